"""Issue 16 #7: a WebSocket client that stops reading while a paced reply streams.

The reply is paced (as live replies are), so the outbox never reaches `max_output_buffer_bytes`
(set out of reach here); the server gives up when no event could be handed to the socket for
`max_output_stall_s`. The session ends with `output_buffer_full`, and a client that reads again
within `close_timeout_s` gets `session.closed` with that reason and close code 1008.
"""

from __future__ import annotations

import asyncio
import json
import struct

from tests.conftest import eventually, running_server
from tests.realtime.client import API_KEY
from tests.realtime.fakes import realtime_profile
from tests.realtime.test_sessions import stalled_client

PACED_REPLY = {"words": 100_000, "chunk_ms": 100, "delay_s": 0.02}  # ~13 KB of base64 audio every 20 ms
STALL_BOUNDS = {"max_output_stall_s": 0.5, "max_output_buffer_bytes": 1 << 30, "close_timeout_s": 5.0}


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload)."""
    first, second = await reader.readexactly(2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", await reader.readexactly(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", await reader.readexactly(8))
    return first & 0x0F, await reader.readexactly(length)


async def test_a_client_that_stops_reading_during_a_paced_reply_is_closed_with_output_buffer_full_and_1008():
    async with running_server(realtime_profile(reply=PACED_REPLY, realtime=STALL_BOUNDS), api_key=API_KEY) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        reader, writer = await stalled_client(port, {"type": "response.create"})
        try:
            await eventually(lambda: srv.runtime.sessions, "the stalled client's session")
            (session,) = srv.runtime.sessions.values()
            async with asyncio.timeout(30):  # a bound on the wait, not a timing assertion
                await session.ended.wait()
            assert session.end_reason == "output_buffer_full"
            # The client reads again: what was in the socket's buffers, then the session's end.
            last_event, close_code = None, None
            async with asyncio.timeout(10):
                while close_code is None:
                    opcode, payload = await read_frame(reader)
                    if opcode == 0x1:
                        last_event = json.loads(payload)
                    elif opcode == 0x8:
                        (close_code,) = struct.unpack("!H", payload[:2])
            assert last_event == {**last_event, "type": "session.closed", "reason": "output_buffer_full"}
            assert close_code == 1008
            assert srv.runtime.sessions == {}
        finally:
            writer.close()
