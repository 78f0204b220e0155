"""The harness's arithmetic: percentiles, summaries and the simulated real-time player."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.stats import busy_seconds, percentile, simulate_playback, summarize


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(q):
    values = list(np.random.default_rng(3).exponential(200.0, size=37))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_one_value_is_that_value_and_of_none_is_none():
    assert percentile([42.0], 99) == 42.0
    assert percentile([], 50) is None


def test_percentile_rejects_out_of_range_q():
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_scales_seconds_to_milliseconds():
    summary = summarize([0.1, 0.2, 0.3, 0.4], scale=1000)
    assert summary == {"n": 4, "mean": 250.0, "p50": 250.0, "p95": 385.0, "p99": 397.0, "max": 400.0}


def test_summarize_of_nothing_has_no_figures():
    assert summarize([]) == {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}


def test_audio_arriving_faster_than_real_time_never_underruns():
    # 10 chunks of 80 ms, all arriving within the first 100 ms.
    chunks = [(1.0 + i * 0.01, 0.08) for i in range(10)]
    playback = simulate_playback(chunks, done_at=1.2)
    assert playback.underruns == 0
    assert playback.stall_s == 0
    assert playback.audio_s == pytest.approx(0.8)


def test_audio_arriving_exactly_at_real_time_never_underruns():
    chunks = [(2.0 + i * 0.1, 0.1) for i in range(20)]
    assert simulate_playback(chunks, done_at=4.0).underruns == 0


def test_each_late_chunk_is_one_underrun_with_its_gap_as_stall():
    # Plays 0.0-0.1; the next chunk is 50 ms late; then 0.15-0.25; the third is 250 ms late.
    chunks = [(0.0, 0.1), (0.15, 0.1), (0.5, 0.1)]
    playback = simulate_playback(chunks, done_at=0.6)
    assert playback.underruns == 2
    assert playback.stall_s == pytest.approx(0.05 + 0.25)


def test_playback_resumes_at_the_late_chunk_and_buffers_from_there():
    # After the stall at 1.0, chunks at 1.05 and 1.1 are queued behind the resumed one: no more underruns.
    chunks = [(0.0, 0.2), (1.0, 0.2), (1.05, 0.2), (1.1, 0.2)]
    assert simulate_playback(chunks, done_at=1.2).underruns == 1


def test_prebuffer_absorbs_jitter_smaller_than_itself():
    chunks = [(0.0, 0.1), (0.15, 0.1), (0.3, 0.1)]
    assert simulate_playback(chunks).underruns == 2
    assert simulate_playback(chunks, prebuffer_s=0.1).underruns == 0


def test_running_dry_after_the_reply_is_done_is_not_an_underrun():
    # The last chunk is the end; draining the buffer afterwards is the reply finishing.
    assert simulate_playback([(0.0, 0.1)], done_at=5.0).underruns == 0


def test_chunks_are_played_in_arrival_order():
    shuffled = [(0.3, 0.1), (0.0, 0.1), (0.15, 0.1)]
    assert simulate_playback(shuffled).underruns == 2


def test_no_audio_is_no_playback():
    assert simulate_playback([]) == simulate_playback([], done_at=1.0)
    assert simulate_playback([]).underruns == 0


def test_busy_seconds_is_the_union_of_overlapping_intervals():
    assert busy_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.2, 3.5)]) == pytest.approx(3.0)
    assert busy_seconds([(5.0, 6.0), (0.0, 1.0)]) == pytest.approx(2.0)
    assert busy_seconds([]) == 0.0
