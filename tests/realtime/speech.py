"""Test speech: spoken with Debian's espeak-ng at test time (`apt-get install espeak-ng`)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile

import numpy as np
import soundfile
import soxr


@functools.lru_cache(maxsize=8)
def _spoken(text: str) -> tuple[np.ndarray, int]:
    espeak = shutil.which("espeak-ng")
    assert espeak is not None, "espeak-ng is needed for speech tests: apt-get install -y espeak-ng"
    with tempfile.NamedTemporaryFile(suffix=".wav") as wav:
        subprocess.run([espeak, "-w", wav.name, text], check=True, capture_output=True)
        samples, rate = soundfile.read(wav.name, dtype="float32")
    return samples, rate


def speech(text: str = "What is the weather like today in Paris?", rate: int = 24000) -> np.ndarray:
    """float32 mono speech at `rate`."""
    samples, source = _spoken(text)
    return soxr.resample(samples, source, rate, quality="HQ").astype(np.float32)


def silence(seconds: float, rate: int = 24000) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
