"""OpenAI's **Live** API (`/v1/live/sessions`) as a dialect of the GA protocol core.

Live is a second voice API over the same ideas: the server decides turns (VAD, barge-in), the
client never asks for a reply, and work the model cannot do itself is *delegated*. This module is
a naming and shape layer, as dialect.py is for beta: each Live client event becomes zero or more
GA client events fed to the one `RealtimeProtocol`, and each GA server event it emits becomes
zero or one Live server event on the way out (`LiveDialect.outgoing`, applied by the transport as
for every dialect). No rule of the session lives here; only the vocabulary.

The definition is the `openai` SDK's `openai/types/live` (the strict client events: live_events.py;
docs/live.md lists every event):

- `session.start` (first, once) -> GA `session.update` (server VAD with barge-in, spoken replies,
  input transcripts on, the `delegate` tool) plus one `conversation.item.create` per `input`
  message; its `session.updated` comes back as `session.started`. Before it, any other event is
  refused with `session_not_started`. The session object is strict: unknown fields are refused
  with `unknown_parameter`, features the graph cannot serve (`responses`/`decisions` delegation,
  `triggers`, `client`) with `unsupported`; `store: true` keeps the session forkable after it
  ends (live_fork.py).
- WebRTC (`start_media`, webrtc/live_calls.py): the startup config comes with the offer, without
  an audio format (the track's), and the session starts at creation; a `session.start` on its data
  channel is `session_already_started`.
- A fork (`seed_fork`, then `start_fork`; live_fork.py): the source's session object under the
  fork's id (`sglang.forked_from`), its `session.start` carrying overrides only (`audio.format`).
- `session.update` changes only `delegation` (its type stays `client`) and `triggers`; it needs no
  GA event and is answered here with `session.updated`.
- `session.input_audio.append` -> `input_audio_buffer.append`; while muted
  (`session.input_audio.mute`), the audio is replaced by silence of the same length, as Live sends
  silence to the model.
- `session.instructions.append` -> a system message; `session.thinking.append` (silent context)
  -> a system message; `session.commentary.append` (context the model may speak) -> a system
  message and an automatic reply. With a `delegation_id`, the first answer to that delegation is
  the function call's output (`function_call_output`) and an automatic reply follows, so the model
  goes on from it.
- Delegation, client mode: the thinker gets one function tool, `delegate`; its call is
  `session.delegation.created` (the delegation id is the call id; the task text, which Live keeps
  out of that event, is given in the extension field `sglang.task`).
- Out: `session.output_audio.delta`, `session.output_transcript.delta` (reply transcript or text),
  `session.input_transcript.delta` (from the GA transcript deltas, or the completed transcript when
  no delta came), `session.usage.updated` after each reply, `session.closed` with the final
  session and usage, `error` with `client_event_id`. GA's item/response bookkeeping is not sent.

Timeline offsets (`start_ms`, `end_ms`, `offset_ms`) are server wall-clock milliseconds since the
session started, taken when the event is sent, not positions in the audio.
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from session_server.realtime.live_events import (
    REALTIME_CLIENT_EVENTS,
    SERVED_CLIENT_EVENTS,
    UNSERVED_CLIENT_EVENTS,
    AudioFormat,
    CommentaryAppend,
    Delegation,
    ForkSessionConfig,
    ForkStart,
    InitialItem,
    InputAudioAppend,
    InputAudioMute,
    InputAudioUnmute,
    InstructionsAppend,
    LiveClientEvent,
    LiveError,
    MediaSessionConfig,
    SessionClose,
    SessionConfig,
    SessionStart,
    SessionUpdate,
    ThinkingAppend,
    VoiceRef,
    validation_error,
)

LIVE_MODELS = ("gpt-live-1", "gpt-live-1.1")  # answered by the served model (`sglang.served_model`)
MAX_INPUT_MESSAGES = 128

DELEGATE_TOOL = {
    "type": "function",
    "name": "delegate",
    "description": "Hand a task you cannot do yourself (look something up, act in the world) to the application. "
                   "Its answer comes back to you; tell the user you are on it.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string", "description": "What to do, in one sentence."}},
                   "required": ["task"]},
}

# Why a GA session ended -> Live's `session.closed.reason`.
_CLOSE_REASONS = {"max_duration": "expired", "max_duration_reached": "expired", "session_expired": "expired",
                  "idle_timeout": "expired", "hangup": "close_requested", "peer_closed": "remote_hangup"}
_SILENCE_BYTE = {"audio/pcm": 0x00, "audio/pcmu": 0xFF, "audio/pcma": 0xD5}


# ------------------------------------------------------------------ what one client event becomes

@dataclass
class LiveInput:
    """One Live client event, translated: GA events for the core, and the Live acknowledgement
    sent once the core accepted them all (no `error` among what they produced)."""

    ga_events: list[dict[str, Any]] = field(default_factory=list)
    ack: dict[str, Any] | None = None
    refusal: dict[str, Any] | None = None  # a Live error event: nothing goes to the core
    input_audio: str | None = None  # an append's audio as the client sent it (before muting): for a sideband


class LiveDialect:
    """The Live vocabulary of one session; set as `protocol.dialect` by the Live transport."""

    name = "live"
    decided = True

    def __init__(self, session_id: str, served_model: str, clock: Any = time.monotonic,
                 aliases: tuple[str, ...] = ()) -> None:
        self.session_id = session_id
        self.served_model = served_model
        self.answered_names = (served_model, *aliases, *LIVE_MODELS)  # the operator's aliases too (model_names.py)
        self.clock = clock
        self.started_at = clock()
        self.started = False
        self.start_event_id: str | None = None
        self.session: dict[str, Any] = {"id": session_id, "object": "live.session", "model": served_model, "status": "active",
                                        "expires_at": 0}
        self.input_format: dict[str, Any] = {"type": "audio/pcm", "rate": 24000}
        self.muted = False
        self.close_requested = False  # a `session.close` went to the core: its close is Live's `close_requested`
        self.delegations: dict[str, bool] = {}  # call id -> answered yet
        self.forked_from: str | None = None  # a fork's source session (seed_fork)
        self.transcribed_items: set[str] = set()
        # Who else sees each Live event sent to the client (live_sideband.py): called in order.
        self.observers: list[Any] = []
        self._event_ids = itertools.count(1)

    # Dialect interface (dialect.py): a Live session's dialect is fixed at the handshake.
    def choose(self, name: str) -> None:
        pass

    def observe_session_update(self, session: Any) -> None:
        pass

    # ------------------------------------------------------------------ in

    def incoming(self, text: str | bytes) -> LiveInput:
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return LiveInput(refusal=self.error("invalid_json", "The event is not valid JSON."))
        if not isinstance(raw, dict):
            return LiveInput(refusal=self.error("invalid_json", "An event must be a JSON object."))
        event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
        try:
            return self._translate(raw, event_id)
        except LiveError as error:
            return LiveInput(refusal=self.error(error.code, error.message, error.param, event_id))

    def _translate(self, raw: dict[str, Any], event_id: str | None) -> LiveInput:
        kind = raw.get("type")
        if not isinstance(kind, str):
            raise LiveError("missing_required_parameter", "The event has no string `type`.", "type")
        if kind in REALTIME_CLIENT_EVENTS:
            raise LiveError("realtime_event_on_live", f"{kind!r} is an event of the Realtime API (GET /v1/realtime); "
                            "a Live session speaks Live events (docs/live.md).", "type")
        if kind in UNSERVED_CLIENT_EVENTS:
            raise LiveError("unsupported", f"{kind!r} is not served by this server (docs/live.md).", "type")
        if kind not in SERVED_CLIENT_EVENTS:
            raise LiveError("unknown_event_type", f"Unknown Live event type {kind!r}. Supported: "
                            f"{', '.join(sorted(SERVED_CLIENT_EVENTS))}.", "type")
        if kind == "session.start" and self.forked_from is not None:
            try:
                fork_start = msgspec.convert(raw, ForkStart)  # the event's own shape; its overrides below
            except msgspec.ValidationError as exc:
                raise validation_error(str(exc)) from None
            return self.start_fork(raw["session"], fork_start.event_id, media=False)
        try:
            event = msgspec.convert(raw, LiveClientEvent)
        except msgspec.ValidationError as exc:
            raise validation_error(str(exc)) from None
        if isinstance(event, SessionStart):
            return self._start(event)
        if not self.started:
            raise LiveError("session_not_started", "Send `session.start` first and wait for `session.started`.", "type")
        if isinstance(event, SessionUpdate):
            return self._update(event)
        if isinstance(event, SessionClose):
            self.close_requested = True
            return LiveInput([{"type": "session.close", "event_id": event_id}])
        if isinstance(event, InputAudioAppend):
            return LiveInput([{"type": "input_audio_buffer.append", "event_id": event_id, "audio": self._heard(event.audio)}],
                             input_audio=event.audio)
        if isinstance(event, (InputAudioMute, InputAudioUnmute)):
            self.muted = isinstance(event, InputAudioMute)
            kind = "session.input_audio.muted" if self.muted else "session.input_audio.unmuted"
            return LiveInput(ack=self.native(kind, client_event_id=event_id))
        return self._context(event)

    def _start(self, event: SessionStart) -> LiveInput:
        self._check_not_started()
        return self._begin(event.session, event.event_id, media=False)

    def start_media(self, config: Any) -> LiveInput:
        """`POST /v1/live/sessions` (WebRTC): the startup config comes with the offer and the
        session starts without a `session.start`; its `session.started` goes out on the data
        channel. Raises `LiveError` (params named `session.*`)."""
        try:
            parsed = msgspec.convert(config, MediaSessionConfig)
        except msgspec.ValidationError as exc:
            raise validation_error(str(exc), "session") from None
        return self._begin(parsed, None, media=True)

    def start_fork(self, overrides: Any, event_id: str | None, media: bool) -> LiveInput:
        """A fork's start (`seed_fork` first): its overrides, as a GA `session.update` whose
        `session.updated` becomes `session.started`. Raises `LiveError`."""
        self._check_not_started()
        try:
            config = msgspec.convert(overrides if overrides is not None else {}, ForkSessionConfig)
        except msgspec.ValidationError as exc:
            raise validation_error(str(exc), "session") from None
        if config.client is not None:
            raise LiveError("unsupported", "`client` (frontend data-channel permissions) is not served.", "session.client")
        if config.delegation is not None:
            raise LiveError("unsupported", "A fork's `delegation` overrides a Responses backend; this server serves client "
                            "delegation only, which a fork inherits.", "session.delegation")
        if media and config.audio is not None:
            raise LiveError("invalid_value", "A WebRTC fork negotiates its audio format on the media transport: "
                            "omit `session.audio`.", "session.audio")
        fmt = config.audio.format if config.audio is not None else None
        audio_format = self._format(fmt) if fmt is not None else None
        ga_session: dict[str, Any] = {"type": "realtime"}
        if audio_format is not None:
            ga_session["audio"] = {"input": {"format": audio_format}, "output": {"format": audio_format}}
            self.input_format = audio_format
            self.session["audio"]["format"] = self._live_format(audio_format)
        if config.store is not None:
            self.session["store"] = config.store  # else the source's
        self.start_event_id = event_id or ""
        return LiveInput([{"type": "session.update", "event_id": event_id, "session": ga_session}])

    def fork_state(self) -> dict[str, Any]:
        """What a fork of this session takes from its Live side (live_fork.py); JSON-able."""
        return {"session": copy.deepcopy(self.session), "input_format": dict(self.input_format),
                "delegations": dict(self.delegations)}

    def seed_fork(self, source_id: str, state: dict[str, Any], media: bool) -> None:
        """Make this (new) session a fork of `source_id`: its session object and open
        delegations, under this session's id. The conversation is the protocol's (snapshot.py)."""
        self.forked_from = source_id
        session = copy.deepcopy(state["session"])
        session.update({"id": self.session_id, "expires_at": 0})
        session.setdefault("sglang", {})["forked_from"] = source_id
        self.input_format = dict(state["input_format"])
        voice = {"voice": ((session.get("audio") or {}).get("output") or {}).get("voice")}
        session["audio"] = {"output": voice} if media else {"format": self._live_format(self.input_format), "output": voice}
        self.session = session
        self.delegations = dict(state["delegations"])

    def _check_not_started(self) -> None:
        if self.started or self.start_event_id is not None:
            raise LiveError("session_already_started", "`session.start` is sent once, first (a WebRTC session "
                            "starts when it is created).", "type")

    def _begin(self, config: SessionConfig | MediaSessionConfig, event_id: str | None, media: bool) -> LiveInput:
        if config.model not in self.answered_names:
            raise LiveError("model_not_found", f"The model {config.model!r} is not served here; this server answers "
                            f"{', '.join(repr(n) for n in dict.fromkeys(self.answered_names))} with {self.served_model!r}.",
                            "session.model")
        delegation = self._delegation(config.delegation, "session.delegation")
        if config.client is not None:
            raise LiveError("unsupported", "`client` (frontend data-channel permissions of a WebRTC session) is not "
                            "served.", "session.client")
        if config.triggers:
            raise LiveError("unsupported", "Decisions triggers are not served.", "session.triggers")
        if isinstance(config, MediaSessionConfig):
            if config.idle_timeout_s is not None:
                raise LiveError("unsupported", "Pausing inference when idle (`idle_timeout_s`) is not served: inference "
                                "stays on for the whole session.", "session.idle_timeout_s")
            if config.wake_policy is not None and config.wake_policy.type != "speech":
                raise LiveError("invalid_value", "The wake policy type is `speech`.", "session.wake_policy.type")
        fmt = getattr(config.audio, "format", None)
        audio_format = self._format(fmt) if fmt is not None else None
        voice = config.audio.output.voice if config.audio is not None and config.audio.output is not None else None
        voice = voice.id if isinstance(voice, VoiceRef) else voice
        if audio_format is None and not media:
            audio_format = {"type": "audio/pcm", "rate": 24000}
        items = self._initial_items(config.input or [], event_id)
        formats = {"format": audio_format} if audio_format is not None else {}  # WebRTC: the GA session's own
        ga_session: dict[str, Any] = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {**formats, "transcription": {"model": config.model},
                          "turn_detection": {"type": "server_vad", "create_response": True, "interrupt_response": True}},
                "output": {**formats, **({"voice": voice} if voice is not None else {})},
            },
            "tools": [DELEGATE_TOOL],
            "tool_choice": "auto",
        }
        if config.instructions and config.instructions.strip():
            ga_session["instructions"] = config.instructions
        self.start_event_id = event_id or ""
        live_audio: dict[str, Any] = {"output": {"voice": voice}}
        if audio_format is not None:
            self.input_format = audio_format
            live_audio = {"format": self._live_format(audio_format), **live_audio}
        self.session.update({
            "model": config.model,
            "audio": live_audio,
            "delegation": delegation,
            "input": [msgspec.to_builtins(item) for item in config.input or []],
            "instructions": config.instructions,
            "safety_identifier": config.safety_identifier,
            "store": bool(config.store),  # kept for forks after the session ends (live_fork.py)
            "triggers": [],
            "sglang": {"served_model": self.served_model},
        })
        return LiveInput([{"type": "session.update", "event_id": event_id, "session": ga_session}, *items])

    def _update(self, event: SessionUpdate) -> LiveInput:
        update = event.session
        if update.triggers:
            raise LiveError("unsupported", "Decisions triggers are not served.", "session.triggers")
        if update.delegation is not None:
            self.session["delegation"] = self._delegation(update.delegation, "session.delegation")
        return LiveInput(ack=self.native("session.updated", client_event_id=event.event_id, session=dict(self.session)))

    def _delegation(self, delegation: Delegation | None, param: str) -> dict[str, Any]:
        if delegation is None:
            return {"type": "client", "acknowledgement_delay_ms": 0}
        if delegation.type in ("responses", "decisions"):
            raise LiveError("unsupported", f"{delegation.type!r} delegation (a backend model run by the session) is not "
                            "served; use client delegation (the default).", f"{param}.type")
        if delegation.type != "client":
            raise LiveError("invalid_value", f"Unknown delegation type {delegation.type!r}.", f"{param}.type")
        if delegation.acknowledgement_delay_ms is not None and delegation.acknowledgement_delay_ms < 0:
            raise LiveError("invalid_value", "`acknowledgement_delay_ms` must be >= 0.", f"{param}.acknowledgement_delay_ms")
        return {"type": "client", "acknowledgement_delay_ms": delegation.acknowledgement_delay_ms or 0}

    @staticmethod
    def _format(fmt: AudioFormat) -> dict[str, Any]:
        if fmt.type == "audio/pcm":
            if fmt.rate not in (16000, 24000):
                raise LiveError("invalid_value", "`audio/pcm` is 16000 or 24000 Hz.", "session.audio.format.rate")
            return {"type": "audio/pcm", "rate": fmt.rate}
        if fmt.type in ("audio/pcmu", "audio/pcma"):
            if fmt.rate not in (None, 8000):
                raise LiveError("invalid_value", "G.711 audio is 8000 Hz.", "session.audio.format.rate")
            return {"type": fmt.type}
        raise LiveError("invalid_value", f"Unknown audio format {fmt.type!r} (audio/pcm, audio/pcmu, audio/pcma).",
                        "session.audio.format.type")

    @staticmethod
    def _live_format(ga_format: dict[str, Any]) -> dict[str, Any]:
        return ga_format if ga_format["type"] == "audio/pcm" else {"type": ga_format["type"], "rate": 8000}

    def _initial_items(self, items: list[InitialItem], event_id: str | None) -> list[dict[str, Any]]:
        if len(items) > MAX_INPUT_MESSAGES:
            raise LiveError("invalid_value", f"At most {MAX_INPUT_MESSAGES} `input` messages.", "session.input")
        out = []
        for index, item in enumerate(items):
            if item.role not in ("developer", "user", "assistant"):
                raise LiveError("invalid_value", "An `input` message's role is developer, user or assistant.",
                                f"session.input[{index}].role")
            if len(item.content) != 1:
                raise LiveError("invalid_value", "An `input` message has exactly one text part.", f"session.input[{index}].content")
            text = item.content[0].text
            role = "system" if item.role == "developer" else item.role
            part = "output_text" if role == "assistant" else "input_text"
            out.append({"type": "conversation.item.create", "event_id": event_id,
                        "item": {"type": "message", "role": role, "content": [{"type": part, "text": text}]}})
        return out

    def _heard(self, audio: str) -> str:
        """What the model hears of an append: the audio, or silence as long while muted."""
        if not self.muted:
            return audio
        try:
            size = len(base64.b64decode(audio, validate=True))
        except (binascii.Error, ValueError):
            return audio  # the core refuses it with its own coded error
        silence = bytes([_SILENCE_BYTE[self.input_format["type"]]]) * size
        return base64.b64encode(silence).decode("ascii")

    def _context(self, event: InstructionsAppend | ThinkingAppend | CommentaryAppend) -> LiveInput:
        if event.delegation_id is not None and event.delegation_id not in self.delegations:
            raise LiveError("delegation_not_found", f"No delegation {event.delegation_id!r} in this session.", "delegation_id")
        kind = {InstructionsAppend: "instructions", ThinkingAppend: "thinking", CommentaryAppend: "commentary"}[type(event)]
        ga: list[dict[str, Any]] = []
        answers = event.delegation_id is not None and not self.delegations[event.delegation_id] and kind != "instructions"
        if answers:
            self.delegations[event.delegation_id] = True
            ga.append({"type": "conversation.item.create", "event_id": event.event_id,
                       "item": {"type": "function_call_output", "call_id": event.delegation_id, "output": event.content}})
        else:
            text = event.content if kind == "instructions" else f"[{kind}] {event.content}"
            ga.append({"type": "conversation.item.create", "event_id": event.event_id,
                       "item": {"type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]}})
        if answers or kind == "commentary" or (kind == "thinking" and event.delegation_id is not None):
            ga.append({"type": "response.create", "event_id": event.event_id})
        now = self.ms()
        return LiveInput(ga, ack=self.native(f"session.{kind}.appended", client_event_id=event.event_id, start_ms=now, end_ms=now))

    # ------------------------------------------------------------------ out

    def ms(self) -> int:
        return int((self.clock() - self.started_at) * 1000)

    def native(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A Live event made here (not a GA one renamed): `outgoing` passes it through."""
        return {"type": kind, "event_id": f"live_event_{next(self._event_ids)}", **fields, "_live": True}

    def error(self, code: str, message: str, param: str | None = None, client_event_id: str | None = None,
              kind: str = "invalid_request_error") -> dict[str, Any]:
        return self.native("error", client_event_id=client_event_id,
                           error={"type": kind, "code": code, "message": message, "param": param, "client_event_id": client_event_id})

    def outgoing(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The Live event for a GA server event (None: Live has no such event)."""
        if event.get("_live"):
            live = {key: value for key, value in event.items() if key != "_live"}
        else:
            handler = _OUT.get(event["type"])
            live = handler(self, event) if handler is not None else None
        if live is not None:
            for observer in self.observers:
                observer(live)
        return live

    def _out_updated(self, event: dict[str, Any]) -> dict[str, Any] | None:
        if self.started or self.start_event_id is None:
            return None
        self.started = True
        self.started_at = self.clock()  # the session timeline starts here
        ga_session = event["session"]
        self.session["expires_at"] = int(ga_session.get("expires_at") or 0)
        voice = ((ga_session.get("audio") or {}).get("output") or {}).get("voice")
        self.session["audio"]["output"]["voice"] = voice  # the voice that speaks, default or chosen
        return self._event("session.started", client_event_id=self.start_event_id or None, session=dict(self.session))

    def _out_error(self, event: dict[str, Any]) -> dict[str, Any]:
        error = event["error"]
        client_event_id = error.get("event_id")
        if not self.started and self.start_event_id is not None and client_event_id == (self.start_event_id or None):
            self.start_event_id = None  # the core refused the start: the client may send it again
        return self._event("error", client_event_id=client_event_id,
                           error={"type": error.get("type", "invalid_request_error"), "code": error.get("code"),
                                  "message": error.get("message"), "param": error.get("param"), "client_event_id": client_event_id})

    def _out_input_transcript(self, event: dict[str, Any]) -> dict[str, Any] | None:
        if event["type"].endswith(".delta"):
            self.transcribed_items.add(event["item_id"])
            delta = event["delta"]
        elif event["item_id"] in self.transcribed_items:
            self.transcribed_items.discard(event["item_id"])
            return None
        else:
            delta = event.get("transcript") or ""
        now = self.ms()
        return self._event("session.input_transcript.delta", delta=delta, start_ms=now, end_ms=now)

    def _out_audio(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._event("session.output_audio.delta", delta=event["delta"])

    def _out_transcript(self, event: dict[str, Any]) -> dict[str, Any]:
        now = self.ms()
        return self._event("session.output_transcript.delta", delta=event["delta"], start_ms=now, end_ms=now)

    def _out_call(self, event: dict[str, Any]) -> dict[str, Any]:
        call_id = event["call_id"]
        self.delegations[call_id] = False
        try:
            task = json.loads(event.get("arguments") or "{}").get("task")
        except (ValueError, AttributeError):
            task = None
        return self._event("session.delegation.created", offset_ms=self.ms(),
                           delegation={"id": call_id, "target": "client", "type": "delegation"},
                           sglang={"task": task, "name": event.get("name"), "arguments": event.get("arguments")})

    def _out_done(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._event("session.usage.updated", usage=self.usage())

    def _out_closed(self, event: dict[str, Any]) -> dict[str, Any]:
        reason = event.get("reason") or "closed"
        if reason == "client_closed":
            live_reason = "close_requested" if self.close_requested else "connection_lost"
        else:
            live_reason = _CLOSE_REASONS.get(reason, "connection_lost")
        return self._event("session.closed", client_event_id=event.get("client_event_id"), reason=live_reason,
                           session=dict(self.session), usage=self.usage(), sglang={"reason": reason})

    def usage(self) -> dict[str, Any]:
        return {"seconds": float(int(self.clock() - self.started_at)) if self.started else 0.0}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": f"live_event_{next(self._event_ids)}", **fields}


_OUT = {
    "session.updated": LiveDialect._out_updated,
    "error": LiveDialect._out_error,
    "conversation.item.input_audio_transcription.delta": LiveDialect._out_input_transcript,
    "conversation.item.input_audio_transcription.completed": LiveDialect._out_input_transcript,
    "response.output_audio.delta": LiveDialect._out_audio,
    "response.output_audio_transcript.delta": LiveDialect._out_transcript,
    "response.output_text.delta": LiveDialect._out_transcript,
    "response.function_call_arguments.done": LiveDialect._out_call,
    "response.done": LiveDialect._out_done,
    "session.closed": LiveDialect._out_closed,
}
