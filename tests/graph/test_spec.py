"""A bad profile fails at startup with one error that names the key at fault."""

import copy

import pytest

from graph.runtime import GraphRuntime
from graph.spec import GraphConfigError, parse_spec
from tests.graph.fakes import relay_sink_profile


def rejected(profile) -> GraphConfigError:
    with pytest.raises(GraphConfigError) as caught:
        GraphRuntime.from_config(profile)
    return caught.value


def test_a_valid_profile_loads():
    runtime = GraphRuntime.from_config(relay_sink_profile())
    assert set(runtime.spec.nodes) == {"relay", "sink"}


def test_unknown_node_type_names_the_node():
    profile = relay_sink_profile()
    profile["nodes"]["sink"]["type"] = "test.nope"
    error = rejected(profile)
    assert error.key == "nodes.sink.type"
    assert "test.nope" in str(error)


def test_edge_to_a_missing_node_names_the_edge():
    profile = relay_sink_profile()
    profile["edges"].append("relay.audio -> ghost.audio")
    error = rejected(profile)
    assert error.key == "edges[1]"
    assert "ghost" in str(error)


def test_edge_to_a_missing_stream_names_the_edge_and_the_streams():
    profile = relay_sink_profile()
    profile["edges"] = ["relay.audio -> sink.video"]
    error = rejected(profile)
    assert error.key == "edges[0]"
    assert "video" in str(error) and "audio" in str(error)


def test_stream_type_mismatch_names_the_edge_and_the_types():
    profile = relay_sink_profile()
    profile["nodes"]["words"] = {"type": "test.text_source"}
    profile["edges"].append("words.text -> sink.audio")
    error = rejected(profile)
    assert error.key == "edges[1]"
    assert "TextDelta" in str(error) and "AudioChunk" in str(error)


def test_a_cycle_in_data_edges_is_rejected():
    profile = copy.deepcopy(relay_sink_profile())
    profile["nodes"]["relay2"] = {"type": "test.relay"}
    profile["edges"] = ["relay.audio -> relay2.audio", "relay2.audio -> relay.audio"]
    error = rejected(profile)
    assert "cycle" in str(error)
    assert error.key.startswith("edges[")


def test_malformed_edge_and_unknown_limit_are_named():
    profile = relay_sink_profile()
    profile["edges"] = ["relay.audio sink.audio"]
    assert rejected(profile).key == "edges[0]"
    profile = relay_sink_profile()
    profile["limits"]["max_sesions"] = 3
    error = rejected(profile)
    assert error.key == "limits" and "max_sesions" in str(error)


def test_keep_warm_ms_is_a_positive_number_of_milliseconds_or_null():
    profile = relay_sink_profile()
    profile["compute"] = {"keep_warm_ms": 150}
    assert parse_spec(profile).compute_keep_warm_s == 0.15
    profile["compute"] = {"keep_warm_ms": None}
    assert parse_spec(profile).compute_keep_warm_s is None
    for bad in (0, -5, "fast", True):
        profile["compute"] = {"keep_warm_ms": bad}
        assert rejected(profile).key == "compute.keep_warm_ms"


def test_graphs_is_auto_or_off_and_auto_by_default():
    profile = relay_sink_profile()
    assert parse_spec(profile).compute_graphs == "auto"
    profile["compute"] = {"graphs": "off"}
    assert parse_spec(profile).compute_graphs == "off"
    for bad in ("on", True, None, 1):
        profile["compute"] = {"graphs": bad}
        error = rejected(profile)
        assert error.key == "compute.graphs" and "auto, off" in str(error)


def test_unknown_input_and_output_ports_are_named():
    profile = relay_sink_profile()
    profile["inputs"] = {"audio": "relay.nope"}
    assert rejected(profile).key == "inputs.audio"
    profile = relay_sink_profile()
    profile["outputs"] = ["sink.nope"]
    assert rejected(profile).key == "outputs[0]"
