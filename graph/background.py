"""Fire-and-forget tasks that are neither lost nor silent.

The event loop keeps only weak references to tasks: a task nobody holds can be garbage-collected
before it finishes (a session close that never completes would leak its KV row). `spawn` holds
each task until it is done and logs its exception, if it ends with one, instead of leaving
"Task exception was never retrieved" to the garbage collector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("graph")

_running: set[asyncio.Task[Any]] = set()


def spawn(coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
    task = asyncio.get_running_loop().create_task(coroutine, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def running() -> int:
    """Tasks spawned here and not yet done (for tests)."""
    return len(_running)


def _finished(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background task %s failed", task.get_name(), exc_info=exc)
