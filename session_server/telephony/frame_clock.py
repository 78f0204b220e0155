"""One 20 ms clock for every phone call of an event loop: each tick, every call sends its frame.

    FrameClock.of(loop) --every 20 ms of the monotonic clock--> call.tick() for each call joined

Why one clock and not a timer per call: a call's frame is due every 20 ms whatever the others
do, so twenty calls with a timer each woke the loop a thousand times a second, and each wake-up
waited its turn behind the others' and behind the loop's other work (measured: a tick p95
17 ms late at 20 calls on 2 busy cores). One timer wakes once per 20 ms and sends every call's
frame in that one turn of the loop.

The schedule is absolute (tick n is due at start + n x 20 ms), so a late wake-up does not
delay the ticks after it; a lag past `MAX_LAG_S` (a stalled loop) restarts the schedule rather
than bursting the frames it missed. The deadline is checked against `time.monotonic()`, not
the loop's clock, whose time uvloop caches per loop turn at millisecond resolution: a timer
that fires early is slept again for the rest.

A call that joins ticks from the next tick; its first frame may so come less than 20 ms after
it joined (nothing was sent before). The clock's task runs while a call is joined and is
cancelled when the last one leaves, so an idle server has no timer. A tick that raises is the call's failure
(`tick_failed`), never the clock's: the other calls go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger("session_server.telephony")

FRAME_S = 0.020
# Past this much lag (a stalled event loop), the clock restarts rather than bursting.
MAX_LAG_S = 0.1


class Ticking(Protocol):
    def tick(self) -> None:
        """Send this call's frame for the tick that is due (never awaits)."""

    def tick_failed(self, error: BaseException) -> None:
        """`tick` raised: the call ends (the clock forgets it first)."""


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FrameClock] = weakref.WeakKeyDictionary()


class FrameClock:
    def __init__(self, now: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._now, self._sleep = now, sleep  # a test's own clock
        self._calls: dict[Ticking, None] = {}  # joined, in the order they joined
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0

    @staticmethod
    def of(loop: asyncio.AbstractEventLoop) -> FrameClock:
        """The clock of `loop` (made on first use)."""
        clock = _clocks.get(loop)
        if clock is None:
            clock = _clocks[loop] = FrameClock()
        return clock

    def join(self, call: Ticking) -> None:
        self._calls[call] = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="phone-frame-clock")

    def leave(self, call: Ticking) -> None:
        self._calls.pop(call, None)
        if not self._calls and self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()  # no call left: no timer (a call joining later starts another)
            self._task = None

    def __len__(self) -> int:
        return len(self._calls)

    async def _run(self) -> None:
        start, ticks = self._now(), 0
        while self._calls:
            ticks += 1
            due = start + ticks * FRAME_S
            now = self._now()
            if now - due > MAX_LAG_S:
                start, ticks = now, 0
            while now < due:
                await self._sleep(due - now)
                now = self._now()
            self.ticks += 1
            for call in list(self._calls):
                if call not in self._calls:
                    continue  # left during this tick
                try:
                    call.tick()
                except Exception as error:  # noqa: BLE001 - one call's failure, never the clock's
                    self.leave(call)
                    call.tick_failed(error)
