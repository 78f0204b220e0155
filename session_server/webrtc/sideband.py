"""`GET /v1/realtime?call_id=rtc_...`: a WebSocket attached to a live WebRTC call (the sideband).

As in OpenAI's GA API, for server-side tool handling: the application's backend, which holds
the API key, follows a call its browser placed and answers the model's function calls.

- Server events: every event the call's `oai-events` data channel gets, from the moment the
  socket attaches, as JSON text frames (reply audio stays on the media track, as on the channel).
- Client events: handled exactly as if they came over the data channel
  (`Call.receive_client_message`, including its `webrtc.max_message_bytes` bound), e.g.
  `conversation.item.create` {function_call_output} then `response.create`. The events they
  cause, errors included, go to every listener, like every other server event.
- Auth: the server's API key when it has one (checked by the middleware, as for the call). An
  ephemeral `ek_` key opens one session of its own and cannot attach to someone's call:
  `invalid_api_key`. A server without a key needs none.
- Refusals, each an `error` event then close code 1008: unknown or ended call
  (`call_not_found`, param `call_id`), `MAX_SIDEBANDS` already attached
  (`sideband_limit_reached`), an ephemeral key (`invalid_api_key`).
- Lifetime: when the call ends the socket gets `session.closed` {reason} and is closed (1000,
  or 1001 at server shutdown). When the socket goes away it is detached; the call goes on.
- Bound: `MAX_BUFFERED_BYTES` of events waiting for a sideband that stopped reading; past it
  that sideband alone is closed (1008 `output_buffer_full`) and the call goes on. So a stalled
  sideband costs at most that much memory plus its socket's buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections import deque
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketDisconnect

from session_server.auth import request_key, subprotocols
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY
from session_server.state import ServerState
from session_server.webrtc.registry import CallRegistry

if TYPE_CHECKING:  # call.py needs aiortc, which is optional (availability.py)
    from session_server.webrtc.call import Call

log = logging.getLogger("session_server.webrtc")

# Several backends may watch one call (e.g. a tool runner and a logger); each costs an outbox.
MAX_SIDEBANDS = 4
MAX_BUFFERED_BYTES = 4 * 1024 * 1024
CLOSE_TIMEOUT_S = 2.0


class Sideband:
    """One attached socket's outbox: `Call` delivers every event here; `write` sends them."""

    def __init__(self, max_buffered_bytes: int = MAX_BUFFERED_BYTES):
        self.max_buffered_bytes = max_buffered_bytes
        self.outbox: deque[str] = deque()
        self.outbox_bytes = 0
        self.ready = asyncio.Event()
        self.ended = asyncio.Event()  # nothing more will be queued; close once the outbox is sent
        self.close_code = CLOSE_NORMAL
        self.close_reason = ""

    def deliver(self, text: str) -> None:
        if self.ended.is_set():
            return
        self.outbox.append(text)
        self.outbox_bytes += len(text)
        self.ready.set()
        if self.outbox_bytes > self.max_buffered_bytes:
            # This sideband stopped reading: drop what it has not read and let it go.
            self.outbox.clear()
            self.outbox_bytes = 0
            self._end(CLOSE_POLICY, "output_buffer_full")

    def call_ended(self, reason: str) -> None:
        self._end(CLOSE_GOING_AWAY if reason == "server_shutdown" else CLOSE_NORMAL, reason)

    def _end(self, code: int, reason: str) -> None:
        if not self.ended.is_set():
            self.close_code, self.close_reason = code, reason
            self.ended.set()
            self.ready.set()

    async def write(self, websocket: WebSocket) -> None:
        """Send queued events; return once ended and everything queued was sent."""
        while True:
            while self.outbox:
                text = self.outbox.popleft()
                self.outbox_bytes -= len(text)
                await websocket.send_text(text)
            if self.ended.is_set():
                return
            self.ready.clear()
            await self.ready.wait()


async def serve_sideband(websocket: WebSocket, state: ServerState, calls: CallRegistry, call_id: str) -> None:
    offered = subprotocols(websocket.scope.get("headers", []))
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    if not _is_server_key(state, request_key(websocket.scope)):
        # The middleware let it in, so it is an ephemeral key (now spent).
        await _refuse(websocket, "invalid_api_key", "A sideband needs the server's API key; an ephemeral key cannot attach to a call.")
        return
    call = calls.get(call_id)
    if call is not None and len(call.sidebands) >= MAX_SIDEBANDS:
        await _refuse(websocket, "sideband_limit_reached", f"A call takes at most {MAX_SIDEBANDS} sideband sockets.", "call_id")
        return
    sideband = Sideband()
    if call is None or not call.attach(sideband):
        await _refuse(websocket, "call_not_found", f"No live call {call_id!r} (unknown, or it has ended).", "call_id")
        return
    try:
        await _run(websocket, call, sideband)
    finally:
        call.detach(sideband)


def _is_server_key(state: ServerState, key: str | None) -> bool:
    expected = state.settings.api_key
    return expected is None or (key is not None and hmac.compare_digest(key.encode(), expected.encode()))


async def _run(websocket: WebSocket, call: Call, sideband: Sideband) -> None:
    reader = asyncio.create_task(_read(websocket, call), name=f"{call.id}:sideband-reader")
    writer = asyncio.create_task(sideband.write(websocket), name=f"{call.id}:sideband-writer")
    ended = asyncio.create_task(sideband.ended.wait())
    try:
        done, _ = await asyncio.wait([reader, writer, ended], return_when=asyncio.FIRST_COMPLETED)
        for task in done & {reader, writer}:
            if task.exception() is not None and not isinstance(task.exception(), WebSocketDisconnect):
                log.error("call %s: %s failed", call.id, task.get_name(), exc_info=task.exception())
        if reader in done or (writer in done and writer.exception() is not None):
            return  # the socket went away (or broke): only this sideband ends
        # The call ended (or this sideband overflowed): deliver what is queued, then close.
        await asyncio.wait([writer, reader], timeout=CLOSE_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            writer.cancel()  # still sending after CLOSE_TIMEOUT_S: the client is not reading
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await websocket.close(sideband.close_code, sideband.close_reason[:120])
    finally:
        for task in (reader, writer, ended):
            task.cancel()
        await asyncio.gather(reader, writer, ended, return_exceptions=True)


async def _read(websocket: WebSocket, call: Call) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        call.receive_client_message(text if text is not None else message.get("bytes") or b"")


async def _refuse(websocket: WebSocket, code: str, message: str, param: str | None = None) -> None:
    """An `error` event in the protocol's shape, then close 1008."""
    event = {"type": "error", "event_id": "event_sideband_refused", "error": RealtimeError(code, message, param).to_wire()}
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await websocket.send_text(json.dumps(event))
            await websocket.close(CLOSE_POLICY, code)
