"""A SIP call's media: RTP both ways on aiortp, as the `PhoneWire` of its `PhoneCall`.

    caller RTP --(only from the offer's address)--> in sequence order --> G.711 decode
        --> PhoneCall.receive_audio (8 kHz) ;  RFC 4733 events --> PhoneCall.dtmf
    PhoneCall's 20 ms clock --> send_audio / send_silence --> G.711 encode --> one RTP packet

- Inbound: packets are put back in sequence order and each goes out as soon as every one
  before it is in (rtp_order.py: no depth held on a steady stream, only a gap waits, for a few
  packets); aiortp conceals lost packets and hands decoded 16-bit PCM on; RFC 4733
  telephone-events share the sequence space and come out once per key, at the event's first
  end packet.
  A packet from any address but the one the SDP offer named is dropped (and the first such
  drop logged), so nobody who guesses the port can speak into a call. With `sip.rtp_latching`
  and an offer naming an address that is not public (a phone behind NAT writes its LAN
  address), the first RTP packet's source becomes the peer instead, both ways (symmetric RTP,
  RFC 4961): whoever sends first to the port before the caller does takes the call's media,
  the price of reaching callers behind NAT, hence off by default.
- Outbound: the call's pacer (phone_call.py) ticks every 20 ms; each tick sends one packet,
  reply audio or G.711 silence, so the far end sees a steady stream (a carrier's own media
  timeout never fires during a silence) and the RTP timestamps advance 160 per packet.
- `clear()` is a no-op: RTP has nothing buffered at the far end beyond its jitter buffer, and
  the outbound queue (phone_audio.py) is already flushed when it is called.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import numpy as np
from aiortp import RTPSession

from session_server.realtime.audio_formats import g711
from session_server.telephony.phone_audio import FRAME_SAMPLES, PHONE_RATE
from session_server.telephony.phone_call import DTMF_KEYS
from session_server.telephony.rtp_order import InboundOrder

log = logging.getLogger("session_server.telephony")


class PeerRtpSession(RTPSession):
    """aiortp's session, taking RTP only from `peer` (the address the SDP offer named, or
    with `latch` the first packet's source)."""

    peer: tuple[str, int] | None = None  # set once created; until then nothing is taken
    latch = False  # the next packet's source becomes the peer (once)
    call_id = "?"
    local_ip = ""  # the address its sockets are bound on (the SDP answer's)
    dropped = 0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._jitter_buffer = InboundOrder(self._deliver_audio_frame)  # type: ignore[assignment]  # aiortp's interface

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.latch and self.peer is not None:
            self.latch = False
            log.info("call %s: RTP latched to %s:%s (the offer named %s)", self.call_id, addr[0], addr[1], self.peer)
            self.peer = (str(addr[0]), int(addr[1]))
            self.update_remote(self.peer)
        if self.peer is None or (str(addr[0]), int(addr[1])) != self.peer:
            self.dropped += 1
            if self.dropped == 1:
                log.info("call %s: RTP from %s:%s dropped (the call's media comes from %s)", self.call_id, addr[0], addr[1], self.peer)
            return
        super()._handle_rtp(data, addr)


def is_public(host: str) -> bool:
    """Whether `host` is an address a caller could be reached at from elsewhere (loopback
    counts: a caller on this host names its real address)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True  # a name: taken as written
    return address.is_global or address.is_loopback


async def open_rtp(call_id: str, local_ip: str, peer: tuple[str, int], payload_type: int, dtmf_payload_type: int,
                   latching: bool = False) -> PeerRtpSession:
    """Bind an RTP (and RTCP) socket on `local_ip`, any free port, toward `peer`; with
    `latching` and a `peer` that is not public, toward the first packet's source instead."""
    session = await PeerRtpSession.create(local_addr=(local_ip, 0), remote_addr=peer, payload_type=payload_type,
                                          clock_rate=PHONE_RATE, dtmf_payload_type=dtmf_payload_type)
    session.call_id = call_id
    session.local_ip = local_ip
    session.peer = peer
    session.latch = latching and not is_public(peer[0])
    return session


def rtp_port(session: RTPSession) -> int:
    return int(session._rtp_transport._transport.get_extra_info("sockname")[1])  # aiortp exposes no accessor


class RtpWire:
    """The `PhoneWire` of a SIP call. `hang_up` sends BYE (unless the caller's BYE ended the
    call) through `send_bye`, then closes the RTP session."""

    def __init__(self, rtp: RTPSession, kind: str, send_bye: Any):
        self.rtp = rtp
        self.kind = kind  # audio/pcmu or audio/pcma: the negotiated codec
        self._send_bye = send_bye
        self._silence = g711(np.zeros(FRAME_SAMPLES, np.float32), kind)
        self.call: Any = None  # the PhoneCall, once started: inbound media goes to it
        rtp.on_audio = self._audio
        rtp.on_dtmf = self._dtmf

    def _audio(self, pcm: bytes, timestamp: int) -> None:
        if self.call is not None:
            self.call.receive_audio(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0, PHONE_RATE)

    def _dtmf(self, digit: str, duration: int) -> None:
        if self.call is not None and digit in DTMF_KEYS:
            self.call.dtmf(digit)

    def send_audio(self, samples: np.ndarray) -> None:
        self.rtp.send_audio_auto(g711(samples, self.kind))

    def send_silence(self) -> None:
        self.rtp.send_audio_auto(self._silence)

    def send_mark(self, name: str) -> None:
        pass  # RTP has no marks: the reply's last packet is its end

    def clear(self) -> None:
        pass

    async def hang_up(self, reason: str) -> None:
        try:
            self._send_bye(reason)
        finally:
            await self.rtp.close()
