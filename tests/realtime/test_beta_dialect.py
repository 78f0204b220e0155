"""OpenAI Realtime beta clients: the same protocol core, beta names and shapes on the way out
(session_server/realtime/dialect.py). Chosen by the `OpenAI-Beta: realtime=v1` header (the
`openai` SDK's `client.beta.realtime`), its subprotocol form, or a beta-shaped first session.update."""

from __future__ import annotations

import base64
import contextlib
import json

import websockets
from openai import AsyncOpenAI

from tests.conftest import running_server
from tests.realtime.client import (
    API_KEY,
    MODEL,
    RawClient,
    append_pcm,
    raw_client,
    until,
    utterance,
)
from tests.realtime.fakes import realtime_profile

GA_ONLY_EVENTS = {"response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.delta",
                  "response.output_audio_transcript.done", "response.output_text.delta", "response.output_text.done",
                  "conversation.item.added", "conversation.item.done"}


def server(**kwargs):
    return running_server(realtime_profile(**kwargs), api_key=API_KEY)


def beta_sdk_client(srv) -> AsyncOpenAI:
    # The beta SDK builds wss:// from base_url; a plain-HTTP test server needs the ws:// base named.
    return AsyncOpenAI(base_url=srv.base_url + "/v1", websocket_base_url=srv.ws_url + "/v1", api_key=API_KEY)


async def test_the_sdk_beta_client_gets_a_spoken_turn_in_beta_names_and_shapes():
    async with server(reply={"words": 3, "chunk_ms": 100}) as srv:
        async with beta_sdk_client(srv).beta.realtime.connect(model=MODEL) as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            assert created.session.input_audio_format == "pcm16"  # beta's pcm16: PCM16 at 24 kHz
            await conn.session.update(session={"modalities": ["text", "audio"], "voice": "alloy", "input_audio_format": "pcm16",
                                               "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}})
            updated = (await until(conn, "session.updated"))[-1]
            await append_pcm(conn, utterance())
            events = await until(conn, "response.done")

    assert updated.session.modalities == ["text", "audio"]
    assert (updated.session.input_audio_format, updated.session.output_audio_format) == ("pcm16", "pcm16")
    assert updated.session.turn_detection.silence_duration_ms == 500
    names = [e.type for e in events]
    assert not GA_ONLY_EVENTS & set(names)
    assert "conversation.item.created" in names
    assert names.index("response.audio.done") < names.index("response.audio_transcript.done") < names.index("response.done")
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.audio.delta")
    assert len(audio) == 3 * 2400 * 2  # three 100 ms chunks of 24 kHz PCM16
    transcript = "".join(e.delta for e in events if e.type == "response.audio_transcript.delta")
    assert transcript == "word0 word1 word2 "
    done = events[-1].response
    assert done.status == "completed"
    assert done.modalities == ["text", "audio"]
    assert done.output_audio_format == "pcm16"
    assert [(c.type, c.transcript) for c in done.output[0].content] == [("audio", "word0 word1 word2 ")]


async def test_a_beta_shaped_first_session_update_gets_beta_names_for_a_text_reply():
    async with server(reply={"words": 2}) as srv:
        async with raw_client(srv) as client:
            assert (await client.recv())["type"] == "session.created"
            await client.send({"type": "session.update", "session": {"modalities": ["text"], "instructions": "Be brief.",
                                                                     "max_response_output_tokens": 50}})
            session = (await client.until("session.updated"))[-1]["session"]
            await client.send({"type": "conversation.item.create",
                               "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
            await client.send({"type": "response.create", "response": {"modalities": ["text"]}})
            events = await client.until("response.done")

    assert (session["modalities"], session["instructions"], session["max_response_output_tokens"]) == (["text"], "Be brief.", 50)
    assert "output_modalities" not in session and "audio" not in session
    names = [e["type"] for e in events]
    assert not GA_ONLY_EVENTS & set(names)
    assert names.count("conversation.item.created") == 2  # the user's item, then the reply's
    assert "".join(e["delta"] for e in events if e["type"] == "response.text.delta") == "word0 word1 "
    assert next(e for e in events if e["type"] == "response.text.done")["text"] == "word0 word1 "
    done = events[-1]["response"]
    assert done["modalities"] == ["text"]
    assert done["output"][0]["content"] == [{"type": "text", "text": "word0 word1 "}]


@contextlib.asynccontextmanager
async def subprotocol_client(srv, *offered: str):
    url = f"{srv.ws_url}/v1/realtime?model={MODEL}"
    async with websockets.connect(url, subprotocols=list(offered)) as ws:
        yield RawClient(ws)


async def test_the_beta_subprotocol_chooses_the_beta_dialect_from_the_first_event():
    async with server() as srv:
        async with subprotocol_client(srv, "realtime", f"openai-insecure-api-key.{API_KEY}", "openai-beta.realtime-v1") as client:
            assert client.ws.subprotocol == "realtime"
            created = await client.recv()
    session = created["session"]
    assert (session["input_audio_format"], session["modalities"], session["voice"]) == ("pcm16", ["text", "audio"], None)
    assert session["turn_detection"]["type"] == "server_vad"
    assert session["sglang"]["granted"]["interaction"] == "turn_based"


async def test_a_ga_client_keeps_ga_names():
    async with server(reply={"words": 1}) as srv:
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            assert "output_modalities" in (await client.until("session.updated"))[-1]["session"]
            await client.send({"type": "response.create"})
            names = [e["type"] for e in await client.until("response.done")]
    assert "response.output_text.delta" in names and "response.text.delta" not in names


async def test_a_16_khz_beta_session_shows_the_format_it_really_reads_since_pcm16_is_24_khz():
    async with server() as srv:
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"modalities": ["text", "audio"], "sglang": {"tail_policy": "flush"}}})
            session = (await client.until("session.updated"))[-1]["session"]
    assert session["input_audio_format"] == {"type": "audio/pcm", "rate": 16000}  # an sglang negotiation block: 16 kHz
    assert session["output_audio_format"] == "pcm16"


async def test_beta_and_ga_name_the_same_error_shape():
    async with server() as srv:
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"modalities": ["text"]}})
            await client.until("session.updated")
            await client.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "nope", "event_id": "e1"}))
            error = await client.error()
    assert (error["code"], error["param"], error["event_id"]) == ("item_not_found", "item_id", "e1")
