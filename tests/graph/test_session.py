"""The per-session runtime: instances, backpressure, controls, failure isolation, compute off-loop."""

import asyncio
import threading
import time
from typing import Any

import pytest

from graph.errors import SessionRejected
from graph.messages import Close, Interrupt, Turn, TurnDone, ReplyParams
from graph.runtime import GraphRuntime
from tests.conftest import eventually
from tests.graph.fakes import chunk, occupy, relay_sink_profile, wait_queued


def compute_profile() -> dict:
    return {
        "model_id": "m",
        "imports": ["tests.graph.fakes"],
        "nodes": {"model": {"type": "test.compute"}},
        "inputs": {"turns": "model.turns"},
        "outputs": ["model.done"],
    }


async def started(profile) -> GraphRuntime:
    runtime = GraphRuntime.from_config(profile)
    await runtime.start()
    return runtime


async def take(session, n, timeout=5.0):
    out = []
    iterator = session.outputs()
    async with asyncio.timeout(timeout):
        async for message in iterator:
            out.append(message)
            if len(out) == n:
                break
    return out


async def test_each_session_gets_its_own_graph_instance_created_and_torn_down_with_it():
    runtime = await started(relay_sink_profile())
    try:
        a = await runtime.open_session("a")
        b = await runtime.open_session("b")
        await a.send("audio", chunk(1))
        await b.send("audio", chunk(2))
        assert [m.text for m in await take(a, 1)] == ["1"]
        assert [m.text for m in await take(b, 1)] == ["2"]
        relay = runtime.nodes["relay"]
        assert relay.opened == ["a", "b"]
        await a.close("client_closed")
        assert relay.closed == ["a"]
        assert "a" not in runtime.sessions and "b" in runtime.sessions
        assert a.end_reason == "client_closed"
    finally:
        await runtime.stop(0)
    assert relay.closed == ["a", "b"]


async def test_a_slow_consumer_applies_backpressure_instead_of_growing_queues():
    runtime = await started(relay_sink_profile())
    try:
        session = await runtime.open_session("s")
        sink = runtime.nodes["sink"]
        sink.gate.clear()  # the consumer stops consuming
        sent = 0

        async def producer():
            nonlocal sent
            for i in range(100):
                await session.send("audio", chunk(i))
                sent += 1

        task = asyncio.create_task(producer())
        async with asyncio.timeout(5):  # both inboxes fill up
            while session.queue_depths() != {"relay": 4, "sink": 4}:
                await asyncio.sleep(0.005)
        # And stay full: a negative check, with no later event to wait for, so the producer gets
        # a fixed 0.1 s to overrun the bound.
        await asyncio.sleep(0.1)
        # relay inbox (4) + sink inbox (4) + one message held by each node task: nothing more.
        assert sent <= 4 + 4 + 2
        assert not task.done()
        assert all(len(inbox) <= 4 for inbox in session._inboxes.values())
        sink.gate.set()
        received = await take(session, 100)
        await task
        assert [m.text for m in received] == [str(i) for i in range(100)]
    finally:
        await runtime.stop(0)


async def test_an_interrupt_overtakes_100_queued_chunks_and_drops_that_turns_data():
    profile = relay_sink_profile()
    profile["limits"]["edge_capacity"] = 200
    profile["limits"]["output_capacity"] = 200
    runtime = await started(profile)
    try:
        session = await runtime.open_session("s")
        sink = runtime.nodes["sink"]
        sink.gate.clear()
        for i in range(100):
            await session.send("audio", chunk(i, turn_id=7))
        await session.send("audio", chunk(1000, turn_id=8))
        async with asyncio.timeout(5):  # the relay has passed them all on; the sink's task holds chunk 0
            while session.queue_depths() != {"relay": 0, "sink": 100}:
                await asyncio.sleep(0.005)
        session.control(Interrupt(turn_id=7))
        # The control reached the node before any of the 100 chunks was handled.
        assert [type(c) for c in sink.controls["s"]] == [Interrupt]
        assert sink.seen["s"] == []
        sink.gate.set()
        received = await take(session, 2)
        # Only the chunk the sink's task already held when the interrupt came (its in-flight
        # step) is handled; the other 99 were dropped; the next turn's data is kept.
        assert sink.seen["s"] == [0, 1000]
        assert [m.text for m in received] == ["0", "1000"]
    finally:
        await runtime.stop(0)


async def test_a_node_that_raises_ends_only_its_own_session_with_a_reason():
    runtime = await started(relay_sink_profile(fail_on=13.0))
    try:
        doomed = await runtime.open_session("doomed")
        healthy = await runtime.open_session("healthy")
        await doomed.send("audio", chunk(13))
        async with asyncio.timeout(5):
            await doomed.ended.wait()
        assert doomed.failed
        code, message = doomed.error
        assert code == "internal_error" and "boom" in message
        assert doomed.end_reason == "error: internal_error"
        await healthy.send("audio", chunk(1))
        assert [m.text for m in await take(healthy, 1)] == ["1"]
        assert not healthy.ended.is_set()
        assert runtime.nodes["relay"].closed == ["doomed"]
    finally:
        await runtime.stop(0)


async def test_sessions_past_the_limit_are_refused_without_touching_others():
    runtime = await started(relay_sink_profile())
    try:
        sessions = [await runtime.open_session(f"s{i}") for i in range(4)]
        with pytest.raises(SessionRejected) as refused:
            await runtime.open_session("one-too-many")
        assert refused.value.code == "session_limit_reached"
        await sessions[0].send("audio", chunk(5))
        assert [m.text for m in await take(sessions[0], 1)] == ["5"]
        await sessions[1].close()
        assert (await runtime.open_session("now-fits")).id == "now-fits"
    finally:
        await runtime.stop(0)


async def test_close_control_ends_the_session_and_draining_refuses_new_ones():
    runtime = await started(relay_sink_profile())
    try:
        session = await runtime.open_session("s")
        session.control(Close(reason="bye"))
        async with asyncio.timeout(2):
            await session.ended.wait()
        assert session.end_reason == "bye"
        await runtime.drain(0)
        with pytest.raises(SessionRejected) as refused:
            await runtime.open_session("late")
        assert refused.value.code == "server_shutting_down"
    finally:
        await runtime.stop(0)


async def started_held() -> tuple[GraphRuntime, Any]:
    """The compute profile's runtime and its model node, whose steps wait for `model.release`."""
    profile = compute_profile()
    profile["nodes"]["model"]["params"] = {"held": True}
    runtime = await started(profile)
    return runtime, runtime.nodes["model"]


async def test_model_compute_runs_in_a_worker_thread_while_the_event_loop_keeps_moving():
    runtime, model = await started_held()
    try:
        session = await runtime.open_session("s")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        await session.send("turns", Turn(reply=ReplyParams()))
        assert len(session.replies) == 1
        await eventually(model.stepping.is_set, "the model step")
        ticks_in_step = ticks
        # The step is held: only a loop that keeps moving meanwhile gets these ticks in.
        await eventually(lambda: ticks >= ticks_in_step + 5, "the loop to tick during the step")
        model.release.set()
        (done,) = await take(session, 1)
        ticking.cancel()
        assert isinstance(done, TurnDone)
        assert done.reason.startswith("compute")  # ran on a compute thread, not the loop
        assert len(session.replies) == 0
    finally:
        model.release.set()
        await runtime.stop(0)


async def test_drain_waits_for_an_open_reply_then_closes_with_server_shutdown():
    runtime, model = await started_held()
    try:
        session = await runtime.open_session("s")
        await session.send("turns", Turn(reply=ReplyParams()))
        await eventually(model.stepping.is_set, "the reply's step")
        # A grace no test run reaches: the drain can only return because the reply finished.
        draining = asyncio.create_task(runtime.drain(3600))
        await eventually(lambda: runtime.shutting_down, "the drain to begin")
        assert not draining.done() and session.end_reason is None  # the held reply keeps it open
        model.release.set()
        await eventually(draining.done, "the drain to return once the reply finished")
        assert session.end_reason == "server_shutdown"
        # The reply's end reached the client before the close: the drain waited for it.
        outputs = [m async for m in session.outputs()]
        assert [type(m) for m in outputs] == [TurnDone]
    finally:
        model.release.set()
        await runtime.stop(0)


async def test_a_reply_request_dropped_by_an_interrupt_counts_as_finished():
    profile = compute_profile()
    runtime = await started(profile)
    try:
        session = await runtime.open_session("s")
        await session.send("turns", Turn(turn_id=1, reply=ReplyParams()))
        await session.send("turns", Turn(turn_id=2, reply=ReplyParams()))  # queued behind turn 1
        assert len(session.replies) == 2
        session.control(Interrupt(turn_id=2))
        assert len(session.replies) == 1
        (done,) = await take(session, 1)
        assert done.turn_id == 1
        assert len(session.replies) == 0
    finally:
        await runtime.stop(0)


async def test_a_profile_warmup_runs_one_reply_through_the_graph_before_ready():
    profile = {
        "model_id": "m",
        "imports": ["tests.graph.fakes"],
        "nodes": {"model": {"type": "test.compute", "params": {"held": True}}},
        "inputs": {"turns": "model.turns"},
        "outputs": ["model.done"],
        "warmup": {"input": "turns", "text": "Hello."},
    }
    runtime = GraphRuntime.from_config(profile)
    starting = asyncio.create_task(runtime.start())
    await eventually(lambda: "model" in runtime.nodes, "the model node to start")
    model = runtime.nodes["model"]
    try:
        await eventually(model.stepping.is_set, "the warm-up reply's step")
        assert not runtime.ready  # the warm-up reply is held in its step
        model.release.set()
        await starting
        assert runtime.ready
        assert runtime.sessions == {}  # the warm-up session is gone
    finally:
        model.release.set()
        await runtime.stop(0)


async def test_a_session_opens_only_the_nodes_its_inputs_reach():
    profile = relay_sink_profile()
    profile["inputs"]["direct"] = "sink.audio"
    runtime = await started(profile)
    try:
        direct = await runtime.open_session("direct", inputs=("direct",))
        both = await runtime.open_session("both")
        assert runtime.nodes["relay"].opened == ["both"]  # no relay state for a session that skips it
        await direct.send("direct", chunk(7))
        assert [m.text for m in await take(direct, 1)] == ["7"]
        with pytest.raises(KeyError, match="does not use input 'audio'"):
            await direct.send("audio", chunk(8))
        await both.send("audio", chunk(9))
        assert [m.text for m in await take(both, 1)] == ["9"]
        with pytest.raises(ValueError, match="no input 'nope'"):
            await runtime.open_session("bad", inputs=("nope",))
    finally:
        await runtime.stop()


async def warm_runtime(inline_compute: bool) -> GraphRuntime:
    """A started runtime whose relay node has a keep-warm unit, run every 10 ms."""
    profile = relay_sink_profile()
    profile["nodes"]["relay"]["type"] = "test.warm_relay"
    profile["compute"] = {"keep_warm_ms": 10}
    runtime = GraphRuntime.from_config(profile, inline_compute=inline_compute)
    await runtime.start()
    return runtime


async def test_an_idle_runtime_keeps_its_nodes_warm_only_while_a_live_session_is_open():
    runtime = await warm_runtime(inline_compute=True)
    relay = runtime.nodes["relay"]
    try:
        # A negative check: the warmer exposes no tick to wait for, so it gets ten intervals.
        await asyncio.sleep(0.1)
        assert relay.warmed == []  # no session: nothing to keep warm for
        session = await runtime.open_session("live")
        async with asyncio.timeout(5):
            while len(relay.warmed) < 3:
                await asyncio.sleep(0.01)
        await session.close("client_closed")
        # Negative checks with no later event to wait for: a unit already past the warmer's
        # session check may still finish (0.05 s), then none may start (ten intervals).
        await asyncio.sleep(0.05)
        warmed = len(relay.warmed)
        await asyncio.sleep(0.1)
        assert len(relay.warmed) == warmed  # the session ended: warming stopped
    finally:
        await runtime.stop()
    assert runtime._warmer is not None and runtime._warmer.done()


async def test_keep_warm_does_not_run_for_sessions_whose_turns_are_prefilled_in_their_pause():
    runtime = await warm_runtime(inline_compute=True)
    relay = runtime.nodes["relay"]
    try:
        await runtime.open_session("early", config={"warms_ahead": True})
        await asyncio.sleep(0.1)  # a negative check: ten intervals for a unit that must not run
        assert relay.warmed == []  # its turns warm the path themselves
        await runtime.open_session("manual")
        async with asyncio.timeout(5):
            while len(relay.warmed) < 3:
                await asyncio.sleep(0.01)
    finally:
        await runtime.stop()


async def test_keeping_warm_waits_while_the_compute_has_other_work():
    runtime = await warm_runtime(inline_compute=False)
    relay = runtime.nodes["relay"]
    gate = threading.Event()
    try:
        await runtime.open_session("live")
        running = await occupy(runtime.compute, gate)  # the one worker: any unit before it is done
        waiting = asyncio.ensure_future(runtime.compute.run(gate.wait, 10))
        await wait_queued(runtime.compute.queue_depth, 1)
        before = len(relay.warmed)
        await asyncio.sleep(0.1)  # a negative check: ten intervals for a unit that must not run
        assert len(relay.warmed) == before  # work was waiting all along
        gate.set()
        await asyncio.gather(running, waiting)
        async with asyncio.timeout(5):
            while len(relay.warmed) == before:
                await asyncio.sleep(0.01)
    finally:
        gate.set()
        await runtime.stop()


async def test_a_busy_engine_is_not_kept_warm():
    runtime = await warm_runtime(inline_compute=True)
    relay = runtime.nodes["relay"]
    busy = True

    async def load():
        while busy:
            await runtime.compute.run(time.sleep, 0.004)  # the loop's own thread: busy most of the time

    try:
        await runtime.open_session("live")
        async with asyncio.timeout(5):
            while not relay.warmed:
                await asyncio.sleep(0.01)
        loader = asyncio.create_task(load())
        # Negative checks with no later event to wait for: the warmer first sees a busy interval
        # (0.05 s), then must run nothing while the load goes on (0.3 s: the busy loop ticks slowly).
        await asyncio.sleep(0.05)
        before = len(relay.warmed)
        await asyncio.sleep(0.3)
        assert len(relay.warmed) == before
        busy = False
        await loader
        async with asyncio.timeout(5):
            while len(relay.warmed) == before:
                await asyncio.sleep(0.01)
    finally:
        busy = False
        await runtime.stop()
