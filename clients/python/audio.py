"""Audio helpers for the client: WAV in and out, and a microphone-like track that plays a file.

Only soundfile, soxr, numpy, av and aiortc: nothing of the server.
"""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np
import soundfile
import soxr
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

TRACK_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz


def read_wav(path: str, rate: int) -> np.ndarray:
    """Any soundfile-readable file -> float32 mono at `rate`."""
    samples, source = soundfile.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    return soxr.resample(mono, source, rate, quality="HQ").astype(np.float32) if source != rate else mono


class MicrophoneUnavailable(RuntimeError):
    pass


def record_microphone(seconds: float, rate: int) -> np.ndarray:
    """`seconds` from the default input device, float32 mono at `rate` (optional `sounddevice`)."""
    try:
        import sounddevice
    except ImportError:
        raise MicrophoneUnavailable("microphone input needs the `sounddevice` package (pip install sounddevice)") from None
    try:
        print(f"recording {seconds:g} s from the microphone ...", flush=True)
        recording = sounddevice.rec(int(seconds * rate), samplerate=rate, channels=1, dtype="float32")
        sounddevice.wait()
    except Exception as exc:  # noqa: BLE001 - PortAudio errors: no device, busy device...
        raise MicrophoneUnavailable(f"could not record from the microphone: {exc}") from None
    return recording[:, 0]


def write_wav(path: str, samples: np.ndarray, rate: int) -> None:
    soundfile.write(path, np.clip(samples, -1, 1), rate, subtype="PCM_16")


def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    array = array.reshape(channels, -1).T if frame.format.is_planar else array.reshape(-1, channels)
    scale = 32768.0 if array.dtype == np.int16 else 1.0
    return (array.astype(np.float32) / scale).mean(axis=1)


class PlaybackTrack(MediaStreamTrack):
    """A microphone stand-in: plays queued float32 48 kHz mono audio in real time, silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, dtype=np.float32)
        self._start: float | None = None
        self._timestamp = 0
        self.drained = asyncio.Event()
        self.drained.set()

    def play(self, samples: np.ndarray, rate: int) -> None:
        if rate != TRACK_RATE:
            samples = soxr.resample(samples, rate, TRACK_RATE, quality="HQ").astype(np.float32)
        self._queue = np.concatenate([self._queue, samples.astype(np.float32)])
        self.drained.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            due = self._start + self._timestamp / TRACK_RATE
            if due > now:
                await asyncio.sleep(due - now)
        chunk = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        take = min(FRAME_SAMPLES, self._queue.size)
        chunk[:take] = self._queue[:take]
        self._queue = self._queue[take:]
        if self._queue.size == 0:
            self.drained.set()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update((np.clip(chunk, -1, 1) * 32767).astype(np.int16).tobytes())
        frame.sample_rate = TRACK_RATE
        frame.pts = self._timestamp
        frame.time_base = fractions.Fraction(1, TRACK_RATE)
        self._timestamp += FRAME_SAMPLES
        return frame
