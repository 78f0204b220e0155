"""One 20 ms clock for every phone call of an event loop: each call's frame at its own phase.

    FrameClock.of(loop) --each call every 20 ms, at its own offset in the period--> call.tick()

Why one clock and not a timer per call: a timer per call is a task per call, twenty of them
waking the loop a thousand times a second, each wake-up a task switch waiting its turn behind
the others' and the loop's other work (measured: a tick p95 17 ms late at 20 calls on 2 busy
cores). One task keeps every call's schedule and sleeps to the next frame due.

Why each call has its own phase and not one tick for all: with one tick every call's frame left
in one burst, so whatever held that one turn of the loop (a reply's first frame with its events,
a collection, the engine's records) delayed every call's frame at once, and the last call's frame
left after all the others' work (measured: jitter p99 8-19 ms and late packets at 20 calls, worse
than a timer per call; docs/notebook/2026-12-07-sip-bench.md). A joining call takes the middle of
the widest gap between the phases of the calls already joined, so the calls' frames are spread
evenly over the 20 ms and each wake-up sends few.

Each call's schedule is absolute (frame n is due at the clock's epoch + the call's phase + n x
20 ms), so a late wake-up does not delay the frames after it and nothing drifts; a call more than
`MAX_LAG_S` behind (a stalled loop) skips to its phase's next slot rather than bursting the
frames it missed. The deadline is checked against `time.monotonic()`, not the loop's clock,
whose time uvloop caches per loop turn at millisecond resolution: a timer that fires early is
slept again for the rest, unless the rest is under `EARLY_S` (another loop turn would cost more
than that).

A call's first frame is due at its phase's first slot after it joined (nothing was sent
before). The clock's task runs while a call is joined and is cancelled when the last one
leaves, so an idle server has no timer. A tick that raises is the call's failure
(`tick_failed`), never the clock's: the other calls go on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger("session_server.telephony")

FRAME_S = 0.020
# Past this much lag (a stalled event loop), a call's schedule skips ahead rather than bursting.
MAX_LAG_S = 0.1
# A frame due within this much is sent now: sleeping again for less costs a loop turn.
EARLY_S = 0.0005


class Ticking(Protocol):
    def tick(self) -> None:
        """Send this call's frame that is due (never awaits)."""

    def tick_failed(self, error: BaseException) -> None:
        """`tick` raised: the call ends (the clock forgets it first)."""


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FrameClock] = weakref.WeakKeyDictionary()


class FrameClock:
    def __init__(self, now: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._now, self._sleep = now, sleep  # a test's own clock
        self._phase: dict[Ticking, float] = {}  # joined calls, in the order they joined -> offset in the period (s)
        self._due: list[tuple[float, int, Ticking]] = []  # a heap of (due, sequence, call): each joined call once
        self._sequence = itertools.count()  # ties between equal dues, so that calls are never compared
        self._epoch = 0.0
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0  # wake-ups that sent frames

    @staticmethod
    def of(loop: asyncio.AbstractEventLoop) -> FrameClock:
        """The clock of `loop` (made on first use)."""
        clock = _clocks.get(loop)
        if clock is None:
            clock = _clocks[loop] = FrameClock()
        return clock

    def join(self, call: Ticking) -> None:
        if self._task is None or self._task.done():
            self._epoch = self._now()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="phone-frame-clock")
        self._forget(call)
        phase = self._free_phase()
        self._phase[call] = phase
        self._schedule(call, self._slot_after(phase, self._now()))

    def leave(self, call: Ticking) -> None:
        self._forget(call)
        if not self._phase and self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()  # no call left: no timer (a call joining later starts another)
            self._task = None

    def phase_of(self, call: Ticking) -> float:
        """Where in the 20 ms period `call`'s frames are due (s after the clock's epoch)."""
        return self._phase[call]

    def __len__(self) -> int:
        return len(self._phase)

    def _free_phase(self) -> float:
        """The middle of the widest gap between the joined calls' phases (0 for the first)."""
        phases = sorted(self._phase.values())
        if not phases:
            return 0.0
        width, after = max((b - a, a) for a, b in zip(phases, phases[1:] + [phases[0] + FRAME_S]))
        return (after + width / 2) % FRAME_S

    def _slot_after(self, phase: float, now: float) -> float:
        """The first time after `now` (by more than `EARLY_S`) that is `phase` into a period."""
        slot = self._epoch + phase + (math.floor((now - self._epoch - phase) / FRAME_S) + 1) * FRAME_S
        while slot <= now + EARLY_S:  # rounding, or a phase just ahead of now
            slot += FRAME_S
        return slot

    def _schedule(self, call: Ticking, due: float) -> None:
        heapq.heappush(self._due, (due, next(self._sequence), call))

    def _forget(self, call: Ticking) -> None:
        """Take `call` off the schedule (its entry out of the heap: a scan, once per call, where
        ticks come fifty times a second)."""
        if self._phase.pop(call, None) is not None:
            self._due = [entry for entry in self._due if entry[2] is not call]
            heapq.heapify(self._due)

    async def _run(self) -> None:
        while self._due:
            now = self._now()
            if now < self._due[0][0] - EARLY_S:
                await self._sleep(self._due[0][0] - now)
                continue  # calls may have left (or joined, earlier) meanwhile
            self.ticks += 1
            while self._due and self._due[0][0] <= now + EARLY_S:
                due, _, call = heapq.heappop(self._due)
                if now - due > MAX_LAG_S:  # a stalled loop: no burst of the frames it missed
                    self._schedule(call, self._slot_after(self._phase[call], now))
                    continue
                self._schedule(call, due + FRAME_S)
                try:
                    call.tick()
                except Exception as error:  # noqa: BLE001 - one call's failure, never the clock's
                    self.leave(call)
                    call.tick_failed(error)
