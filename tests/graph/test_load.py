"""Admission by load: the estimator of graph/load.py on fake step times (no sleeps), and the
admission decisions that read it (an in-process runtime, the server's choice of engine)."""

from __future__ import annotations

import math
import time

import pytest

from configs import load_profile
from graph.engine_client import EngineHandle, EngineRuntime
from graph.errors import SessionRejected
from graph.limits import SessionLimits
from graph.load import MAX_BUSY, ComputeLoad, EngineLoads, LoadSnapshot, admits, first_audio_estimate_s
from graph.runtime import GraphRuntime, free_slots, validated_spec
from tests.graph.fakes import relay_sink_profile


def steady(load: ComputeLoad, stage: str, step_s: float, period_s: float, seconds: float, start: float = 0.0,
           first_audio: bool = False) -> float:
    """Fake units of `step_s` every `period_s` for `seconds`; returns the clock at the end."""
    t = start
    while t < start + seconds:
        load.record(stage, t, t + step_s, first_audio)
        t += period_s
    return t


def test_a_stage_step_average_weighs_recent_steps_more():
    load = ComputeLoad(alpha=0.5)
    load.record("talker", 0.0, 0.010, first_audio=True)
    load.record("talker", 1.0, 1.020, first_audio=True)
    assert load.first_audio["talker"].value == pytest.approx(0.015)
    load.record("talker", 2.0, 2.020, first_audio=True)
    assert load.first_audio["talker"].value == pytest.approx(0.0175)


def test_the_first_audio_path_sums_the_stages_that_served_a_waiting_turn_only():
    load = ComputeLoad()
    load.record("encoders", 0.0, 0.002, first_audio=True)
    load.record("thinker", 0.01, 0.016, first_audio=True)
    load.record("talker", 0.02, 0.023, first_audio=True)
    load.record("silero_vad", 0.03, 0.0301)  # a listening session's VAD: not on the path
    snapshot = load.snapshot(0.04, speaking=0)
    assert snapshot.first_audio_steps == 3
    assert snapshot.first_audio_path_s == pytest.approx(0.011)


def test_the_busy_share_is_busy_time_over_wall_time_and_decays_once_idle():
    load = ComputeLoad(busy_tau_s=1.0)
    end = steady(load, "talker", 0.003, 0.010, seconds=10.0)
    assert load.busy(end) == pytest.approx(0.3, abs=0.01)
    # A second idle: the decayed busy time over the decayed wall time plus that second.
    decay = math.exp(-1.0)
    assert load.busy(end + 1.0) == pytest.approx(0.3 * decay / (decay + 1.0), abs=0.01)
    assert load.busy(end + 20.0) < 0.001


def test_one_unit_just_run_counts_its_own_duration_as_watched_time():
    load = ComputeLoad()
    load.record("thinker", 1.0, 1.005, first_audio=True)
    assert load.busy(1.005) == pytest.approx(1.0)  # all of the time watched, but not more
    assert load.busy(1.010) == pytest.approx(0.5, abs=0.01)
    watched = ComputeLoad(since=0.0)  # a runtime watching since it was ready, idle until then
    watched.record("thinker", 1.0, 1.005, first_audio=True)
    assert watched.busy(1.005) < 0.01


def test_an_idle_engine_admits_and_estimates_its_bare_first_audio_path():
    assert first_audio_estimate_s(LoadSnapshot()) == 0.0
    load = ComputeLoad()
    load.record("thinker", 0.0, 0.020, first_audio=True)
    snapshot = load.snapshot(60.0, speaking=0)  # a minute later: idle
    assert snapshot.busy < 1e-6
    assert first_audio_estimate_s(snapshot) == pytest.approx(0.020)
    assert admits(snapshot, goal_s=0.1)


def test_one_more_speaker_costs_what_each_speaker_costs_now():
    # 4 speakers' replies keep the engine 60% busy: a fifth makes it 75%; a turn's 5 first-audio
    # steps (20 ms together) each wait u/(1-u) = 3 mean units of 2 ms.
    snapshot = LoadSnapshot(first_audio_path_s=0.020, first_audio_steps=5, step_s=0.002, busy=0.6, reply_busy=0.6, speaking=4)
    assert first_audio_estimate_s(snapshot) == pytest.approx(0.020 + 5 * 3 * 0.002)
    assert admits(snapshot, goal_s=0.050)
    assert not admits(snapshot, goal_s=0.040)
    assert admits(snapshot, goal_s=None)


def test_the_estimate_grows_with_the_speakers_until_the_engine_could_not_keep_up():
    estimates = [first_audio_estimate_s(LoadSnapshot(0.02, 5, 0.002, busy=0.1 * n, reply_busy=0.1 * n, speaking=n))
                 for n in range(1, 9)]
    assert estimates == sorted(estimates)
    # 9 speakers at 90% busy: a tenth would need 100% of the engine.
    saturated = LoadSnapshot(0.02, 5, 0.002, busy=0.9, reply_busy=0.9, speaking=9)
    assert 0.9 * 10 / 9 >= MAX_BUSY and first_audio_estimate_s(saturated) == math.inf
    assert not admits(saturated, goal_s=10.0)


def test_what_listening_sessions_cost_does_not_grow_with_one_more_speaker():
    # 1 speaker's reply is 10% of the engine; the VAD of many listening sessions another 40%.
    listening = LoadSnapshot(0.02, 5, 0.002, busy=0.5, reply_busy=0.1, speaking=1)
    assert first_audio_estimate_s(listening) == pytest.approx(0.02 + 5 * (0.6 / 0.4) * 0.002)


def test_the_reply_share_counts_the_units_that_served_replies():
    load = ComputeLoad(busy_tau_s=1.0)
    t = 0.0
    while t < 10.0:
        load.record("silero_vad", t, t + 0.004)  # listening: not a reply's
        load.record("talker", t + 0.005, t + 0.007, reply=True)
        t += 0.010
    assert load.busy(t) == pytest.approx(0.6, abs=0.02)
    assert load.busy(t, reply=True) == pytest.approx(0.2, abs=0.02)


def test_with_nobody_speaking_a_new_session_slows_no_reply_down_and_is_admitted():
    # Listening sessions' VAD, or a one-off unit such as a model's first call, keep it busy.
    busy_listening = LoadSnapshot(first_audio_path_s=0.02, first_audio_steps=5, step_s=0.13, busy=0.99, speaking=0)
    assert first_audio_estimate_s(busy_listening) == pytest.approx(0.02)
    assert admits(busy_listening, goal_s=0.15)


def test_sessions_admitted_since_the_last_report_count_as_speakers():
    loads = EngineLoads()
    assert loads.admits(0.001)  # nothing reported yet: nothing measured to refuse on
    loads.report(LoadSnapshot(first_audio_path_s=0.02, first_audio_steps=5, step_s=0.002, busy=0.4, reply_busy=0.4, speaking=4))
    alone = loads.estimate_s()
    loads.admitted_since = 2
    assert loads.estimate_s() > alone
    loads.report(LoadSnapshot(first_audio_path_s=0.02, first_audio_steps=5, step_s=0.002, busy=0.4, reply_busy=0.4, speaking=4))
    assert loads.admitted_since == 0 and loads.estimate_s() == alone


async def started(profile) -> GraphRuntime:
    runtime = GraphRuntime.from_config(profile)
    await runtime.start()
    return runtime


async def started_with_kv_rows(rows: int) -> GraphRuntime:
    """A relay runtime whose sink holds `rows` KV rows allocated at start (its session limit far above)."""
    profile = relay_sink_profile()
    profile["limits"]["max_sessions"] = 100
    runtime = await started(profile)
    runtime.nodes["sink"].kv_rows = lambda: rows  # type: ignore[method-assign]
    return runtime


async def test_a_runtime_too_busy_for_the_goal_refuses_a_new_session_with_session_limit_reached():
    profile = relay_sink_profile()
    profile["limits"].update(max_sessions=100, first_audio_goal_ms=50)
    runtime = await started(profile)
    try:
        first = await runtime.open_session("first")
        # Its compute is busy 90% of the time serving a speaker's first-audio steps (fake times
        # on the pool's own clock, ending now).
        now = time.perf_counter()
        steady(runtime.compute.load, "talker", 0.009, 0.010, seconds=10.0, start=now - 10.0, first_audio=True)
        runtime.speaking = lambda: 1  # type: ignore[method-assign]
        with pytest.raises(SessionRejected) as refused:
            await runtime.open_session("second")
        assert refused.value.code == "session_limit_reached"
        assert "first-audio goal of 50 ms" in refused.value.message
        assert not first.ended.is_set() and set(runtime.sessions) == {"first"}
    finally:
        await runtime.stop(0)


def embedded_limits() -> dict:
    return load_profile(None)["limits"]


def test_the_embedded_default_has_no_small_fixed_session_cap_but_a_first_audio_goal():
    limits = SessionLimits.from_dict(embedded_limits())
    assert limits.effective_max_sessions >= 64
    assert limits.first_audio_goal_ms is not None


async def test_the_embedded_defaults_limits_admit_twelve_sessions_on_an_idle_runtime():
    profile = relay_sink_profile()
    profile["limits"] = {**embedded_limits(), "edge_capacity": 4, "output_capacity": 4}
    runtime = await started(profile)
    try:
        sessions = [await runtime.open_session(f"s{i}") for i in range(12)]
        assert len(runtime.sessions) == 12 and not any(s.ended.is_set() for s in sessions)
    finally:
        await runtime.stop(0)


def ready_engines(runtime: EngineRuntime, *loads: LoadSnapshot | None) -> None:
    for engine, load in zip(runtime.engines, loads, strict=True):
        engine.ready = True
        if load is not None:
            engine.load.report(load)


def two_engine_runtime(**limits) -> EngineRuntime:
    profile = relay_sink_profile()
    profile["limits"].update(limits)
    profile["compute"] = {"engines": 2}
    return EngineRuntime(validated_spec(profile), profile)


BUSY = LoadSnapshot(first_audio_path_s=0.02, first_audio_steps=5, step_s=0.002, busy=0.85, reply_busy=0.85, speaking=8)
IDLE = LoadSnapshot(first_audio_path_s=0.02, first_audio_steps=5, step_s=0.002, busy=0.05, speaking=0)


def test_the_server_sends_a_new_session_to_an_engine_that_can_serve_it_in_time_or_refuses_it():
    runtime = two_engine_runtime(max_sessions=100, first_audio_goal_ms=100)
    ready_engines(runtime, BUSY, IDLE)
    assert runtime._engine_for("realtime").index == 1  # engine 0 hosts fewer (none) but is too busy
    runtime.engines[1].load.report(BUSY)
    assert runtime.first_audio_estimate_s() == math.inf
    with pytest.raises(SessionRejected) as refused:
        runtime._engine_for("realtime")
    assert refused.value.code == "session_limit_reached"
    assert runtime._engine_for("speech").index == 0  # speech requests are not live sessions


def test_an_engines_kv_rows_cap_the_sessions_the_server_sends_it():
    runtime = two_engine_runtime(max_sessions=100)
    ready_engines(runtime, None, None)
    runtime.engines[0].facts = {"kv_rows": 3}
    runtime.engines[1].facts = {"kv_rows": 5}
    assert runtime.capacity("realtime") == 8
    runtime.engines[0].sessions = {f"s{i}": _Live() for i in range(3)}
    assert [e.index for e in runtime._open_engines()] == [1]


class _Live:
    kind = "realtime"


def test_engine_handles_start_with_no_report():
    assert EngineHandle(0, None).load.snapshot is None


async def test_a_nodes_kv_rows_allocated_at_start_cap_the_sessions_a_runtime_admits():
    runtime = await started_with_kv_rows(2)
    try:
        assert runtime.capacity("realtime") == 2
        await runtime.open_session("a")
        await runtime.open_session("b")
        with pytest.raises(SessionRejected) as refused:
            await runtime.open_session("c")
        assert refused.value.code == "session_limit_reached"
    finally:
        await runtime.stop(0)


async def test_speech_requests_and_live_sessions_share_the_rows_allocated_at_start():
    runtime = await started_with_kv_rows(3)
    try:
        await runtime.open_session("speech", kind="speech")
        assert runtime.capacity("realtime") == 2 and runtime.capacity("speech") == 3
        await runtime.open_session("live")
        assert runtime.capacity("speech") == 2
    finally:
        await runtime.stop(0)


async def test_a_runtime_too_busy_for_the_goal_has_no_free_slot_for_ready_to_read():
    profile = relay_sink_profile()
    profile["limits"].update(max_sessions=100, first_audio_goal_ms=50)
    runtime = await started(profile)
    try:
        assert free_slots(runtime) == 100
        runtime.first_audio_estimate_s = lambda: 0.2  # type: ignore[method-assign]
        assert free_slots(runtime) == 0
    finally:
        await runtime.stop(0)
