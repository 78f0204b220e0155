"""`sgl-omni bench sip`: callers in their own process against a SIP endpoint on 127.0.0.1, fake reply graph."""

from __future__ import annotations

import asyncio

from benchmarks import report
from benchmarks.cli import main
from benchmarks.server import free_port
from benchmarks.sip import WEBHOOK_SECRET
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
    assert "INVITE->200 p50/95 ms" in capsys.readouterr().out
