"""Issue 16 fairness: a long job run in slices (a long prefill, chunk by chunk) holds the compute
pool for one slice at a time. Its slices after the first are due no earlier than when they are
submitted (`continuation_due`), so work that has waited since before then goes next, even though
the job itself was due first."""

from __future__ import annotations

import asyncio

import pytest

from graph.executor import ComputePool, continuation_due, current_due

SLICES = 20


@pytest.mark.parametrize("threads", [0, 1], ids=["inline", "worker"])
async def test_work_waiting_behind_a_sliced_job_runs_after_the_slice_in_progress(threads):
    pool = ComputePool(threads=threads)
    order: list[str] = []

    async def long_job() -> None:
        current_due.set(lambda: 0.0)  # due before anything else
        due = None
        for index in range(SLICES):
            await pool.run(order.append, f"slice{index}", due=due)
            due = continuation_due()

    async def first_audio() -> None:
        current_due.set(lambda: 1.0)  # due after the job, and long before now
        while "slice0" not in order:
            await asyncio.sleep(0)
        await pool.run(order.append, "other")

    try:
        await asyncio.wait_for(asyncio.gather(long_job(), first_audio()), 30)
    finally:
        pool.shutdown()
    assert order.index("other") < order.index(f"slice{SLICES - 1}")
    assert order.index("other") <= order.index("slice0") + 3  # a slice or two, not the whole job


def test_continuation_due_is_the_task_due_time_unless_that_has_passed():
    token = current_due.set(lambda: 1e12)  # a reply far ahead of its listener keeps its own due time
    try:
        assert continuation_due() == 1e12
        current_due.set(lambda: 0.0)
        assert continuation_due() > 0.0
    finally:
        current_due.reset(token)
