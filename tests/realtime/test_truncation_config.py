"""`session.truncation` as the GA types define it (`RealtimeTruncation`): accepted, echoed as
given, checked, and carried to the model with every reply."""

from __future__ import annotations

import json

import pytest

from graph.messages import Configure, Truncation
from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import ServedModel

RETENTION = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 4000}}


def opened() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x", served=ServedModel(model="model-x"))
    protocol.open()
    return protocol


def update(protocol: RealtimeProtocol, truncation) -> list:
    return protocol.receive_text(json.dumps({"type": "session.update", "session": {"type": "realtime", "truncation": truncation}}))


def echoed(actions) -> object:
    (event,) = [a.event for a in actions if isinstance(a, SendEvent) and a.event["type"] == "session.updated"]
    return event["session"]["truncation"]


def test_the_default_is_auto_as_in_ga():
    protocol = RealtimeProtocol("sess_1", "model-x", served=ServedModel(model="model-x"))
    (created,) = [a.event for a in protocol.open() if isinstance(a, SendEvent) and a.event["type"] == "session.created"]
    assert created["session"]["truncation"] == "auto"


@pytest.mark.parametrize("mode", ["auto", "disabled", RETENTION,
                                  {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": None}])
def test_each_mode_is_echoed_as_asked(mode):
    assert echoed(update(opened(), mode)) == mode


def test_the_mode_reaches_the_graph_with_the_automatic_reply():
    actions = update(opened(), RETENTION)
    (configure,) = [a.message for a in actions if isinstance(a, SendToGraph) and isinstance(a.message, Configure)
                    and a.message.target == "dialog"]
    assert configure.config["truncation"] == {"type": "retention_ratio", "retention_ratio": 0.8, "post_instructions": 4000}
    assert configure.config["auto_reply"].truncation == Truncation(type="retention_ratio", retention_ratio=0.8, post_instructions=4000)


@pytest.mark.parametrize(("mode", "param"), [
    ({"type": "retention_ratio", "retention_ratio": 1.5}, "session.truncation.retention_ratio"),
    ({"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
     "session.truncation.token_limits.post_instructions"),
])
def test_a_bad_mode_is_refused_and_changes_nothing(mode, param):
    protocol = opened()
    actions = update(protocol, mode)
    (error,) = [a.event["error"] for a in actions if isinstance(a, SendEvent) and a.event["type"] == "error"]
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert protocol.config.truncation == Truncation()
