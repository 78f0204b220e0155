"""End to end on the embedded default (the tiny random-weight Qwen3-Omni): a few requests only.

Every stage runs for real: preprocessing, thinker (teacher-forced: the text is the reply), talker,
code2wav. The audio is noise-like (random weights); these tests check the plumbing, formats,
usage, seeds and cancellation, not quality. `max_new_tokens` keeps each request short on CPU.
"""

from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio
import yaml

from tests.conftest import eventually, running_server
from tests.speech.helpers import parse_sse, pcm_samples, sdk, sse_audio, wav_samples

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROFILE = Path(__file__).resolve().parents[2] / "configs" / "embedded_cpu.yaml"
MODEL = "qwen3-omni-tiny"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny(tmp_path_factory):
    profile = yaml.safe_load(PROFILE.read_text())
    profile.setdefault("speech", {})["voices_dir"] = str(tmp_path_factory.mktemp("voices"))
    async with running_server(profile, enable_realtime=False) as server:
        assert server.state.startup_error is None
        yield server


async def test_voices_are_the_checkpoints_speakers(tiny):
    async with httpx.AsyncClient(base_url=tiny.base_url) as client:
        body = (await client.get("/v1/audio/voices")).json()
    assert body == {"voices": ["aiden", "chelsie", "ethan"], "uploaded_voices": []}


async def test_sdk_speech_returns_a_24khz_wav_with_usage_headers(tiny):
    raw = await sdk(tiny).audio.speech.with_raw_response.create(
        model=MODEL, voice="Ethan", input="Hello world.", instructions="Speak calmly.", extra_body={"max_new_tokens": 12, "seed": 1}
    )
    samples, rate = wav_samples(raw.content)
    assert raw.headers["content-type"] == "audio/wav" and rate == 24000
    assert len(samples) > 0 and np.isfinite(samples).all()
    text_tokens = int(raw.headers["x-sgl-omni-input-text-tokens"])
    output_tokens = int(raw.headers["x-sgl-omni-output-tokens"])
    assert text_tokens > 0 and output_tokens > 0
    assert int(raw.headers["x-sgl-omni-total-tokens"]) == text_tokens + output_tokens


async def test_sse_stream_carries_the_same_audio_as_the_whole_file_for_a_seed(tiny):
    body = {"model": MODEL, "input": "Hi there.", "response_format": "pcm", "max_new_tokens": 10, "seed": 5}
    async with httpx.AsyncClient(base_url=tiny.base_url, timeout=120) as client:
        streamed = parse_sse((await client.post("/v1/audio/speech", json=body | {"stream_format": "sse"})).text)
        whole = (await client.post("/v1/audio/speech", json=body)).content
        other_seed = (await client.post("/v1/audio/speech", json=body | {"seed": 6})).content
    assert streamed[-1][0] == "speech.audio.done"
    assert streamed[-1][1]["usage"]["output_tokens"] > 0
    a, b = pcm_samples(sse_audio(streamed)), pcm_samples(whole)
    assert len(a) == len(b)
    # Same codes; the decoder's float rounding may move a sample by one LSB (see docs/speech.md).
    assert np.max(np.abs(a - b)) <= 1.5 / 32767
    c = pcm_samples(other_seed)
    assert len(c) != len(a) or np.max(np.abs(a - c)) > 0.01


async def test_disconnect_mid_stream_closes_the_speech_session(tiny):
    async with httpx.AsyncClient(base_url=tiny.base_url, timeout=120) as client:
        body = {"model": MODEL, "input": "A longer sentence to speak.", "response_format": "pcm", "stream_format": "audio"}
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            async for _ in response.aiter_bytes():
                break
    await eventually(lambda: tiny.runtime.count("speech") == 0, timeout_s=30)
    assert tiny.server.config.app.state.speech.active_jobs == set()
    # The graph serves the next request normally.
    response = await sdk(tiny).audio.speech.create(model=MODEL, voice="aiden", input="Next.", response_format="pcm",
                                                    extra_body={"max_new_tokens": 4})
    assert len(response.content) > 0


async def test_max_new_tokens_caps_the_generated_codec_frames(tiny):
    raw = await sdk(tiny).audio.speech.with_raw_response.create(
        model=MODEL, voice="aiden", input="A sentence long enough to need more than a few frames.",
        response_format="pcm", extra_body={"max_new_tokens": 3},
    )
    assert 0 < int(raw.headers["x-sgl-omni-output-tokens"]) <= 3
    assert len(raw.content) <= 3 * 1920 * 2  # 1920 samples per codec frame at 24 kHz, 16-bit


async def test_the_streaming_text_websocket_speaks_each_sentence(tiny):
    import json

    from websockets.asyncio.client import connect

    async with connect(f"{tiny.ws_url}/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "split_granularity": "sentence",
                                  "stream_audio": True, "max_new_tokens": 4}))
        for piece in ["Hi there. ", "Dr. Who is ", "here."]:
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await ws.send(json.dumps({"type": "input.done"}))
        events, audio_bytes = [], 0
        while not events or events[-1]["type"] != "session.done":
            message = await ws.recv()
            if isinstance(message, bytes):
                audio_bytes += len(message)
            else:
                events.append(json.loads(message))
    assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == ["Hi there.", "Dr. Who is here."]
    done = [e for e in events if e["type"] == "audio.done"]
    assert [d["error"] for d in done] == [False, False] and sum(d["total_bytes"] for d in done) == audio_bytes > 0


async def test_the_voice_and_the_instructions_condition_the_talker(tiny):
    # Same text and seed: the voice picks the checkpoint speaker the talker is prefilled with, and
    # the instructions enter its prompt, so each changes the generated codes.
    async def speak(voice: str, instructions: str | None = None):
        extra = {"instructions": instructions} if instructions else {}
        raw = await sdk(tiny).audio.speech.with_raw_response.create(
            model=MODEL, voice=voice, input="Good morning.", response_format="pcm", extra_body={"max_new_tokens": 6, "seed": 7}, **extra
        )
        return pcm_samples(raw.content), int(raw.headers["x-sgl-omni-input-text-tokens"])

    ethan, ethan_tokens = await speak("ethan")
    again, _ = await speak("ethan")
    aiden, _ = await speak("aiden")
    instructed, instructed_tokens = await speak("ethan", "Whisper, very slowly.")

    def differ(a, b):
        return len(a) != len(b) or np.max(np.abs(a - b)) > 0.01

    assert not differ(ethan, again)
    assert differ(ethan, aiden) and differ(ethan, instructed)
    assert instructed_tokens > ethan_tokens  # the instructions are counted as input text
