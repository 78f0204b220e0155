"""Reports: the JSON schema, turn accounting, the stdout table, the plot, and `--compare` deltas."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import report
from benchmarks.cli import main
from benchmarks.realtime import RealtimeSettings, Reply, SessionResult, TurnRecord, summarize_level


def _turn(session: int, stopped: float, first_audio: float, done: float, chunks: list[tuple[float, float]], user_end: float) -> TurnRecord:
    turn = TurnRecord(session, 0, user_audio_start=0.0, user_audio_end=user_end, speech_started=1, speech_stopped_at=stopped)
    reply = Reply("resp_1", created_at=stopped + 0.01, first_audio_at=first_audio, done_at=done, status="completed", chunks=chunks, text_tokens=5 + 2 * session)
    turn.replies.append(reply)
    return turn


def _level(sessions: int = 2) -> dict:
    results = [
        SessionResult([_turn(0, 3.0, 3.2, 4.0, [(3.2, 0.5), (3.5, 0.5)], user_end=2.5)], events=40),
        SessionResult([_turn(1, 3.0, 3.4, 5.0, [(3.4, 0.2), (4.0, 0.2)], user_end=2.6)], events=60, errors=["error: some_code"]),
    ]
    return summarize_level(sessions, results, wall_s=10.0, settings=RealtimeSettings(turns=1))


def _doc(level: dict | None = None) -> dict:
    return {
        "schema": report.SCHEMA,
        "created": "2026-12-01T00:00:00Z",
        "machine": {"cpu_count": 2, "platform": "Linux"},
        "server": {"model_id": "qwen3-omni-tiny"},
        "settings": {"realtime": {"turns": 1, "max_output_tokens": 32}},
        "realtime": {"levels": [level or _level()]},
        "speech": {
            "levels": [
                {"concurrency": 1, "mode": "file", "requests": 3, "ok": 3, "latency_ms": {"p50": 100.0, "p95": 120.0}, "first_chunk_ms": {}, "requests_per_s": 2.0, "audio_s_per_s": 4.0, "errors": {"count": 0, "by_kind": {}}}
            ],
            "batch": {"items": 2, "succeeded": 2, "failed": 0, "wall_s": 1.0, "items_per_s": 2.0, "audio_s_per_s": 3.0},
        },
        "components": {"vad": {"audio_s": 60.0, "compute_s": 0.5, "x_realtime": 120.0}},
        "ratios": {"ttfa_p50_over_direct_first_audio": 3.5},
    }


def test_a_level_summarizes_its_turns_from_speech_stopped_and_end_of_user_audio():
    level = _level()
    assert level["turns_completed"] == 2
    assert level["ttfa_from_speech_stopped_ms"]["p50"] == pytest.approx(300.0)  # 200 and 400 ms
    assert level["ttfa_from_user_audio_end_ms"]["max"] == pytest.approx(800.0)  # 3.4 - 2.6
    assert level["turn_latency_ms"]["max"] == pytest.approx(2000.0)
    # Session 1's second chunk came 0.4 s after its first 0.2 s ran out: one underrun.
    assert level["underruns"]["total"] == 1
    assert level["underruns"]["turns_with_underrun"] == 1
    assert level["events_per_s"] == 10.0
    # 5 + 7 text tokens over the union of [3.01, 4.0] and [3.01, 5.0]
    assert level["generation_text_tok_per_s"] == pytest.approx(12 / 1.99, abs=0.05)
    assert level["errors"] == {"count": 1, "by_kind": {"error: some_code": 1}}


def test_a_turn_answered_only_by_an_interrupted_earlier_reply_has_no_metrics():
    turn = TurnRecord(0, 0, user_audio_end=2.0, speech_started=2, speech_stopped_at=3.0)
    turn.replies.append(Reply("resp_early", created_at=1.0, done_at=1.5, status="cancelled"))
    assert turn.reply is None and turn.metrics() is None
    turn.replies.append(Reply("resp_final", created_at=3.1, first_audio_at=3.3, done_at=3.9, status="completed", chunks=[(3.3, 0.6)]))
    metrics = turn.metrics()
    assert metrics["vad_splits"] == 1
    assert metrics["ttfa_from_speech_stopped_s"] == pytest.approx(0.3)
    assert metrics["output_rtf"] == pytest.approx(0.8 / 0.6)


def test_a_pause_inside_the_sentence_does_not_end_the_turn():
    # VAD stopped at 1.5 s, inside the sentence (the audio ran until 2.0 s) and a reply started.
    turn = TurnRecord(0, 0, user_audio_end=2.0, speech_started=1, speech_stopped_at=1.5)
    turn.replies.append(Reply("resp_early", created_at=1.6, first_audio_at=1.7, done_at=1.9, status="completed"))
    assert not turn.complete and turn.metrics() is None
    turn.speech_started, turn.speech_stopped_at = 2, 2.6  # the real end of the turn
    turn.replies.append(Reply("resp_final", created_at=2.6, first_audio_at=2.7, done_at=3.0, status="completed", chunks=[(2.7, 0.3)]))
    assert turn.complete and turn.reply.response_id == "resp_final"


def test_a_valid_report_passes_and_a_broken_one_names_what_is_wrong():
    report.validate(_doc())
    broken = _doc()
    del broken["realtime"]["levels"][0]["ttfa_from_speech_stopped_ms"]["p95"]
    with pytest.raises(report.ReportError, match=r"realtime.levels\[0\].ttfa_from_speech_stopped_ms is missing 'p95'"):
        report.validate(broken)
    with pytest.raises(report.ReportError, match="schema"):
        report.validate({**_doc(), "schema": "other/1"})
    with pytest.raises(report.ReportError, match="missing 'machine'"):
        report.validate({k: v for k, v in _doc().items() if k != "machine"})


def test_skipped_scenarios_are_valid_and_rendered_as_skipped():
    doc = {**_doc(), "speech": {"skipped": "deadline reached"}}
    report.validate(doc)
    assert "speech: skipped (deadline reached)" in report.render(doc)


def test_the_table_shows_each_level_with_its_ttfa_percentiles():
    text = report.render(_doc())
    assert "TTFA stop p50/95/99 ms" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("2 ") and "2/2" in line)
    assert "300/390/398" in row
    assert "batch of 2: 2 ok" in text
    assert "ttfa_p50_over_direct_first_audio" in text


def test_an_adaptive_servers_share_of_each_level_as_sched_batch_is_printed():
    doc = _doc()
    doc["server"]["sched"] = "adaptive"
    quiet, busy = copy.deepcopy(doc["realtime"]["levels"][0]), doc["realtime"]["levels"][0]
    quiet["sessions"], quiet["server"] = 1, {"sched_batch_share": 0.0}
    busy["server"] = {"sched_batch_share": 0.82}
    doc["realtime"]["levels"].insert(0, quiet)
    text = report.render(doc)
    assert "server scheduled adaptive" in text
    assert "N=1 0%, N=2 82%" in text.split("server as SCHED_BATCH")[1].splitlines()[0]
    doc["server"]["sched"] = "batch"  # a fixed policy needs no such line
    assert "server as SCHED_BATCH" not in report.render(doc)


def test_compare_reports_deltas_and_percent_changes_per_metric():
    a = _doc()
    b = copy.deepcopy(a)
    b["realtime"]["levels"][0]["ttfa_from_speech_stopped_ms"]["p95"] = 195.0  # was 390
    b["speech"]["levels"][0]["requests_per_s"] = 3.0  # was 2
    del b["components"]["vad"]
    rows = {path: (va, vb, delta, pct) for path, va, vb, delta, pct in report.compare(a, b)}
    assert rows["realtime[N=2].ttfa_from_speech_stopped_ms.p95"] == (390.0, 195.0, -195.0, -50.0)
    assert rows["speech[C=1,file].requests_per_s"] == (2.0, 3.0, 1.0, 50.0)
    assert rows["components.vad.x_realtime"] == (120.0, None, None, None)
    assert "realtime[N=2].sessions" not in rows  # the key of a level is not a metric


def test_compare_command_prints_the_deltas(tmp_path, capsys):
    a, b = _doc(), _doc()
    b["ratios"]["ttfa_p50_over_direct_first_audio"] = 7.0
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("ratios.ttfa_p50_over_direct_first_audio"))
    assert line.split()[1:] == ["3.5", "7", "+3.5", "+100.0%"]


def test_the_plot_is_a_png_of_the_realtime_levels(tmp_path):
    path = tmp_path / "plot.png"
    assert report.plot(_doc(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not report.plot({**_doc(), "realtime": {"skipped": "no route"}}, tmp_path / "none.png")


def test_a_level_with_spread_arrivals_is_named_apart_from_the_same_count_arriving_together(tmp_path):
    together = _level(2)
    results = [
        SessionResult([_turn(0, 3.0, 3.1, 4.0, [(3.1, 0.5)], user_end=2.5)], events=10),
        SessionResult([_turn(1, 9.0, 9.1, 10.0, [(9.1, 0.5)], user_end=8.5)], events=10),
    ]
    spread = summarize_level(2, results, wall_s=12.0, settings=RealtimeSettings(turns=1, stagger_s=6.0), arrivals="spread")
    assert (together["arrivals"], spread["arrivals"], spread["stagger_s"]) == ("together", "spread", 6.0)
    doc = _doc()
    doc["realtime"]["levels"].append(spread)
    report.validate(doc)
    rows = [line for line in report.render(doc).splitlines() if "2/2" in line]
    assert rows[0].split()[0] == "2" and rows[1].split()[:2] == ["2", "spread"]
    assert "100/100/100" in rows[1]
    flat = report.flatten(doc)
    assert flat["realtime[N=2].ttfa_from_speech_stopped_ms.p50"] == pytest.approx(300.0)
    assert flat["realtime[N=2 spread].ttfa_from_speech_stopped_ms.p50"] == pytest.approx(100.0)
    assert report.plot(doc, tmp_path / "plot.png")


def test_a_levels_mean_batch_sizes_count_only_the_calls_made_during_it():
    from benchmarks.cli import mean_batch_sizes

    before = {"talker": (10.0, 30.0), "code2wav": (4.0, 4.0)}
    after = {"talker": (20.0, 70.0), "code2wav": (4.0, 4.0), "silero_vad": (5.0, 15.0)}
    assert mean_batch_sizes(before, after) == {"talker": 4.0, "silero_vad": 3.0}


def test_a_levels_node_events_count_only_what_happened_during_it_and_print_as_early_prefills():
    from benchmarks.cli import node_event_deltas

    before = {"thinker.early_prefill": 4.0, "thinker.early_prefill_confirmed": 4.0}
    after = {"thinker.early_prefill": 10.0, "thinker.early_prefill_confirmed": 9.0, "thinker.early_prefill_dropped": 1.0}
    events = node_event_deltas(before, after)
    assert events == {"thinker.early_prefill": 6, "thinker.early_prefill_confirmed": 5, "thinker.early_prefill_dropped": 1}
    level = {**_level(2), "node_events": events}
    assert "early prefill (utterances prefilled in the pause before their turn ended): N=2 5 confirmed, 1 dropped of 6" \
        in report.render(_doc(level)).splitlines()
