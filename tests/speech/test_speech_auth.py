"""With --api-key, every speech route needs the key; the SDK and WebSocket clients send it."""

import json

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import running_server
from tests.speech.fake_speaker import speaker_profile
from tests.speech.helpers import sdk

KEY = "sekret"


@pytest.fixture
async def keyed(tmp_path):
    async with running_server(speaker_profile(tmp_path), api_key=KEY, enable_realtime=False) as server:
        yield server


async def test_speech_routes_refuse_requests_without_the_key(keyed):
    async with httpx.AsyncClient(base_url=keyed.base_url) as client:
        for method, path in [("POST", "/v1/audio/speech"), ("POST", "/v1/audio/speech/batch"), ("GET", "/v1/audio/voices")]:
            response = await client.request(method, path, json={"input": "hi"})
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await sdk(keyed, api_key="wrong").audio.speech.create(model="test-tts", voice="ethan", input="hi")


async def test_the_sdk_with_the_key_is_served(keyed):
    response = await sdk(keyed, api_key=KEY).audio.speech.create(model="test-tts", voice="ethan", input="hi")
    assert response.content[:4] == b"RIFF"


async def test_the_speech_websocket_needs_the_key_too(keyed):
    url = f"{keyed.ws_url}/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus):
        async with connect(url):
            pass
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await ws.send(json.dumps({"type": "session.config"}))
        await ws.send(json.dumps({"type": "input.done"}))
        assert json.loads(await ws.recv())["type"] == "session.done"
