"""One phone call on the realtime protocol core: the link every phone wire shares.

    caller audio (8 kHz G.711, decoded by the wire) --receive_audio--> protocol --> graph
    graph outputs --pump--> protocol --> SendAudio --> PhoneOutput --20 ms clock--> wire frames
                                     \\-> server events --> sidebands (`GET /v1/realtime?call_id=`)

A wire (the carrier media stream of twilio.py, RTP of a SIP call in sip_media.py) moves bytes and says what its
caller did; every protocol rule stays in `session_server/realtime/protocol.py`. The core is
built with `audio_deltas=False`, as for WebRTC: reply audio comes out as `SendAudio`, is
resampled to 8 kHz and leaves one 20 ms frame per tick of the loop's frame clock (one 20 ms
monotonic clock for every call: frame_clock.py). What a phone call adds to the core:

- barge-in: the core's Interrupt (speech during a reply, `response.cancel`) clears the outbound
  queue, so the next tick sends nothing of the reply, and the wire tells the far end to drop
  what it buffered (`clear` on a media stream). Speech while a finished reply is still leaving
  clears it too, and the item is truncated to what was sent (`conversation.item.truncated`);
- DTMF: a keypad press becomes `input_audio_buffer.dtmf_event_received` {event, received_at}
  (as OpenAI's SIP calls send it), for the call's sidebands;
- media timeout: a call whose caller sends no audio for `media_timeout_s` ends (`media_timeout`).

Lifetime: `close(reason)` is idempotent and releases everything (tasks, graph session, the
wire); `on_closed(call)` then forgets it in the registries.

Here because the issue's "one link for every transport" (WebSocket, WebRTC, SIP, media
streams) is for later: this link serves the phone wires; the WebSocket and WebRTC adapters keep
their own until that refactor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import deque
from typing import Any, Protocol

import numpy as np

from graph.messages import Interrupt
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
from session_server.realtime.voice_lookups import look_up_voices
from session_server.telephony.frame_clock import FrameClock
from session_server.telephony.phone_audio import FRAME_MS, PhoneOutput

log = logging.getLogger("session_server.telephony")

# Client messages queued toward the graph; past it the call ends (`input_backlog_full`).
MAX_PENDING_INPUTS = 1024
# Sideband client events waiting for their turn (each may wait for a voice lookup).
MAX_PENDING_CLIENT_EVENTS = 256
DTMF_KEYS = frozenset("0123456789*#ABCD")


class PhoneWire(Protocol):
    """What a phone transport does for its call."""

    def send_audio(self, samples: np.ndarray) -> None:
        """One 20 ms frame of reply audio (float32, 8 kHz, 160 samples)."""

    def send_silence(self) -> None:
        """A tick with no reply audio (RTP keeps its clock running; a media stream sends nothing)."""

    def send_mark(self, name: str) -> None:
        """The reply `name`'s last frame has been sent."""

    def clear(self) -> None:
        """Drop what the far end buffered of the reply (barge-in)."""

    async def hang_up(self, reason: str) -> None:
        """End the call on the wire (close the stream; BYE). Called once, from `close`."""


class PhoneCall:
    def __init__(self, call_id: str, protocol: RealtimeProtocol, wire: PhoneWire, transport: str,
                 media_timeout_s: float, on_closed=lambda call: None, metrics: Any = None):
        self.id = call_id
        self.protocol = protocol
        self.wire = wire
        self.transport = transport  # the metrics' label: "twilio", "sip"
        self.media_timeout_s = media_timeout_s
        self.metrics = metrics
        self.graph: Any = None
        self.output = PhoneOutput()
        self.closed = asyncio.Event()
        self.close_reason: str | None = None
        self.sidebands: set[Any] = set()
        self.trace: Any = None
        self.frames_sent = 0  # reply frames sent (tests and the bench read it)
        self._on_closed = on_closed
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._inputs: deque[SendToGraph] = deque()
        self._inputs_changed = asyncio.Event()
        self._feeding = False  # the feeder holds an input that waits for room: later ones queue behind it
        self._client_events: asyncio.Queue[str | bytes] = asyncio.Queue(MAX_PENDING_CLIENT_EVENTS)
        self._item_of: dict[str, str] = {}  # response id -> its assistant item id
        self._event_ids = itertools.count(1)
        self._last_media = time.monotonic()
        self._turn_ended_at: float | None = None
        self._awaiting_audio: dict[str, float] = {}
        self._clock: FrameClock | None = None

    # ------------------------------------------------------------------ what the wire reports

    def start(self, graph: Any) -> None:
        self.graph = graph
        self.apply(self.protocol.open())
        for coroutine, name in ((self._feeder(), "feeder"), (self._output_pump(), "pump"),
                                (self._media_watch(), "media-watch"), (self._client_event_pump(), "client-events")):
            self._spawn(coroutine, name)
        self._clock = FrameClock.of(asyncio.get_running_loop())
        self._clock.join(self)  # reply audio or silence, one frame per 20 ms tick (frame_clock.py)

    def receive_audio(self, samples: np.ndarray, sample_rate: int) -> None:
        self._last_media = time.monotonic()
        if samples.size:
            self.apply(self.protocol.receive_audio(samples, sample_rate))

    def dtmf(self, key: str) -> None:
        """A keypad press (already checked against `DTMF_KEYS` by the wire)."""
        self._last_media = time.monotonic()
        self._send_own("input_audio_buffer.dtmf_event_received", event=key, received_at=int(time.time()))

    def played(self, response_id: str) -> None:
        """The far end played a reply to its end (a media stream's `mark` coming back)."""
        if response_id in self._item_of:
            self._send_own("output_audio_buffer.stopped", response_id=response_id)

    # ------------------------------------------------------------------ sidebands (webrtc/sideband.py)

    def attach(self, sideband: Any) -> bool:
        if self._closing or self.protocol.close_reason is not None:
            return False
        self.sidebands.add(sideband)
        return True

    def detach(self, sideband: Any) -> None:
        self.sidebands.discard(sideband)

    def receive_client_message(self, message: str | bytes) -> None:
        try:
            self._client_events.put_nowait(message)
        except asyncio.QueueFull:
            error = {"type": "invalid_request_error", "code": "too_many_events", "param": None, "event_id": None,
                     "message": f"More than {MAX_PENDING_CLIENT_EVENTS} client events are waiting; send fewer at once."}
            self._send_own("error", error=error)

    async def _client_event_pump(self) -> None:
        while True:
            message = await self._client_events.get()
            if isinstance(message, bytes):
                self.apply(self.protocol.receive_binary(message))
                continue
            await look_up_voices(self.protocol, message)  # off the event loop, before the event
            self.apply(self.protocol.receive_text(message))

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coroutine, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"{self.id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed(task.get_name(), task.exception())

    def tick_failed(self, error: BaseException) -> None:
        self._failed(f"{self.id}:tick", error)

    def _failed(self, what: str, error: BaseException | None) -> None:
        if not self._closing:
            log.error("call %s: %s failed", self.id, what, exc_info=error)
            self.apply(self.protocol.close("internal_error"))

    async def _feeder(self) -> None:
        while True:
            while not self._inputs:
                self._inputs_changed.clear()
                await self._inputs_changed.wait()
            action = self._inputs.popleft()
            self._feeding = True
            try:
                await self.graph.send(action.input, action.message)
            except RuntimeError:
                return  # the graph session ended; the pump reports why
            finally:
                self._feeding = False

    async def _output_pump(self) -> None:
        async for message in self.graph.outputs():
            self.apply(self.protocol.graph_output(message))
        self.apply(self.protocol.session_ended(self.graph.end_reason or "closed", self.graph.error))

    def tick(self) -> None:
        """The frame clock's tick: the reply's next 20 ms frame, or silence."""
        frame = self.output.next_frame()
        if frame is None:
            self.wire.send_silence()
            return
        if self.output.played_ms(frame.response_id) <= FRAME_MS:  # the reply's first frame
            self._audio_started(frame.response_id)
        self.wire.send_audio(frame.samples)
        self.frames_sent += 1
        if frame.last:
            self.wire.send_mark(frame.response_id)

    async def _media_watch(self) -> None:
        while True:
            idle = time.monotonic() - self._last_media
            if idle >= self.media_timeout_s:
                log.info("call %s: no media for %.0f s", self.id, idle)
                self.apply(self.protocol.close("media_timeout"))
                return
            await asyncio.sleep(min(1.0, self.media_timeout_s - idle + 0.01))

    # ------------------------------------------------------------------ protocol actions

    def apply(self, actions: list[Action]) -> None:
        """Carry out the protocol's actions in order. Never awaits (the feeder awaits the graph)."""
        for action in actions:
            if isinstance(action, SendEvent):
                self._event(action.event)
            elif isinstance(action, SendAudio):
                self.output.push(action.response_id, action.samples, action.sample_rate)
            elif isinstance(action, SendToGraph):
                if not self._inputs and not self._feeding and self._send_now(action):
                    continue
                if len(self._inputs) >= MAX_PENDING_INPUTS:
                    self.apply(self.protocol.close("input_backlog_full", CLOSE_POLICY))
                    return
                self._inputs.append(action)
                self._inputs_changed.set()
            elif isinstance(action, ControlGraph):
                if self.graph is not None:
                    self.graph.control(action.control)
                if isinstance(action.control, Interrupt):
                    self._clear_audio(action.control.response_id)
            elif isinstance(action, HoldPlayback):
                self.output.hold(action.held)
            elif isinstance(action, CloseSession):
                self.close_soon(action.reason)

    def _send_now(self, action: SendToGraph) -> bool:
        """Straight to the graph when it takes the message without waiting: no hop through the
        feeder task for each 20 ms packet (as websocket_link.py). Anything else goes the
        feeder's way, in order."""
        if self.graph is None:
            return False
        try:
            return self.graph.send_nowait(action.input, action.message)
        except (RuntimeError, KeyError):
            return False  # the feeder's send meets the same and deals with it

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        self._observe(event)
        if kind == "response.output_item.added":
            self._item_of[event["response_id"]] = event["item"]["id"]
            if len(self._item_of) > 64:
                del self._item_of[next(iter(self._item_of))]
        elif kind == "response.done":
            response_id = event["response"]["id"]
            if event["response"]["status"] == "cancelled":
                self._clear_audio(response_id)
            elif self.output.finish(response_id):
                self.wire.send_mark(response_id)
        elif kind == "input_audio_buffer.speech_started":
            self._send(event)
            self._barge_in()  # after the event: listeners learn of the speech, then of the clear
            return
        self._send(event)

    def _clear_audio(self, response_id: str | None) -> None:
        audible = self.output.clear()
        if audible is not None:
            self.wire.clear()
            self._send_own("output_audio_buffer.cleared", response_id=audible)

    def _barge_in(self) -> None:
        """Speech while reply audio is leaving: stop it (when the session interrupts on speech)
        and keep in the conversation only what was sent."""
        self.output.hold(False)
        detection = self.protocol.config.turn_detection
        playing = self.output.playing
        if detection is None or not detection.interrupt_response or playing is None:
            return
        sent_ms = self.output.played_ms(playing)
        self._clear_audio(playing)
        item_id = self._item_of.get(playing)

        def truncate() -> None:
            # After the core has handled the speech (and cancelled a reply still generating).
            if item_id is not None and item_id in self.protocol.items and not self._closing:
                event = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": int(sent_ms)}
                self.apply(self.protocol.receive_text(json.dumps(event)))

        asyncio.get_running_loop().call_soon(truncate)

    def _observe(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed") and self._turn_ended_at is None:
            self._turn_ended_at = time.monotonic()
        elif kind == "response.created":
            started = self._turn_ended_at if self._turn_ended_at is not None else time.monotonic()
            self._awaiting_audio[event["response"]["id"]] = started
            self._turn_ended_at = None
            if len(self._awaiting_audio) > 64:
                del self._awaiting_audio[next(iter(self._awaiting_audio))]

    def _audio_started(self, response_id: str) -> None:
        started = self._awaiting_audio.pop(response_id, None)
        if started is not None and self.metrics is not None:
            self.metrics.first_audio(self.transport, time.monotonic() - started)
        self._send_own("output_audio_buffer.started", response_id=response_id)

    def _send_own(self, kind: str, **fields: Any) -> None:
        self._send({"type": kind, "event_id": f"event_tel_{next(self._event_ids)}", **fields})

    def _send(self, event: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace.observe(event)
        worded = self.protocol.dialect.outgoing(event)
        if worded is None or not self.sidebands:
            return
        text = json.dumps(worded, separators=(",", ":"))
        for sideband in list(self.sidebands):
            sideband.deliver(text)

    # ------------------------------------------------------------------ ending

    # The live-sessions registry's view (session_server/live_sessions.py `SessionHost`).
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
        if self._clock is not None:
            self._clock.leave(self)
        self.close_reason = self.protocol.close_reason or reason
        for sideband in list(self.sidebands):
            sideband.call_ended(self.close_reason)
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            if self.graph is not None:
                await self.graph.close(self.close_reason)
            with contextlib.suppress(Exception):
                await self.wire.hang_up(self.close_reason)
        finally:
            self.closed.set()
            self._on_closed(self)
            log.info("call %s ended: %s", self.id, self.close_reason)
