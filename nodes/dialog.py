"""Dialog: turns the input stream into the conversation's turns.

Input (from the VAD, in order): 16 kHz `AudioChunk`s, `SpeechStarted`/`SpeechPaused`/`SpeechStopped`,
`ImageFrame`s and the transport's commands (graph/messages.py: `Configure`, `Commit`, `Clear`,
`AddItem`, `DeleteItem`, `CreateResponse`, `InputEnd`), dispatched by type. Output:
- `turns`: `Turn`s for the model, each with a turn id this node allocates (the one counter of the
  session, so controls can name a turn): user utterances (16 kHz float32 audio plus the newest
  `max_utterance_frames` images that fell in it), client-created items (`AddItem`, with
  `insert_after` when not at the end), deletions (`DeleteItem`: a `Turn` with `delete_key`),
  and reply requests;
- `events`: `NodeEvent`s for the transport (graph/messages.py: `InputSpeechStarted`,
  `InputSpeechStopped`, `InputCommitted`, `InputCleared`, `InputTimeout`, `TurnQueued`,
  `InputEnded`, `NodeError`, and `InputSoundStarted` / `InputSoundDismissed`).

An utterance runs from speech start minus `prefix_padding_ms` to speech stop (server VAD), or
is everything appended since the last commit/clear (manual mode, `turn_detection: null`).
A sound that starts while a reply is open is not a turn until the VAD confirms it (it lasted
`interrupt_min_speech_ms`): meanwhile only a `sound_started` notice goes out (a transport that
plays the audio itself holds it), and `sound_dismissed` when it ends short (a cough). Confirmed,
it becomes a turn whose `speech_started` carries the sound's true start.
The reply side is the transport's decision: it answers a committed utterance with a
`CreateResponse` command when it wants a reply, except for automatic replies (server VAD with
`create_response`, or `InputEnd`): the transport gives their `ReplyParams` in the config
(`auto_reply`), and the commit makes them itself — the utterance's `Turn` carries the reply (one
turn through preprocessing, the encoders and one thinker prefill, with no round trip through the
transport) and the `committed` event names it (`response_id`). When the
session's config has `transcription`, a committed utterance carries it (`Turn.transcribe`): the
thinker then transcribes it.

Early prefill (server VAD with `create_response` and an `auto_reply`): on the VAD's
`SpeechPaused`, an utterance of at least 100 ms with no reply open is sent ahead as a
*speculative* `Turn` (its audio and images so far, under a private `spec_` item key that never
leaves the engine, and the automatic reply under a provisional `spec_resp_` response id, not
asked for yet; no event). At the `SpeechStopped` the commit goes out as usual, events and all,
but its `Turn` carries no audio or images, only `confirms` = that key and the reply (the same
params, the real response id): the model already heard the utterance up to the pause and its
reply's header. Anything else first retracts the speculation (a `Turn` with `retracts`, no
event): speech resuming (`SpeechPaused(resumed=True)`), a new `SpeechStarted`, a command for the
dialog (before the command acts), an image, the utterance overflowing, a
commit without that same reply (the queue of replies full); that utterance is then committed the
old way, with its full audio.

Bounds, and what the client sees:
- `max_utterance_seconds` (60): server VAD commits the utterance at the bound and ignores speech
  until the next pause; manual mode stops buffering. Either way an `error` notice with code
  `utterance_too_long` (the session stays usable).
- `max_queued_turns` (8): replies waiting behind the one being answered. One more is refused
  with `max_queued_turns_exceeded` (the utterance stays in the conversation, unanswered).
- a commit of less than 100 ms of audio: `input_audio_buffer_commit_empty`.
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import soxr

from graph.messages import (
    AddItem,
    AudioChunk,
    Clear,
    Command,
    Commit,
    Configure,
    CreateResponse,
    DeleteItem,
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
    Message,
    NodeError,
    NodeEvent,
    ReplyParams,
    SpeechDismissed,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Stage,
    Turn,
    TurnQueued,
)
from graph.node import Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.params import DialogParams, decode

RATE = 16000
MIN_COMMIT_MS = 100.0


@dataclass
class Speculation:
    """An utterance sent down the graph early, at a pause (`Turn.speculative`)."""

    key: str  # its private item key, which `confirms` / `retracts` name
    frames: list[ImageFrame]  # the images it carried
    reply: ReplyParams  # the automatic reply it carried, under a provisional response id


@register_node("dialog")
class Dialog(Node):
    params_schema = DialogParams
    inputs = {"events": (AudioChunk, SpeechStarted, SpeechDismissed, SpeechPaused, SpeechStopped, ImageFrame, Command)}
    outputs = {"turns": (Turn,), "events": (NodeEvent,)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = decode(self.params, DialogParams, f"nodes.{self.name}.params")
        self.max_utterance_seconds = settings.max_utterance_seconds
        self.max_queued_turns = settings.max_queued_turns
        self.max_utterance_frames = settings.max_utterance_frames
        self.open_sessions = 0

    def open_session(self, session: SessionInfo) -> NodeSession:
        self.open_sessions += 1
        return DialogSession(self, session)


class DialogSession(NodeSession):
    node: Dialog

    def __init__(self, node: Dialog, session: SessionInfo):
        super().__init__(node, session)
        self.turn_ids = 0
        self.instructions: str | None = None
        self.tools: tuple[dict[str, Any], ...] = ()  # the session's function tools (part of its system prompt)
        # The reply an automatic commit gets (`ReplyParams` without an id; None: the transport
        # sends `CreateResponse` itself, as for any other reply).
        self.auto_reply: ReplyParams | None = None
        self.vad: dict[str, Any] | None = {}
        self.transcription: dict[str, Any] | None = None  # committed audio gets a transcript (Turn.transcribe)
        self._configure(session.config)
        # The prefix ring: the last `prefix_padding_ms` of audio before speech starts.
        self.ring: deque[AudioChunk] = deque()
        self.utterance: list[AudioChunk] = []
        self.utterance_ms = 0.0
        self.utterance_start_ms: float | None = None
        self.item_id: str | None = None  # the user item the current utterance becomes
        self.speaking = False
        self.sound_start_ms: float | None = None  # an unconfirmed sound during a reply began here
        self.sound_held = False  # its `sound_started` went out, its end not yet
        self.overflowed = False  # hit max_utterance_seconds; waiting for the speaker to pause
        self.images: deque[ImageFrame] = deque(maxlen=max(node.max_utterance_frames, 1) * 4)
        self.now_ms = 0.0  # end of the latest audio seen
        self.idle_since_ms = 0.0
        # The replies the graph is working on (graph/replies.py): what bounds queued replies
        # and decides whether a sound during a reply is a turn yet.
        self.replies = session.replies
        self.speculation: Speculation | None = None  # the utterance sent ahead at a pause

    def _configure(self, config: dict[str, Any]) -> None:
        if "instructions" in config:
            self.instructions = config["instructions"] or None
        if "tools" in config:
            self.tools = tuple(config["tools"] or ())
        if "turn_detection" in config:
            self.vad = config["turn_detection"]
        if "transcription" in config:
            self.transcription = config["transcription"]
        if "auto_reply" in config:
            self.auto_reply = config["auto_reply"]

    @property
    def prefix_ms(self) -> float:
        return float((self.vad or {}).get("prefix_padding_ms", 300))

    # ------------------------------------------------------------------ input

    async def on_message(self, stream: str, message: Message, emit) -> None:
        if isinstance(message, AudioChunk):
            await self._audio(message, emit)
        elif isinstance(message, SpeechStarted):
            await self._retract(emit)
            await self._speech_started(message, emit)
        elif isinstance(message, SpeechPaused):
            if message.resumed:
                await self._retract(emit)
            else:
                await self._speculate(message.audio_end_ms, emit)
        elif isinstance(message, SpeechDismissed):
            await self._sound_over(emit)
        elif isinstance(message, SpeechStopped):
            await self._sound_over(emit)
            self.sound_start_ms = None
            if self.speaking and not self.overflowed:
                await emit("events", InputSpeechStopped(audio_end_ms=message.audio_end_ms, item_id=self.item_id))
                await self._commit(emit, auto_reply=True, end_ms=message.audio_end_ms)
            self.speaking = self.overflowed = False
            self.idle_since_ms = message.audio_end_ms
        elif isinstance(message, ImageFrame):
            await self._retract(emit)  # the speculation lacks it; the commit will have it
            self.images.append(message)
        elif isinstance(message, Command) and message.target is Stage.DIALOG:
            await self._retract(emit)
            await self._command(message, emit)

    async def _audio(self, chunk: AudioChunk, emit) -> None:
        duration = len(chunk.samples) * 1000.0 / chunk.sample_rate
        self.now_ms = chunk.media_ms + duration
        if self.vad is None or self.speaking:
            if self.overflowed:
                return
            if self.utterance_start_ms is None:
                self.utterance_start_ms = chunk.media_ms
            self.utterance.append(chunk)
            self.utterance_ms += duration
            if self.utterance_ms > self.node.max_utterance_seconds * 1000.0:
                await self._too_long(emit)
            return
        self.ring.append(chunk)
        # Hold the prefix before an unconfirmed sound too: confirmed, the turn starts there.
        keep_from = min(chunk.media_ms, self.sound_start_ms if self.sound_start_ms is not None else chunk.media_ms)
        while self.ring and self.ring[0].media_ms + self.prefix_ms < keep_from:
            self.ring.popleft()
        await self._idle_check(emit)

    async def _speech_started(self, event: SpeechStarted, emit) -> None:
        if self.vad is None or self.speaking:
            return
        if not event.confirmed and self.replies:
            if self.sound_start_ms is None:
                self.sound_start_ms = event.audio_start_ms
                self.sound_held = True
                await emit("events", InputSoundStarted(audio_start_ms=event.audio_start_ms))
            return
        self.sound_start_ms = None
        self.sound_held = False
        self.speaking = True
        start = max(0.0, event.audio_start_ms - self.prefix_ms)
        self.utterance = [c for c in self.ring if c.media_ms + len(c.samples) * 1000.0 / RATE > start]
        self.utterance_ms = sum(len(c.samples) for c in self.utterance) * 1000.0 / RATE
        self.utterance_start_ms = self.utterance[0].media_ms if self.utterance else event.audio_start_ms
        self.ring.clear()
        self.item_id = _item_id()
        await emit("events", InputSpeechStarted(audio_start_ms=self.utterance_start_ms, item_id=self.item_id))

    async def _sound_over(self, emit) -> None:
        if self.sound_held:
            self.sound_held = False
            await emit("events", InputSoundDismissed())

    async def _too_long(self, emit) -> None:
        await self._retract(emit)
        limit = self.node.max_utterance_seconds
        await self._error(emit, "utterance_too_long", f"An utterance may be at most {limit:g} s of audio; it was committed at the limit.")
        if self.vad is None:
            # Manual mode: keep what fits, drop the rest until the client commits or clears.
            self.overflowed = True
            return
        await self._commit(emit, auto_reply=True)
        self.overflowed = True

    async def _idle_check(self, emit) -> None:
        if self.replies:
            self.idle_since_ms = self.now_ms  # the idle time starts when the last reply ends
            return
        timeout = (self.vad or {}).get("idle_timeout_ms")
        if not timeout or self.speaking or self.now_ms - self.idle_since_ms < timeout:
            return
        item_id = _item_id()
        await emit(
            "events",
            InputTimeout(audio_start_ms=self.idle_since_ms, audio_end_ms=self.now_ms, item_id=item_id),
        )
        self.item_id = item_id
        self.idle_since_ms = self.now_ms
        await self._commit(emit, auto_reply=True, allow_empty=True)

    # ------------------------------------------------------------------ commands

    async def _command(self, command: Command, emit) -> None:
        if isinstance(command, Configure):
            was_manual = self.vad is None
            self._configure(command.config)
            if was_manual != (self.vad is None):
                self._reset_utterance()
        elif isinstance(command, Commit):
            if await self._commit(emit, auto_reply=False):
                self.speaking = False  # a commit ends the utterance; speech goes on only after the next start
        elif isinstance(command, Clear):
            self._reset_utterance()
            self.ring.clear()
            self.speaking = False
            await emit("events", InputCleared())
        elif isinstance(command, AddItem):
            audio = command.audio
            if audio is not None and command.sample_rate != RATE:
                audio = soxr.resample(np.asarray(audio, np.float32), command.sample_rate, RATE, quality="HQ")
            await emit(
                "turns",
                Turn(
                    turn_id=self._next_turn(),
                    item_id=command.item_id,
                    role=command.role,
                    text=command.text,
                    call=command.call,
                    audio=audio,
                    images=list(command.images),
                    instructions=self.instructions,
                    tools=self.tools,
                    media_ms=self.now_ms,
                    insert_after=command.insert_after,
                ),
            )
        elif isinstance(command, DeleteItem):
            # The model forgets the item too: a reply's item by its response id (thinker_history.py).
            await emit(
                "turns",
                Turn(
                    turn_id=self._next_turn(),
                    item_id=command.item_id,
                    delete_key=command.response_id or command.item_id,
                    instructions=self.instructions,
                    tools=self.tools,
                    media_ms=self.now_ms,
                ),
            )
        elif isinstance(command, CreateResponse):
            await self._create_response(command.reply, emit)
        elif isinstance(command, InputEnd):
            # What is left of the input becomes a last turn (less than 100 ms is dropped quietly).
            if self.utterance_ms >= MIN_COMMIT_MS and (self.speaking or self.vad is None):
                if self.speaking:
                    await emit("events", InputSpeechStopped(audio_end_ms=self.now_ms, item_id=self.item_id))
                await self._commit(emit, auto_reply=True)
            self.speaking = False
            await emit("events", InputEnded(audio_end_ms=self.now_ms))

    async def _create_response(self, reply: ReplyParams, emit) -> None:
        if self.replies.cancelled_ahead(reply.response_id):
            return
        if len(self.replies) > self.node.max_queued_turns:
            await self._error(
                emit,
                "max_queued_turns_exceeded",
                f"More than {self.node.max_queued_turns} turns are waiting for a reply; this one stays unanswered.",
                response_id=reply.response_id,
            )
            return
        turn_id = self._next_turn()
        await emit("turns", Turn(turn_id=turn_id, reply=reply, instructions=self.instructions,
                    tools=self.tools, media_ms=self.now_ms))
        await emit("events", TurnQueued(turn_id=turn_id, response_id=reply.response_id))

    async def _commit(self, emit, auto_reply: bool, end_ms: float | None = None, allow_empty: bool = False) -> bool:
        audio_ms = self.utterance_ms
        if audio_ms < MIN_COMMIT_MS and not allow_empty:
            await self._error(
                emit,
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS:g}ms of audio, but buffer only has {audio_ms:.2f}ms of audio.",
            )
            return False
        start = self.utterance_start_ms if self.utterance_start_ms is not None else self.now_ms
        end = end_ms if end_ms is not None else self.now_ms
        frames = self._frames(start, end)
        awaited = auto_reply and bool((self.vad or {}).get("create_response", True))
        # The automatic reply goes with its utterance, as one turn (one prefill); when the queue
        # of replies is full, the transport's `CreateResponse` meets the refusal instead.
        reply = None
        if awaited and self.auto_reply is not None and len(self.replies) <= self.node.max_queued_turns:
            reply = msgspec.structs.replace(self.auto_reply, response_id=_response_id())
        confirms = await self._confirmable(frames, reply, emit)
        # A confirmed speculation's audio, images and reply header are in the model already.
        audio = self._utterance_audio() if confirms is None else None
        item_id = self.item_id or _item_id()
        turn_id = self._next_turn()
        await emit(
            "turns",
            Turn(
                turn_id=turn_id,
                item_id=item_id,
                role="user",
                audio=audio,
                images=[f.image for f in frames] if confirms is None else [],
                instructions=self.instructions,
                tools=self.tools,
                media_ms=start,
                reply=reply,
                awaited=awaited,
                transcribe=self.transcription if audio is not None or confirms is not None else None,
                confirms=confirms,
            ),
        )
        await emit(
            "events",
            InputCommitted(turn_id=turn_id, item_id=item_id, audio_ms=audio_ms, image_count=len(frames),
                           auto_reply=auto_reply, response_id=reply.response_id if reply is not None else ""),
        )
        self._reset_utterance()
        return True

    def _frames(self, start: float, end: float) -> list[ImageFrame]:
        return [f for f in self.images if start <= f.media_ms <= end][-self.node.max_utterance_frames :]

    def _utterance_audio(self) -> np.ndarray | None:
        return np.concatenate([c.samples for c in self.utterance]).astype(np.float32) if self.utterance else None

    # ------------------------------------------------------------------ early prefill

    async def _speculate(self, pause_ms: float, emit) -> None:
        """At a pause, send the utterance so far ahead under a private key, with the automatic
        reply under a provisional response id (nothing to the client; no reply is open)."""
        vad = self.vad
        if vad is None or not vad.get("create_response", True) or self.auto_reply is None:
            return
        if not self.speaking or self.overflowed or self.replies or self.speculation is not None:
            return
        if self.utterance_ms < MIN_COMMIT_MS or self.utterance_start_ms is None:
            return
        start = self.utterance_start_ms
        frames = self._frames(start, pause_ms)
        token = secrets.token_hex(10)
        key = f"spec_{token}"
        # Its confirm brings the same params under the real id (`_confirmable`).
        reply = msgspec.structs.replace(self.auto_reply, response_id=f"spec_resp_{token}")
        await emit(
            "turns",
            Turn(
                turn_id=self._next_turn(),
                item_id=key,
                role="user",
                audio=self._utterance_audio(),
                images=[f.image for f in frames],
                instructions=self.instructions,
                tools=self.tools,
                media_ms=start,
                reply=reply,
                speculative=True,
            ),
        )
        self.speculation = Speculation(key, frames, reply)

    async def _confirmable(self, frames: list[ImageFrame], reply: ReplyParams | None, emit) -> str | None:
        """The speculation the commit confirms; retracted instead where its images or its reply
        differ (a commit without reply must not have the reply header the model holds)."""
        speculation = self.speculation
        if speculation is None:
            return None
        same_reply = reply is not None and reply == msgspec.structs.replace(speculation.reply, response_id=reply.response_id)
        if not same_reply or frames != speculation.frames:
            await self._retract(emit)
            return None
        self.speculation = None
        return speculation.key

    async def _retract(self, emit) -> None:
        if self.speculation is None:
            return
        key, self.speculation = self.speculation.key, None
        # Content-free: preprocessing passes it without compute, the model only restores.
        await emit("turns", Turn(turn_id=self._next_turn(), retracts=key, media_ms=self.now_ms))

    def _reset_utterance(self) -> None:
        self.utterance = []
        self.utterance_ms = 0.0
        self.utterance_start_ms = None
        self.item_id = None
        self.overflowed = False

    async def _error(self, emit, code: str, message: str, response_id: str = "") -> None:
        await emit("events", NodeError(code=code, message=message, response_id=response_id))

    def _next_turn(self) -> int:
        self.turn_ids += 1
        return self.turn_ids

    async def close(self) -> None:
        self.node.open_sessions -= 1
        self.speculation = None
        self._reset_utterance()
        self.ring.clear()
        self.images.clear()


def _response_id() -> str:
    return f"resp_{secrets.token_hex(10)}"  # the transport's own form (session_server/realtime/conversation.py)


def _item_id() -> str:
    return f"item_{secrets.token_hex(10)}"
