"""Issue 16 (2, 5): text and images are bounded at the edge, before any model work, with coded errors."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import pytest
from PIL import Image

from graph.messages import AddItem, Command, ImageFrame
from session_server.realtime.input_bounds import DEFAULT_MAX_TEXT_TOKENS
from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import ServedModel
from tests.conftest import running_server
from tests.realtime.client import API_KEY, raw_client
from tests.realtime.fakes import realtime_profile


def opened(**bounds) -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x", served=ServedModel(model="model-x", **bounds))
    protocol.open()
    return protocol


def send(protocol: RealtimeProtocol, **event) -> list:
    return protocol.receive_text(json.dumps(event))


def errors(actions) -> list[dict]:
    return [a.event["error"] for a in actions if isinstance(a, SendEvent) and a.event["type"] == "error"]


def to_graph(actions) -> list:
    return [a.message for a in actions if isinstance(a, SendToGraph)]


def text_item(text: str) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()


def image_item(data: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}}


def test_a_32000_character_text_item_is_refused_before_it_reaches_the_model():
    protocol = opened()
    actions = send(protocol, **text_item("x" * 32000))
    (error,) = errors(actions)
    assert (error["code"], error["param"]) == ("text_too_long", "item.content")
    assert str(DEFAULT_MAX_TEXT_TOKENS) in error["message"]
    assert to_graph(actions) == [] and protocol.items == {}


def test_a_text_item_within_the_bound_is_added():
    actions = send(opened(max_text_tokens=100), **text_item("x" * 100))
    assert errors(actions) == []
    assert [type(m) for m in to_graph(actions) if isinstance(m, Command)] == [AddItem]


def test_the_bound_counts_utf8_bytes_so_no_text_can_exceed_it_in_tokens():
    # 40 characters of CJK are 120 bytes: a byte-level BPE makes at most 120 tokens of them.
    assert errors(send(opened(max_text_tokens=100), **text_item("字" * 40)))[0]["code"] == "text_too_long"


def test_a_long_function_output_is_refused_like_a_text():
    event = {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": "y" * 200}}
    assert errors(send(opened(max_text_tokens=100), **event))[0]["code"] == "text_too_long"


@pytest.mark.parametrize(
    "event,param",
    [
        ({"type": "session.update", "session": {"instructions": "z" * 200}}, "session.instructions"),
        ({"type": "response.create", "response": {"instructions": "z" * 200}}, "response.instructions"),
    ],
)
def test_long_instructions_are_refused_and_change_nothing(event, param):
    protocol = opened(max_text_tokens=100)
    actions = protocol.receive_text(json.dumps(event))
    (error,) = errors(actions)
    assert (error["code"], error["param"]) == ("text_too_long", param)
    assert to_graph(actions) == [] and protocol.responses == {} and protocol.config.instructions == ""


def test_instructions_in_an_initial_session_config_are_bounded_too():
    protocol = RealtimeProtocol("sess_1", "m", served=ServedModel(model="m", max_text_tokens=10))
    with pytest.raises(Exception) as refused:
        protocol.configure_initial({"instructions": "a" * 11})
    assert refused.value.code == "text_too_long"


BAD_IMAGES = [
    pytest.param(b"not an image at all", id="not-an-image"),
    pytest.param(png(32, 32)[:40] + b"garbage" * 30, id="png-header-then-garbage"),
    pytest.param(b"\xff\xd8\xff\xe0" + b"\x00" * 200, id="jpeg-magic-then-zeros"),
    pytest.param(png(2000, 2000), id="over-the-pixel-bound"),
]


@pytest.mark.parametrize("data", BAD_IMAGES)
def test_an_undecodable_or_huge_image_item_gets_invalid_image_and_the_session_goes_on(data):
    protocol = opened(max_image_pixels=1000 * 1000)
    actions = send(protocol, **image_item(data))
    (error,) = errors(actions)
    assert error["code"] == "invalid_image"
    assert to_graph(actions) == [] and protocol.state.name == "OPEN"


@pytest.mark.parametrize("data", BAD_IMAGES)
def test_an_undecodable_or_huge_appended_image_gets_invalid_image(data):
    protocol = opened(max_image_pixels=1000 * 1000)
    actions = send(protocol, type="sglang.input_image.append", image=base64.b64encode(data).decode())
    assert errors(actions)[0]["code"] == "invalid_image"
    assert not any(isinstance(m, ImageFrame) for m in to_graph(actions))


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature, its IHDR (the size) and the start of its pixel data: all a decoder reads
    before it would inflate the pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\x00" * 4096))


@pytest.mark.parametrize("side", [6000, 14000])  # 14,000: past PIL's own decompression-bomb guard too
def test_the_pixel_count_comes_from_the_header_before_any_decode(side):
    error = errors(send(opened(), **image_item(png_header(side, side))))[0]
    assert error["code"] == "invalid_image" and "pixels" in error["message"]


def test_a_good_image_is_accepted():
    actions = send(opened(), type="sglang.input_image.append", image=base64.b64encode(png(64, 48)).decode())
    assert errors(actions) == [] and any(isinstance(m, ImageFrame) for m in to_graph(actions))


async def test_the_profiles_limits_bound_a_live_session():
    profile = realtime_profile(limits={"max_text_tokens": 64, "max_image_pixels": 100})
    async with running_server(profile, api_key=API_KEY) as srv, raw_client(srv) as client:
        assert (await client.recv())["type"] == "session.created"
        await client.send(text_item("x" * 65))
        assert (await client.error())["code"] == "text_too_long"
        await client.send(image_item(png(11, 10)))
        assert (await client.error())["code"] == "invalid_image"
        await client.send(text_item("x" * 64))
        assert (await client.until("conversation.item.added"))[-1]["item"]["content"][0]["text"] == "x" * 64


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_a_deeply_nested_event_is_invalid_json_and_the_session_goes_on(depth):
    protocol = opened()
    nested = '{"type":"input_audio_buffer.clear","x":' + "[" * depth + "]" * depth + "}"
    (error,) = errors(protocol.receive_text(nested))
    assert error["code"] == "invalid_json" and protocol.state.name == "OPEN"
    assert errors(send(protocol, type="input_audio_buffer.clear")) == []


def test_deeply_nested_function_call_arguments_are_invalid_value():
    arguments = "[" * 5000 + "]" * 5000
    event = {"type": "conversation.item.create", "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": arguments}}
    (error,) = errors(send(opened(), **event))
    assert (error["code"], error["param"]) == ("invalid_value", "item.arguments")
