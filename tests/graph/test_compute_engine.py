"""One scheduler for all compute: batchers run on the pool's workers in urgency order, a batcher
never runs two batches at once, a lingering batcher lets other work run, reply-side work is due by
its session's playback clock, and `compute.threads` comes from the profile."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import numpy as np
import pytest

from graph.spec import GraphConfigError, parse_spec
from tests.graph.fakes import occupy, wait_queued
from graph.executor import PRIORITY_SPEECH, Batcher, ComputePool, current_due, current_release
from graph.messages import AudioOut, ReplyParams, Turn, TurnDone
from graph.node import Node, NodeSession
from graph.registry import register_node
from graph.runtime import GraphRuntime
from graph.session import PlaybackClock


async def test_calls_and_batches_of_several_batchers_share_the_workers_in_urgency_order():
    pool = ComputePool(threads=1)
    order: list[str] = []
    def recorder(name):
        def run(items):
            order.append(f"{name}:{'+'.join(items)}")
            return items
        return run

    thinker = pool.batcher("thinker", recorder("thinker"))
    talker = pool.batcher("talker", recorder("talker"))
    gate = threading.Event()
    try:
        blocker = await occupy(pool, gate)
        work = [asyncio.ensure_future(thinker.submit("a"))]
        await wait_queued(thinker.queue_depth, 1)
        work.append(asyncio.ensure_future(pool.run(order.append, "speech-call", priority=PRIORITY_SPEECH)))
        work.append(asyncio.ensure_future(talker.submit("b")))
        await wait_queued(talker.queue_depth, 1)
        work.append(asyncio.ensure_future(pool.run(order.append, "call")))
        work.append(asyncio.ensure_future(thinker.submit("c")))
        await wait_queued(thinker.queue_depth, 2)
        gate.set()
        await asyncio.gather(blocker, *work)
        # The thinker's first item is the oldest: its batch takes "c" along; speech goes last.
        assert order == ["thinker:a+c", "talker:b", "call", "speech-call"]
    finally:
        pool.shutdown()


async def test_a_batcher_never_runs_two_batches_at_once_but_other_batchers_run_beside_it():
    pool = ComputePool(threads=3)
    lock = threading.Lock()
    running = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    both_ran_together = threading.Event()

    def batch_fn(name):
        def run(items):
            with lock:
                running[name] += 1
                most[name] = max(most[name], running[name])
                if running["a"] and running["b"]:
                    both_ran_together.set()
            threading.Event().wait(0.02)
            with lock:
                running[name] -= 1
            return items
        return run

    a = pool.batcher("a", batch_fn("a"), max_batch=1)
    b = pool.batcher("b", batch_fn("b"), max_batch=1)
    try:
        results = await asyncio.gather(*(a.submit(i) for i in range(5)), *(b.submit(i) for i in range(5)))
        assert results == [0, 1, 2, 3, 4] * 2
        assert most == {"a": 1, "b": 1}
        assert both_ran_together.is_set()  # three workers: the two batchers overlapped
        assert (a.batches_run, b.batches_run) == (5, 5)
    finally:
        pool.shutdown()


def recording_steps() -> tuple[ComputePool, list[str], Batcher]:
    """A one-worker pool and a batcher (one item per batch) that records the items it runs."""
    pool = ComputePool(threads=1)
    order: list[str] = []
    return pool, order, pool.batcher("steps", lambda items: [order.append(item) for item in items], max_batch=1)


async def test_work_with_an_earlier_due_time_runs_first():
    pool, order, steps = recording_steps()
    gate = threading.Event()
    try:
        blocker = await occupy(pool, gate)

        async def submit(name: str, due: float):
            current_due.set(lambda: due)
            await steps.submit(name)

        ahead = asyncio.ensure_future(submit("reply two seconds ahead of playback", 1e9 + 2))
        await wait_queued(steps.queue_depth, 1)
        waiting = asyncio.ensure_future(submit("turn waiting for first audio", 1e9))
        plain = asyncio.ensure_future(steps.submit("no clock: due when submitted"))  # monotonic() << 1e9
        await wait_queued(steps.queue_depth, 3)
        gate.set()
        await asyncio.gather(blocker, ahead, waiting, plain)
        assert order == ["no clock: due when submitted", "turn waiting for first audio", "reply two seconds ahead of playback"]
    finally:
        pool.shutdown()


async def test_a_due_time_given_with_the_work_overrides_the_tasks_clock():
    pool, order, steps = recording_steps()
    gate = threading.Event()
    try:
        blocker = await occupy(pool, gate)
        now = asyncio.ensure_future(steps.submit("audio that arrived just now"))
        await wait_queued(steps.queue_depth, 1)
        late = asyncio.ensure_future(steps.submit("audio that arrived a second ago", due=time.monotonic() - 1.0))
        call = asyncio.ensure_future(pool.run(lambda: order.append("call due long ago"), due=0.0))
        await wait_queued(steps.queue_depth, 2)
        await wait_queued(pool.queue_depth, 1)
        gate.set()
        await asyncio.gather(blocker, now, late, call)
        assert order == ["call due long ago", "audio that arrived a second ago", "audio that arrived just now"]
    finally:
        pool.shutdown()


async def test_a_lingering_batcher_lets_other_work_run_while_it_waits_for_its_batch():
    pool = ComputePool(threads=1)
    sizes: list[int] = []
    def run(items):
        sizes.append(len(items))
        return items

    steps = pool.batcher("steps", run, max_batch=8, linger_s=30.0)
    try:
        assert await asyncio.gather(*(steps.submit(i) for i in range(3))) == [0, 1, 2]
        assert sizes == [3]
        first = asyncio.ensure_future(steps.submit(10))  # fewer than last time: it waits for the rest
        await wait_queued(steps.queue_depth, 1)
        async with asyncio.timeout(5):  # the only worker is not stuck in the 30 s wait
            assert await pool.run(lambda: "other work") == "other work"
        assert not first.done()
        rest = [asyncio.ensure_future(steps.submit(i)) for i in (11, 12)]
        async with asyncio.timeout(5):
            assert await asyncio.gather(first, *rest) == [10, 11, 12]
        assert sizes == [3, 3]
    finally:
        pool.shutdown()


async def test_shutdown_fails_queued_batcher_items_and_later_submits():
    pool = ComputePool(threads=1)
    steps = pool.batcher("steps", lambda items: items)
    gate = threading.Event()
    blocker = await occupy(pool, gate)
    queued = asyncio.ensure_future(steps.submit("queued"))
    await wait_queued(steps.queue_depth, 1)
    pool.shutdown()
    gate.set()
    assert await blocker is True
    with pytest.raises(RuntimeError, match="shut down"):
        await queued
    with pytest.raises(RuntimeError, match="closed"):
        await steps.submit("later")


async def test_work_held_back_until_its_release_lets_later_work_run_first():
    pool, order, steps = recording_steps()
    try:
        async def ahead_of_playback(name: str, release_in: float):
            release_at = time.monotonic() + release_in
            current_release.set(lambda: release_at)
            current_due.set(lambda: 0.0)  # the most urgent by due time: only its release holds it back
            await steps.submit(name)
            return time.monotonic() - release_at

        held_call = asyncio.ensure_future(_release_call(pool, order, 0.3))
        held = asyncio.ensure_future(ahead_of_playback("reply ahead of its listener", 0.3))
        await wait_queued(steps.queue_depth, 1)
        await wait_queued(pool.queue_depth, 1)
        async with asyncio.timeout(0.25):  # the worker is free for work that came later
            await steps.submit("new turn")
            await pool.run(order.append, "new call")
        assert order == ["new turn", "new call"]
        late_by = await held
        assert late_by >= 0  # not started before its release
        await held_call
        assert sorted(order[2:]) == ["held call", "reply ahead of its listener"]
    finally:
        pool.shutdown()


async def test_held_work_starts_as_soon_as_its_release_clock_moves_earlier():
    pool = ComputePool(threads=1)
    steps = pool.batcher("steps", lambda items: items, max_batch=4)
    release_at = [time.monotonic() + 30.0]  # a reply 30 s ahead of its listener
    try:
        async def paced_step():
            current_release.set(lambda: release_at[0])
            return await steps.submit("step")

        held = asyncio.ensure_future(paced_step())
        await wait_queued(steps.queue_depth, 1)
        await asyncio.sleep(0.05)  # a negative check, no later event to wait for: it must not start
        assert not held.done()
        release_at[0] = -math.inf  # the reply was interrupted: nothing tells the pool
        async with asyncio.timeout(2):
            assert await held == "step"
    finally:
        pool.shutdown()


async def _release_call(pool: ComputePool, order: list[str], release_in: float) -> None:
    release_at = time.monotonic() + release_in
    current_release.set(lambda: release_at)
    await pool.run(order.append, "held call", due=0.0)


def test_playback_clock_releases_reply_work_lookahead_before_it_is_due(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("graph.session.time.monotonic", lambda: now[0])
    clock = PlaybackClock(margin_s=0.2, lookahead_s=0.5)
    clock.reply_requested()
    assert clock.release() == -math.inf  # before the first audio: at once
    clock.audio_sent(2.0)  # first audio at 100.0: the listener runs dry at 102.0
    assert clock.due() == pytest.approx(101.8)
    assert clock.release() == pytest.approx(101.3)
    assert PlaybackClock(margin_s=0.2).release() == -math.inf  # no lookahead: never held back


def test_playback_clock_says_when_reply_work_is_due(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("graph.session.time.monotonic", lambda: now[0])
    clock = PlaybackClock(margin_s=0.2)
    assert clock.due() == 100.0  # nothing asked for: due now
    clock.reply_requested()
    now[0] = 100.5
    # The listener waits from the moment it asked, as if it ran dry then: every stage of the
    # reply is due the margin before that, the stage nearer the listener first.
    assert clock.due() == pytest.approx(99.8)
    assert clock.due(stages_out=0) < clock.due(stages_out=1) < clock.due(stages_out=2) < 99.81
    clock.audio_sent(1.0)  # first audio at 100.5, 1 s of audio: counted from the request
    now[0] = 100.9
    assert clock.due() == pytest.approx(100.8)
    assert clock.due(stages_out=2) == clock.due()  # once audio plays, stages tie
    clock.audio_sent(0.5)
    assert clock.due() == pytest.approx(101.3)
    clock.reply_ended()
    assert clock.due() == 100.9


def test_an_utterance_prefilled_in_its_pause_is_due_as_if_its_reply_was_asked_for_then(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("graph.session.time.monotonic", lambda: now[0])
    clock = PlaybackClock(margin_s=0.2)
    clock.utterance_paused()  # early prefill: the turn will most likely end within the pause
    now[0] = 100.2
    assert clock.due() == pytest.approx(99.8)  # not "now": ahead of replies building up their buffers
    assert clock.phase() == "unasked"
    clock.utterance_resumed()  # the speaker went on
    assert clock.due() == 100.2
    clock.utterance_paused()
    now[0] = 100.3
    clock.reply_requested()  # the turn ended: due from the request on
    assert clock.due() == pytest.approx(100.1)


@register_node("test.turn_sink")
class TurnSink(Node):
    """Takes turns and does nothing with them."""

    inputs = {"turns": (Turn,)}
    outputs = {}

    def open_session(self, session):
        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                pass

        return State(self, session)


async def test_a_speculative_turn_starts_its_sessions_pause_and_its_retraction_ends_it():
    runtime = GraphRuntime.from_config({
        "model_id": "m",
        "imports": ["tests.graph.test_compute_engine"],
        "nodes": {"sink": {"type": "test.turn_sink"}},
        "inputs": {"turns": "sink.turns"},
        "outputs": [],
    })
    await runtime.start()
    try:
        session = await runtime.open_session("s")
        sent_at = time.monotonic()
        await session.send("turns", Turn(turn_id=0, item_id="early_0", speculative=True, text="hi"))
        assert session.playback.due() <= sent_at - session.playback.margin_s + 0.001
        await session.send("turns", Turn(turn_id=1, retracts="early_0"))
        assert session.playback.due() >= sent_at
        await session.close()
    finally:
        await runtime.stop(0)


@register_node("test.reply_audio")
class ReplyAudio(Node):
    """A reply-side node: records its compute's due time, then speaks one second of audio."""

    inputs = {"turns": (Turn,)}
    outputs = {"audio": (AudioOut, TurnDone)}
    follows_playback = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dues: list[float] = []

    def open_session(self, session):
        node = self

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                node.dues.append(await node.context.compute.run(lambda due=current_due.get(): due()))
                await emit("audio", AudioOut(turn_id=message.turn_id, samples=np.zeros(24000, np.float32), sample_rate=24000))
                node.dues.append(await node.context.compute.run(lambda due=current_due.get(): due()))
                await emit("audio", TurnDone(turn_id=message.turn_id, response_id=message.reply.response_id))

        return State(self, session)


async def test_reply_side_nodes_compute_by_their_sessions_playback_clock():
    runtime = GraphRuntime.from_config({
        "model_id": "m",
        "imports": ["tests.graph.test_compute_engine"],
        "nodes": {"speaker": {"type": "test.reply_audio"}},
        "inputs": {"turns": "speaker.turns"},
        "outputs": ["speaker.audio"],
    })
    await runtime.start()
    try:
        session = await runtime.open_session("s")
        await session.send("turns", Turn(turn_id=0, role="user", text="hi", reply=ReplyParams(response_id="r")))
        async with asyncio.timeout(5):
            async for message in session.outputs():
                if isinstance(message, TurnDone):
                    break
        before_audio, after_audio = runtime.nodes["speaker"].dues
        # Before the first audio: due when the reply was asked for; after one second of audio was
        # sent: due (that second - the margin) after the first audio, i.e. later.
        assert after_audio - before_audio >= 1.0 - session.playback.margin_s
        # A live listener's reply is made at most the profile's lookahead ahead (default 500 ms);
        # a speech request is a download, never held back.
        speech = await runtime.open_session("download", kind="speech")
        assert (session.playback.lookahead_s, speech.playback.lookahead_s) == (0.5, None)
        await speech.close()
        await session.close()
    finally:
        await runtime.stop(0)
    # Stopped means the workers have exited: no native call is left running at process exit.
    assert not any(worker.is_alive() for worker in runtime.compute._workers)


def test_compute_threads_and_lookahead_come_from_the_profile_and_are_validated():
    base = {"model_id": "m", "nodes": {"n": {"type": "x"}}}
    assert (parse_spec(base).compute_threads, parse_spec(base).compute_lookahead_s) == (1, 0.5)
    assert parse_spec(base | {"compute": {"threads": 3}}).compute_threads == 3
    assert parse_spec(base | {"compute": {"lookahead_ms": 150}}).compute_lookahead_s == 0.15
    assert parse_spec(base | {"compute": {"lookahead_ms": None}}).compute_lookahead_s is None
    for bad, key in (({"threads": 0}, "compute.threads"), ({"threads": "2"}, "compute.threads"), ({"workers": 2}, "compute.workers"),
                     ({"lookahead_ms": -1}, "compute.lookahead_ms"), ({"lookahead_ms": "soon"}, "compute.lookahead_ms")):
        with pytest.raises(GraphConfigError, match=key.replace(".", r"\.")):
            parse_spec(base | {"compute": bad})
