"""Issue 16 (10): an `ek_` key is spent by the session it opens, not by requests that never used it."""

from __future__ import annotations

import httpx
import pytest
import websockets

from session_server.webrtc.client_secrets import ClientSecrets
from tests.conftest import running_server
from tests.webrtc.helpers import API_KEY, MODEL, webrtc_profile
from tests.webrtc.test_client_secrets import mint


async def test_a_404_and_a_refused_offer_leave_the_key_good_for_the_real_session():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        key = (await mint(server, {})).json()["value"]
        auth = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.base_url, headers=auth) as http:
            assert (await http.get("/v1/realtime")).status_code == 404
            refused = await http.post("/v1/realtime/calls", content=b"v=0\r\nnot an offer\r\n", headers={"content-type": "application/sdp"})
            assert refused.status_code == 400 and refused.json()["error"]["code"]
            wrong_model = await http.post(f"/v1/realtime/calls?model=other", content=b"v=0\r\n", headers={"content-type": "application/sdp"})
            assert wrong_model.status_code in (400, 404)
        url = f"{server.ws_url}/v1/realtime?model={MODEL}"
        async with websockets.connect(url, additional_headers=auth) as ws:
            assert '"session.created"' in await ws.recv()
        with pytest.raises(websockets.InvalidStatus) as spent:
            async with websockets.connect(url, additional_headers=auth):
                pass
        assert spent.value.response.status_code == 401


async def test_a_websocket_refused_for_the_wrong_model_does_not_spend_the_key():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        key = (await mint(server, {})).json()["value"]
        auth = {"Authorization": f"Bearer {key}"}
        async with websockets.connect(f"{server.ws_url}/v1/realtime?model=other", additional_headers=auth) as ws:
            assert '"model_not_found"' in await ws.recv()
        async with websockets.connect(f"{server.ws_url}/v1/realtime?model={MODEL}", additional_headers=auth) as ws:
            assert '"session.created"' in await ws.recv()


def test_checking_a_key_spends_nothing_and_a_released_key_is_good_again():
    store = ClientSecrets()
    key = store.mint(60, {"instructions": "x"}).value
    assert store.is_usable(key) and store.is_usable(key)
    assert store.session_of(key) == {"instructions": "x"}
    assert store.redeem(key) and not store.is_usable(key) and not store.redeem(key)
    store.release(key)
    assert store.is_usable(key) and store.redeem(key)
    assert not store.is_usable("ek_unknown") and not store.is_usable("sk-anything")
