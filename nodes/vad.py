"""Voice activity detection: silero VAD (ONNX) on 16 kHz audio, batched across sessions.

Model: the ONNX export that ships inside the `silero-vad` PyPI package
(`silero_vad/data/silero_vad.onnx`), run with onnxruntime. No torch hub, no download.

Per session the node keeps the model's recurrent state (2 x 128 floats), the last 64 samples of
context the model expects in front of each window, a stream resampler to 16 kHz (8 kHz phone
audio through graph/fir_resampling.py's `Upsample2`, 2 ms of lookahead: soxr's held back
20-100 ms of it in 20 ms chunks, so VAD heard a caller stop that much later; other rates, 24 kHz
among them, through soxr's), and the speech/silence hysteresis. Every 512-sample window
(32 ms) of every session goes through ONE shared batcher: windows that are ready at the same
moment from many sessions are stacked into a single onnxruntime call with their states batched
along the model's batch axis. A window is due (graph/executor.py) when its audio reached the
server (`AudioChunk.received_at`), so a session that fell behind catches up ahead of newer work.

Output, in input order: each 16 kHz window as an `AudioChunk`, a `SpeechStarted` /
`SpeechPaused` / `SpeechStopped` right after the window that decided it, and `ImageFrame` /
`Command` messages forwarded where they arrived. `Configure(target=Stage.VAD)` updates the
thresholds (`turn_detection` of the session config; `None` switches detection off: manual
commits, audio is still resampled and forwarded).

Segmentation (as silero's VADIterator): speech starts at the first window with probability >=
`threshold`; it stops once the probability stayed below `threshold - 0.15` for
`silence_duration_ms`. `audio_start_ms` is the start of the first speech window;
`audio_end_ms` is the end of the silence window (it includes the silence, as GA reports).

Semantic end of turn (`turn_detection.semantic`, nodes/smart_turn.py): once a pause has lasted
`check_after_ms` (200 ms under `semantic_vad`; the silence window under `server_vad` with the
check), the Smart Turn classifier scores the turn's last 8 s (from 500 ms before its speech
started), batched with every other session pausing then; p(complete) >= 0.5 ends the turn
there, otherwise it checks again each time the pause has doubled (the longer the pause, the surer
the score; shorter than 200 ms, scores are unreliable), and the turn ends after `max_silence_ms`
of silence whatever it said, unless speech resumes. Without the model loaded (the `smart-turn`
extra is missing; the server refuses such sessions first) the first check point ends the turn.

Early prefill (node param `prefill_early_ms`, default 300; null or 0: off): under plain server VAD
(no semantic check) a pause that reaches `silence_duration_ms - prefill_early_ms` (at least 100 ms)
gets one `SpeechPaused` right after the window that reached it, unless that window ends the turn
too; if speech comes back before the turn ends, a `SpeechPaused(resumed=True)` follows the first
speech window. The dialog may send the utterance down the graph early on it (nodes/dialog.py).
No pause events in semantic mode (the classifier, not the clock, ends those turns) or with turn
detection off.

Short sounds (`interrupt_min_speech_ms`): the first speech window's `SpeechStarted` is
unconfirmed until the segment holds that much speech; then a confirmed one follows with the same
`audio_start_ms`. An unconfirmed sound followed by 96 ms of silence gets a `SpeechDismissed`.
The dialog decides what they mean (only a sound during a reply waits for confirmation).
"""

from __future__ import annotations

import importlib.resources
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import soxr

from graph.fir_resampling import CentredFir, streaming
from graph.messages import (
    AudioChunk,
    Command,
    Commit,
    Configure,
    ImageFrame,
    InputEnd,
    Message,
    SpeechDismissed,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Stage,
)
from graph.node import Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes import smart_turn
from nodes.params import SileroVadParams, decode

RATE = 16000
WINDOW = 512  # samples at 16 kHz: 32 ms, the window the model is trained on
CONTEXT = 64  # samples of the previous window the model sees in front of each window
STATE_SHAPE = (2, 128)
WINDOW_MS = WINDOW * 1000.0 / RATE
PREROLL_MS = 500.0  # audio before speech start the classifier also hears (as pipecat feeds it)
DISMISS_AFTER_MS = 96.0  # silence after which an unconfirmed sound counts as over
COMPLETE = 0.5  # p(complete) from which the classifier's verdict ends the turn
MIN_PAUSE_MS = 100.0  # no `SpeechPaused` before this much silence: shorter gaps are within words


def model_path() -> str:
    return str(importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx")


@dataclass
class VadSettings:
    threshold: float = 0.5
    silence_duration_ms: float = 500.0
    interrupt_min_speech_ms: float = 0.0
    # Semantic end of turn: the classifier decides at a pause of `check_after_ms`; a pause of
    # `max_silence_ms` ends the turn whatever it said. None: silence timing alone.
    check_after_ms: float | None = None
    max_silence_ms: float = 0.0

    @classmethod
    def from_config(cls, turn_detection: dict[str, Any] | None) -> VadSettings | None:
        if turn_detection is None:
            return None
        semantic = turn_detection.get("semantic") or {}
        return cls(
            threshold=float(turn_detection.get("threshold", 0.5)),
            silence_duration_ms=float(turn_detection.get("silence_duration_ms", 500)),
            interrupt_min_speech_ms=float(turn_detection.get("interrupt_min_speech_ms", 0)),
            check_after_ms=float(semantic["check_after_ms"]) if semantic else None,
            max_silence_ms=float(semantic.get("max_silence_ms", 0)),
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
    outputs = {"events": (AudioChunk, ImageFrame, Command, SpeechStarted, SpeechDismissed, SpeechPaused, SpeechStopped)}

    async def start(self) -> None:
        settings = decode(self.params, SileroVadParams, f"nodes.{self.name}.params")
        self.prefill_early_ms = float(settings.prefill_early_ms or 0)
        self.model = await self.context.compute.run(SileroModel, settings.model_path)
        self.batcher = self.context.compute.batcher("silero_vad", self.model.run_batch, settings.max_batch)
        self.open_sessions = 0
        # Warm-up: the first onnxruntime call allocates its arenas.
        await self.batcher.submit((np.zeros(CONTEXT + WINDOW, np.float32), np.zeros(STATE_SHAPE, np.float32)))
        self.end_of_turn: Any = None  # the Smart Turn batcher, where the `smart-turn` extra is installed
        if settings.smart_turn and smart_turn.available():
            model = await self.context.compute.run(smart_turn.SmartTurnModel)
            self.end_of_turn = self.context.compute.batcher("smart_turn", model.run_batch, settings.max_batch)
            await self.end_of_turn.submit(np.zeros(WINDOW, np.float32))

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
        self.resampler: CentredFir | soxr.ResampleStream | None = None
        self.resampler_rate = RATE
        self.speaking = False
        self.silence_since: int | None = None  # sample index where the current silence began
        self.speech_start_ms = 0.0
        self.voiced_ms = 0.0  # speech heard in the current segment
        self.confirmed = False  # the segment has lasted interrupt_min_speech_ms
        self.dismissed = False
        self.paused = False  # the current pause had its `SpeechPaused`
        self.next_check_ms: float | None = None  # the pause length at which the classifier scores it next
        self.turn_from = 0  # sample index the classifier's audio starts at
        self.heard: deque[tuple[int, np.ndarray]] = deque(maxlen=int(smart_turn.SAMPLES // WINDOW))
        self.closed = False

    @property
    def now_ms(self) -> float:
        return (self.origin_ms or 0.0) + self.samples * 1000.0 / RATE

    async def on_message(self, stream: str, message: Message, emit) -> None:
        if isinstance(message, AudioChunk):
            await self._audio(message, emit)
        elif isinstance(message, Command) and message.target is Stage.VAD:
            if isinstance(message, Configure):
                self.settings = VadSettings.from_config(message.config.get("turn_detection"))
                if self.settings is None:
                    self.speaking = self.paused = False
        else:
            if isinstance(message, (Commit, InputEnd)):
                await self._flush_partial(emit)
            await emit("events", message)

    async def _audio(self, chunk: AudioChunk, emit) -> None:
        if self.origin_ms is None:
            self.origin_ms = chunk.media_ms
        samples = np.asarray(chunk.samples, dtype=np.float32).reshape(-1)
        if chunk.sample_rate != RATE:
            if self.resampler is None or self.resampler_rate != chunk.sample_rate:
                self.resampler = (streaming(chunk.sample_rate, RATE)
                                  or soxr.ResampleStream(chunk.sample_rate, RATE, 1, dtype="float32", quality="HQ"))
                self.resampler_rate = chunk.sample_rate
            samples = self.resampler.resample_chunk(samples)
        self.pending = np.concatenate([self.pending, samples]) if len(self.pending) else samples
        self.pending_received_at = chunk.received_at
        while len(self.pending) >= WINDOW:
            window, self.pending = self.pending[:WINDOW], self.pending[WINDOW:]
            await self._window(window, emit)

    async def _window(self, window: np.ndarray, emit) -> None:
        start_ms = self.now_ms
        events: list[Message] = []
        self.heard.append((self.samples, window))
        if self.settings is not None:
            # Due when its audio arrived: a session whose windows queued up (its inbox filled
            # while the compute worker was busy) is served first, not one window per round.
            probability, self.state = await self.node.batcher.submit(
                (np.concatenate([self.context, window]), self.state), due=self.pending_received_at)
            events = await self._decide(probability, start_ms)
        self.context = window[-CONTEXT:]
        self.samples += len(window)
        await emit("events", AudioChunk(samples=window, sample_rate=RATE, media_ms=start_ms))
        for event in events:
            await emit("events", event)

    async def _decide(self, probability: float, start_ms: float) -> list[Message]:
        settings = self.settings
        assert settings is not None
        end = self.samples + WINDOW
        end_ms = start_ms + WINDOW_MS
        if probability >= settings.threshold:
            self.silence_since = None
            self.next_check_ms = settings.check_after_ms
            resumed: list[Message] = []
            if self.paused:
                self.paused = False
                resumed.append(SpeechPaused(audio_end_ms=end_ms, media_ms=end_ms, resumed=True))
            onset = not self.speaking
            if onset:
                self.speaking = True
                self.speech_start_ms = start_ms
                self.voiced_ms = 0.0
                self.confirmed = self.dismissed = False
                self.turn_from = max(0, self.samples - int(PREROLL_MS * RATE / 1000))
            self.voiced_ms += WINDOW_MS
            if not self.confirmed and self.voiced_ms >= settings.interrupt_min_speech_ms:
                self.confirmed = True
                return [*resumed, SpeechStarted(audio_start_ms=self.speech_start_ms, media_ms=start_ms)]
            if onset:
                return [SpeechStarted(audio_start_ms=start_ms, media_ms=start_ms, confirmed=False)]
            return resumed
        if not (self.speaking and probability < settings.threshold - 0.15):
            return []
        if self.silence_since is None:
            self.silence_since = self.samples
        silence_ms = (end - self.silence_since) * 1000.0 / RATE
        events: list[Message] = []
        if not self.confirmed and not self.dismissed and silence_ms >= DISMISS_AFTER_MS:
            self.dismissed = True
            events.append(SpeechDismissed(audio_end_ms=end_ms, media_ms=end_ms))
        if await self._turn_ends(silence_ms):
            self.speaking = self.paused = False
            self.silence_since = None
            events.append(SpeechStopped(audio_end_ms=end_ms, media_ms=end_ms))
        elif not self.paused and self._pause_reached(silence_ms):
            self.paused = True
            events.append(SpeechPaused(audio_end_ms=end_ms, media_ms=end_ms))
        return events

    def warms_ahead(self) -> bool:
        """Plain server VAD with early prefill: each turn's utterance is prefilled in its pause."""
        settings = self.settings
        return settings is not None and settings.check_after_ms is None and self.node.prefill_early_ms > 0

    def _pause_reached(self, silence_ms: float) -> bool:
        """Plain server VAD: the pause is `prefill_early_ms` short of ending the turn."""
        settings = self.settings
        if not self.warms_ahead():
            return False
        early_ms = self.node.prefill_early_ms
        assert settings is not None
        pause_ms = max(settings.silence_duration_ms - early_ms, MIN_PAUSE_MS)
        return pause_ms < settings.silence_duration_ms and silence_ms >= pause_ms

    async def _turn_ends(self, silence_ms: float) -> bool:
        settings = self.settings
        assert settings is not None
        if settings.check_after_ms is None:
            return silence_ms >= settings.silence_duration_ms
        if silence_ms >= settings.max_silence_ms:
            return True
        if self.next_check_ms is None or silence_ms < self.next_check_ms:
            return False
        self.next_check_ms = max(silence_ms, self.next_check_ms) * 2
        if self.node.end_of_turn is None:
            return True
        turn = np.concatenate([window for index, window in self.heard if index >= self.turn_from])
        complete = await self.node.end_of_turn.submit(turn, due=self.pending_received_at)
        return complete >= COMPLETE

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
        self.heard.clear()
