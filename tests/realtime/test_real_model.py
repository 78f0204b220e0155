"""The served default graph (tiny random-weight Qwen3-Omni on CPU) behind the realtime protocol.

One small session: replies are gibberish (random weights), but every stage is the real one.
"""

from __future__ import annotations

import base64
import json

from configs import load_profile
from tests.conftest import running_server
from tests.realtime.client import API_KEY, append_pcm, sdk_client, until, utterance


async def test_the_default_graph_answers_two_spoken_turns_and_reuses_its_kv_cache():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 6})
            await until(conn, "session.updated")
            await append_pcm(conn, utterance())
            first = await until(conn, "response.done", timeout=120)
            await append_pcm(conn, utterance("And tomorrow?"))
            second = await until(conn, "response.done", timeout=120)
    for events in (first, second):
        assert [e.type for e in events][:3] == [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
        ]
        done = events[-1].response
        assert done.status in ("completed", "incomplete")
        audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
        assert len(audio) > 0 and len(audio) % 2 == 0
        assert done.usage.input_token_details.audio_tokens > 0
    # The second reply reuses the KV of everything before it, the first turn and reply included:
    # cached_tokens is exactly the previous context (its new utterance counts as input, even
    # though the thinker prefilled it at commit).
    first_usage = first[-1].response.usage
    assert first_usage.input_token_details.cached_tokens == 0
    previous_context = first_usage.input_tokens + first_usage.output_token_details.text_tokens
    assert second[-1].response.usage.input_token_details.cached_tokens == previous_context


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def schema_valid_weather_arguments(arguments: str) -> bool:
    parsed = json.loads(arguments)
    return set(parsed) == {"city", "unit"} and isinstance(parsed["city"], str) and parsed["unit"] in ("celsius", "fahrenheit")


async def test_a_forced_tool_call_on_the_tiny_model_is_schema_valid_and_its_result_feeds_a_spoken_reply():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "audio": {"input": {"turn_detection": None}}})
            await until(conn, "session.updated")
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
            await conn.response.create(response={"tool_choice": {"type": "function", "name": "get_weather"}})
            called = await until(conn, "response.done", timeout=120)
            done = called[-1].response
            assert done.status == "completed"
            (call,) = done.output
            assert (call.type, call.name) == ("function_call", "get_weather")
            assert schema_valid_weather_arguments(call.arguments)
            kinds = [e.type for e in called]
            assert "response.output_audio.delta" not in kinds  # a call is not spoken
            (arguments_done,) = [e for e in called if e.type == "response.function_call_arguments.done"]
            assert arguments_done.arguments == call.arguments and arguments_done.call_id == call.call_id

            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                      "output": json.dumps({"temperature": 21})})
            await conn.response.create()
            follow_up = await until(conn, "response.done", timeout=120)
    reply = follow_up[-1].response
    assert reply.status in ("completed", "incomplete")
    assert [item.type for item in reply.output] == ["message"]
    audio = b"".join(base64.b64decode(e.delta) for e in follow_up if e.type == "response.output_audio.delta")
    assert len(audio) > 0
    # The call and its result are in the model's context: the follow-up reuses the KV of the call.
    assert reply.usage.input_token_details.cached_tokens == done.usage.input_tokens + done.usage.output_tokens
