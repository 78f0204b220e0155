"""Issue 16 (1): a voice upload is decoded only up to its length limit, never in full."""

import io
import tracemalloc

import numpy as np
import pytest
import soundfile

from session_server.speech import encode
from tests.speech.test_voices import client_for, upload


def silence_flac(seconds: float, rate: int = 16000) -> bytes:
    """A FLAC of silence: a few KiB per minute on disk, `seconds * rate * 4` bytes decoded."""
    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", rate, 1, format="FLAC", subtype="PCM_16") as out:
        block = np.zeros(rate * 10, dtype=np.float32)
        for _ in range(int(seconds // 10)):
            out.write(block)
    return buffer.getvalue()


def peak_bytes_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_small_flac_holding_ten_minutes_is_refused_without_decoding_it_all():
    data = silence_flac(600)  # 38 MB of float32 once decoded
    assert len(data) < 1024 * 1024

    def decode():
        with pytest.raises(encode.AudioTooLong, match="longer than 60 s"):
            encode.decode_audio(data, max_seconds=60)

    assert peak_bytes_while(decode) < 12 * 1024 * 1024


def test_decoding_stops_at_the_limit_when_the_container_does_not_say_how_long():
    # An Ogg/Opus stream is read by PyAV packet by packet; its length is not in a header.
    seconds, rate = 120, 24000
    data = encode.encode(np.zeros(seconds * rate, dtype=np.float32), rate, "opus")

    def decode():
        with pytest.raises(encode.AudioTooLong):
            encode.decode_audio(data, max_seconds=10)

    assert peak_bytes_while(decode) < 6 * 1024 * 1024  # the whole clip would be 11 MB decoded


def test_audio_within_the_limit_still_decodes_in_full():
    data = silence_flac(20)
    samples, rate = encode.decode_audio(data, max_seconds=60)
    assert rate == 16000 and len(samples) == 20 * 16000


async def test_a_voice_upload_of_hours_of_audio_gets_invalid_audio_and_stores_nothing(server):
    async with client_for(server) as client:
        response = await upload(client, name="bomb", audio=silence_flac(900), filename="s.flac", mime="audio/flac")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_audio" and error["param"] == "audio_sample"
        assert "too long" in error["message"]
        assert (await client.get("/v1/audio/voices")).json()["uploaded_voices"] == []
