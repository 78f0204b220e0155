"""Issue 37, operators: `/metrics` tells parked sessions from connected ones, and sums every
session's usage (tokens by kind and modality, audio seconds in and out)."""

from __future__ import annotations

import asyncio

from tests.conftest import http_client, running_server
from tests.realtime.client import API_KEY, b64, connect
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16, silence

def sample(text: str, series: str) -> float:
    """The value of one series (`name{labels}`) in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exported")


async def metrics_until(srv, check, timeout: float = 10.0) -> str:
    """/metrics, scraped until `check(text)` holds."""
    async with http_client(srv, api_key=API_KEY) as client:
        async with asyncio.timeout(timeout):
            while True:
                text = (await client.get("/metrics")).text
                if check(text):
                    return text
                await asyncio.sleep(0.02)


async def test_a_dropped_client_shows_as_parked_and_its_resume_as_connected_again():
    async with running_server(realtime_profile(), api_key=API_KEY) as srv:
        async with connect(srv) as client:
            created = await client.recv()
            session_id, token = created["session"]["id"], created["session"]["sglang"]["resume_token"]
            text = await metrics_until(srv, lambda t: sample(t, 'sgl_omni_active_sessions{kind="realtime"}') == 1)
            assert sample(text, 'sgl_omni_parked_sessions{kind="realtime"}') == 0
            client.ws.transport.abort()  # no close frame: the session is parked for a resume
        text = await metrics_until(srv, lambda t: sample(t, 'sgl_omni_parked_sessions{kind="realtime"}') == 1)
        assert sample(text, 'sgl_omni_active_sessions{kind="realtime"}') == 1  # it still holds its slot
        async with connect(srv, f"&session_id={session_id}&resume_token={token}") as client:
            await client.until("sglang.session.resumed")
            text = await metrics_until(srv, lambda t: sample(t, 'sgl_omni_parked_sessions{kind="realtime"}') == 0)
            assert sample(text, 'sgl_omni_active_sessions{kind="realtime"}') == 1


async def test_metrics_count_the_tokens_and_audio_seconds_of_every_reply():
    async with running_server(realtime_profile(reply={"words": 3, "chunk_ms": 100}), api_key=API_KEY) as srv:
        async with connect(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"type": "realtime", "turn_detection": None}})
            await client.until("session.updated")
            await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(silence(0.5, 24000)))})
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two three four"}]}})
            await client.send({"type": "response.create"})
            usage = (await client.until("response.done"))[-1]["response"]["usage"]
        text = await metrics_until(srv, lambda t: sample(t, 'sgl_omni_tokens_total{kind="output",modality="audio"}') > 0)
    assert sample(text, 'sgl_omni_tokens_total{kind="input",modality="text"}') == usage["input_token_details"]["text_tokens"] == 4
    assert sample(text, 'sgl_omni_tokens_total{kind="output",modality="text"}') == usage["output_token_details"]["text_tokens"] == 3
    assert sample(text, 'sgl_omni_tokens_total{kind="output",modality="audio"}') == usage["output_token_details"]["audio_tokens"] == 3
    assert sample(text, "sgl_omni_cached_tokens_total") == usage["input_token_details"]["cached_tokens"]
    assert sample(text, 'sgl_omni_audio_seconds_total{direction="in"}') == 0.5
    assert abs(sample(text, 'sgl_omni_audio_seconds_total{direction="out"}') - 0.3) < 1e-6  # 3 words x 100 ms
