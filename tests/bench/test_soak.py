"""A quick form of `sgl-omni bench soak`: sessions that keep talking, reported per time window.

Against the realtime tests' fake reply node (no model: seconds, not minutes), through `--url`
as against any server; truncation itself is tested on the tiny model (tests/realtime/test_truncation.py)."""

from __future__ import annotations

import asyncio
import os

from benchmarks import report
from benchmarks.cli import main
from benchmarks.soak import parse_truncation
from tests.conftest import running_server
from tests.realtime.fakes import realtime_profile


async def test_a_short_soak_reports_every_window_with_its_turns_memory_and_errors(tmp_path, capsys):
    profile = realtime_profile(reply={"words": 2, "chunk_ms": 100, "delay_s": 0.01})
    async with running_server(profile) as server:
        args = ["soak", "--url", server.base_url, "--server-pid", str(os.getpid()), "--sessions", "2", "--minutes", "0.25",
                "--window-minutes", "0.05", "--out", str(tmp_path), "--name", "soak", "--fixtures", "synthetic",
                "--truncation", "retention_ratio:0.8"]
        assert await asyncio.to_thread(main, args) == 0
    doc = report.load_json(tmp_path / "soak.json")
    soak = doc["soak"]
    assert soak["sessions"] == 2 and soak["truncation"] == {"type": "retention_ratio", "retention_ratio": 0.8}
    windows = soak["windows"]
    assert len(windows) == 5  # 15 s in windows of 3 s
    assert [w["start_s"] for w in windows] == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert soak["errors"] == 0 and soak["context_exhausted"] == 0
    assert soak["turns"] >= 2 and sum(w["turns"] for w in windows) == soak["turns"]
    assert any(w["ttfa_ms"]["p50"] for w in windows)
    assert all(w["rss_mb"]["server"] > 0 for w in windows)
    assert "| window | turns | TTFA p50/p95 ms |" in capsys.readouterr().err


def test_the_truncation_flag_gives_the_ga_shapes():
    assert parse_truncation("auto") == "auto" and parse_truncation("disabled") == "disabled"
    assert parse_truncation("retention_ratio:0.5:1000") == {
        "type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 1000}}
