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

The graph plumbing, barge-in, sidebands and the close are `CallLink`'s
(session_server/realtime/call_link.py), shared with phone calls; this module keeps what
WebRTC adds: the peer connection, the data channel and its bounds, the track.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import deque
from typing import Any

from aiortc import RTCDataChannel, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from session_server.realtime.call_link import CallLink
from session_server.realtime.protocol import CLOSE_POLICY, RealtimeProtocol, ResponseState
from session_server.realtime.reply_audio import RecentIds
from session_server.realtime.voice_lookups import look_up_voices
from session_server.webrtc.config import WebRTCConfig
from session_server.webrtc.ice import apply_candidate_policy, filter_remote_candidates, rtc_configuration
from session_server.webrtc.media import InputAudio, ReplyAudioTrack
from session_server.webrtc.offer import OfferError, PeerConnection, check_offer

log = logging.getLogger("session_server.webrtc")

EVENTS_CHANNEL = "oai-events"
INPUT_RATE = 16000  # what the track's audio is resampled to before it enters the graph
# Events waiting for the data channel to open, and data-channel bytes not yet sent: past either
# bound the client is not reading, and the call ends with reason `output_buffer_full`.
MAX_PENDING_EVENTS = 1024
MAX_BUFFERED_BYTES = 4 * 1024 * 1024
CLOSE_FLUSH_S = 1.0


class Call(CallLink):
    transport = "webrtc"
    event_prefix = "event_rtc_"
    log = log
    # The data channel that carries the events (None: the first one the client opens, whatever its label).
    events_channel: str | None = EVENTS_CHANNEL

    def __init__(self, call_id: str, protocol: RealtimeProtocol, config: WebRTCConfig, on_closed=lambda call: None, metrics: Any = None):
        # The track is the call's reply output (`output`): it paces the audio and says when it plays.
        self.track = ReplyAudioTrack(on_started=self._audio_started, on_stopped=self._audio_stopped)
        super().__init__(call_id, protocol, self.track, on_closed=on_closed, metrics=metrics)
        self.config = config
        self.pc = PeerConnection(rtc_configuration(config))
        self.channel: RTCDataChannel | None = None
        self._pending_events: deque[str] = deque()
        # Client messages waiting, in order, behind one whose uploaded voice is being looked up
        # in a worker thread (realtime/voice_lookups.py); True while that drain runs.
        self._held_messages: deque[str | bytes] = deque()
        self._draining_held = False
        self._cleared = RecentIds()  # responses whose `output_audio_buffer.cleared` was sent
        self.connected = asyncio.Event()

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
        super().start(graph)
        self._spawn(self._connect_deadline(), "connect-deadline")

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

    # ------------------------------------------------------------------ what the link asks of the track

    def _event(self, event: dict[str, Any]) -> None:
        if event["type"] == "output_audio_buffer.cleared":  # the core's, for `output_audio_buffer.clear`
            if event.get("response_id") in self._cleared:
                return  # already announced when the track was cleared
            self._clear_audio(event.get("response_id"), announce=False)
        super()._event(event)

    def _reply_done(self, response_id: str, cancelled: bool) -> None:
        self.track.finish(response_id)
        if cancelled:
            self._clear_audio(response_id)

    def _clear_audio(self, response_id: str | None, announce: bool = True) -> None:
        audible = self.track.clear()
        target = audible or response_id
        if audible is not None and announce and audible not in self._cleared:
            self._cleared.add(audible)
            self._send_own("output_audio_buffer.cleared", response_id=audible)
        elif target is not None:
            self._cleared.add(target)

    def _deliver(self, event: dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"))
        self._to_sidebands(text)
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

    async def _flush(self) -> None:
        """Let the data channel send what it buffered (`session.closed`), for up to `CLOSE_FLUSH_S`."""
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_FLUSH_S
        while channel.bufferedAmount > 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def _release(self) -> None:
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()


def new_call_id() -> tuple[str, str]:
    """(call id, session id) sharing one random part."""
    token = secrets.token_hex(12)
    return f"rtc_{token}", f"sess_{token}"
