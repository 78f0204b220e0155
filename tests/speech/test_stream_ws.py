"""WS /v1/audio/speech/stream: streamed text in, audio out, flushes, config, timeouts, limits."""

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import eventually, running_server
from tests.speech.conftest import speaker_node, speech_service
from tests.speech.fake_speaker import RATE, speaker_profile
from tests.speech.helpers import dominant_hz, pcm_samples, wav_samples


def url(server) -> str:
    return f"{server.ws_url}/v1/audio/speech/stream"


async def send(ws, **event):
    await ws.send(json.dumps(event))


async def receive_until(ws, event_type: str) -> list:
    """Everything received up to and including the first event of `event_type`."""
    received = []
    async with asyncio.timeout(20):
        while True:
            message = await ws.recv()
            received.append(message if isinstance(message, bytes) else json.loads(message))
            if isinstance(received[-1], dict) and received[-1]["type"] == event_type:
                return received


async def flush(ws, text: str) -> list:
    """`text`, then `input.done`: everything received up to and including its `session.done`."""
    await send(ws, type="input.text", text=text)
    await send(ws, type="input.done")
    return await receive_until(ws, "session.done")


def events(received, event_type=None):
    return [m for m in received if isinstance(m, dict) and (event_type is None or m["type"] == event_type)]


def audio(received) -> bytes:
    return b"".join(m for m in received if isinstance(m, bytes))


async def test_one_flush_is_spoken_as_one_request_by_default(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", voice="aiden", response_format="pcm")
        await send(ws, type="input.text", text="Hello there. ")
        received = await flush(ws, "How are you?")
    start, done, finished = events(received)
    assert start == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello there. How are you?",
        "format": "pcm",
        "sample_rate": RATE,
    }
    samples = pcm_samples(audio(received))
    assert len(samples) == 5 * 2 * 2400 and abs(dominant_hz(samples, RATE) - 440) < 10
    assert done == {"type": "audio.done", "utterance_index": 0, "sentence_index": 0, "total_bytes": len(audio(received)), "error": False}
    assert finished == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


async def test_sentence_granularity_speaks_each_sentence_as_it_completes(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", split_granularity="sentence", response_format="wav")
        await send(ws, type="input.text", text="Dr. Smith paid 3.50 dollars. Then ")
        first = await receive_until(ws, "audio.done")  # spoken before input.done
        rest = await flush(ws, 'he said "Bye." Done')
    starts = events(first + rest, "audio.start")
    assert [s["sentence_text"] for s in starts] == ["Dr. Smith paid 3.50 dollars.", 'Then he said "Bye."', "Done"]
    assert [s["sentence_index"] for s in starts] == [0, 1, 2]
    assert events(rest, "session.done") == [{"type": "session.done", "utterance_index": 0, "total_sentences": 3}]
    clips = [m for m in first + rest if isinstance(m, bytes)]
    assert len(clips) == 3 and all(wav_samples(clip)[1] == RATE for clip in clips)


async def test_clause_granularity_also_cuts_at_commas(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", split_granularity="clause", response_format="pcm")
        received = await flush(ws, "First, 1,000 things; then more")
    assert [s["sentence_text"] for s in events(received, "audio.start")] == ["First,", "1,000 things;", "then more"]


async def test_stream_audio_sends_pcm_chunks_as_they_are_decoded(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", response_format="pcm", stream_audio=True, sample_rate=16000)
        received = await flush(ws, "one two three")
    frames = [m for m in received if isinstance(m, bytes)]
    assert len(frames) > 1
    assert events(received, "audio.start")[0]["sample_rate"] == 16000
    assert events(received, "audio.done")[0]["total_bytes"] == sum(len(f) for f in frames)
    assert abs(len(pcm_samples(b"".join(frames))) - 0.6 * 16000) <= 16


async def test_the_connection_stays_open_across_flushes_and_config_is_sticky(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", voice="chelsie", response_format="pcm")
        first = await flush(ws, "first")
        second = await flush(ws, "second")  # same config, no resend
        await send(ws, type="session.config", voice="aiden", response_format="pcm")  # between utterances: fine
        third = await flush(ws, "third")
    assert [events(r, "session.done")[0]["utterance_index"] for r in (first, second, third)] == [0, 1, 2]
    assert abs(dominant_hz(pcm_samples(audio(second)), RATE) - 220) < 10
    assert abs(dominant_hz(pcm_samples(audio(third)), RATE) - 440) < 10


async def test_an_empty_flush_reports_zero_sentences(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config")
        await send(ws, type="input.done")
        received = await receive_until(ws, "session.done")
    assert received == [{"type": "session.done", "utterance_index": 0, "total_sentences": 0}]


async def test_config_mid_utterance_is_rejected_and_the_buffer_kept(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", voice="chelsie", response_format="pcm")
        await send(ws, type="input.text", text="half of an")
        await send(ws, type="session.config", voice="aiden")
        [error] = await receive_until(ws, "error")
        assert error["code"] == "config_mid_utterance"
        received = await flush(ws, " utterance")
    assert events(received, "audio.start")[0]["sentence_text"] == "half of an utterance"
    assert abs(dominant_hz(pcm_samples(audio(received)), RATE) - 220) < 10  # still the first voice


async def test_an_invalid_config_is_reported_and_a_valid_one_then_works(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", voice="nobody")
        [error] = await receive_until(ws, "error")
        assert error["code"] == "invalid_voice" and "Supported voices" in error["message"]
        await send(ws, type="session.config", response_format="mp3", stream_audio=True)
        [error] = await receive_until(ws, "error")
        assert "stream_audio requires response_format" in error["message"]
        await send(ws, type="session.config", response_format="mp3", speed=1.5)
        received = await flush(ws, "fast words")
    assert events(received, "audio.done")[0]["error"] is False and audio(received)


async def test_the_first_message_must_be_session_config(server):
    async with connect(url(server)) as ws:
        await send(ws, type="input.text", text="hello")
        [error] = await receive_until(ws, "error")
        assert error["code"] == "config_required"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd.code == 1008


async def test_a_failed_unit_reports_an_error_and_the_session_goes_on(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", split_granularity="sentence", response_format="pcm")
        received = await flush(ws, "This will FAIL. This works.")
    assert events(received, "error")[0]["code"] == "synthesis_failed"
    assert [d["error"] for d in events(received, "audio.done")] == [True, False]


async def test_session_close_finishes_flushed_text_then_closes(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", response_format="pcm")
        await send(ws, type="input.text", text="last words")
        await send(ws, type="input.done")
        await send(ws, type="session.close")
        received = await receive_until(ws, "session.done")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert audio(received) and closed.value.rcvd.code == 1000


async def test_disconnecting_mid_unit_cancels_its_generation(tmp_path):
    async with running_server(speaker_profile(tmp_path, step_delay_s=0.02), enable_realtime=False) as server:
        node = speaker_node(server)
        async with connect(url(server)) as ws:
            await send(ws, type="session.config", response_format="pcm", stream_audio=True)
            await send(ws, type="input.text", text="word " * 100)
            await send(ws, type="input.done")
            await receive_until(ws, "audio.start")
            assert isinstance(await ws.recv(), bytes)
        [session_id] = list(node.steps)
        await eventually(lambda: session_id in node.closed and server.runtime.count("speech") == 0)
        assert node.steps[session_id] < 200 and speech_service(server).active_jobs == set()


@pytest.mark.parametrize(
    "speech, script, code, close_code",
    [
        ({"ws_config_timeout_s": 0.3}, [], "config_timeout", 1008),
        ({"ws_idle_timeout_s": 0.3}, [{"type": "session.config"}], "idle_timeout", 1000),
        ({"ws_max_message_bytes": 1000}, [{"type": "session.config"}, {"type": "input.text", "text": "x" * 2000}], "message_too_large", 1009),
    ],
)
async def test_timeouts_and_size_limits_close_the_connection(tmp_path, speech, script, code, close_code):
    async with running_server(speaker_profile(tmp_path, speech=speech), enable_realtime=False) as server:
        async with connect(url(server)) as ws:
            for event in script:
                await ws.send(json.dumps(event))
            [error] = await receive_until(ws, "error")
            assert error["code"] == code
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
    assert closed.value.rcvd.code == close_code


async def test_an_utterance_over_the_size_limit_is_refused_but_the_connection_stays(tmp_path):
    async with running_server(speaker_profile(tmp_path, speech={"ws_max_utterance_chars": 20}), enable_realtime=False) as server:
        async with connect(url(server)) as ws:
            await send(ws, type="session.config", response_format="pcm")
            await send(ws, type="input.text", text="short")
            await send(ws, type="input.text", text=" and then far too long for it")
            [error] = await receive_until(ws, "error")
            assert error["code"] == "utterance_too_long"
            await send(ws, type="input.done")
            received = await receive_until(ws, "session.done")
    assert events(received, "audio.start")[0]["sentence_text"] == "short"


async def test_bad_messages_are_reported_without_closing(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", response_format="pcm")
        await ws.send("{not json")
        assert (await receive_until(ws, "error"))[0]["code"] == "invalid_json"
        await ws.send(b"\x00\x01")
        assert (await receive_until(ws, "error"))[0]["code"] == "invalid_message"
        await send(ws, type="input.nonsense")
        assert (await receive_until(ws, "error"))[0]["code"] == "unknown_event"
        assert events(await flush(ws, "still here"), "audio.done")[0]["error"] is False


async def test_stream_audio_wav_starts_each_unit_with_a_streaming_header(server):
    async with connect(url(server)) as ws:
        await send(ws, type="session.config", response_format="wav", stream_audio=True, split_granularity="sentence")
        received = await flush(ws, "One two. Three four.")
    units, current = [], None
    for message in received:
        if isinstance(message, dict) and message["type"] == "audio.start":
            current = []
            units.append(current)
        elif isinstance(message, bytes):
            current.append(message)
    assert len(units) == 2
    for frames in units:
        assert frames[0][:4] == b"RIFF" and frames[0][4:8] == b"\xff\xff\xff\xff"
        samples, rate = wav_samples(b"".join(frames))
        assert rate == RATE and len(samples) == 4 * 2400
