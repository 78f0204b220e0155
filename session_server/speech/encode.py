"""Turning the graph's float32 reply audio into what a speech client asked for.

The graph speaks float32 mono at the model's rate (24 kHz for Qwen3-Omni). A request may ask for
another `sample_rate` (resampled with soxr, a real band-limited resampler), another `speed`
(pitch-preserving time stretch, see `time_stretch`) and one of five containers:

| format | bytes | media type |
|---|---|---|
| wav | RIFF/WAVE, PCM 16-bit LE mono | audio/wav |
| pcm | raw PCM 16-bit LE mono, no header | audio/pcm |
| flac | FLAC 16-bit (libsndfile) | audio/flac |
| mp3 | MPEG layer III (LAME via PyAV) | audio/mpeg |
| opus | Opus in an Ogg container (libopus via PyAV) | audio/ogg |

mp3 and opus need PyAV; a server without it offers (and its schema lists) the other three.

Only `wav` and `pcm` can be streamed (the others need the whole clip or a stateful encoder a
client cannot join mid-way); a streamed WAV starts with a header whose sizes say "unknown"
(0xFFFFFFFF), which players and decoders read as "until the end of the stream".
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile
import soxr

try:
    import av
except ImportError:  # PyAV is optional (session_server/webrtc/availability.py): no mp3 or opus then
    av = None

RESPONSE_FORMATS = ("wav", "pcm", "flac", "mp3", "opus") if av is not None else ("wav", "pcm", "flac")
STREAMABLE_FORMATS = ("wav", "pcm")
SAMPLE_RATES = (8000, 16000, 24000, 48000)
MIN_SPEED, MAX_SPEED = 0.25, 4.0

MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}

# Fixed so that `seed` -> same audio also holds when `speed` is set (the stretcher randomises
# phases otherwise).
_STRETCH_SEED = 0x5EED


def to_pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> PCM 16-bit little-endian (clipped, rounded)."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte PCM16 mono WAV header. `data_bytes=None`: a streaming header (sizes unknown)."""
    if data_bytes is None:
        riff_size = data_size = 0xFFFFFFFF
    else:
        riff_size, data_size = 36 + data_bytes, data_bytes
    block_align = 2
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * block_align, block_align, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    if from_rate == to_rate or len(samples) == 0:
        return np.asarray(samples, dtype=np.float32)
    return soxr.resample(np.asarray(samples, dtype=np.float32), from_rate, to_rate, quality="HQ").astype(np.float32)


def time_stretch(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Play `speed` times faster without changing pitch (Signalsmith Stretch via python-stretch).

    Chosen over the alternatives that install here: Rubber Band (pyrubberband) needs a system
    CLI and is GPL; librosa's phase vocoder pulls numba/scipy and smears transients; audiotsm is
    unmaintained pure Python. Signalsmith Stretch is MIT, a 100 kB wheel, compensates its own
    latency (output stays aligned) and is deterministic given a seed.
    """
    if speed == 1.0 or len(samples) == 0:
        return np.asarray(samples, dtype=np.float32)
    import python_stretch  # local: a C extension only `speed != 1` requests need

    stretcher = python_stretch.Signalsmith.Stretch(_STRETCH_SEED)
    stretcher.preset(1, float(sample_rate))
    stretcher.timeFactor = float(speed)
    out = stretcher.process(np.ascontiguousarray(samples, dtype=np.float32)[np.newaxis, :])
    return np.asarray(out[0], dtype=np.float32)


def encode(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """Encode a whole clip (float32 mono) into `response_format`."""
    if response_format == "pcm":
        return to_pcm16(samples)
    if response_format == "wav":
        pcm = to_pcm16(samples)
        return wav_header(sample_rate, len(pcm)) + pcm
    if response_format == "flac":
        buffer = io.BytesIO()
        soundfile.write(buffer, np.asarray(samples, dtype=np.float32), sample_rate, format="FLAC", subtype="PCM_16")
        return buffer.getvalue()
    if response_format == "mp3":
        return _encode_with_av(samples, sample_rate, container="mp3", codec="libmp3lame", bit_rate=64_000)
    if response_format == "opus":
        return _encode_with_av(samples, sample_rate, container="ogg", codec="libopus", bit_rate=32_000)
    raise ValueError(f"unsupported response_format {response_format!r}")


def _encode_with_av(samples: np.ndarray, sample_rate: int, *, container: str, codec: str, bit_rate: int) -> bytes:
    buffer = io.BytesIO()
    pcm = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    with av.open(buffer, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=sample_rate, layout="mono")
        stream.bit_rate = bit_rate
        frame = av.AudioFrame.from_ndarray(pcm[np.newaxis, :], format="flt", layout="mono")
        frame.sample_rate = sample_rate
        frame.pts = 0
        # PyAV converts to the codec's sample format and re-chunks into its frame size.
        for packet in stream.encode(frame):
            output.mux(packet)
        for packet in stream.encode(None):
            output.mux(packet)
    return buffer.getvalue()


class StreamEncoder:
    """Streaming wav/pcm: resamples chunk by chunk (soxr keeps its filter state across chunks).

    `start()` returns the bytes that open the stream (the WAV header, or nothing for PCM),
    `push(samples)` the bytes for one decoded chunk, `finish()` what the resampler still holds.
    """

    def __init__(self, response_format: str, source_rate: int, target_rate: int):
        if response_format not in STREAMABLE_FORMATS:
            raise ValueError(f"streaming supports {', '.join(STREAMABLE_FORMATS)}, not {response_format!r}")
        self.response_format = response_format
        self.source_rate = source_rate
        self.target_rate = target_rate
        self._resampler = (
            soxr.ResampleStream(source_rate, target_rate, 1, dtype="float32", quality="HQ")
            if source_rate != target_rate
            else None
        )

    def start(self) -> bytes:
        return wav_header(self.target_rate) if self.response_format == "wav" else b""

    def push(self, samples: np.ndarray) -> bytes:
        samples = np.asarray(samples, dtype=np.float32)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=False)
        return to_pcm16(samples)

    def finish(self) -> bytes:
        if self._resampler is None:
            return b""
        return to_pcm16(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))


class AudioTooLong(ValueError):
    """The upload decodes to more than the caller's `max_seconds` (decoding stopped there)."""


# Samples read per step when decoding an upload: memory stays max_seconds of audio plus one block.
_DECODE_BLOCK_FRAMES = 65536


def decode_audio(data: bytes, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode an uploaded file (wav, flac, ogg, mp3, aac, webm, mp4...) to float32 mono.

    Decodes block by block and stops as soon as the audio passes `max_seconds`, raising
    `AudioTooLong`: a few hundred KiB of FLAC silence can hold an hour of audio (1.3 GB decoded),
    so the length is never learnt by decoding it all. Raises ValueError when the bytes are not
    audio any decoder here understands.
    """
    try:
        return _decode_with_soundfile(data, max_seconds)
    except AudioTooLong:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        pass
    try:
        return _decode_with_av(data, max_seconds)
    except AudioTooLong:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
        raise ValueError(f"could not decode the audio: {exc}") from None


def _too_long(max_seconds: float) -> AudioTooLong:
    return AudioTooLong(f"longer than {max_seconds:g} s")


def _decode_with_soundfile(data: bytes, max_seconds: float | None) -> tuple[np.ndarray, int]:
    with soundfile.SoundFile(io.BytesIO(data)) as audio:
        rate = int(audio.samplerate)
        max_frames = None if max_seconds is None else int(max_seconds * rate)
        if max_frames is not None and 0 < audio.frames and audio.frames > max_frames + _DECODE_BLOCK_FRAMES:
            raise _too_long(max_seconds)  # the header already says so
        blocks: list[np.ndarray] = []
        total = 0
        while True:
            block = audio.read(_DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)
            if len(block) == 0:
                break
            blocks.append(block.mean(axis=1).astype(np.float32))
            total += len(block)
            if max_frames is not None and total > max_frames:
                raise _too_long(max_seconds)
    if not blocks:
        return np.zeros(0, dtype=np.float32), rate
    return np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32), rate


def _decode_with_av(data: bytes, max_seconds: float | None) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise ValueError("the file has no audio stream")
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate or stream.rate
        if not rate:
            raise ValueError("could not decode the audio: no sample rate")
        max_samples = None if max_seconds is None else int(max_seconds * rate)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks: list[np.ndarray] = []
        total = 0

        def keep(frames) -> None:
            nonlocal total
            for converted in frames:
                chunk = converted.to_ndarray().reshape(-1)
                chunks.append(chunk)
                total += len(chunk)
            if max_samples is not None and total > max_samples:
                raise _too_long(max_seconds)

        for frame in container.decode(stream):
            keep(resampler.resample(frame))
        keep(resampler.resample(None))
    if not chunks:
        raise ValueError("could not decode the audio: no samples")
    return np.concatenate(chunks).astype(np.float32), int(rate)
