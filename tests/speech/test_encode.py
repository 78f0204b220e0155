"""Audio formats, resampling and pitch-preserving speed for speech responses."""

import io

import av
import numpy as np
import pytest
import soundfile

from session_server.speech import encode

RATE = 24000


def tone(freq: float = 440.0, seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_frequency(samples: np.ndarray, rate: int) -> float:
    core = samples[len(samples) // 8 : -len(samples) // 8]
    spectrum = np.abs(np.fft.rfft(core * np.hanning(len(core))))
    return float(np.argmax(spectrum) * rate / len(core))


def test_wav_is_pcm16_mono_with_exact_sizes():
    data = encode.encode(tone(), RATE, "wav")
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    info = soundfile.info(io.BytesIO(data))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (RATE, 1, "PCM_16", RATE)


def test_pcm_is_raw_little_endian_int16():
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0], dtype=np.float32)
    assert np.frombuffer(encode.encode(samples, RATE, "pcm"), "<i2").tolist() == [0, 16384, -16384, 32767, -32767, 32767]


def test_flac_round_trips():
    decoded, rate = soundfile.read(io.BytesIO(encode.encode(tone(), RATE, "flac")), dtype="float32")
    assert rate == RATE and len(decoded) == RATE
    assert np.max(np.abs(decoded - tone())) < 1e-3


def test_mp3_is_mpeg_audio():
    data = encode.encode(tone(), RATE, "mp3")
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "mp3"
        assert container.streams.audio[0].codec_context.name.startswith("mp3")
    decoded, _ = encode.decode_audio(data)
    assert abs(dominant_frequency(decoded, RATE) - 440) < 5


def test_opus_is_ogg_opus():
    data = encode.encode(tone(), RATE, "opus")
    assert data[:4] == b"OggS" and encode.MEDIA_TYPES["opus"] == "audio/ogg"
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "ogg"
        assert container.streams.audio[0].codec_context.name == "opus"
    decoded, rate = encode.decode_audio(data)
    assert abs(dominant_frequency(decoded, rate) - 440) < 5


@pytest.mark.parametrize("target", encode.SAMPLE_RATES)
def test_resampling_keeps_the_pitch_and_duration(target):
    resampled = encode.resample(tone(), RATE, target)
    assert len(resampled) == target
    assert abs(dominant_frequency(resampled, target) - 440) < 3


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_duration_not_pitch(speed):
    stretched = encode.time_stretch(tone(seconds=2.0), RATE, speed)
    assert abs(len(stretched) - 2.0 * RATE / speed) <= RATE * 0.01
    assert abs(dominant_frequency(stretched, RATE) - 440) < 5


def test_speed_is_deterministic():
    assert np.array_equal(encode.time_stretch(tone(), RATE, 1.5), encode.time_stretch(tone(), RATE, 1.5))


def test_streamed_wav_starts_with_a_streaming_header_and_decodes():
    encoder = encode.StreamEncoder("wav", RATE, 16000)
    stream = encoder.start()
    assert stream[:4] == b"RIFF" and stream[4:8] == b"\xff\xff\xff\xff" and stream[40:44] == b"\xff\xff\xff\xff"
    samples = tone()
    for start in range(0, len(samples), 960):
        stream += encoder.push(samples[start : start + 960])
    stream += encoder.finish()
    decoded, rate = soundfile.read(io.BytesIO(stream), dtype="float32")
    assert rate == 16000 and abs(len(decoded) - 16000) <= 16
    assert abs(dominant_frequency(decoded, rate) - 440) < 3


def test_streamed_pcm_has_no_header_and_matches_the_whole_clip_encoding():
    encoder = encode.StreamEncoder("pcm", RATE, RATE)
    samples = tone()
    stream = encoder.start() + b"".join(encoder.push(samples[i : i + 1000]) for i in range(0, len(samples), 1000))
    assert stream + encoder.finish() == encode.encode(samples, RATE, "pcm")


def test_only_wav_and_pcm_stream():
    with pytest.raises(ValueError):
        encode.StreamEncoder("mp3", RATE, RATE)


def test_decode_audio_reads_uploads_and_rejects_garbage():
    buffer = io.BytesIO()
    soundfile.write(buffer, np.stack([tone(), tone()], axis=1), RATE, format="WAV")  # stereo -> mono
    decoded, rate = encode.decode_audio(buffer.getvalue())
    assert rate == RATE and decoded.shape == (RATE,)
    decoded, rate = encode.decode_audio(encode.encode(tone(), RATE, "mp3"))
    assert rate == RATE and abs(len(decoded) - RATE) < RATE * 0.1
    with pytest.raises(ValueError, match="decode"):
        encode.decode_audio(b"this is not audio at all" * 100)


@pytest.mark.parametrize("container, codec", [("adts", "aac"), ("webm", "libopus"), ("mp4", "aac")])
def test_decode_audio_reads_aac_webm_and_mp4_uploads(container, codec):
    samples = tone(300.0, rate=48000)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as output:
        stream = output.add_stream(codec, rate=48000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[np.newaxis, :], format="flt", layout="mono")
        frame.sample_rate, frame.pts = 48000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            output.mux(packet)
    decoded, rate = encode.decode_audio(buffer.getvalue())
    assert rate == 48000 and abs(len(decoded) - 48000) < 2048
    assert abs(dominant_frequency(decoded, rate) - 300) < 5
