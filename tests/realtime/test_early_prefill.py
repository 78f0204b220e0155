"""Early prefill, the VAD and dialog side: the VAD's `SpeechPaused` before a turn ends, and the
dialog's speculative, confirming and retracting turns. Each node runs through the graph runtime
on its own; the VAD's model is replaced by a script (a window of zeros is silence, any other
window speech), so the windows the events follow are exact."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from graph.messages import (
    AudioChunk,
    Clear,
    Commit,
    Configure,
    CreateResponse,
    ImageFrame,
    NodeEvent,
    ReplyParams,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Stage,
    Turn,
)
from graph.runtime import GraphRuntime
from nodes.vad import CONTEXT, WINDOW, WINDOW_MS
from tests.realtime.test_vad_dialog import TD, chunk16, drain, single_node_profile

# --------------------------------------------------------------------------- vad


async def scripted_vad(params: dict) -> GraphRuntime:
    runtime = GraphRuntime.from_config(single_node_profile("vad", "silero_vad", {"smart_turn": False, **params}))
    await runtime.start()
    node = runtime.nodes["vad"]

    async def scripted(item, priority=None, due=None):
        window, state = item
        return (0.9 if np.any(window[CONTEXT:]) else 0.0), state

    node.batcher.submit = scripted
    return runtime


@pytest.fixture
async def vad_runtime():
    runtime = await scripted_vad({})
    yield runtime
    await runtime.stop(0)


async def vad_events(runtime, name: str, turn_detection: dict, pattern: str) -> list:
    """Feed one window per letter of `pattern` ("s" speech, "." silence); everything out up to the stop."""
    session = await runtime.open_session(name, config={"turn_detection": turn_detection})
    for index, kind in enumerate(pattern):
        samples = np.full(WINDOW, 0.1 if kind == "s" else 0.0, np.float32)
        await session.send("in", AudioChunk(samples=samples, sample_rate=16000, media_ms=index * WINDOW_MS))
    out = await drain(session, "SpeechStopped")
    await session.close("done")
    return out


def window_before(out: list, event) -> float:
    """The start of the window an event follows."""
    previous = out[out.index(event) - 1]
    assert isinstance(previous, AudioChunk)
    return previous.media_ms


async def test_vad_says_the_pause_prefill_early_ms_before_the_silence_would_end_the_turn(vad_runtime):
    out = await vad_events(vad_runtime, "pause", TD, "s" * 10 + "." * 20)
    (paused,) = [m for m in out if isinstance(m, SpeechPaused)]
    stopped = out[-1]
    # Silence starts at 320 ms; 500 - 300 = 200 ms of it is first reached by the 7th silent window.
    assert not paused.resumed
    assert paused.audio_end_ms == paused.media_ms == 320 + 7 * WINDOW_MS
    assert window_before(out, paused) == 320 + 6 * WINDOW_MS
    assert stopped.audio_end_ms == 320 + 16 * WINDOW_MS and window_before(out, stopped) == 320 + 15 * WINDOW_MS


async def test_vad_says_when_speech_comes_back_after_a_pause_and_pauses_again(vad_runtime):
    out = await vad_events(vad_runtime, "resume", TD, "s" * 10 + "." * 10 + "s" * 5 + "." * 20)
    paused = [m for m in out if isinstance(m, SpeechPaused)]
    assert [(p.resumed, p.audio_end_ms) for p in paused] == [
        (False, 320 + 7 * WINDOW_MS),
        (True, 21 * WINDOW_MS),  # right after the first window of speech again
        (False, 25 * WINDOW_MS + 7 * WINDOW_MS),
    ]
    assert window_before(out, paused[1]) == 20 * WINDOW_MS
    assert isinstance(out[-1], SpeechStopped) and out[-1].audio_end_ms == 25 * WINDOW_MS + 16 * WINDOW_MS


async def test_a_session_warms_ahead_exactly_when_its_vad_says_pauses():
    """What keep-warm asks (graph/runtime.py): plain server VAD with early prefill, nothing else."""
    semantic = {**TD, "semantic": {"check_after_ms": 200, "max_silence_ms": 2000}}
    cases = [({}, TD, True), ({}, None, False), ({}, semantic, False), ({"prefill_early_ms": None}, TD, False)]
    for params, turn_detection, expected in cases:
        runtime = await scripted_vad(params)
        try:
            session = await runtime.open_session("s", config={"turn_detection": turn_detection})
            assert session.warms_ahead() is expected, (params, turn_detection)
            await session.send("in", Configure(target=Stage.VAD, config={"turn_detection": None}))  # a session.update turning VAD off
            async with asyncio.timeout(5):
                while session.warms_ahead():
                    await asyncio.sleep(0.01)
        finally:
            await runtime.stop(0)


async def test_vad_says_no_pause_in_semantic_mode(vad_runtime):
    semantic = {**TD, "semantic": {"check_after_ms": 200, "max_silence_ms": 2000}}
    out = await vad_events(vad_runtime, "semantic", semantic, "s" * 10 + "." * 20)
    assert isinstance(out[-1], SpeechStopped)  # without the classifier loaded, its first check point ends the turn
    assert not any(isinstance(m, SpeechPaused) for m in out)


async def test_vad_says_no_pause_when_too_short_a_silence_would_leave_no_time_ahead(vad_runtime):
    out = await vad_events(vad_runtime, "short", {**TD, "silence_duration_ms": 100}, "s" * 10 + "." * 10)
    assert isinstance(out[-1], SpeechStopped)
    assert not any(isinstance(m, SpeechPaused) for m in out)


@pytest.mark.parametrize("off", [None, 0])
async def test_vad_says_no_pause_with_prefill_early_ms_off(off):
    runtime = await scripted_vad({"prefill_early_ms": off})
    try:
        out = await vad_events(runtime, "off", TD, "s" * 10 + "." * 20)
    finally:
        await runtime.stop(0)
    assert isinstance(out[-1], SpeechStopped)
    assert not any(isinstance(m, SpeechPaused) for m in out)


# --------------------------------------------------------------------------- dialog

AUTO = {"turn_detection": TD, "auto_reply": ReplyParams(voice="ethan")}


@pytest.fixture
async def dialog_runtime():
    runtime = GraphRuntime.from_config(single_node_profile("dialog", "dialog"))
    await runtime.start()
    yield runtime
    await runtime.stop(0)


async def speak(session, pause: list | None, after_pause: tuple = ()) -> None:
    """300 ms before speech, speech from 300 ms, the pause's events at 800 ms, silence to 1100 ms."""
    for ms in range(0, 300, 100):
        await session.send("in", chunk16(ms, value=0.0))
    await session.send("in", SpeechStarted(audio_start_ms=300))
    await session.send("in", ImageFrame(image=b"frame", media_ms=400))
    for ms in range(300, 800, 100):
        await session.send("in", chunk16(ms))
    for message in pause or ():
        await session.send("in", message)
    for message in after_pause:
        await session.send("in", message)
    for ms in range(800, 1100, 100):
        await session.send("in", chunk16(ms, value=0.0))
    await session.send("in", SpeechStopped(audio_end_ms=1100))


def client_view(out: list) -> list[tuple[str, dict]]:
    """The dialog's events with the random ids replaced by their order of appearance."""
    names: dict[str, str] = {}
    view = []
    for event in (m for m in out if isinstance(m, NodeEvent)):
        fields = {key: names.setdefault(value, f"id{len(names)}") if key in ("item_id", "response_id") else value
                  for key, value in event.payload().items()}
        view.append((event.kind, fields))
    return view


def turns_of(out: list) -> list[Turn]:
    return [m for m in out if isinstance(m, Turn)]


async def test_a_pause_sends_the_utterance_ahead_and_the_stop_confirms_it_with_the_same_events(dialog_runtime):
    plain = await dialog_runtime.open_session("plain", config=AUTO)
    await speak(plain, pause=None)
    expected = await drain(plain, "committed")

    early = await dialog_runtime.open_session("early", config=AUTO)
    await speak(early, pause=[SpeechPaused(audio_end_ms=800, media_ms=800)])
    out = await drain(early, "committed")

    assert client_view(out) == client_view(expected)
    speculative, confirming = turns_of(out)
    (normal,) = turns_of(expected)
    assert speculative.speculative and speculative.item_id.startswith("spec_")
    assert len(speculative.audio) == 16 * 800  # 300 ms prefix + speech up to the pause
    assert speculative.images == [b"frame"] and not speculative.awaited
    # It carries the automatic reply under a provisional id the client never sees, asked for by no one yet.
    provisional = speculative.reply
    assert provisional is not None and provisional.response_id.startswith("spec_resp_")
    assert provisional.response_id not in {f.get("response_id") for _, f in client_view(out)}
    assert provisional.response_id not in dialog_runtime.sessions[early.id].replies
    assert speculative.media_ms == normal.media_ms == 0
    committed = out[-1]
    assert confirming.confirms == speculative.item_id and not confirming.speculative
    assert confirming.audio is None and confirming.images == []
    assert confirming.item_id == committed.item_id and committed.audio_ms == 1100
    assert confirming.reply is not None and confirming.reply.response_id == committed.response_id
    assert confirming.awaited and confirming.turn_id == committed.turn_id
    assert (confirming.media_ms, confirming.reply.voice, confirming.transcribe) == (normal.media_ms, normal.reply.voice, None)
    # The same reply, under the real id.
    assert confirming.reply == msgspec.structs.replace(provisional, response_id=confirming.reply.response_id)
    assert len(normal.audio) == 16 * 1100 and normal.confirms is None


async def test_speech_resuming_retracts_the_speculation_and_the_stop_commits_the_full_utterance(dialog_runtime):
    session = await dialog_runtime.open_session("resumed", config=AUTO)
    await speak(session, pause=[SpeechPaused(audio_end_ms=800), SpeechPaused(audio_end_ms=900, resumed=True)])
    out = await drain(session, "committed")
    speculative, retracting, committed = turns_of(out)
    assert retracting.retracts == speculative.item_id and retracting.audio is None and retracting.reply is None
    assert committed.confirms is None and not committed.speculative
    assert len(committed.audio) == 16 * 1100 and committed.images == [b"frame"] and committed.reply is not None
    assert [e.kind for e in out if isinstance(e, NodeEvent)] == ["speech_started", "speech_stopped", "committed"]


@pytest.mark.parametrize(
    "during_pause",
    [Clear(), CreateResponse(reply=ReplyParams(response_id="resp_x")), Commit(), ImageFrame(image=b"late", media_ms=850),
     Configure(target=Stage.DIALOG, config={"auto_reply": ReplyParams(voice="cedar")})],
    ids=["clear", "create_response", "commit", "image", "configure"],
)
async def test_anything_else_during_the_pause_retracts_the_speculation_first(dialog_runtime, during_pause):
    session = await dialog_runtime.open_session("other", config=AUTO)
    await speak(session, pause=[SpeechPaused(audio_end_ms=800)], after_pause=(during_pause,))
    await session.send("in", Clear())  # an end to read up to
    out = await drain(session, "cleared")
    turns = turns_of(out)
    speculative, retracting = turns[:2]
    assert speculative.speculative and retracting.retracts == speculative.item_id
    assert out.index(retracting) == out.index(speculative) + 1  # before the command did anything
    assert not any(turn.confirms for turn in turns)
    if isinstance(during_pause, (CreateResponse, ImageFrame, Configure)):
        # The utterance went on and was committed the old way, with all its audio.
        assert len(turns[-1].audio) == 16 * 1100
    if isinstance(during_pause, Configure):  # with the new automatic reply
        assert turns[-1].reply is not None and turns[-1].reply.voice == "cedar"


async def test_a_commit_without_its_reply_retracts_the_speculation_and_commits_the_full_utterance(dialog_runtime):
    session = await dialog_runtime.open_session("full_queue", config=AUTO)
    for ms in range(0, 300, 100):
        await session.send("in", chunk16(ms, value=0.0))
    await session.send("in", SpeechStarted(audio_start_ms=300))
    for ms in range(300, 800, 100):
        await session.send("in", chunk16(ms))
    await session.send("in", SpeechPaused(audio_end_ms=800))
    (speculative,) = turns_of(await drain(session, "Turn"))
    # The queue of replies is full by the stop (the state the commit reads): the reply is refused.
    dialog = dialog_runtime.sessions[session.id]._node_sessions["dialog"]
    for n in range(dialog.node.max_queued_turns + 1):
        session.replies.asked(100 + n, f"resp_{n}")
    for ms in range(800, 1100, 100):
        await session.send("in", chunk16(ms, value=0.0))
    await session.send("in", SpeechStopped(audio_end_ms=1100))
    out = await drain(session, "committed")
    retracting, committed = turns_of(out)
    # The model holds a reply header this turn must not have: out with it, and in the old way.
    assert retracting.retracts == speculative.item_id
    assert committed.reply is None and committed.confirms is None and len(committed.audio) == 16 * 1100
    assert out[-1].response_id == ""  # no reply was made with it


async def test_no_speculation_while_a_reply_is_open(dialog_runtime):
    session = await dialog_runtime.open_session("busy", config=AUTO)
    await session.send("in", CreateResponse(reply=ReplyParams(response_id="resp_open")))
    await speak(session, pause=[SpeechPaused(audio_end_ms=800)])
    out = await drain(session, "committed")
    reply_request, committed = turns_of(out)
    assert reply_request.reply.response_id == "resp_open"
    assert not committed.confirms and len(committed.audio) == 16 * 1100


async def test_no_speculation_without_an_automatic_reply(dialog_runtime):
    session = await dialog_runtime.open_session("manual_replies", config={"turn_detection": {**TD, "create_response": False}, "auto_reply": ReplyParams()})
    await speak(session, pause=[SpeechPaused(audio_end_ms=800)])
    (committed,) = turns_of(await drain(session, "committed"))
    assert not committed.confirms and len(committed.audio) == 16 * 1100 and committed.reply is None


async def test_the_confirming_turn_carries_the_transcription_request(dialog_runtime):
    transcription = {"language": "en", "prompt": None, "keep_in_history": True}
    session = await dialog_runtime.open_session("transcribed", config={**AUTO, "transcription": transcription})
    await speak(session, pause=[SpeechPaused(audio_end_ms=800)])
    speculative, confirming = turns_of(await drain(session, "committed"))
    assert speculative.transcribe is None
    assert confirming.confirms == speculative.item_id and confirming.transcribe == transcription
