"""Voice matching: an uploaded voice speaks with the loaded model's nearest built-in speaker.

Qwen3-Omni cannot clone a voice: its talker speaks only as the speakers of its checkpoint. So an
uploaded sample is matched, once at upload, to the built-in speaker whose voice is nearest, and
that speaker speaks whenever a request or a session names the uploaded voice.

A voice's signature is a small fixed-length vector of the sample (librosa, at 16 kHz): the mean
and the standard deviation of MFCCs 1..19 (the spectral envelope and how it moves; c0, the
loudness, is left out) over the frames within 30 dB of the loudest, and the median pitch of those
frames in semitones (YIN). The built-in speakers' signatures come from the speech service itself
(`SpeechService.speak_reference`): each speaker says `REFERENCE_TEXT` once per process, lazily at
the first upload, with a fixed seed and one speaker at a time, so every replica computes the same
ones (up to rounding where a speaker's request shared a batch with live sessions' work).

Distance: euclidean after z-scoring each dimension by how much the built-in speakers differ on it
(their standard deviation, floored at a tenth of the median one so that a dimension on which they
happen to agree does not blow the sample's noise up). Cosine was the other candidate; it ignores
a vector's length, and a voice an octave lower has a longer one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
import soxr

SIGNATURE_RATE = 16000
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back home."
REFERENCE_SEED = 0
# Codec frames of one reference utterance: about 6 s of speech at 12.5 frames per second.
REFERENCE_FRAMES = 80
_N_MFCC = 20
_HOP = 512
_QUIET_DB = 30.0
_MIN_PITCH_HZ, _MAX_PITCH_HZ = 65.0, 500.0


def signature(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """The sample's signature (float64, fixed length). Blocking: run it in a thread."""
    import librosa  # a few seconds at the first import: off the server's start

    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    if sample_rate != SIGNATURE_RATE:
        audio = soxr.resample(audio, sample_rate, SIGNATURE_RATE)
    if audio.size < 2048:
        audio = np.pad(audio, (0, 2048 - audio.size))
    mfcc = librosa.feature.mfcc(y=audio, sr=SIGNATURE_RATE, n_mfcc=_N_MFCC, hop_length=_HOP)[1:]
    rms = librosa.feature.rms(y=audio, hop_length=_HOP)[0]
    pitch = librosa.yin(audio, fmin=_MIN_PITCH_HZ, fmax=_MAX_PITCH_HZ, sr=SIGNATURE_RATE, frame_length=2048, hop_length=_HOP)
    frames = min(mfcc.shape[1], rms.size, pitch.size)
    level = librosa.amplitude_to_db(rms[:frames], ref=np.max)
    loud = level >= -_QUIET_DB
    if not loud.any():
        loud = np.ones(frames, dtype=bool)
    kept = mfcc[:, :frames][:, loud]
    semitones = 12.0 * np.log2(np.median(pitch[:frames][loud]) / 55.0)
    return np.concatenate([kept.mean(axis=1), kept.std(axis=1), [semitones]]).astype(np.float64)


def nearest(sample: np.ndarray, speakers: dict[str, np.ndarray]) -> str:
    """The speaker whose signature is nearest to `sample` (z-scored euclidean, see above)."""
    names = sorted(speakers)
    if len(names) == 1:
        return names[0]
    table = np.stack([speakers[name] for name in names])
    spread = table.std(axis=0)
    scale = np.maximum(spread, max(0.1 * float(np.median(spread)), 1e-9))
    distances = np.linalg.norm((table - sample) / scale, axis=1)
    return names[int(np.argmin(distances))]


class SpeakerMatcher:
    """Matches samples to built-in speakers; their signatures are made once, at the first match.

    `speak(speaker)` returns that speaker's reference audio (samples, rate); `speakers()` names
    them. A failure to make the signatures is raised to the caller and tried again next time.
    """

    def __init__(self, speak: Callable[[str], Awaitable[tuple[np.ndarray, int]]], speakers: Callable[[], Sequence[str]]):
        self._speak = speak
        self._speakers = speakers
        self._signatures: asyncio.Future[dict[str, np.ndarray]] | None = None

    async def signatures(self) -> dict[str, np.ndarray]:
        made = self._signatures
        if made is None or (made.done() and (made.cancelled() or made.exception() is not None)):
            self._signatures = asyncio.ensure_future(self._make_signatures())
        return await asyncio.shield(self._signatures)

    async def nearest(self, samples: np.ndarray, sample_rate: int) -> str:
        """The built-in speaker nearest to the sample."""
        sample = await asyncio.to_thread(signature, samples, sample_rate)
        return nearest(sample, await self.signatures())

    async def _make_signatures(self) -> dict[str, np.ndarray]:
        made = {}
        # One speaker at a time: batched together, their requests would round differently.
        for name in self._speakers():
            samples, rate = await self._speak(name)
            made[name] = await asyncio.to_thread(signature, samples, rate)
        return made
