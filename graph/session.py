"""One live instance of the graph for one session.

Each node gets a `NodeSession` and one task that takes messages from its bounded inbox in order.
Data flows one way along the spec's edges; what reaches a declared output lands in the session's
output inbox, which the transport reads with `outputs()`.

Controls overtake data: `control()` first purges the cancelled turn's queued data from every
edge, then hands the control to every node session synchronously, so an interrupt takes effect
before any message queued ahead of it is handled.

Failure isolation: an exception in one node ends this session only, with `error` set to a
(code, message) the transport can report; other sessions and the server keep running.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from graph.background import spawn
from graph.edges import Inbox, InboxClosed
from graph.errors import NodeFailure
from graph.executor import PRIORITY_REALTIME, PRIORITY_SPEECH, current_due, current_phase, current_priority, current_release
from graph.messages import (
    AudioChunk,
    AudioOut,
    Close,
    CodecFrames,
    Command,
    Control,
    HiddenChunk,
    InputSpeechStopped,
    Interrupt,
    Message,
    NodeEvent,
    TextDelta,
    Turn,
    TurnDone,
)
from graph.metrics import GraphMetrics
from graph.node import Node, NodeSession, SessionInfo
from graph.spec import GraphSpec, Port
from graph.unit_trace import UnitTrace

log = logging.getLogger("graph.session")

# Messages that report on a turn are never purged by an interrupt: the client must still learn
# how the turn ended. Nor are the transport's commands (a `CreateResponse` the interrupt
# overtook is refused by the dialog, which learns of the cancel from `Replies`).
_NEVER_PURGED = (TurnDone, NodeEvent, Command)


# Before a reply's first audio: how much later each stage further from the listener is due.
FIRST_AUDIO_STAGE_S = 0.00005


class PlaybackClock:
    """When this session's reply-side compute is due (graph/executor.py schedules by it).

    A listener starts playing at the reply's first audio and plays in real time, so it runs dry
    at first audio + seconds sent. Its next chunk is due `margin_s` before the reply was asked
    for + seconds sent: counted from the request, not from the first audio, so a reply whose first
    audio came late (a burst of turns) keeps the place in line it had while its listener waited,
    instead of starving behind turns asked for after it (docs/batching.md, rule 2). Before its first
    audio the listener is already waiting, as if it ran dry when the reply was asked for: the
    reply's work is due `margin_s` before that, and the stage nearer the listener goes first.
    So the oldest waiting turn gets its first audio first, and a turn that just arrived goes
    before a reply that has started playing and still has audio buffered. An utterance prefilled
    in its pause (early prefill: `utterance_paused`) is due as if its reply were asked for when the
    pause came: its turn will most likely end within the pause, and then its listener waits
    (due when submitted, it waited behind every reply building up its buffer and was sometimes
    not prefilled when its turn ended). With `lookahead_s`
    (live sessions; profile `compute: {lookahead_ms}`), work is released `lookahead_s` before it
    is due, so the listener is never more than margin + lookahead ahead.
    """

    def __init__(self, margin_s: float = 0.2, lookahead_s: float | None = None):
        self.margin_s = margin_s
        self.lookahead_s = lookahead_s
        self._paused_at: float | None = None
        self._requested_at: float | None = None
        self._started_at: float | None = None
        self._seconds = 0.0

    def utterance_paused(self) -> None:
        """An utterance is prefilled in its pause (early prefill): its turn is expected to end
        within the pause, so its work is due as if asked for now (see `due`)."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def utterance_resumed(self) -> None:
        """The paused utterance went on (its early prefill was retracted)."""
        self._paused_at = None

    def reply_requested(self) -> None:
        self._paused_at = None
        if self._requested_at is None:
            self._requested_at = time.monotonic()

    def audio_sent(self, seconds: float) -> None:
        if self._started_at is None:
            self._started_at = time.monotonic()
        self._seconds += seconds

    def reply_ended(self) -> None:
        self._requested_at = self._started_at = None
        self._seconds = 0.0

    def phase(self) -> str:
        """Of the reply now: "first" (asked for, no audio yet), "playing", or "unasked"."""
        if self._started_at is not None:
            return "playing"
        return "first" if self._requested_at is not None else "unasked"

    def due(self, stages_out: int = 0) -> float:
        """`stages_out`: of the stage asking (its distance from the listener, `Wiring.stages_out`).
        Before the first audio every stage of the reply is due at once; there the stage nearer the
        listener goes first (`FIRST_AUDIO_STAGE_S` per stage), so the turn that has waited
        longest is finished before a later stage of it, or of a turn asked for just after,
        starts. Once audio plays, stages tie and batch freely."""
        if self._started_at is not None:
            anchor = self._started_at if self._requested_at is None else self._requested_at
            return anchor + self._seconds - self.margin_s
        asked = self._requested_at if self._requested_at is not None else self._paused_at
        if asked is not None:  # a reply asked for, or as if asked for at the pause
            return asked - self.margin_s + stages_out * FIRST_AUDIO_STAGE_S
        return time.monotonic()

    def release(self) -> float:
        """Before when reply work must not start: `lookahead_s` before it is due once the reply
        plays (it is made at most that far ahead of the listener); before its first audio, or
        without a lookahead, at once."""
        if self._started_at is None or self.lookahead_s is None:
            return -math.inf
        return self.due() - self.lookahead_s


@dataclass(frozen=True)
class Wiring:
    """The spec's edges resolved once at startup, shared by every session."""

    routes: dict[tuple[str, str], tuple[Port, ...]]
    outputs: frozenset[tuple[str, str]]
    inputs: dict[str, Port]
    # The nodes that messages put into each input can reach.
    reach: dict[str, frozenset[str]]
    # Each node's stages from the listener: the longest path from it to the last node on the way
    # out (code2wav 0, talker 1, thinker 2...). Before a reply's first audio, a stage nearer the
    # listener goes first (PlaybackClock.due).
    stages_out: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: GraphSpec) -> Wiring:
        routes: dict[tuple[str, str], list[Port]] = {}
        for edge in spec.edges:
            routes.setdefault((edge.source.node, edge.source.stream), []).append(edge.target)
        downstream: dict[str, set[str]] = {}
        for edge in spec.edges:
            downstream.setdefault(edge.source.node, set()).add(edge.target.node)

        def reach(node: str) -> frozenset[str]:
            reached, pending = set(), [node]
            while pending:
                if (current := pending.pop()) not in reached:
                    reached.add(current)
                    pending += downstream.get(current, ())
            return frozenset(reached)

        def stages_out(node: str, seen: frozenset[str] = frozenset()) -> int:
            after = [stages_out(d, seen | {node}) for d in downstream.get(node, ()) if d not in seen and d != node]
            return 1 + max(after) if after else 0

        return cls(
            routes={key: tuple(targets) for key, targets in routes.items()},
            outputs=frozenset((port.node, port.stream) for port in spec.outputs),
            inputs=dict(spec.inputs),
            reach={name: reach(port.node) for name, port in spec.inputs.items()},
            stages_out={name: stages_out(name) for name in spec.nodes},
        )

    def reached_from(self, inputs: Collection[str]) -> frozenset[str]:
        """The nodes that messages put into `inputs` can reach: all a session using them needs."""
        return frozenset().union(*(self.reach[name] for name in inputs))


def offer(session: Any, input_name: str, message: Message) -> bool:
    """`send_nowait` for a transport that keeps its own queue behind it: False, nothing sent, when
    the input is full now, the session has ended or it has no such input. The transport's queued
    `send` meets the same and deals with it, in order (`GraphInputs`)."""
    try:
        return session.send_nowait(input_name, message)
    except (RuntimeError, KeyError):
        return False


class GraphInputs:
    """A transport's way into its graph session, the same for every link (session_server/realtime:
    the WebSocket's, a call's): an input goes straight in (`offer`) while the graph has room and
    nothing waits ahead of it, else it is queued, and `feed` sends the queue in order, waiting for
    room. So the transport never awaits the graph where it reads its wire, and the order holds.

    `limit` (None: no bound): past it `put` refuses (nothing queued) and the transport decides
    what that means (a call ends); a transport that can stop reading its wire bounds the queue
    itself instead, waiting on `changed` while it is too long (the WebSocket's backpressure).
    """

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self._queue: collections.deque[tuple[str, Message]] = collections.deque()
        self._changed = asyncio.Event()
        self._feeding = False  # `feed` holds an input that waits for room: later ones queue behind it

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, session: Any, input_name: str, message: Message) -> bool:
        """Send now or queue; False when `limit` inputs wait already (nothing queued)."""
        if not self._queue and not self._feeding and session is not None and offer(session, input_name, message):
            return True
        if self.limit is not None and len(self._queue) >= self.limit:
            return False
        self._queue.append((input_name, message))
        self._changed.set()
        return True

    async def changed(self) -> None:
        """Wait for an input to be queued or taken off the queue."""
        self._changed.clear()
        await self._changed.wait()

    async def feed(self, session: Any) -> None:
        """Send the queued inputs in order, each when its input has room; returns when the
        session has ended (its outputs say why)."""
        while True:
            while not self._queue:
                await self.changed()
            input_name, message = self._queue.popleft()
            self._changed.set()
            self._feeding = True
            try:
                await session.send(input_name, message)
            except RuntimeError:
                return
            finally:
                self._feeding = False


class GraphSession:
    def __init__(
        self,
        info: SessionInfo,
        nodes: dict[str, Node],
        wiring: Wiring,
        edge_capacity: int,
        output_capacity: int,
        metrics: GraphMetrics,
        on_closed: Callable[[GraphSession], None] = lambda session: None,
        lookahead_s: float | None = None,
        trace: UnitTrace | None = None,
    ):
        self.info = info
        self.id = info.session_id
        self.kind = info.kind
        self._nodes = nodes
        self._wiring = wiring
        self._metrics = metrics
        self._on_closed = on_closed
        self._inboxes: dict[str, Inbox[tuple[str, Message]]] = {name: Inbox(edge_capacity) for name in nodes}
        self._output: Inbox[Message] = Inbox(output_capacity)
        self._node_sessions: dict[str, NodeSession] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self.error: tuple[str, str] | None = None
        self.started_at = time.monotonic()
        self.last_input_at = self.started_at
        # The replies asked for and not yet finished (graph/replies.py). Shutdown waits for them.
        self.replies = info.replies
        self.turns = 0
        self.playback = PlaybackClock(lookahead_s=lookahead_s)
        self._trace = trace

    @property
    def failed(self) -> bool:
        return self.error is not None

    async def start(self) -> None:
        try:
            for name, node in self._nodes.items():
                self._node_sessions[name] = node.open_session(self.info)
        except BaseException:
            await self._close_node_sessions()
            raise
        for name in self._nodes:
            self._tasks.append(asyncio.create_task(self._run_node(name), name=f"{self.id}:{name}"))

    # ------------------------------------------------------------------ transport side

    async def send(self, input_name: str, message: Message) -> None:
        """Put a message into a graph input. Waits while that input's edge is full."""
        inbox, stream = self._input(input_name)
        self._accepted(message)
        try:
            await inbox.put((stream, message))
        except InboxClosed:
            raise RuntimeError(f"session {self.id} is closed") from None

    def send_nowait(self, input_name: str, message: Message) -> bool:
        """`send` if the input's edge has room now; False (nothing sent) if it is full."""
        inbox, stream = self._input(input_name)
        try:
            sent = inbox.put_nowait((stream, message))
        except InboxClosed:
            raise RuntimeError(f"session {self.id} is closed") from None
        if sent:
            self._accepted(message)
        return sent

    def _input(self, input_name: str) -> tuple[Inbox[tuple[str, Message]], str]:
        port = self._wiring.inputs.get(input_name)
        if port is None or port.node not in self._inboxes:
            raise KeyError(f"graph has no input {input_name!r}" if port is None else f"this session does not use input {input_name!r}")
        if self._closing:
            raise RuntimeError(f"session {self.id} is closed")
        return self._inboxes[port.node], port.stream

    def _accepted(self, message: Message) -> None:
        self.last_input_at = time.monotonic()
        message.session_id = self.id
        if isinstance(message, AudioChunk) and message.received_at is None:
            message.received_at = self.last_input_at
        self._track_turn(message)

    def control(self, control: Control) -> None:
        """Deliver a control to every node now, ahead of queued data."""
        if self._closing:
            return
        control.session_id = self.id
        if isinstance(control, Interrupt):
            self.replies.interrupted(control)
            dropped = [m for inbox in self._inboxes.values() for _, m in inbox.purge(lambda item: belongs_to(item[1], control))]
            dropped += self._output.purge(lambda message: belongs_to(message, control))
            for message in dropped:
                # A reply request dropped before any node saw it will never produce a TurnDone.
                if _requests_reply(message):
                    self.replies.ended(message.turn_id, message.reply.response_id)
            if dropped:
                log.debug("session %s: interrupt dropped %d queued messages", self.id, len(dropped))
            self.playback.reply_ended()  # the listener drops what it had buffered
        for name, node_session in self._node_sessions.items():
            try:
                node_session.on_control(control)
            except Exception as exc:  # noqa: BLE001 - one session's node must not take others down
                self._fail(name, exc)
                return
        if isinstance(control, Close):
            spawn(self.close(control.reason), name=f"{self.id}:close")

    async def outputs(self) -> AsyncIterator[Message]:
        """Messages from the graph's outputs, in order; ends once the session has ended."""
        while True:
            try:
                yield await self._output.get()
            except InboxClosed:
                return

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each node's inbox (for metrics)."""
        return {name: len(inbox) for name, inbox in self._inboxes.items()}

    async def wait_replies_done(self) -> None:
        await self.replies.wait_all_ended()

    def warms_ahead(self) -> bool:
        """Whether a node of this session starts its turns' first stages before they end (see
        `NodeSession.warms_ahead`): then keep-warm need not run for it."""
        return any(node_session.warms_ahead() for node_session in self._node_sessions.values())

    async def close(self, reason: str = "closed") -> None:
        """End the session and free everything its nodes hold. Idempotent."""
        if self._closing:
            await self.ended.wait()
            return
        self._closing = True
        self.end_reason = reason
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
        await self._close_node_sessions()
        for inbox in self._inboxes.values():
            inbox.close()
        self._output.close()
        self.replies.close()
        self.ended.set()
        self._on_closed(self)

    # ------------------------------------------------------------------ node side

    async def _run_node(self, name: str) -> None:
        # This task's compute (and that of tasks the node starts from here) runs at the session's
        # priority: speech requests after live sessions.
        current_priority.set(PRIORITY_SPEECH if self.kind == "speech" else PRIORITY_REALTIME)
        if self._nodes[name].follows_playback:
            current_due.set(functools.partial(self.playback.due, self._wiring.stages_out.get(name, 0)))
            current_release.set(self.playback.release)
            current_phase.set(self.playback.phase)
        inbox = self._inboxes[name]
        node_session = self._node_sessions[name]
        emit = self._emitter(name)
        try:
            while True:
                try:
                    stream, message = await inbox.get()
                except InboxClosed:
                    return
                started = time.perf_counter()
                if self._trace is not None and not isinstance(message, _STREAMED):
                    self._trace.hop(self.id, name, message)
                await node_session.on_message(stream, message, emit)
                self._metrics.node_step(name, time.perf_counter() - started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this session
            self._fail(name, exc)

    def _emitter(self, name: str):
        declared = self._nodes[name].outputs
        routes = self._wiring.routes
        outputs = self._wiring.outputs

        async def emit(stream: str, message: Message) -> None:
            if stream not in declared:
                raise ValueError(f"node {name!r} emitted on undeclared stream {stream!r}")
            message.session_id = self.id
            self._track_turn(message)
            for target in routes.get((name, stream), ()):
                await self._inboxes[target.node].put((target.stream, message))
            if (name, stream) in outputs:
                if isinstance(message, AudioOut):
                    self.playback.audio_sent(len(message.samples) / message.sample_rate)
                    if self._trace is not None:
                        self._trace.audio(self.id)
                elif isinstance(message, TurnDone):
                    self.replies.ended(message.turn_id, message.response_id)
                    self.playback.reply_ended()
                elif self._trace is not None and isinstance(message, InputSpeechStopped):
                    self._trace.speech_stopped(self.id)
                await self._output.put(message)

        return emit

    def _track_turn(self, message: Message) -> None:
        """What a turn entering the graph or leaving a node tells the playback clock and the ledger:
        an utterance paused or resumed (early prefill), a reply asked for."""
        if not isinstance(message, Turn):
            return
        if message.speculative:  # an early prefill's provisional reply is asked for only by the turn confirming it
            self.playback.utterance_paused()
            return
        if message.retracts is not None:
            self.playback.utterance_resumed()
        if message.awaited or message.reply is not None:
            self.playback.reply_requested()
        if message.reply is not None:
            self.replies.asked(message.turn_id, message.reply.response_id)
            self.turns += 1

    def _fail(self, node: str, exc: Exception) -> None:
        if self._closing:
            return
        if isinstance(exc, NodeFailure):
            self.error = (exc.code, exc.message)
        else:
            log.exception("session %s: node %r failed", self.id, node, exc_info=exc)
            self.error = ("internal_error", f"node {node!r} failed: {type(exc).__name__}: {exc}")
        spawn(self.close(f"error: {self.error[0]}"), name=f"{self.id}:close")

    async def _close_node_sessions(self) -> None:
        for name, node_session in self._node_sessions.items():
            try:
                await node_session.close()
            except Exception:  # noqa: BLE001 - keep freeing the others
                log.exception("session %s: closing node %r failed", self.id, name)
        self._node_sessions.clear()


# What a unit trace leaves out of its hops (graph/unit_trace.py): the streamed data.
_STREAMED = (AudioChunk, HiddenChunk, CodecFrames, TextDelta, AudioOut)


def _requests_reply(message: Message) -> bool:
    """A turn that asks for a reply (an early prefill's provisional one is not asked for yet)."""
    return isinstance(message, Turn) and message.reply is not None and not message.speculative


def belongs_to(message: Message, interrupt: Interrupt) -> bool:
    if isinstance(message, _NEVER_PURGED):
        return False
    if interrupt.turn_id >= 0 and message.turn_id == interrupt.turn_id:
        return True
    return bool(interrupt.response_id) and getattr(message, "response_id", None) == interrupt.response_id
