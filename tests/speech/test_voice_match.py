"""Voice matching on the embedded default (the tiny random-weight Qwen3-Omni): an uploaded voice
speaks as the built-in speaker nearest to it, in speech requests and in realtime sessions.

The tiny checkpoint's speakers are random: on another sentence their outputs are not told apart by
the signature (each speaker's clip lands about as near to every speaker), so the samples here are
each speaker's own speech of the matcher's reference sentence, as the speech service makes it.
The fake speaker's voices (tones) are told apart on any sentence: tests/speech/test_voices.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio
import yaml

from session_server.speech.voice_match import REFERENCE_FRAMES, REFERENCE_SEED, REFERENCE_TEXT, nearest, signature
from tests.conftest import running_server
from tests.realtime.client import API_KEY, sdk_client, until
from tests.speech.helpers import wav_samples

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROFILE = Path(__file__).resolve().parents[2] / "configs" / "embedded_cpu.yaml"
MODEL = "qwen3-omni-tiny"
SPEAKERS = ("aiden", "chelsie", "ethan")
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny(tmp_path_factory):
    profile = yaml.safe_load(PROFILE.read_text())
    profile.setdefault("speech", {})["voices_dir"] = str(tmp_path_factory.mktemp("voices"))
    async with running_server(profile, api_key=API_KEY) as server:
        assert server.state.startup_error is None
        yield server


async def speech(client: httpx.AsyncClient, voice: str, **fields) -> bytes:
    body = {"model": MODEL, "input": REFERENCE_TEXT, "voice": voice, "seed": REFERENCE_SEED, "max_new_tokens": REFERENCE_FRAMES} | fields
    response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    return response.content


async def upload(client: httpx.AsyncClient, name: str, wav: bytes) -> httpx.Response:
    return await client.post("/v1/audio/voices", data={"name": name, "consent": "yes"}, files={"audio_sample": ("s.wav", wav, "audio/wav")})


def client_for(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=120)


async def ensure_like_aiden(client: httpx.AsyncClient) -> None:
    """The voice `like-aiden` (aiden's own speech), uploaded unless an earlier test did."""
    listed = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    if not any(voice["name"] == "like-aiden" for voice in listed):
        assert (await upload(client, "like-aiden", await speech(client, "aiden"))).json()["voice"]["speaker"] == "aiden"


async def test_nearest_picks_the_speaker_whose_signature_is_closest():
    rng = np.random.default_rng(0)
    rate = 16000
    t = np.arange(2 * rate) / rate
    voices = {name: (np.sin(2 * np.pi * hz * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
              for name, hz in (("low", 110.0), ("mid", 220.0), ("high", 440.0))}
    signatures = {name: signature(audio, rate) for name, audio in voices.items()}
    sample = (np.sin(2 * np.pi * 210.0 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    assert nearest(signature(sample, rate), signatures) == "mid"
    assert signature(sample, rate).shape == signatures["low"].shape


async def test_each_speakers_own_speech_uploaded_is_matched_to_that_speaker(tiny):
    async with client_for(tiny) as client:
        for speaker in SPEAKERS:
            uploaded = await upload(client, f"like-{speaker}", await speech(client, speaker))
            assert uploaded.status_code == 200, uploaded.text
            assert uploaded.json()["voice"]["speaker"] == speaker
        listed = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert {voice["name"]: voice["speaker"] for voice in listed} == {f"like-{s}": s for s in SPEAKERS}


async def test_speech_in_an_uploaded_voice_is_its_matched_speakers_speech(tiny):
    async with client_for(tiny) as client:
        await ensure_like_aiden(client)
        as_uploaded = await speech(client, "like-aiden", input="Hello there.", max_new_tokens=12, seed=3)
        as_aiden = await speech(client, "aiden", input="Hello there.", max_new_tokens=12, seed=3)
    samples, _ = wav_samples(as_uploaded)
    assert len(samples) > 0 and as_uploaded == as_aiden


async def test_a_realtime_session_in_an_uploaded_voice_replies_with_its_matched_speaker(tiny, monkeypatch):
    async with client_for(tiny) as client:
        await ensure_like_aiden(client)
    talker = tiny.runtime.nodes["talker"]
    asked: list[str | None] = []
    speaker_for = talker.speaker_for
    monkeypatch.setattr(talker, "speaker_for", lambda voice: asked.append(voice) or speaker_for(voice))
    async with sdk_client(tiny).realtime.connect(model=MODEL) as conn:
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "like-aiden"}}})
        updated = (await until(conn, "session.updated", timeout=60))[-1]
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]})
        await conn.response.create()
        reply = await until(conn, "response.done", timeout=120)
    assert updated.session.audio.output.voice == "like-aiden"
    audio = b"".join(base64.b64decode(e.delta) for e in reply if e.type == "response.output_audio.delta")
    assert reply[-1].response.status == "completed" and len(audio) > 0
    assert asked == ["aiden"]
