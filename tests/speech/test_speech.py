"""POST /v1/audio/speech: whole file, formats, speed, rates, seed, usage headers, validation."""

import numpy as np
import openai
import pytest

from graph.executor import PRIORITY_SPEECH
from session_server.speech import encode
from tests.speech.conftest import speaker_node
from tests.speech.fake_speaker import RATE, render_chunk
from tests.speech.helpers import any_samples, dominant_hz, sdk, wav_samples

MODEL = "test-tts"


async def test_sdk_create_returns_a_wav_of_the_generated_audio(server):
    response = await sdk(server).audio.speech.create(model=MODEL, voice="aiden", input="hello there world", extra_body={"seed": 3})
    samples, rate = wav_samples(response.content)
    assert response.response.headers["content-type"] == "audio/wav"
    assert rate == RATE and len(samples) == 6 * 2400  # 3 words x 2 chunks x 100 ms
    expected = np.concatenate([render_chunk("aiden", 3, i, 2400) for i in range(6)])
    assert np.max(np.abs(samples - expected)) < 1e-3


async def test_the_request_reaches_the_graph_as_a_speak_turn_on_a_speech_session(server):
    await sdk(server).audio.speech.create(
        model=MODEL, voice="Chelsie", input="say this", instructions="Whisper.", extra_body={"max_new_tokens": 3, "seed": 9}
    )
    [turn] = speaker_node(server).turns
    assert (turn.role, turn.text, turn.speak, turn.instructions) == ("assistant", "say this", True, "Whisper.")
    assert turn.reply.voice == "chelsie"  # matched case-insensitively, canonical spelling
    assert turn.reply.max_output_tokens == 3 and turn.reply.sampling == {"seed": 9}
    assert speaker_node(server).priorities == [PRIORITY_SPEECH]  # sessions first


async def test_non_streaming_responses_carry_usage_headers(server):
    raw = await sdk(server).audio.speech.with_raw_response.create(
        model=MODEL, voice="ethan", input="one two three", instructions="calm voice"
    )
    headers = raw.headers
    assert headers["x-sgl-omni-input-text-tokens"] == "5"
    assert headers["x-sgl-omni-input-audio-tokens"] == "0"
    assert headers["x-sgl-omni-input-tokens"] == "5"
    assert headers["x-sgl-omni-output-tokens"] == "6"
    assert headers["x-sgl-omni-total-tokens"] == "11"
    assert headers["x-sgl-omni-request-id"].startswith("speech_")


@pytest.mark.parametrize("response_format", encode.RESPONSE_FORMATS)
async def test_every_response_format_has_its_media_type_and_decodes(server, response_format):
    response = await sdk(server).audio.speech.create(model=MODEL, voice="aiden", input="a b c d", response_format=response_format)
    assert response.response.headers["content-type"] == encode.MEDIA_TYPES[response_format]
    samples, rate = any_samples(response.content, response_format)
    assert abs(len(samples) / rate - 0.8) < 0.1
    assert abs(dominant_hz(samples, rate) - 440) < 10
    if response_format == "opus":
        assert response.content[:4] == b"OggS"


async def test_speed_changes_duration_and_keeps_pitch(server):
    client = sdk(server)
    normal = wav_samples((await client.audio.speech.create(model=MODEL, voice="aiden", input="a b c d", extra_body={"seed": 1})).content)[0]
    fast = wav_samples((await client.audio.speech.create(model=MODEL, voice="aiden", input="a b c d", speed=2.0, extra_body={"seed": 1})).content)[0]
    slow = wav_samples((await client.audio.speech.create(model=MODEL, voice="aiden", input="a b c d", speed=0.5, extra_body={"seed": 1})).content)[0]
    assert abs(len(fast) - len(normal) / 2) < RATE * 0.01
    assert abs(len(slow) - len(normal) * 2) < RATE * 0.01
    for samples in (fast, slow):
        assert abs(dominant_hz(samples, RATE) - 440) < 10


@pytest.mark.parametrize("sample_rate", [8000, 16000, 24000, 48000])
async def test_sample_rate_resamples_the_output(server, sample_rate):
    response = await sdk(server).audio.speech.create(
        model=MODEL, voice="chelsie", input="a b", extra_body={"sample_rate": sample_rate}
    )
    samples, rate = wav_samples(response.content)
    assert rate == sample_rate and abs(len(samples) - 0.4 * sample_rate) <= 2
    assert abs(dominant_hz(samples, rate) - 220) < 10


async def test_same_seed_gives_the_same_audio_and_another_seed_differs(server):
    client = sdk(server)

    async def speak(seed):
        return (await client.audio.speech.create(model=MODEL, voice="ethan", input="same words", extra_body={"seed": seed})).content

    first, again, other = await speak(42), await speak(42), await speak(43)
    assert first == again and first != other


async def test_max_new_tokens_bounds_the_output(server):
    response = await sdk(server).audio.speech.create(
        model=MODEL, voice="ethan", input="a long sentence of many words", extra_body={"max_new_tokens": 2}
    )
    assert len(wav_samples(response.content)[0]) == 2 * 2400


async def test_omitted_model_and_voice_use_the_served_model_and_default_speaker(server):
    import httpx

    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post("/v1/audio/speech", json={"input": "hello"})
    assert response.status_code == 200
    assert speaker_node(server).turns[0].reply.voice == "ethan"


# ------------------------------------------------------------------ bad input


async def expect_400(server, message: str, param: str | None, **kwargs):
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("voice", "ethan")
    kwargs.setdefault("input", "hello")
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(server).audio.speech.create(**kwargs)
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"] and error["param"] == param
    return error


@pytest.mark.parametrize("text", ["", "   \n\t "])
async def test_empty_or_whitespace_input_is_400(server, text):
    error = await expect_400(server, "Input text cannot be empty", "input", input=text)
    assert error["message"] == "Input text cannot be empty"


async def test_unknown_model_is_404_in_the_openai_shape(server):
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk(server).audio.speech.create(model="gpt-4o-mini-tts", voice="ethan", input="hi")
    assert caught.value.body == {
        "message": "The model `gpt-4o-mini-tts` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


async def test_unknown_voice_is_400_listing_the_supported_voices(server):
    error = await expect_400(server, "Invalid voice 'alloy'", "voice", voice="alloy")
    assert "Supported voices: aiden, chelsie, ethan" in error["message"]


@pytest.mark.parametrize(
    "kwargs, message, param",
    [
        ({"response_format": "aac"}, "Unsupported response_format 'aac'", "response_format"),
        ({"extra_body": {"response_format": False}}, "Unsupported response_format 'False'", "response_format"),
        ({"speed": 0.2}, "speed must be between 0.25 and 4.0", "speed"),
        ({"speed": 4.5}, "speed must be between 0.25 and 4.0", "speed"),
        ({"extra_body": {"sample_rate": 44100}}, "sample_rate must be one of 8000, 16000, 24000, 48000", "sample_rate"),
        ({"extra_body": {"max_new_tokens": 0}}, "max_new_tokens must be an integer", "max_new_tokens"),
        ({"extra_body": {"seed": "abc"}}, "seed must be a non-negative integer", "seed"),
        ({"stream_format": "sse", "response_format": "mp3"}, "Streaming requires response_format 'pcm' or 'wav'", "response_format"),
        ({"stream_format": "audio", "response_format": "opus"}, "Streaming requires response_format 'pcm' or 'wav'", "response_format"),
        ({"stream_format": "sse", "speed": 1.5}, "Streaming requires speed 1.0", "speed"),
        ({"extra_body": {"stream": True, "response_format": "flac"}}, "Streaming requires response_format", "response_format"),
        ({"extra_body": {"ref_audio": "data:audio/wav;base64,AAAA"}}, "does not support voice cloning", "ref_audio"),
    ],
)
async def test_invalid_fields_are_400_with_a_clear_message(server, kwargs, message, param):
    await expect_400(server, message, param, **kwargs)


async def test_a_body_that_is_not_json_is_400(server):
    import httpx

    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post("/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


async def test_past_the_speech_capacity_a_request_gets_503(tmp_path):
    import httpx

    from tests.conftest import running_server
    from tests.speech.fake_speaker import speaker_profile

    profile = speaker_profile(tmp_path, step_delay_s=0.05)
    profile["limits"] = {"max_speech_sessions": 1}
    async with running_server(profile, enable_realtime=False) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            async with client.stream("POST", "/v1/audio/speech", json={"input": "a " * 50, "stream_format": "audio"}) as held:
                assert held.status_code == 200
                second = await client.post("/v1/audio/speech", json={"input": "hi"})
                assert second.status_code == 503
                assert second.json()["error"]["code"] == "speech_capacity_reached"


async def test_time_to_first_audio_is_exported_for_speech(server):
    import httpx

    await sdk(server).audio.speech.create(model=MODEL, voice="ethan", input="hello")
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        metrics = (await client.get("/metrics")).text
    assert 'sgl_omni_time_to_first_audio_seconds_count{transport="speech"} 1.0' in metrics


async def test_a_graph_without_a_speech_input_answers_501(tmp_path):
    import httpx

    from tests.conftest import running_server
    from tests.graph.fakes import relay_sink_profile

    async with running_server(relay_sink_profile(), enable_realtime=False) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.post("/v1/audio/speech", json={"input": "hello"})
    assert response.status_code == 501 and response.json()["error"]["code"] == "speech_unsupported"
