"""The realtime protocol as one transport-free state machine (sans-I/O).

A transport adapter (WebSocket today, a WebRTC data channel next) feeds it what arrives:

    protocol.receive_text(text)        a client event (JSON text)
    protocol.receive_binary(data)      a binary frame (rejected: the protocol is JSON)
    protocol.receive_audio(samples, r) decoded input audio (a WebRTC media track)
    protocol.graph_output(message)     a message from the session graph's outputs
    protocol.session_ended(...)        the graph session ended (idle, error, shutdown)
    protocol.close(reason)             the transport is going away

and gets back a list of actions to carry out, in order: `SendEvent` (a server event for the
client), `SendAudio` (reply audio for a media track, when built with `audio_deltas=False`),
`SendToGraph` (a message for the graph's `audio` input: audio, images and the typed commands
of graph/messages.py (`Configure`, `Commit`, `AddItem`, `CreateResponse`...) stay in order; an automatic reply goes to `reply_input`, see `_committed`), `ControlGraph` (an
Interrupt/Truncate that overtakes data), `HoldPlayback` (a sound during a reply, not yet a
turn: a transport that plays the audio itself pauses it, and resumes it if the sound ends short)
and `CloseSession`.
Nothing here awaits or touches a socket, so both transports share every rule below.

Who decides what:
- the `dialog` node owns utterances (VAD turns, commits, clears) and turn ids; it reports them
  as `NodeEvent`s (`speech_started`, `committed`, `turn_queued`...);
- this protocol owns the conversation (items, `previous_item_id` links; an item deleted, or
  created before the end, goes to the model as a dialog `DeleteItem` / `AddItem` with
  `insert_after`, and the thinker rebuilds its KV from there), responses and their
  lifecycle, barge-in (a `speech_started` during a reply cancels it when `interrupt_response`),
  and every client-facing error;
- the thinker transcribes committed utterances when the session config has `transcription` (the
  dialog marks them) and reports `transcription_*` NodeEvents, which become the
  `conversation.item.input_audio_transcription.*` events; a `transcription` session commits and
  transcribes but never creates a response;
- `sglang_session.py` holds what an sglang-omni session client negotiated (the grant in
  `session.sglang.granted`, its 16 kHz default input rate); `dialect.py` names the GA events this
  protocol emits for beta clients (the transports apply `protocol.dialect.outgoing`). Every
  acknowledgement of a client command carries its `event_id` as `client_event_id`;
- `compat.py`: the server's compatibility preset, if any, sets a new session's defaults and
  dialect; under `sglang-omni-v0` a turn's transcript events wait for its `response.done`.

States. The session is OPEN until `session.closed` has been queued, then CLOSED: nothing is
accepted or sent after that. A response goes QUEUED -> IN_PROGRESS -> DONE (or QUEUED -> DONE
when dropped); `_advance` is the one place that changes it. At most one response is IN_PROGRESS;
server-VAD turns that finish while one is speaking wait QUEUED behind it (their graph output is
held until they start). Every method runs to completion without awaiting, so state checks and
updates cannot interleave.
"""

from __future__ import annotations

import base64
import enum
import itertools
import json
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from graph.messages import (
    AddItem,
    AudioChunk,
    AudioOut,
    Clear,
    Commit,
    Configure,
    Control,
    CreateResponse,
    DeleteItem,
    FunctionCall,
    ImageFrame,
    InputCleared,
    InputCommitted,
    InputEnd,
    InputEnded,
    InputSoundDismissed,
    InputSoundStarted,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTimeout,
    Interrupt,
    Message,
    NodeError,
    NodeEvent,
    ReplyParams,
    Stage,
    TextDelta,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
    Truncate,
    TurnDone,
    TurnQueued,
    Usage,
)
from session_server.realtime import events as ev
from session_server.realtime.audio_formats import InvalidAudio, OutputEncoder, decode
from session_server.realtime.compat import default_dialect, initial_config
from session_server.realtime.conversation import (
    Item,
    decode_base64,
    item_content,
    new_id,
    response_wire,
    transcription_usage_wire,
)
from session_server.realtime.dialect import SGLANG_OMNI_V0, Dialect
from session_server.realtime.events import RealtimeError
from session_server.realtime.input_bounds import check_image, check_text
from session_server.realtime.session_config import (
    ResponseSettings,
    ServedModel,
    SessionConfig,
    apply_update,
    response_settings,
)
from session_server.realtime.sglang_session import (
    NATIVE_UNIT_MS,
    TAIL_POLICY,
    Negotiation,
    check_timeline,
)
from session_server.usage import SessionUsage, UsageTotals
from session_server.realtime.voice_lookups import VoiceLookups, voice_names

# Largest base64 payload of one append or image, as sent (OpenAI's limit is 15 MiB per append).
MAX_APPEND_CHARS = 15 * 1024 * 1024
# Input bounds of a protocol built without the served model's facts (tests, the client-secret check).
_DEFAULT_BOUNDS = ServedModel(model="")


@dataclass(frozen=True)
class SendEvent:
    event: dict[str, Any]


# The graph inputs a realtime session feeds: audio, images and commands, in order; and, where the
# profile has it, one that leads straight to the dialog node (automatic replies, see `_committed`).
AUDIO_INPUT = "audio"
REPLIES_INPUT = "replies"


def reply_input_for(graph_inputs: Collection[str]) -> str:
    """The graph input for automatic replies: `replies` where the profile has one, else `audio`
    (behind the queued audio, still correct)."""
    return REPLIES_INPUT if REPLIES_INPUT in graph_inputs else AUDIO_INPUT


def realtime_unavailable(graph_inputs: Collection[str]) -> str | None:
    """Why a graph with these inputs cannot serve realtime sessions (None: it can)."""
    if AUDIO_INPUT in graph_inputs:
        return None
    return f"This server's graph has no `{AUDIO_INPUT}` input: it does not serve realtime sessions."


@dataclass(frozen=True)
class SendToGraph:
    message: Message
    input: str = AUDIO_INPUT


@dataclass(frozen=True)
class ControlGraph:
    control: Control


@dataclass(frozen=True)
class SendAudio:
    """Reply audio for a media track (transports built with `audio_deltas=False`, i.e. WebRTC)."""

    response_id: str
    item_id: str
    samples: Any  # float32 mono
    sample_rate: int


@dataclass(frozen=True)
class CloseSession:
    code: int
    reason: str


@dataclass(frozen=True)
class HoldPlayback:
    """held True: a sound began during a reply (not yet `interrupt_min_speech_ms` long); False: it
    ended short, play on. A sound that becomes a turn gets `speech_started` and the cancel instead."""

    held: bool


Action = SendEvent | SendAudio | SendToGraph | ControlGraph | CloseSession | HoldPlayback

def _reply_params(response_id: str, settings: ResponseSettings) -> ReplyParams:
    return ReplyParams(
        response_id=response_id,
        output_modalities=settings.output_modalities,
        instructions=settings.instructions,
        max_output_tokens=settings.max_output_tokens,
        voice=settings.voice_speaker or settings.voice,
        out_of_band=settings.out_of_band,
        sampling=settings.sampling,
        tools=tuple(tool.to_wire() for tool in settings.tools),
        tool_choice=settings.tool_choice,
        parallel_tool_calls=settings.parallel_tool_calls,
        truncation=settings.truncation,
    )


# WebSocket close codes the adapters use.
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_INTERNAL, CLOSE_TRY_AGAIN = 1000, 1001, 1008, 1011, 1013


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class ResponseState(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    DONE = "done"


_TRANSITIONS = {
    ResponseState.QUEUED: {ResponseState.IN_PROGRESS, ResponseState.DONE},
    ResponseState.IN_PROGRESS: {ResponseState.DONE},
    ResponseState.DONE: set(),
}


@dataclass
class Response:
    id: str
    settings: ResponseSettings
    state: ResponseState = ResponseState.QUEUED
    turn_id: int = -1
    item: Item | None = None
    text: list[str] = field(default_factory=list)
    encoder: OutputEncoder | None = None
    output_tokens: int = 0
    held: list[Message] = field(default_factory=list)  # graph output that arrived while QUEUED
    calls: list[Item] = field(default_factory=list)  # function_call items, after the message item

    @property
    def output_items(self) -> list[Item]:
        return ([self.item] if self.item is not None else []) + self.calls

    @property
    def audio(self) -> bool:
        return "audio" in self.settings.output_modalities


class RealtimeProtocol:
    def __init__(self, session_id: str, model: str, max_append_chars: int = MAX_APPEND_CHARS, audio_deltas: bool = True,
                 reply_input: str = AUDIO_INPUT, served: ServedModel | None = None, compat: str | None = None,
                 usage_totals: UsageTotals | None = None):
        self.session_id = session_id
        # What the session used (usage.py); every addition also goes to the server's `usage_totals`.
        self.usage = SessionUsage(totals=usage_totals)
        # The graph input for automatic replies (`replies` where the profile routes it straight
        # to the dialog node; `audio` otherwise).
        self.reply_input = reply_input
        # False: reply audio leaves as `SendAudio` actions (a media track), not `output_audio.delta` events.
        self.audio_deltas = audio_deltas
        self.state = SessionState.OPEN
        # Uploaded voices are looked up off the event loop, ahead of the event (voice_lookups.py).
        self.voice_lookups: VoiceLookups | None = None
        if served is not None and served.uploaded_speaker is not None:
            self.voice_lookups = VoiceLookups(served.uploaded_speaker)
            served = replace(served, uploaded_speaker=self.voice_lookups.speaker)
        # `compat`: the server's compatibility preset (compat.py): the defaults and dialect of a
        # client that does not say which dialect it speaks.
        self.config = initial_config(compat, SessionConfig(model=model, served=served))
        self.max_append_chars = max_append_chars
        self.items: dict[str, Item] = {}  # the conversation, in order
        self.responses: dict[str, Response] = {}  # QUEUED and IN_PROGRESS, in order
        self.close_reason: str | None = None
        # Wall-clock time of the client's last event or input audio (the admin API shows it).
        self.last_activity_at = time.time()
        self._done: deque[str] = deque(maxlen=64)  # recently finished response ids (late graph output is dropped)
        self._by_turn: dict[int, str] = {}
        self._event_ids = itertools.count(1)
        self._out: list[Action] = []
        self._input_ms = 0.0  # the input audio timeline: ms of audio appended so far
        self._next_seq = 0
        self._turns_processed = False
        self._audio_produced = False
        self._input_ended = False  # sglang.input_audio.end received
        self._ended_acknowledged = False
        self._drained_sent = False
        # The client's dialect (GA or beta: names on the way out, dialect.py) and what it
        # negotiated as an sglang-omni session client (grant, input rate: sglang_session.py).
        self.dialect = Dialect(default_dialect(compat))
        self.negotiation = Negotiation()
        # sglang-omni-v0 clients get a user transcript after its turn's reply is done: the reply
        # answering each transcribed item, and transcript events held until it is done.
        self._reply_of_item: dict[str, str] = {}
        self._held_transcripts: list[TranscriptDelta | TranscriptCompleted | TranscriptFailed] = []
        self._end_event_id: str | None = None  # event_id of sglang.input_audio.end (acks carry it)
        self._consumed_ms = 0.0  # input the dialog had taken in when input ended

    # ------------------------------------------------------------------ entry points

    def graph_config(self) -> dict[str, Any]:
        """The session config nodes start with (`SessionInfo.config`), and what every `Configure`
        command carries: `SessionConfig.to_graph()` plus `auto_reply`, the reply an automatic
        commit gets (None: none, a transcription session). The dialog makes that reply with the
        commit itself, as one turn — the utterance and its reply request go through preprocessing,
        the encoders and the thinker's prefill once, with no round trip through this protocol —
        and names it in the `committed` event (`response_id`)."""
        graph = self.config.to_graph()
        auto = response_settings(self.config, None)
        # A reply its tool choice cannot be had for is not made with the commit: the protocol
        # opens it and fails it (`_start`), without the graph.
        made_with_commit = self.config.type != "transcription" and auto.tool_choice_unmet is None
        graph["auto_reply"] = _reply_params("", auto) if made_with_commit else None
        return graph

    def configure_initial(self, session: dict[str, Any]) -> None:
        """Start from a session config given before the session opens (minted into an ephemeral
        key, or sent with a WebRTC offer). Raises `RealtimeError` when it is not valid."""
        session = {key: value for key, value in session.items() if key not in ("type", "model")}
        if session:
            event = ev.parse_client_event(msgspec.json.encode({"type": "session.update", "session": session}))
            assert isinstance(event, ev.SessionUpdate)
            self._check_instructions(event.session, "session.instructions")
            self.config = apply_update(self.config, event.session, turns_processed=False, audio_produced=False)
            self.negotiation.observe_update(event.session)
            self.config = self._sglang_input_default(self.config)

    def open(self) -> list[Action]:
        self._send("session.created", session=self._session_wire())
        return self._flush()

    def voices_to_look_up(self, event: str | dict[str, Any]) -> list[str]:
        """The names the client event `event` (its text, or a parsed `session.update`) will look
        up in the voice registry. The transport runs `look_up_voice` for each, in a worker
        thread, before it hands the event over (voice_lookups.py)."""
        served = self.config.served
        if self.voice_lookups is None or served is None:
            return []
        if isinstance(event, str):
            if '"voice"' not in event:  # nearly every event (appends): no parse
                return []
            try:
                event = json.loads(event)
            except (ValueError, RecursionError):
                return []  # `receive_text` answers it with `invalid_json`
        return [name for name in voice_names(event) if served.may_be_uploaded(name)]

    def look_up_voice(self, name: str) -> None:
        """Blocking (the registry): call it in a worker thread, then hand the event over."""
        assert self.voice_lookups is not None
        self.voice_lookups.resolve(name)

    # ------------------------------------------------------------------ resume (snapshot.py)

    def load(self, config: SessionConfig, negotiation: Negotiation, items: list[Item], dialect: str | None) -> None:
        """Take a snapshot's session (a new protocol, not yet opened): its settings, what its
        client negotiated, its dialect (None: as the handshake chose) and its conversation."""
        self.config = replace(config, served=self.config.served)
        self.negotiation = negotiation
        if dialect is not None:
            self.dialect.choose(dialect)
        self.items = {item.id: item for item in items}
        self._turns_processed = bool(self.items)

    def detach(self) -> list[Action]:
        """The client's socket dropped and the session waits for a resume: a reply that was
        streaming ends `cancelled`, its item truncated to the audio already sent (the model forgets
        the rest, as after `conversation.item.truncate`); a queued one ends `cancelled`."""
        for response in reversed(list(self.responses.values())):
            item = response.item
            if response.state is ResponseState.IN_PROGRESS:
                self._cancel(response, "client_disconnected")
                if item is not None and item.id in self.items and response.audio:
                    self._on_ConversationItemTruncate(ev.ConversationItemTruncate(item_id=item.id, audio_end_ms=int(item.audio_ms)))
            else:
                self._finish(response, "cancelled")
        return self._flush()

    def resumed(self, kv: str) -> list[Action]:
        """A resumed session's greeting: `session.created` (the same id), then
        `sglang.session.resumed` {session_id, items, kv}."""
        actions = self.open()
        self._send("sglang.session.resumed", session_id=self.session_id, items=[item.to_wire() for item in self.items.values()], kv=kv)
        return actions + self._flush()

    def reject(self, code: str, message: str, close_code: int = CLOSE_TRY_AGAIN) -> list[Action]:
        """The session cannot start (`session_limit_reached`, `model_not_found`...): error, then close."""
        self._error(RealtimeError(code, message, type="server_error" if code == "server_shutting_down" else "invalid_request_error"))
        return self._closing(code, close_code)

    def receive_text(self, text: str | bytes) -> list[Action]:
        if self.state is SessionState.CLOSED:
            return []
        self.last_activity_at = time.time()
        try:
            event = ev.parse_client_event(text)
            self._handle(event)
        except RealtimeError as error:
            self._error(error)
            if error.fatal:
                self._closing(error.code, CLOSE_POLICY)
        return self._flush()

    def receive_binary(self, data: bytes) -> list[Action]:
        if self.state is SessionState.CLOSED:
            return []
        self.last_activity_at = time.time()
        self._error(RealtimeError("binary_frames_unsupported", "Binary frames are not part of this protocol; send JSON text events (audio as base64)."))
        return self._flush()

    def receive_audio(self, samples: Any, sample_rate: int) -> list[Action]:
        """Input audio that arrives already decoded (float32 mono), e.g. a WebRTC media track:
        the path of an `input_audio_buffer.append` after decoding, on the same timeline."""
        if self.state is SessionState.CLOSED or self._input_ended:
            return []
        self.last_activity_at = time.time()
        self._input_audio(samples, sample_rate)
        return self._flush()

    def graph_output(self, message: Message) -> list[Action]:
        if self.state is SessionState.CLOSED:
            return []
        if isinstance(message, NodeEvent):
            self._node_event(message)
        elif isinstance(message, (TextDelta, AudioOut, TurnDone, FunctionCall)):
            response = self._response_for(message)
            if response is not None:
                if response.state is ResponseState.QUEUED:
                    response.held.append(message)
                else:
                    self._reply_output(response, message)
        return self._flush()

    def session_ended(self, reason: str, error: tuple[str, str] | None = None) -> list[Action]:
        if self.state is SessionState.CLOSED:
            return []
        for response in reversed(list(self.responses.values())):  # queued first: none starts meanwhile
            self._finish(response, "failed" if error else "cancelled", reason="session_ended" if not error else None, error=error)
        if error is not None:
            self._error(RealtimeError(error[0], error[1], type="server_error"))
        code = CLOSE_INTERNAL if error else CLOSE_GOING_AWAY if reason == "server_shutdown" else CLOSE_NORMAL
        return self._closing(reason, code)

    def close(self, reason: str, code: int = CLOSE_NORMAL) -> list[Action]:
        """The transport ends the session (client gone, output buffer full...)."""
        if self.state is SessionState.CLOSED:
            return []
        return self._closing(reason, code)

    # ------------------------------------------------------------------ client events

    def _handle(self, event: ev.ClientEvent) -> None:
        try:
            handler = getattr(self, "_on_" + type(event).__name__)
            handler(event)
        except RealtimeError as error:
            error.event_id = event.event_id
            raise

    def _on_SessionUpdate(self, event: ev.SessionUpdate) -> None:
        self._check_instructions(event.session, "session.instructions")
        config = apply_update(self.config, event.session, turns_processed=self._turns_processed, audio_produced=self._audio_produced)
        self.dialect.observe_session_update(event.session)
        self.negotiation.observe_update(event.session)
        self.config = self._sglang_input_default(config)
        graph = self.graph_config()
        self._to_graph(Configure(target=Stage.VAD, config=graph))
        self._to_graph(Configure(target=Stage.DIALOG, config=graph))
        self._send("session.updated", client_event_id=event.event_id, session=self._session_wire())

    def _on_SessionClose(self, event: ev.SessionClose) -> None:
        for response in reversed(list(self.responses.values())):  # queued first: none starts meanwhile
            if response.state is ResponseState.IN_PROGRESS:
                self._cancel(response, "client_closed")
            else:
                self._finish(response, "cancelled")
        self._end_session("client_closed", CLOSE_NORMAL, client_event_id=event.event_id)

    def _session_wire(self) -> dict[str, Any]:
        """The session as `session.created` / `.updated` show it, with sglang-omni's grant."""
        wire = self.config.to_wire(self.session_id)
        wire.setdefault("sglang", {})["granted"] = self.negotiation.grant(self.config, max_image_bytes=self.max_append_chars * 3 // 4)
        return wire

    def _sglang_input_default(self, config: SessionConfig) -> SessionConfig:
        """16 kHz input for an sglang-dialect client that named no rate, until audio fixes the rate."""
        if self.negotiation.rate_fixed:
            return config
        input_format = self.negotiation.default_input(config.input_format)
        return config if input_format is None else replace(config, input_format=input_format)

    def _fix_input_rate(self, sglang_fields: bool) -> None:
        """The first append fixes the input rate; its `sglang` fields mark an sglang-dialect client."""
        if not self.negotiation.rate_fixed:
            self.negotiation.speaks_sglang |= sglang_fields
            self.config = self._sglang_input_default(self.config)
            self.negotiation.rate_fixed = True

    def _on_InputAudioBufferAppend(self, event: ev.InputAudioBufferAppend) -> None:
        seq = event.sglang.seq if event.sglang is not None else None
        if self._input_ended:
            raise RealtimeError("input_audio_ended", "Input audio was ended with sglang.input_audio.end; no more appends are accepted.", "audio")
        if len(event.audio) > self.max_append_chars:
            raise RealtimeError(
                "input_audio_buffer_append_too_large",
                f"One append may carry at most {self.max_append_chars} characters of base64 audio; send smaller chunks.",
                "audio",
            )
        if seq is not None and seq != self._next_seq:
            raise RealtimeError("invalid_seq", f"sglang.seq must be contiguous from 0: expected {self._next_seq}, got {seq}.", "sglang.seq")
        data = decode_base64(event.audio, "audio")
        self._fix_input_rate(event.sglang is not None)
        fmt = self.config.input_format
        if event.sglang is not None:
            check_timeline(event.sglang.t_start_ms, self._input_ms, fmt.rate)
        try:
            samples = decode(data, fmt)
        except InvalidAudio as exc:  # odd byte count; a WAV file whose header disagrees with the format
            raise RealtimeError("invalid_audio", str(exc), "audio") from None
        self._input_audio(samples, fmt.rate)
        if seq is not None:
            self._next_seq += 1
            self._send("sglang.input_audio.accepted", seq=seq, accepted_end_ms=round(self._input_ms, 3), client_event_id=event.event_id)

    def _input_audio(self, samples: Any, sample_rate: int) -> None:
        if len(samples):
            self._to_graph(AudioChunk(samples=samples, sample_rate=sample_rate, media_ms=self._input_ms))
            self._input_ms += len(samples) * 1000.0 / sample_rate
            self.usage.audio_in(len(samples) / sample_rate)

    def _on_InputAudioBufferCommit(self, event: ev.InputAudioBufferCommit) -> None:
        self._to_graph(Commit())

    def _on_InputAudioBufferClear(self, event: ev.InputAudioBufferClear) -> None:
        self._to_graph(Clear())

    def _on_OutputAudioBufferClear(self, event: ev.OutputAudioBufferClear) -> None:
        active = self._active()
        if active is None:
            raise RealtimeError("response_cancel_not_active", "There is no reply audio to clear.")
        self._cancel(active, "client_cancelled")
        self._send("output_audio_buffer.cleared", response_id=active.id)

    def _on_ConversationItemCreate(self, event: ev.ConversationItemCreate) -> None:
        item = event.item
        if item.type == "message" and item.role is None:
            raise RealtimeError("missing_required_parameter", "A message item needs a `role`.", "item.role")
        if item.id is not None and item.id in self.items:
            raise RealtimeError("invalid_value", f"Item id {item.id!r} already exists in the conversation.", "item.id")
        position = self._insert_position(event.previous_item_id)
        item_id = item.id or new_id("item")
        if item.type == "message":
            command, content = item_content(item, item_id, self.config.input_format)
            added = Item(item_id, item.role, content)
        else:
            command, added = self._function_item(item, item_id)
        check_text(command.text, self._bounds.max_text_tokens, "item.content")
        for image in command.images:
            check_image(image, self._bounds.max_image_pixels, "item.content")
        if position is not None:  # the model's history is rebuilt from there
            command.insert_after = [history_key(self.items[key]) for key in reversed(list(self.items)[:position])]
        self._to_graph(command)
        self._turns_processed = True
        if added.type == "message" and added.role == "user":
            self.usage.user_turn()
        self._add_item(added, at=position)

    def _insert_position(self, previous_item_id: str | None) -> int | None:
        """Where a created item goes in the conversation: None = at the end (`previous_item_id`
        missing, null or the last item), 0 for `"root"` (the very start), else after that item."""
        keys = list(self.items)
        if previous_item_id is None or (keys and previous_item_id == keys[-1]):
            return None
        if previous_item_id == "root":
            return 0 if keys else None
        if previous_item_id not in self.items:
            raise RealtimeError("item_not_found", f"Item {previous_item_id!r} does not exist in the conversation.", "previous_item_id")
        return keys.index(previous_item_id) + 1

    def _function_item(self, item: ev.ItemParam, item_id: str) -> tuple[AddItem, Item]:
        """A `function_call_output` (a function's result for the model) or a `function_call` the
        client adds itself: the dialog's `AddItem` and the conversation item."""
        if not item.call_id:
            raise RealtimeError("missing_required_parameter", f"A {item.type} item needs a `call_id`.", "item.call_id")
        if item.type == "function_call_output":
            if item.output is None:
                raise RealtimeError("missing_required_parameter", "A function_call_output item needs an `output`.", "item.output")
            added = Item(item_id, "tool", [], type=item.type, call_id=item.call_id, output=item.output)
            return AddItem(item_id=item_id, role="tool", text=item.output), added
        if not item.name:
            raise RealtimeError("missing_required_parameter", "A function_call item needs a `name`.", "item.name")
        arguments = item.arguments or "{}"
        try:
            json.loads(arguments)
        except (ValueError, RecursionError):
            raise RealtimeError("invalid_value", "`arguments` must be JSON text.", "item.arguments") from None
        added = Item(item_id, "assistant", [], type=item.type, call_id=item.call_id, name=item.name, arguments=arguments)
        return AddItem(item_id=item_id, role="assistant", call={"name": item.name, "arguments": arguments}), added

    def _on_ConversationItemTruncate(self, event: ev.ConversationItemTruncate) -> None:
        item = self._item(event.item_id)
        if item.type != "message" or item.role != "assistant" or item.response_id is None:
            raise RealtimeError("invalid_value", "Only assistant audio items can be truncated.", "item_id")
        if event.content_index != 0:
            raise RealtimeError("invalid_value", "An assistant item has one content part (content_index 0).", "content_index")
        if event.audio_end_ms < 0 or event.audio_end_ms > item.audio_ms + 1:
            raise RealtimeError(
                "invalid_value",
                f"audio_end_ms {event.audio_end_ms} is outside the item's {item.audio_ms:.0f} ms of audio.",
                "audio_end_ms",
            )
        response = self.responses.get(item.response_id)
        if response is not None:
            self._cancel(response, "client_cancelled")
        turn_id = next((t for t, r in self._by_turn.items() if r == item.response_id), -1)
        self._control(Truncate(turn_id=turn_id, response_id=item.response_id, item_id=item.id, audio_end_ms=float(event.audio_end_ms)))
        # What the listener did not hear is forgotten, transcript included (as in GA).
        for part in item.content:
            if "transcript" in part:
                part["transcript"] = ""
        item.audio_ms = float(event.audio_end_ms)
        self._send("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=event.audio_end_ms)

    def _on_ConversationItemDelete(self, event: ev.ConversationItemDelete) -> None:
        item = self._item(event.item_id)
        del self.items[event.item_id]
        # The model forgets it too (its KV is rebuilt from there, in order with the turns).
        self._to_graph(DeleteItem(item_id=item.id, response_id=item.response_id))
        self._send("conversation.item.deleted", item_id=event.item_id)

    def _on_ConversationItemRetrieve(self, event: ev.ConversationItemRetrieve) -> None:
        self._send("conversation.item.retrieved", item=self._item(event.item_id).to_wire())

    def _on_ResponseCreate(self, event: ev.ResponseCreate) -> None:
        self._refuse_in_transcription_session("response.create")
        if self.responses:
            raise RealtimeError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {next(iter(self.responses))}. Wait for response.done.",
            )
        self._check_instructions(event.response, "response.instructions")
        settings = response_settings(self.config, event.response)
        self._create_response(settings)

    def _on_ResponseCancel(self, event: ev.ResponseCancel) -> None:
        active = self._active()
        if active is None or (event.response_id and event.response_id != active.id):
            raise RealtimeError("response_cancel_not_active", "Cancellation failed: no active response found.", "response_id" if event.response_id else None)
        self._cancel(active, "client_cancelled")

    def _on_InputImageAppend(self, event: ev.InputImageAppend) -> None:
        if len(event.image) > self.max_append_chars:
            raise RealtimeError("image_too_large", f"An image may be at most {self.max_append_chars} base64 characters.", "image")
        data = decode_base64(event.image, "image")
        check_image(data, self._bounds.max_image_pixels, "image")
        t_ms = event.sglang.t_ms if event.sglang is not None and event.sglang.t_ms is not None else self._input_ms
        self._to_graph(ImageFrame(image=data, media_ms=float(t_ms)))
        self._send("sglang.input_image.accepted", t_ms=t_ms, unit_id=f"unit_{int(t_ms // NATIVE_UNIT_MS)}", client_event_id=event.event_id)

    def _on_InputAudioEnd(self, event: ev.InputAudioEnd) -> None:
        if self._input_ended:
            raise RealtimeError("input_audio_ended", "Input audio was already ended.")
        self._input_ended = True
        self._end_event_id = event.event_id
        self._to_graph(InputEnd())

    @property
    def _bounds(self) -> ServedModel:
        return self.config.served or _DEFAULT_BOUNDS

    def _check_instructions(self, params: Any, param: str) -> None:
        instructions = getattr(params, "instructions", None) if params is not None else None
        if isinstance(instructions, str):
            check_text(instructions, self._bounds.max_text_tokens, param)

    # ------------------------------------------------------------------ graph output

    def _node_event(self, event: NodeEvent) -> None:
        if isinstance(event, InputSpeechStarted):
            self._send("input_audio_buffer.speech_started", audio_start_ms=int(event.audio_start_ms), item_id=event.item_id)
            detection = self.config.turn_detection
            active = self._active()
            if active is not None and detection is not None and detection.interrupt_response:
                self._cancel(active, "turn_detected")
        elif isinstance(event, (InputSoundStarted, InputSoundDismissed)):
            detection = self.config.turn_detection
            if detection is not None and detection.interrupt_response:
                self._out.append(HoldPlayback(held=isinstance(event, InputSoundStarted)))
        elif isinstance(event, InputSpeechStopped):
            self._send("input_audio_buffer.speech_stopped", audio_end_ms=int(event.audio_end_ms), item_id=event.item_id)
        elif isinstance(event, InputTimeout):
            self._send(
                "input_audio_buffer.timeout_triggered",
                audio_start_ms=int(event.audio_start_ms),
                audio_end_ms=int(event.audio_end_ms),
                item_id=event.item_id,
            )
        elif isinstance(event, InputCommitted):
            self._committed(event)
        elif isinstance(event, InputCleared):
            self._send("input_audio_buffer.cleared")
        elif isinstance(event, TurnQueued):
            self._by_turn[event.turn_id] = event.response_id
            if event.response_id in self.responses:
                self.responses[event.response_id].turn_id = event.turn_id
        elif isinstance(event, InputEnded):
            self._ended_acknowledged = True
            accepted = round(self._input_ms, 3)
            # What the dialog took in: all accepted audio but a last partial VAD window (discarded).
            self._consumed_ms = min(float(event.audio_end_ms), accepted)
            self._send("sglang.input_audio.ended", audio_end_ms=accepted, accepted_end_ms=accepted, tail_policy=TAIL_POLICY,
                       client_event_id=self._end_event_id)
            self._maybe_drained()
        elif isinstance(event, NodeError):
            dropped = self.responses.get(event.response_id)
            if dropped is not None and dropped.state is ResponseState.QUEUED:
                self._advance(dropped, ResponseState.DONE)
            self._error(RealtimeError(event.code, event.message, event.param))
        elif isinstance(event, (TranscriptDelta, TranscriptCompleted, TranscriptFailed)):
            self._transcription_event(event)

    def _committed(self, event: InputCommitted) -> None:
        item_id = event.item_id
        previous = next(reversed(self.items), None)
        self._send("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        content: list[dict[str, Any]] = [{"type": "input_audio", "transcript": None}]
        content += [{"type": "input_image", "image_url": None}] * event.image_count
        self._turns_processed = True
        self.usage.user_turn()
        self._add_item(Item(item_id, "user", content))
        if self.config.type == "transcription":
            return  # transcripts only: the dialog marked the turn for one; no reply
        detection = self.config.turn_detection
        if event.auto_reply and (detection is None or detection.create_response):
            settings = response_settings(self.config, None)
            if event.response_id:  # the dialog made the reply with the commit (`graph_config`)
                response = Response(event.response_id, settings, turn_id=event.turn_id)
                self._by_turn[event.turn_id] = response.id
                self._queue(response)
            else:
                # The reply need not queue behind the audio appended since the commit (on a
                # loaded server, hundreds of ms in the VAD's inbox): it goes to the reply input.
                response = self._create_response(settings, graph_input=self.reply_input)
            if self._transcripts_follow_replies:
                self._reply_of_item[item_id] = response.id

    def _reply_output(self, response: Response, message: Message) -> None:
        if response.state is not ResponseState.IN_PROGRESS:
            return
        if isinstance(message, FunctionCall):
            self._function_call(response, message)
            return
        if isinstance(message, TurnDone):
            self._finish(response, message.status, reason=message.reason, usage=message.usage, transcript=message.transcript)
            return
        if response.item is None:
            return  # a function-call response says nothing
        if isinstance(message, TextDelta):
            response.text.append(message.text)
            response.output_tokens += len(message.token_ids)
            kind = "response.output_audio_transcript.delta" if response.audio else "response.output_text.delta"
            self._send(kind, **self._part_ref(response), delta=message.text)
        elif isinstance(message, AudioOut):
            if not response.audio or response.encoder is None:
                return
            self._audio_produced = True
            self.usage.audio_out(len(message.samples) / message.sample_rate)
            if not self.audio_deltas:
                response.item.audio_ms += len(message.samples) * 1000.0 / message.sample_rate
                self._out.append(SendAudio(response.id, response.item.id, message.samples, message.sample_rate))
                return
            data = response.encoder.encode(message.samples, message.sample_rate)
            response.item.audio_ms = response.encoder.duration_ms
            self._send("response.output_audio.delta", **self._part_ref(response), delta=base64.b64encode(data).decode("ascii"))

    def _function_call(self, response: Response, call: FunctionCall) -> None:
        """A call the reply made: its own output item (after the message item, if any), its
        arguments whole in one delta (they are only known valid once complete)."""
        item = Item(new_id("item"), "assistant", [], status="in_progress", response_id=response.id, type="function_call",
                    call_id=new_id("call"), name=call.name, arguments="")
        index = len(response.output_items)
        response.calls.append(item)
        self._send("response.output_item.added", response_id=response.id, output_index=index, item=item.to_wire())
        if not response.settings.out_of_band:
            self._add_item(item, done=False)
        ref = {"response_id": response.id, "item_id": item.id, "output_index": index, "call_id": item.call_id}
        self._send("response.function_call_arguments.delta", **ref, delta=call.arguments)
        item.arguments, item.status = call.arguments, "completed"
        self._send("response.function_call_arguments.done", **ref, name=call.name, arguments=call.arguments)
        self._send("response.output_item.done", response_id=response.id, output_index=index, item=item.to_wire())
        if not response.settings.out_of_band:
            self._send("conversation.item.done", previous_item_id=self._previous(item.id), item=item.to_wire())

    # ------------------------------------------------------------------ user transcripts

    @property
    def _transcripts_follow_replies(self) -> bool:
        """sglang-omni-v0 clients read a turn's transcript after its reply (compat.py). The pass
        runs once the thinker has made the reply's text, so a spoken reply's audio may still be
        streaming when its transcript is ready."""
        return self.dialect.name == SGLANG_OMNI_V0 and self.config.transcription is not None

    def _transcription_event(self, event: TranscriptDelta | TranscriptCompleted | TranscriptFailed) -> None:
        """A transcript event: sent now, or held while the reply answering its item is open
        (`_transcripts_follow_replies`)."""
        reply = self._reply_of_item.get(event.item_id)
        if reply is not None and reply in self.responses:
            self._held_transcripts.append(event)  # sent by `_flush` once the reply is done
            return
        if not isinstance(event, TranscriptDelta):
            self._reply_of_item.pop(event.item_id, None)
        self._send_transcription_event(event)

    def _release_transcripts(self) -> None:
        """Send the held transcript events whose reply is done (its `response.done` is already out)."""
        held, self._held_transcripts = self._held_transcripts, []
        for event in held:
            self._transcription_event(event)

    def _send_transcription_event(self, event: TranscriptDelta | TranscriptCompleted | TranscriptFailed) -> None:
        """The transcript of a committed user audio item, as the thinker's out-of-band pass reports
        it (nodes/qwen3_omni/transcription.py): deltas, then completed (kept on the item) or failed."""
        ref = {"item_id": event.item_id, "content_index": 0}  # the item's input_audio part
        if isinstance(event, TranscriptDelta):
            self._send("conversation.item.input_audio_transcription.delta", **ref, delta=event.delta)
        elif isinstance(event, TranscriptCompleted):
            item = self.items.get(event.item_id)
            if item is not None and item.content:
                # New objects: events already queued hold the old ones.
                item.content = [{**item.content[0], "transcript": event.transcript}, *item.content[1:]]
            self._send("conversation.item.input_audio_transcription.completed", **ref,
                       transcript=event.transcript, usage=transcription_usage_wire(event.usage))
        else:
            error = {"type": "server_error", "code": event.code, "message": event.message, "param": None}
            self._send("conversation.item.input_audio_transcription.failed", **ref, error=error)

    def _refuse_in_transcription_session(self, event: str) -> None:
        if self.config.type == "transcription":
            raise RealtimeError("unsupported", f"A transcription session makes transcripts only; {event} is not served in it.", "type")

    # ------------------------------------------------------------------ responses

    def _create_response(self, settings: ResponseSettings, graph_input: str = AUDIO_INPUT) -> Response:
        response = Response(new_id("resp"), settings)
        self._turns_processed = True
        if settings.tool_choice_unmet is None:  # else it fails as it starts, in the protocol alone
            self._to_graph(CreateResponse(reply=_reply_params(response.id, settings)), graph_input)
        self._queue(response)
        return response

    def _queue(self, response: Response) -> None:
        self.responses[response.id] = response
        if self._active() is None:
            self._start(response)

    def _active(self) -> Response | None:
        return next((r for r in self.responses.values() if r.state is ResponseState.IN_PROGRESS), None)

    def _advance(self, response: Response, state: ResponseState) -> None:
        """The one place a response changes state."""
        if state not in _TRANSITIONS[response.state]:
            raise AssertionError(f"response {response.id}: {response.state.value} -> {state.value} is not a transition")
        response.state = state
        if state is ResponseState.DONE:
            self.responses.pop(response.id, None)
            self._done.append(response.id)

    def _start(self, response: Response) -> None:
        self._advance(response, ResponseState.IN_PROGRESS)
        settings = response.settings
        self._send("response.created", response=response_wire(self.session_id, response, "in_progress"))
        if settings.tool_choice_unmet is not None:
            # A forced choice accepted before its tools (session_config.py), and still without
            # them: this reply fails, the session goes on. The graph never heard of it.
            message, param = settings.tool_choice_unmet
            self._error(RealtimeError("tool_choice_unmet", message, param))
            self._finish(response, "failed", error=("tool_choice_unmet", message), error_type="invalid_request_error")
            return
        if not settings.forced_call:  # a forced call's output is the call(s) alone: no message item
            self._open_message(response)
        held, response.held = response.held, []
        for message in held:
            self._reply_output(response, message)

    def _open_message(self, response: Response) -> None:
        settings = response.settings
        content = {"type": "output_audio", "transcript": ""} if response.audio else {"type": "output_text", "text": ""}
        response.item = Item(new_id("item"), "assistant", [], status="in_progress", response_id=response.id)
        response.encoder = OutputEncoder(settings.output_format) if response.audio else None
        self._send("response.output_item.added", response_id=response.id, output_index=0, item=response.item.to_wire())
        if not settings.out_of_band:
            self._add_item(response.item, done=False)
        response.item.content.append(content)
        part = {"type": "audio", "transcript": ""} if response.audio else {"type": "text", "text": ""}
        self._send("response.content_part.added", **self._part_ref(response), part=part)

    def _cancel(self, response: Response, reason: str) -> None:
        self._control(Interrupt(turn_id=response.turn_id, response_id=response.id, reason=reason))
        self._finish(response, "cancelled", reason=reason)

    def _finish(
        self,
        response: Response,
        status: str,
        reason: str | None = None,
        usage: Usage | None = None,
        transcript: str = "",
        error: tuple[str, str] | None = None,
        error_type: str = "server_error",
    ) -> None:
        if response.state is ResponseState.QUEUED:
            self._advance(response, ResponseState.DONE)  # never announced: it ends without events
            return
        if response.item is not None:
            self._close_message(response, status, "".join(response.text) or transcript)
        self._advance(response, ResponseState.DONE)
        if usage is None:
            usage = Usage(output_tokens=response.output_tokens, output_text_tokens=response.output_tokens)
        self.usage.reply_done(usage)
        self._send("response.done", response=response_wire(self.session_id, response, status, reason, usage, error, error_type))
        self._start_next()
        self._maybe_drained()

    def _close_message(self, response: Response, status: str, text: str) -> None:
        item = response.item
        assert item is not None
        ref = self._part_ref(response)
        if response.audio:
            tail = response.encoder.flush() if response.encoder is not None and status == "completed" and self.audio_deltas else b""
            if tail:
                self._send("response.output_audio.delta", **ref, delta=base64.b64encode(tail).decode("ascii"))
            self._send("response.output_audio.done", **ref)
            self._send("response.output_audio_transcript.done", **ref, transcript=text)
            item.content[0] = {"type": "output_audio", "transcript": text}
            self._send("response.content_part.done", **ref, part={"type": "audio", "transcript": text})
        else:
            self._send("response.output_text.done", **ref, text=text)
            item.content[0] = {"type": "output_text", "text": text}
            self._send("response.content_part.done", **ref, part={"type": "text", "text": text})
        item.status = "completed" if status == "completed" else "incomplete"
        self._send("response.output_item.done", response_id=response.id, output_index=0, item=item.to_wire())
        if not response.settings.out_of_band and item.id in self.items:
            self._send("conversation.item.done", previous_item_id=self._previous(item.id), item=item.to_wire())

    def _start_next(self) -> None:
        if self.state is SessionState.OPEN and self._active() is None:
            following = next((r for r in self.responses.values() if r.state is ResponseState.QUEUED), None)
            if following is not None:
                self._start(following)

    def _maybe_drained(self) -> None:
        if self._ended_acknowledged and not self.responses and not self._drained_sent:
            self._drained_sent = True
            accepted = round(self._input_ms, 3)
            consumed = round(self._consumed_ms, 3)
            self._send("sglang.input_audio.drained", accepted_end_ms=accepted, consumed_ms=consumed,
                       discarded_ms=round(accepted - consumed, 3), padding_ms=0.0, client_event_id=self._end_event_id)

    def _response_for(self, message: TextDelta | AudioOut | TurnDone | FunctionCall) -> Response | None:
        response_id = message.response_id or self._by_turn.get(message.turn_id, "")
        return self.responses.get(response_id)

    # ------------------------------------------------------------------ helpers

    def _item(self, item_id: str) -> Item:
        item = self.items.get(item_id)
        if item is None:
            raise RealtimeError("item_not_found", f"Item {item_id!r} does not exist in the conversation.", "item_id")
        return item

    def _previous(self, item_id: str) -> str | None:
        keys = list(self.items)
        index = keys.index(item_id)
        return keys[index - 1] if index > 0 else None

    def _add_item(self, item: Item, done: bool = True, at: int | None = None) -> None:
        """Add `item` at the end of the conversation, or at index `at`."""
        entries = list(self.items.items())
        at = len(entries) if at is None else at
        previous = entries[at - 1][0] if at > 0 else None
        entries.insert(at, (item.id, item))
        self.items.clear()
        self.items.update(entries)
        self._send("conversation.item.added", previous_item_id=previous, item=item.to_wire())
        if done:
            self._send("conversation.item.done", previous_item_id=previous, item=item.to_wire())
        self._bound_items()

    def _bound_items(self) -> None:
        """Past `limits.max_conversation_items` the oldest items leave the client's conversation
        (graph/limits.py): `conversation.item.deleted` for each. The model's context has its own
        bound (`session.truncation`), so nothing is rebuilt for them; the newest item always stays."""
        bound = max(1, self.config.served.max_conversation_items if self.config.served is not None else 1024)
        while len(self.items) > bound:
            oldest = next(iter(self.items))
            del self.items[oldest]
            self._reply_of_item.pop(oldest, None)
            self._send("conversation.item.deleted", item_id=oldest)
        while len(self._by_turn) > bound:  # which reply each turn made: the latest turns' only
            del self._by_turn[next(iter(self._by_turn))]

    def _part_ref(self, response: Response) -> dict[str, Any]:
        assert response.item is not None
        return {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}

    def _send(self, kind: str, **fields: Any) -> None:
        self._out.append(SendEvent({"type": kind, "event_id": f"event_{next(self._event_ids)}", **fields}))

    def _error(self, error: RealtimeError) -> None:
        self._send("error", error=error.to_wire())

    def _to_graph(self, message: Message, graph_input: str = AUDIO_INPUT) -> None:
        self._out.append(SendToGraph(message, graph_input))

    def _control(self, control: Control) -> None:
        self._out.append(ControlGraph(control))

    def _closing(self, reason: str, code: int) -> list[Action]:
        self._end_session(reason, code)
        return self._flush()

    def _end_session(self, reason: str, code: int, client_event_id: str | None = None) -> None:
        # `usage`: an extension, what the session used (usage.py)
        self._send("session.closed", reason=reason, client_event_id=client_event_id,
                   usage=msgspec.to_builtins(self.usage.record()))
        self.state = SessionState.CLOSED
        self.close_reason = reason
        self._out.append(CloseSession(code, reason))

    def _flush(self) -> list[Action]:
        if self._held_transcripts and self.state is SessionState.OPEN:
            self._release_transcripts()
        out, self._out = self._out, []
        return out


def history_key(item: Item) -> str:
    """How the model's history names an item: a reply's items by their response id."""
    return item.response_id or item.id
