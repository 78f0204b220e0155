"""GET/POST/DELETE /v1/audio/voices, persistence across restarts, and speaking with an uploaded
voice: the model cannot clone, so an upload speaks as the built-in speaker nearest to it."""

import io

import httpx
import numpy as np
import pytest
import soundfile

from session_server.speech import encode
from session_server.speech.voice_match import REFERENCE_TEXT
from session_server.speech.voice_registry import VoiceRegistry
from tests.conftest import running_server
from tests.speech.conftest import speaker_node
from tests.speech.fake_speaker import RATE, VOICE_HZ, render_chunk, speaker_profile
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
    assert set(voice) == {"name", "consent", "created_at", "file_size", "mime_type", "speaker"}


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


def spoken_by(voice: str, seconds: float = 2.0, seed: int = 5) -> bytes:
    """A WAV of the fake speaker's `voice` (its tone and its noise), not the sentence it is matched on."""
    chunk = RATE // 10
    samples = np.concatenate([render_chunk(voice, seed, index, chunk) for index in range(int(seconds * 10))])
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, RATE, format="WAV")
    return buffer.getvalue()


@pytest.mark.parametrize("speaker", sorted(VOICE_HZ))
async def test_an_upload_is_matched_to_the_built_in_speaker_it_sounds_like(server, speaker):
    async with client_for(server) as client:
        uploaded = await upload(client, name="sounds-alike", audio=spoken_by(speaker))
        [listed] = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert uploaded.status_code == 200 and uploaded.json()["voice"]["speaker"] == speaker
    assert listed["name"] == "sounds-alike" and listed["speaker"] == speaker


async def test_speaking_with_an_uploaded_voice_speaks_as_its_matched_speaker(server):
    async with client_for(server) as client:
        await upload(client, name="my-voice", audio=spoken_by("aiden"))
    speech = sdk(server).audio.speech
    as_uploaded = await speech.create(model="test-tts", voice="my-voice", input="Hello there", extra_body={"seed": 1})
    as_aiden = await speech.create(model="test-tts", voice="aiden", input="Hello there", extra_body={"seed": 1})
    as_ethan = await speech.create(model="test-tts", voice="ethan", input="Hello there", extra_body={"seed": 1})
    assert len(as_uploaded.content) > 1000
    assert as_uploaded.content == as_aiden.content != as_ethan.content
    assert speaker_node(server).turns[-3].reply.voice == "aiden"


async def test_a_voice_stored_without_a_speaker_is_refused_until_uploaded_again(server, tmp_path):
    # As an older server stored it: no matched speaker in its metadata.
    VoiceRegistry(tmp_path / "voices").add(name="old-voice", consent="yes", samples=np.zeros(24000, np.float32), sample_rate=24000,
                                           mime_type="audio/wav", file_size=1000)
    async with client_for(server) as client:
        [listed] = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
        refused = await client.post("/v1/audio/speech", json={"input": "Hello", "voice": "old-voice"})
        await upload(client, name="old-voice", audio=spoken_by("chelsie"))
        spoken = await client.post("/v1/audio/speech", json={"input": "Hello", "voice": "old-voice"})
    assert "speaker" not in listed
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "voice_not_matched"
    assert "upload it again" in refused.json()["error"]["message"] and refused.json()["error"]["param"] == "voice"
    assert spoken.status_code == 200


async def test_the_speakers_signatures_are_made_once_per_process(server):
    async with client_for(server) as client:
        await upload(client, name="first", audio=spoken_by("ethan"))
        await upload(client, name="second", audio=spoken_by("aiden"))
    references = [turn.reply.voice for turn in speaker_node(server).turns if turn.text == REFERENCE_TEXT]
    assert sorted(references) == sorted(VOICE_HZ)


async def test_an_upload_that_cannot_be_matched_now_is_503_and_stores_nothing(tmp_path):
    profile = speaker_profile(tmp_path / "voices", step_delay_s=0.2)
    profile["limits"] = {"max_speech_sessions": 1}
    long_speech = {"input": "word " * 50, "response_format": "pcm", "stream_format": "audio"}
    async with running_server(profile, enable_realtime=False) as server:
        async with client_for(server) as client:
            async with client.stream("POST", "/v1/audio/speech", json=long_speech) as busy:
                audio = busy.aiter_bytes()
                await anext(audio)  # the one speech slot is taken: no speaker can say its sentence
                response = await upload(client, name="unmatched")
                await audio.aclose()
            listed = (await client.get("/v1/audio/voices")).json()["uploaded_voices"]
    assert response.status_code == 503 and response.json()["error"]["code"] == "voice_matching_unavailable"
    assert listed == []


async def test_voice_cloning_inputs_stay_refused(server):
    async with client_for(server) as client:
        await upload(client, name="my-voice")
        response = await client.post("/v1/audio/speech", json={"input": "Hi", "voice": "my-voice", "task_type": "Base"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "voice_cloning_unsupported"
