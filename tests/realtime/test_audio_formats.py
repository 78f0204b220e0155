"""Wire audio formats: PCM16 at 24/16 kHz, G.711 mu-law and A-law at 8 kHz, resampled output."""

import warnings

import numpy as np
import pytest

from graph.fir_resampling import Downsample3
from session_server.realtime.audio_formats import (
    ALAW_DECODE,
    ALAW_ENCODE,
    ULAW_DECODE,
    ULAW_ENCODE,
    AudioFormat,
    OddByteCount,
    OutputEncoder,
    UnsupportedFormat,
    decode,
    g711,
    parse_format,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the stdlib reference codec (deprecated, still in 3.11)

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def test_g711_tables_match_the_reference_codec_for_every_sample_and_byte():
    assert np.array_equal(ULAW_ENCODE, np.frombuffer(audioop.lin2ulaw(ALL_INT16.tobytes(), 2), np.uint8))
    assert np.array_equal(ALAW_ENCODE, np.frombuffer(audioop.lin2alaw(ALL_INT16.tobytes(), 2), np.uint8))
    every_byte = bytes(range(256))
    assert np.array_equal(ULAW_DECODE, np.frombuffer(audioop.ulaw2lin(every_byte, 2), np.int16))
    assert np.array_equal(ALAW_DECODE, np.frombuffer(audioop.alaw2lin(every_byte, 2), np.int16))


def test_formats_parse_from_ga_objects_and_beta_names():
    assert parse_format({"type": "audio/pcm"}) == AudioFormat("audio/pcm", 24000)
    assert parse_format({"type": "audio/pcm", "rate": 16000}) == AudioFormat("audio/pcm", 16000)
    assert parse_format({"type": "audio/pcmu"}) == AudioFormat("audio/pcmu", 8000)
    assert parse_format("pcm16") == AudioFormat("audio/pcm", 24000)
    assert parse_format("g711_alaw") == AudioFormat("audio/pcma", 8000)
    for bad in ({"type": "audio/opus"}, {"type": "audio/pcm", "rate": 44100}, {"type": "audio/pcmu", "rate": 16000}, "mp3"):
        with pytest.raises(UnsupportedFormat):
            parse_format(bad)


def test_pcm16_decodes_to_float_and_rejects_half_samples():
    data = np.array([0, 16384, -32768], "<i2").tobytes()
    assert decode(data, AudioFormat()).tolist() == [0.0, 0.5, -1.0]
    with pytest.raises(OddByteCount):
        decode(data[:-1], AudioFormat())


def test_reply_audio_is_resampled_to_8khz_g711_without_losing_the_tail():
    encoder = OutputEncoder(AudioFormat("audio/pcmu", 8000))
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(24000) / 24000)).astype(np.float32)
    wire = b"".join(encoder.encode(tone[i : i + 2400]) for i in range(0, 24000, 2400)) + encoder.flush()
    assert len(wire) == 8000  # one second at 8 kHz, one byte a sample
    decoded = ULAW_DECODE[np.frombuffer(wire, np.uint8)].astype(np.float32) / 32768
    reference = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)
    assert np.corrcoef(decoded[400:-400], reference[400:-400])[0, 1] > 0.99
    assert encoder.duration_ms == 1000.0


def test_pcm_output_at_24khz_is_passed_through_as_pcm16():
    encoder = OutputEncoder(AudioFormat())
    wire = encoder.encode(np.array([0.0, 0.5, -0.5], np.float32))
    assert np.frombuffer(wire, "<i2").tolist() == [0, 16384, -16384]
    assert encoder.flush() == b""


def test_g711_output_is_resampled_as_on_a_phone_line_so_a_replys_first_chunk_leaves_at_once():
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(24000) / 24000)).astype(np.float32)
    chunks = [tone[i : i + 1368] for i in range(0, 24000, 1368)]  # 57 ms: a reply's first chunk
    for kind in ("audio/pcmu", "audio/pcma"):
        encoder, line = OutputEncoder(AudioFormat(kind, 8000)), Downsample3()
        wire = [encoder.encode(chunk) for chunk in chunks] + [encoder.flush()]
        phone = [line.resample_chunk(chunk) for chunk in chunks] + [line.resample_chunk(np.zeros(0, np.float32), last=True)]
        assert wire == [g711(samples, kind) for samples in phone]  # the same 24 kHz -> 8 kHz, chunk for chunk, as a phone call's
        assert len(wire[0]) >= (len(chunks[0]) - line.half) // 3  # held back: the 1.9 ms lookahead only
