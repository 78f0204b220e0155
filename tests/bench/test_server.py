"""The server the harness starts itself: a subprocess on 127.0.0.1, healthy before use, stopped after."""

from __future__ import annotations

import httpx
import psutil
import pytest
import yaml

from benchmarks import unit_trace
from benchmarks.server import ManagedServer, ServerStartError, bench_profile
from tests.realtime.fakes import realtime_profile


def test_the_served_profile_makes_room_for_the_sessions_asked_for():
    profile = bench_profile(None, max_sessions=300)  # past the embedded default's safety cap
    assert profile["limits"]["max_sessions"] == 300
    assert profile["limits"]["first_audio_goal_ms"] is None  # admission by load would refuse the load it measures
    assert profile["webrtc"]["candidates"] == "loopback"
    assert profile["model_id"] == "qwen3-omni-tiny"


def test_a_kv_budget_grows_with_the_sessions_so_admission_does_not_refuse_them(tmp_path):
    path = tmp_path / "kv.yaml"
    path.write_text(yaml.safe_dump(realtime_profile(limits={"max_sessions": 2, "kv_tokens": 1000, "max_seq_len": 500})))
    limits = bench_profile(str(path), max_sessions=16)["limits"]
    assert limits["max_sessions"] == 16 and limits["kv_tokens"] == 16 * 500


def test_a_kv_budget_raised_past_the_profiles_makes_its_caches_grow_instead_of_allocating_it_at_start():
    profile = bench_profile("qwen3_omni_session_h200.yaml", max_sessions=64)
    assert profile["limits"]["kv_tokens"] == 64 * 32768
    assert profile["resources"]["omni"]["params"]["kv_cache"] == "grow"
    assert "kv_cache" not in bench_profile("qwen3_omni_session_h200.yaml", max_sessions=8)["resources"]["omni"]["params"]


def test_the_harness_starts_a_healthy_server_and_stops_it(tmp_path):
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(realtime_profile()))
    with ManagedServer(str(path), max_sessions=4, log_path=tmp_path / "server.log", startup_timeout_s=60) as server:
        assert server.profile_path == str(tmp_path / "server-profile.yaml")
        assert server.base_url.startswith("http://127.0.0.1:")
        assert httpx.get(server.base_url + "/health").json() == {"status": "ok", "model": "test-realtime"}
        assert server.model_id == "test-realtime" and server.started_by_harness
        process = psutil.Process(server.pid)
    assert not process.is_running()
    # The profile it served is kept beside the log, with room for the sessions asked for.
    served = yaml.safe_load((tmp_path / "server-profile.yaml").read_text())
    assert served["limits"]["max_sessions"] == 8 and served["model_id"] == "test-realtime"


def test_with_a_unit_trace_the_harness_s_server_writes_one_for_each_engine_when_it_stops(tmp_path):
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(realtime_profile()))
    traces = tmp_path / "units"
    with ManagedServer(str(path), max_sessions=2, log_path=tmp_path / "server.log", startup_timeout_s=60, unit_trace=str(traces)):
        served = yaml.safe_load((tmp_path / "server-profile.yaml").read_text())
        assert served["compute"]["unit_trace"] == str(traces.resolve())
    engines = served["compute"].get("engines", 1) or 1  # 0: the server's own runtime, one trace
    unit_trace.summarize_when_written(str(traces))  # waits for the files the engines write as they stop
    assert len(list(traces.glob("units-*.json"))) == engines


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    path = tmp_path / "broken.yaml"
    broken = realtime_profile()
    broken["nodes"]["reply"]["type"] = "no.such_node"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ServerStartError, match="exited with code 2 during startup") as error:
        with ManagedServer(str(path), max_sessions=1, log_path=tmp_path / "server.log", startup_timeout_s=60):
            pass
    assert "no.such_node" in str(error.value)


def test_a_preallocated_kv_cache_holds_a_row_of_the_longest_context_per_benched_session():
    profile = bench_profile(None, max_sessions=2, max_seq_len=4096, kv_cache="preallocate")
    assert profile["resources"]["omni"]["params"]["kv_cache"] == "preallocate"
    assert profile["limits"]["kv_tokens"] == 2 * 4096 and profile["limits"]["max_seq_len"] == 4096
    # Without a context given, the model's own (the tiny profile leaves it at the model's default).
    assert bench_profile(None, max_sessions=2, kv_cache="preallocate")["limits"]["kv_tokens"] == 2 * 32768
    assert bench_profile(None, max_sessions=2, kv_cache="grow")["resources"]["omni"]["params"]["kv_cache"] == "grow"
