"""Issue 16 (4): sampling values the sampler cannot compute with are refused at `session.update` /
`response.create`, under every name they arrive by, before a reply can fail on them."""

from __future__ import annotations

import json

import pytest

from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import SAMPLER_SCALE_RANGE


def opened() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x")
    protocol.open()
    return protocol


def answers(protocol: RealtimeProtocol, event: dict) -> list:
    return protocol.receive_text(json.dumps(event))


def error_of(actions) -> dict:
    (error,) = [a.event["error"] for a in actions if isinstance(a, SendEvent) and a.event["type"] == "error"]
    return error


BAD = [
    ("sglang", "temperature", 1e-300),
    ("sglang", "temperature", 1e308),
    ("sglang", "talker_temperature", 1e308),
    ("sglang", "talker_temperature", 1e-300),
    ("sglang", "talker_repetition_penalty", 1e-300),
    ("sglang", "repetition_penalty", 1e300),
    ("beta", "temperature", -1),
    ("beta", "temperature", 1e-300),
]


def carrying(where: str, name: str, value: float) -> dict:
    return {"sglang": {name: value}} if where == "sglang" else {name: value}


@pytest.mark.parametrize("where,name,value", BAD)
def test_a_session_update_with_an_unusable_sampling_value_is_refused_and_changes_nothing(where, name, value):
    protocol = opened()
    before = dict(protocol.config.sampling)
    actions = answers(protocol, {"type": "session.update", "session": carrying(where, name, value)})
    error = error_of(actions)
    assert error["code"] == "invalid_value" and name in error["message"]
    assert protocol.config.sampling == before and protocol.state.name == "OPEN"
    assert not any(isinstance(a, SendToGraph) for a in actions)


@pytest.mark.parametrize("where,name,value", BAD)
def test_a_response_create_with_an_unusable_sampling_value_starts_no_reply(where, name, value):
    protocol = opened()
    actions = answers(protocol, {"type": "response.create", "response": carrying(where, name, value)})
    assert error_of(actions)["code"] == "invalid_value"
    assert protocol.responses == {}


def test_every_value_inside_the_range_is_accepted_and_greedy_zero_too():
    low, high = SAMPLER_SCALE_RANGE
    protocol = opened()
    for sampling in ({"temperature": 0}, {"temperature": low, "talker_temperature": high}, {"repetition_penalty": 1.05}):
        actions = answers(protocol, {"type": "session.update", "session": {"sglang": sampling}})
        assert [a.event["type"] for a in actions if isinstance(a, SendEvent)] == ["session.updated"]
    assert answers(protocol, {"type": "session.update", "session": {"temperature": 0.8}})[-1].event["type"] == "session.updated"

