"""Semantic end-of-turn: the Smart Turn v3.2 classifier (ONNX), batched across sessions.

Model: `smart-turn-v3.2-cpu.onnx` (8 MB, BSD-2, by Daily), which ships inside the `pipecat-ai`
wheel, installed by this server's `smart-turn` extra. Only that file is used: it is run here with
onnxruntime, on features from transformers' `WhisperFeatureExtractor`. pipecat itself is never
imported (its package `__init__` replaces `asyncio.wait_for` and logs a banner), which is also why
the file is found through the distribution's metadata rather than `importlib.resources`, which
would import the package. Nothing downloads it.

Input: the last 8 s of a user's turn at 16 kHz (shorter audio is zero-padded in front, as the
model was trained), as 80 x 800 Whisper log-mel features. Output: the probability that the
speaker has finished their turn (the model's output is already a sigmoid). `run_batch` stacks the
turns of every session that paused at the same moment into one onnxruntime call.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort

RATE = 16000
SECONDS = 8
SAMPLES = RATE * SECONDS
DISTRIBUTION = "pipecat-ai"  # session_server/realtime/session_config.py checks for it by the same name
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
EXTRA_HINT = "install the server with its `smart-turn` extra: pip install 'sgl-omni-server[smart-turn]'"


class SmartTurnUnavailable(RuntimeError):
    pass


def model_path() -> str:
    """The ONNX file inside the installed `pipecat-ai` wheel, or SmartTurnUnavailable."""
    try:
        path = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(MODEL_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise SmartTurnUnavailable(f"the Smart Turn model is not installed; {EXTRA_HINT}") from None
    if not path.is_file():
        raise SmartTurnUnavailable(f"{path} is missing from the installed {DISTRIBUTION}; {EXTRA_HINT}")
    return str(path)


def available() -> bool:
    try:
        model_path()
    except SmartTurnUnavailable:
        return False
    return True


def last_seconds(audio: np.ndarray) -> np.ndarray:
    """The model's input window: the last 8 s, zero-padded in front when shorter."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)[-SAMPLES:]
    if len(audio) < SAMPLES:
        audio = np.concatenate([np.zeros(SAMPLES - len(audio), np.float32), audio])
    return audio


class SmartTurnModel:
    """One onnxruntime session for all sessions; `run_batch` is the batcher's batch function."""

    def __init__(self, path: str | None = None, threads: int = 1):
        from transformers import WhisperFeatureExtractor

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path or model_path(), sess_options=options, providers=["CPUExecutionProvider"])
        self.features = WhisperFeatureExtractor(chunk_length=SECONDS, feature_size=80)

    def run_batch(self, turns: list[np.ndarray]) -> list[float]:
        """turns: 16 kHz audio of each turn so far -> p(the turn is complete), in order."""
        windows = [last_seconds(audio) for audio in turns]
        features = self.features(windows, sampling_rate=RATE, padding="max_length", max_length=SAMPLES,
                                 truncation=True, do_normalize=True, return_tensors="np").input_features
        (probabilities,) = self.session.run(None, {"input_features": features.astype(np.float32, copy=False)})
        return [float(p) for p in probabilities.reshape(-1)]
