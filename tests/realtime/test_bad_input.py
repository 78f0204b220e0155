"""Bad input over a raw WebSocket: each gets an `error` event naming the problem, and the session
stays usable unless the error is fatal."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import websockets

from tests.conftest import running_server
from tests.realtime.client import API_KEY, b64, raw_client
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16


def server(**kwargs):
    return running_server(realtime_profile(**kwargs), api_key=API_KEY)


async def still_usable(client) -> None:
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    updated = (await client.until("session.updated"))[-1]
    assert updated["session"]["output_modalities"] == ["text"]


@pytest.fixture
async def srv():
    async with server(dialog={"max_utterance_seconds": 1}) as running:
        yield running


BAD_EVENTS = [
    pytest.param("{not json", "invalid_json", None, id="malformed-json"),
    pytest.param('["a list"]', "invalid_json", None, id="not-an-object"),
    pytest.param({"type": "response.frobnicate", "event_id": "evt_1"}, "unknown_event_type", "type", id="unknown-event"),
    pytest.param({"event_id": "evt_1"}, "missing_required_parameter", "type", id="no-type"),
    pytest.param({"type": "conversation.item.truncate", "content_index": 0, "audio_end_ms": 5}, "missing_required_parameter", "item_id", id="missing-field"),
    pytest.param({"type": "input_audio_buffer.append", "audio": 12}, "invalid_type", "audio", id="wrong-type"),
    pytest.param(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 3}}}}},
        "invalid_value",
        "session.audio.input.turn_detection.threshold",
        id="out-of-range",
    ),
    pytest.param(
        {"type": "session.update", "session": {"sglang": {"talker_temperature": -1.0}}},
        "invalid_value",
        "session.sglang.talker_temperature",
        id="sampling-out-of-range",
    ),
    pytest.param(
        {"type": "response.create", "response": {"sglang": {"top_p": 2}}},
        "invalid_value",
        "response.sglang.top_p",
        id="reply-sampling-out-of-range",
    ),
    pytest.param({"type": "input_audio_buffer.append", "audio": "not base64!!"}, "invalid_base64", "audio", id="invalid-base64"),
    pytest.param({"type": "input_audio_buffer.append", "audio": b64(b"\x00\x01\x02")}, "invalid_audio", "audio", id="odd-byte-count"),
    pytest.param(
        {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}},
        "unsupported_audio_format",
        "session.audio.input.format",
        id="unsupported-format",
    ),
    pytest.param(
        {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}},
        "unsupported_audio_format",
        "session.audio.input.format",
        id="unsupported-rate",
    ),
    pytest.param({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None, id="commit-empty"),
    pytest.param({"type": "response.cancel"}, "response_cancel_not_active", None, id="cancel-nothing"),
    pytest.param({"type": "conversation.item.delete", "item_id": "item_nope"}, "item_not_found", "item_id", id="unknown-item"),
    pytest.param(
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c"}},
        "missing_required_parameter",
        "item.output",
        id="function-call-output-without-output",
    ),
    pytest.param(
        {"type": "conversation.item.create", "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}},
        "invalid_value",
        "item.arguments",
        id="function-call-arguments-not-json",
    ),
    pytest.param(
        {"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}},
        "unsupported",
        "session.tools[0].type",
        id="mcp-tool",
    ),
    pytest.param(
        {"type": "session.update", "session": {"tools": [{"type": "function", "name": "get weather!"}]}},
        "invalid_value",
        "session.tools[0].name",
        id="tool-name",
    ),
    pytest.param(
        {"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}},
        "invalid_value",
        "session.tools[0].parameters",
        id="tool-parameters-not-an-object",
    ),
    pytest.param(
        {"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "nope"}}},
        "tool_choice_unmet",
        "response.tool_choice.name",
        id="tool-choice-names-no-tool",
    ),
    pytest.param(
        {"type": "response.create", "response": {"tool_choice": "required"}},
        "tool_choice_unmet",
        "response.tool_choice",
        id="required-without-tools",
    ),
    pytest.param(
        {"type": "sglang.input_image.append", "image": b64(b"GIF89a....")}, "invalid_image", "image", id="image-not-jpeg-or-png"
    ),
    pytest.param(
        {"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00"), "sglang": {"seq": 3}}, "invalid_seq", "sglang.seq", id="seq-gap"
    ),
]


@pytest.mark.parametrize("event,code,param", BAD_EVENTS)
async def test_bad_event_gets_an_error_naming_the_problem_and_the_session_stays_usable(srv, event, code, param):
    async with raw_client(srv) as client:
        assert (await client.recv())["type"] == "session.created"
        await client.send(event)
        error = await client.error()
        assert error["code"] == code
        assert error["param"] == param
        assert error["message"]
        assert set(error) >= {"type", "code", "message", "param", "event_id"}
        if isinstance(event, dict) and "event_id" in event:
            assert error["event_id"] == event["event_id"]
        await still_usable(client)


async def test_a_binary_frame_is_rejected_with_an_error(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send(b"\x00\x01 raw pcm")
        assert (await client.error())["code"] == "binary_frames_unsupported"
        await still_usable(client)


async def test_an_append_over_15_mib_is_refused(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "input_audio_buffer.append", "audio": "A" * (15 * 1024 * 1024 + 4)})
        error = await client.error()
        assert (error["code"], error["param"]) == ("input_audio_buffer_append_too_large", "audio")
        await still_usable(client)


async def test_audio_over_max_utterance_seconds_is_an_error(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await client.until("session.updated")
        loud = pcm16(np.full(24000 * 2, 0.1, np.float32))  # 2 s, the limit is 1 s
        await client.send({"type": "input_audio_buffer.append", "audio": b64(loud)})
        assert (await client.error())["code"] == "utterance_too_long"
        await still_usable(client)


async def test_response_create_while_one_is_active_is_refused():
    async with server(reply={"words": 100, "delay_s": 0.02}) as srv:
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "response.create"})
            await client.until("response.created")
            await client.send({"type": "response.create", "event_id": "evt_again"})
            error = await client.error()
            assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response", "evt_again")
            await client.send({"type": "response.cancel"})
            done = (await client.until("response.done"))[-1]["response"]
            assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")


async def test_appends_after_input_audio_end_are_refused(srv):
    async with raw_client(srv) as client:
        await client.recv()
        await client.send({"type": "sglang.input_audio.end"})
        await client.until("sglang.input_audio.ended")
        await client.send({"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00")})
        assert (await client.error())["code"] == "input_audio_ended"


async def test_events_after_the_server_closed_the_session_go_nowhere():
    async with server(limits={"idle_timeout_s": 0.3}) as srv:
        async with raw_client(srv) as client:
            await client.recv()
            events = await client.until("session.closed", timeout=10)
            assert events[-1]["reason"] == "idle_timeout"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await client.send({"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00")})
                await client.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert srv.runtime.sessions == {}


async def test_a_wrong_model_is_refused_with_an_error_and_a_close():
    async with server() as srv:
        async with raw_client(srv, model="gpt-realtime") as client:
            error = await client.error()
            assert error["code"] == "model_not_found"
            assert (await client.recv())["type"] == "session.closed"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await client.recv()
            assert closed.value.rcvd.code == 1008


async def test_a_missing_api_key_is_refused_before_the_handshake():
    async with server() as srv:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with raw_client(srv, api_key=None):
                pass
        assert refused.value.response.status_code == 401


async def test_a_browser_can_authenticate_with_the_subprotocol():
    async with server() as srv:
        url = f"{srv.ws_url}/v1/realtime?model=test-realtime"
        protocols = ["realtime", f"openai-insecure-api-key.{API_KEY}"]
        async with websockets.connect(url, subprotocols=protocols) as ws:
            assert ws.subprotocol == "realtime"
            assert b'"session.created"' in (await ws.recv()).encode()



class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_text_frame_that_is_not_utf8_closes_with_1007_and_logs_one_line():
    records = Records()
    uvicorn_log = logging.getLogger("uvicorn.error")
    async with server() as srv:
        uvicorn_log.addHandler(records)
        try:
            async with raw_client(srv) as client:
                assert (await client.recv())["type"] == "session.created"
                # websockets sends bytes given with text=True as a text frame, unchecked.
                await client.ws.send(b'{"type": "session.update", "x": "\xff\xfe"}', text=True)
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    while True:
                        await client.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
            async with asyncio.timeout(10):  # ended, not parked for a resume
                while srv.runtime.sessions:
                    await asyncio.sleep(0.05)
        finally:
            uvicorn_log.removeHandler(records)
    refusals = [r for r in records.records if "UTF-8" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in records.records]
    (refusal,) = refusals
    assert refusal.levelno == logging.WARNING and refusal.exc_info is None and "\n" not in refusal.getMessage()
    assert "1007" in refusal.getMessage() and "byte" in refusal.getMessage()
