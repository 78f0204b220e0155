"""The effective session configuration: defaults, `session.update` patches, the wire form.

`apply_update` validates a whole patch before changing anything, so a rejected `session.update`
leaves the session exactly as it was. What the server does with each field:

- `instructions`: the system prompt. It reaches the model with the first turn; once a turn has
  been processed it cannot change (error `instructions_locked`, as in the sglang-omni profile).
- `output_modalities`: `["audio"]` (spoken reply with transcript) or `["text"]`.
- `max_output_tokens`: thinker tokens per reply (`"inf"` = the server's cap).
- `audio.input.format`: `audio/pcm` 24000 or 16000, `audio/pcmu`, `audio/pcma` (8 kHz).
- `audio.input.turn_detection`: `server_vad` (threshold 0.5, prefix 300 ms, silence 500 ms),
  `semantic_vad` (served as server VAD with a silence window from `eagerness`), or `null`.
- `audio.output.voice`: only until the session has produced audio (error `voice_locked`).
- `audio.output.format`: as the input formats (output is resampled from 24 kHz when needed).
- `sglang`: sampling (temperature, top_p, top_k, talker_*...), applied from the next reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from msgspec import UNSET

from session_server.realtime.audio_formats import AudioFormat, UnsupportedFormat, parse_format
from session_server.realtime.events import (
    AudioFormatParam,
    RealtimeError,
    ResponseParam,
    SamplingParam,
    SessionParam,
    TurnDetectionParam,
)

# semantic_vad is served by the same silero VAD; eagerness picks how long a pause ends a turn.
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 700, "auto": 700, "high": 300}


@dataclass(frozen=True)
class TurnDetection:
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    idle_timeout_ms: int | None = None
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None  # semantic_vad only

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "type": self.type,
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "idle_timeout_ms": self.idle_timeout_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }
        if self.type == "semantic_vad":
            # Say how it is served: by server VAD with the eagerness-derived silence window.
            wire["eagerness"] = self.eagerness
            wire["sglang"] = {"served_as": "server_vad", "silence_duration_ms": self.silence_duration_ms}
        return wire

    def to_graph(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "idle_timeout_ms": self.idle_timeout_ms,
            "create_response": self.create_response,
        }


@dataclass(frozen=True)
class SessionConfig:
    model: str
    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    max_output_tokens: int | None = None  # None = "inf"
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    turn_detection: TurnDetection | None = TurnDetection()
    voice: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)

    def to_wire(self, session_id: str) -> dict[str, Any]:
        """The full effective session, as `session.created` / `session.updated` carry it."""
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "tools": [],
            "tool_choice": "auto",
            "tracing": None,
            "truncation": "disabled",
            "prompt": None,
            "include": None,
            "expires_at": 0,
            "audio": {
                "input": {
                    "format": self.input_format.to_wire(),
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": None if self.turn_detection is None else self.turn_detection.to_wire(),
                },
                "output": {"format": self.output_format.to_wire(), "voice": self.voice, "speed": 1.0},
            },
            "sglang": dict(self.sampling),
        }

    def to_graph(self) -> dict[str, Any]:
        """What nodes read from `SessionInfo.config` and `configure` commands."""
        return {
            "turn_detection": None if self.turn_detection is None else self.turn_detection.to_graph(),
            "instructions": self.instructions,
            "voice": self.voice,
            "sampling": dict(self.sampling),
        }


def _format(value: AudioFormatParam | str, param: str) -> AudioFormat:
    try:
        return parse_format(value if isinstance(value, str) else {"type": value.type, "rate": value.rate})
    except UnsupportedFormat as exc:
        raise RealtimeError("unsupported_audio_format", str(exc), param) from None


def _turn_detection(value: TurnDetectionParam | None, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if value is None:
        return None
    base = current if current is not None and current.type == value.type else TurnDetection(type=value.type)
    changes = {
        name: getattr(value, name)
        for name in ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms", "create_response", "interrupt_response")
        if getattr(value, name) is not None
    }
    if value.type == "semantic_vad":
        eagerness = value.eagerness or base.eagerness or "auto"
        changes.update(eagerness=eagerness, silence_duration_ms=SEMANTIC_SILENCE_MS[eagerness])
    detection = replace(base, **changes)
    if not 0.0 <= detection.threshold <= 1.0:
        raise RealtimeError("invalid_value", "threshold must be between 0.0 and 1.0.", f"{param}.threshold")
    for name in ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
        number = getattr(detection, name)
        if number is not None and not 0 <= number <= 60_000:
            raise RealtimeError("invalid_value", f"{name} must be between 0 and 60000.", f"{param}.{name}")
    return detection


def _max_tokens(value: int | str, param: str) -> int | None:
    if value == "inf":
        return None
    assert isinstance(value, int)
    if not 1 <= value <= 4096:
        raise RealtimeError("invalid_value", "max_output_tokens must be between 1 and 4096, or \"inf\".", param)
    return value


def _voice(value: Any) -> str:
    return value if isinstance(value, str) else value.id


def _sampling(value: SamplingParam, current: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current)
    merged.update(msgspec.structs.asdict(value))
    return {key: number for key, number in merged.items() if number is not None}


def apply_update(config: SessionConfig, patch: SessionParam, *, turns_processed: bool, audio_produced: bool) -> SessionConfig:
    """A new config with `patch` applied, or `RealtimeError` and nothing changed."""
    changes: dict[str, Any] = {}
    if patch.type is not UNSET and patch.type != "realtime":
        raise RealtimeError("unsupported", f"Session type {patch.type!r} is not served; use \"realtime\".", "session.type")
    if patch.tools is not UNSET and patch.tools:
        raise RealtimeError("unsupported", "Function tools are not supported by this server yet.", "session.tools")
    if patch.instructions is not UNSET and patch.instructions != config.instructions:
        if turns_processed:
            raise RealtimeError(
                "instructions_locked",
                "instructions cannot change after the first turn was processed; open a new session instead.",
                "session.instructions",
            )
        changes["instructions"] = patch.instructions
    modalities = patch.output_modalities if patch.output_modalities is not UNSET else patch.modalities
    if modalities is not UNSET:
        changes["output_modalities"] = _modalities(modalities, "session.output_modalities")
    max_tokens = patch.max_output_tokens if patch.max_output_tokens is not UNSET else patch.max_response_output_tokens
    if max_tokens is not UNSET:
        changes["max_output_tokens"] = _max_tokens(max_tokens, "session.max_output_tokens")

    audio_in = patch.audio.input if patch.audio is not UNSET else UNSET
    audio_out = patch.audio.output if patch.audio is not UNSET else UNSET
    input_format = audio_in.format if audio_in is not UNSET else UNSET
    if input_format is UNSET and patch.input_audio_format is not UNSET:
        input_format = patch.input_audio_format
    if input_format is not UNSET:
        changes["input_format"] = _format(input_format, "session.audio.input.format")
    output_format = audio_out.format if audio_out is not UNSET else UNSET
    if output_format is UNSET and patch.output_audio_format is not UNSET:
        output_format = patch.output_audio_format
    if output_format is not UNSET:
        changes["output_format"] = _format(output_format, "session.audio.output.format")
    detection = audio_in.turn_detection if audio_in is not UNSET else UNSET
    if detection is UNSET and patch.turn_detection is not UNSET:
        detection = patch.turn_detection
    if detection is not UNSET:
        changes["turn_detection"] = _turn_detection(detection, config.turn_detection, "session.audio.input.turn_detection")
    voice = audio_out.voice if audio_out is not UNSET else UNSET
    if voice is UNSET and patch.voice is not UNSET:
        voice = patch.voice
    if voice is not UNSET and _voice(voice) != config.voice:
        if audio_produced:
            raise RealtimeError("voice_locked", "voice cannot change once the session has produced audio.", "session.audio.output.voice")
        changes["voice"] = _voice(voice)
    sampling = config.sampling
    if patch.sglang is not UNSET:
        sampling = _sampling(patch.sglang, sampling)
    if patch.temperature is not UNSET:
        sampling = {**sampling, "temperature": patch.temperature}
    if sampling is not config.sampling:
        changes["sampling"] = sampling
    return replace(config, **changes)


def _modalities(value: list[str], param: str) -> tuple[str, ...]:
    if "audio" in value:
        return ("audio",)  # a spoken reply always carries its transcript
    if value == ["text"]:
        return ("text",)
    raise RealtimeError("invalid_value", "output_modalities must be [\"audio\"] or [\"text\"].", param)


@dataclass(frozen=True)
class ResponseSettings:
    """What one response looks like: the session's defaults overridden by `response.create`."""

    output_modalities: tuple[str, ...]
    instructions: str | None
    max_output_tokens: int | None
    voice: str | None
    output_format: AudioFormat
    out_of_band: bool = False
    metadata: dict[str, str] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


def response_settings(config: SessionConfig, params: ResponseParam | None) -> ResponseSettings:
    settings = ResponseSettings(
        output_modalities=config.output_modalities,
        instructions=None,
        max_output_tokens=config.max_output_tokens,
        voice=config.voice,
        output_format=config.output_format,
        sampling=dict(config.sampling),
    )
    if params is None:
        return settings
    changes: dict[str, Any] = {}
    if params.input is not UNSET:
        raise RealtimeError("unsupported", "response.input is not supported yet; the response uses the conversation.", "response.input")
    modalities = params.output_modalities if params.output_modalities is not UNSET else params.modalities
    if modalities is not UNSET:
        changes["output_modalities"] = _modalities(modalities, "response.output_modalities")
    if params.instructions is not UNSET:
        changes["instructions"] = params.instructions
    max_tokens = params.max_output_tokens if params.max_output_tokens is not UNSET else params.max_response_output_tokens
    if max_tokens is not UNSET:
        changes["max_output_tokens"] = _max_tokens(max_tokens, "response.max_output_tokens")
    if params.conversation is not UNSET:
        if params.conversation not in ("auto", "none"):
            raise RealtimeError("invalid_value", "response.conversation must be \"auto\" or \"none\".", "response.conversation")
        changes["out_of_band"] = params.conversation == "none"
    if params.metadata is not UNSET:
        changes["metadata"] = params.metadata
    audio_out = params.audio.output if params.audio is not UNSET else UNSET
    if audio_out is not UNSET and audio_out.format is not UNSET:
        changes["output_format"] = _format(audio_out.format, "response.audio.output.format")
    voice = audio_out.voice if audio_out is not UNSET else UNSET
    if voice is UNSET and params.voice is not UNSET:
        voice = params.voice
    if voice is not UNSET:
        changes["voice"] = _voice(voice)
    sampling = settings.sampling
    if params.sglang is not UNSET:
        sampling = _sampling(params.sglang, sampling)
    if params.temperature is not UNSET:
        sampling = {**sampling, "temperature": params.temperature}
    changes["sampling"] = sampling
    return replace(settings, **changes)
