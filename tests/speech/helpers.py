"""Small helpers shared by the speech tests: decoding responses, reading SSE."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import soundfile
from openai import AsyncOpenAI

from session_server.speech.encode import decode_audio


def sdk(server, api_key: str = "none") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=api_key, max_retries=0, timeout=30)


def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def pcm_samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0


def any_samples(data: bytes, response_format: str) -> tuple[np.ndarray, int]:
    if response_format == "pcm":
        return pcm_samples(data), 24000
    return decode_audio(data)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def sse_audio(events: list[tuple[str, dict]]) -> bytes:
    return b"".join(base64.b64decode(data["audio"]) for name, data in events if name == "speech.audio.delta")
