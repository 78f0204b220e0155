"""Streamed speech: SSE events, raw audio bytes, failures mid-stream, and client disconnects."""

import asyncio

import httpx
import pytest

from tests.conftest import eventually, running_server
from tests.speech.conftest import speaker_node, speech_service
from tests.speech.fake_speaker import RATE, speaker_profile
from tests.speech.helpers import parse_sse, pcm_samples, sdk, sse_audio, wav_samples

MODEL = "test-tts"


async def test_sse_streams_deltas_then_done_with_usage(server):
    async with sdk(server).audio.speech.with_streaming_response.create(
        model=MODEL, voice="aiden", input="one two three", response_format="pcm", stream_format="sse", extra_body={"seed": 5}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = await response.text()
    events = parse_sse(text)
    names = [name for name, _ in events]
    assert names == ["speech.audio.delta"] * 6 + ["speech.audio.done"]
    assert all(data["response_format"] == "pcm" for name, data in events[:-1])
    assert events[-1][1] == {
        "type": "speech.audio.done",
        "usage": {"input_tokens": 3, "output_tokens": 6, "total_tokens": 9, "input_token_details": {"text_tokens": 3, "audio_tokens": 0}},
    }
    whole = await sdk(server).audio.speech.create(
        model=MODEL, voice="aiden", input="one two three", response_format="pcm", extra_body={"seed": 5}
    )
    assert sse_audio(events) == whole.content


async def test_stream_true_alone_selects_sse_and_wav_deltas_form_a_streamed_wav(server):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post("/v1/audio/speech", json={"input": "a b", "stream": True, "voice": "chelsie"})
    events = parse_sse(response.text)
    assert events[-1][0] == "speech.audio.done"
    audio = sse_audio(events)
    assert audio[:4] == b"RIFF" and audio[4:8] == b"\xff\xff\xff\xff"
    samples, rate = wav_samples(audio)
    assert rate == RATE and len(samples) == 4 * 2400


async def test_sse_failure_ends_with_speech_audio_error(server):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post("/v1/audio/speech", json={"input": "please FAIL now", "stream_format": "sse", "response_format": "pcm"})
    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["speech.audio.delta", "speech.audio.error"]
    error = events[-1][1]["error"]
    assert error["type"] == "server_error" and error["code"] == "synthesis_failed" and "fail" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


async def test_raw_audio_stream_starts_with_a_streaming_wav_header(server):
    chunks = []
    async with sdk(server).audio.speech.with_streaming_response.create(
        model=MODEL, voice="ethan", input="a b c", response_format="wav", stream_format="audio", extra_body={"seed": 2}
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        async for chunk in response.iter_bytes():
            chunks.append(chunk)
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    samples, rate = wav_samples(data)
    whole = await sdk(server).audio.speech.create(model=MODEL, voice="ethan", input="a b c", response_format="pcm", extra_body={"seed": 2})
    assert data[44:] == whole.content and len(samples) == 6 * 2400


async def test_raw_pcm_stream_can_be_resampled(server):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post(
            "/v1/audio/speech", json={"input": "a b", "stream_format": "audio", "response_format": "pcm", "sample_rate": 16000}
        )
    assert response.headers["content-type"] == "audio/pcm"
    assert abs(len(pcm_samples(response.content)) - 0.4 * 16000) <= 16


async def test_raw_stream_failure_breaks_the_stream_instead_of_ending_it_cleanly(server):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream(
                "POST", "/v1/audio/speech", json={"input": "FAIL " * 20, "stream_format": "audio", "response_format": "pcm"}
            ) as response:
                async for _ in response.aiter_bytes():
                    pass


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_client_disconnect_mid_stream_cancels_generation_and_frees_the_executor(tmp_path, stream_format):
    # 200 executor steps of 20 ms each: about 4 s of work if nobody stopped it.
    profile = speaker_profile(tmp_path, step_delay_s=0.02, chunks_per_word=2)
    async with running_server(profile, enable_realtime=False) as server:
        node = speaker_node(server)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            async with client.stream(
                "POST", "/v1/audio/speech", json={"input": "word " * 100, "stream_format": stream_format, "response_format": "pcm"}
            ) as response:
                async for _ in response.aiter_bytes():
                    break  # first audio arrived: hang up
            [session_id] = list(node.steps)
            # The graph session is closed (its node state freed) and no speech session remains.
            await eventually(lambda: session_id in node.closed and server.runtime.count("speech") == 0)
            steps_at_close = node.steps[session_id]
            assert steps_at_close < 200
            assert speech_service(server).active_jobs == set()
            # Nothing of it is left queued on the shared executor; at most the one step that was
            # already running when it closed completes, and then no more steps run for it.
            assert node.batcher.queue_depth() == 0
            await eventually(server.runtime.compute.idle, "the step in progress at the close to finish")
            settled = node.steps[session_id]
            assert settled <= steps_at_close + 1
            # A negative check with no later event to wait for: ten step times for a step that
            # must not run.
            await asyncio.sleep(0.2)
            assert node.steps[session_id] == settled
            # The executor serves the next request at once.
            follow_up = await client.post("/v1/audio/speech", json={"input": "done", "response_format": "pcm"})
            assert follow_up.status_code == 200 and len(follow_up.content) == 2 * 2400 * 2


async def test_client_giving_up_on_a_whole_file_request_cancels_it_too(tmp_path):
    profile = speaker_profile(tmp_path, step_delay_s=0.02)
    async with running_server(profile, enable_realtime=False) as server:
        node = speaker_node(server)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            request = asyncio.create_task(client.post("/v1/audio/speech", json={"input": "word " * 100}))
            await eventually(lambda: sum(node.steps.values()) > 0)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
        [session_id] = list(node.steps)
        await eventually(lambda: session_id in node.closed and server.runtime.count("speech") == 0)
        assert node.steps[session_id] < 200
        assert node.batcher.queue_depth() == 0
        assert speech_service(server).active_jobs == set()


# A client at the speech capacity that sends its next request as soon as a stream has ended must
# find the slot free: the request's session is closed when the audio ends, before the last event
# or bytes go out. Closing takes a while here (as freeing a model's state can), so a session
# still closing when the stream ended would show.


def one_slot_profile(tmp_path) -> dict:
    profile = speaker_profile(tmp_path, close_delay_s=0.5)
    profile["limits"] = {"max_speech_sessions": 1}
    return profile


async def test_the_speech_slot_is_free_when_the_sse_done_event_arrives(tmp_path):
    async with running_server(one_slot_profile(tmp_path), enable_realtime=False) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            for round_ in range(2):
                body = {"input": "one two", "stream_format": "sse", "response_format": "pcm"}
                async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line == "event: speech.audio.done":
                            assert server.runtime.count("speech") == 0, "the speech session is still open"
                            assert len(speaker_node(server).closed) == 2 * round_ + 1  # this one and the last round's two
                            break
                    else:
                        raise AssertionError("no speech.audio.done event")
                again = await client.post("/v1/audio/speech", json={"input": "next", "response_format": "pcm"})
                assert again.status_code == 200, again.text


async def test_the_speech_slot_is_free_when_the_sse_error_event_arrives(tmp_path):
    async with running_server(one_slot_profile(tmp_path), enable_realtime=False) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            body = {"input": "please FAIL now", "stream_format": "sse", "response_format": "pcm"}
            async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                async for line in response.aiter_lines():
                    if line == "event: speech.audio.error":
                        assert server.runtime.count("speech") == 0, "the speech session is still open"
                        break
                else:
                    raise AssertionError("no speech.audio.error event")
            again = await client.post("/v1/audio/speech", json={"input": "next", "response_format": "pcm"})
            assert again.status_code == 200, again.text


@pytest.mark.parametrize("response_format", ["pcm", "wav"])
async def test_a_raw_stream_client_can_send_its_next_request_as_soon_as_the_stream_ends(tmp_path, response_format):
    async with running_server(one_slot_profile(tmp_path), enable_realtime=False) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            for _ in range(3):
                body = {"input": "one two", "stream_format": "audio", "response_format": response_format}
                async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                    assert response.status_code == 200
                    received = b"".join([chunk async for chunk in response.aiter_bytes()])
                assert server.runtime.count("speech") == 0, "the speech session is still open"
                assert len(received) >= 4 * 2400 * 2
            assert len(speaker_node(server).closed) == 3
