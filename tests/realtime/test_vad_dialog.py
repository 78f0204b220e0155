"""The vad and dialog nodes, each driven through the graph runtime on its own."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from graph.messages import AudioChunk, Clear, Commit, CreateResponse, ImageFrame, Interrupt, NodeEvent, ReplyParams, SpeechStarted, SpeechStopped, Turn
from graph.runtime import GraphRuntime
from nodes.vad import CONTEXT, WINDOW, SileroModel
from tests.realtime.speech import silence, speech

TD = {"threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}


def single_node_profile(name: str, node_type: str, params: dict | None = None) -> dict:
    streams = {"silero_vad": ("audio", "events"), "dialog": ("events", "events")}[node_type]
    outputs = [f"{name}.{streams[1]}"] + (["dialog.turns"] if node_type == "dialog" else [])
    return {
        "model_id": "test",
        "imports": ["nodes.vad", "nodes.dialog"],
        "nodes": {name: {"type": node_type, "params": params or {}}},
        "edges": [],
        "inputs": {"in": f"{name}.{streams[0]}"},
        "outputs": outputs,
        "limits": {"max_sessions": 16},
    }


@pytest.fixture
async def vad_runtime():
    runtime = GraphRuntime.from_config(single_node_profile("vad", "silero_vad"))
    await runtime.start()
    yield runtime
    await runtime.stop(0)


@pytest.fixture
async def dialog_runtime():
    runtime = GraphRuntime.from_config(single_node_profile("dialog", "dialog", {"max_utterance_seconds": 2, "max_queued_turns": 2}))
    await runtime.start()
    yield runtime
    await runtime.stop(0)


async def drain(session, until_kind, timeout: float = 20.0) -> list:
    out = []
    async with asyncio.timeout(timeout):
        async for message in session.outputs():
            out.append(message)
            if type(message).__name__ == until_kind or (isinstance(message, NodeEvent) and message.kind == until_kind):
                return out


async def feed(session, audio: np.ndarray, rate: int, chunk_ms: int = 100) -> None:
    step = rate * chunk_ms // 1000
    for start in range(0, len(audio), step):
        await session.send("in", AudioChunk(samples=audio[start : start + step], sample_rate=rate, media_ms=start * 1000 / rate))


# --------------------------------------------------------------------------- vad


@pytest.mark.parametrize("rate", [24000, 16000, 8000])
async def test_vad_finds_the_speech_in_a_spoken_sentence_at_any_input_rate(vad_runtime, rate):
    session = await vad_runtime.open_session(f"s{rate}", config={"turn_detection": TD})
    spoken = speech(rate=rate)
    audio = np.concatenate([silence(1.0, rate), spoken, silence(1.0, rate)])
    feeding = asyncio.create_task(feed(session, audio, rate))
    out = await drain(session, "SpeechStopped")
    await feeding
    started = next(m for m in out if isinstance(m, SpeechStarted))
    stopped = out[-1]
    speech_end_ms = 1000 + len(spoken) * 1000 / rate
    assert 900 <= started.audio_start_ms <= 1300
    # The stop includes the 500 ms silence window (espeak ends its audio with a short pause).
    assert speech_end_ms <= stopped.audio_end_ms <= speech_end_ms + 700
    chunks = [m for m in out if isinstance(m, AudioChunk)]
    assert all(c.sample_rate == 16000 for c in chunks)
    assert len(chunks[0].samples) == WINDOW


async def test_vad_off_still_resamples_and_forwards_audio_and_commands_in_order(vad_runtime):
    session = await vad_runtime.open_session("manual", config={"turn_detection": None})
    await feed(session, np.concatenate([speech(rate=24000)[:24000]]), 24000)
    await session.send("in", Commit())
    out = await drain(session, "Commit")
    assert not any(isinstance(m, (SpeechStarted, SpeechStopped)) for m in out)
    # Every sample before the commit reaches the dialog ahead of it, partial window included.
    forwarded = sum(len(m.samples) for m in out if isinstance(m, AudioChunk))
    assert abs(forwarded - 16000) <= 64


def test_batched_inference_equals_one_session_at_a_time():
    model = SileroModel()
    rng = np.random.default_rng(0)
    windows = [rng.uniform(-0.3, 0.3, CONTEXT + WINDOW).astype(np.float32) for _ in range(5)]
    states = [rng.uniform(-0.1, 0.1, (2, 128)).astype(np.float32) for _ in range(5)]
    batched = model.run_batch(list(zip(windows, states)))
    for (window, state), (probability, new_state) in zip(zip(windows, states), batched):
        (alone_probability, alone_state), = model.run_batch([(window, state)])
        assert probability == pytest.approx(alone_probability, abs=1e-5)
        assert np.allclose(new_state, alone_state, atol=1e-5)


async def test_concurrent_sessions_share_one_batched_onnx_call(vad_runtime):
    node = vad_runtime.nodes["vad"]
    sizes: list[int] = []
    run_batch = node.model.run_batch
    gate = threading.Event()

    def slow_batch(items):
        sizes.append(len(items))
        gate.wait(0.005)  # a forward that takes a while, so other sessions' windows queue up
        return run_batch(items)

    node.batcher._batch_fn = slow_batch
    sessions = [await vad_runtime.open_session(f"c{i}", config={"turn_detection": TD}) for i in range(6)]
    audio = speech(rate=16000)[:16000]
    readers = [asyncio.create_task(drain_count(s, 16000 // WINDOW)) for s in sessions]
    await asyncio.gather(*(feed(s, audio, 16000) for s in sessions))
    await asyncio.gather(*readers)
    assert max(sizes) > 1
    assert sum(sizes) == 6 * (16000 // WINDOW)


async def test_each_window_is_due_when_its_audio_reached_the_server(vad_runtime):
    node = vad_runtime.nodes["vad"]
    dues: list[float | None] = []
    submit = node.batcher.submit

    async def recording_submit(item, priority=None, due=None):
        dues.append(due)
        return await submit(item, priority, due)

    node.batcher.submit = recording_submit
    session = await vad_runtime.open_session("due", config={"turn_detection": TD})
    before = time.monotonic()
    # Two windows' worth stamped by the transport long ago, then one the graph stamps on arrival.
    await session.send("in", AudioChunk(samples=np.zeros(2 * WINDOW, np.float32), sample_rate=16000, received_at=12.5))
    unstamped = AudioChunk(samples=np.zeros(WINDOW, np.float32), sample_rate=16000)
    await session.send("in", unstamped)
    await drain_count(session, 3)
    assert unstamped.received_at is not None and unstamped.received_at >= before
    assert dues == [12.5, 12.5, unstamped.received_at]


async def drain_count(session, windows: int) -> None:
    seen = 0
    async for message in session.outputs():
        seen += isinstance(message, AudioChunk)
        if seen == windows:
            return


# --------------------------------------------------------------------------- dialog


def chunk16(ms: float, length_ms: float = 100, value: float = 0.1) -> AudioChunk:
    return AudioChunk(samples=np.full(int(16 * length_ms), value, np.float32), sample_rate=16000, media_ms=ms)


async def test_an_utterance_runs_from_speech_start_minus_prefix_padding_to_speech_stop(dialog_runtime):
    session = await dialog_runtime.open_session("d", config={"turn_detection": TD})
    for ms in range(0, 1000, 100):
        await session.send("in", chunk16(ms))
    await session.send("in", SpeechStarted(audio_start_ms=1000))
    for ms in (200, 900, 1100, 1200, 1300, 1400):
        await session.send("in", ImageFrame(image=f"frame{ms}".encode(), media_ms=ms))
    for ms in range(1000, 1500, 100):
        await session.send("in", chunk16(ms))
    await session.send("in", SpeechStopped(audio_end_ms=1500))
    out = await drain(session, "committed")
    started = next(m for m in out if isinstance(m, NodeEvent) and m.kind == "speech_started")
    turn = next(m for m in out if isinstance(m, Turn))
    committed = out[-1]
    assert started.audio_start_ms == 700
    assert len(turn.audio) == 16 * 800  # 300 ms prefix + 500 ms of speech
    assert turn.images == [b"frame1100", b"frame1200", b"frame1300", b"frame1400"]  # the newest 4 inside it
    assert turn.reply is None and turn.item_id == started.item_id == committed.item_id
    assert committed.turn_id == turn.turn_id and committed.auto_reply is True


async def test_manual_commits_clears_and_the_100ms_minimum(dialog_runtime):
    session = await dialog_runtime.open_session("m", config={"turn_detection": None})
    await session.send("in", chunk16(0, 50))
    await session.send("in", Commit())
    error = (await drain(session, "error"))[-1]
    assert error.code == "input_audio_buffer_commit_empty"
    await session.send("in", Clear())
    assert (await drain(session, "cleared"))[-1].kind == "cleared"
    await session.send("in", chunk16(50, 300))
    await session.send("in", Commit())
    out = await drain(session, "committed")
    turn = next(m for m in out if isinstance(m, Turn))
    assert len(turn.audio) == 16 * 300 and out[-1].auto_reply is False


async def test_a_server_vad_utterance_is_committed_at_max_utterance_seconds(dialog_runtime):
    session = await dialog_runtime.open_session("long", config={"turn_detection": TD})
    await session.send("in", SpeechStarted(audio_start_ms=0))
    for ms in range(0, 3000, 100):
        await session.send("in", chunk16(ms))
    out = await drain(session, "committed")
    assert any(isinstance(m, NodeEvent) and m.kind == "error" and m.code == "utterance_too_long" for m in out)
    turn = next(m for m in out if isinstance(m, Turn))
    assert len(turn.audio) <= 16 * 2100


async def test_replies_past_max_queued_turns_are_refused(dialog_runtime):
    session = await dialog_runtime.open_session("q", config={"turn_detection": TD})
    for n in range(4):  # one being answered + 2 queued is the bound
        await session.send("in", CreateResponse(reply=ReplyParams(response_id=f"r{n}")))
    out = await drain(session, "error")
    queued = [m for m in out if isinstance(m, NodeEvent) and m.kind == "turn_queued"]
    assert [m.response_id for m in queued] == ["r0", "r1", "r2"]
    assert (out[-1].kind, out[-1].code, out[-1].response_id) == ("error", "max_queued_turns_exceeded", "r3")
    # r0's TurnDone leaves the graph (this graph has no model: the ledger hears it as the session would).
    session.replies.ended(queued[0].turn_id, "r0")
    await session.send("in", CreateResponse(reply=ReplyParams(response_id="r4")))
    assert (await drain(session, "turn_queued"))[-1].response_id == "r4"


async def test_a_reply_cancelled_before_its_request_reaches_the_dialog_is_never_asked_for(dialog_runtime):
    session = await dialog_runtime.open_session("cancel_ahead", config={"turn_detection": TD})
    # The cancel is a control: it overtakes the request still on its way (here: not sent yet).
    session.control(Interrupt(response_id="r0"))
    await session.send("in", CreateResponse(reply=ReplyParams(response_id="r0")))
    await session.send("in", CreateResponse(reply=ReplyParams(response_id="r1")))
    out = await drain(session, "turn_queued")
    assert [m.reply.response_id for m in out if isinstance(m, Turn)] == ["r1"]
    assert [m.response_id for m in out if isinstance(m, NodeEvent)] == ["r1"]
    assert "r0" not in session.replies and "r1" in session.replies
    # The cancel answered once: the same id asked for again is a new reply.
    await session.send("in", CreateResponse(reply=ReplyParams(response_id="r0")))
    assert (await drain(session, "turn_queued"))[-1].response_id == "r0"


async def test_server_vad_idle_timeout_commits_an_empty_turn_that_asks_for_a_reply(dialog_runtime):
    session = await dialog_runtime.open_session("idle", config={"turn_detection": {**TD, "idle_timeout_ms": 500}})
    for ms in range(0, 800, 100):
        await session.send("in", chunk16(ms, value=0.0))
    out = await drain(session, "committed")
    timeout = next(m for m in out if isinstance(m, NodeEvent) and m.kind == "timeout_triggered")
    assert timeout.audio_start_ms == 0 and timeout.audio_end_ms >= 500
    committed = out[-1]
    assert committed.auto_reply is True and committed.item_id == timeout.item_id


async def test_a_client_commit_during_server_vad_speech_ends_that_utterance(dialog_runtime):
    session = await dialog_runtime.open_session("vc", config={"turn_detection": TD})
    await session.send("in", SpeechStarted(audio_start_ms=0))
    for ms in range(0, 500, 100):
        await session.send("in", chunk16(ms))
    await session.send("in", Commit())
    committed = (await drain(session, "committed"))[-1]
    assert committed.auto_reply is False
    for ms in range(500, 800, 100):
        await session.send("in", chunk16(ms))
    await session.send("in", SpeechStopped(audio_end_ms=800))
    await session.send("in", Clear())
    rest = await drain(session, "cleared")
    # The speech after the commit starts no second turn of its own.
    assert not any(isinstance(m, (Turn,)) or (isinstance(m, NodeEvent) and m.kind in ("committed", "speech_stopped")) for m in rest)
