"""Issue 16: the protocol core under hypothesis-generated client events (no socket, no graph).

Whatever arrives, no exception escapes the state machine, every event it answers is a valid
server event (the OpenAI SDK's own types, or this server's `sglang.*` extensions), and an error
has the protocol's error shape. Bounded: a fixed number of examples, no deadline (2 shared cores).
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import typing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.realtime import RealtimeServerEvent

from graph.messages import AudioOut, InputCommitted, TextDelta, TurnDone, TurnQueued
from session_server.realtime.events import EVENT_TYPES
from session_server.realtime.protocol import RealtimeProtocol, SendEvent
from session_server.realtime.session_config import ServedModel

# Each OpenAI server event type -> the SDK's model of it (validated one by one: clear failures).
SERVER_EVENTS = {
    literal: model
    for model in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
    for literal in typing.get_args(model.model_fields["type"].annotation)
}
# This server's own events (docs/realtime.md); every other one must be an OpenAI server event.
EXTENSIONS = {"session.closed", "sglang.input_audio.accepted", "sglang.input_audio.drained", "sglang.input_audio.ended",
              "sglang.input_image.accepted"}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

FIELD_NAMES = [
    "type", "event_id", "session", "audio", "item", "item_id", "content_index", "audio_end_ms", "response",
    "response_id", "previous_item_id", "instructions", "temperature", "sglang", "image", "input", "output_modalities",
    "modalities", "voice", "tools", "tool_choice", "max_output_tokens", "turn_detection", "format", "role", "content",
    "text", "call_id", "output", "arguments", "name", "conversation", "metadata", "seq", "t_ms",
]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1e-300, 1e308, 2**63, "", "root", "auto", "none", "user", "assistant", "system",
                     "message", "function_call", "function_call_output", "input_text", "input_audio", "input_image",
                     "server_vad", "semantic_vad", "audio/pcm", "audio/pcmu", "text", "audio", "realtime", "transcription"]),
    st.text(max_size=40),
    st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELD_NAMES), inner, max_size=5)),
    max_leaves=25,
)
events = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.one_of(st.sampled_from(sorted(EVENT_TYPES)), st.text(max_size=20)),
    st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6),
)
raw_texts = st.one_of(
    events.map(json.dumps),
    st.text(max_size=200),
    st.integers(1, 3000).map(lambda n: '{"type":"session.update","session":' + "[" * n + "]" * n + "}"),
)


def graph_outputs(protocol: RealtimeProtocol) -> list:
    """What a graph could say next: a commit, a reply's text/audio/end for the active response."""
    outputs: list = [InputCommitted(turn_id=1, item_id="item_fuzz", auto_reply=True)]
    for response_id in list(protocol.responses):
        outputs += [
            TurnQueued(turn_id=2, response_id=response_id),
            TextDelta(turn_id=2, text="hi", response_id=response_id),
            AudioOut(turn_id=2, samples=np.zeros(240, dtype=np.float32), response_id=response_id),
            TurnDone(turn_id=2, response_id=response_id),
        ]
    return outputs


def assert_valid_server_event(event: dict) -> None:
    json.dumps(event, allow_nan=False)  # what goes on the wire is plain JSON
    assert isinstance(event.get("type"), str) and event.get("event_id")
    if event["type"] == "error":
        error = event["error"]
        assert set(error) >= {"type", "code", "message", "param"} and error["code"] and error["message"]
    if event["type"] in EXTENSIONS:
        assert event["type"] != "session.closed" or isinstance(event.get("reason"), str)
    else:
        SERVER_EVENTS[event["type"]].model_validate(_without_known_deviations(event))


# Cancel reasons this server sends that GA's enum lacks (found by this fuzzer; reported on issue 16):
# a reply cut short by `session.close` or by the session ending.
EXTENSION_CANCEL_REASONS = {"client_closed", "session_ended"}


def _without_known_deviations(event: dict) -> dict:
    details = (event.get("response") or {}).get("status_details") or {}
    if event["type"] == "response.done" and details.get("reason") in EXTENSION_CANCEL_REASONS:
        event = json.loads(json.dumps(event))
        event["response"]["status_details"]["reason"] = "client_cancelled"
    return event


def check(actions) -> None:
    for action in actions:
        if isinstance(action, SendEvent):
            assert_valid_server_event(action.event)


@FUZZ
@given(st.lists(raw_texts, min_size=1, max_size=12), st.booleans())
def test_no_client_event_sequence_breaks_the_protocol(texts, with_graph):
    protocol = RealtimeProtocol("sess_fuzz", "model-x", served=ServedModel(model="model-x", max_text_tokens=512, max_image_pixels=4096))
    check(protocol.open())
    for text in texts:
        check(protocol.receive_text(text))
        if with_graph:
            for output in graph_outputs(protocol):
                check(protocol.graph_output(output))
    check(protocol.close("client_closed"))
    assert protocol.state.name == "CLOSED"


@FUZZ
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**80), 2**80), st.sampled_from(
    ["temperature", "talker_temperature", "repetition_penalty", "talker_repetition_penalty", "top_p", "top_k"]))
def test_a_sampling_value_is_either_refused_or_one_the_sampler_can_use(value, name):
    protocol = RealtimeProtocol("sess_fuzz", "model-x")
    protocol.open()
    # json.dumps writes NaN / Infinity literals for non-finite floats: not JSON, refused as such.
    actions = protocol.receive_text(json.dumps({"type": "session.update", "session": {"sglang": {name: value}}}))
    check(actions)
    kinds = [a.event["type"] for a in actions if isinstance(a, SendEvent)]
    if kinds == ["session.updated"] and name in protocol.config.sampling:
        accepted = protocol.config.sampling[name]
        assert math.isfinite(accepted)
        if name in ("temperature", "talker_temperature", "repetition_penalty", "talker_repetition_penalty") and accepted != 0:
            assert 0.01 <= accepted <= 100
