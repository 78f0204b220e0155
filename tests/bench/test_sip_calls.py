"""`sgl-omni bench sip`: callers in their own process against a SIP endpoint on 127.0.0.1, fake reply graph."""

from __future__ import annotations

import asyncio
import socket
import time

from benchmarks import report
from benchmarks.cli import main
from benchmarks.server import free_port
from benchmarks.sip import WEBHOOK_SECRET, arrival_clock
from tests.conftest import running_server
from tests.realtime.fakes import realtime_profile


async def test_one_call_is_answered_hears_a_reply_and_delivers_every_dtmf_digit(tmp_path, capsys):
    webhook_port = free_port()
    profile = realtime_profile(reply={"words": 3, "chunk_ms": 200, "delay_s": 0.02})
    profile["sip"] = {"listen": "udp:127.0.0.1:0", "webhook_url": f"http://127.0.0.1:{webhook_port}/webhook", "webhook_secret": WEBHOOK_SECRET}
    async with running_server(profile) as server:
        host, port = server.server.config.app.state.sip.address
        args = ["sip", "--calls", "1", "--url", server.base_url, "--sip", f"{host}:{port}", "--sip-webhook-port", str(webhook_port),
                "--out", str(tmp_path), "--name", "sip", "--fixtures", "synthetic"]
        assert await asyncio.to_thread(main, args) == 0
    (level,) = report.load_json(tmp_path / "sip.json")["sip"]["levels"]
    assert level["errors"] == {"count": 0, "by_kind": {}}
    assert level["calls"] == 1 and level["answered"] == 1
    assert level["dtmf"] == {"sent": 3, "delivered": 3, "delivered_share": 1.0}
    for key in ("invite_to_200_ms", "first_reply_after_speech_ms"):
        assert level[key]["n"] == 1 and level[key]["p50"] > 0
    # three 200 ms chunks of reply: about 30 packets, each gap timed
    assert 25 <= level["reply_packets"] <= 40 and level["jitter_ms"]["n"] == level["reply_packets"] - 1
    assert 0 < level["speech_stopped_after_speech_ms"]["p50"] < level["first_reply_after_speech_ms"]["p50"]
    assert level["late_packets"] >= 0 and 0 < level["invite_to_webhook_ms"]["p50"] <= level["invite_to_200_ms"]["p50"]
    # arrivals are the kernel's receive stamps: never after the callers' loop read them
    assert level["invite_to_200_ms"]["p50"] <= level["invite_to_200_loop_ms"]["p50"]
    assert level["jitter_loop_ms"]["n"] == level["jitter_ms"]["n"]
    assert "INVITE->200 p50/95 ms" in capsys.readouterr().out


def test_a_datagrams_arrival_is_when_the_kernel_got_it_not_when_it_was_read():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as phone, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        phone.bind(("127.0.0.1", 0))
        arrived = arrival_clock(phone)
        deadline = time.monotonic() + 2  # the kernel turns stamping on in a deferred work item: until it has, loop time
        while time.monotonic() < deadline:
            server.sendto(b"warm-up", phone.getsockname())
            time.sleep(0.005)
            phone.recvfrom(100)
            if time.monotonic() - arrived() > 0.004:
                break
        else:
            raise AssertionError("the kernel never stamped a datagram's arrival within 2 s")
        before = time.monotonic()
        server.sendto(b"SIP/2.0 200 OK", phone.getsockname())  # on loopback, delivered within the call
        sent = time.monotonic()
        time.sleep(0.05)  # the callers' loop busy elsewhere: the read comes 50 ms late
        phone.recvfrom(100)
        read = time.monotonic()
        # Bounded by the send itself, not by a wall-clock tolerance a loaded machine could break.
        assert before - 0.002 <= arrived() <= sent + 0.002 and read - arrived() > 0.04
