"""Turn-taking on real speech (espeak-ng): semantic end of turn (Smart Turn v3.2) and barge-in
that ignores short sounds. The vad and dialog nodes run through the graph runtime, configured
from the session's `turn_detection` exactly as a realtime session configures them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from graph.messages import (
    AudioChunk,
    CreateResponse,
    InputCommitted,
    InputEnd,
    InputSoundDismissed,
    InputSoundStarted,
    InputSpeechStarted,
    NodeEvent,
    ReplyParams,
)
from graph.runtime import GraphRuntime
from nodes import smart_turn
from session_server.realtime.protocol import HoldPlayback, RealtimeProtocol, SendEvent
from session_server.realtime.session_config import SessionConfig, TurnDetection
from tests.realtime.speech import silence, speech

RATE = 16000
PROFILE = {
    "model_id": "test",
    "imports": ["nodes.vad", "nodes.dialog"],
    "nodes": {"vad": {"type": "silero_vad"}, "dialog": {"type": "dialog"}},
    "edges": ["vad.events -> dialog.events"],
    "inputs": {"in": "vad.audio"},
    "outputs": ["dialog.events", "dialog.turns"],
    "limits": {"max_sessions": 16},
}


@pytest.fixture
async def runtime():
    runtime = GraphRuntime.from_config(PROFILE)
    await runtime.start()
    yield runtime
    await runtime.stop(0)


def graph_config(**detection) -> dict:
    return SessionConfig(model="m", turn_detection=TurnDetection(**detection)).to_graph()


async def events_for(runtime, name: str, config: dict, audio: np.ndarray, before=()) -> list[NodeEvent]:
    """Feed 16 kHz audio in 100 ms chunks, then `input_end`; the dialog's events up to `input_ended`."""
    session = await runtime.open_session(name, config=config)
    for message in before:
        await session.send("in", message)
    step = RATE // 10
    for start in range(0, len(audio), step):
        await session.send("in", AudioChunk(samples=audio[start:start + step], sample_rate=RATE, media_ms=start * 1000 / RATE))
    await session.send("in", InputEnd())
    out: list[NodeEvent] = []
    async with asyncio.timeout(60):
        async for message in session.outputs():
            if isinstance(message, NodeEvent):
                out.append(message)
                if message.kind == "input_ended":
                    break
    await session.close("done")
    return out


def of_kind(events: list[NodeEvent], kind: str) -> list[NodeEvent]:
    return [event for event in events if event.kind == kind]


def interrupted_question() -> tuple[np.ndarray, float]:
    """'What is the weather like in' + 900 ms + 'Paris today?' + 3 s; returns it and where speech ends (ms)."""
    first, second = speech("What is the weather like in", RATE), speech("Paris today?", RATE)
    audio = np.concatenate([silence(0.5, RATE), first, silence(0.9, RATE), second])
    return np.concatenate([audio, silence(3.0, RATE)]), len(audio) * 1000 / RATE


def test_the_classifier_is_installed_by_the_smart_turn_extra():
    assert smart_turn.available(), smart_turn.EXTRA_HINT


@pytest.mark.parametrize("eagerness", ["low", "medium"])
async def test_semantic_vad_waits_through_a_mid_sentence_pause_and_commits_one_turn(runtime, eagerness):
    audio, speech_end_ms = interrupted_question()
    events = await events_for(runtime, f"semantic-{eagerness}", graph_config(type="semantic_vad", eagerness=eagerness), audio)
    (stopped,) = of_kind(events, "speech_stopped")
    assert len(of_kind(events, "committed")) == 1
    # Committed on the classifier's word, long before the eagerness maximum (4 s, 8 s) ran out.
    assert stopped.audio_end_ms <= speech_end_ms + 1000
    assert events.index(of_kind(events, "committed")[0]) < events.index(of_kind(events, "input_ended")[0])


async def test_server_vad_with_a_500ms_window_commits_the_same_speech_as_two_turns(runtime):
    audio, _ = interrupted_question()
    events = await events_for(runtime, "server", graph_config(type="server_vad", silence_duration_ms=500), audio)
    assert len(of_kind(events, "committed")) == 2


async def test_server_vad_with_the_semantic_check_commits_the_same_speech_as_one_turn(runtime):
    audio, _ = interrupted_question()
    config = graph_config(type="server_vad", silence_duration_ms=500, semantic_end_of_turn=True)
    events = await events_for(runtime, "server-semantic", config, audio)
    assert len(of_kind(events, "committed")) == 1


async def test_semantic_vad_high_commits_a_complete_question_within_a_second_of_its_end(runtime):
    question = speech("What is the weather like in Paris today?", RATE)
    audio = np.concatenate([silence(0.5, RATE), question, silence(3.0, RATE)])
    speech_end_ms = (0.5 * RATE + len(question)) * 1000 / RATE
    events = await events_for(runtime, "semantic-high", graph_config(type="semantic_vad", eagerness="high"), audio)
    (stopped,) = of_kind(events, "speech_stopped")
    assert len(of_kind(events, "committed")) == 1
    assert stopped.audio_end_ms - speech_end_ms <= 1000


def open_reply() -> CreateResponse:
    return CreateResponse(reply=ReplyParams(response_id="resp_playing"))


async def test_a_150ms_burst_during_a_reply_is_neither_a_turn_nor_a_barge_in(runtime):
    word = speech("Hello there, how are you", RATE)
    burst = word[int(0.25 * RATE):int(0.40 * RATE)]  # 150 ms from inside the speech
    audio = np.concatenate([silence(0.5, RATE), burst, silence(1.5, RATE)])
    events = await events_for(runtime, "burst", graph_config(type="server_vad"), audio, before=[open_reply()])
    assert of_kind(events, "sound_started")  # the VAD heard it...
    assert of_kind(events, "sound_dismissed")  # ...and let it go
    assert not of_kind(events, "speech_started")
    assert not of_kind(events, "committed")


async def test_a_second_of_speech_during_a_reply_starts_a_turn_back_dated_to_its_start(runtime):
    spoken = speech("Stop, stop, please wait a moment", RATE)[:RATE]
    audio = np.concatenate([silence(0.5, RATE), spoken, silence(1.0, RATE)])
    events = await events_for(runtime, "speech", graph_config(type="server_vad"), audio, before=[open_reply()])
    (started,) = of_kind(events, "speech_started")
    (sound,) = of_kind(events, "sound_started")
    assert not of_kind(events, "sound_dismissed")
    # speech_started comes once the sound lasted 250 ms, but names where it began (less the prefix).
    assert started.audio_start_ms <= sound.audio_start_ms
    assert sound.audio_start_ms - 300 <= started.audio_start_ms
    assert len(of_kind(events, "committed")) == 1


async def test_without_a_reply_a_short_sound_starts_a_turn_at_once(runtime):
    word = speech("Yes", RATE)
    audio = np.concatenate([silence(0.5, RATE), word, silence(1.0, RATE)])
    events = await events_for(runtime, "yes", graph_config(type="server_vad"), audio)
    assert not of_kind(events, "sound_started")
    assert len(of_kind(events, "speech_started")) == 1 and len(of_kind(events, "committed")) == 1


def protocol_replying() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x")
    protocol.open()
    protocol.graph_output(InputCommitted(turn_id=1, item_id="item_a", auto_reply=True))
    return protocol


def test_a_short_sound_holds_playback_and_releases_it_without_cancelling_the_reply():
    protocol = protocol_replying()
    held = protocol.graph_output(InputSoundStarted(audio_start_ms=900))
    released = protocol.graph_output(InputSoundDismissed())
    assert held == [HoldPlayback(held=True)] and released == [HoldPlayback(held=False)]
    assert protocol._active() is not None


def test_a_confirmed_turn_during_a_reply_cancels_it():
    protocol = protocol_replying()
    protocol.graph_output(InputSoundStarted(audio_start_ms=900))
    actions = protocol.graph_output(InputSpeechStarted(audio_start_ms=900, item_id="item_b"))
    sent = [a.event for a in actions if isinstance(a, SendEvent)]
    assert sent[0] == {**sent[0], "type": "input_audio_buffer.speech_started", "audio_start_ms": 900}
    done = next(e for e in sent if e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled"
