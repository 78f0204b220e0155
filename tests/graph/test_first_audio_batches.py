"""What rides along in a batch: everything queued, except in a batch led by the first-audio work of
a turn that has just ended, which leaves out the replies that are not due yet (they would make the
forward the turn waits on longer, for work not needed for hundreds of ms)."""

from __future__ import annotations

import asyncio
import threading
import time

from graph.executor import PRIORITY_REALTIME, PRIORITY_SPEECH, ComputePool, current_due, current_phase, current_priority
from tests.graph.fakes import occupy, wait_queued


async def batches_of(first_asked_s_ago: float, priority: int = PRIORITY_REALTIME) -> list[list[str]]:
    """The batches a batcher runs for three items queued behind a busy worker: a turn's first-audio
    work (its reply asked for `first_asked_s_ago`), a reply catching up (overdue) and a reply ahead
    of its listener (due in 0.3 s)."""
    pool = ComputePool(threads=1)
    batches: list[list[str]] = []
    batcher = pool.batcher("talker", lambda items: batches.append(list(items)) or items, max_batch=8)
    gate = threading.Event()
    now = time.monotonic()

    async def submit(name: str, phase: str, due: float) -> str:
        current_priority.set(priority)
        current_phase.set(lambda: phase)
        current_due.set(lambda: due)
        return await batcher.submit(name)

    try:
        blocker = await occupy(pool, gate)
        items = [
            asyncio.ensure_future(submit("ahead", "playing", now + 0.3)),
            asyncio.ensure_future(submit("catching up", "playing", now - 0.05)),
            asyncio.ensure_future(submit("first", "first", now - 0.2 - first_asked_s_ago)),
        ]
        await wait_queued(batcher.queue_depth, 3)
        gate.set()
        await asyncio.gather(blocker, *items)
    finally:
        pool.shutdown()
    return batches


async def test_a_turn_that_just_ended_gets_a_forward_without_the_replies_not_due_yet():
    assert await batches_of(first_asked_s_ago=0.0) == [["first", "catching up"], ["ahead"]]


async def test_a_turn_that_waited_behind_others_takes_every_reply_along():
    # Turns ending together: the playing replies must not wait for the whole burst's first audio.
    assert await batches_of(first_asked_s_ago=0.3) == [["first", "catching up", "ahead"]]


async def test_speech_requests_batch_everything_ready():
    # Downloads: what pays there is batching every request that is ready.
    assert await batches_of(first_asked_s_ago=0.0, priority=PRIORITY_SPEECH) == [["first", "catching up", "ahead"]]
