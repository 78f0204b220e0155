"""Client events of the realtime protocol: msgspec schemas and the one place they are validated.

Names and shapes follow the OpenAI Realtime GA API (the `openai` SDK's `types/realtime` are the
authority). Beta field names that clients still send are accepted and mapped onto GA ones in
`session_config.py` (`modalities`, `voice`, `input_audio_format`, `turn_detection`...).
Extensions for sglang-omni session clients live under `sglang`, in `sglang.*` events and in
`session.close` (their session protocol: sglang_session.py).

`parse_client_event(text)` returns a typed event or raises `RealtimeError` with the code,
message and `param` (a dotted path such as `session.audio.input.format.type`) a client can act on.
Unknown fields are ignored (forward compatibility); unknown event types are an error.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType


class RealtimeError(Exception):
    """An error event for the client. `fatal` errors end the session after the event is sent."""

    def __init__(
        self,
        code: str,
        message: str,
        param: str | None = None,
        *,
        type: str = "invalid_request_error",
        event_id: str | None = None,
        fatal: bool = False,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.type = type
        self.event_id = event_id
        self.fatal = fatal

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code, "message": self.message, "param": self.param, "event_id": self.event_id}


# --------------------------------------------------------------------------- shared pieces


class AudioFormatParam(msgspec.Struct, kw_only=True):
    # Validated in session_config (unsupported values get code `unsupported_audio_format`).
    type: str | None = None
    rate: int | None = None
    channels: int | None = None  # not OpenAI's; anything but 1 is refused (audio is mono)


class TurnDetectionExtensionParam(msgspec.Struct, kw_only=True):
    """`turn_detection.sglang`: this server's extensions (session_config.py)."""

    interrupt_min_speech_ms: int | None = None
    semantic_end_of_turn: bool | None = None  # server_vad: the Smart Turn check at the silence window
    max_silence_ms: int | None = None


class TurnDetectionParam(msgspec.Struct, kw_only=True):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    idle_timeout_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    sglang: TurnDetectionExtensionParam | None = None


class TranscriptionParam(msgspec.Struct, kw_only=True):
    """`audio.input.transcription`: transcripts of the user's committed audio (session_config.py).
    `model` is echoed as given; the session's own model transcribes."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInputParam(msgspec.Struct, kw_only=True):
    format: AudioFormatParam | str | UnsetType = UNSET
    turn_detection: TurnDetectionParam | None | UnsetType = UNSET
    transcription: TranscriptionParam | None | UnsetType = UNSET
    noise_reduction: Any = UNSET


class VoiceIdParam(msgspec.Struct, kw_only=True):
    id: str


class AudioOutputParam(msgspec.Struct, kw_only=True):
    format: AudioFormatParam | str | UnsetType = UNSET
    voice: str | VoiceIdParam | UnsetType = UNSET
    speed: float | UnsetType = UNSET


class AudioParam(msgspec.Struct, kw_only=True):
    input: AudioInputParam | UnsetType = UNSET
    output: AudioOutputParam | UnsetType = UNSET


class SamplingParam(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Sampling extensions (`session.sglang`), as the sglang-omni session profile names them."""

    # Ranges the samplers accept: refused here with `invalid_value`, not by the model mid-reply.
    temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None  # 0: greedy
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None  # 0: off
    min_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0)] | None = None
    seed: int | None = None
    talker_temperature: Annotated[float, msgspec.Meta(gt=0)] | None = None
    talker_top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    talker_top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    talker_repetition_penalty: Annotated[float, msgspec.Meta(gt=0)] | None = None
    talker_max_new_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None


class TimebaseParam(msgspec.Struct, kw_only=True):
    native_unit_ms: float | None = None
    microturn_ms: float | None = None


class SessionExtensionParam(SamplingParam, kw_only=True, omit_defaults=True):
    """`session.sglang`: this server's sampling fields, and the negotiation block of sglang-omni's
    native session protocol (`sglang_session.py` grants or rejects each of these)."""

    interaction: str | None = None
    tail_policy: str | None = None
    timebase: TimebaseParam | None = None
    sampling: dict[str, Any] | None = None
    reference_audio: Any = None
    tts_reference_audio: Any = None
    max_slice_nums: int | None = None


Modality = Literal["text", "audio"]


class ToolParam(msgspec.Struct, kw_only=True):
    """A tool (`session.tools`, `response.tools`). Only `function` tools are served; the rest of the
    checks (names, schemas) are in session_config.py."""

    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolChoiceParam(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceParam


class TokenLimitsParam(msgspec.Struct, kw_only=True):
    post_instructions: int | None = None


class TruncationRetentionRatioParam(msgspec.Struct, kw_only=True):
    type: Literal["retention_ratio"]
    retention_ratio: float
    token_limits: TokenLimitsParam | None = None


class SessionParam(msgspec.Struct, kw_only=True):
    type: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    audio: AudioParam | UnsetType = UNSET
    sglang: SessionExtensionParam | UnsetType = UNSET
    tools: list[ToolParam] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    truncation: Literal["auto", "disabled"] | TruncationRetentionRatioParam | UnsetType = UNSET
    # beta aliases
    modalities: list[Modality] | UnsetType = UNSET
    max_response_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    input_audio_format: str | UnsetType = UNSET
    output_audio_format: str | UnsetType = UNSET
    turn_detection: TurnDetectionParam | None | UnsetType = UNSET
    input_audio_transcription: TranscriptionParam | None | UnsetType = UNSET
    temperature: float | UnsetType = UNSET


class ContentParam(msgspec.Struct, kw_only=True):
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: str | None = None


class ItemParam(msgspec.Struct, kw_only=True):
    type: Literal["message", "function_call", "function_call_output"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentParam] = []
    status: str | None = None
    call_id: str | None = None
    output: str | None = None
    name: str | None = None
    arguments: str | None = None


class ResponseAudioOutputParam(msgspec.Struct, kw_only=True):
    format: AudioFormatParam | str | UnsetType = UNSET
    voice: str | VoiceIdParam | UnsetType = UNSET


class ResponseAudioParam(msgspec.Struct, kw_only=True):
    output: ResponseAudioOutputParam | UnsetType = UNSET


class ResponseParam(msgspec.Struct, kw_only=True):
    output_modalities: list[Modality] | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    conversation: str | UnsetType = UNSET
    metadata: dict[str, str] | None | UnsetType = UNSET
    audio: ResponseAudioParam | UnsetType = UNSET
    input: list[Any] | UnsetType = UNSET
    tools: list[ToolParam] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    sglang: SamplingParam | UnsetType = UNSET
    # beta aliases
    modalities: list[Modality] | UnsetType = UNSET
    max_response_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    temperature: float | UnsetType = UNSET


class AppendExtension(msgspec.Struct, kw_only=True):
    """sglang-omni clients number their appends: `seq` contiguous from 0, acknowledged one by one."""

    seq: int | None = None
    t_start_ms: float | None = None


class ImageExtension(msgspec.Struct, kw_only=True):
    t_ms: float | None = None


# --------------------------------------------------------------------------- client events


class ClientEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionParam


class InputAudioBufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str
    sglang: AppendExtension | None = None


class InputAudioBufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class OutputAudioBufferClear(ClientEvent, tag="output_audio_buffer.clear"):
    response_id: str | None = None


class ConversationItemCreate(ClientEvent, tag="conversation.item.create"):
    item: ItemParam
    previous_item_id: str | None = None


class ConversationItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: str
    audio_end_ms: int
    content_index: int = 0


class ConversationItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ConversationItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: str


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseParam | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class InputImageAppend(ClientEvent, tag="sglang.input_image.append"):
    image: str
    sglang: ImageExtension | None = None


class InputAudioEnd(ClientEvent, tag="sglang.input_audio.end"):
    pass


class SessionClose(ClientEvent, tag="session.close"):
    """sglang-omni session clients end a session this way: `session.closed`, then the close frame."""


AnyClientEvent = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | OutputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemTruncate
    | ConversationItemDelete
    | ConversationItemRetrieve
    | ResponseCreate
    | ResponseCancel
    | InputImageAppend
    | InputAudioEnd
    | SessionClose
)

EVENT_TYPES: frozenset[str] = frozenset(
    cls.__struct_config__.tag  # type: ignore[attr-defined]
    for cls in AnyClientEvent.__args__  # type: ignore[attr-defined]
)

_json = msgspec.json.Decoder()
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_RANGE = re.compile(r"Expected `\w+` [<>]=? ")  # the right type, out of range (msgspec.Meta bounds)


def _path(path: str) -> str:
    # msgspec writes `$.item.content[0].type`; clients know the dotted form without `$`.
    return path.replace("`", "")


_typed = msgspec.json.Decoder(AnyClientEvent)


def parse_client_event(text: str | bytes) -> ClientEvent:
    """JSON text -> typed client event, or `RealtimeError` naming what is wrong."""
    try:
        # One pass straight into the event type (~20x faster than a dict and then `convert`;
        # every 20 ms audio append comes through here). Anything wrong is diagnosed below.
        return _typed.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        pass
    try:
        raw = _json.decode(text)
    except msgspec.DecodeError as exc:
        raise RealtimeError("invalid_json", f"The event is not valid JSON: {exc}.") from None
    except RecursionError:  # msgspec's guard on nesting (about the interpreter's recursion limit)
        raise RealtimeError("invalid_json", "The event is nested too deeply.") from None
    if not isinstance(raw, dict):
        raise RealtimeError("invalid_json", "An event must be a JSON object.")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise RealtimeError("missing_required_parameter", "The event has no string `type`.", "type", event_id=event_id)
    if kind not in EVENT_TYPES:
        raise RealtimeError(
            "unknown_event_type",
            f"Unknown event type {kind!r}. Supported: {', '.join(sorted(EVENT_TYPES))}.",
            "type",
            event_id=event_id,
        )
    try:
        return msgspec.convert(_without_nulls(raw), AnyClientEvent)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), kind, event_id) from None


# Fields where an explicit `null` means "off" (GA), not "not given".
_NULL_MEANS_OFF = frozenset({"turn_detection", "transcription", "noise_reduction", "input_audio_transcription",
                             "input_audio_noise_reduction"})


def _without_nulls(event: dict[str, Any]) -> dict[str, Any]:
    """The event with every `null` field removed, except those where null means "off": the GA types
    declare optional fields with default null, and clients send it (LiveKit's `"instructions": null`).
    A tool's JSON schema (`parameters`) is kept as given. In place and without recursion (a deeply
    nested event cannot exhaust the stack)."""
    stack: list[Any] = [event]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in [k for k, v in node.items() if v is None and k not in _NULL_MEANS_OFF]:
                del node[key]
            stack.extend(v for k, v in node.items() if isinstance(v, (dict, list)) and k != "parameters")
        else:
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return event


def _validation_error(text: str, kind: str, event_id: str | None) -> RealtimeError:
    at = _AT.search(text)
    path = _path(at.group("path")) if at else ""
    detail = _AT.sub("", text)
    missing = _MISSING.search(detail)
    if missing:
        param = f"{path}.{missing.group('field')}" if path else missing.group("field")
        return RealtimeError(
            "missing_required_parameter", f"{kind}: missing required parameter `{param}`.", param, event_id=event_id
        )
    code = "invalid_type" if detail.startswith("Expected") and not _RANGE.match(detail) else "invalid_value"
    return RealtimeError(code, f"{kind}: {detail} at `{path}`.", path or None, event_id=event_id)
