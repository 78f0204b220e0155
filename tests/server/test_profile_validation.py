"""The whole profile is checked before anything loads: one line per problem, naming the key."""

import copy
import subprocess
import sys

import pytest
import yaml

from configs import load_profile
from session_server.profile import ProfileInvalid, profile_errors, validated_profile
from tests.conftest import REPO, free_port
from tests.graph.fakes import relay_sink_profile


@pytest.fixture(scope="module")
def embedded():
    return load_profile("embedded_cpu")


def errors_with(profile, **changes):
    profile = copy.deepcopy(profile)
    profile.update(changes)
    return profile_errors(profile)


def test_shipped_profiles_load_by_name_with_or_without_yaml_and_are_valid(embedded):
    assert load_profile("embedded_cpu.yaml") == embedded
    for name in ("embedded_cpu", "qwen3_omni_session_h200", "qwen3_omni_speech_h200", "qwen3_omni_random_h200"):
        assert profile_errors(load_profile(name)) == [], name


def test_an_unknown_top_level_key_is_refused_with_the_likely_intent(embedded):
    [line] = errors_with(embedded, limit={"max_sessions": 2})
    assert line.startswith("limit: unknown top-level key (did you mean `limits`?")
    assert "webrtc" in line and "speech" in line


def test_a_bad_webrtc_key_names_the_key_and_the_allowed_values(embedded):
    assert errors_with(embedded, webrtc={"candidates": "lan"}) == [
        "webrtc.candidates: 'lan' is not allowed (allowed: host, loopback, host+loopback)"
    ]
    assert errors_with(embedded, webrtc={"connect_timeout_s": "soon"}) == ["webrtc.connect_timeout_s: expected float, got str"]
    [line] = errors_with(embedded, webrtc={"ice_server": []})
    assert line.startswith("webrtc.ice_server: unknown key (known: candidates, connect_timeout_s, ice_servers")


def test_bad_speech_and_realtime_keys_are_one_line_each(embedded):
    assert errors_with(embedded, speech={"max_voices": "many"}) == ["speech.max_voices: expected int, got str"]
    assert errors_with(embedded, speech={"voice_policy": "never"}) == [
        "speech.voice_policy: 'never' is not allowed (allowed: overwrite, immutable)"
    ]
    [line] = errors_with(embedded, realtime={"max_output_buffer": 10})
    assert line.startswith("realtime.max_output_buffer: unknown key (known: close_timeout_s, compat, max_append_chars")


def test_every_node_and_resource_params_are_typed(embedded):
    profile = copy.deepcopy(embedded)
    profile["nodes"]["vad"]["params"] = {"max_batch": "lots"}
    profile["nodes"]["thinker"]["params"]["sampling"] = {"topk": 3}
    profile["nodes"]["code2wav"]["params"]["chunk_frame"] = 6
    profile["resources"]["omni"]["params"]["dtype"] = "fp8"
    assert sorted(profile_errors(profile)) == [
        "nodes.code2wav.params.chunk_frame: unknown key (known: chunk_frames, first_chunk_frames, max_batch, resource)",
        "nodes.thinker.params.sampling.topk: unknown key (known: seed, temperature, top_k, top_p)",
        "nodes.vad.params.max_batch: expected int, got str",
        "resources.omni.params.dtype: 'fp8' is not allowed (allowed: float32, bfloat16, float16)",
    ]


def test_a_warmup_into_a_missing_input_is_refused(embedded):
    assert errors_with(embedded, warmup={"input": "speach"}) == [
        "warmup.input: 'speach' is not a graph input (inputs: audio, replies, speech)"
    ]


def test_problems_of_every_section_are_reported_together(embedded):
    profile = copy.deepcopy(embedded)
    profile["limit"] = {}
    profile["webrtc"] = {"candidates": "lan"}
    profile["nodes"]["dialog"]["params"] = {"max_queued_turns": 0}
    with pytest.raises(ProfileInvalid) as caught:
        validated_profile(profile)
    keys = [line.split(":", 1)[0] for line in caught.value.lines]
    assert keys == ["limit", "nodes.dialog.params.max_queued_turns", "webrtc.candidates"]


def test_serve_prints_one_line_per_problem_and_exits_2_without_a_traceback(tmp_path):
    profile = relay_sink_profile()
    profile["limit"] = {"max_sessions": 1}
    profile["webrtc"] = {"candidates": "lan"}
    config = tmp_path / "typo.yaml"
    config.write_text(yaml.safe_dump(profile))
    result = subprocess.run(
        [sys.executable, "-m", "session_server.cli", "serve", "--config", str(config), "--port", str(free_port())],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if "invalid profile:" in line]
    assert len(problems) == 2
    assert "limit: unknown top-level key" in problems[0]
    assert "webrtc.candidates: 'lan' is not allowed (allowed: host, loopback, host+loopback)" in problems[1]
    assert "Traceback" not in result.stderr
    assert "validated" not in result.stderr


def test_a_node_reads_its_params_from_its_struct_defaults_filled_and_a_typo_refused():
    from nodes.code2wav import Code2WavNode as Code2Wav

    node = Code2Wav("code2wav", {"chunk_frames": 3}, context=None)
    assert (node.first_chunk_frames, node.chunk_frames, node.settings.max_batch, node.settings.resource) == (1, 3, 16, "omni")
    with pytest.raises(ValueError, match=r"nodes.code2wav.params.chunk_frame: unknown key"):
        Code2Wav("code2wav", {"chunk_frame": 3}, context=None)
