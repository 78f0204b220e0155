"""One quick end-to-end run of `sgl-omni bench` against a real server with test-only model nodes.

The server is the real app (realtime WebSocket and WebRTC routes, silero VAD, dialog, speech routes) on
127.0.0.1; the reply side is the fake reply node of the realtime tests and the fake speaker of
the speech tests, so the run needs no model and takes seconds. The harness drives it through
`--url`, exactly as it would drive a server started elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os

from benchmarks import report
from benchmarks.cli import main
from tests.conftest import running_server
from tests.realtime.fakes import realtime_profile
from tests.speech.fake_speaker import with_speaker


def bench_profile(voices_dir) -> dict:
    """Realtime sessions answered by the fake reply node; speech requests by the fake speaker."""
    profile = with_speaker(realtime_profile(reply={"words": 4, "chunk_ms": 200, "delay_s": 0.02}), voices_dir)
    profile["webrtc"] = {"candidates": "loopback"}
    return profile


async def test_a_quick_run_measures_realtime_sessions_webrtc_calls_and_speech_requests(tmp_path, capsys):
    async with running_server(bench_profile(tmp_path / "voices")) as server:
        args = ["realtime", "webrtc", "speech", "--quick", "--url", server.base_url, "--server-pid", str(os.getpid()), "--out", str(tmp_path), "--name", "quick", "--fixtures", "synthetic", "--level-budget", "0.3"]
        assert await asyncio.to_thread(main, args) == 0
    out = capsys.readouterr().out
    doc = report.load_json(tmp_path / "quick.json")  # validates the schema

    # Realtime: 1 then 2 concurrent sessions, one spoken turn each, every turn answered.
    levels = {level["sessions"]: level for level in doc["realtime"]["levels"]}
    assert sorted(levels) == [1, 2]
    for sessions, level in levels.items():
        assert level["errors"]["count"] == 0, level["errors"]
        assert level["turns_completed"] == sessions
        ttfa = level["ttfa_from_speech_stopped_ms"]
        assert ttfa["n"] == sessions and 0 < ttfa["p50"] <= ttfa["p95"] <= ttfa["p99"]
        # The user's audio ends before VAD can call it (a silence window later): TTFA from the end of audio is longer.
        assert level["ttfa_from_user_audio_end_ms"]["p50"] > ttfa["p50"]
        # The fake reply is 4 chunks of 200 ms; every turn was played by the simulated player.
        assert level["reply_audio_s"]["p50"] == 0.8
        assert level["underruns"]["stall_ms"]["n"] == sessions
        assert level["underruns"]["total_with_100ms_buffer"] <= level["underruns"]["total"]  # a buffer only helps
        assert level["client_cpu_percent"] is not None and level["server"]["machine_cpu_percent"] is not None
        assert level["events_per_s"] > 0 and level["generation_text_tok_per_s"] > 0  # 4 words a reply
        assert level["server"]["rss_mb"] > 0
    assert doc["settings"]["fixtures"]["source"] == "synthetic"
    # The report says how the server was scheduled (here it is this process's main thread).
    assert doc["server"]["sched"] == "normal" and "server scheduled normal" in out
    assert all(level["server"]["sched_batch_share"] == 0.0 for level in levels.values())  # sampled with its CPU

    # The streaming cost: the 2 sessions sent silence at 20 ms pace for ~1 s, and both
    # processes' CPU per append came out of it.
    streaming = doc["realtime"]["streaming"]
    assert streaming["sessions"] == 2 and streaming["chunk_ms"] == 20
    assert 50 <= streaming["appends"] <= 2 * streaming["seconds"] * 1000 / 20 + 4
    assert streaming["server_us_per_append"] > 0 and streaming["client_us_per_append"] > 0
    assert streaming["server_cpu_percent"] > 0

    # WebRTC: one call, its turn answered with audio on the server's track.
    (call,) = doc["webrtc"]["levels"]
    assert call["sessions"] == 1 and call["errors"]["count"] == 0, call["errors"]
    assert call["turns_completed"] == 1 and call["ttfa_from_speech_stopped_ms"]["p50"] > 0

    # Speech: whole-file and SSE at concurrency 1 and 2, and the batch endpoint.
    modes = {(level["concurrency"], level["mode"]) for level in doc["speech"]["levels"]}
    assert modes == {(1, "file"), (1, "sse"), (2, "file"), (2, "sse")}
    for level in doc["speech"]["levels"]:
        assert level["errors"]["count"] == 0 and level["ok"] >= level["concurrency"]
        assert level["audio_s_per_s"] > 0
        if level["mode"] == "sse":
            assert 0 < level["first_chunk_ms"]["p50"] <= level["latency_ms"]["p50"]
    assert doc["speech"]["batch"]["succeeded"] == 2

    # The table, the JSON and the plot all came out.
    assert "TTFA stop p50/95/99 ms" in out and "batch of 2" in out and "streaming: 2 sessions sending silence" in out
    assert (tmp_path / "quick.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "quick.json").read_text())["server"]["url"] == server.base_url


async def test_sessions_the_server_refuses_are_counted_as_errors_by_kind(tmp_path):
    profile = realtime_profile(reply={"words": 2, "chunk_ms": 100}, limits={"max_sessions": 1})
    async with running_server(profile) as server:
        args = ["realtime", "--sessions", "2", "--turns", "1", "--stagger", "0.3", "--url", server.base_url, "--out", str(tmp_path), "--name", "refused", "--fixtures", "synthetic"]
        assert await asyncio.to_thread(main, args) == 0
    (level,) = report.load_json(tmp_path / "refused.json")["realtime"]["levels"]
    assert level["turns_planned"] == 2 and level["turns_completed"] == 1
    # One refusal is one error: the close and the dropped connection that follow it are the same failure.
    assert level["errors"] == {"count": 1, "by_kind": {"error: session_limit_reached": 1}}
    assert level["server"]["cpu_percent"] is None  # no --server-pid: not ours to watch


async def test_probes_the_server_refuses_report_why_and_the_run_goes_on(tmp_path, capsys):
    profile = realtime_profile(reply={"words": 2, "chunk_ms": 100}, limits={"max_sessions": 1})
    async with running_server(profile) as server:
        args = ["realtime", "--sessions", "2", "--turns", "1", "--stagger", "0.3", "--quick", "--url", server.base_url,
                "--server-pid", str(os.getpid()), "--out", str(tmp_path), "--name", "probes", "--fixtures", "synthetic"]
        assert await asyncio.to_thread(main, args) == 0
    realtime = report.load_json(tmp_path / "probes.json")["realtime"]
    # Both probes hold 2 sessions open; the server admits 1 and closes the other with its reason.
    for probe in ("idle_memory", "streaming"):
        assert realtime[probe]["sessions"] == 2
        assert "session_limit_reached" in realtime[probe]["error"]
    out = capsys.readouterr().out
    assert "memory: not measured (2 idle sessions: " in out and "streaming: not measured (2 sessions: " in out
