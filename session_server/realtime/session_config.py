"""The effective session configuration: defaults, `session.update` patches, the wire form.

`apply_update` validates a whole patch before changing anything, so a rejected `session.update`
leaves the session exactly as it was. What the server does with each field:

- `instructions`: the system prompt. It may change at any time and applies from the next turn:
  the new system prompt replaces the old one at the start of the model's history, whose KV is
  rebuilt from there (nodes/qwen3_omni/thinker_history.py).
- `output_modalities`: `["audio"]` (spoken reply with transcript) or `["text"]`.
- `max_output_tokens`: thinker tokens per reply; the echo is the bound in force (never above the
  profile's cap, `ServedModel.max_output_tokens`; `"inf"` = the cap).
- `tools` (function tools, JSON-schema `parameters` checked to be constrainable), `tool_choice`,
  `parallel_tool_calls`: the session's defaults for replies; `response.create` may override them.
  A forced `tool_choice` (`required`, a named function) is accepted before its tools, as clients
  send it (pipecat, LiveKit: the choice in one update, the tools in a later one); it is checked
  when a reply starts (`ResponseSettings.tool_choice_unmet`), and a reply it cannot be followed
  for fails with `tool_choice_unmet`.
- `audio.input.format`: `audio/pcm` 24000 or 16000, `audio/pcmu`, `audio/pcma` (8 kHz).
- `audio.input.turn_detection`: `server_vad` (threshold 0.5, prefix 300 ms, silence 500 ms),
  `semantic_vad` (the Smart Turn v3.2 classifier decides at each pause of 200 ms; `eagerness`
  sets the longest pause before a commit anyway; refused with `semantic_vad_unavailable` without
  the `smart-turn` extra), or `null`. Extensions under `turn_detection.sglang`:
  `interrupt_min_speech_ms` (250: a shorter sound during a reply is not a turn nor a barge-in),
  and for `server_vad` `semantic_end_of_turn` (the classifier checks at the silence window) with
  `max_silence_ms` (3000).
- `audio.output.voice`: only until the session has produced audio (error `voice_locked`); the
  echo names the speaker that really speaks (`ServedModel.voice`: an unknown name such as `alloy`
  is echoed as the default speaker). An uploaded voice (`POST /v1/audio/voices`, read from the
  registry, which replicas may share) is echoed by its own name and spoken by the built-in
  speaker it was matched to at upload (`SessionConfig.voice_speaker`, resolved once when it is
  set); one stored without a match gets `voice_not_matched`.
- `audio.output.format`: as the input formats (output is resampled from 24 kHz when needed).
- `sglang`: sampling (temperature, top_p, top_k, talker_*...), applied from the next reply.
- `audio.input.transcription` {model, language, prompt}: transcripts of committed user audio,
  made by the session's own model (`model` is echoed as given, `session.sglang.transcription.
  served_by` says which model served it); `null` turns them off.
- `truncation`: `"auto"` (the default, as GA's: when the next turn and its reply would not fit
  the model's context, the oldest items leave the model's context), `"disabled"` (such a turn
  fails with `context_exhausted`), or `{"type": "retention_ratio", "retention_ratio": r,
  "token_limits": {"post_instructions": n}}` (past n tokens after the instructions, or the
  context, the oldest items leave until r of it is used). Items that leave stay in the client's
  conversation; the policy is nodes/qwen3_omni/truncation.py, docs/realtime.md says more.
- `type`: `realtime`, or `transcription` (transcripts only, no replies; the wire form is the GA
  transcription session's). It may change only until the first turn (`session_type_locked`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from msgspec import UNSET

from graph.messages import Truncation

from session_server.realtime.audio_formats import (
    AudioFormat,
    UnsupportedFormat,
    parse_format,
)
from session_server.realtime.events import (
    AudioFormatParam,
    RealtimeError,
    ResponseParam,
    SamplingParam,
    SessionParam,
    ToolChoiceParam,
    ToolParam,
    TranscriptionParam,
    TruncationRetentionRatioParam,
    TurnDetectionParam,
)
from session_server.realtime.input_bounds import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_TEXT_TOKENS,
)
from session_server.realtime.sglang_session import sampling_values

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ServedModel:
    """What the loaded graph serves, as far as a session's config is concerned."""

    model: str
    max_output_tokens: int | None = None  # the profile's per-reply cap (None: none known)
    speakers: tuple[str, ...] = ()  # the checkpoint's voices (empty: any voice is taken as given)
    default_speaker: str | None = None
    voice_aliases: dict[str, str] = field(default_factory=dict)  # e.g. {"alloy": "ethan"} (talker `voices`)
    # name -> the built-in speaker an uploaded voice speaks with, None when it is no uploaded voice;
    # raises RealtimeError for one that cannot speak here (session_server/realtime/served.py).
    uploaded_speaker: Callable[[str], str | None] | None = field(default=None, compare=False)
    max_text_tokens: int = DEFAULT_MAX_TEXT_TOKENS  # the profile's `limits` (realtime/input_bounds.py)
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_conversation_items: int = 1024  # the profile's `limits` (graph/limits.py)

    def voice(self, requested: str | None) -> str | None:
        """The speaker that will really speak for `requested` (the talker's own rule)."""
        if not self.speakers:
            return requested
        if requested:
            name = self.voice_aliases.get(requested.lower(), requested.lower())
            if name in self.speakers:
                return name
        return self.default_speaker or self.speakers[0]

    def uploaded(self, requested: str) -> str | None:
        """The built-in speaker of the uploaded voice `requested`; None for any other name."""
        if not self.may_be_uploaded(requested):
            return None
        assert self.uploaded_speaker is not None
        return self.uploaded_speaker(requested)

    def may_be_uploaded(self, requested: str) -> bool:
        """Whether `uploaded` reads the voice registry for `requested` (not a built-in or alias)."""
        lowered = requested.lower()
        return self.uploaded_speaker is not None and lowered not in self.speakers and lowered not in self.voice_aliases

    def reply_tokens(self, requested: int | None) -> int | None:
        """The reply token bound in force: the client's, never above the profile's cap."""
        if self.max_output_tokens is None:
            return requested
        return self.max_output_tokens if requested is None else min(requested, self.max_output_tokens)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_wire(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters}


SESSION_TYPES = ("realtime", "transcription")
# A transcription prompt goes through the model with every transcript: bounded like an instruction.
MAX_TRANSCRIPTION_PROMPT_CHARS = 4096
LANGUAGE_CODE = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$")  # ISO-639-1 (or -3), optional region


@dataclass(frozen=True)
class Transcription:
    """`audio.input.transcription`: the session's own model transcribes; `model` is only echoed."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt}

    def to_graph(self, keep_in_history: bool) -> dict[str, Any]:
        # keep_in_history False (transcription sessions): the utterance leaves the model's context
        # with its transcript, so a long transcription session never fills it.
        return {"language": self.language, "prompt": self.prompt, "keep_in_history": keep_in_history}


# semantic_vad: the classifier decides at a pause of SEMANTIC_CHECK_MS; eagerness sets the longest
# pause before a commit anyway (GA's maximum timeouts: low 8 s, medium 4 s, high 2 s).
SEMANTIC_MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}
SEMANTIC_CHECK_MS = 200  # scores on shorter pauses are unreliable
SERVER_VAD_MAX_SILENCE_MS = 3000  # server_vad with semantic_end_of_turn: pipecat's stop_secs
END_OF_TURN_MODEL = "smart-turn-v3.2"


@functools.cache
def smart_turn_installed() -> bool:
    """Whether the `smart-turn` extra is installed: nodes/smart_turn.py loads the model from the
    `pipecat-ai` wheel (this process never imports nodes)."""
    try:
        importlib.metadata.distribution("pipecat-ai")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


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
    interrupt_min_speech_ms: int = 250
    semantic_end_of_turn: bool = False  # server_vad only (semantic_vad always is)
    max_silence_ms: int | None = None  # None: from eagerness (semantic_vad) or 3000 (server_vad)

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad" or self.semantic_end_of_turn

    @property
    def longest_pause_ms(self) -> int:
        if self.max_silence_ms is not None:
            return self.max_silence_ms
        if self.type == "semantic_vad":
            return SEMANTIC_MAX_SILENCE_MS[self.eagerness or "auto"]
        return SERVER_VAD_MAX_SILENCE_MS

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
        extension: dict[str, Any] = {"interrupt_min_speech_ms": self.interrupt_min_speech_ms}
        if self.type == "semantic_vad":
            del wire["silence_duration_ms"]  # pauses are judged by the classifier, not a window
            wire["eagerness"] = self.eagerness
        else:
            extension["semantic_end_of_turn"] = self.semantic_end_of_turn
        if self.semantic:
            extension.update(end_of_turn_model=END_OF_TURN_MODEL, max_silence_ms=self.longest_pause_ms)
        wire["sglang"] = extension
        return wire

    def to_graph(self) -> dict[str, Any]:
        semantic = None
        if self.semantic:
            check_after = SEMANTIC_CHECK_MS if self.type == "semantic_vad" else self.silence_duration_ms
            semantic = {"check_after_ms": check_after, "max_silence_ms": self.longest_pause_ms}
        return {
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "idle_timeout_ms": self.idle_timeout_ms,
            "create_response": self.create_response,
            "interrupt_min_speech_ms": self.interrupt_min_speech_ms,
            "semantic": semantic,
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
    # The built-in speaker of `voice` when it names an uploaded voice (None otherwise); kept in
    # snapshots, so a session rebuilt on another replica speaks as it did.
    voice_speaker: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    tools: tuple[Tool, ...] = ()
    tool_choice: str | dict[str, str] = "auto"  # auto | none | required | {"type": "function", "name"}
    parallel_tool_calls: bool = True
    served: ServedModel | None = None
    type: str = "realtime"  # or "transcription": transcripts only, no replies
    transcription: Transcription | None = None
    truncation: Truncation = field(default_factory=Truncation)

    def to_wire(self, session_id: str) -> dict[str, Any]:
        """The full effective session, as `session.created` / `session.updated` carry it."""
        if self.type == "transcription":
            return self._transcription_session_wire(session_id)
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "max_output_tokens": _tokens_wire(self.served.reply_tokens(self.max_output_tokens) if self.served else self.max_output_tokens),
            "tools": [tool.to_wire() for tool in self.tools],
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "tracing": None,
            "truncation": truncation_wire(self.truncation),
            "prompt": None,
            "include": None,
            "expires_at": 0,
            "audio": {
                "input": {
                    "format": self.input_format.to_wire(),
                    "transcription": self._transcription_wire(),
                    "noise_reduction": None,
                    "turn_detection": None if self.turn_detection is None else self.turn_detection.to_wire(),
                },
                "output": {"format": self.output_format.to_wire(), "voice": self.echoed_voice, "speed": 1.0},
            },
            "sglang": {**self.sampling, **self._served_wire()},
        }

    @property
    def spoken_voice(self) -> str | None:
        """The built-in speaker that speaks."""
        if self.voice_speaker is not None:
            return self.voice_speaker
        return self.served.voice(self.voice) if self.served else self.voice

    @property
    def echoed_voice(self) -> str | None:
        """What `session.updated` names: an uploaded voice by its name, else the speaker that speaks."""
        return self.voice if self.voice_speaker is not None else self.spoken_voice

    def to_graph(self) -> dict[str, Any]:
        """What nodes read from `SessionInfo.config` and `configure` commands."""
        return {
            "turn_detection": None if self.turn_detection is None else self.turn_detection.to_graph(),
            "instructions": self.instructions,
            "voice": self.voice_speaker or self.voice,
            "sampling": dict(self.sampling),
            "tools": [tool.to_wire() for tool in self.tools],
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "truncation": msgspec.to_builtins(self.truncation),
            **self._transcription_graph(),
        }

    # ------------------------------------------------------------------ transcription

    def _transcription_wire(self) -> dict[str, Any] | None:
        if self.transcription is None:
            return None
        return self.transcription.to_wire()

    def _served_wire(self) -> dict[str, Any]:
        """Which model serves the transcripts, under `session.sglang`: not inside the GA
        transcription object, which strict clients parse field by field (pipecat)."""
        served_by = self.served.model if self.served is not None and self.served.model else self.model  # not an alias
        return {"transcription": {"served_by": served_by}} if self.transcription is not None else {}

    def _transcription_session_wire(self, session_id: str) -> dict[str, Any]:
        """A `transcription` session as GA shows one: input audio only, nothing about replies."""
        detection = None
        if self.turn_detection is not None:
            detection = {key: value for key, value in self.turn_detection.to_wire().items()
                         if key not in ("create_response", "interrupt_response")}
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "expires_at": 0,
            "include": None,
            "sglang": self._served_wire(),
            "audio": {
                "input": {
                    "format": self.input_format.to_wire(),
                    "transcription": self._transcription_wire(),
                    "noise_reduction": None,
                    "turn_detection": detection,
                },
            },
        }

    def _transcription_graph(self) -> dict[str, Any]:
        """`transcription` for the dialog (it marks committed turns for a transcript); a
        transcription session never answers, so its turns are not awaited by a reply either."""
        graph: dict[str, Any] = {
            "transcription": None if self.transcription is None else self.transcription.to_graph(
                keep_in_history=self.type == "realtime"),
        }
        if self.type == "transcription" and self.turn_detection is not None:
            graph["turn_detection"] = {**self.turn_detection.to_graph(), "create_response": False}
        return graph


def truncation_wire(mode: Truncation) -> str | dict[str, Any]:
    """The GA wire form of a truncation mode (`RealtimeTruncation`)."""
    if mode.type != "retention_ratio":
        return mode.type
    limits = {"post_instructions": mode.post_instructions} if mode.post_instructions is not None else None
    return {"type": "retention_ratio", "retention_ratio": mode.retention_ratio, "token_limits": limits}


def _truncation(value: str | TruncationRetentionRatioParam, param: str) -> Truncation:
    if isinstance(value, str):
        return Truncation(type=value)
    if not 0.0 <= value.retention_ratio <= 1.0:
        raise RealtimeError("invalid_value", "retention_ratio must be between 0.0 and 1.0.", f"{param}.retention_ratio")
    limit = value.token_limits.post_instructions if value.token_limits is not None else None
    if limit is not None and limit <= 0:
        raise RealtimeError("invalid_value", "token_limits.post_instructions must be a positive integer.",
                            f"{param}.token_limits.post_instructions")
    return Truncation(type="retention_ratio", retention_ratio=float(value.retention_ratio), post_instructions=limit)


def _tokens_wire(value: int | None) -> int | str:
    return "inf" if value is None else value


def _format(value: AudioFormatParam | str, param: str) -> AudioFormat:
    try:
        return parse_format(value if isinstance(value, str) else {"type": value.type, "rate": value.rate, "channels": value.channels})
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
        changes["eagerness"] = value.eagerness or base.eagerness or "auto"
    extension = value.sglang
    if extension is not None:
        changes.update({name: getattr(extension, name) for name in ("interrupt_min_speech_ms", "semantic_end_of_turn", "max_silence_ms")
                        if getattr(extension, name) is not None})
        if value.type == "semantic_vad" and extension.semantic_end_of_turn is False:
            raise RealtimeError("invalid_value", "semantic_vad always checks the end of turn; use server_vad for silence timing alone.",
                                f"{param}.sglang.semantic_end_of_turn")
    detection = replace(base, **changes)
    if not 0.0 <= detection.threshold <= 1.0:
        raise RealtimeError("invalid_value", "threshold must be between 0.0 and 1.0.", f"{param}.threshold")
    for name in ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms", "max_silence_ms"):
        number = getattr(detection, name)
        if number is not None and not 0 <= number <= 60_000:
            raise RealtimeError("invalid_value", f"{name} must be between 0 and 60000.", f"{param}.{name}")
    if not 0 <= detection.interrupt_min_speech_ms <= 5000:
        raise RealtimeError("invalid_value", "interrupt_min_speech_ms must be between 0 and 5000.", f"{param}.sglang.interrupt_min_speech_ms")
    if detection.semantic and not smart_turn_installed():
        raise RealtimeError(
            "semantic_vad_unavailable",
            "Semantic end-of-turn needs the Smart Turn model, which this server does not have: install it with the "
            "`smart-turn` extra (pip install 'sgl-omni-server[smart-turn]').",
            f"{param}.type" if detection.type == "semantic_vad" else f"{param}.sglang.semantic_end_of_turn",
        )
    return detection


def _max_tokens(value: int | str, param: str) -> int | None:
    if value == "inf":
        return None
    assert isinstance(value, int)
    if not 1 <= value <= 4096:
        raise RealtimeError("invalid_value", "max_output_tokens must be between 1 and 4096, or \"inf\".", param)
    return value


def _tools(value: list[ToolParam], param: str) -> tuple[Tool, ...]:
    tools: list[Tool] = []
    for index, tool in enumerate(value):
        at = f"{param}[{index}]"
        if tool.type != "function":
            raise RealtimeError("unsupported", f"Tools of type {tool.type!r} are not served; use \"function\" tools.", f"{at}.type")
        if tool.name is None:
            raise RealtimeError("missing_required_parameter", "A function tool needs a `name`.", f"{at}.name")
        if not TOOL_NAME.match(tool.name):
            raise RealtimeError("invalid_value", "A tool name is 1-64 characters of a-z, A-Z, 0-9, _ and -.", f"{at}.name")
        if any(t.name == tool.name for t in tools):
            raise RealtimeError("invalid_value", f"Two tools are named {tool.name!r}.", f"{at}.name")
        parameters = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        _check_schema(parameters, f"{at}.parameters")
        tools.append(Tool(tool.name, tool.description or "", parameters))
    return tuple(tools)


def _check_schema(schema: dict[str, Any], param: str) -> None:
    """The arguments' JSON schema must describe an object, and one that calls can be constrained to
    (the thinker decodes arguments under it: a schema it cannot compile would fail mid-reply)."""
    import xgrammar

    if schema.get("type", "object") != "object":
        raise RealtimeError("invalid_value", "A function's `parameters` must be a JSON schema of type \"object\".", param)
    try:
        xgrammar.Grammar.from_json_schema(json.dumps(schema))
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with the reason
        raise RealtimeError("invalid_value", f"`parameters` is not a JSON schema this server can follow: {exc}", param) from None


def _tool_choice(value: str | ToolChoiceParam, param: str) -> str | dict[str, str]:
    if isinstance(value, str):
        return value
    if value.type != "function":
        raise RealtimeError("unsupported", f"tool_choice of type {value.type!r} is not served; name a function.", f"{param}.type")
    if not value.name:
        raise RealtimeError("missing_required_parameter", "tool_choice {type: \"function\"} needs a `name`.", f"{param}.name")
    return {"type": "function", "name": value.name}


def _unmet_tool_choice(choice: str | dict[str, str], tools: tuple[Tool, ...], param: str) -> tuple[str, str] | None:
    """Why a reply cannot follow `choice` with these tools (message, param), or None when it can."""
    if isinstance(choice, dict) and not any(tool.name == choice["name"] for tool in tools):
        return f"tool_choice names {choice['name']!r}, which is not one of the tools.", f"{param}.name"
    if choice == "required" and not tools:
        return "tool_choice \"required\" needs at least one tool; there is none.", param
    return None


def _voice(value: Any) -> str:
    return value if isinstance(value, str) else value.id


def _uploaded_speaker(served: ServedModel | None, voice: str, param: str) -> str | None:
    """The built-in speaker of `voice` when it names an uploaded voice (see `ServedModel.uploaded`)."""
    if served is None:
        return None
    try:
        return served.uploaded(voice)
    except RealtimeError as error:
        raise RealtimeError(error.code, error.message, param) from None


# What the samplers compute with these values: logits / temperature, and logits * or / the
# repetition penalty. Bounded to [0.01, 100] (temperature 0 is greedy: no division), a logit is
# scaled at most 100x and stays finite in fp32/bf16, so softmax never meets inf or nan. Applied
# to the merged values, whichever name each came under (GA/beta `temperature`, `sglang.*`).
SAMPLER_SCALE_RANGE = (0.01, 100.0)
_SCALED = ("temperature", "talker_temperature", "repetition_penalty", "talker_repetition_penalty")


def check_sampling(sampling: dict[str, Any], at: str) -> dict[str, Any]:
    low, high = SAMPLER_SCALE_RANGE
    for name in _SCALED:
        value = sampling.get(name)
        if value is None or (name == "temperature" and value == 0):
            continue
        if not low <= value <= high:  # also false for nan
            param = f"{at}.temperature" if name == "temperature" else f"{at}.sglang.{name}"
            allowed = "0 (greedy) or " if name == "temperature" else ""
            raise RealtimeError("invalid_value", f"{name} must be {allowed}between {low:g} and {high:g}, got {value!r}.", param)
    return sampling


def _sampling(value: SamplingParam, current: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current)
    merged.update(sampling_values(value))  # flat fields, and sglang-omni's nested `sampling`
    return {key: number for key, number in merged.items() if number is not None}


def _type_and_transcription(config: SessionConfig, patch: SessionParam, turns_processed: bool) -> dict[str, Any]:
    """`session.type` and `audio.input.transcription` (beta: `input_audio_transcription`) of a patch."""
    changes: dict[str, Any] = {}
    if patch.type is not UNSET and patch.type != config.type:
        if patch.type not in SESSION_TYPES:
            raise RealtimeError("unsupported", f"Session type {patch.type!r} is not served; use \"realtime\" or \"transcription\".", "session.type")
        if turns_processed:
            raise RealtimeError("session_type_locked", "The session type cannot change after the first turn; open a new session instead.", "session.type")
        changes["type"] = patch.type
    audio_in = patch.audio.input if patch.audio is not UNSET else UNSET
    value = audio_in.transcription if audio_in is not UNSET else UNSET
    param = "session.audio.input.transcription"
    if value is UNSET and patch.input_audio_transcription is not UNSET:
        value, param = patch.input_audio_transcription, "session.input_audio_transcription"
    if value is not UNSET:
        changes["transcription"] = _transcription(value, param)
    elif changes.get("type") == "transcription" and config.transcription is None:
        changes["transcription"] = Transcription()  # a transcription session transcribes unless told `null`
    return changes


def _transcription(value: TranscriptionParam | None, param: str) -> Transcription | None:
    if value is None:
        return None
    if value.language is not None and not LANGUAGE_CODE.match(value.language):
        raise RealtimeError("invalid_value", "language must be an ISO-639-1 code such as \"en\".", f"{param}.language")
    if value.prompt is not None and len(value.prompt) > MAX_TRANSCRIPTION_PROMPT_CHARS:
        raise RealtimeError("invalid_value", f"prompt may be at most {MAX_TRANSCRIPTION_PROMPT_CHARS} characters.", f"{param}.prompt")
    return Transcription(model=value.model, language=value.language, prompt=value.prompt or None)


def apply_update(config: SessionConfig, patch: SessionParam, *, turns_processed: bool, audio_produced: bool) -> SessionConfig:
    """A new config with `patch` applied, or `RealtimeError` and nothing changed."""
    changes: dict[str, Any] = {}
    changes.update(_type_and_transcription(config, patch, turns_processed))
    tools = _tools(patch.tools, "session.tools") if patch.tools is not UNSET else config.tools
    if tools is not config.tools:
        changes["tools"] = tools
    if patch.tool_choice is not UNSET:  # checked against the tools when a reply starts
        changes["tool_choice"] = _tool_choice(patch.tool_choice, "session.tool_choice")
    if patch.parallel_tool_calls is not UNSET:
        changes["parallel_tool_calls"] = patch.parallel_tool_calls
    if patch.truncation is not UNSET:
        changes["truncation"] = _truncation(patch.truncation, "session.truncation")
    if patch.instructions is not UNSET and patch.instructions != config.instructions:
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
        speaker = _uploaded_speaker(config.served, _voice(voice), "session.audio.output.voice")
        if audio_produced and replace(config, voice=_voice(voice), voice_speaker=speaker).spoken_voice != config.spoken_voice:
            raise RealtimeError("voice_locked", "voice cannot change once the session has produced audio.", "session.audio.output.voice")
        changes["voice"] = _voice(voice)
        changes["voice_speaker"] = speaker
    sampling = config.sampling
    if patch.sglang is not UNSET:
        sampling = _sampling(patch.sglang, sampling)
    if patch.temperature is not UNSET:
        sampling = {**sampling, "temperature": patch.temperature}
    if sampling is not config.sampling:
        changes["sampling"] = check_sampling(sampling, "session")
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
    # The built-in speaker of `voice` when it names an uploaded voice (what the graph is told).
    voice_speaker: str | None = None
    out_of_band: bool = False
    metadata: dict[str, str] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    tools: tuple[Tool, ...] = ()
    tool_choice: str | dict[str, str] = "auto"
    parallel_tool_calls: bool = True
    # Why this reply cannot follow its tool choice (message, param: where the choice was given),
    # or None. A session accepts a forced choice before its tools; the reply it fails on fails
    # alone, with `tool_choice_unmet` (protocol.py), and is never sent to the graph.
    tool_choice_unmet: tuple[str, str] | None = None
    truncation: Truncation = field(default_factory=Truncation)  # the session's (no per-response one)

    @property
    def forced_call(self) -> bool:
        """The reply is a function call from its first token (no spoken message)."""
        return bool(self.tools) and self.tool_choice != "auto" and self.tool_choice != "none"


def response_settings(config: SessionConfig, params: ResponseParam | None) -> ResponseSettings:
    settings = ResponseSettings(
        output_modalities=config.output_modalities,
        instructions=None,
        max_output_tokens=config.max_output_tokens,
        voice=config.voice,
        voice_speaker=config.voice_speaker,
        output_format=config.output_format,
        sampling=dict(config.sampling),
        tools=config.tools,
        tool_choice=config.tool_choice,
        parallel_tool_calls=config.parallel_tool_calls,
        truncation=config.truncation,
    )
    if params is None:
        unmet = _unmet_tool_choice(config.tool_choice, config.tools, "session.tool_choice")
        settings = replace(settings, tool_choice_unmet=unmet)
        return replace(settings, max_output_tokens=config.served.reply_tokens(settings.max_output_tokens)) if config.served else settings
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
        changes["voice_speaker"] = _uploaded_speaker(config.served, _voice(voice), "response.audio.output.voice")
    sampling = settings.sampling
    if params.sglang is not UNSET:
        sampling = _sampling(params.sglang, sampling)
    if params.temperature is not UNSET:
        sampling = {**sampling, "temperature": params.temperature}
    changes["sampling"] = check_sampling(sampling, "response") if sampling is not settings.sampling else sampling
    if config.served is not None:
        changes["max_output_tokens"] = config.served.reply_tokens(changes.get("max_output_tokens", settings.max_output_tokens))
    tools = _tools(params.tools, "response.tools") if params.tools is not UNSET else settings.tools
    changes["tools"] = tools
    choice = _tool_choice(params.tool_choice, "response.tool_choice") if params.tool_choice is not UNSET else settings.tool_choice
    if params.tools is not UNSET and params.tool_choice is UNSET and isinstance(choice, dict):
        choice = "auto"  # the session's named function may not be among this response's tools
    changes["tool_choice"] = choice
    source = "response.tool_choice" if params.tool_choice is not UNSET else "session.tool_choice"
    changes["tool_choice_unmet"] = _unmet_tool_choice(choice, tools, source)
    if params.parallel_tool_calls is not UNSET:
        changes["parallel_tool_calls"] = params.parallel_tool_calls
    return replace(settings, **changes)
