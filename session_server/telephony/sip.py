"""The SIP endpoint (`serve --sip udp:HOST:PORT`, the profile's `sip.listen`): calls become sessions.

A user agent server on aiosipua over UDP. An INVITE with an SDP offer goes:

    INVITE --> 100 Trying (aiosipua) --> checks --> 180 Ringing --> pending call `sip_...`
      no `sip.webhook_url`: accepted at once with `sip.accept`
      with one: `realtime.call.incoming` POSTed there (sip_control.py); the application
        answers with POST /v1/realtime/calls/{call_id}/accept | reject, or nobody does and
        after `sip.answer_timeout_s` the call gets 480
    accept --> session (phone_session.py) + RTP (sip_media.py, its sockets opened while the
      call rang) --> 200 OK with the SDP answer
    ACK; then BYE from either side, REFER (transfer) from ours; CANCEL while pending; OPTIONS: 200

The checks, cheapest first, each a refusal logged once (one line, never a traceback):
malformed message -> 400 (when it names enough to route an answer; else dropped), no SDP offer
or malformed SDP -> 400/488, no PCMU/PCMA at 8 kHz -> 488, the server draining -> 503, no free
session slot (live sessions plus calls still ringing) -> 486. So an INVITE flood is bounded by
the session limit and costs a call in progress nothing but the parse.

The answer offers the codec the caller preferred of PCMU (0) and PCMA (8), and
`telephone-event/8000` under the caller's payload type when it offered one (RFC 4733 DTMF);
SIP INFO `application/dtmf-relay` (and `application/dtmf`) keys are taken too. Each live call is
a `PhoneCall` (phone_call.py) with the id `sip_...`, where `GET /v1/realtime?call_id=` attaches a
sideband as for the carrier media stream.

Not served: TCP/TLS, SRTP, delayed offers (an INVITE without SDP), re-INVITE renegotiation
(a re-INVITE is answered with the session's SDP unchanged), authentication (put the endpoint on a
network only the trunk reaches, or behind an SBC).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from aiosipua import IncomingCall, SipMessage, SipRequest, SipUAS, UdpSipTransport, negotiate_sdp, parse_sdp
from aiosipua.dialog import DialogState
from aiosipua.message import missing_required_headers
from aiosipua.transport import _stamp_via_received

from graph.errors import SessionRejected
from session_server.realtime.audio_formats import PCMA, PCMU
from session_server.realtime.events import RealtimeError
from session_server.state import ServerState
from session_server.telephony.config import TelephonyConfig
from session_server.telephony.phone_call import DTMF_KEYS, PhoneCall
from session_server.telephony.phone_session import phone_audio, phone_protocol, start_call
from session_server.telephony.registry import PhoneCalls
from graph.background import spawn
from session_server.telephony.sip_media import PeerRtpSession, RtpWire, open_rtp, rtp_port

log = logging.getLogger("session_server.telephony")
# Every refusal is logged here, once, as one line; aiosipua's own warnings about the same
# messages (with a traceback for some) would say it twice.
logging.getLogger("aiosipua").setLevel(logging.ERROR)

CODECS = {0: PCMU, 8: PCMA}  # RTP payload type -> session audio format, 8 kHz both
DEFAULT_DTMF_PAYLOAD_TYPE = 101
DTMF_BODIES = ("application/dtmf-relay", "application/dtmf")  # SIP INFO keys (de facto, as PBXes send them)
USER_AGENT = "sgl-omni"
# A rejected INVITE's call is forgotten after this long even if its ACK never comes (64*T1).
FORGET_AFTER_S = 32.0
# How long a sent webhook may take (its answer, not the application's accept).
WEBHOOK_TIMEOUT_S = 5.0


class CallRefusal(Exception):
    """An `accept`/`reject`/`refer`/`hangup` the endpoint refuses: an HTTP status and a code."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


@dataclass(eq=False)
class PendingCall:
    """A call that rang and has not been answered yet."""

    id: str
    invite: IncomingCall
    payload_type: int
    dtmf_payload_type: int | None
    answering: bool = False  # an accept is in progress: the answer timeout lets it finish
    expired: bool = False  # the answer timeout passed during an accept: if that fails, 480
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # Its RTP session, opened as it starts to ring so that the accept does not wait for the
    # sockets; an accept takes it (None then), a call that ends unanswered closes it.
    media: asyncio.Task[PeerRtpSession] | None = None

    @property
    def kind(self) -> str:
        return CODECS[self.payload_type]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, transport: _Transport):
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport._dispatch(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip: socket error: %s", exc)  # an ICMP unreachable from a caller gone away


class _Transport(UdpSipTransport):
    """aiosipua's UDP transport, answering a message it cannot parse with 400 (logged once,
    without the traceback aiosipua logs), on a protocol that also runs under uvloop (aiosipua's
    asserts asyncio's own transport class)."""

    async def start(self) -> None:
        self._udp_transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Datagrams(self), local_addr=self.local_addr)

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            message = SipMessage.parse(data)
        except Exception as error:  # noqa: BLE001 - whatever the parser says, the datagram is malformed
            self._refuse(data, addr, f"malformed message: {error}")
            return
        if isinstance(message, SipRequest):
            missing = missing_required_headers(message)
            if missing and "via" in missing:
                log.info("sip: %s from %s:%s dropped: no Via to answer it by", message.method, addr[0], addr[1])
                return
            why = f"missing {', '.join(missing)}" if missing else _malformed(message)
            if why is not None:
                self._refuse(data, addr, f"{message.method} {message.call_id}: {why}")
                return
            _stamp_via_received(message, addr)
        if self.on_message is not None:
            self.on_message(message, addr)

    def _refuse(self, data: bytes, addr: tuple[str, int], why: str) -> None:
        """400, answered where it came from (its own Via may be what is wrong)."""
        reply = _bad_request(data)
        log.info("sip: from %s:%s %s: %s", addr[0], addr[1], "refused (400)" if reply is not None else "dropped", why)
        if reply is not None and self._udp_transport is not None:
            self._udp_transport.sendto(reply, addr)


def _bad_request(data: bytes) -> bytes | None:
    """A 400 for an unparseable request, its headers copied as text; None when it is no request."""
    lines = data.decode("utf-8", "replace").split("\n")
    if not lines[0].rstrip().endswith("SIP/2.0"):
        return None  # a response, or noise: nothing to answer
    copied = [line.rstrip("\r") for line in lines[1:64]
              if line.split(":", 1)[0].strip().lower() in ("via", "v", "from", "f", "to", "t", "call-id", "i", "cseq")]
    if not any(line.split(":", 1)[0].strip().lower() in ("via", "v") for line in copied):
        return None
    return ("\r\n".join(["SIP/2.0 400 Bad Request", *copied, f"User-Agent: {USER_AGENT}", "Content-Length: 0"]) + "\r\n\r\n").encode()


_CSEQ = re.compile(r"^\s*(\d{1,10})\s+([A-Za-z]+)\s*$")
_VIA = re.compile(r"^\s*SIP\s*/\s*2\.0\s*/\s*[A-Za-z]+\s+[^\s;,]+")
_ADDRESS = re.compile(r"^[^<>]*<\s*(sips?|tel):[^<>\s]+>[^<>]*$|^\s*(sips?|tel):[^<>\s;]+(;[^<>]*)?$", re.IGNORECASE)


def _malformed(request: SipRequest) -> str | None:
    """Why a request aiosipua parsed is not well formed (RFC 3261 §20 and §25), or None.
    aiosipua is lenient here: it would answer an INVITE whose CSeq is `nonsense`."""
    cseq = _CSEQ.match(request.get_header("cseq") or "")
    if cseq is None or cseq.group(2).upper() != request.method.upper():
        return f"CSeq {request.get_header('cseq')!r} is not `NUMBER {request.method}`"
    if not _VIA.match(request.get_header("via") or ""):
        return f"Via {request.get_header('via')!r} is not `SIP/2.0/TRANSPORT HOST`"
    for name in ("from", "to"):
        if not _ADDRESS.match(request.get_header(name) or ""):
            return f"{name.title()} {request.get_header(name)!r} is not a sip:, sips: or tel: address"
    contact = request.get_header("contact")
    if contact is not None and contact.strip() != "*" and not _ADDRESS.match(contact.split(",")[0]):
        return f"Contact {contact!r} is not a sip:, sips: or tel: address"
    max_forwards = request.get_header("max-forwards")
    if max_forwards is not None and not max_forwards.strip().isdigit():
        return f"Max-Forwards {max_forwards!r} is not a number"
    return None


class _Uas(SipUAS):
    """aiosipua's UAS, with INFO (DTMF relay), malformed SDP refused before aiosipua parses it,
    INVITE retransmissions recognised, and calls forgotten once over."""

    def __init__(self, transport: _Transport, on_info: Any):
        super().__init__(transport, user_agent=USER_AGENT)
        self._handlers["INFO"] = on_info

    def _handle_invite(self, request: SipRequest, addr: tuple[str, int]) -> None:
        existing = self._calls.get(request.call_id or "")
        if existing is not None and existing.dialog.state == DialogState.EARLY:
            existing.trying()  # a retransmission of an INVITE still being answered
            return
        if request.body and request.content_type == "application/sdp":
            try:
                parse_sdp(request.text)
            except (ValueError, IndexError) as error:
                self.refuse(request, addr, 400, "Bad Request", f"malformed SDP: {error}")
                return
        super()._handle_invite(request, addr)

    def refuse(self, request: SipRequest, addr: tuple[str, int], status: int, reason: str, why: str) -> None:
        log.info("sip: %s %s from %s:%s refused (%d): %s", request.method, request.call_id, addr[0], addr[1], status, why)
        self._send_error(request, status, reason)

    def reply(self, call: IncomingCall, request: SipRequest, status: int, reason: str) -> None:
        self.transport.send_reply(call.dialog.create_response(request, status, reason))

    def forget(self, call: IncomingCall) -> None:
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]
        self._remove_invite_transaction(call.invite)
        call._stop_retransmissions()


class SipEndpoint:
    """The SIP user agent server of one app: pending calls by id, live calls in `calls`."""

    def __init__(self, state: ServerState, calls: PhoneCalls, config: TelephonyConfig, webhooks: Any = None):
        assert config.listen is not None
        self.state = state
        self.calls = calls
        self.config = config
        self.webhooks = webhooks  # sip_control.Webhooks when `sip.webhook_url` is set
        self.transport = _Transport(local_addr=config.listen)
        self.uas = _Uas(self.transport, self._on_info)
        self.uas.on_invite = self._on_invite
        self.uas.on_cancel = self._on_cancel
        self.uas.on_bye = self._on_bye
        self.uas.on_reinvite = self._on_reinvite
        self.uas.on_ack_timeout = self._on_ack_timeout
        self.uas.on_transfer_progress = self._on_transfer_progress
        self.pending: dict[str, PendingCall] = {}
        self._by_sip_call: dict[str, str] = {}  # SIP Call-ID -> our call id (pending or live)
        self._invites: dict[str, IncomingCall] = {}  # our call id -> its INVITE (live calls)

    @property
    def address(self) -> tuple[str, int]:
        assert self.transport._udp_transport is not None
        host, port = self.transport._udp_transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    async def start(self) -> None:
        await self.uas.start()
        log.info("sip: listening on udp:%s:%s", *self.address)

    async def stop(self) -> None:
        for pending in list(self.pending.values()):
            self._end_pending(pending, 503, "server shutting down")
        await self.uas.stop()

    # ------------------------------------------------------------------ an INVITE arrives

    def _on_invite(self, invite: IncomingCall) -> None:
        request, addr = invite.invite, invite.source_addr
        offer = invite.sdp_offer
        refusal = None
        audio = offer.audio if offer is not None else None
        offered = [codec.payload_type for codec in audio.codecs] if audio is not None else []
        chosen = next((pt for pt in offered if pt in CODECS), None)
        if offer is None:
            refusal = (488, "Not Acceptable Here", "no SDP offer (delayed offers are not served)")
        elif audio is None or offer.rtp_address is None:
            refusal = (488, "Not Acceptable Here", "the offer has no audio stream with an address")
        elif chosen is None:
            refusal = (488, "Not Acceptable Here", f"no common codec: offered payload types {offered}, served PCMU (0), PCMA (8)")
        elif self.state.shutting_down:
            refusal = (503, "Service Unavailable", "the server is shutting down")
        elif self.state.free_session_slots() - len(self.pending) <= 0:
            refusal = (486, "Busy Here", "no free session slot")
        if refusal is not None:
            status, reason, why = refusal
            log.info("sip: INVITE %s from %s:%s refused (%d): %s", request.call_id, addr[0], addr[1], status, why)
            invite.reject(status, reason)
            self._forget_later(invite)
            return
        assert audio is not None and chosen is not None
        dtmf = next((c.payload_type for c in audio.codecs if c.encoding_name.lower() == "telephone-event" and c.clock_rate == 8000), None)
        pending = PendingCall(f"sip_{secrets.token_hex(12)}", invite, chosen, dtmf)
        self.pending[pending.id] = pending
        self._by_sip_call[invite.call_id] = pending.id
        invite.ringing()
        log.info("sip: call %s (INVITE %s from %s:%s) ringing", pending.id, invite.call_id, addr[0], addr[1])
        pending.media = self._open_media(pending)
        if self.webhooks is None:
            self._spawn(pending, self._auto_accept(pending), "accept")
        else:
            self._spawn(pending, self._announce(pending), "webhook")
            self._spawn(pending, self._answer_timeout(pending), "answer-timeout")

    async def _auto_accept(self, pending: PendingCall) -> None:
        try:
            await self.accept(pending.id, self.config.accept)
        except CallRefusal:
            pass  # accept() already answered the caller and logged why

    async def _announce(self, pending: PendingCall) -> None:
        headers = [(name, value) for name, values in pending.invite.invite.headers.items() for value in values]
        if not await self.webhooks.call_incoming(pending.id, headers) and not pending.answering:
            self._end_pending(pending, 480, "the webhook was not delivered")

    async def _answer_timeout(self, pending: PendingCall) -> None:
        await asyncio.sleep(self.config.answer_timeout_s)
        pending.expired = True
        if not pending.answering:
            self._end_pending(pending, 480, f"not accepted within {self.config.answer_timeout_s:g} s")

    # ------------------------------------------------------------------ the control plane (sip_control.py)

    async def accept(self, call_id: str, session: dict[str, Any]) -> PhoneCall:
        """Answer a pending call with `session` (a GA session object). A session config the
        core refuses leaves the call ringing (the application may accept again), except without
        a webhook (nobody would) or once the answer timeout passed; no free slot answers 486."""
        pending = self._pending(call_id)
        if pending.answering:
            raise CallRefusal(409, "call_already_accepted", f"Call {call_id!r} is already being accepted.", "call_id")
        pending.answering = True
        invite, rtp = pending.invite, None
        try:
            # The wire's formats last: the session says what the line carries, whatever the body said.
            protocol = await phone_protocol(self.state, f"sess_{secrets.token_hex(12)}", session, phone_audio(pending.kind))
            self._still_pending(pending)
            rtp = await self._take_media(pending)
            self._still_pending(pending)
            wire = RtpWire(rtp, pending.kind, lambda reason: self._send_bye(invite))
            call = await start_call(self.state, self.calls, pending.id, protocol, wire, "sip", self.config.media_timeout_s,
                                    on_closed=self._call_closed)
        except RealtimeError as error:
            # The application may fix its session and accept again; the answer timeout still runs.
            # A profile's `sip.accept` the core refuses answers every call with 500.
            await self._close_rtp(rtp)
            pending.answering = False
            if self.webhooks is None or error.type == "server_error" or pending.expired:
                self._end_pending(pending, 480 if pending.expired else 500, f"session config refused: {error.code}: {error.message}")
            raise CallRefusal(400, error.code, error.message, error.param) from None
        except SessionRejected as rejected:
            await self._close_rtp(rtp)
            busy = rejected.code == "session_limit_reached"
            self._end_pending(pending, 486 if busy else 503, f"{rejected.code}: {rejected.message}")
            raise CallRefusal(429 if busy else 503, rejected.code, rejected.message) from None
        except CallRefusal:
            await self._close_rtp(rtp)
            pending.answering = False
            raise
        except BaseException:
            await self._close_rtp(rtp)
            self._end_pending(pending, 500, "internal error while answering")
            raise
        # No await from here on: the 200 OK leaves with the session started.
        if self.pending.get(pending.id) is not pending:  # cancelled while the session opened
            call.close_soon("caller_cancelled")
            raise CallRefusal(404, "call_not_found", f"Call {call_id!r} was cancelled by the caller.", "call_id")
        del self.pending[pending.id]
        self._stop_tasks(pending)
        answer, _ = negotiate_sdp(invite.sdp_offer, rtp.local_ip, rtp_port(rtp), supported_codecs=[pending.payload_type],
                                  dtmf_payload_type=pending.dtmf_payload_type or 0, session_name=USER_AGENT)
        invite.accept(answer)
        self._invites[pending.id] = invite
        wire.call = call
        log.info("sip: call %s answered (%s), session %s", pending.id, pending.kind, protocol.session_id)
        return call

    def reject(self, call_id: str, status_code: int) -> None:
        self._end_pending(self._pending(call_id), status_code, "rejected by the application")

    def refer(self, call_id: str, target_uri: str) -> None:
        """Transfer a live call (REFER to the caller); it ends once the transfer succeeds."""
        invite = self._live_invite(call_id)
        address = invite._signaling_addr()
        refer = invite.dialog.create_request("REFER", via_host=address[0], via_port=address[1])
        refer.headers.set_single("Refer-To", f"<{target_uri}>")
        refer.headers.set_single("Contact", f"<sip:{address[0]}:{address[1]}>")
        refer.headers.set_single("User-Agent", USER_AGENT)
        self.transport.send(refer, invite.source_addr)
        log.info("sip: call %s referred to %s", call_id, target_uri)

    async def hangup(self, call_id: str) -> bool:
        """End a call: BYE when live, 603 when still ringing. False when there is no such call."""
        if call_id in self.pending:
            self._end_pending(self.pending[call_id], 603, "hung up by the application")
            return True
        call = self.calls.get(call_id)
        if call is None or call_id not in self._invites:
            return False
        await call.close("hangup")
        return True

    # ------------------------------------------------------------------ the caller's requests

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        pending = self.pending.get(self._by_sip_call.get(request.call_id or "", ""))
        if pending is not None and self._drop_pending(pending):
            log.info("sip: call %s cancelled by the caller", pending.id)

    def _on_bye(self, invite: IncomingCall, request: SipRequest) -> None:
        call = self.calls.get(self._by_sip_call.get(invite.call_id, ""))
        if call is not None:
            call.close_soon("caller_hung_up")

    def _on_ack_timeout(self, invite: IncomingCall) -> None:
        call = self.calls.get(self._by_sip_call.get(invite.call_id, ""))
        if call is not None:
            log.info("sip: call %s: no ACK for its 200 OK", call.id)
            call.close_soon("no_ack")

    def _on_reinvite(self, invite: IncomingCall) -> None:
        invite.accept(invite.sdp_answer)  # the media stays as negotiated

    def _on_transfer_progress(self, sip_call_id: str, status: int, reason: str) -> None:
        call = self.calls.get(self._by_sip_call.get(sip_call_id, ""))
        if call is not None and 200 <= status < 300:
            call.close_soon("transferred")

    def _on_info(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call_id = self._by_sip_call.get(request.call_id or "", "")
        call, invite = self.calls.get(call_id), self._invites.get(call_id)
        if call is None or invite is None:
            self.uas.refuse(request, addr, 481, "Call/Transaction Does Not Exist", "INFO outside a live call")
            return
        if not self.uas._validate_in_dialog(invite.dialog, request):
            return
        content_type = (request.content_type or "").split(";")[0].strip().lower()
        if content_type not in DTMF_BODIES:
            self.uas.refuse(request, addr, 415, "Unsupported Media Type", f"INFO with {content_type or 'no body'}: not a DTMF key")
            return
        key = _dtmf_key(content_type, request.text)
        if key is None:
            self.uas.refuse(request, addr, 400, "Bad Request", f"INFO {content_type} names no key of 0-9, *, #, A-D")
            return
        self.uas.reply(invite, request, 200, "OK")
        call.dtmf(key)

    # ------------------------------------------------------------------ bookkeeping

    def _pending(self, call_id: str) -> PendingCall:
        pending = self.pending.get(call_id)
        if pending is not None:
            return pending
        if call_id in self._invites:
            raise CallRefusal(409, "call_already_accepted", f"Call {call_id!r} has already been answered.", "call_id")
        raise CallRefusal(404, "call_not_found", f"No pending SIP call {call_id!r}.", "call_id")

    def _still_pending(self, pending: PendingCall) -> None:
        if self.pending.get(pending.id) is not pending:
            raise CallRefusal(404, "call_not_found", f"Call {pending.id!r} was cancelled by the caller.", "call_id")

    def _live_invite(self, call_id: str) -> IncomingCall:
        invite = self._invites.get(call_id)
        if invite is None or self.calls.get(call_id) is None:
            raise CallRefusal(404, "call_not_found", f"No live SIP call {call_id!r}.", "call_id")
        return invite

    def _end_pending(self, pending: PendingCall, status: int, why: str) -> None:
        if not self._drop_pending(pending):
            return
        log.info("sip: call %s refused (%d): %s", pending.id, status, why)
        pending.invite.reject(status)
        self._forget_later(pending.invite)

    def _send_bye(self, invite: IncomingCall) -> None:
        if invite.dialog.state == DialogState.CONFIRMED:  # not when the caller's BYE ended it
            invite.hangup()
        self.uas.forget(invite)

    def _call_closed(self, call: PhoneCall) -> None:
        invite = self._invites.pop(call.id, None)
        if invite is not None:
            self._by_sip_call.pop(invite.call_id, None)

    def _drop_pending(self, pending: PendingCall) -> bool:
        """Forget a call that ends unanswered (cancelled, refused): its tasks stopped, its RTP
        session closed. False when it was not pending any more."""
        if self.pending.pop(pending.id, None) is None:
            return False
        self._by_sip_call.pop(pending.invite.call_id, None)
        self._stop_tasks(pending)
        self._release_media(pending)
        return True

    @staticmethod
    def _stop_tasks(pending: PendingCall) -> None:
        """Stop a call's signalling tasks, but not an accept in progress: it finds the call gone
        at its next step and releases what it opened (a cancel mid-way could leave a session)."""
        for task in pending.tasks:
            if task is not asyncio.current_task() and not (pending.answering and task.get_name().endswith(":accept")):
                task.cancel()

    def _forget_later(self, invite: IncomingCall) -> None:
        asyncio.get_running_loop().call_later(FORGET_AFTER_S, self.uas.forget, invite)

    def _spawn(self, pending: PendingCall, coroutine: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"{pending.id}:{name}")
        pending.tasks.add(task)
        task.add_done_callback(pending.tasks.discard)

    def _open_media(self, pending: PendingCall) -> asyncio.Task[PeerRtpSession]:
        invite = pending.invite
        assert invite.sdp_offer is not None and invite.sdp_offer.rtp_address is not None
        return asyncio.get_running_loop().create_task(
            open_rtp(pending.id, self._local_ip(invite.source_addr[0]), invite.sdp_offer.rtp_address, pending.payload_type,
                     pending.dtmf_payload_type or DEFAULT_DTMF_PAYLOAD_TYPE, self.config.rtp_latching),
            name=f"{pending.id}:media")

    async def _take_media(self, pending: PendingCall) -> PeerRtpSession:
        """The call's RTP session, for the accept to own (opened now if none is open)."""
        media, pending.media = pending.media or self._open_media(pending), None
        try:
            return await asyncio.shield(media)
        except asyncio.CancelledError:
            pending.media = media  # the accept was cancelled: the call keeps it (and closes it when it ends)
            if self.pending.get(pending.id) is not pending:
                self._release_media(pending)
            raise

    def _release_media(self, pending: PendingCall) -> None:
        """Close the RTP session of a call that ends unanswered: now, or once it is open."""
        media, pending.media = pending.media, None

        def close(opened: asyncio.Task[PeerRtpSession]) -> None:
            if not opened.cancelled() and opened.exception() is None:
                spawn(self._close_rtp(opened.result()), name=f"{pending.id}:media-close")

        if media is not None:
            media.add_done_callback(close)

    def _local_ip(self, peer_ip: str) -> str:
        """The address to advertise and bind RTP on: the SIP socket's, or when that is a
        wildcard, the one this host routes toward the caller from."""
        host = self.address[0]
        if host not in ("0.0.0.0", "::"):
            return host
        with socket.socket(socket.AF_INET6 if ":" in peer_ip else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer_ip, 9))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])

    @staticmethod
    async def _close_rtp(rtp: Any) -> None:
        if rtp is not None:
            with contextlib.suppress(Exception):
                await rtp.close()


def _dtmf_key(content_type: str, body: str) -> str | None:
    """The key of an INFO body: `application/dtmf-relay` (`Signal=5`, `Duration=160`) or
    `application/dtmf` (`5`)."""
    if content_type == "application/dtmf-relay":
        for line in body.splitlines():
            name, _, value = line.partition("=")
            if name.strip().lower() == "signal":
                key = value.strip().upper()
                return key if key in DTMF_KEYS else None
        return None
    if content_type == "application/dtmf":
        key = body.strip().upper()
        return key if key in DTMF_KEYS else None
    return None
