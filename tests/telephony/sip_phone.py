"""A caller's phone, for tests: SIP requests written out as text over UDP, RTP on aiortp.

Hand-written on purpose: the tests need to send what a real phone sends and also what a broken
one does (a malformed request, an offer with no common codec, RTP from the wrong port), and to
read every response in order. Responses are parsed with aiosipua's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

import numpy as np
from aiortp import RTPSession
from aiosipua import SipMessage, SipRequest, SipResponse, parse_sdp

from tests.telephony.twilio_client import FRAME, RATE, from_mulaw, mulaw

OFFER_CODECS = "0 8 101"


def sdp_offer(rtp_port: int, formats: str = OFFER_CODECS) -> str:
    lines = ["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=test", "c=IN IP4 127.0.0.1", "t=0 0",
             f"m=audio {rtp_port} RTP/AVP {formats}"]
    names = {"0": "PCMU/8000", "8": "PCMA/8000", "101": "telephone-event/8000", "9": "G722/8000", "18": "G729/8000"}
    lines += [f"a=rtpmap:{pt} {names[pt]}" for pt in formats.split() if pt in names]
    if "101" in formats.split():
        lines.append("a=fmtp:101 0-16")
    lines += ["a=ptime:20", "a=sendrecv"]
    return "\r\n".join(lines) + "\r\n"


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, phone: SipPhone):
        self.phone = phone

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.phone._received(data)


class SipPhone:
    """One caller: `call()` (INVITE ... 200 ... ACK), `play`, `dtmf`, `bye`; every SIP message
    the server sends is kept in order (`responses`, `requests`); reply audio in `heard`."""

    def __init__(self, server: tuple[str, int]):
        self.server = server
        self.call_id = f"{secrets.token_hex(8)}@127.0.0.1"
        self.tag = secrets.token_hex(4)
        self.cseq = 1
        self.branch = ""
        self.responses: list[SipResponse] = []
        self.requests: list[SipRequest] = []
        self.changed = asyncio.Event()
        self.heard: list[bytes] = []  # decoded 16-bit PCM of every reply packet, in order
        self.to_tag: str | None = None
        self.remote_target = f"sip:assistant@{server[0]}:{server[1]}"
        self.transport: asyncio.DatagramTransport | None = None
        self.rtp: RTPSession | None = None
        self.answer: Any = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, server: tuple[str, int]):
        phone = cls(server)
        loop = asyncio.get_running_loop()
        phone.transport, _ = await loop.create_datagram_endpoint(lambda: _Socket(phone), local_addr=("127.0.0.1", 0))
        phone.rtp = await RTPSession.create(local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", 9), payload_type=0)
        phone.rtp.on_audio = lambda pcm, ts: phone.heard.append(pcm)
        try:
            yield phone
        finally:
            await phone.rtp.close()
            phone.transport.close()

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    @property
    def rtp_port(self) -> int:
        assert self.rtp is not None
        return int(self.rtp._rtp_transport._transport.get_extra_info("sockname")[1])

    # ------------------------------------------------------------------ SIP

    def send_raw(self, data: bytes, addr: tuple[str, int] | None = None) -> None:
        assert self.transport is not None
        self.transport.sendto(data, addr or self.server)

    def request(self, method: str, body: str = "", content_type: str = "application/sdp", headers: dict[str, str] | None = None,
                new_transaction: bool = True, cseq: int | None = None) -> None:
        if new_transaction:
            self.branch = f"z9hG4bK{secrets.token_hex(6)}"
        to = f"<sip:assistant@{self.server[0]}>" + (f";tag={self.to_tag}" if self.to_tag and method != "CANCEL" else "")
        uri = self.remote_target if method not in ("INVITE", "CANCEL", "OPTIONS") else f"sip:assistant@{self.server[0]}:{self.server[1]}"
        lines = [f"{method} {uri} SIP/2.0",
                 f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch={self.branch};rport",
                 "Max-Forwards: 70",
                 f"From: <sip:caller@127.0.0.1>;tag={self.tag}",
                 f"To: {to}",
                 f"Call-ID: {self.call_id}",
                 f"CSeq: {cseq or self.cseq} {method}",
                 f"Contact: <sip:caller@127.0.0.1:{self.port}>"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body:
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(body.encode())}")
        self.send_raw(("\r\n".join(lines) + "\r\n\r\n" + body).encode())

    def invite(self, formats: str = OFFER_CODECS, headers: dict[str, str] | None = None) -> None:
        self.request("INVITE", sdp_offer(self.rtp_port, formats), headers=headers)

    async def call(self, formats: str = OFFER_CODECS, headers: dict[str, str] | None = None, timeout: float = 10) -> SipResponse:
        """INVITE, wait for its final answer, ACK it; on 200 the RTP heads to the answer's address."""
        self.invite(formats, headers)
        final = await self.final_response(timeout=timeout)
        if final.status_code == 200:
            self.accept_answer(final)
        return final

    def accept_answer(self, final: SipResponse) -> None:
        self.answer = parse_sdp(final.text)
        assert self.rtp is not None and self.answer.rtp_address is not None
        self.rtp.update_remote(self.answer.rtp_address)

    async def final_response(self, method: str = "INVITE", timeout: float = 10) -> SipResponse:
        response = await self.response(lambda r: r.status_code >= 200 and r.cseq is not None and r.cseq.method == method, timeout)
        self.to_tag = response.to_addr.tag if response.to_addr is not None else None
        if method == "INVITE":
            if response.status_code == 200:
                contact = response.contact
                if contact:
                    self.remote_target = str(contact[0].uri) if not hasattr(contact[0].uri, "host") else f"sip:{contact[0].uri.host}:{contact[0].uri.port}"
                self.request("ACK", cseq=1)
            else:
                self.request("ACK", new_transaction=False, cseq=1)  # the INVITE's transaction
        return response

    async def response(self, check, timeout: float = 10) -> SipResponse:
        await self.wait_for(lambda: any(check(r) for r in self.responses), timeout)
        return next(r for r in self.responses if check(r))

    def statuses(self, method: str = "INVITE") -> list[int]:
        return [r.status_code for r in self.responses if r.cseq is not None and r.cseq.method == method]

    async def bye(self) -> SipResponse:
        self.cseq += 1
        self.request("BYE")
        return await self.response(lambda r: r.cseq is not None and r.cseq.method == "BYE")

    def cancel(self) -> None:
        self.request("CANCEL", new_transaction=False, cseq=1)

    async def info(self, body: str, content_type: str = "application/dtmf-relay") -> SipResponse:
        self.cseq += 1
        self.request("INFO", body, content_type=content_type)
        cseq = self.cseq
        return await self.response(lambda r: r.cseq is not None and r.cseq.method == "INFO" and r.cseq.seq == cseq)

    async def notify_transfer(self, sipfrag: str) -> SipResponse:
        """Report a transfer's progress, as the transferee does after a REFER (RFC 3515)."""
        self.cseq += 1
        self.request("NOTIFY", f"{sipfrag}\r\n", content_type="message/sipfrag;version=2.0",
                     headers={"Event": "refer", "Subscription-State": "terminated;reason=noresource"})
        cseq = self.cseq
        return await self.response(lambda r: r.cseq is not None and r.cseq.method == "NOTIFY" and r.cseq.seq == cseq)

    def _received(self, data: bytes) -> None:
        message = SipMessage.parse(data)
        if isinstance(message, SipResponse):
            self.responses.append(message)
        else:
            self.requests.append(message)
            if message.method in ("BYE", "REFER"):  # the server hangs up (200) or transfers the call (202)
                status = "202 Accepted" if message.method == "REFER" else "200 OK"
                lines = [f"SIP/2.0 {status}", *[f"Via: {v}" for v in message.headers.get("via")],
                         f"From: {message.get_header('from')}", f"To: {message.get_header('to')}",
                         f"Call-ID: {message.call_id}", f"CSeq: {message.get_header('cseq')}", "Content-Length: 0"]
                self.send_raw(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.changed.set()

    async def wait_for(self, check, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    # ------------------------------------------------------------------ RTP

    async def play(self, samples: np.ndarray, rate: int, packet_gap_s: float = 0.005) -> None:
        """The caller speaks: 20 ms mu-law packets (sent 4x faster than real time by default)."""
        assert self.rtp is not None
        data = mulaw(samples, rate)
        for offset in range(0, len(data) - FRAME + 1, FRAME):
            self.rtp.send_audio_auto(data[offset:offset + FRAME])
            await asyncio.sleep(packet_gap_s)

    async def dtmf(self, digit: str) -> None:
        assert self.rtp is not None
        self.rtp.send_dtmf(digit, 100, timestamp=self.rtp._sender.current_timestamp)
        self.rtp._sender.advance_timestamp()
        await asyncio.sleep(0.03)

    def heard_audio(self) -> np.ndarray:
        pcm = b"".join(self.heard)
        return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


__all__ = ["RATE", "SipPhone", "from_mulaw", "sdp_offer"]
