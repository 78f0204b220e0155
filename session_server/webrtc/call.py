"""One WebRTC call: a peer connection around a realtime session, on the shared protocol core.

    client Opus track --input pump--> InputAudio (48 kHz stereo -> 16 kHz mono) --> protocol
    `oai-events` data channel -------------------------------------------------> protocol
    protocol --> graph input queue --feeder--> graph session
    graph outputs --output pump--> protocol --> events on `oai-events`
                                            \\-> reply audio --> ReplyAudioTrack (paced Opus track)

Every protocol rule lives in `session_server/realtime/protocol.py`, exactly as for the
WebSocket; this module moves messages and media. What is WebRTC-only:
- reply audio travels on the media track: the core is built with `audio_deltas=False` and hands
  it over as `SendAudio` actions instead of `response.output_audio.delta` events (as OpenAI's
  WebRTC does); every other event goes on the data channel;
- `output_audio_buffer.started` / `.stopped` report when a reply's audio starts and stops
  *playing* on the track; `.cleared` when queued audio was dropped;
- barge-in: the core's Interrupt (speech during a reply, `response.cancel`,
  `output_audio_buffer.clear`) clears the track at once, so the next 20 ms frame is silence.
  Speech while a finished reply's audio is still playing clears the track too, and the item is
  truncated to what was heard (`conversation.item.truncated`). A sound during a reply first
  only holds the track (`HoldPlayback`): if it ends shorter than `interrupt_min_speech_ms` (a
  cough) the reply plays on from where it paused, nothing lost; if it becomes a turn, the
  barge-in above clears it.
- sidebands (sideband.py): WebSockets attached to the call get every event the data channel
  gets, and their client events go through `receive_client_message` as the channel's do. They
  come and go without affecting the call; the call's end closes them.

Lifetime: a call ends when its session ends (idle, error, shutdown), the data channel closes,
ICE/DTLS fails or does not connect within `connect_timeout_s`, the client hangs up, or the
server shuts down. `close()` is idempotent and releases everything: the graph session, the
peer connection (and its sockets), tracks and tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import deque
from typing import Any

from aiortc import RTCDataChannel, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from graph.messages import Interrupt
from session_server.realtime.protocol import (
    CLOSE_POLICY,
    Action,
    CloseSession,
    ControlGraph,
    HoldPlayback,
    RealtimeProtocol,
    ResponseState,
    SendAudio,
    SendEvent,
    SendToGraph,
)
from session_server.realtime.voice_lookups import look_up_voices
from session_server.webrtc.config import WebRTCConfig
from session_server.webrtc.ice import apply_candidate_policy, filter_remote_candidates, rtc_configuration
from session_server.webrtc.media import InputAudio, RecentIds, ReplyAudioTrack
from session_server.webrtc.offer import OfferError, PeerConnection, check_offer

log = logging.getLogger("session_server.webrtc")

EVENTS_CHANNEL = "oai-events"
INPUT_RATE = 16000  # what the track's audio is resampled to before it enters the graph
# Events waiting for the data channel to open, and data-channel bytes not yet sent: past either
# bound the client is not reading, and the call ends with reason `output_buffer_full`.
MAX_PENDING_EVENTS = 1024
MAX_BUFFERED_BYTES = 4 * 1024 * 1024
# Client messages queued toward the graph; past it the call ends (`input_backlog_full`).
MAX_PENDING_INPUTS = 1024
CLOSE_FLUSH_S = 1.0


class Call:
    # The data channel that carries the events (None: the first one the client opens, whatever its label).
    events_channel: str | None = EVENTS_CHANNEL

    def __init__(self, call_id: str, protocol: RealtimeProtocol, config: WebRTCConfig, on_closed=lambda call: None, metrics: Any = None):
        self.id = call_id
        self.metrics = metrics  # anything with `first_audio(transport, seconds)` (session_server.metrics)
        self.protocol = protocol
        self.config = config
        self.graph: Any = None  # the GraphSession, set by `start`
        self.pc = PeerConnection(rtc_configuration(config))
        self.track = ReplyAudioTrack(on_started=self._audio_started, on_stopped=self._audio_stopped)
        self.channel: RTCDataChannel | None = None
        self.closed = asyncio.Event()
        self.close_reason: str | None = None
        self._on_closed = on_closed
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending_events: deque[str] = deque()
        # Client messages waiting, in order, behind one whose uploaded voice is being looked up
        # in a worker thread (realtime/voice_lookups.py); True while that drain runs.
        self._held_messages: deque[str | bytes] = deque()
        self._draining_held = False
        self._inputs: deque[SendToGraph] = deque()
        self._inputs_changed = asyncio.Event()
        self._item_of: dict[str, str] = {}  # response id -> its assistant item id
        self._cleared = RecentIds()  # responses whose `output_audio_buffer.cleared` was sent
        self._event_ids = 0
        # Time to first audio: from the end of the user's turn to the reply's first frame on the track.
        self._turn_ended_at: float | None = None
        self._awaiting_audio: dict[str, float] = {}
        self.connected = asyncio.Event()
        # WebSockets attached with `GET /v1/realtime?call_id=` (sideband.py): each gets a copy of
        # every event the data channel gets, and may send client events as the channel does.
        self.sidebands: set[Any] = set()
        # Operators (session_server/tracing.py): the turn traces, when on.
        self.trace: Any = None

    # ------------------------------------------------------------------ setup

    async def answer(self, offer_sdp: str) -> str:
        """Take the client's offer; return the SDP answer (with every local candidate)."""
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        offer = filter_remote_candidates(offer_sdp, self.config.candidates)
        check_offer(offer)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        except Exception as exc:  # noqa: BLE001 - aiortc raises ValueError/KeyError/... on bad SDP
            raise OfferError(f"The SDP offer could not be applied: {type(exc).__name__}: {exc}") from None
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise OfferError("The SDP offer has no audio m-line (add an audio transceiver).", "missing_audio")
        if audio[0].sender.track is None:
            audio[0].sender.replaceTrack(self.track)
        audio[0].direction = "sendrecv"
        apply_candidate_policy(pc, self.config.candidates)
        try:
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # noqa: BLE001 - e.g. no codec in common
            raise OfferError(f"No answer could be made for this offer: {type(exc).__name__}: {exc}") from None
        return pc.localDescription.sdp

    def start(self, graph: Any) -> None:
        """Run the call on its graph session (after `answer` succeeded)."""
        self.graph = graph
        self.apply(self.protocol.open())
        self._spawn(self._feeder(), "feeder")
        self._spawn(self._output_pump(), "pump")
        self._spawn(self._connect_deadline(), "connect-deadline")

    def _spawn(self, coroutine, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"{self.id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._closing:
            log.error("call %s: %s failed", self.id, task.get_name(), exc_info=task.exception())
            self.apply(self.protocol.close("internal_error"))

    # ------------------------------------------------------------------ peer connection events

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self.channel is not None or self.events_channel not in (None, channel.label):
            channel.close()  # only the one events channel (`oai-events`) is part of the protocol
            return
        self.channel = channel
        channel.on("message", self.receive_client_message)
        channel.on("open", self._flush_pending)
        channel.on("close", lambda: self.close_soon("client_closed"))
        self._flush_pending()

    def _flush_pending(self) -> None:
        """Events queued before the channel opened (`session.created`...), in order."""
        channel = self.channel
        while self._pending_events and channel is not None and channel.readyState == "open":
            channel.send(self._pending_events.popleft())

    def receive_client_message(self, message: str | bytes) -> None:
        """A client event from the data channel or a sideband WebSocket: the same rules for both.
        One that names an uploaded voice waits for its lookup (off the event loop), and the
        messages after it wait behind it."""
        if self._held_messages or (
            isinstance(message, str) and len(message) <= self.config.max_message_bytes
            and self.protocol.voices_to_look_up(message)
        ):
            self._held_messages.append(message)
            if not self._draining_held:
                self._draining_held = True
                self._spawn(self._receive_held(), "voice-lookups")
            return
        self._receive(message)

    async def _receive_held(self) -> None:
        try:
            while self._held_messages and not self._closing:
                message = self._held_messages[0]
                if isinstance(message, str):
                    await look_up_voices(self.protocol, message)
                self._held_messages.popleft()
                self._receive(message)
        finally:
            self._held_messages.clear()
            self._draining_held = False

    def _receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.apply(self.protocol.receive_binary(message))
        elif len(message) > self.config.max_message_bytes:
            # Refused; the session stays usable. (Large audio travels on the track, not here.)
            error = {
                "type": "invalid_request_error",
                "code": "message_too_large",
                "message": f"A data-channel message may be at most {self.config.max_message_bytes} bytes; got {len(message)}.",
                "param": None,
                "event_id": None,
            }
            self._send_own("error", error=error)
        elif '"output_audio_buffer.clear"' in message and self._clear_requested(message):
            return
        else:
            self.apply(self.protocol.receive_text(message))

    def attach(self, sideband: Any) -> bool:
        """Add a listener with `deliver(text)` and `call_ended(reason)`; False once the call is ending."""
        if self._closing or self.protocol.close_reason is not None:
            return False
        self.sidebands.add(sideband)
        return True

    def detach(self, sideband: Any) -> None:
        self.sidebands.discard(sideband)

    def _clear_requested(self, message: str) -> bool:
        """`output_audio_buffer.clear` while reply audio plays. Only the track knows that it is
        playing (the reply may have finished generating long ago), so it is handled here: the
        track is cleared and the item trimmed to what was heard; a reply still generating is
        cancelled by the core as usual. False: not such an event, the core handles it alone."""
        try:
            event = json.loads(message)
        except (ValueError, RecursionError):
            return False  # the core answers it with `invalid_json`
        if not isinstance(event, dict) or event.get("type") != "output_audio_buffer.clear" or self.track.playing is None:
            return False
        self._stop_playback()
        if any(r.state is ResponseState.IN_PROGRESS for r in self.protocol.responses.values()):
            self.apply(self.protocol.receive_text(message))
        return True

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._input_pump(track), "input")

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.connected.set()
        elif state in ("failed", "closed"):
            self.close_soon("ice_failed" if state == "failed" else "peer_closed")

    async def _connect_deadline(self) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), self.config.connect_timeout_s)
        except TimeoutError:
            self.close_soon("connect_timeout")

    # ------------------------------------------------------------------ pumps

    async def _input_pump(self, track: MediaStreamTrack) -> None:
        converter = InputAudio(INPUT_RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            samples = converter.convert(frame)
            if samples.size:
                self.apply(self.protocol.receive_audio(self.heard(samples), INPUT_RATE))

    def heard(self, samples: Any) -> Any:
        """What the model hears of the track's audio (a Live call's mute makes it silence)."""
        return samples

    async def _feeder(self) -> None:
        while True:
            while not self._inputs:
                self._inputs_changed.clear()
                await self._inputs_changed.wait()
            action = self._inputs.popleft()
            try:
                await self.graph.send(action.input, action.message)
            except RuntimeError:
                return  # the graph session ended; the output pump reports why

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
                self.track.push(action.response_id, action.samples, action.sample_rate)
                if self.trace is not None:
                    self.trace.audio_out(action.response_id)
            elif isinstance(action, SendToGraph):
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
                self.track.hold(action.held)
            elif isinstance(action, CloseSession):
                self.close_soon(action.reason)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        self._observe(event)
        if kind == "response.output_item.added":
            self._item_of[event["response_id"]] = event["item"]["id"]
            if len(self._item_of) > 64:
                del self._item_of[next(iter(self._item_of))]
        elif kind == "response.done":
            response_id = event["response"]["id"]
            self.track.finish(response_id)
            if event["response"]["status"] == "cancelled":
                self._clear_audio(response_id)
        elif kind == "output_audio_buffer.cleared":
            if event.get("response_id") in self._cleared:
                return  # already announced when the track was cleared
            self._clear_audio(event.get("response_id"), announce=False)
        elif kind == "input_audio_buffer.speech_started":
            self._send(event)
            self._barge_in()  # after the event: the client learns of the speech, then of the clear
            return
        self._send(event)

    def _clear_audio(self, response_id: str | None, announce: bool = True) -> None:
        audible = self.track.clear()
        target = audible or response_id
        if audible is not None and announce and audible not in self._cleared:
            self._cleared.add(audible)
            self._send_own("output_audio_buffer.cleared", response_id=audible)
        elif target is not None:
            self._cleared.add(target)

    def _barge_in(self) -> None:
        """Speech while reply audio plays: stop it (when the session interrupts on speech)."""
        self.track.hold(False)  # a held sound became a turn: the clear below, if any, decides
        detection = self.protocol.config.turn_detection
        if detection is not None and detection.interrupt_response:
            self._stop_playback()

    def _stop_playback(self) -> bool:
        """Clear the track now and keep in the conversation only the audio that was heard."""
        playing = self.track.playing
        if playing is None:
            return False
        heard_ms = self.track.played_ms(playing)
        self._clear_audio(playing)
        item_id = self._item_of.get(playing)

        def truncate() -> None:
            # Runs after the core has handled the event that stopped playback (and cancelled
            # the reply if it was still generating): trim the item to what the listener heard.
            if item_id is not None and item_id in self.protocol.items and not self._closing:
                event = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": int(heard_ms)}
                self.apply(self.protocol.receive_text(json.dumps(event)))

        asyncio.get_running_loop().call_soon(truncate)
        return True

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
            self.metrics.first_audio("webrtc", time.monotonic() - started)
        self._send_own("output_audio_buffer.started", response_id=response_id)

    def _audio_stopped(self, response_id: str) -> None:
        self._send_own("output_audio_buffer.stopped", response_id=response_id)

    def _send_own(self, kind: str, **fields: Any) -> None:
        self._event_ids += 1
        self._send({"type": kind, "event_id": f"event_rtc_{self._event_ids}", **fields})

    def _send(self, event: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace.observe(event)
        worded = self.protocol.dialect.outgoing(event)  # GA, or beta names (realtime/dialect.py)
        if self._closing or worded is None:
            return
        text = json.dumps(worded, separators=(",", ":"))
        for sideband in self.sidebands:
            sideband.deliver(text)
        channel = self.channel
        if channel is None or channel.readyState == "connecting" or self._pending_events:
            if len(self._pending_events) >= MAX_PENDING_EVENTS:
                self.apply(self.protocol.close("output_buffer_full", CLOSE_POLICY))
                return
            self._pending_events.append(text)
            self._flush_pending()
            return
        if channel.readyState != "open":
            return  # closing or closed: the call is ending
        if channel.bufferedAmount > MAX_BUFFERED_BYTES and not self._closing:
            self.apply(self.protocol.close("output_buffer_full", CLOSE_POLICY))
            return
        channel.send(text)

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
        # The protocol's own close (nothing if it already closed) sends `session.closed`.
        for action in self.protocol.close(reason):
            if isinstance(action, SendEvent):
                self._send(action.event)
        self._closing = True
        self.close_reason = self.protocol.close_reason or reason
        for sideband in self.sidebands:
            sideband.call_ended(self.close_reason)
        await self._flush_channel()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.graph is not None:
            await self.graph.close(self.close_reason)
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self.closed.set()
        self._on_closed(self)
        log.info("call %s ended: %s", self.id, self.close_reason)

    async def _flush_channel(self) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_FLUSH_S
        while channel.bufferedAmount > 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)


def new_call_id() -> tuple[str, str]:
    """(call id, session id) sharing one random part."""
    token = secrets.token_hex(12)
    return f"rtc_{token}", f"sess_{token}"
