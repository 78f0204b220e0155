"""OpenAI's Live client events, strict, as the SDK's `openai/types/live` defines them.

The vocabulary of live_dialect.py in one place: the event types a Live session serves, refuses
with `unsupported`, or refuses as the Realtime API's; and each served event as a msgspec Struct
that refuses unknown fields (`forbid_unknown_fields`), as Live's session object does. A
validation failure becomes a `LiveError` naming the parameter (`validation_error`).
"""

from __future__ import annotations

from typing import Any

import msgspec

SERVED_CLIENT_EVENTS = frozenset({
    "session.start", "session.update", "session.close", "session.input_audio.append", "session.input_audio.mute",
    "session.input_audio.unmute", "session.instructions.append", "session.thinking.append", "session.commentary.append",
})
# Live client events the graph cannot serve: refused with `unsupported`.
UNSERVED_CLIENT_EVENTS = frozenset({
    "session.output_audio.fixture.play", "decision.create", "decision.item.create", "decision.item.delete",
    "response.item.create", "response.create", "transport.dtmf.send",
})
# Events of the Realtime (GA/beta) dialect: refused with `realtime_event_on_live`.
REALTIME_CLIENT_EVENTS = frozenset({
    "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear", "output_audio_buffer.clear",
    "conversation.item.create", "conversation.item.truncate", "conversation.item.delete", "conversation.item.retrieve",
    "response.cancel", "transcription_session.update",
})

class LiveError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


# ------------------------------------------------------------------ the client events, strict

class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class VoiceRef(_Strict, kw_only=True):
    id: str


class AudioFormat(_Strict, kw_only=True):
    type: str
    rate: int | None = None


class AudioOutput(_Strict, kw_only=True):
    voice: str | VoiceRef | None = None


class Audio(_Strict, kw_only=True):
    format: AudioFormat | None = None
    output: AudioOutput | None = None


class Delegation(_Strict, kw_only=True):
    type: str
    acknowledgement_delay_ms: int | None = None
    responses: dict[str, Any] | None = None
    decisions: dict[str, Any] | None = None


class InitialContent(_Strict, kw_only=True):
    text: str
    type: str | None = None


class InitialItem(_Strict, kw_only=True):
    role: str
    content: list[InitialContent]
    id: str | None = None
    status: str | None = None
    type: str | None = None


class SessionConfig(_Strict, kw_only=True):
    model: str
    audio: Audio | None = None
    client: dict[str, Any] | None = None
    delegation: Delegation | None = None
    input: list[InitialItem] | None = None
    instructions: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None


class MediaAudio(_Strict, kw_only=True):
    output: AudioOutput | None = None  # no `format`: WebRTC negotiates it on the media transport


class WakePolicy(_Strict, kw_only=True):
    type: str
    vad_threshold: float | None = None


class MediaSessionConfig(_Strict, kw_only=True):
    """`POST /v1/live/sessions`'s `session` (WebRTC): the startup config, without an audio format."""

    model: str
    audio: MediaAudio | None = None
    client: dict[str, Any] | None = None
    delegation: Delegation | None = None
    idle_timeout_s: int | None = None
    input: list[InitialItem] | None = None
    instructions: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None
    wake_policy: WakePolicy | None = None


class ForkAudio(_Strict, kw_only=True):
    format: AudioFormat | None = None


class ForkSessionConfig(_Strict, kw_only=True):
    """A fork's overrides (`session.start` on the fork WebSocket, or the fork POST's `session`):
    the model, voice, instructions and conversation are the source's."""

    audio: ForkAudio | None = None  # WebSocket forks only
    client: dict[str, Any] | None = None
    delegation: dict[str, Any] | None = None
    store: bool | None = None


class SessionUpdateConfig(_Strict, kw_only=True):
    delegation: Delegation | None = None
    triggers: list[dict[str, Any]] | None = None


class _Event(_Strict, tag_field="type"):
    event_id: str | None = None


class SessionStart(_Event, tag="session.start", kw_only=True):
    session: SessionConfig


class ForkStart(_Event, tag="session.start", kw_only=True):
    session: ForkSessionConfig


class SessionUpdate(_Event, tag="session.update", kw_only=True):
    session: SessionUpdateConfig


class SessionClose(_Event, tag="session.close", kw_only=True):
    pass


class InputAudioAppend(_Event, tag="session.input_audio.append", kw_only=True):
    audio: str


class InputAudioMute(_Event, tag="session.input_audio.mute", kw_only=True):
    pass


class InputAudioUnmute(_Event, tag="session.input_audio.unmute", kw_only=True):
    pass


class _ContextAppend(_Event, kw_only=True):
    content: str
    delegation_id: str | None = None


class InstructionsAppend(_ContextAppend, tag="session.instructions.append", kw_only=True):
    pass


class ThinkingAppend(_ContextAppend, tag="session.thinking.append", kw_only=True):
    pass


class CommentaryAppend(_ContextAppend, tag="session.commentary.append", kw_only=True):
    pass


LiveClientEvent = (SessionStart | SessionUpdate | SessionClose | InputAudioAppend | InputAudioMute | InputAudioUnmute
                   | InstructionsAppend | ThinkingAppend | CommentaryAppend)


def validation_error(message: str, prefix: str | None = None) -> LiveError:
    """msgspec's message names the path (`... - at `$.session.foo``): the Live param it names
    (under `prefix` when what was converted is a part of the request, e.g. its `session`)."""
    text, _, where = message.partition(" - at `")
    path = where.rstrip("`").removeprefix("$").lstrip(".") or None
    if prefix is not None:
        path = f"{prefix}.{path}" if path else prefix
    if text.startswith("Object contains unknown field"):
        name = text.split("`")[1] if "`" in text else ""
        param = f"{path}.{name}" if path else name
        return LiveError("unknown_parameter", f"Unknown parameter {param!r}.", param)
    if text.startswith("Object missing required field"):
        name = text.split("`")[1] if "`" in text else ""
        param = f"{path}.{name}" if path else name
        return LiveError("missing_required_parameter", f"Missing required parameter {param!r}.", param)
    return LiveError("invalid_value", f"{text}.", path)
