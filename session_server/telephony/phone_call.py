"""One phone call on the realtime protocol core: the link every phone wire shares.

    caller audio (8 kHz G.711, decoded by the wire) --receive_audio--> protocol --> graph
    graph outputs --pump--> protocol --> SendAudio --> PhoneOutput --20 ms clock--> wire frames
                                     \\-> server events --> sidebands (`GET /v1/realtime?call_id=`)

A wire (the carrier media stream of twilio.py, RTP of a SIP call in sip_media.py) moves bytes and says what its
caller did; every protocol rule stays in `session_server/realtime/protocol.py`. The core is
built with `audio_deltas=False`, as for WebRTC: reply audio comes out as `SendAudio`, is
resampled to 8 kHz and leaves one 20 ms frame per 20 ms of the loop's frame clock (one
monotonic schedule for every call, each call at its own phase: frame_clock.py). What a phone call adds to the core:

- barge-in: the core's Interrupt (speech during a reply, `response.cancel`) clears the outbound
  queue, so the next tick sends nothing of the reply, and the wire tells the far end to drop
  what it buffered (`clear` on a media stream). Speech while a finished reply is still leaving
  clears it too, and the item is truncated to what was sent (`conversation.item.truncated`);
- DTMF: a keypad press becomes `input_audio_buffer.dtmf_event_received` {event, received_at}
  (as OpenAI's SIP calls send it), for the call's sidebands;
- media timeout: a call whose caller sends no audio for `media_timeout_s` ends (`media_timeout`).

Lifetime: `close(reason)` is idempotent and releases everything (tasks, graph session, the
wire, which hangs up); `on_closed(call)` then forgets it in the registries.

The graph plumbing, barge-in, sidebands and the close are `CallLink`'s
(session_server/realtime/call_link.py), shared with WebRTC calls; this module keeps what a
phone line adds: the 20 ms clock, the wire's `clear` and marks, DTMF and the media timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

import numpy as np

from session_server.realtime.call_link import CallLink
from session_server.realtime.protocol import RealtimeProtocol
from session_server.realtime.voice_lookups import look_up_voices
from session_server.telephony.frame_clock import FrameClock
from session_server.telephony.phone_audio import FRAME_MS, PhoneOutput

log = logging.getLogger("session_server.telephony")

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


class PhoneCall(CallLink):
    event_prefix = "event_tel_"
    log = log
    output: PhoneOutput

    def __init__(self, call_id: str, protocol: RealtimeProtocol, wire: PhoneWire, transport: str,
                 media_timeout_s: float, on_closed=lambda call: None, metrics: Any = None):
        super().__init__(call_id, protocol, PhoneOutput(), on_closed=on_closed, metrics=metrics)
        self.wire = wire
        self.transport = transport  # the metrics' label: "twilio", "sip"
        self.media_timeout_s = media_timeout_s
        self.frames_sent = 0  # reply frames sent (tests and the bench read it)
        self._client_events: asyncio.Queue[str | bytes] = asyncio.Queue(MAX_PENDING_CLIENT_EVENTS)
        self._last_media = time.monotonic()
        self._clock: FrameClock | None = None

    # ------------------------------------------------------------------ what the wire reports

    def start(self, graph: Any) -> None:
        super().start(graph)
        for coroutine, name in ((self._media_watch(), "media-watch"), (self._client_event_pump(), "client-events")):
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
            self._audio_stopped(response_id)

    # ------------------------------------------------------------------ sidebands' client events (webrtc/sideband.py)

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

    # ------------------------------------------------------------------ the 20 ms clock

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

    # ------------------------------------------------------------------ what the link asks of the wire

    def _reply_done(self, response_id: str, cancelled: bool) -> None:
        if cancelled:
            self._clear_audio(response_id)
        elif self.output.finish(response_id):  # its last frame already left, unmarked
            self.wire.send_mark(response_id)

    def _clear_audio(self, response_id: str | None) -> None:
        audible = self.output.clear()
        if audible is not None:
            self.wire.clear()
            self._send_own("output_audio_buffer.cleared", response_id=audible)

    def tick_failed(self, error: BaseException) -> None:
        self._failed(f"{self.id}:tick", error)

    async def _flush(self) -> None:
        if self._clock is not None:
            self._clock.leave(self)  # the call is ending: no more frames on the line

    async def _release(self) -> None:
        with contextlib.suppress(Exception):
            await self.wire.hang_up(self.close_reason or "closed")
