"""Session lifecycle and limits: admission, lifetime, stalled clients, sglang-omni session clients."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import socket

import psutil
import websockets

from nodes.dialog import DialogSession
from nodes.vad import VadSession
from session_server.realtime.protocol import RealtimeProtocol
from tests.conftest import eventually, http_client, running_server
from tests.realtime.client import API_KEY, b64, raw_client, utterance
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16


def server(**kwargs):
    return running_server(realtime_profile(**kwargs), api_key=API_KEY)


async def test_past_max_sessions_a_new_connection_gets_session_limit_reached_and_others_keep_working():
    async with server(limits={"max_sessions": 2}) as srv:
        async with raw_client(srv) as first, raw_client(srv) as second:
            await first.recv()
            await second.recv()
            async with raw_client(srv) as third:
                error = await third.error()
                assert error["code"] == "session_limit_reached"
                assert (await third.recv())["type"] == "session.closed"
                try:
                    await third.recv()
                except websockets.ConnectionClosed as closed:
                    assert closed.rcvd.code == 1013
            for client in (first, second):
                await client.send({"type": "response.create"})
                assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


async def test_a_session_past_its_maximum_lifetime_is_closed_with_that_reason():
    async with server(limits={"max_session_s": 0.5}) as srv:
        async with raw_client(srv) as client:
            events = await client.until("session.closed", timeout=10)
            assert events[-1]["reason"] == "max_duration_reached"


async def test_a_client_that_stops_reading_is_closed_instead_of_growing_server_memory():
    profile = dict(reply={"words": 5000, "chunk_ms": 500}, realtime={"max_output_buffer_bytes": 256 * 1024, "close_timeout_s": 0.5})
    async with server(**profile) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        reader, writer = await stalled_client(port, {"type": "response.create"})
        try:
            await eventually(lambda: srv.runtime.sessions, "the stalled client's session")
            (session,) = srv.runtime.sessions.values()
            # The client reads nothing more; the server must give up on it on its own.
            async with asyncio.timeout(30):
                await session.ended.wait()
            assert session.end_reason == "output_buffer_full"
            assert srv.runtime.sessions == {}
        finally:
            writer.close()


async def stalled_client(port: int, event: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client that sends one event and then never reads again (tiny receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /v1/realtime?model=test-realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {API_KEY}\r\n\r\n"
        ).encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    payload = json.dumps(event).encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    writer.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)  # one small masked text frame
    await writer.drain()
    return reader, writer


async def test_an_sglang_omni_session_client_flow():
    async with server(reply={"words": 2}) as srv:
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})
            await client.until("session.updated")
            audio = pcm16(utterance(rate=16000))
            step = 3200  # 100 ms of 16 kHz PCM16
            chunks = [audio[i : i + step] for i in range(0, len(audio), step)]
            for seq, chunk in enumerate(chunks):
                await client.send({"type": "input_audio_buffer.append", "audio": b64(chunk), "sglang": {"seq": seq, "t_start_ms": seq * 100}})
            await client.send({"type": "sglang.input_audio.end"})
            events = await client.until("sglang.input_audio.drained")
    accepted = [e for e in events if e["type"] == "sglang.input_audio.accepted"]
    assert [e["seq"] for e in accepted] == list(range(len(chunks)))
    assert [round(e["accepted_end_ms"]) for e in accepted][-1] == round(len(audio) / 2 / 16)
    kinds = [e["type"] for e in events]
    assert kinds.index("sglang.input_audio.ended") < kinds.index("sglang.input_audio.drained")
    assert kinds.index("response.done") < kinds.index("sglang.input_audio.drained")
    assert "input_audio_buffer.speech_started" in kinds


async def test_ending_input_mid_utterance_commits_it_and_answers():
    async with server(reply={"words": 1}) as srv:
        async with raw_client(srv) as client:
            await client.recv()
            speech_only = pcm16(utterance(tail_s=0.0))
            await client.send({"type": "input_audio_buffer.append", "audio": b64(speech_only)})
            await client.until("input_audio_buffer.speech_started")
            await client.send({"type": "sglang.input_audio.end"})
            events = await client.until("sglang.input_audio.drained")
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created") < kinds.index("response.done")


def live_objects(*types: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) in types)


async def test_200_sessions_opened_and_closed_leave_no_state_behind():
    async with server(reply={"words": 1}) as srv:
        tracked = (RealtimeProtocol, VadSession, DialogSession)

        async def one_session(index: int) -> None:
            async with raw_client(srv) as client:
                await client.recv()
                await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(utterance()[:2400]))})
                if index % 10 == 0:
                    await client.send({"type": "response.create"})
                    await client.until("response.done")

        for index in range(10):  # warm-up: allocator pools, caches
            await one_session(index)
        # The baseline is read once the warm-up sessions are torn down, as the end state is.
        await eventually(lambda: not srv.runtime.sessions, "the warm-up sessions to close")
        await eventually(lambda: not live_objects(*tracked), "the warm-up sessions' state to be freed")
        rss_before = psutil.Process().memory_info().rss
        for batch in range(0, 200, 8):
            await asyncio.gather(*(one_session(batch + i) for i in range(8)))
        async with asyncio.timeout(10):
            while srv.runtime.sessions:
                await asyncio.sleep(0.02)
        rss_growth = psutil.Process().memory_info().rss - rss_before
        assert srv.runtime.nodes["vad"].open_sessions == 0
        assert srv.runtime.nodes["dialog"].open_sessions == 0
        assert srv.runtime.nodes["reply"].live == set()
        # Teardown of the last sessions may still be unwinding: state must reach zero shortly.
        async with asyncio.timeout(10):
            while live_objects(*tracked):
                await asyncio.sleep(0.1)
        print(f"RSS growth after 200 sessions: {rss_growth / 2**20:.1f} MiB")
        assert rss_growth < 64 * 2**20


async def test_a_session_opened_with_an_ephemeral_key_starts_with_the_config_minted_into_it():
    async with server() as srv:
        async with http_client(srv, API_KEY) as http:
            minted = await http.post(
                "/v1/realtime/client_secrets",
                json={"session": {"type": "realtime", "instructions": "Be brief.", "audio": {"input": {"turn_detection": None}}}},
            )
        assert minted.status_code == 200, minted.text
        async with raw_client(srv, api_key=minted.json()["value"]) as client:
            session = (await client.recv())["session"]
            assert session["instructions"] == "Be brief."
            assert session["audio"]["input"]["turn_detection"] is None
            (graph_session,) = srv.runtime.sessions.values()
            assert graph_session.info.config["turn_detection"] is None  # the graph started in manual mode


async def test_websockets_are_served_without_compression_even_when_the_client_offers_it():
    async with server() as srv:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        # websockets offers permessage-deflate by default.
        async with websockets.connect(f"{srv.ws_url}/v1/realtime", additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            assert ws.protocol.extensions == []
            assert "permessage-deflate" in ws.request.headers.get("Sec-WebSocket-Extensions", "")
