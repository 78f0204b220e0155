"""Batch formation: a Batcher with `linger_s` waits for the sessions of its last batch to come back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from graph.executor import ComputePool, current_phase
from tests.conftest import eventually
from tests.graph.fakes import wait_queued


def test_a_lingering_batcher_gathers_the_sessions_of_its_last_batch_again():
    sizes: list[int] = []
    holding, release = threading.Event(), threading.Event()

    def batch_fn(items):
        if "hold" in items:
            holding.set()
            release.wait(5)
        sizes.append(len(items))
        return items

    async def main():
        compute = ComputePool(threads=1)
        batcher = compute.batcher("linger-test", batch_fn, max_batch=8, linger_s=5.0)
        try:
            held = asyncio.ensure_future(batcher.submit("hold"))
            await eventually(holding.is_set, 'the worker to take "hold"')
            first = [asyncio.ensure_future(batcher.submit(i)) for i in range(4)]
            await wait_queued(batcher.queue_depth, 4)
            release.set()
            await asyncio.gather(held, *first)
            assert sizes == [1, 4]
            # The four come back one by one, 10 ms apart: still one batch (the worker lingers).
            second = []
            for i in range(4):
                second.append(asyncio.ensure_future(batcher.submit(10 + i)))
                await asyncio.sleep(0.01)
            assert await asyncio.gather(*second) == [10, 11, 12, 13]
        finally:
            compute.shutdown()

    asyncio.run(main())
    assert sizes == [1, 4, 4]


def test_a_lingering_batcher_holding_first_audio_work_runs_at_once():
    # A turn waiting for its first audio must not wait the linger (behind whatever unit the worker
    # takes meanwhile) for other sessions to come back.
    order: list[str] = []

    async def main():
        compute = ComputePool(threads=1)
        batcher = compute.batcher("linger-test", lambda items: order.extend(items) or items, max_batch=8, linger_s=5.0)

        async def submit(name: str, phase: str):
            current_phase.set(lambda: phase)
            return await batcher.submit(name)

        try:
            await asyncio.gather(*(batcher.submit(i) for i in range(4)))  # its last batch held four
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await submit("playing", "playing")  # the linger holds other work
            async with asyncio.timeout(2):  # well within the 5 s linger
                assert await submit("first", "first") == "first"
        finally:
            compute.shutdown()

    asyncio.run(main())
