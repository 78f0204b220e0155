"""The compute pool: live-session calls before queued speech calls, cancelled calls skipped, no
reference kept to finished calls, shutdown semantics; the runtime sets the priority from the
session's kind, for `ComputePool.run` and `Batcher.submit` alike."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from graph.executor import PRIORITY_REALTIME, PRIORITY_SPEECH, ComputePool, current_priority
from graph.messages import Turn, TurnDone
from graph.node import Node, NodeSession
from graph.registry import register_node
from graph.runtime import GraphRuntime
from tests.graph.fakes import occupy, wait_queued


async def test_a_realtime_call_overtakes_queued_speech_calls():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    order: list[str] = []
    try:
        blocker = await occupy(pool, gate)

        async def call(name: str, priority: int):
            current_priority.set(priority)
            await pool.run(order.append, name)

        speech = [asyncio.ensure_future(call(f"speech{i}", PRIORITY_SPEECH)) for i in range(3)]
        await asyncio.sleep(0)
        live = asyncio.ensure_future(call("live", PRIORITY_REALTIME))
        await wait_queued(pool.queue_depth, 4)
        gate.set()
        await asyncio.gather(blocker, live, *speech)
        assert order == ["live", "speech0", "speech1", "speech2"]
    finally:
        pool.shutdown()


async def test_an_explicit_priority_overrides_the_task_priority():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    order: list[str] = []
    try:
        blocker = await occupy(pool, gate)
        current_priority.set(PRIORITY_REALTIME)
        late = asyncio.ensure_future(pool.run(order.append, "speech", priority=PRIORITY_SPEECH))
        early = asyncio.ensure_future(pool.run(order.append, "live"))
        await wait_queued(pool.queue_depth, 2)
        gate.set()
        await asyncio.gather(blocker, late, early)
        assert order == ["live", "speech"]
    finally:
        pool.shutdown()


async def test_a_cancelled_call_that_has_not_started_is_skipped():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    ran: list[int] = []
    try:
        blocker = await occupy(pool, gate)
        doomed = asyncio.ensure_future(pool.run(ran.append, 1))
        await wait_queued(pool.queue_depth, 1)
        doomed.cancel()
        gate.set()
        await blocker
        await pool.run(ran.append, 2)
        assert ran == [2]
        assert doomed.cancelled()
    finally:
        pool.shutdown()


class Payload:
    """Stands in for a session's state passed to a model call."""


async def test_the_pool_keeps_no_reference_to_finished_failed_or_skipped_calls():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    gc.disable()  # freed by refcount, not by a later collection
    try:
        done, failed, skipped = Payload(), Payload(), Payload()
        refs = [weakref.ref(done), weakref.ref(failed), weakref.ref(skipped)]

        def fail(payload):
            raise ValueError("boom")

        await pool.run(id, done)
        with pytest.raises(ValueError):
            await pool.run(fail, failed)
        blocker = await occupy(pool, gate)
        doomed = asyncio.ensure_future(pool.run(id, skipped))
        await wait_queued(pool.queue_depth, 1)
        doomed.cancel()
        gate.set()
        await blocker
        del done, failed, skipped, doomed
        async with asyncio.timeout(5):  # the worker skips the cancelled call, then waits idle
            while refs[2]() is not None:
                await asyncio.sleep(0.001)
        assert [ref() for ref in refs] == [None, None, None]
    finally:
        gc.enable()
        pool.shutdown()


async def test_shutdown_lets_running_calls_finish_fails_queued_and_later_calls():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    ran: list[str] = []
    blocker = await occupy(pool, gate)
    queued = asyncio.ensure_future(pool.run(ran.append, "queued"))
    await wait_queued(pool.queue_depth, 1)
    pool.shutdown()
    gate.set()
    assert await blocker is True  # the running call delivered its result
    with pytest.raises(RuntimeError, match="shut down"):
        await queued
    with pytest.raises(RuntimeError, match="shut down"):
        await pool.run(ran.append, "later")
    assert ran == []
    for worker in pool._workers:
        worker.join(5)
        assert not worker.is_alive()


async def test_calls_run_in_parallel_on_all_threads():
    pool = ComputePool(threads=3)
    both = threading.Barrier(3, timeout=5)
    try:
        await asyncio.gather(*(pool.run(both.wait) for _ in range(3)))  # would time out on fewer threads
    finally:
        pool.shutdown()


async def test_a_batcher_submit_defaults_to_the_task_priority():
    pool = ComputePool(threads=1)
    gate = threading.Event()
    holding = threading.Event()
    order: list[str] = []

    def batch_fn(items):
        if "hold" in items:
            holding.set()
            gate.wait(10)
        order.extend(item for item in items if item != "hold")
        return items

    batcher = pool.batcher("priority-test", batch_fn, max_batch=1)
    try:
        held = asyncio.ensure_future(batcher.submit("hold"))
        while not holding.is_set():  # the worker is busy with "hold"
            await asyncio.sleep(0.001)

        async def call(name: str, priority: int):
            current_priority.set(priority)
            await batcher.submit(name)

        speech = [asyncio.ensure_future(call(f"speech{i}", PRIORITY_SPEECH)) for i in range(2)]
        await asyncio.sleep(0)
        live = asyncio.ensure_future(call("live", PRIORITY_REALTIME))
        await wait_queued(batcher.queue_depth, 3)
        gate.set()
        await asyncio.gather(held, live, *speech)
        assert order == ["live", "speech0", "speech1"]
    finally:
        pool.shutdown()


@register_node("test.priority_probe")
class PriorityProbe(Node):
    """Records the compute priority of its session's node task and of a task that node starts."""

    inputs = {"turns": (Turn,)}
    outputs = {"done": (TurnDone,)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[str, tuple[int, int]] = {}

    def open_session(self, session):
        node = self

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                spawned = await asyncio.get_running_loop().create_task(_priority())
                node.seen[self.session.session_id] = (current_priority.get(), spawned)
                await emit("done", TurnDone(turn_id=message.turn_id, response_id=message.reply.response_id if message.reply else ""))

        return State(self, session)


async def _priority() -> int:
    return current_priority.get()


async def test_the_runtime_runs_each_node_at_its_sessions_priority():
    runtime = GraphRuntime.from_config({
        "model_id": "m",
        "imports": ["tests.graph.test_compute_priority"],
        "nodes": {"probe": {"type": "test.priority_probe"}},
        "inputs": {"turns": "probe.turns"},
        "outputs": ["probe.done"],
    })
    await runtime.start()
    try:
        current_priority.set(PRIORITY_SPEECH)  # the transport's own context does not leak into nodes
        for session_id, kind in (("live", "realtime"), ("tts", "speech")):
            session = await runtime.open_session(session_id, kind=kind)
            await session.send("turns", Turn(turn_id=0, role="user", text="hi"))
            async with asyncio.timeout(5):
                async for message in session.outputs():
                    assert isinstance(message, TurnDone)
                    break
            await session.close()
        probe = runtime.nodes["probe"]
        assert probe.seen == {"live": (PRIORITY_REALTIME, PRIORITY_REALTIME), "tts": (PRIORITY_SPEECH, PRIORITY_SPEECH)}
    finally:
        await runtime.stop(0)
