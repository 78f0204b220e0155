"""The GPU probe runs its whole path on CPU with the 30B-A3B layout shrunk 16 times."""

from __future__ import annotations

import json

from benchmarks import gpu_probe, probe_stages

INTERFACE_KEYS = ("wall_ms", "gpu_ms", "launches", "host_syncs", "roofline_ms")


def test_every_stage_runs_on_cpu_and_reports_the_interface_keys(tmp_path, capsys):
    assert gpu_probe.main(["--device", "cpu", "--shrink", "16", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-probe.json").read_text())
    expected = ([f"thinker_decode.b{b}.{c}" for c in ("1k", "8k", "32k") for b in (1, 8, 16, 32, 64)]
                + ["thinker_prefill.1k", "thinker_prefill.8k", "talker_frame.b1", "talker_frame.b16", "talker_frame.b64",
                   "code2wav_chunk", "audio_encoder.5s"])
    assert list(report["stages"]) == expected
    for name, figures in report["stages"].items():
        assert "skipped" not in figures, (name, figures)
        assert set(INTERFACE_KEYS) <= set(figures)
        assert figures["wall_ms"] > 0 and figures["roofline_ms"] > 0
        assert figures["gpu_ms"] is None  # no CUDA events on CPU
        assert figures["launches"] == figures["ops"] > 0  # on CPU: the aten operators a launch each on CUDA
        assert figures["host_syncs"] >= 0 and figures["memory_gib"] > 0
    # The contexts are divided by the shrink too: 32k -> 2048 tokens of KV per row.
    assert report["stages"]["thinker_decode.b16.32k"]["context_tokens"] == 2048
    assert report["stages"]["thinker_decode.b16.32k"]["batch"] == 16
    assert report["shrink"] == 16 and report["dtype"] == "float32" and report["rates"]["bandwidth_from"] == "measured"
    for batch in (1, 16, 64):  # --graphs auto (the default): the talker's frames replayed captured, one host read each
        talker = report["stages"][f"talker_frame.b{batch}"]
        assert talker["graphs"] == "auto" and talker["replayed_frames"] > 0 and talker["host_syncs"] == 1
    table = capsys.readouterr().out
    assert all(name in table for name in expected) and "roofline_ms" in table


def test_graphs_both_times_a_stage_without_a_captured_path_eager_once_and_says_so(tmp_path):
    assert gpu_probe.main(["--device", "cpu", "--shrink", "16", "--graphs", "both", "--stages", "audio_encoder",
                           "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-probe.json").read_text())
    assert list(report["stages"]) == ["audio_encoder.5s"] and "captured" not in report
    assert any("no captured steps for audio_encoder.5s" in note for note in report["notes"])


def test_graphs_both_times_the_code2wav_chunk_eager_then_captured(tmp_path):
    assert gpu_probe.main(["--device", "cpu", "--shrink", "16", "--graphs", "both", "--stages", "code2wav",
                           "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-probe.json").read_text())
    eager, captured = report["stages"]["code2wav_chunk"], report["captured"]["code2wav_chunk"]
    assert eager["graphs"] == "off" and eager["replayed_chunks"] == 0
    assert captured["graphs"] == "auto" and captured["replayed_chunks"] > 0


def test_a_stage_that_does_not_fit_in_memory_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_stages, "memory_free", lambda device: probe_stages.HEADROOM["cpu"])
    assert gpu_probe.main(["--device", "cpu", "--shrink", "16", "--stages", "thinker_decode.b64",
                           "--out", str(tmp_path)]) == 1  # nothing ran
    stages = json.loads((tmp_path / "gpu-probe.json").read_text())["stages"]
    assert list(stages) == ["thinker_decode.b64.1k", "thinker_decode.b64.8k", "thinker_decode.b64.32k"]
    for figures in stages.values():
        assert figures["skipped"].startswith("needs ") and "KV of 64 x" in figures["skipped"]


def test_the_check_names_torch_and_passes_here(capsys):
    assert gpu_probe.main(["--check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "torch " in out and out.rstrip().endswith("ok")


def test_graphs_both_times_the_thinker_decode_step_eager_then_captured(tmp_path):
    assert gpu_probe.main(["--device", "cpu", "--shrink", "16", "--graphs", "both", "--stages", "thinker_decode.b16.1k",
                           "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-probe.json").read_text())
    eager, captured = report["stages"]["thinker_decode.b16.1k"], report["captured"]["thinker_decode.b16.1k"]
    assert eager["graphs"] == "off" and eager["replayed_steps"] == 0
    assert captured["graphs"] == "auto" and captured["replayed_steps"] > 0
    assert eager["host_syncs"] == captured["host_syncs"] == 1  # the chosen ids, read once per step
