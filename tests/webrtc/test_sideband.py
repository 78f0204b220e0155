"""The sideband: `GET /v1/realtime?call_id=...` attaches a WebSocket to a live WebRTC call."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets

from clients.python.webrtc import WebRTCSession
from session_server.webrtc.sideband import MAX_SIDEBANDS, Sideband
from tests.conftest import running_server, until_true
from tests.realtime.client import RawClient
from tests.webrtc.helpers import API_KEY, calls_of, webrtc_profile


@contextlib.asynccontextmanager
async def sideband(server, call_id: str, api_key: str | None = API_KEY) -> AsyncIterator[RawClient]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with websockets.connect(f"{server.ws_url}/v1/realtime?call_id={call_id}", additional_headers=headers) as ws:
        yield RawClient(ws)


async def closed_with(client: RawClient) -> tuple[int, str]:
    """Read to the end of the socket; the close frame's (code, reason)."""
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await client.recv(timeout=10)
    return client.ws.close_code, client.ws.close_reason


def user_text(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def test_a_sideband_gets_the_calls_events_and_its_client_events_act_on_the_call():
    async with running_server(webrtc_profile(reply={"words": 2, "chunk_ms": 100}), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            async with sideband(server, call.call_id) as backend:
                await until_true(lambda: calls_of(server).get(call.call_id).sidebands)
                # an event caused on the data channel reaches the sideband
                call.send({"type": "session.update", "session": {"instructions": "From the browser."}})
                updated = (await backend.until("session.updated"))[-1]
                assert updated["session"]["instructions"] == "From the browser."
                assert updated["session"]["id"] == (await call.next_event("session.updated"))["session"]["id"]

                # client events sent on the sideband act on the call, and its reply reaches both
                await backend.send(user_text("What time is it?"))
                await backend.send({"type": "response.create"})
                on_sideband = await backend.until("response.done")
                on_channel = await call.events_until("response.done")
                done = on_sideband[-1]["response"]
                assert done["status"] == "completed"
                assert on_channel[-1]["response"]["id"] == done["id"]
                kinds = [e["type"] for e in on_sideband]
                assert [e["type"] for e in on_channel] == kinds  # the same events, in the same order
                assert "conversation.item.added" in kinds and "response.output_audio_transcript.delta" in kinds
                # reply audio stays on the media track, as on the data channel
                assert "response.output_audio.delta" not in kinds
                # the user item came from the sideband; the call's session holds it
                user_item = next(e["item"] for e in on_sideband if e["type"] == "conversation.item.added")
                assert user_item["role"] == "user" and user_item["content"][0]["text"] == "What time is it?"
                assert user_item["id"] in calls_of(server).get(call.call_id).protocol.items

                # errors from a sideband event are in the protocol's shape, on every listener
                await backend.send({"type": "response.cancel", "event_id": "evt_side"})
                error = (await backend.until("error"))[-1]["error"]
                assert error["code"] == "response_cancel_not_active" and error["event_id"] == "evt_side"
                assert (await call.next_event("error"))["error"]["event_id"] == "evt_side"


async def test_a_function_result_sent_on_the_sideband_continues_the_call():
    async with running_server(webrtc_profile(reply={"words": 2, "chunk_ms": 100}), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            async with sideband(server, call.call_id) as backend:
                # (the test reply node makes no calls, so the call is added as a client would)
                await backend.send({"type": "conversation.item.create", "item": {
                    "type": "function_call", "call_id": "call_weather", "name": "get_weather", "arguments": '{"city": "Paris"}'}})
                await backend.send({"type": "conversation.item.create", "item": {
                    "type": "function_call_output", "call_id": "call_weather", "output": '{"forecast": "sunny"}'}})
                await backend.send({"type": "response.create"})
                on_sideband = await backend.until("response.done")
                on_channel = await call.events_until("response.done")
                for events in (on_sideband, on_channel):
                    added = [e["item"] for e in events if e["type"] == "conversation.item.added"]
                    assert added[1]["type"] == "function_call_output" and added[1]["call_id"] == "call_weather"
                    assert events[-1]["response"]["status"] == "completed"
                output = calls_of(server).get(call.call_id).protocol.items[added[1]["id"]]
                assert output.output == '{"forecast": "sunny"}'


async def test_the_sideband_going_away_leaves_the_call_running():
    async with running_server(webrtc_profile(reply={"words": 1, "chunk_ms": 100}), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            server_call = calls_of(server).get(call.call_id)
            async with sideband(server, call.call_id) as backend:
                await backend.send({"type": "session.update", "session": {"instructions": "Hello."}})
                await backend.until("session.updated")
            await until_true(lambda: not server_call.sidebands)
            call.send(user_text("Still there?"))
            call.send({"type": "response.create"})
            assert (await call.events_until("response.done"))[-1]["response"]["status"] == "completed"
            assert calls_of(server).get(call.call_id) is server_call and server_call.close_reason is None


async def test_the_call_ending_sends_session_closed_to_its_sidebands_and_closes_them():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            async with sideband(server, call.call_id) as first, sideband(server, call.call_id) as second:
                await until_true(lambda: len(calls_of(server).get(call.call_id).sidebands) == 2)
                assert await call.hangup(server.base_url, API_KEY) == 200
                for backend in (first, second):
                    assert (await backend.until("session.closed"))[-1]["reason"] == "hangup"
                    assert await closed_with(backend) == (1000, "hangup")
            # the ended call takes no new sideband
            async with sideband(server, call.call_id) as late:
                error = await late.error()
                assert error["code"] == "call_not_found" and error["param"] == "call_id"
                assert (await closed_with(late))[0] == 1008


async def test_a_draining_server_tells_the_sideband_why_the_call_ended():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            async with sideband(server, call.call_id) as backend:
                await until_true(lambda: calls_of(server).get(call.call_id).sidebands)
                await server.runtime.drain(0)  # what SIGTERM does before the server stops
                assert (await backend.until("session.closed"))[-1]["reason"] == "server_shutdown"
                assert await closed_with(backend) == (1001, "server_shutdown")


async def test_an_unknown_call_id_gets_call_not_found_then_a_close():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with sideband(server, "rtc_nosuchcall") as backend:
            event = await backend.recv()
            assert event["type"] == "error"
            assert set(event["error"]) == {"type", "code", "message", "param", "event_id"}
            assert event["error"]["code"] == "call_not_found" and "rtc_nosuchcall" in event["error"]["message"]
            assert await closed_with(backend) == (1008, "call_not_found")
        assert not server.runtime.sessions  # no session of its own was opened


async def test_a_sideband_needs_the_server_key_when_the_server_has_one():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            for key in (None, "wrong-key"):
                with pytest.raises(websockets.InvalidStatus) as refused:
                    async with sideband(server, call.call_id, api_key=key):
                        pass
                assert refused.value.response.status_code == 401
            # an ephemeral key opens one session of its own; it cannot attach to a call
            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
                ephemeral = (await http.post("/v1/realtime/client_secrets", json={})).json()["value"]
            async with sideband(server, call.call_id, api_key=ephemeral) as backend:
                assert (await backend.error())["code"] == "invalid_api_key"
                assert (await closed_with(backend))[0] == 1008
            assert not calls_of(server).get(call.call_id).sidebands


async def test_a_server_without_a_key_takes_a_sideband_without_one():
    async with running_server(webrtc_profile()) as server:
        async with WebRTCSession.connect(server.base_url, loopback=True) as call:
            await call.next_event("session.created")
            async with sideband(server, call.call_id, api_key=None) as backend:
                await backend.send({"type": "session.update", "session": {"instructions": "No key."}})
                assert (await backend.until("session.updated"))[-1]["session"]["instructions"] == "No key."


async def test_a_call_takes_a_bounded_number_of_sidebands():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            async with contextlib.AsyncExitStack() as stack:
                attached = [await stack.enter_async_context(sideband(server, call.call_id)) for _ in range(MAX_SIDEBANDS)]
                await until_true(lambda: len(calls_of(server).get(call.call_id).sidebands) == MAX_SIDEBANDS)
                async with sideband(server, call.call_id) as extra:
                    assert (await extra.error())["code"] == "sideband_limit_reached"
                    assert (await closed_with(extra))[0] == 1008
                call.send({"type": "session.update", "session": {"instructions": "To all."}})
                for backend in attached:
                    assert (await backend.until("session.updated"))[-1]["session"]["instructions"] == "To all."


async def test_a_sideband_that_stops_reading_is_dropped_alone():
    sideband_outbox = Sideband(max_buffered_bytes=1000)
    sideband_outbox.deliver(json.dumps({"type": "session.updated", "pad": "x" * 600}))
    assert not sideband_outbox.ended.is_set()
    sideband_outbox.deliver(json.dumps({"type": "session.updated", "pad": "x" * 600}))
    assert sideband_outbox.ended.is_set() and not sideband_outbox.outbox
    assert (sideband_outbox.close_code, sideband_outbox.close_reason) == (1008, "output_buffer_full")
    sideband_outbox.deliver("{}")  # nothing is queued after the end
    assert not sideband_outbox.outbox
