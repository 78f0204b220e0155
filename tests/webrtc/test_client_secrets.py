"""Ephemeral client secrets: minted with the server key, accepted once, never after expiry."""

from __future__ import annotations

import time

import httpx
import pytest
import websockets

from clients.python.webrtc import CallFailed, WebRTCSession
from session_server.webrtc.client_secrets import ClientSecretError, ClientSecrets, parse_request
from tests.conftest import running_server
from tests.webrtc.helpers import API_KEY, MODEL, webrtc_profile


async def mint(server, body: dict, key: str = API_KEY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}) as http:
        return await http.post("/v1/realtime/client_secrets", json=body)


async def test_a_minted_key_opens_one_webrtc_call_with_its_session_config_and_is_refused_after():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        reply = await mint(server, {"expires_after": {"anchor": "created_at", "seconds": 60}, "session": {"type": "realtime", "model": MODEL, "instructions": "Speak like a pirate."}})
        assert reply.status_code == 200, reply.text
        secret = reply.json()
        assert secret["value"].startswith("ek_")
        assert abs(secret["expires_at"] - (time.time() + 60)) < 5
        assert secret["session"]["instructions"] == "Speak like a pirate."
        async with WebRTCSession.connect(server.base_url, secret["value"], loopback=True) as call:
            created = await call.next_event("session.created")
            assert created["session"]["instructions"] == "Speak like a pirate."
        with pytest.raises(CallFailed) as again:
            async with WebRTCSession.connect(server.base_url, secret["value"], loopback=True):
                pass
        assert again.value.status == 401


async def test_a_minted_key_opens_one_websocket_session():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        key = (await mint(server, {})).json()["value"]
        url = f"{server.ws_url}/v1/realtime?model={MODEL}"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            assert '"session.created"' in await ws.recv()
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}):
                pass
        assert refused.value.response.status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 9}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": "60"}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "last_used", "seconds": 60}}, "expires_after.anchor"),
        ({"session": {"type": "transcription"}}, "session.type"),
        ({"session": {"model": "gpt-realtime"}}, "model"),
        ({"session": {"audio": {"output": {"format": {"type": "audio/ogg"}}}}}, "session.audio.output.format"),
    ],
    ids=["9s", "7201s", "string-seconds", "anchor", "transcription", "other-model", "bad-format"],
)
async def test_out_of_bounds_or_invalid_requests_are_400_naming_the_param(body, param):
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        reply = await mint(server, body)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param


async def test_the_bounds_themselves_are_accepted_and_an_ephemeral_key_cannot_mint():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        for seconds in (10, 7200):
            assert (await mint(server, {"expires_after": {"anchor": "created_at", "seconds": seconds}})).status_code == 200
        key = (await mint(server, {})).json()["value"]
        assert (await mint(server, {}, key=key)).status_code == 401
        assert (await mint(server, {}, key="wrong")).status_code == 401


async def test_an_ephemeral_key_is_good_only_for_opening_a_realtime_session():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        key = (await mint(server, {})).json()["value"]
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}) as http:
            assert (await http.get("/v1/models")).status_code == 401
            assert (await http.post("/v1/audio/speech", json={"model": MODEL, "input": "hi"})).status_code == 401
        # Refused elsewhere, the key was not spent: it still opens one session.
        url = f"{server.ws_url}/v1/realtime?model={MODEL}"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            assert '"session.created"' in await ws.recv()


def test_keys_expire_at_their_deadline_and_are_accepted_only_once():
    now = [1000.0]
    store = ClientSecrets(clock=lambda: now[0])
    first = store.mint(10, {})
    second = store.mint(10, {"instructions": "x"})
    assert first.expires_at == 1010
    now[0] = 1009.9
    assert store.redeem(second.value) and store.session_of(second.value) == {"instructions": "x"}
    assert not store.redeem(second.value)
    now[0] = 1010.0
    assert not store.redeem(first.value)
    assert not store.redeem("ek_unknown") and not store.redeem("sk-anything")
    assert store.outstanding() == 0


def test_outstanding_keys_are_bounded():
    store = ClientSecrets(max_outstanding=2)
    store.mint(60, {})
    store.mint(60, {})
    with pytest.raises(ClientSecretError) as full:
        store.mint(60, {})
    assert full.value.status == 429
    assert parse_request(None) == (600, {})


async def test_the_offer_session_patches_the_minted_one():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        key = (await mint(server, {"session": {"instructions": "Minted.", "audio": {"input": {"turn_detection": None}}}})).json()["value"]
        async with WebRTCSession.connect(server.base_url, key, session={"max_output_tokens": 5}, loopback=True) as call:
            session = (await call.next_event("session.created"))["session"]
            assert session["instructions"] == "Minted." and session["audio"]["input"]["turn_detection"] is None
            assert session["max_output_tokens"] == 5
