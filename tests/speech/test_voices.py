"""GET/POST/DELETE /v1/audio/voices, persistence across restarts, and the cloning refusal."""

import io

import httpx
import numpy as np
import openai
import pytest
import soundfile

from session_server.speech import encode
from tests.conftest import running_server
from tests.speech.fake_speaker import speaker_profile
from tests.speech.helpers import sdk


def wav_bytes(seconds: float = 2.0, rate: int = 16000, freq: float = 200.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


async def upload(client, name="narrator", audio=None, consent="consent-123", filename="sample.wav", mime="audio/wav", **fields):
    data = {"name": name, "consent": consent, **fields}
    data = {k: v for k, v in data.items() if v is not None}
    files = {"audio_sample": (filename, audio if audio is not None else wav_bytes(), mime)}
    return await client.post("/v1/audio/voices", data=data, files=files)


def client_for(server):
    return httpx.AsyncClient(base_url=server.base_url, timeout=30)


async def test_voices_lists_the_models_speakers_and_no_uploads_at_first(server):
    async with client_for(server) as client:
        response = await client.get("/v1/audio/voices")
    assert response.json() == {"voices": ["aiden", "chelsie", "ethan"], "uploaded_voices": []}


async def test_upload_then_list_then_delete(server, tmp_path):
    async with client_for(server) as client:
        uploaded = await upload(client, ref_text="The exact transcript.", speaker_description="warm narrator")
        assert uploaded.status_code == 200
        voice = uploaded.json()["voice"]
        assert uploaded.json()["success"] is True
        assert voice["name"] == "narrator" and voice["consent"] == "consent-123" and voice["mime_type"] == "audio/wav"
        assert voice["ref_text"] == "The exact transcript." and voice["speaker_description"] == "warm narrator"
        assert voice["file_size"] == len(wav_bytes()) and isinstance(voice["created_at"], int)
        assert list((tmp_path / "voices").glob("*.safetensors")) != []

        listed = (await client.get("/v1/audio/voices")).json()
        assert [v["name"] for v in listed["uploaded_voices"]] == ["narrator"]

        deleted = await client.delete("/v1/audio/voices/narrator")
        assert deleted.json() == {"success": True, "message": "Voice 'narrator' deleted successfully"}
        assert (await client.get("/v1/audio/voices")).json()["uploaded_voices"] == []
        assert list((tmp_path / "voices").glob("*.safetensors")) == []


async def test_optional_fields_are_omitted_when_not_given(server):
    async with client_for(server) as client:
        voice = (await upload(client)).json()["voice"]
    assert set(voice) == {"name", "consent", "created_at", "file_size", "mime_type"}


async def test_uploaded_voices_survive_a_restart(tmp_path):
    profile = speaker_profile(tmp_path / "voices")
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            assert (await upload(client, name="keeper", ref_text="hello")).status_code == 200
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            [voice] = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert voice["name"] == "keeper" and voice["ref_text"] == "hello"


@pytest.mark.parametrize("name", ["a/b", "..", ".", "nul\x00x", "Ethan", "back\\slash"])
async def test_bad_names_are_400(server, name):
    async with client_for(server) as client:
        response = await upload(client, name=name)
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["param"] == "name"


async def test_reupload_overwrites_by_default(server):
    async with client_for(server) as client:
        await upload(client, ref_text="first")
        again = await upload(client, ref_text="second")
        assert again.status_code == 200
        [voice] = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert voice["ref_text"] == "second"


async def test_immutable_policy_refuses_reupload_until_deleted(tmp_path):
    profile = speaker_profile(tmp_path / "voices", speech={"voice_policy": "immutable"})
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            await upload(client, ref_text="first")
            refused = await upload(client, ref_text="second")
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "voice_exists"
            await client.delete("/v1/audio/voices/narrator")
            assert (await upload(client, ref_text="second")).status_code == 200


async def test_the_number_of_voices_is_capped(tmp_path):
    profile = speaker_profile(tmp_path / "voices", speech={"max_voices": 2})
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            assert (await upload(client, name="one")).status_code == 200
            assert (await upload(client, name="two")).status_code == 200
            third = await upload(client, name="three")
    assert third.status_code == 400 and third.json()["error"]["code"] == "voice_limit_reached"


@pytest.mark.parametrize(
    "audio, message",
    [
        (b"definitely not audio" * 50, "not decodable audio"),
        (wav_bytes(seconds=0.3), "too short"),
        (wav_bytes(seconds=61), "too long"),
    ],
)
async def test_bad_audio_is_400_and_never_destroys_the_existing_voice(server, audio, message):
    async with client_for(server) as client:
        await upload(client, ref_text="original")
        response = await upload(client, audio=audio, ref_text="replacement")
        assert response.status_code == 400 and message in response.json()["error"]["message"]
        [voice] = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert voice["ref_text"] == "original"


async def test_other_containers_are_accepted(server):
    mp3 = encode.encode(np.sin(np.arange(32000) / 10).astype(np.float32) * 0.2, 16000, "mp3")
    async with client_for(server) as client:
        response = await upload(client, name="from-mp3", audio=mp3, filename="sample.mp3", mime="audio/mpeg")
    assert response.status_code == 200 and response.json()["voice"]["mime_type"] == "audio/mpeg"


async def test_an_undeclared_media_type_is_recognised_from_the_bytes(server):
    async with client_for(server) as client:
        response = await upload(client, mime="application/octet-stream", filename="blob")
    assert response.json()["voice"]["mime_type"] == "audio/wav"


async def test_files_over_the_size_limit_are_413(tmp_path):
    profile = speaker_profile(tmp_path / "voices", speech={"voice_max_bytes": 50_000})
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            response = await upload(client, audio=wav_bytes(seconds=3))  # 96 kB
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"


async def test_by_default_a_file_over_ten_mib_is_413_before_it_is_decoded(server):
    async with client_for(server) as client:
        response = await upload(client, audio=b"\0" * (10 * 1024 * 1024 + 1))
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert response.json()["error"]["message"] == "audio_sample is larger than 10 MiB"


@pytest.mark.parametrize("missing", ["name", "consent"])
async def test_name_and_consent_are_required(server, missing):
    async with client_for(server) as client:
        response = await upload(client, **{missing: None})
    assert response.status_code == 400 and response.json()["error"]["param"] == missing


async def test_deleting_an_unknown_voice_is_404_in_the_openai_shape(server):
    async with client_for(server) as client:
        response = await client.delete("/v1/audio/voices/ghost")
    assert response.status_code == 404
    assert response.json() == {
        "error": {"message": "Voice 'ghost' not found", "type": "invalid_request_error", "param": "name", "code": "voice_not_found"}
    }


async def test_speaking_with_an_uploaded_voice_is_refused_the_model_cannot_clone(server):
    async with client_for(server) as client:
        await upload(client, name="my-clone")
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(server).audio.speech.create(model="test-tts", voice="my-clone", input="Hello")
    assert "the loaded model does not support voice cloning" in caught.value.body["message"]
    assert caught.value.body["param"] == "voice"
