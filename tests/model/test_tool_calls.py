"""Function calls on the tiny checkpoint: whatever the weights, a forced call's arguments are JSON
valid under the tool's schema (xgrammar-constrained decoding), and `none` never calls."""

from __future__ import annotations

import json

import pytest

from nodes.qwen3_omni.inputs import build_turn_inputs, system_with_tools, tool_call_text
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession
from nodes.qwen3_omni.tool_calls import ToolCallDecoder

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
BOOKING = {
    "type": "function",
    "name": "book_table",
    "parameters": {
        "type": "object",
        "properties": {
            "guests": {"type": "integer", "minimum": 1, "maximum": 12},
            "vegetarian": {"type": "boolean"},
            "times": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "contact": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False},
        },
        "required": ["guests", "vegetarian", "times", "contact"],
        "additionalProperties": False,
    },
}


def valid_weather(arguments: dict) -> bool:
    return set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str) and arguments["unit"] in ("celsius", "fahrenheit")


def valid_booking(arguments: dict) -> bool:
    return (
        set(arguments) == {"guests", "vegetarian", "times", "contact"}
        and isinstance(arguments["guests"], int) and 1 <= arguments["guests"] <= 12
        and isinstance(arguments["vegetarian"], bool)
        and isinstance(arguments["times"], list) and len(arguments["times"]) <= 3 and all(isinstance(t, str) for t in arguments["times"])
        and set(arguments["contact"]) == {"name"} and isinstance(arguments["contact"]["name"], str)
    )


def reply(omni, tools, choice, sampling=Sampling(), text="Book me something.", max_reply_tokens=16):
    session = ThinkerSession(omni, sampling, max_reply_tokens=max_reply_tokens)
    prompt = build_turn_inputs(omni, text=text, system_prompt=system_with_tools("You help.", tools), add_generation_prompt=True)
    calls = ToolCallDecoder.for_reply(omni, tuple(tools), choice, parallel=False)
    session.prefill(prompt.tensors(), calls=calls)
    steps = []
    while (step := session.decode_step()).finish_reason is None:
        steps.append(step)
    steps.append(step)
    return session, calls, steps


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tool,valid", [(WEATHER, valid_weather), (BOOKING, valid_booking)], ids=["weather", "booking"])
def test_a_forced_call_has_schema_valid_arguments_whatever_is_sampled(omni, tool, valid, seed):
    sampling = Sampling(temperature=1.5, seed=seed)  # far from greedy: the grammar alone keeps it valid
    session, calls, steps = reply(omni, [WEATHER, BOOKING], {"type": "function", "name": tool["name"]}, sampling)
    assert steps[-1].finish_reason == "stop"
    ((name, arguments),) = calls.finished
    assert name == tool["name"]
    assert valid(json.loads(arguments))
    assert all(step.call for step in steps if step.token_id is not None)  # none of it is spoken
    # The history holds the call in Qwen3's format, as a client-added call item would put it.
    expected = omni.tokenizer.decode(omni.tokenizer(tool_call_text(name, arguments), add_special_tokens=False).input_ids)
    assert json.loads(session.reply_text().split("\n")[1]) == json.loads(expected.split("\n")[1])


def test_required_calls_one_of_the_tools(omni):
    _, calls, _ = reply(omni, [WEATHER, BOOKING], "required")
    ((name, arguments),) = calls.finished
    assert {"get_weather": valid_weather, "book_table": valid_booking}[name](json.loads(arguments))


def test_a_call_past_the_reply_limit_is_finished_not_cut(omni):
    _, calls, steps = reply(omni, [BOOKING], "required", max_reply_tokens=4)
    assert len(steps) > 4 and steps[-1].finish_reason == "stop"
    assert valid_booking(json.loads(calls.finished[0][1]))


def test_tool_choice_none_never_opens_a_call(omni):
    session, calls, steps = reply(omni, [WEATHER], "none", Sampling(temperature=2.0, seed=3))
    assert calls.finished == [] and not any(step.call for step in steps)
    assert omni.tokens.tool_call not in session.reply_token_ids
