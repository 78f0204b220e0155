"""`GET /v1/realtime`: the WebSocket adapter over the sans-I/O protocol core.

All protocol rules live in `protocol.py`; this module only moves bytes and messages:

    client frames --reader--> protocol --> graph input queue --feeder--> graph session
    graph outputs --pump----> protocol --> outbox --writer--> client frames

Auth runs before the handshake (session_server/auth.py: Bearer header, or the subprotocol
`openai-insecure-api-key.KEY` offered next to `realtime`, which browsers must use); the server
answers with the `realtime` subprotocol when offered. The `OpenAI-Beta: realtime=v1` header or
the `openai-beta.realtime-v1` subprotocol chooses the beta dialect (realtime/dialect.py): events
are renamed as they are serialized.

`GET /v1/realtime?call_id=rtc_...` is not a session of its own: it attaches the socket to a live
WebRTC call (the sideband, `session_server/webrtc/sideband.py`).

Bounds (profile section `realtime:`; each says what the client sees):
- `max_output_buffer_bytes` (4 MiB, about 40 s of 24 kHz audio as base64): events waiting for a
  client that stopped reading. Past it the session ends with `session.closed`
  {reason: "output_buffer_full"} and close code 1008; queued events are dropped, so a stalled
  client costs at most this much memory plus the socket's own buffer.
- `max_append_chars` (15 MiB): base64 characters in one `input_audio_buffer.append` or image;
  larger ones get error `input_audio_buffer_append_too_large`. A frame larger than the
  server's WebSocket `ws_max_size` is refused by the server itself (close code 1009).
- `max_pending_inputs` (64): client messages queued toward the graph; past it the reader stops
  reading the socket (TCP backpressure) until the graph catches up.
- `close_timeout_s` (2): how long the final `session.closed` may take to reach the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from graph.errors import SessionRejected
from graph.messages import Message
from graph.schema import convert_section
from session_server.auth import request_key, subprotocols
from session_server.realtime.dialect import BETA, beta_requested
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import (
    CLOSE_POLICY,
    MAX_APPEND_CHARS,
    Action,
    CloseSession,
    ControlGraph,
    RealtimeProtocol,
    SendEvent,
    SendToGraph,
    realtime_unavailable,
    reply_input_for,
)
from session_server.realtime.served import served_model
from session_server.state import ServerState

log = logging.getLogger("session_server.realtime")


@dataclass(frozen=True)
class RealtimeSettings:
    max_output_buffer_bytes: int = 4 * 1024 * 1024
    max_append_chars: int = MAX_APPEND_CHARS
    max_pending_inputs: int = 64
    close_timeout_s: float = 2.0

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> RealtimeSettings:
        section = profile.get("realtime")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known) if isinstance(section, dict) else []
        if unknown:
            raise ValueError(f"realtime.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        return convert_section(section, cls, "realtime")


_encode = msgspec.json.Encoder().encode


class _Link:
    """One client connection: the protocol, its graph session and the three queues around it."""

    def __init__(self, websocket: WebSocket, protocol: RealtimeProtocol, settings: RealtimeSettings, metrics: Any = None):
        self.websocket = websocket
        self.metrics = metrics
        # Time to first audio: from the end of the user's turn to the reply's first audio delta.
        self.turn_ended_at: float | None = None
        self.awaiting_audio: dict[str, float] = {}
        self.protocol = protocol
        self.settings = settings
        self.graph: Any = None
        self.outbox: deque[str] = deque()
        self.outbox_bytes = 0
        self.outbox_ready = asyncio.Event()
        self.outbox_drained = asyncio.Event()
        self.outbox_drained.set()
        self.inputs: deque[SendToGraph] = deque()
        self.inputs_changed = asyncio.Event()
        self.closed = asyncio.Event()
        self.close_code = 1000
        self.close_reason = ""
        self.disconnected = False  # the client went away: no close frame to send

    # Apply the protocol's actions in order. Never blocks on the graph: graph-bound messages go
    # through `inputs` (the feeder awaits the graph), so the pump can always keep draining outputs.
    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendEvent):
                self._queue_event(action.event)
            elif isinstance(action, SendToGraph):
                self.inputs.append(action)
                self.inputs_changed.set()
            elif isinstance(action, ControlGraph):
                if self.graph is not None:
                    self.graph.control(action.control)
            elif isinstance(action, CloseSession):
                self.close_code, self.close_reason = action.code, action.reason
                self.closed.set()

    def _observe(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed") and self.turn_ended_at is None:
            self.turn_ended_at = time.monotonic()
        elif kind == "response.created":
            started = self.turn_ended_at if self.turn_ended_at is not None else time.monotonic()
            self.awaiting_audio[event["response"]["id"]] = started
            self.turn_ended_at = None
        elif kind == "response.output_audio.delta":
            started = self.awaiting_audio.pop(event["response_id"], None)
            if started is not None and self.metrics is not None:
                self.metrics.first_audio("realtime", time.monotonic() - started)
        elif kind == "response.done":
            self.awaiting_audio.pop(event["response"]["id"], None)

    def _queue_event(self, event: dict[str, Any]) -> None:
        self._observe(event)
        if self.closed.is_set() and event["type"] != "session.closed":
            return
        worded = self.protocol.dialect.outgoing(event)  # GA, or renamed for a beta client (dialect.py)
        if worded is None:
            return
        text = _encode(worded).decode()
        self.outbox.append(text)
        self.outbox_bytes += len(text)
        self.outbox_ready.set()
        self.outbox_drained.clear()
        if self.outbox_bytes > self.settings.max_output_buffer_bytes and not self.closed.is_set():
            # The client stopped reading: drop what it has not read and end the session.
            self.outbox.clear()
            self.outbox_bytes = 0
            self.apply(self.protocol.close("output_buffer_full", CLOSE_POLICY))

    async def reader(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self.disconnected = True
                self.apply(self.protocol.close("client_closed"))
                return
            text = message.get("text")
            if text is not None:
                self.apply(self.protocol.receive_text(text))
            else:
                self.apply(self.protocol.receive_binary(message.get("bytes") or b""))
            while len(self.inputs) > self.settings.max_pending_inputs and not self.closed.is_set():
                self.inputs_changed.clear()
                await self.inputs_changed.wait()

    async def feeder(self) -> None:
        while True:
            while not self.inputs:
                self.inputs_changed.clear()
                await self.inputs_changed.wait()
            action = self.inputs.popleft()
            self.inputs_changed.set()
            try:
                await self.graph.send(action.input, action.message)
            except RuntimeError:
                return  # the graph session ended; the pump reports why

    async def pump(self) -> None:
        message: Message
        async for message in self.graph.outputs():
            self.apply(self.protocol.graph_output(message))
        self.apply(self.protocol.session_ended(self.graph.end_reason or "closed", self.graph.error))

    async def writer(self) -> None:
        while True:
            while not self.outbox:
                self.outbox_ready.clear()
                await self.outbox_ready.wait()
            text = self.outbox.popleft()
            self.outbox_bytes -= len(text)
            await self.websocket.send_text(text)
            if not self.outbox:
                self.outbox_drained.set()


async def serve(websocket: WebSocket, state: ServerState) -> None:
    call_id = websocket.query_params.get("call_id")
    attach_to_call = getattr(websocket.app.state, "attach_to_call", None)
    if call_id is not None and attach_to_call is not None:
        await attach_to_call(websocket, call_id)  # a sideband of a WebRTC call, not a session of its own
        return
    settings = RealtimeSettings.from_profile(state.settings.profile)
    offered = subprotocols(websocket.scope.get("headers", []))
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    session_id = f"sess_{secrets.token_hex(12)}"
    protocol = RealtimeProtocol(session_id, state.settings.model_id, settings.max_append_chars,
                                reply_input=reply_input_for(state.runtime.spec.inputs), served=served_model(state))
    if beta_requested(websocket.scope.get("headers", []), offered):
        protocol.dialect.choose(BETA)
    link = _Link(websocket, protocol, settings, state.metrics)
    writer = asyncio.create_task(link.writer(), name=f"{session_id}:writer")
    tasks: list[asyncio.Task[None]] = []
    try:
        refusal = _refusal(websocket, state, protocol)
        if refusal is not None:
            link.apply(protocol.reject(*refusal, CLOSE_POLICY))
        else:
            try:
                link.graph = await state.runtime.open_session(session_id, "realtime", protocol.graph_config())
            except SessionRejected as rejected:
                _unspend_key(websocket)  # no session: the ephemeral key stays good
                link.apply(protocol.reject(rejected.code, rejected.message))
        if link.graph is not None:
            link.apply(protocol.open())
            tasks = [
                asyncio.create_task(link.reader(), name=f"{session_id}:reader"),
                asyncio.create_task(link.feeder(), name=f"{session_id}:feeder"),
                asyncio.create_task(link.pump(), name=f"{session_id}:pump"),
            ]
            await _until_closed(link, tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if link.graph is not None:
            await link.graph.close(link.close_reason or "client_closed")
        await _finish(link, writer)


def _refusal(websocket: WebSocket, state: ServerState, protocol: RealtimeProtocol) -> tuple[str, str] | None:
    """Why this connection cannot become a session, as (code, message); None when it can.

    Also applies the session config minted into an ephemeral key (`POST /v1/realtime/client_secrets`),
    so the graph starts with it."""
    requested = websocket.query_params.get("model")
    if requested and requested != state.settings.model_id:
        return "model_not_found", f"The model {requested!r} is not served here; this server serves {state.settings.model_id!r}."
    if (why := realtime_unavailable(state.runtime.spec.inputs)) is not None:
        return "realtime_unavailable", why
    minted_by = getattr(websocket.app.state, "client_secrets", None)
    key = request_key(websocket.scope)
    minted = minted_by.session_of(key) if minted_by is not None else None
    if minted is not None and not minted_by.redeem(key) and state.settings.api_key is not None:
        return "invalid_api_key", "This ephemeral key was already used or has expired."
    if minted:
        try:
            protocol.configure_initial(minted)
        except RealtimeError as error:
            return error.code, error.message
    return None


def _unspend_key(websocket: WebSocket) -> None:
    minted_by = getattr(websocket.app.state, "client_secrets", None)
    key = request_key(websocket.scope)
    if minted_by is not None and key and minted_by.session_of(key) is not None:
        minted_by.release(key)


async def _until_closed(link: _Link, tasks: list[asyncio.Task[None]]) -> None:
    closed = asyncio.create_task(link.closed.wait())
    try:
        while not link.closed.is_set():
            done, _ = await asyncio.wait([closed, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not closed and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    link.disconnected = link.disconnected or isinstance(exc, WebSocketDisconnect)
                    if not isinstance(exc, WebSocketDisconnect):
                        log.error("realtime session %s: %s failed", link.protocol.session_id, task.get_name(), exc_info=exc)
                    link.apply(link.protocol.close("client_closed" if isinstance(exc, WebSocketDisconnect) else "internal_error"))
            tasks[:] = [t for t in tasks if not t.done()]
            if not tasks and not link.closed.is_set():
                link.apply(link.protocol.close("closed"))
    finally:
        closed.cancel()


async def _finish(link: _Link, writer: asyncio.Task[None]) -> None:
    """Deliver what is queued (ending with `session.closed`), then the close frame; bounded in time."""
    timeout = link.settings.close_timeout_s
    drained = asyncio.create_task(link.outbox_drained.wait())
    await asyncio.wait([drained, writer], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    drained.cancel()
    writer.cancel()
    with contextlib.suppress(BaseException):
        await writer
    if not link.disconnected:  # also after `session.close`: the client is still there for the close frame
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await link.websocket.close(link.close_code, link.close_reason[:120])
