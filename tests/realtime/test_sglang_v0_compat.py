"""The `sglang-omni-v0` compatibility preset (session_server/realtime/compat.py).

The end-to-end tests follow sglang-omni v0.1.1's own realtime e2e tests event for event, with the
same assertions (`tests/test_model/test_qwen3_omni_realtime.py`, run there against their
thinker-only server, and `..._realtime_audio.py`, against their speech server): a bare
`websockets` client, no header, no key, 16 kHz PCM16 speech and 1 s of silence in 200 ms appends,
read until the user transcript. They run on the embedded tiny checkpoint (the fake reply node
makes no transcripts); its text means nothing, but it is text.
"""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest
import websockets

from configs import load_profile
from graph.messages import InputCommitted, TextDelta, TranscriptCompleted, TranscriptDelta, TurnDone
from session_server.cli import _set_section_flags, build_parser
from session_server.profile import profile_errors
from session_server.realtime.protocol import RealtimeProtocol, SendEvent
from tests.conftest import running_server
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16, silence, speech

PRESET = "sglang-omni-v0"
WS_TIMEOUT = 60
TRANSCRIPT_DONE = "conversation.item.input_audio_transcription.completed"


def their_audio() -> bytes:
    """A 16 kHz mono PCM16 spoken query and 1 s of silence, as their fixture is sent."""
    return pcm16(np.concatenate([speech("Please draw a cat sitting on a red chair.", 16000), silence(1.0, 16000)]))


def their_fixture_audio() -> bytes:
    """The shape of their `query_to_draw.wav` as `test_vad_turn_streams_raw_pcm_audio` sends it:
    a query with a ~1 s pause mid-sentence (server VAD sees two turns), then 1 s of silence."""
    return pcm16(np.concatenate([speech("Please draw a cat", 16000), silence(1.0, 16000),
                                 speech("sitting on a red chair.", 16000), silence(1.0, 16000)]))


async def recv_event(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout=WS_TIMEOUT))


async def recv_until(ws, terminal_type: str, *, limit: int) -> list[dict]:
    events = []
    for _ in range(limit):
        event = await recv_event(ws)
        events.append(event)
        if event.get("type") == terminal_type:
            return events
    raise AssertionError(f"did not see {terminal_type} after {limit} events; saw {[e.get('type') for e in events]}")


async def stream_audio(ws, pcm: bytes, chunk_ms: int = 200) -> None:
    chunk_bytes = 16000 * chunk_ms // 1000 * 2
    for start in range(0, len(pcm), chunk_bytes):
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[start:start + chunk_bytes]).decode()}))


def compat_profile(base: dict) -> dict:
    return {**base, "realtime": {**(base.get("realtime") or {}), "compat": PRESET}}


# --------------------------------------------------------------------------- their two tests


async def test_their_thinker_only_flow_gets_the_reply_then_the_user_transcript():
    async with running_server(compat_profile(load_profile(None))) as srv:
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            created = await recv_event(ws)
            await stream_audio(ws, their_audio())
            events = await recv_until(ws, TRANSCRIPT_DONE, limit=300)

    assert created["type"] == "session.created"
    assert created["session"]["modalities"] == ["text"] and created["session"]["input_audio_format"] == "pcm16"
    types = [e["type"] for e in events]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                 "response.created", "response.text.delta", "response.text.done", "response.done",
                 "conversation.item.input_audio_transcription.delta"):
        assert kind in types, types
    assert types.index("response.done") < types.index(TRANSCRIPT_DONE), types
    response_done = next(e for e in events if e["type"] == "response.done")
    assert response_done["response"]["output"][0]["content"][0]["text"].strip(), response_done
    completed = next(e for e in events if e["type"] == TRANSCRIPT_DONE)
    assert completed.get("transcript", "").strip(), completed


async def test_their_disconnect_mid_reply_leaves_the_server_healthy_and_serving():
    async with running_server(compat_profile(load_profile(None))) as srv:
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            await recv_event(ws)
            await stream_audio(ws, their_audio())
            for _ in range(5):
                await recv_event(ws)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{srv.base_url}/health", timeout=10)).status_code == 200
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            assert (await recv_event(ws))["type"] == "session.created"


async def test_their_speech_flow_gets_audio_then_a_message_with_text_and_audio_parts():
    async with running_server(compat_profile(load_profile(None))) as srv:
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            assert (await recv_event(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {
                "modalities": ["text", "audio"], "input_audio_format": "pcm16", "output_audio_format": "pcm16"}}))
            updated = await recv_event(ws)
            assert updated["type"] == "session.updated", updated
            await stream_audio(ws, their_audio())
            events = await recv_until(ws, TRANSCRIPT_DONE, limit=500)

    types = [e["type"] for e in events]
    response_done_index = types.index("response.done")
    assert types.index("response.audio.done") < response_done_index
    pcm = b"".join(base64.b64decode(e["delta"], validate=True) for e in events if e["type"] == "response.audio.delta")
    assert pcm
    response = events[response_done_index]["response"]
    assert response["status"] == "completed"
    assert {content["type"] for content in response["output"][0]["content"]} == {"text", "audio"}
    # The text part says what the audio part's transcript says.
    parts = {part["type"]: part for part in response["output"][0]["content"]}
    assert parts["text"]["text"] == parts["audio"]["transcript"]


async def test_their_vad_turn_flow_with_a_pause_mid_sentence_gets_both_replies_each_complete():
    """`test_vad_turn_streams_raw_pcm_audio`: its fixture's pause makes two turns; v0.1.1 queued
    them, so the first reply is not cancelled by the second turn's speech (barge-in is off)."""
    async with running_server(compat_profile(load_profile(None))) as srv:
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            created = await recv_event(ws)
            await ws.send(json.dumps({"type": "session.update", "session": {
                "modalities": ["text", "audio"], "input_audio_format": "pcm16", "output_audio_format": "pcm16"}}))
            assert (await recv_event(ws))["type"] == "session.updated"
            await stream_audio(ws, their_fixture_audio())
            events = await recv_until(ws, TRANSCRIPT_DONE, limit=800)  # where their test stops reading
            while sum(e["type"] == "response.done" for e in events) < 2:
                events.append(await recv_event(ws))

    types = [e["type"] for e in events]
    assert types.count("input_audio_buffer.committed") == 2, types
    # Their assertions, on the first reply (the one before the transcript they read up to) ...
    response_done_index = types.index("response.done")
    assert types.index("response.audio.done") < response_done_index
    assert any(base64.b64decode(e["delta"], validate=True) for e in events[:response_done_index] if e["type"] == "response.audio.delta")
    # ... and on both.
    replies = [e["response"] for e in events if e["type"] == "response.done"]
    assert len(replies) == 2
    for reply in replies:
        assert reply["status"] == "completed", reply
        assert {content["type"] for content in reply["output"][0]["content"]} == {"text", "audio"}
    assert created["session"]["turn_detection"]["interrupt_response"] is False


# --------------------------------------------------------------------------- the preset's rules


def sent(actions) -> list[dict]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def worded(protocol: RealtimeProtocol, actions) -> list[dict]:
    """The events as the client reads them (the transport applies the dialect)."""
    return [w for w in (protocol.dialect.outgoing(e) for e in sent(actions)) if w is not None]


def v0_protocol() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "qwen3-omni-tiny", compat=PRESET)
    protocol.open()
    return protocol


def test_a_transcript_that_is_ready_before_the_reply_is_done_waits_for_its_response_done():
    protocol = v0_protocol()
    actions = protocol.graph_output(InputCommitted(turn_id=1, item_id="item_u", auto_reply=True, response_id="resp_1"))
    actions += protocol.graph_output(TextDelta(turn_id=1, response_id="resp_1", text="Hello", token_ids=(1,)))
    actions += protocol.graph_output(TranscriptDelta(turn_id=1, item_id="item_u", delta="draw"))
    actions += protocol.graph_output(TranscriptCompleted(turn_id=1, item_id="item_u", transcript="draw"))
    assert not [e for e in sent(actions) if e["type"].startswith("conversation.item.input_audio_transcription")]
    actions += protocol.graph_output(TurnDone(turn_id=1, response_id="resp_1", status="completed"))
    types = [e["type"] for e in worded(protocol, actions)]
    assert types.index("response.text.delta") < types.index("response.done") < types.index(
        "conversation.item.input_audio_transcription.delta") < types.index(TRANSCRIPT_DONE)
    assert protocol.items["item_u"].content[0]["transcript"] == "draw"


def test_a_client_that_marks_itself_ga_gets_ga_names_and_its_transcripts_as_they_come():
    protocol = v0_protocol()
    protocol.receive_text(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
    assert protocol.dialect.name == "ga"
    actions = protocol.graph_output(InputCommitted(turn_id=1, item_id="item_u", auto_reply=True, response_id="resp_1"))
    actions += protocol.graph_output(TranscriptCompleted(turn_id=1, item_id="item_u", transcript="hi"))
    actions += protocol.graph_output(TextDelta(turn_id=1, response_id="resp_1", text="Hello", token_ids=(1,)))
    types = [e["type"] for e in worded(protocol, actions)]
    assert TRANSCRIPT_DONE in types and "response.output_text.delta" in types


def test_a_bad_preset_is_a_config_error_naming_the_allowed_ones():
    errors = profile_errors(compat_profile(realtime_profile()) | {"realtime": {"compat": "sglang-omni-v9"}})
    assert errors == ["realtime.compat: 'sglang-omni-v9' is not allowed (allowed: sglang-omni-v0)"]
    assert profile_errors(compat_profile(realtime_profile())) == []


def test_the_flag_sets_the_profile_preset_and_accepts_only_the_presets(capsys):
    profile = realtime_profile()
    _set_section_flags(profile, build_parser().parse_args(["serve", "--realtime-compat", PRESET]))
    assert profile["realtime"]["compat"] == PRESET
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--realtime-compat", "openai-beta"])
    assert "sglang-omni-v0" in capsys.readouterr().err


async def test_without_the_preset_their_client_gets_ga_names_and_no_transcripts():
    async with running_server(realtime_profile(reply={"words": 2})) as srv:
        async with websockets.connect(f"{srv.ws_url}/v1/realtime") as ws:
            created = await recv_event(ws)
            await stream_audio(ws, their_audio())
            events = await recv_until(ws, "response.done", limit=300)
    assert created["session"]["output_modalities"] == ["audio"] and created["session"]["type"] == "realtime"
    types = [e["type"] for e in events]
    assert "response.output_audio.delta" in types and "response.audio.delta" not in types
    assert not [t for t in types if t.startswith("conversation.item.input_audio_transcription")]


@pytest.mark.parametrize("update", [{"instructions": "Be brief."}, {"modalities": ["text", "audio"]}])
def test_an_update_without_ga_shape_keeps_the_preset_dialect(update):
    protocol = v0_protocol()
    (updated,) = worded(protocol, protocol.receive_text(json.dumps({"type": "session.update", "session": update})))
    assert protocol.dialect.name == PRESET and "modalities" in updated["session"]
