"""Input the server used to misread without a word: now refused with an error naming the problem."""

import io

import numpy as np
import pytest
import soundfile

from tests.conftest import running_server
from tests.realtime.client import API_KEY, b64, raw_client
from tests.realtime.fakes import realtime_profile


@pytest.fixture
async def srv():
    async with running_server(realtime_profile(), api_key=API_KEY) as running:
        yield running


def wav_file(channels: int, rate: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((rate // 10, channels), np.float32), rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


async def test_a_stereo_format_is_refused_and_the_session_keeps_its_format(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000, "channels": 2}}}}})
        error = await client.error()
        assert (error["code"], error["param"]) == ("unsupported_audio_format", "session.audio.input.format")
        assert "mono only" in error["message"] and "channels 2" in error["message"]
        await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000, "channels": 1}}}}})
        updated = (await client.until("session.updated"))[-1]
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}


@pytest.mark.parametrize(
    "wav,described",
    [
        pytest.param(wav_file(2, 24000), "2 channel(s), 24000 Hz", id="stereo"),
        pytest.param(wav_file(1, 44100), "1 channel(s), 44100 Hz", id="other-rate"),
        pytest.param(wav_file(1, 24000, "FLOAT"), "32-bit", id="float-samples"),
    ],
)
async def test_a_wav_file_whose_header_disagrees_with_the_session_format_is_refused(srv, wav, described):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "input_audio_buffer.append", "audio": b64(wav)})
        error = await client.error()
        assert (error["code"], error["param"]) == ("invalid_audio", "audio")
        assert described in error["message"] and "audio/pcm mono at 24000 Hz" in error["message"]


async def test_a_wav_file_that_matches_the_session_format_is_accepted(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await client.until("session.updated")
        await client.send({"type": "input_audio_buffer.append", "audio": b64(wav_file(1, 24000))})
        await client.send({"type": "input_audio_buffer.commit"})
        assert (await client.until("input_audio_buffer.committed"))[-1]["type"] == "input_audio_buffer.committed"
