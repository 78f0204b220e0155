"""The protocol core on its own: no socket, no graph, just events in and actions out."""

from __future__ import annotations

import base64
import json

import numpy as np

from graph.messages import (
    AddItem,
    AudioChunk,
    AudioOut,
    Command,
    Configure,
    CreateResponse,
    InputCommitted,
    InputSpeechStarted,
    Interrupt,
    Stage,
    TextDelta,
    TurnDone,
    TurnQueued,
    Usage,
)
from session_server.realtime import session_config
from session_server.realtime.protocol import (
    CLOSE_INTERNAL,
    CloseSession,
    ControlGraph,
    RealtimeProtocol,
    ResponseState,
    SendAudio,
    SendEvent,
    SendToGraph,
    SessionState,
    reply_input_for,
)


def events(actions) -> list[dict]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def kinds(actions) -> list[str]:
    return [e["type"] for e in events(actions)]


def graph_messages(actions) -> list:
    return [a.message for a in actions if isinstance(a, SendToGraph)]


def send(protocol: RealtimeProtocol, **event) -> list:
    return protocol.receive_text(json.dumps(event))


def opened() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x")
    assert kinds(protocol.open()) == ["session.created"]
    return protocol


def commit(protocol: RealtimeProtocol, item_id: str, turn_id: int) -> list:
    return protocol.graph_output(InputCommitted(turn_id=turn_id, item_id=item_id, auto_reply=True))


def test_session_created_carries_the_full_effective_session():
    protocol = RealtimeProtocol("sess_1", "model-x")
    (created,) = events(protocol.open())
    session = created["session"]
    assert (session["id"], session["model"], session["type"]) == ("sess_1", "model-x", "realtime")
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    detection = session["audio"]["input"]["turn_detection"]
    assert (detection["threshold"], detection["prefix_padding_ms"], detection["silence_duration_ms"]) == (0.5, 300, 500)
    assert created["event_id"]


def test_appended_audio_enters_the_graph_on_one_timeline():
    protocol = opened()
    pcm = base64.b64encode(np.zeros(2400, "<i2").tobytes()).decode()  # 100 ms at 24 kHz
    chunks = [graph_messages(send(protocol, type="input_audio_buffer.append", audio=pcm))[0] for _ in range(3)]
    assert all(isinstance(c, AudioChunk) and c.sample_rate == 24000 for c in chunks)
    assert [c.media_ms for c in chunks] == [0.0, 100.0, 200.0]


def test_a_reply_waits_queued_behind_the_active_one_and_its_early_output_is_held():
    protocol = opened()
    first = commit(protocol, "item_a", 1)
    assert kinds(first) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    (active,) = protocol.responses.values()
    assert active.state is ResponseState.IN_PROGRESS
    second_actions = commit(protocol, "item_b", 3)
    assert "response.created" not in kinds(second_actions)
    queued = [r for r in protocol.responses.values() if r is not active][0]
    assert queued.state is ResponseState.QUEUED
    # The model already talks for the queued reply (its thinker is ahead of the first's audio).
    assert protocol.graph_output(TextDelta(response_id=queued.id, text="early ")) == []
    done = protocol.graph_output(TurnDone(response_id=active.id, usage=Usage(input_tokens=5, output_tokens=2)))
    sequence = kinds(done)
    assert sequence.index("response.done") < sequence.index("response.created")
    assert sequence[-2:] == ["response.content_part.added", "response.output_audio_transcript.delta"]
    delta = next(e for e in events(done) if e["type"] == "response.output_audio_transcript.delta")
    assert (delta["response_id"], delta["delta"]) == (queued.id, "early ")
    assert queued.state is ResponseState.IN_PROGRESS


def test_barge_in_interrupts_the_graph_and_drops_late_output():
    protocol = opened()
    commit(protocol, "item_a", 1)
    (active,) = protocol.responses.values()
    protocol.graph_output(TurnQueued(turn_id=2, response_id=active.id))
    protocol.graph_output(AudioOut(response_id=active.id, samples=np.zeros(2400, np.float32)))
    actions = protocol.graph_output(InputSpeechStarted(audio_start_ms=900, item_id="item_b"))
    assert kinds(actions)[0] == "input_audio_buffer.speech_started"
    (control,) = [a.control for a in actions if isinstance(a, ControlGraph)]
    assert isinstance(control, Interrupt) and (control.turn_id, control.response_id) == (2, active.id)
    done = events(actions)[-1]
    assert (done["type"], done["response"]["status"]) == ("response.done", "cancelled")
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert active.state is ResponseState.DONE
    # Output still in flight for the cancelled reply goes nowhere.
    assert protocol.graph_output(AudioOut(response_id=active.id, samples=np.zeros(2400, np.float32))) == []
    assert protocol.graph_output(TurnDone(response_id=active.id, status="cancelled")) == []


def test_speech_does_not_cancel_when_interrupt_response_is_off():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}}})
    commit(protocol, "item_a", 1)
    actions = protocol.graph_output(InputSpeechStarted(audio_start_ms=900, item_id="item_b"))
    assert kinds(actions) == ["input_audio_buffer.speech_started"]


def test_a_failed_graph_fails_the_reply_then_closes_with_session_closed_last():
    protocol = opened()
    commit(protocol, "item_a", 1)
    actions = protocol.session_ended("error: internal_error", ("internal_error", "node 'thinker' failed"))
    sequence = kinds(actions)
    assert sequence[-3:] == ["response.done", "error", "session.closed"]
    assert events(actions)[-3]["response"]["status"] == "failed"
    assert isinstance(actions[-1], CloseSession) and actions[-1].code == CLOSE_INTERNAL
    assert protocol.state is SessionState.CLOSED
    # Events after close are not processed and produce nothing.
    assert send(protocol, type="response.create") == []
    assert protocol.receive_binary(b"x") == []
    assert protocol.graph_output(TextDelta(text="late")) == []


def test_beta_field_names_are_accepted_and_answered_in_ga_shape():
    protocol = opened()
    actions = send(
        protocol,
        type="session.update",
        session={
            "modalities": ["text"],
            "voice": "ethan",
            "input_audio_format": "g711_alaw",
            "output_audio_format": "pcm16",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800},
            "max_response_output_tokens": 50,
            "temperature": 0.7,
        },
    )
    session = events(actions)[-1]["session"]
    assert session["output_modalities"] == ["text"]
    assert session["audio"]["input"]["format"] == {"type": "audio/pcma"}
    assert session["audio"]["output"]["voice"] == "ethan"
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 800
    assert session["max_output_tokens"] == 50
    assert session["sglang"]["temperature"] == 0.7  # next to `granted` (sglang_session.py)
    configure = [m for m in graph_messages(actions) if isinstance(m, Command)]
    assert all(isinstance(m, Configure) for m in configure)
    assert {m.target for m in configure} == {Stage.VAD, Stage.DIALOG}


def test_semantic_vad_is_served_by_the_end_of_turn_model_and_says_so():
    protocol = opened()
    actions = send(protocol, type="session.update", session={"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    detection = events(actions)[-1]["session"]["audio"]["input"]["turn_detection"]
    assert detection["type"] == "semantic_vad"
    assert detection["eagerness"] == "high"
    assert "silence_duration_ms" not in detection  # pauses are judged by the model, not a window
    assert detection["sglang"] == {"interrupt_min_speech_ms": 250, "end_of_turn_model": "smart-turn-v3.2", "max_silence_ms": 2000}
    graph = protocol.config.to_graph()["turn_detection"]
    assert graph["semantic"] == {"check_after_ms": 200, "max_silence_ms": 2000}


def test_server_vad_takes_the_semantic_check_and_the_barge_in_threshold_as_extensions():
    protocol = opened()
    detection = {"type": "server_vad", "silence_duration_ms": 400,
                 "sglang": {"semantic_end_of_turn": True, "max_silence_ms": 2500, "interrupt_min_speech_ms": 400}}
    actions = send(protocol, type="session.update", session={"audio": {"input": {"turn_detection": detection}}})
    echo = events(actions)[-1]["session"]["audio"]["input"]["turn_detection"]
    assert echo["silence_duration_ms"] == 400
    assert echo["sglang"] == {"interrupt_min_speech_ms": 400, "semantic_end_of_turn": True,
                              "end_of_turn_model": "smart-turn-v3.2", "max_silence_ms": 2500}
    graph = protocol.config.to_graph()["turn_detection"]
    assert graph["semantic"] == {"check_after_ms": 400, "max_silence_ms": 2500}
    assert graph["interrupt_min_speech_ms"] == 400


def test_semantic_vad_without_the_smart_turn_extra_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(session_config, "smart_turn_installed", lambda: False)
    protocol = opened()
    before = protocol.config
    actions = send(protocol, type="session.update", session={"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    (error,) = events(actions)
    assert error["type"] == "error"
    assert error["error"]["code"] == "semantic_vad_unavailable"
    assert error["error"]["param"] == "session.audio.input.turn_detection.type"
    assert "smart-turn" in error["error"]["message"]
    assert protocol.config == before


def test_a_rejected_update_changes_nothing():
    protocol = opened()
    before = protocol.config
    actions = send(protocol, type="session.update", session={"output_modalities": ["text"], "audio": {"output": {"format": {"type": "audio/flac"}}}})
    assert kinds(actions) == ["error"]
    assert protocol.config == before


def test_voice_is_locked_once_audio_was_produced():
    protocol = opened()
    commit(protocol, "item_a", 1)
    (active,) = protocol.responses.values()
    protocol.graph_output(AudioOut(response_id=active.id, samples=np.zeros(240, np.float32)))
    actions = send(protocol, type="session.update", session={"audio": {"output": {"voice": "aiden"}}})
    assert events(actions)[0]["error"]["code"] == "voice_locked"


def test_item_ids_are_unique_and_previous_item_id_links_the_conversation():
    protocol = opened()
    for n in range(3):
        send(protocol, type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"t{n}"}]})
    ids = list(protocol.items)
    assert len(set(ids)) == 3
    actions = send(protocol, type="conversation.item.create", item={"type": "message", "role": "system", "content": [{"type": "input_text", "text": "x"}]})
    added = events(actions)[0]
    assert added["previous_item_id"] == ids[-1]
    add_item = graph_messages(actions)[0]
    assert isinstance(add_item, AddItem) and (add_item.role, add_item.text) == ("system", "x")


def test_a_media_track_transport_gets_decoded_audio_in_and_reply_audio_as_samples():
    protocol = RealtimeProtocol("sess_1", "model-x", audio_deltas=False)
    protocol.open()
    (chunk,) = graph_messages(protocol.receive_audio(np.zeros(1600, np.float32), 16000))
    assert (chunk.sample_rate, chunk.media_ms) == (16000, 0.0)
    assert graph_messages(protocol.receive_audio(np.zeros(1600, np.float32), 16000))[0].media_ms == 100.0
    commit(protocol, "item_a", 1)
    (active,) = protocol.responses.values()
    actions = protocol.graph_output(AudioOut(response_id=active.id, samples=np.zeros(2400, np.float32)))
    assert kinds(actions) == []
    (audio,) = [a for a in actions if isinstance(a, SendAudio)]
    assert (audio.response_id, audio.sample_rate, len(audio.samples)) == (active.id, 24000, 2400)
    assert active.item.audio_ms == 100.0


def test_items_can_be_retrieved_and_deleted():
    protocol = opened()
    send(protocol, type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    (item_id,) = protocol.items
    retrieved = events(send(protocol, type="conversation.item.retrieve", item_id=item_id))[0]
    assert retrieved["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    deleted = events(send(protocol, type="conversation.item.delete", item_id=item_id))[0]
    assert (deleted["type"], deleted["item_id"]) == ("conversation.item.deleted", item_id)
    assert protocol.items == {}


def test_output_audio_buffer_clear_cuts_the_active_reply():
    protocol = opened()
    commit(protocol, "item_a", 1)
    (active,) = protocol.responses.values()
    actions = send(protocol, type="output_audio_buffer.clear")
    assert kinds(actions)[-2:] == ["response.done", "output_audio_buffer.cleared"]
    assert any(isinstance(a, ControlGraph) and isinstance(a.control, Interrupt) for a in actions)
    assert events(send(protocol, type="output_audio_buffer.clear"))[0]["error"]["code"] == "response_cancel_not_active"


def test_an_automatic_reply_goes_to_the_reply_input_and_a_client_reply_stays_behind_the_audio():
    protocol = RealtimeProtocol("sess_1", "model-x", reply_input="replies")
    protocol.open()
    auto = [a for a in commit(protocol, "item_a", 1) if isinstance(a, SendToGraph)]
    assert [(a.input, type(a.message)) for a in auto] == [("replies", CreateResponse)]
    # A client's response.create may follow a commit the dialog has not made yet: it keeps the
    # audio input's order.
    protocol = RealtimeProtocol("sess_2", "model-x", reply_input="replies")
    protocol.open()
    asked = [a for a in send(protocol, type="response.create") if isinstance(a, SendToGraph)]
    assert [(a.input, type(a.message)) for a in asked] == [("audio", CreateResponse)]


def test_an_automatic_reply_the_dialog_made_with_the_commit_needs_no_create_response():
    protocol = RealtimeProtocol("sess_1", "model-x", reply_input="replies")
    protocol.open()
    auto_reply = protocol.graph_config()["auto_reply"]
    assert auto_reply.response_id == "" and auto_reply.output_modalities == ("audio",)
    actions = protocol.graph_output(InputCommitted(turn_id=3, item_id="item_a", auto_reply=True, response_id="resp_dialog"))
    assert not [a for a in actions if isinstance(a, SendToGraph)]
    created = [e for e in events(actions) if e["type"] == "response.created"]
    assert [e["response"]["id"] for e in created] == ["resp_dialog"]
    # Its output is matched by turn as well as by id.
    actions = protocol.graph_output(TextDelta(turn_id=3, text="Hi", token_ids=(1,)))
    assert [e["delta"] for e in events(actions)] == ["Hi"]
    # A transcription session's commits get no reply.
    protocol = RealtimeProtocol("sess_2", "model-x")
    protocol.open()
    assert "error" not in kinds(send(protocol, type="session.update", session={"type": "transcription"}))
    assert protocol.graph_config()["auto_reply"] is None


def test_the_reply_input_is_used_only_where_the_graph_has_one():
    assert reply_input_for({"audio", "replies", "speech"}) == "replies"
    assert reply_input_for({"audio", "speech"}) == "audio"
