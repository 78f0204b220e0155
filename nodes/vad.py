"""Voice activity detection: silero VAD (ONNX) on 16 kHz audio, batched across sessions.

Model: the ONNX export that ships inside the `silero-vad` PyPI package
(`silero_vad/data/silero_vad.onnx`), run with onnxruntime. No torch hub, no download.

Per session the node keeps the model's recurrent state (2 x 128 floats), the last 64 samples of
context the model expects in front of each window, a soxr stream resampler (24 kHz and 8 kHz
input become 16 kHz; no decimation), and the speech/silence hysteresis. Every 512-sample window
(32 ms) of every session goes through ONE shared batcher: windows that are ready at the same
moment from many sessions are stacked into a single onnxruntime call with their states batched
along the model's batch axis. A window is due (graph/executor.py) when its audio reached the
server (`AudioChunk.received_at`), so a session that fell behind catches up ahead of newer work.

Output, in input order: each 16 kHz window as an `AudioChunk`, a `SpeechStarted` /
`SpeechStopped` right after the window that decided it, and `ImageFrame` / `Command` messages
forwarded where they arrived. `Command(target="silero_vad", name="configure")` updates the
thresholds (`turn_detection` of the session config; `None` switches detection off: manual
commits, audio is still resampled and forwarded).

Segmentation (as silero's VADIterator): speech starts at the first window with probability >=
`threshold`; it stops once the probability stayed below `threshold - 0.15` for
`silence_duration_ms`. `audio_start_ms` is the start of the first speech window;
`audio_end_ms` is the end of the silence window (it includes the silence, as GA reports).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import soxr

from graph.messages import AudioChunk, Command, ImageFrame, Message, SpeechStarted, SpeechStopped
from graph.node import Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.params import SileroVadParams

RATE = 16000
WINDOW = 512  # samples at 16 kHz: 32 ms, the window the model is trained on
CONTEXT = 64  # samples of the previous window the model sees in front of each window
STATE_SHAPE = (2, 128)


def model_path() -> str:
    return str(importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx")


@dataclass
class VadSettings:
    threshold: float = 0.5
    silence_duration_ms: float = 500.0

    @classmethod
    def from_config(cls, turn_detection: dict[str, Any] | None) -> VadSettings | None:
        if turn_detection is None:
            return None
        return cls(
            threshold=float(turn_detection.get("threshold", 0.5)),
            silence_duration_ms=float(turn_detection.get("silence_duration_ms", 500)),
        )


class SileroModel:
    """One onnxruntime session for all sessions; `run_batch` is the batcher's batch function."""

    def __init__(self, path: str | None = None, threads: int = 1):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path or model_path(), sess_options=options, providers=["CPUExecutionProvider"])
        self._sr = np.array(RATE, dtype=np.int64)

    def run_batch(self, items: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[float, np.ndarray]]:
        """items: (context + window [576], state [2, 128]) -> (speech probability, new state)."""
        audio = np.stack([window for window, _ in items]).astype(np.float32, copy=False)
        state = np.stack([s for _, s in items], axis=1).astype(np.float32, copy=False)
        probs, new_state = self.session.run(None, {"input": audio, "state": state, "sr": self._sr})
        return [(float(probs[i, 0]), new_state[:, i, :].copy()) for i in range(len(items))]


@register_node("silero_vad")
class SileroVad(Node):
    params_schema = SileroVadParams
    inputs = {"audio": (AudioChunk, ImageFrame, Command)}
    outputs = {"events": (AudioChunk, ImageFrame, Command, SpeechStarted, SpeechStopped)}

    async def start(self) -> None:
        self.model = await self.context.compute.run(SileroModel, self.params.get("model_path"))
        self.batcher = self.context.compute.batcher("silero_vad", self.model.run_batch, int(self.params.get("max_batch", 64)))
        self.open_sessions = 0
        # Warm-up: the first onnxruntime call allocates its arenas.
        await self.batcher.submit((np.zeros(CONTEXT + WINDOW, np.float32), np.zeros(STATE_SHAPE, np.float32)))

    def open_session(self, session: SessionInfo) -> NodeSession:
        self.open_sessions += 1
        return VadSession(self, session)


class VadSession(NodeSession):
    node: SileroVad

    def __init__(self, node: SileroVad, session: SessionInfo):
        super().__init__(node, session)
        self.settings = VadSettings.from_config(session.config.get("turn_detection", {}))
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)  # 16 kHz samples not yet a whole window
        self.pending_received_at: float | None = None  # when the newest of them reached the server
        self.samples = 0  # 16 kHz samples forwarded so far: the node's clock
        self.origin_ms: float | None = None  # media time of the first input sample
        self.resampler: soxr.ResampleStream | None = None
        self.resampler_rate = RATE
        self.speaking = False
        self.silence_since: int | None = None  # sample index where the current silence began
        self.closed = False

    @property
    def now_ms(self) -> float:
        return (self.origin_ms or 0.0) + self.samples * 1000.0 / RATE

    async def on_message(self, stream: str, message: Message, emit) -> None:
        if isinstance(message, AudioChunk):
            await self._audio(message, emit)
        elif isinstance(message, Command) and message.target == "silero_vad":
            if message.name == "configure":
                self.settings = VadSettings.from_config(message.args.get("turn_detection"))
                if self.settings is None:
                    self.speaking = False
        else:
            if isinstance(message, Command) and message.name in ("commit", "input_end"):
                await self._flush_partial(emit)
            await emit("events", message)

    async def _audio(self, chunk: AudioChunk, emit) -> None:
        if self.origin_ms is None:
            self.origin_ms = chunk.media_ms
        samples = np.asarray(chunk.samples, dtype=np.float32).reshape(-1)
        if chunk.sample_rate != RATE:
            if self.resampler is None or self.resampler_rate != chunk.sample_rate:
                self.resampler = soxr.ResampleStream(chunk.sample_rate, RATE, 1, dtype="float32", quality="HQ")
                self.resampler_rate = chunk.sample_rate
            samples = self.resampler.resample_chunk(samples)
        self.pending = np.concatenate([self.pending, samples]) if len(self.pending) else samples
        self.pending_received_at = chunk.received_at
        while len(self.pending) >= WINDOW:
            window, self.pending = self.pending[:WINDOW], self.pending[WINDOW:]
            await self._window(window, emit)

    async def _window(self, window: np.ndarray, emit) -> None:
        start_ms = self.now_ms
        event: Message | None = None
        if self.settings is not None:
            # Due when its audio arrived: a session whose windows queued up (its inbox filled
            # while the compute worker was busy) is served first, not one window per round.
            probability, self.state = await self.node.batcher.submit(
                (np.concatenate([self.context, window]), self.state), due=self.pending_received_at)
            event = self._decide(probability, start_ms)
        self.context = window[-CONTEXT:]
        self.samples += len(window)
        await emit("events", AudioChunk(samples=window, sample_rate=RATE, media_ms=start_ms))
        if event is not None:
            await emit("events", event)

    def _decide(self, probability: float, start_ms: float) -> Message | None:
        settings = self.settings
        assert settings is not None
        end = self.samples + WINDOW
        if probability >= settings.threshold:
            self.silence_since = None
            if not self.speaking:
                self.speaking = True
                return SpeechStarted(audio_start_ms=start_ms, media_ms=start_ms)
            return None
        if self.speaking and probability < settings.threshold - 0.15:
            if self.silence_since is None:
                self.silence_since = self.samples
            if (end - self.silence_since) * 1000.0 / RATE >= settings.silence_duration_ms:
                self.speaking = False
                self.silence_since = None
                end_ms = self.now_ms + WINDOW * 1000.0 / RATE
                return SpeechStopped(audio_end_ms=end_ms, media_ms=end_ms)
        return None

    async def _flush_partial(self, emit) -> None:
        # A commit must see every sample appended before it: the resampler's filter delay and
        # the last partial window too. (The next audio starts a fresh resampler stream.)
        if self.resampler is not None:
            tail = self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self.resampler = None
            if len(tail):
                self.pending = np.concatenate([self.pending, tail])
            while len(self.pending) >= WINDOW:
                window, self.pending = self.pending[:WINDOW], self.pending[WINDOW:]
                await self._window(window, emit)
        if len(self.pending):
            window, self.pending = self.pending, np.zeros(0, np.float32)
            start_ms = self.now_ms
            self.samples += len(window)
            await emit("events", AudioChunk(samples=window, sample_rate=RATE, media_ms=start_ms))

    async def close(self) -> None:
        self.closed = True
        self.node.open_sessions -= 1
        self.pending = self.context = self.state = np.zeros(0, np.float32)
        self.resampler = None
