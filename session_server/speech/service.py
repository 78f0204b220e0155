"""What the speech routes share: their settings, the voice registry, the speaker matcher (an
uploaded voice speaks as its nearest built-in speaker: `voice_match.py`), and running one request.

A speech request runs on the loaded graph, next to the live sessions: it opens a graph session
of kind `speech`, sends one `Turn(role="assistant", text=..., speak=True)` into the graph input
`speech`, and reads `AudioOut` until the turn's `TurnDone` (which carries the usage). Nothing
is kept afterwards; the session is closed when the request ends, whether it finished, failed or
the client went away.

Sessions first: the runtime runs each node task of a `speech` session at
`graph.executor.PRIORITY_SPEECH`, below the live sessions' `PRIORITY_REALTIME`
(`graph.executor.current_priority`, set from the session kind). The shared batchers take every
waiting live-session item before any speech item (speech only fills the rest of a batch), and the
compute pool's threads take queued live-session calls before queued speech calls; running work is
never preempted.
Each request is a session of kind `speech` in the live-sessions registry while it runs
(session_server/live_sessions.py: the admin API lists it; its DELETE ends the request, whose
client gets error `admin_closed`).

Speech requests also have their own admission cap (`limits.max_speech_sessions`): past it a
request gets 503 `speech_capacity_reached` instead of queueing without bound, and they never
take a live-session slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from graph.background import spawn
from graph.errors import SessionRejected
from graph.messages import AudioOut, ReplyParams, Turn, TurnDone, Usage
from graph.runtime import GraphRuntime
from graph.schema import convert_section
from session_server.speech.voice_match import REFERENCE_FRAMES, REFERENCE_SEED, REFERENCE_TEXT, SpeakerMatcher
from session_server.speech.voice_registry import POLICIES, VoiceRegistry
from session_server.usage import SessionUsage

log = logging.getLogger("session_server.speech")

SPEECH_INPUT = "speech"
DEFAULT_SAMPLE_RATE = 24000


@dataclass(frozen=True)
class SpeechConfig:
    """The profile's optional `speech:` section. Every bound says what a client sees past it."""

    # The resource whose `speakers` / `default_speaker` / `output_sample_rate` describe the
    # model's voices (None: the first resource that has `speakers`).
    resource: str | None = None
    # Used only when no resource names speakers (fake graphs, models without speakers).
    voices: tuple[str, ...] = ("default",)
    voices_dir: str = "~/.cache/sgl-omni/voices"
    # s3://BUCKET/PREFIX: the registry on S3-compatible storage, shared by replicas (voice_registry_s3.py).
    voices_url: str | None = None
    # Uploads of a new name past this get 400 `voice_limit_reached`.
    max_voices: int = 1000
    voice_policy: str = "overwrite"
    voice_min_s: float = 1.0
    voice_max_s: float = 60.0
    # Uploaded files larger than this get 413 before decoding (the reference's 10 MiB).
    voice_max_bytes: int = 10 * 1024 * 1024
    # `input` (or `instructions`) longer than this gets 400 `input_too_long` (a request must stay
    # a bounded amount of work).
    max_input_chars: int = 4096
    # `max_new_tokens` above this gets 400.
    max_new_tokens: int = 8192
    # Items of one batch synthesised at once; the rest wait their turn inside the request.
    batch_concurrency: int = 8
    # WebSocket: no `session.config` within this long -> `error`, then close (1008).
    ws_config_timeout_s: float = 10.0
    # WebSocket: no client message for this long while nothing is being spoken -> close (1000).
    ws_idle_timeout_s: float = 120.0
    # WebSocket: a client message larger than this -> `error`, then close (1009).
    ws_max_message_bytes: int = 64 * 1024
    # WebSocket: text buffered for one utterance beyond this -> `error`, the text is refused.
    ws_max_utterance_chars: int = 4096

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> SpeechConfig:
        raw = profile.get("speech")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known) if isinstance(raw, dict) else []
        if unknown:
            raise ValueError(f"speech.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        config = convert_section(raw, cls, "speech")  # types checked: one line naming the key
        if config.voices_url is not None:
            from session_server.speech.voice_registry_s3 import parse_voices_url

            parse_voices_url(config.voices_url)
        if config.voice_policy not in POLICIES:
            raise ValueError(f"speech.voice_policy: {config.voice_policy!r} is not allowed (allowed: {', '.join(POLICIES)})")
        return config


class SpeechFailed(Exception):
    """The graph could not produce the audio (a node failed, the reply was cancelled)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ModelVoices:
    names: tuple[str, ...]
    default: str
    sample_rate: int

    def canonical(self, voice: str) -> str | None:
        """Voice names match case-insensitively; returns the model's spelling."""
        lowered = voice.lower()
        return next((name for name in self.names if name.lower() == lowered), None)


class SpeechService:
    def __init__(self, runtime: GraphRuntime, config: SpeechConfig, metrics: Any = None, sessions: Any = None,
                 model_names: tuple[str, ...] = ()):
        self.runtime = runtime
        self.config = config
        # The server's live-sessions registry (session_server/live_sessions.py), where each job is listed.
        self.sessions = sessions
        # The names a request's `model` may give (session_server/model_names.py); empty: the runtime's model_id.
        self.model_names = model_names
        # Optional: anything with `first_audio(transport, seconds)` (session_server.metrics).
        self.metrics = metrics
        self._registry: VoiceRegistry | None = None
        self._model_voices: ModelVoices | None = None
        # Jobs in flight, so tests and metrics can see that a request really ended.
        self.active_jobs: set[SpeechJob] = set()
        # Uploaded voices speak with the nearest built-in speaker (voice_match.py).
        self.matcher = SpeakerMatcher(self.speak_reference, lambda: self.model_voices().names)

    # The model's voices are known once its resources have loaded (after the port opened).
    def model_voices(self) -> ModelVoices:
        if self._model_voices is not None:
            return self._model_voices
        voices = _read_model_voices(self.runtime, self.config)
        if self.runtime.ready:  # before that the resources may not exist yet
            self._model_voices = voices
        return voices

    def registry(self) -> VoiceRegistry:
        if self._registry is None:
            options = dict(builtin=frozenset(self.model_voices().names), max_voices=self.config.max_voices,
                           policy=self.config.voice_policy, min_seconds=self.config.voice_min_s,
                           max_seconds=self.config.voice_max_s)
            if self.config.voices_url:
                from session_server.speech.voice_registry_s3 import S3VoiceRegistry

                registry: VoiceRegistry = S3VoiceRegistry(self.config.voices_url, **options)
            else:
                registry = VoiceRegistry(Path(self.config.voices_dir).expanduser(), **options)
            registry.load()
            self._registry = registry
        return self._registry

    def job(self, **params: Any) -> SpeechJob:
        return SpeechJob(self, **params)

    async def speak_reference(self, speaker: str) -> tuple[np.ndarray, int]:
        """`speaker` saying the matcher's reference sentence (deterministic: a fixed seed).
        Raises SessionRejected / SpeechFailed as any request does."""
        job = self.job(text=REFERENCE_TEXT, voice=speaker, seed=REFERENCE_SEED,
                       max_new_tokens=min(REFERENCE_FRAMES, self.config.max_new_tokens))
        chunks: list[np.ndarray] = []
        rate = self.model_voices().sample_rate
        async with job:
            async for out in job.audio():
                chunks.append(np.asarray(out.samples, dtype=np.float32).reshape(-1))
                rate = out.sample_rate
        return (np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)), rate


@dataclass
class SpeechActivity:
    """What the live-sessions registry reads of a running job (live_sessions.py `SessionProtocol`)."""

    session_id: str
    usage: SessionUsage = field(default_factory=SessionUsage)  # its own sums; the /metrics counters are realtime's
    last_activity_at: float = field(default_factory=time.time)


@dataclass(eq=False)
class SpeechJob:
    """One speech request on the graph. Use as `async with job: async for chunk in job.audio()`."""

    service: SpeechService
    text: str
    voice: str
    instructions: str | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    id: str = field(default_factory=lambda: f"speech_{uuid.uuid4().hex[:24]}")
    transport: str = "http"  # how its client reached it: `http`, or `websocket` (/v1/audio/speech/stream)
    usage: Usage | None = None
    status: str | None = None
    finished: bool = False
    closed: bool = False
    protocol: SpeechActivity | None = None  # set while the job is listed with the live sessions
    _session: Any = None
    _opened_at: float = 0.0
    _ended_by: str | None = None  # the reason an operator gave (admin API)

    async def __aenter__(self) -> SpeechJob:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close("completed" if self.finished else "client_disconnected")

    async def open(self) -> None:
        """Open the graph session and send the turn. Raises SessionRejected when full."""
        self._opened_at = time.perf_counter()
        self._session = await self.service.runtime.open_session(self.id, kind="speech", config={"voice": self.voice},
                                                                inputs=(SPEECH_INPUT,))
        self.service.active_jobs.add(self)
        if self.service.sessions is not None:
            self.protocol = SpeechActivity(self.id)
            self.service.sessions.add(self, "speech", self.transport)
        sampling = {"seed": self.seed} if self.seed is not None else {}
        turn = Turn(
            turn_id=0,
            item_id=self.id,
            role="assistant",
            text=self.text,
            speak=True,
            instructions=self.instructions,
            reply=ReplyParams(response_id=self.id, voice=self.voice, max_output_tokens=self.max_new_tokens, sampling=sampling),
        )
        try:
            await self._session.send(SPEECH_INPUT, turn)
        except BaseException:
            await self.close("failed")
            raise

    async def audio(self) -> AsyncIterator[AudioOut]:
        """The reply's audio chunks in order; ends after the TurnDone, raises SpeechFailed."""
        session = self._session
        first = True
        async for message in session.outputs():
            if isinstance(message, AudioOut):
                if first and self.service.metrics is not None:
                    self.service.metrics.first_audio("speech", time.perf_counter() - self._opened_at)
                first = False
                if self.protocol is not None:
                    self.protocol.usage.audio_out(len(message.samples) / message.sample_rate)
                yield message
            elif isinstance(message, TurnDone):
                self.usage, self.status = message.usage, message.status
                if self.protocol is not None and message.usage is not None:
                    self.protocol.usage.reply_done(message.usage)
                if message.status not in ("completed", "incomplete"):
                    raise SpeechFailed("speech_failed", f"speech generation {message.status}: {message.reason or 'no reason given'}")
                self.finished = True
                return
        if self._ended_by is not None:
            raise SpeechFailed(self._ended_by, "An operator ended this speech request (admin API).")
        code, text = session.error or ("speech_failed", f"the speech session ended early ({session.end_reason})")
        raise SpeechFailed(code, text)

    async def close(self, reason: str) -> None:
        """Close the graph session (idempotent). Shielded: a cancelled caller still frees it."""
        self.closed = True
        self.service.active_jobs.discard(self)
        if self._session is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._session.close(reason))
        if self.service.sessions is not None:
            self.service.sessions.forget(self)

    # The live-sessions registry's view (session_server/live_sessions.py `SessionHost`).
    @property
    def graph(self) -> Any:
        return self._session

    def parked_at(self) -> float | None:
        return None

    def end(self, reason: str) -> None:
        """An operator ends the request: its graph session closes, its client gets error `reason`."""
        self._ended_by = reason
        if self._session is not None:
            spawn(self._session.close(reason), name=f"{self.id}:end")


def usage_body(usage: Usage | None) -> dict[str, Any]:
    """The speech usage object (same on `speech.audio.done` and in batch results)."""
    usage = usage or Usage()
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_token_details": {"text_tokens": usage.input_text_tokens, "audio_tokens": usage.input_audio_tokens},
    }


def _read_model_voices(runtime: GraphRuntime, config: SpeechConfig) -> ModelVoices:
    resource = None
    if config.resource is not None:
        resource = runtime.resources.get(config.resource)
    if resource is None:
        resource = next((r for r in runtime.resources.values() if getattr(r, "speakers", None)), None)
    speakers = tuple(getattr(resource, "speakers", None) or ()) if resource is not None else ()
    if not speakers:
        # A transformers omni checkpoint names its speakers in talker_config.speaker_id.
        for candidate in ([resource] if resource is not None else list(runtime.resources.values())):
            talker_config = getattr(getattr(candidate, "config", None), "talker_config", None)
            speaker_ids = getattr(talker_config, "speaker_id", None)
            if speaker_ids:
                resource, speakers = candidate, tuple(name.lower() for name in speaker_ids)
                break
    if not speakers:
        speakers = tuple(config.voices)
        default = speakers[0]
    else:
        default = getattr(resource, "default_speaker", None) or speakers[0]
    rate = int(getattr(resource, "output_sample_rate", 0) or DEFAULT_SAMPLE_RATE)
    return ModelVoices(tuple(speakers), default, rate)


__all__ = ["SessionRejected", "SpeechConfig", "SpeechFailed", "SpeechJob", "SpeechService", "usage_body"]
