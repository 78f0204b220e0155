"""The `components` scenario: direct model figures on the tiny checkpoint, and the ratios built on them."""

from __future__ import annotations

import pytest

from benchmarks import components


@pytest.fixture(scope="module")
def figures():
    return components.run(None, quick=True, max_output_tokens=4)


def test_every_component_is_measured_on_the_embedded_default(figures):
    for name in ("vad", "reply", "thinker", "talker", "code2wav", "speech", "batching"):
        assert "skipped" not in figures[name], (name, figures[name])


def test_the_batching_figures_compare_one_session_with_many_through_the_shared_executors(figures):
    batching = figures["batching"]
    many = batching["sessions"]
    assert many == 4  # quick
    assert batching["thinker_tok_per_s_1"] > 0 and batching[f"thinker_tok_per_s_{many}"] > 0
    assert batching["thinker_x"] == round(batching[f"thinker_tok_per_s_{many}"] / batching["thinker_tok_per_s_1"], 1)
    assert batching["talker_x"] == round(batching[f"talker_frames_per_s_{many}"] / batching["talker_frames_per_s_1"], 1)


def test_the_direct_reply_figures_hang_together(figures):
    reply, thinker, talker = figures["reply"], figures["thinker"], figures["talker"]
    assert 0 < reply["first_audio_ms"] <= reply["compute_s"] * 1000
    assert thinker["prefill_tokens"] > 0 and thinker["decode_tokens"] == 4  # max_output_tokens
    assert talker["frames"] > 0 and reply["audio_s"] > 0
    assert figures["code2wav"]["audio_s"] == reply["audio_s"]


def test_the_step_costs_are_reported_under_their_interface_names(figures):
    thinker, talker = figures["thinker"], figures["talker"]
    for value in (thinker["ops_per_step_16"], thinker["host_syncs_per_step"], talker["ops_per_frame"]):
        assert isinstance(value, int) and value > 0
    assert thinker["host_syncs_per_step"] == 1  # the chosen ids of the whole batch, nothing else
    assert isinstance(talker["ms_per_frame"], float) and talker["ms_per_frame"] > 0
    assert talker["reply_ms_per_frame"] > 0  # the frames of the spoken turn, apart
    code2wav = figures["code2wav"]  # one chunk, eager and captured, beside the spoken turn's figures
    assert code2wav["chunk_ms"] > 0 and code2wav["chunk_ms_captured"] > 0
    assert code2wav["chunk_ops"] > 0 and code2wav["chunk_ops_captured"] > 0


def test_vad_runs_one_window_per_call_and_many_sessions_per_batched_call(monkeypatch):
    from nodes.vad import SileroModel

    batch_sizes: list[int] = []
    run_batch = SileroModel.run_batch

    def counted(model, items):
        batch_sizes.append(len(items))
        return run_batch(model, items)

    monkeypatch.setattr(SileroModel, "run_batch", counted)
    vad = components.vad_figures(2.0, 4)
    windows = vad["windows"]
    # a warm-up, every window alone (one session), then every window of 4 sessions in one call
    assert batch_sizes == [1] * (1 + windows) + [4] * windows
    assert vad["batched_sessions"] == 4 and vad["batched_x_realtime"] > 0


def test_the_vad_figures_cover_the_fixtures_speech_and_its_pauses(figures):
    vad = figures["vad"]
    assert vad["audio_s"] == pytest.approx(10.0, abs=0.05)
    assert 0.2 < vad["speech_share"] < 1.0  # the fixture is speech with pauses


def test_the_end_of_turn_classifier_is_measured_per_call_and_per_session_second_beside_the_vad():
    figures = components.end_of_turn_figures(10.0, 4, 1)
    assert figures["calls"] > 0  # the fixture's pauses get checks
    assert figures["calls_per_session_s"] == round(figures["calls"] / figures["audio_s"], 3)
    assert figures["ms_per_call"] > 0 and figures["ms_per_session_s"] > 0
    assert figures["batched_sessions"] == 4
    assert figures["batched_ms_per_turn"] == pytest.approx(figures["batched_ms_per_call"] / 4, abs=0.1)


def test_ratios_divide_server_figures_by_direct_ones():
    level = {"sessions": 4, "ttfa_from_speech_stopped_ms": {"p50": 300.0, "p95": 600.0}}
    doc = {
        "realtime": {"levels": [level]},
        "speech": {
            "levels": [
                {"concurrency": 2, "mode": "file", "ok": 3, "audio_s_per_s": 20.0, "first_chunk_ms": {}},
                {"concurrency": 2, "mode": "sse", "ok": 3, "audio_s_per_s": 20.0, "first_chunk_ms": {"p50": 30.0}},
            ],
            "batch": {"audio_s_per_s": 15.0},
        },
        "components": {"reply": {"first_audio_ms": 100.0}, "speech": {"audio_s_per_s": 10.0, "first_chunk_ms": 10.0}},
    }
    assert components.ratios(doc) == {
        "realtime N=4 TTFA p50 / direct first audio": 3.0,
        "realtime N=4 TTFA p95 / direct first audio": 6.0,
        "speech C=2 audio s/s / direct": 2.0,
        "speech batch audio s/s / direct": 1.5,
        "speech C=2 SSE first chunk p50 / direct": 3.0,
    }
    assert components.ratios({"components": {"reply": {"skipped": "no model"}}}) == {}
