"""Captures made in idle compute: the `defer` the captured units of the thinker, talker and
code2wav nodes are given (`compute: {graphs: auto}`), so that no reply's step waits for one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from graph.background import spawn
from graph.executor import PRIORITY_IDLE

log = logging.getLogger(__name__)


def defer_to_idle_compute(compute: Any, what: str) -> Callable[[Callable[[], None]], None]:
    """A `defer(capture)` callable from any thread: `capture` runs on `compute` at idle priority,
    scheduled on the running loop. A capture that cannot run (the runtime stopped first) leaves
    its steps eager; `what` names it in the debug log."""
    loop = asyncio.get_running_loop()

    async def run(capture: Callable[[], None]) -> None:
        try:
            await compute.run(capture, priority=PRIORITY_IDLE)
        except Exception:  # noqa: BLE001 - the runtime stopped first: steps stay eager
            log.debug("%s capture did not run", what, exc_info=True)

    return lambda capture: loop.call_soon_threadsafe(lambda: spawn(run(capture), name=f"{what}-capture"))
