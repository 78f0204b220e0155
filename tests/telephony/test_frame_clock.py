"""FrameClock: one 20 ms clock for every phone call of a loop, each call at its own phase."""

from __future__ import annotations

import asyncio

import pytest

from session_server.telephony.frame_clock import FRAME_S, MAX_LAG_S, FrameClock
from tests.conftest import until_true


class Call:
    def __init__(self, clock: FrameClock, fails: bool = False):
        self.clock, self.fails = clock, fails
        self.ticked_at: list[tuple[int, float]] = []  # (the clock's tick count, the clock's time)
        self.failed: BaseException | None = None

    def tick(self) -> None:
        if self.fails:
            raise RuntimeError("broken wire")
        self.ticked_at.append((self.clock.ticks, self.clock._now()))

    def tick_failed(self, error: BaseException) -> None:
        self.failed = error


class FakeTime:
    """A clock that only sleeps move, each sleep `late` seconds longer than asked (a busy loop)."""

    def __init__(self, late: float = 0.0):
        self.t, self.late = 100.0, late

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds + self.late
        await asyncio.sleep(0)


def joined(count: int) -> tuple[FrameClock, list[Call]]:
    """`count` calls joined, one after another, to a clock on fake time."""
    fake = FakeTime()
    clock = FrameClock(now=fake.now, sleep=fake.sleep)
    calls = [Call(clock) for _ in range(count)]
    for call in calls:
        clock.join(call)
    return clock, calls


async def test_joined_calls_take_phases_spread_evenly_over_the_20_ms():
    clock, calls = joined(4)
    assert sorted(clock.phase_of(call) for call in calls) == pytest.approx([0.0, 0.005, 0.010, 0.015])
    left = clock.phase_of(calls[1])
    clock.leave(calls[1])  # the widest gap is now where it was: the next call takes its place
    newcomer = Call(clock)
    clock.join(newcomer)
    assert clock.phase_of(newcomer) == pytest.approx(left)
    for call in [calls[0], *calls[2:], newcomer]:
        clock.leave(call)


async def test_each_call_sends_every_20_ms_at_its_phase_not_all_in_one_burst():
    clock, calls = joined(4)
    await until_true(lambda: all(len(call.ticked_at) >= 5 for call in calls), timeout=5, step=0.001)
    for call in calls:
        clock.leave(call)
    for call in calls:
        times = [at for _, at in call.ticked_at]
        assert [round(b - a, 9) for a, b in zip(times, times[1:])] == [FRAME_S] * (len(times) - 1)
    wake_ups = [n for call in calls for n, _ in call.ticked_at]
    assert len(set(wake_ups)) == len(wake_ups)  # one call's frame per wake-up: no burst
    firsts = sorted(call.ticked_at[0][1] for call in calls)
    assert [round(b - a, 9) for a, b in zip(firsts, firsts[1:])] == [0.005] * 3


async def test_ticks_keep_an_absolute_20_ms_schedule_so_oversleeping_does_not_accumulate():
    fake = FakeTime(late=0.004)  # every sleep 4 ms long: a drifting clock would be 4 ms later each tick
    clock = FrameClock(now=fake.now, sleep=fake.sleep)
    call = Call(clock)
    start = fake.t
    clock.join(call)
    await until_true(lambda: clock.ticks >= 50, timeout=5, step=0.001)
    clock.leave(call)
    for n, at in call.ticked_at:
        assert start + n * FRAME_S <= at <= start + n * FRAME_S + 0.004 + 1e-9  # never early, late by one oversleep at most


async def test_a_stalled_loop_skips_to_the_calls_next_slot_instead_of_bursting_the_missed_frames():
    fake = FakeTime()
    clock = FrameClock(now=fake.now, sleep=fake.sleep)

    class Stalling(Call):
        def tick(self) -> None:
            super().tick()
            if clock.ticks == 3:
                fake.t += 5 * MAX_LAG_S  # this tick blocked the loop for half a second

    call = Stalling(clock)
    clock.join(call)
    await until_true(lambda: clock.ticks >= 10, timeout=5, step=0.001)
    clock.leave(call)
    times = [at for _, at in call.ticked_at]
    resumed = times[3]  # the first tick after the stall: at its phase's next slot, then 20 ms apart again
    assert times[2] + 5 * MAX_LAG_S <= resumed <= times[2] + 5 * MAX_LAG_S + FRAME_S + 1e-9
    assert [round(b - a, 6) for a, b in zip(times[3:10], times[4:10])] == [FRAME_S] * 6  # not the 25 missed frames in a burst


async def test_a_call_whose_tick_raises_is_told_and_dropped_while_the_others_go_on():
    clock = FrameClock()
    broken, fine = Call(clock, fails=True), Call(clock)
    clock.join(broken)
    clock.join(fine)
    await until_true(lambda: len(fine.ticked_at) >= 3 and broken.failed is not None, timeout=5, step=0.005)
    assert isinstance(broken.failed, RuntimeError) and len(clock) == 1
    clock.leave(fine)


async def test_the_clock_runs_only_while_a_call_is_joined():
    clock = FrameClock()
    call = Call(clock)
    clock.join(call)
    task = clock._task
    await until_true(lambda: clock.ticks >= 1, timeout=5, step=0.005)
    clock.leave(call)
    await until_true(lambda: task is not None and task.done(), timeout=1, step=0.005)
    assert clock._task is None
    clock.join(call)  # a later call starts it again
    await until_true(lambda: len(call.ticked_at) >= 2, timeout=5, step=0.005)
    clock.leave(call)


def test_each_event_loop_has_its_own_clock():
    loop_a, loop_b = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert FrameClock.of(loop_a) is FrameClock.of(loop_a)
        assert FrameClock.of(loop_a) is not FrameClock.of(loop_b)
    finally:
        loop_a.close()
        loop_b.close()
