"""`sgl-omni bench sip`: phone calls over SIP/RTP against the server's SIP endpoint.

Each caller is what a phone sends: INVITE (PCMU, telephone-event), ACK, a spoken question as
20 ms PCMU packets paced on the caller's clock (then G.711 silence, as a phone keeps sending),
the reply's RTP, three RFC 4733 digits, BYE. The server answers through OpenAI's control plane:
its `realtime.call.incoming` webhook reaches the callers' process, which accepts the call
(`POST /v1/realtime/calls/{id}/accept`) and attaches the sideband (`GET /v1/realtime?call_id=`)
to see the DTMF events arrive. So INVITE -> 200 OK includes the webhook and the accept.

The callers run in a process of their own (`python -m benchmarks.sip`, JSON on stdout), so
their packets are timed by a loop the server does not share even when the server runs inside
the caller of `run_level` (the tests').

Measured per level:
- `invite_to_200_ms`: the INVITE leaving to its 200 OK arriving (`invite_to_webhook_ms`: to
  its webhook arriving; the rest is the accept: the session's start and the answer).

Arrivals (the 200 OK, every RTP packet) are the kernel's receive stamps of the callers'
sockets (SIOCGSTAMPNS), not when the callers' loop got to them: twenty phones, their webhook
listener, accepts and sidebands share one loop here, and its own delays (measured: the 200 OK
read 20-58 ms after it arrived at 20 calls) are no part of the server's answer or its pacing.
The loop's view is kept beside them (`*_loop_ms`), as the first runs measured.
- `first_reply_after_speech_ms`: the caller's last speech packet leaving to the first reply
  packet (the first that is not the server's G.711 silence) arriving;
  `speech_stopped_after_speech_ms`: to the sideband's `input_audio_buffer.speech_stopped`
  arriving (VAD's silence window and the inbound path; the rest is the reply's own TTFA).
- `jitter_ms`: |inter-arrival - 20 ms| of the packets from a reply's first to its last.
- `late_packets`: packets of that span arriving more than 20 ms behind the schedule their RTP
  timestamps set (against the span's earliest-arriving packet).
- `dtmf`: digits sent and `input_audio_buffer.dtmf_event_received` seen on the sideband.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import secrets
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks import stats

FRAME_S = 0.020
DIGITS = ("1", "5", "#")
WEBHOOK_SECRET = "whsec_" + "YmVuY2gtc2lwLXNlY3JldC1mb3Itd2ViaG9va3M="  # base64: the bench's own


SIOCGSTAMPNS = 0x8907  # linux/sockios.h: the receive stamp of the datagram last read from a socket


def arrival_clock(sock: socket.socket) -> Any:
    """`arrived()`: when the datagram just read from `sock` reached this host, on the monotonic
    clock (the kernel's receive stamp; the loop's time where the kernel gives none). Call it in
    the datagram's callback: the stamp is the last datagram's."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(sock.fileno(), SIOCGSTAMPNS, bytes(16))  # the first asks the kernel to stamp (ENOENT: none yet)

    def arrived() -> float:
        try:
            seconds, nanoseconds = struct.unpack("qq", fcntl.ioctl(sock.fileno(), SIOCGSTAMPNS, bytes(16)))
        except OSError:
            return time.monotonic()
        return seconds + nanoseconds / 1e9 - (time.time() - time.monotonic())

    return arrived


def sip_section(sip_port: int, webhook_port: int) -> dict[str, Any]:
    """The profile's `sip:` section for a server the bench calls: webhooks to the callers' process."""
    return {"listen": f"udp:127.0.0.1:{sip_port}", "webhook_url": f"http://127.0.0.1:{webhook_port}/webhook",
            "webhook_secret": WEBHOOK_SECRET, "answer_timeout_s": 10}


def run_level(base_url: str, sip: tuple[str, int], webhook_port: int, calls: int, utterance: Any, api_key: str | None,
              timeout_s: float = 60.0) -> dict[str, Any]:
    """One level of `calls` concurrent callers, run in a child process; its report."""
    import soxr

    from benchmarks.fixtures import SAMPLE_RATE

    speech = soxr.resample(utterance.samples, SAMPLE_RATE, 8000).astype(np.float32)
    with contextlib.ExitStack() as stack:
        import tempfile

        path = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".npy"))
        np.save(path, speech)
        path.flush()
        command = [sys.executable, "-m", "benchmarks.sip", "--url", base_url, "--sip", f"{sip[0]}:{sip[1]}", "--webhook-port", str(webhook_port),
                   "--calls", str(calls), "--speech", path.name, "--timeout", str(timeout_s)]
        if api_key:
            command += ["--api-key", api_key]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 30)
    if done.returncode != 0:
        return {"calls": calls, "error": done.stderr.strip()[-500:], **_summary([], calls)}
    return json.loads(done.stdout)


# ---------------------------------------------------------------------- the callers' process


class _Webhooks:
    """A minimal HTTP listener for `realtime.call.incoming`: each call is accepted and its
    sideband attached; `calls[sip Call-ID]` holds the sideband's DTMF keys as they come."""

    def __init__(self, base_url: str, api_key: str | None):
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.digits: dict[str, list[str]] = {}
        self.stopped: dict[str, float] = {}  # sip Call-ID -> when the sideband said speech_stopped (the first)
        self.announced: dict[str, float] = {}  # sip Call-ID -> when its webhook arrived (monotonic s)
        self.errors: list[str] = []
        self.tasks: set[asyncio.Task] = set()
        self.changed = asyncio.Event()
        self.http: Any = None  # one client for every accept: making one costs ms of this loop (its TLS context)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = time.monotonic()
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
            body = json.loads(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()
        data = body["data"]
        sip_call = next(h["value"] for h in data["sip_headers"] if h["name"].lower() == "call-id")
        self.announced[sip_call] = arrived
        task = asyncio.create_task(self._answer(data["call_id"], sip_call))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, call_id: str, sip_call: str) -> None:
        import httpx
        import websockets

        try:
            answer = await self.http.post(f"/v1/realtime/calls/{call_id}/accept", json={"type": "realtime", "instructions": "Answer briefly."})
            if answer.status_code != 200:
                self.errors.append(f"accept: {answer.status_code}")
                return
            ws_url = self.base_url.replace("http", "ws", 1) + f"/v1/realtime?call_id={call_id}"
            async with websockets.connect(ws_url, additional_headers=self.headers) as socket:
                keys = self.digits.setdefault(sip_call, [])
                self.changed.set()
                async for text in socket:
                    event = json.loads(text)
                    if event.get("type") == "input_audio_buffer.speech_stopped":
                        self.stopped.setdefault(sip_call, time.monotonic())
                    elif event.get("type") == "input_audio_buffer.dtmf_event_received":
                        keys.append(event["event"])
                        self.changed.set()
        except (OSError, websockets.exceptions.WebSocketException, httpx.HTTPError) as exc:
            if not isinstance(exc, websockets.exceptions.ConnectionClosedOK):
                self.errors.append(f"sideband: {type(exc).__name__}")

    async def until(self, check, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not check():
                    self.changed.clear()
                    await self.changed.wait()
        return bool(check())


class _Caller:
    """One phone: SIP as text over UDP, RTP on aiortp; arrivals of the reply's packets timed
    before aiortp's jitter buffer sees them."""

    def __init__(self, server: tuple[str, int]):
        self.server = server
        self.call_id = f"{secrets.token_hex(8)}@127.0.0.1"
        self.tag = secrets.token_hex(4)
        self.responses: list[Any] = []
        self.changed = asyncio.Event()
        self.arrivals: list[tuple[float, int, bytes, float]] = []  # (arrived, RTP timestamp, payload, read by the loop), monotonic s
        self.answered: list[tuple[float, float]] = []  # each response's (arrived, read by the loop), as `responses`
        self.to_tag = ""
        self.contact = f"sip:assistant@{server[0]}:{server[1]}"

    async def run(self, speech: bytes, silence: bytes, hooks: _Webhooks, timeout: float) -> dict[str, Any]:
        from aiortp import RTPSession
        from aiosipua import SipMessage, SipResponse, parse_sdp

        caller = self
        arrivals = self.arrivals
        clocks: dict[str, Any] = {}  # "sip", "rtp": the sockets' arrival clocks

        class Rtp(RTPSession):
            def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
                if len(data) > 12:
                    arrivals.append((clocks["rtp"](), int.from_bytes(data[4:8], "big"), data[12 + 4 * (data[0] & 0x0F):], time.monotonic()))
                super()._handle_rtp(data, addr)

        class Sip(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                arrived = clocks["sip"]()
                message = SipMessage.parse(data)
                if isinstance(message, SipResponse):
                    caller.responses.append(message)
                    caller.answered.append((arrived, time.monotonic()))
                    caller.changed.set()

        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(Sip, local_addr=("127.0.0.1", 0))
        clocks["sip"] = arrival_clock(self.transport.get_extra_info("socket"))
        rtp = await Rtp.create(local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", 9), payload_type=0)
        clocks["rtp"] = arrival_clock(rtp._rtp_transport._transport.get_extra_info("socket"))
        result: dict[str, Any] = {"error": None}
        try:
            rtp_port = int(rtp._rtp_transport._transport.get_extra_info("sockname")[1])
            sent = time.monotonic()
            self._request("INVITE", 1, _offer(rtp_port))
            ok = await self._final("INVITE", timeout=15)
            arrived, read = self.answered[next(i for i, r in enumerate(self.responses) if r is ok)]
            result["invite_to_200_ms"], result["invite_to_200_loop_ms"] = (arrived - sent) * 1000, (read - sent) * 1000
            if self.call_id in hooks.announced:
                result["invite_to_webhook_ms"] = (hooks.announced[self.call_id] - sent) * 1000
            if ok.status_code != 200:
                result["error"] = f"INVITE answered {ok.status_code}"
                self._request("ACK", 1, branch=self.branch)
                return result
            self.to_tag = ok.to_addr.tag if ok.to_addr is not None else ""
            self._request("ACK", 1)
            rtp.update_remote(parse_sdp(ok.text).rtp_address)
            # Speech at 20 ms pace on the caller's own clock, then silence until the reply has ended.
            packets = [speech[i:i + 160] for i in range(0, len(speech) - 159, 160)]
            start = time.monotonic()
            for n, packet in enumerate(packets):
                rtp.send_audio_auto(packet)
                await asyncio.sleep(max(0.0, start + (n + 1) * FRAME_S - time.monotonic()))
            speech_end = time.monotonic()
            n = len(packets)
            reply_ended = False
            while time.monotonic() - speech_end < timeout:
                rtp.send_audio_auto(silence)
                n += 1
                await asyncio.sleep(max(0.0, start + (n + 1) * FRAME_S - time.monotonic()))
                loud = [a for a in arrivals if a[0] > speech_end and a[2] != silence]
                if loud and time.monotonic() - loud[-1][0] > 0.4:
                    reply_ended = True
                    break
            span = [a for a in arrivals if a[0] > speech_end]
            first = next((i for i, a in enumerate(span) if a[2] != silence), None)
            if first is None or not reply_ended:
                result["error"] = "no reply audio" if first is None else "reply did not end"
            if first is not None:
                last = max(i for i, a in enumerate(span) if a[2] != silence)
                reply = span[first:last + 1]
                result["first_reply_ms"] = (reply[0][0] - speech_end) * 1000
                if self.call_id in hooks.stopped:
                    result["speech_stopped_ms"] = (hooks.stopped[self.call_id] - speech_end) * 1000
                result["jitter_ms"] = [abs((b[0] - a[0]) * 1000 - 20) for a, b in zip(reply, reply[1:])]
                result["jitter_loop_ms"] = [abs((b[3] - a[3]) * 1000 - 20) for a, b in zip(reply, reply[1:])]
                offsets = [t - ts / 8000 for t, ts, _, _ in reply]
                result["late_packets"] = sum(1 for o in offsets if o - min(offsets) > FRAME_S)
                result["reply_packets"] = len(reply)
            # DTMF: three digits, each an RFC 4733 event of 100 ms; seen once on the sideband.
            for digit in DIGITS:
                rtp.send_dtmf(digit, 100, timestamp=rtp._sender.current_timestamp)
                rtp._sender.advance_timestamp()
                await asyncio.sleep(0.03)
            keys = lambda: hooks.digits.get(self.call_id, [])  # noqa: E731
            await hooks.until(lambda: len(keys()) >= len(DIGITS), timeout=3)
            result["dtmf_sent"], result["dtmf_delivered"] = len(DIGITS), sum(1 for a, b in zip(DIGITS, keys()) if a == b)
            self._request("BYE", 2)
            bye = await self._final("BYE", timeout=5)
            if bye.status_code != 200 and result["error"] is None:
                result["error"] = f"BYE answered {bye.status_code}"
        except TimeoutError:
            result["error"] = result["error"] or "timeout"
        finally:
            await rtp.close()
            self.transport.close()
        return result

    def _request(self, method: str, cseq: int, body: str = "", branch: str | None = None) -> None:
        self.branch = branch or f"z9hG4bK{secrets.token_hex(6)}"
        port = self.transport.get_extra_info("sockname")[1]
        to = f"<sip:assistant@{self.server[0]}>" + (f";tag={self.to_tag}" if self.to_tag else "")
        uri = self.contact if method != "INVITE" else f"sip:assistant@{self.server[0]}:{self.server[1]}"
        lines = [f"{method} {uri} SIP/2.0", f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch={self.branch};rport", "Max-Forwards: 70",
                 f"From: <sip:caller@127.0.0.1>;tag={self.tag}", f"To: {to}", f"Call-ID: {self.call_id}", f"CSeq: {cseq} {method}",
                 f"Contact: <sip:caller@127.0.0.1:{port}>"]
        if body:
            lines.append("Content-Type: application/sdp")
        lines.append(f"Content-Length: {len(body.encode())}")
        self.transport.sendto(("\r\n".join(lines) + "\r\n\r\n" + body).encode(), self.server)

    async def _final(self, method: str, timeout: float) -> Any:
        def final() -> Any:
            return next((r for r in self.responses if r.status_code >= 200 and r.cseq is not None and r.cseq.method == method), None)

        async with asyncio.timeout(timeout):
            while final() is None:
                self.changed.clear()
                await self.changed.wait()
        return final()


def _offer(rtp_port: int) -> str:
    lines = ["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=bench", "c=IN IP4 127.0.0.1", "t=0 0", f"m=audio {rtp_port} RTP/AVP 0 101",
             "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-16", "a=ptime:20", "a=sendrecv"]
    return "\r\n".join(lines) + "\r\n"


def _summary(results: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    def dist(key: str) -> dict[str, Any]:
        return stats.summarize([r[key] for r in results if key in r])

    errors: dict[str, int] = {}
    for r in results:
        if r.get("error"):
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    sent = sum(r.get("dtmf_sent", 0) for r in results)
    delivered = sum(r.get("dtmf_delivered", 0) for r in results)
    jitter = [j for r in results for j in r.get("jitter_ms", [])]
    jitter_loop = [j for r in results for j in r.get("jitter_loop_ms", [])]
    return {
        "calls": calls,
        "answered": sum(1 for r in results if "first_reply_ms" in r or r.get("dtmf_sent")),
        "invite_to_200_ms": dist("invite_to_200_ms"),
        "invite_to_200_loop_ms": dist("invite_to_200_loop_ms"),
        "invite_to_webhook_ms": dist("invite_to_webhook_ms"),
        "first_reply_after_speech_ms": dist("first_reply_ms"),
        "speech_stopped_after_speech_ms": dist("speech_stopped_ms"),
        "jitter_ms": stats.summarize(jitter),
        "jitter_loop_ms": stats.summarize(jitter_loop),
        "reply_packets": sum(r.get("reply_packets", 0) for r in results),
        "late_packets": sum(r.get("late_packets", 0) for r in results),
        "dtmf": {"sent": sent, "delivered": delivered, "delivered_share": round(delivered / sent, 4) if sent else None},
        "errors": {"count": sum(errors.values()), "by_kind": errors},
    }


async def _callers(args: argparse.Namespace) -> dict[str, Any]:
    from session_server.realtime.audio_formats import g711

    speech = g711(np.load(args.speech), "audio/pcmu")
    silence = g711(np.zeros(160, np.float32), "audio/pcmu")
    import httpx
    import websockets  # noqa: F401 - imported before the calls start, not inside the first one

    hooks = _Webhooks(args.url, args.api_key)
    hooks.http = httpx.AsyncClient(base_url=args.url, headers=hooks.headers, timeout=10)
    listener = await asyncio.start_server(hooks.handle, "127.0.0.1", args.webhook_port)
    host, port = args.sip.rsplit(":", 1)
    try:
        results = await asyncio.gather(*(_Caller((host, int(port))).run(speech, silence, hooks, args.timeout) for _ in range(args.calls)),
                                       return_exceptions=True)
    finally:
        listener.close()
        for task in list(hooks.tasks):
            task.cancel()
        await hooks.http.aclose()
    reports = [r if isinstance(r, dict) else {"error": f"{type(r).__name__}: {r}"[:120]} for r in results]
    summary = _summary(reports, args.calls)
    for error in hooks.errors:
        summary["errors"]["by_kind"][error] = summary["errors"]["by_kind"].get(error, 0) + 1
        summary["errors"]["count"] += 1
    return summary


def render(levels: list[dict[str, Any]]) -> str:
    rows = ["SIP calls    INVITE->200 p50/95 ms   first reply p50/95 ms   jitter p99 ms   late   DTMF    errors"]
    for level in levels:
        def pair(d: dict[str, Any]) -> str:
            return f"{d.get('p50')}/{d.get('p95')}"

        share = level["dtmf"]["delivered_share"]
        rows.append(f"N={level['calls']:<10} {pair(level['invite_to_200_ms']):>21}   {pair(level['first_reply_after_speech_ms']):>21}   "
                    f"{level['jitter_ms'].get('p99')!s:>13}   {level['late_packets']:>4}   {'-' if share is None else f'{share:.0%}':>5}   {level['errors']['count']:>6}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sip", description="SIP callers for `sgl-omni bench sip` (one level; JSON on stdout)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--sip", required=True, help="HOST:PORT of the server's SIP endpoint")
    parser.add_argument("--webhook-port", type=int, required=True)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--speech", required=True, help=".npy of float32 8 kHz speech")
    parser.add_argument("--api-key")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_callers(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
