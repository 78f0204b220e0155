"""Bad input on the Live endpoint, and Live on the Realtime one: each a coded error with the
client's `event_id`, and the session (and server) goes on. Raw WebSockets: the SDK would not
send most of this."""

from __future__ import annotations

import base64
import contextlib
import json

import httpx
import pytest
import websockets

from tests.conftest import running_server
from tests.live.fakes import live_profile
from tests.realtime.client import API_KEY, RawClient, raw_client

START = {"type": "session.start", "session": {"model": "gpt-live-1"}}


def server():
    return running_server(live_profile(), api_key=API_KEY)


def live_socket(srv, path: str = "/v1/live/sessions"):
    return websockets.connect(srv.ws_url + path, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None)


async def refused(client: RawClient, event: dict) -> dict:
    await client.send(event)
    error = (await client.until("error"))[-1]
    assert error["client_event_id"] == event.get("event_id")
    assert error["error"]["client_event_id"] == event.get("event_id")
    return error["error"]


@pytest.mark.parametrize(("session", "code", "param"), [
    ({"model": "gpt-live-1", "voice": "marin"}, "unknown_parameter", "session.voice"),
    ({"model": "gpt-live-1", "audio": {"output": {"voice": "marin", "speed": 2}}}, "unknown_parameter", "session.audio.output.speed"),
    ({"instructions": "Hi"}, "missing_required_parameter", "session.model"),
    ({"model": "gpt-4o"}, "model_not_found", "session.model"),
    ({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "gpt-5"}}}, "unsupported", "session.delegation.type"),
    ({"model": "gpt-live-1", "triggers": [{"type": "input_transcript"}]}, "unsupported", "session.triggers"),
    ({"model": "gpt-live-1", "client": {"data_channel": {"allowed_client_events": "all"}}}, "unsupported", "session.client"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}, "invalid_value", "session.audio.format.rate"),
])
async def test_a_session_start_the_server_cannot_honour_is_refused_and_a_good_one_still_starts(session, code, param):
    async with server() as srv:
        async with live_socket(srv) as ws:
            client = RawClient(ws)
            error = await refused(client, {"type": "session.start", "event_id": "bad", "session": session})
            assert (error["code"], error["param"]) == (code, param)
            await client.send({**START, "event_id": "good"})
            started = (await client.until("session.started"))[-1]
    assert started["client_event_id"] == "good"


async def test_a_live_session_answers_to_the_operators_served_model_names_and_names_them_when_refusing():
    profile = {**live_profile(), "served_model_names": ["omni-live", "house-voice"]}
    async with running_server(profile, api_key=API_KEY) as srv:
        async with live_socket(srv) as ws:
            client = RawClient(ws)
            error = await refused(client, {"type": "session.start", "event_id": "bad", "session": {"model": "gpt-4o"}})
            assert error["code"] == "model_not_found"
            assert "'house-voice'" in error["message"] and "'omni-live'" in error["message"]
            await client.send({"type": "session.start", "event_id": "alias", "session": {"model": "house-voice"}})
            started = (await client.until("session.started"))[-1]
    assert started["client_event_id"] == "alias"


@pytest.mark.parametrize(("event", "code"), [
    ({"type": "input_audio_buffer.append", "audio": ""}, "realtime_event_on_live"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": []}}, "realtime_event_on_live"),
    ({"type": "response.create"}, "unsupported"),
    ({"type": "response.cancel"}, "realtime_event_on_live"),
    ({"type": "decision.create"}, "unsupported"),
    ({"type": "session.nonsense"}, "unknown_event_type"),
    ({"type": "session.thinking.append", "content": "x", "delegation_id": "call_nope"}, "delegation_not_found"),
    ({"type": "session.commentary.append", "content": "x", "extra": 1}, "unknown_parameter"),
    ({"type": "session.update", "session": {"delegation": {"type": "decisions", "decisions": {}}}}, "unsupported"),
    ({"type": "session.update", "session": {"instructions": "change"}}, "unknown_parameter"),
    ({"type": "session.start", "session": {"model": "gpt-live-1"}}, "session_already_started"),
])
async def test_events_a_started_live_session_cannot_take_get_coded_errors_and_it_goes_on(event, code):
    async with server() as srv:
        async with live_socket(srv) as ws:
            client = RawClient(ws)
            await client.send(START)
            await client.until("session.started")
            error = await refused(client, {**event, "event_id": "evt_bad"})
            assert error["code"] == code
            await client.send({"type": "session.input_audio.mute", "event_id": "still_there"})
            assert (await client.until("session.input_audio.muted"))[-1]["client_event_id"] == "still_there"


async def test_events_before_session_start_are_refused_with_session_not_started():
    async with server() as srv:
        async with live_socket(srv) as ws:
            client = RawClient(ws)
            error = await refused(client, {"type": "session.commentary.append", "content": "hi", "event_id": "early"})
            assert error["code"] == "session_not_started"
            await client.send("not json")
            assert (await client.error())["code"] == "invalid_json"
            await client.send(START)
            await client.until("session.started")


async def test_live_events_on_the_realtime_endpoint_get_coded_errors():
    async with server() as srv:
        async with raw_client(srv) as client:
            await client.until("session.created")
            await client.send({"type": "session.start", "event_id": "live_1", "session": {"model": "gpt-live-1"}})
            error = await client.error()
            assert (error["code"], error["event_id"]) == ("unknown_event_type", "live_1")
            await client.send({"type": "session.commentary.append", "content": "hi"})
            assert (await client.error())["code"] == "unknown_event_type"
            await client.send({"type": "session.update", "session": {"instructions": "still a GA session"}})
            await client.until("session.updated")


async def test_an_unknown_sideband_fork_a_bad_webrtc_offer_and_sip_get_coded_errors():
    async with server() as srv:
        async with live_socket(srv, "/v1/live/sessions/sess_x/attach") as ws:
            refusal = await RawClient(ws).recv()
        async with live_socket(srv, "/v1/live/sessions/sess_x/fork") as ws:
            fork_refusal = await RawClient(ws).recv()
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=srv.base_url, headers=headers) as http:
            created = await http.post("/v1/live/sessions", json={"session": {"model": "gpt-live-1"},
                                                                 "transport": {"type": "webrtc", "sdp": "v=0"}})
            sip = await http.post("/v1/live/sessions", json={"session": {"model": "gpt-live-1"}, "transport": {"type": "sip"}})
            fork = await http.post("/v1/live/sessions/sess_x/fork", json={"transport": {"type": "webrtc", "sdp": "v=0"}})
            accept = await http.post("/v1/live/sessions/sess_x/accept", json={})
    assert (refusal["type"], refusal["error"]["code"]) == ("error", "session_not_found")
    assert (fork_refusal["type"], fork_refusal["error"]["code"]) == ("error", "session_not_found")
    assert (created.status_code, created.json()["error"]["code"], created.json()["error"]["param"]) == (
        400, "missing_audio", "transport.sdp")
    assert (sip.status_code, sip.json()["error"]["code"], sip.json()["error"]["param"]) == (400, "invalid_value", "transport.type")
    assert (fork.status_code, fork.json()["error"]["code"]) == (404, "session_not_found")
    assert (accept.status_code, accept.json()["error"]["code"]) == (501, "unsupported")


async def test_a_server_without_realtime_refuses_the_live_handshake_naming_the_flag():
    async with running_server(live_profile(), enable_realtime=False) as srv:
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(f"{srv.ws_url}/v1/live/sessions"):
                pass
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == "realtime_disabled"


async def test_a_sideband_sees_the_session_with_reflected_audio_and_may_answer_for_it():
    async with server() as srv:
        async with live_socket(srv) as primary_ws, contextlib.AsyncExitStack() as stack:
            primary = RawClient(primary_ws)
            await primary.send(START)
            session_id = (await primary.until("session.started"))[-1]["session"]["id"]
            sideband = RawClient(await stack.enter_async_context(live_socket(srv, f"/v1/live/sessions/{session_id}/attach")))
            await sideband.send({"type": "session.input_audio.mute", "event_id": "from_sideband"})
            assert (await sideband.until("session.input_audio.muted"))[-1]["client_event_id"] == "from_sideband"
            await primary.send({"type": "session.input_audio.append", "audio": base64.b64encode(bytes(4800)).decode()})
            reflected = (await sideband.until("session.input_audio.append"))[-1]
            await primary.send({"type": "session.commentary.append", "content": "Hi.", "delegation_id": None})
            seen = await sideband.until("session.usage.updated")
    audio = [e for e in seen if e["type"] == "session.output_audio.delta"]
    assert len(base64.b64decode(reflected["audio"])) == 4800  # before muting, PCM16 24 kHz
    assert audio and all(e["end_ms"] - e["start_ms"] == 100 for e in audio)
    assert [e["start_ms"] for e in audio[1:]] == [e["end_ms"] for e in audio[:-1]]  # laid end to end
