"""Function calling and the GA details agent frameworks rely on, at the protocol core (no graph)."""

from __future__ import annotations

import json

from graph.messages import (
    AddItem,
    CreateResponse,
    FunctionCall,
    TextDelta,
    TurnDone,
    Usage,
)
from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import ServedModel

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SERVED = ServedModel("model-x", max_output_tokens=16, speakers=("chelsie", "ethan"), default_speaker="ethan",
                     voice_aliases={"alloy": "ethan"})


def events(actions) -> list[dict]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def kinds(actions) -> list[str]:
    return [e["type"] for e in events(actions)]


def send(protocol: RealtimeProtocol, **event) -> list:
    return protocol.receive_text(json.dumps(event))


def opened(served: ServedModel | None = SERVED) -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x", served=served)
    protocol.open()
    return protocol


def response_of(actions) -> dict:
    return next(e["response"] for e in events(actions) if e["type"] == "response.created")


def reply_command(actions) -> CreateResponse:
    (command,) = [a.message for a in actions if isinstance(a, SendToGraph) and isinstance(a.message, CreateResponse)]
    return command


def test_tools_are_accepted_echoed_and_reach_the_reply():
    protocol = opened()
    actions = send(protocol, type="session.update", session={
        "instructions": "Be brief.", "tools": [WEATHER], "tool_choice": "auto", "audio": {"output": {"voice": "alloy"}},
    })
    assert "error" not in kinds(actions)
    (updated,) = [e for e in events(actions) if e["type"] == "session.updated"]
    session = updated["session"]
    assert session["tools"] == [WEATHER]
    assert session["tool_choice"] == "auto"
    configure = [a.message for a in actions if isinstance(a, SendToGraph) and a.message.target == "dialog"][0]
    assert configure.config["tools"] == [WEATHER]
    reply = reply_command(send(protocol, type="response.create", response={"tool_choice": {"type": "function", "name": "get_weather"}})).reply
    assert reply.tools == (WEATHER,)
    assert reply.tool_choice == {"type": "function", "name": "get_weather"}


def test_a_forced_call_is_a_function_call_item_with_ga_events_and_no_message():
    protocol = opened()
    send(protocol, type="session.update", session={"tools": [WEATHER]})
    actions = send(protocol, type="response.create", response={"tool_choice": "required", "metadata": {"topic": "weather"}})
    created = events(actions)[-1]
    assert created["type"] == "response.created"
    assert created["response"]["metadata"] == {"topic": "weather"}
    response_id = created["response"]["id"]
    args = '{"city": "Paris"}'
    actions = protocol.graph_output(FunctionCall(turn_id=1, response_id=response_id, name="get_weather", arguments=args))
    actions += protocol.graph_output(TurnDone(turn_id=1, response_id=response_id, status="completed", usage=Usage(output_tokens=12)))
    assert kinds(actions) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    added, _, delta, done, item_done, _, response_done = events(actions)
    assert added["item"]["type"] == "function_call" and added["output_index"] == 0
    call_id = added["item"]["call_id"]
    assert call_id and delta["call_id"] == call_id and delta["delta"] == args
    assert (done["name"], done["arguments"], done["call_id"]) == ("get_weather", args, call_id)
    assert item_done["item"] == {**added["item"], "status": "completed", "arguments": args}
    body = response_done["response"]
    assert body["status"] == "completed"
    assert body["metadata"] == {"topic": "weather"}
    assert [item["type"] for item in body["output"]] == ["function_call"]
    assert json.loads(body["output"][0]["arguments"]) == {"city": "Paris"}
    # The call is in the conversation; its result goes back as a function_call_output item.
    retrieved = events(send(protocol, type="conversation.item.retrieve", item_id=added["item"]["id"]))[0]
    assert retrieved["item"]["name"] == "get_weather"
    actions = send(protocol, type="conversation.item.create", item={"type": "function_call_output", "call_id": call_id, "output": '{"temp_c": 21}'})
    (command,) = [a.message for a in actions if isinstance(a, SendToGraph)]
    assert isinstance(command, AddItem) and (command.role, command.text) == ("tool", '{"temp_c": 21}')
    added = events(actions)[0]
    assert added["item"]["type"] == "function_call_output" and added["previous_item_id"] == retrieved["item"]["id"]


def test_an_auto_reply_may_speak_then_call():
    protocol = opened()
    send(protocol, type="session.update", session={"tools": [WEATHER], "output_modalities": ["text"]})
    response_id = response_of(send(protocol, type="response.create"))["id"]
    actions = protocol.graph_output(TextDelta(turn_id=1, response_id=response_id, text="Let me check."))
    actions += protocol.graph_output(FunctionCall(turn_id=1, response_id=response_id, name="get_weather", arguments='{"city": "Oslo"}'))
    actions += protocol.graph_output(TurnDone(turn_id=1, response_id=response_id, transcript="Let me check."))
    done = events(actions)[-1]["response"]
    assert [(item["type"]) for item in done["output"]] == ["message", "function_call"]
    call_added = [e for e in events(actions) if e["type"] == "response.output_item.added"][0]
    assert call_added["output_index"] == 1
    assert done["output"][0]["content"][0]["text"] == "Let me check."


def test_null_on_optional_fields_means_not_given():
    protocol = opened()
    actions = send(protocol, type="response.create", response={"instructions": None, "max_output_tokens": None, "metadata": None,
                                                               "tools": None, "audio": {"output": {"voice": None}}})
    assert "error" not in kinds(actions)
    actions = send(protocol, type="session.update", session={"instructions": None, "tools": None, "max_output_tokens": None,
                                                             "audio": {"output": {"voice": None}, "input": {"turn_detection": None}}})
    assert "error" not in kinds(actions)
    # ...except where GA gives null a meaning: turn_detection null turns server VAD off.
    assert events(actions)[-1]["session"]["audio"]["input"]["turn_detection"] is None


def test_the_voice_and_the_reply_cap_in_force_are_what_the_session_says():
    protocol = RealtimeProtocol("sess_1", "model-x", served=SERVED)
    created = events(protocol.open())[0]["session"]
    assert created["max_output_tokens"] == 16  # the profile's cap, not "inf"
    assert created["audio"]["output"]["voice"] == "ethan"  # the speaker that will really speak
    session = events(send(protocol, type="session.update", session={"audio": {"output": {"voice": "alloy"}}, "max_output_tokens": 8}))[-1]["session"]
    assert (session["audio"]["output"]["voice"], session["max_output_tokens"]) == ("ethan", 8)
    session = events(send(protocol, type="session.update", session={"audio": {"output": {"voice": "Chelsie"}}, "max_output_tokens": "inf"}))[-1]["session"]
    assert (session["audio"]["output"]["voice"], session["max_output_tokens"]) == ("chelsie", 16)
    reply = reply_command(send(protocol, type="response.create")).reply
    assert reply.max_output_tokens == 16


def test_a_client_function_call_item_goes_to_the_model_as_a_call():
    protocol = opened()
    actions = send(protocol, type="conversation.item.create",
                   item={"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'})
    (command,) = [a.message for a in actions if isinstance(a, SendToGraph)]
    assert isinstance(command, AddItem) and command.call == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert events(actions)[0]["item"]["call_id"] == "call_1"


def test_an_error_echoes_the_failing_event_id():
    protocol = opened()
    actions = send(protocol, type="session.update", event_id="evt_tools", session={"tool_choice": {"type": "mcp"}})
    (error,) = [e for e in events(actions) if e["type"] == "error"]
    assert (error["error"]["code"], error["error"]["event_id"]) == ("unsupported", "evt_tools")


def test_a_forced_tool_choice_before_its_tools_is_accepted_with_the_rest_of_the_update():
    """pipecat sends `tool_choice: "required"` before its tools; LiveKit a named choice."""
    protocol = opened()
    actions = send(protocol, type="session.update", session={"instructions": "Be brief.", "tool_choice": "required"})
    assert "error" not in kinds(actions)
    (updated,) = [e for e in events(actions) if e["type"] == "session.updated"]
    assert (updated["session"]["instructions"], updated["session"]["tool_choice"]) == ("Be brief.", "required")
    actions = send(protocol, type="session.update", session={"tool_choice": {"type": "function", "name": "get_weather"}})
    assert "error" not in kinds(actions)
    send(protocol, type="session.update", session={"tools": [WEATHER]})
    reply = reply_command(send(protocol, type="response.create")).reply
    assert reply.tool_choice == {"type": "function", "name": "get_weather"} and reply.tools[0]["name"] == "get_weather"


def test_a_reply_whose_forced_choice_has_no_tool_fails_with_a_coded_error_and_the_session_goes_on():
    protocol = opened()
    send(protocol, type="session.update", session={"tool_choice": "required"})
    actions = send(protocol, type="response.create", event_id="evt_r")
    assert not [a for a in actions if isinstance(a, SendToGraph) and isinstance(a.message, CreateResponse)]
    (error,) = [e["error"] for e in events(actions) if e["type"] == "error"]
    assert (error["code"], error["param"]) == ("tool_choice_unmet", "session.tool_choice")
    (done,) = [e["response"] for e in events(actions) if e["type"] == "response.done"]
    assert done["status"] == "failed"
    assert done["status_details"]["error"]["code"] == "tool_choice_unmet"
    assert protocol.responses == {}
    actions = send(protocol, type="response.create", response={"tool_choice": "auto"})
    assert reply_command(actions).reply.tool_choice == "auto"


def test_a_named_choice_missing_from_the_tools_fails_its_reply_naming_where_it_was_given():
    protocol = opened()
    send(protocol, type="session.update", session={"tools": [WEATHER]})
    actions = send(protocol, type="response.create", response={"tool_choice": {"type": "function", "name": "nope"}})
    (error,) = [e["error"] for e in events(actions) if e["type"] == "error"]
    assert (error["code"], error["param"]) == ("tool_choice_unmet", "response.tool_choice.name")
    assert [e["response"]["status"] for e in events(actions) if e["type"] == "response.done"] == ["failed"]


def test_an_automatic_reply_is_not_made_with_the_commit_while_its_forced_choice_has_no_tool():
    protocol = opened()
    send(protocol, type="session.update", session={"tool_choice": "required"})
    assert protocol.graph_config()["auto_reply"] is None
    send(protocol, type="session.update", session={"tools": [WEATHER]})
    assert protocol.graph_config()["auto_reply"].tool_choice == "required"
