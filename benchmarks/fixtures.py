"""Deterministic speech input for the load generator.

Each simulated user speaks one of a few fixed sentences (chosen by a seeded generator). The
audio comes from espeak-ng when it is installed (Debian: `apt-get install espeak-ng`; its output
is byte-identical run to run), else from a synthetic voiced signal: a glottal pulse train with a
gliding pitch, shaped by vowel formants into ~4 syllables a second. silero VAD detects both as
speech (tests/bench checks the synthetic one), which is all the server's turn-taking needs.

Audio is float32 mono at 24 kHz (the realtime API's default `audio/pcm` rate).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 24000

SENTENCES = (
    "What is the weather like in Paris today?",
    "Please tell me a short story about a red fox.",
    "How many minutes does it take to boil an egg?",
    "Remind me to call my sister tomorrow morning.",
    "Can you explain how a rainbow forms in the sky?",
    "Which train goes to the airport after nine?",
)

QUICK_SENTENCE = "Hello, can you hear me?"


@dataclass(frozen=True)
class Utterance:
    text: str
    samples: np.ndarray  # float32 mono, SAMPLE_RATE
    source: str  # "espeak-ng" | "synthetic"

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def make_utterance(text: str, prefer: str = "auto") -> Utterance:
    """Speech for `text`: espeak-ng if available (or `prefer="espeak"`), else synthetic."""
    if prefer not in ("auto", "espeak", "synthetic"):
        raise ValueError(f"unknown fixture source {prefer!r}")
    if prefer != "synthetic" and espeak_available():
        return Utterance(text, espeak(text), "espeak-ng")
    if prefer == "espeak":
        raise RuntimeError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    return Utterance(text, synthetic_speech(text), "synthetic")


def espeak(text: str, words_per_minute: int = 160) -> np.ndarray:
    import soundfile as sf
    import soxr

    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", str(words_per_minute), "--stdout", text],
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    samples = soxr.resample(samples, rate, SAMPLE_RATE).astype(np.float32)
    return _trim(_normalize(samples))


# Formants (F1, F2, F3 in Hz) of a few vowels; syllables cycle through them.
_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (530, 1840, 2480), (300, 870, 2240), (660, 1720, 2410))


def synthetic_speech(text: str, syllables_per_s: float = 4.0) -> np.ndarray:
    """A voiced, speech-like signal whose length follows `text` (~1 syllable per 3 letters).

    Deterministic: the only randomness is a generator seeded from the text.
    """
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
    syllables = max(2, sum(c.isalpha() for c in text) // 3)
    syllable_len = int(SAMPLE_RATE / syllables_per_s)
    pieces = []
    for index in range(syllables):
        t = np.arange(syllable_len) / SAMPLE_RATE
        f0 = 110 + 25 * rng.random() + 15 * np.sin(2 * np.pi * 0.8 * (index * syllable_len / SAMPLE_RATE + t))
        phase = np.cumsum(f0 / SAMPLE_RATE)
        # Glottal pulses: a sharp, decaying wave once per pitch period, rich in harmonics.
        source = np.exp(-8 * (phase % 1.0)) - 0.12
        voiced = _formant_filter(source, _VOWELS[index % len(_VOWELS)])
        onset = rng.normal(0, 0.3, int(0.03 * SAMPLE_RATE))  # a short consonant burst
        voiced[: onset.size] += onset * np.linspace(1, 0, onset.size)
        envelope = np.sin(np.pi * np.clip(t / t[-1], 0, 1)) ** 0.6
        pieces.append(voiced * envelope)
    samples = np.concatenate(pieces)
    return _normalize(samples.astype(np.float32))


def _formant_filter(source: np.ndarray, formants: tuple[int, int, int]) -> np.ndarray:
    """Sum of second-order resonators (one per formant), applied in the frequency domain."""
    spectrum = np.fft.rfft(source)
    freqs = np.fft.rfftfreq(source.size, 1 / SAMPLE_RATE)
    response = np.zeros_like(freqs)
    for gain, formant in zip((1.0, 0.6, 0.3), formants):
        bandwidth = 80 + formant * 0.05
        response += gain / (1 + ((freqs - formant) / bandwidth) ** 2)
    return np.fft.irfft(spectrum * response, n=source.size)


def _trim(samples: np.ndarray, floor: float = 0.01, margin_s: float = 0.01) -> np.ndarray:
    """Cut leading and trailing silence (espeak-ng adds ~350 ms at the end), so that "the end of
    the user's audio" is the end of the speech."""
    loud = np.nonzero(np.abs(samples) > floor)[0]
    if loud.size == 0:
        return samples
    margin = int(margin_s * SAMPLE_RATE)
    return samples[max(0, loud[0] - margin) : loud[-1] + margin + 1]


def _normalize(samples: np.ndarray, peak: float = 0.6) -> np.ndarray:
    top = float(np.max(np.abs(samples))) if samples.size else 0.0
    return (samples * (peak / top)).astype(np.float32) if top > 0 else samples


def pcm16(samples: np.ndarray) -> bytes:
    """float32 [-1, 1] -> little-endian PCM16 bytes (what `audio/pcm` carries)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
