"""A call on the realtime protocol core: the link shared by the wires whose reply audio is media.

    wire (WebRTC track, phone line) --receive_audio--> protocol --> SendToGraph --feeder--> graph
    graph outputs --pump--> protocol --> SendAudio --> ReplyOutput (paced by the wire)
                                     \\-> server events --> sidebands (+ the wire's event channel)

A WebRTC call (webrtc/call.py) and a phone call (telephony/phone_call.py) run the core with
`audio_deltas=False`: reply audio leaves as `SendAudio` into an outbound queue that the wire
drains in real time, not as events. `CallLink` is what both do with the core's actions:

- the graph: inputs go in through graph/session.py's `GraphInputs` (straight in when the graph
  has room and nothing waits ahead of it, else queued in order to one feeder task; past
  `MAX_PENDING_INPUTS` the call ends with `input_backlog_full`), outputs pumped back into the
  core, controls sent at once;
- barge-in: the core's Interrupt (speech during a reply, `response.cancel`) clears the reply
  output, so its next frame is silence; speech while a finished reply is still playing clears
  it too, and the item is truncated to what was played (`conversation.item.truncate`, after
  the core has handled the speech). A sound that may be a barge-in only holds the output
  (`HoldPlayback`);
- time to first audio (first_audio.py, as on the WebSocket: from the end of the user's turn to
  the reply's first frame leaving) and `output_audio_buffer.started` / `.stopped`;
- sidebands (webrtc/sideband.py): listeners that get every server event;
- lifetime: `close(reason)` is idempotent and releases everything (tasks, graph session, the
  wire's own resources); `on_closed(call)` then forgets the call in its registries.

A subclass keeps only what its wire needs: how it clears the far end (`_clear_audio`), what a
reply's end means to it (`_reply_done`), where events go besides the sidebands (`_deliver`),
and what it releases at the end (`_release`). (The WebSocket has its own link,
websocket_link.py: its reply audio is events, and it has a socket's backpressure.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any, ClassVar, Protocol

import numpy as np

from graph.messages import Interrupt
from graph.session import GraphInputs
from session_server.realtime.first_audio import FirstAudio
from session_server.realtime.protocol import (
    CLOSE_POLICY,
    Action,
    CloseSession,
    ControlGraph,
    HoldPlayback,
    RealtimeProtocol,
    SendAudio,
    SendEvent,
    SendToGraph,
)

# Client messages queued toward the graph; past it the call ends (`input_backlog_full`).
MAX_PENDING_INPUTS = 1024
# Responses whose assistant item a call remembers (older ones are forgotten).
MAX_RECENT_RESPONSES = 64


class ReplyOutput(Protocol):
    """A call's outbound queue of reply audio, drained by its wire in real time (a WebRTC
    track, a phone line's 20 ms clock)."""

    @property
    def playing(self) -> str | None:
        """The response whose audio is leaving now, if any."""

    def push(self, response_id: str, samples: np.ndarray, sample_rate: int) -> None:
        """Queue reply audio of `response_id` (float32 mono at `sample_rate`)."""

    def hold(self, held: bool) -> None:
        """Pause the reply audio (True) or play on from where it paused (False)."""

    def clear(self) -> str | None:
        """Drop everything queued now; returns the response that was audible (or queued), if any."""

    def played_ms(self, response_id: str) -> float:
        """How much of `response_id`'s audio has left (what the listener can have heard)."""


class CallLink:
    transport: str  # the metrics' label: "webrtc"; a phone call's wire ("twilio", "sip")
    event_prefix: ClassVar[str]  # of the event ids of the events the call sends itself
    log: ClassVar[logging.Logger]

    def __init__(self, call_id: str, protocol: RealtimeProtocol, output: ReplyOutput, on_closed=lambda call: None,
                 metrics: Any = None):
        self.id = call_id
        self.protocol = protocol
        self.output = output
        self._first_audio = FirstAudio(metrics)  # metrics: anything with `first_audio(transport, seconds)`
        self.graph: Any = None  # the GraphSession, set by `start`
        self.closed = asyncio.Event()
        self.close_reason: str | None = None
        # Listeners with `deliver(text)` and `call_ended(reason)` (webrtc/sideband.py): each gets
        # every server event, and may send client events through the wire's `receive_client_message`.
        self.sidebands: set[Any] = set()
        self.trace: Any = None  # the turn traces (session_server/tracing.py), when on
        self._on_closed = on_closed
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._inputs = GraphInputs(limit=MAX_PENDING_INPUTS)
        self._item_of: dict[str, str] = {}  # response id -> its assistant item id
        self._event_ids = itertools.count(1)

    def start(self, graph: Any) -> None:
        """Run the call on its graph session; a subclass adds its wire's tasks."""
        self.graph = graph
        self.apply(self.protocol.open())
        self._spawn(self._inputs.feed(graph), "feeder")
        self._spawn(self._output_pump(), "pump")

    # ------------------------------------------------------------------ sidebands

    def attach(self, sideband: Any) -> bool:
        """Add a listener; False once the call is ending."""
        if self._closing or self.protocol.close_reason is not None:
            return False
        self.sidebands.add(sideband)
        return True

    def detach(self, sideband: Any) -> None:
        self.sidebands.discard(sideband)

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coroutine, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"{self.id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed(task.get_name(), task.exception())

    def _failed(self, what: str, error: BaseException | None) -> None:
        """A task of the call (or a wire's callback, `what`) raised: the call ends."""
        if not self._closing:
            self.log.error("call %s: %s failed", self.id, what, exc_info=error)
            self.apply(self.protocol.close("internal_error"))

    async def _output_pump(self) -> None:
        async for message in self.graph.outputs():
            self.apply(self.protocol.graph_output(message))
        self.apply(self.protocol.session_ended(self.graph.end_reason or "closed", self.graph.error))

    # ------------------------------------------------------------------ protocol actions

    def apply(self, actions: list[Action]) -> None:
        """Carry out the protocol's actions in order. Never awaits (the feeder awaits the graph)."""
        for action in actions:
            if isinstance(action, SendEvent):
                self._event(action.event)
            elif isinstance(action, SendAudio):
                self.output.push(action.response_id, action.samples, action.sample_rate)
                if self.trace is not None:
                    self.trace.audio_out(action.response_id)  # no event carries media audio
            elif isinstance(action, SendToGraph):
                if not self._inputs.put(self.graph, action.input, action.message):
                    self.apply(self.protocol.close("input_backlog_full", CLOSE_POLICY))
                    return
            elif isinstance(action, ControlGraph):
                if self.graph is not None:
                    self.graph.control(action.control)
                if isinstance(action.control, Interrupt):
                    self._clear_audio(action.control.response_id)
            elif isinstance(action, HoldPlayback):
                self.output.hold(action.held)
            elif isinstance(action, CloseSession):
                self.close_soon(action.reason)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        self._first_audio.observe(event)
        if kind == "response.output_item.added":
            self._item_of[event["response_id"]] = event["item"]["id"]
            if len(self._item_of) > MAX_RECENT_RESPONSES:
                del self._item_of[next(iter(self._item_of))]
        elif kind == "response.done":
            self._reply_done(event["response"]["id"], cancelled=event["response"]["status"] == "cancelled")
        elif kind == "input_audio_buffer.speech_started":
            self._send(event)
            self._barge_in()  # after the event: listeners learn of the speech, then of the clear
            return
        self._send(event)

    def _reply_done(self, response_id: str, cancelled: bool) -> None:
        """`response.done`: no more audio comes for `response_id` (a cancelled one's is dropped)."""
        raise NotImplementedError

    def _clear_audio(self, response_id: str | None) -> None:
        """Drop the queued reply audio now (barge-in, a cancelled reply), on the far end too, and
        say so (`output_audio_buffer.cleared`). `response_id`: the reply the core stopped, if any."""
        raise NotImplementedError

    def _barge_in(self) -> None:
        """Speech while reply audio plays: stop it (when the session interrupts on speech)."""
        self.output.hold(False)  # a held sound became a turn: the clear below, if any, decides
        detection = self.protocol.config.turn_detection
        if detection is not None and detection.interrupt_response:
            self._stop_playback()

    def _stop_playback(self) -> None:
        """Clear the reply output now and keep in the conversation only the audio that was played."""
        playing = self.output.playing
        if playing is None:
            return
        played_ms = self.output.played_ms(playing)
        self._clear_audio(playing)
        item_id = self._item_of.get(playing)

        def truncate() -> None:
            # Runs after the core has handled the event that stopped playback (and cancelled
            # the reply if it was still generating): trim the item to what the listener heard.
            if item_id is not None and item_id in self.protocol.items and not self._closing:
                event = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                         "audio_end_ms": int(played_ms)}
                self.apply(self.protocol.receive_text(json.dumps(event)))

        asyncio.get_running_loop().call_soon(truncate)

    # ------------------------------------------------------------------ reply audio leaving

    def _audio_started(self, response_id: str) -> None:
        """The reply's first frame has left."""
        self._first_audio.left(response_id, self.transport)
        self._send_own("output_audio_buffer.started", response_id=response_id)

    def _audio_stopped(self, response_id: str) -> None:
        """The reply's last frame has left (or been played, where the far end says so)."""
        self._send_own("output_audio_buffer.stopped", response_id=response_id)

    # ------------------------------------------------------------------ server events

    def _send_own(self, kind: str, **fields: Any) -> None:
        """An event of the call's own (not the core's)."""
        self._send({"type": kind, "event_id": f"{self.event_prefix}{next(self._event_ids)}", **fields})

    def _send(self, event: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace.observe(event)
        worded = self.protocol.dialect.outgoing(event)  # GA, or the dialect's names (realtime/dialect.py)
        if worded is not None and not self._closing:
            self._deliver(worded)

    def _deliver(self, event: dict[str, Any]) -> None:
        """An event, as the dialect words it, to the sidebands; a wire with an event channel of
        its own (WebRTC's data channel) sends it there too."""
        if self.sidebands:
            self._to_sidebands(json.dumps(event, separators=(",", ":")))

    def _to_sidebands(self, text: str) -> None:
        for sideband in list(self.sidebands):
            sideband.deliver(text)

    # ------------------------------------------------------------------ ending

    # The live-sessions registry's view (session_server/live_sessions.py `SessionHost`): a call
    # is never parked; an operator's end is a hangup with that reason.
    def parked_at(self) -> float | None:
        return None

    def end(self, reason: str) -> None:
        self.close_soon(reason)

    def close_soon(self, reason: str) -> None:
        if not self._closing:
            asyncio.get_running_loop().create_task(self.close(reason), name=f"{self.id}:close")

    async def close(self, reason: str = "closed") -> None:
        """End the call and release everything. Idempotent."""
        if self._closing:
            await self.closed.wait()
            return
        for action in self.protocol.close(reason):  # `session.closed`, unless the core already closed
            if isinstance(action, SendEvent):
                self._send(action.event)
        self._closing = True
        self.close_reason = self.protocol.close_reason or reason
        for sideband in list(self.sidebands):
            sideband.call_ended(self.close_reason)
        await self._flush()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            if self.graph is not None:
                await self.graph.close(self.close_reason)
            await self._release()
        finally:
            self.closed.set()
            self._on_closed(self)
            self.log.info("call %s ended: %s", self.id, self.close_reason)

    async def _flush(self) -> None:
        """Before the call's tasks stop: let the wire send what it still owes (`session.closed`)."""

    async def _release(self) -> None:
        """After the graph session closed: release the wire (hang up, close the connection)."""
