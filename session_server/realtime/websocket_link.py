"""One WebSocket connection of a realtime session: the link between the socket and the protocol core.

`WebSocketLink` holds the protocol, its graph session and the queues around it; the route
(websocket.py), the Live WebSocket (live_websocket.py) and resumes (resume.py) share it.
It only moves bytes and messages:

    client frames --reader--> protocol --> graph input queue --feeder--> graph session
                                       `----(room now, nothing queued)---^
    graph outputs --pump----> protocol --> outbox --writer--> client frames

Bounds (profile section `realtime:`; each says what the client sees):
- A client that stops reading: its socket's buffers fill, then sending blocks and events wait
  in the session's outbox. The session ends with reason `output_buffer_full` when either
  `max_output_stall_s` (10 s) passes without one event handed to the socket, or the outbox passes
  `max_output_buffer_bytes` (4 MiB, about 40 s of 24 kHz audio as base64). Queued events are
  dropped (a stalled client costs at most this much memory plus the socket's own buffers);
  `session.closed` {reason: "output_buffer_full"} and close code 1008 reach the client only if
  it reads again within `close_timeout_s`, after which the connection is dropped. Replies are
  paced, so the stall bound is the one a live client hits. A client that stops reading while
  nothing is being sent is found by uvicorn's keepalive instead (no pong within 20 s + 20 s):
  the socket drops, and the session ends as `client_closed` (or waits for a resume).
- `max_append_chars` (15 MiB): base64 characters in one `input_audio_buffer.append` or image;
  larger ones get error `input_audio_buffer_append_too_large`. A frame larger than the
  server's WebSocket `ws_max_size` is refused by the server itself (close code 1009).
- `max_pending_inputs` (64): client messages queued toward the graph; past it the reader stops
  reading the socket (TCP backpressure) until the graph catches up.
- `close_timeout_s` (2): how long the final `session.closed` may take to reach the client.

`compat` (none; `sgl-omni serve --realtime-compat`): a compatibility preset, what a client that
does not say which dialect it speaks gets (`sglang-omni-v0`: compat.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from graph.messages import Message
from graph.schema import convert_section
from graph.session import GraphInputs
from session_server.realtime.compat import PRESETS
from session_server.realtime.dialect import BETA, beta_requested
from session_server.realtime.first_audio import FirstAudio
from session_server.realtime.protocol import (
    CLOSE_POLICY,
    MAX_APPEND_CHARS,
    Action,
    CloseSession,
    ControlGraph,
    RealtimeProtocol,
    SendEvent,
    SendToGraph,
    reply_input_for,
)
from session_server.realtime.served import served_model
from session_server.realtime.voice_lookups import look_up_voices
from session_server.state import ServerState

log = logging.getLogger("session_server.realtime")


@dataclass(frozen=True)
class RealtimeSettings:
    max_output_buffer_bytes: int = 4 * 1024 * 1024
    max_output_stall_s: float = 10.0
    max_append_chars: int = MAX_APPEND_CHARS
    max_pending_inputs: int = 64
    close_timeout_s: float = 2.0
    # What a client that does not say which dialect it speaks gets (compat.py); None: GA.
    compat: Literal[PRESETS] | None = None

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> RealtimeSettings:
        section = profile.get("realtime")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known) if isinstance(section, dict) else []
        if unknown:
            raise ValueError(f"realtime.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        return convert_section(section, cls, "realtime")


_encode = msgspec.json.Encoder().encode

# Close codes with which a client says it is done: the session ends. Any other way of losing the
# socket (no close frame: 1006; an error code) leaves a resumable session open (resume.py).
CLOSE_ABNORMAL = 1006
FINAL_CLOSE_CODES = frozenset({1000, 1001})
# Closes the server's WebSocket layer sent because the client broke the protocol (1002, 1007: a
# text frame that is not UTF-8): that client is not waiting to resume, so its session ends.
PROTOCOL_ERROR_CODES = frozenset({1002, 1007})


class WebSocketLink:
    """One client connection: the protocol, its graph session and the three queues around it."""

    def __init__(self, websocket: WebSocket, protocol: RealtimeProtocol, settings: RealtimeSettings, metrics: Any = None):
        self.websocket = websocket
        # Time to first audio: from the end of the user's turn to the reply's first audio delta.
        self.first_audio = FirstAudio(metrics)
        self.protocol = protocol
        self.settings = settings
        self.graph: Any = None
        self.outbox: deque[str] = deque()
        self.outbox_bytes = 0
        self.outbox_ready = asyncio.Event()
        self.outbox_drained = asyncio.Event()
        self.outbox_drained.set()
        self.inputs = GraphInputs()  # bounded by the reader (`max_pending_inputs`), not by refusing
        self.closed = asyncio.Event()
        self.close_code = 1000
        self.close_reason = ""
        self.disconnected = False  # the client went away: no close frame to send
        # Resumable sessions (resume.py): a socket that drops without a normal close detaches
        # the session instead of ending it; `on_event` sees every server event before it is sent.
        self.resume_token: str | None = None
        self.detached = asyncio.Event()
        self.detached_at: float | None = None
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        # Operators (session_server/live_sessions.py, tracing.py): the turn traces, when on.
        self.trace: Any = None

    def attach(self, websocket: WebSocket) -> None:
        """A resumed client's socket takes the place of the dropped one."""
        self.websocket = websocket
        self.outbox.clear()
        self.outbox_bytes = 0
        self.outbox_drained.set()
        self.disconnected = False
        self.detached.clear()
        self.detached_at = None

    def detach(self) -> None:
        """The socket dropped: the session stays open, waiting for a resume (resume.py)."""
        self.disconnected = True
        self.detached.set()
        self.detached_at = time.time()

    # The live-sessions registry's view (session_server/live_sessions.py `SessionHost`).
    def parked_at(self) -> float | None:
        return self.detached_at if self.detached.is_set() and not self.closed.is_set() else None

    def end(self, reason: str) -> None:
        """An operator ends the session: `session.closed` {reason} and the close frame; a parked
        one ends as its resume window would (resume.py `_expire` sees it closed)."""
        self.apply(self.protocol.close(reason))

    # Apply the protocol's actions in order. Never blocks on the graph: graph-bound messages go
    # through `inputs` (the feeder awaits the graph), so the pump can always keep draining outputs.
    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendEvent):
                self._queue_event(action.event)
            elif isinstance(action, SendToGraph):
                self.inputs.put(self.graph, action.input, action.message)
            elif isinstance(action, ControlGraph):
                if self.graph is not None:
                    self.graph.control(action.control)
            elif isinstance(action, CloseSession):
                self.close_code, self.close_reason = action.code, action.reason
                self.closed.set()

    def _queue_event(self, event: dict[str, Any]) -> None:
        self.first_audio.observe(event)
        if event["type"] == "response.output_audio.delta":
            self.first_audio.left(event["response_id"], "realtime")
        if self.trace is not None:
            self.trace.observe(event)
        if self.on_event is not None:
            self.on_event(event)
        if self.detached.is_set() or (self.closed.is_set() and event["type"] != "session.closed"):
            return
        worded = self.protocol.dialect.outgoing(event)  # GA, or renamed for a beta client (dialect.py)
        if worded is None:
            return
        text = _encode(worded).decode()
        self.outbox.append(text)
        self.outbox_bytes += len(text)
        self.outbox_ready.set()
        self.outbox_drained.clear()
        if self.outbox_bytes > self.settings.max_output_buffer_bytes:
            self._give_up_on_reader()

    def _give_up_on_reader(self) -> None:
        """The client stopped reading: drop what it has not read and end the session."""
        if self.closed.is_set():
            return
        self.outbox.clear()
        self.outbox_bytes = 0
        self.apply(self.protocol.close("output_buffer_full", CLOSE_POLICY))

    async def reader(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                if self.resume_token is not None and message.get("code", CLOSE_ABNORMAL) not in FINAL_CLOSE_CODES | PROTOCOL_ERROR_CODES:
                    self.detach()
                    return
                self.disconnected = True
                self.apply(self.protocol.close("client_closed"))
                return
            text = message.get("text")
            if text is not None:
                await self.receive_text(text)
            else:
                self.apply(self.protocol.receive_binary(message.get("bytes") or b""))
            while len(self.inputs) > self.settings.max_pending_inputs and not self.closed.is_set():
                await self.inputs.changed()

    async def receive_text(self, text: str) -> None:
        """One text frame of the client; a dialect with client events of its own overrides it
        (live_websocket.py)."""
        await look_up_voices(self.protocol, text)  # off the event loop, before the event
        self.apply(self.protocol.receive_text(text))

    async def feeder(self) -> None:
        await self.inputs.feed(self.graph)  # until the graph session ends; the pump reports why

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
            try:
                # Sending blocks while the socket's buffers are full; cancelling it mid-wait
                # writes nothing (uvicorn waits for the socket to be writable, then writes whole).
                async with asyncio.timeout(self.settings.max_output_stall_s):
                    await self.websocket.send_text(text)
            except TimeoutError:
                self._give_up_on_reader()
            if not self.outbox:
                self.outbox_drained.set()


def session_headers(session_id: str) -> list[tuple[bytes, bytes]]:
    """The handshake names the session, so a proxy can pin its resumes to this replica (deploy/haproxy.cfg)."""
    return [(b"x-sglang-session-id", session_id.encode())]


def new_link(websocket: WebSocket, state: ServerState, settings: RealtimeSettings, offered: list[str], session_id: str) -> WebSocketLink:
    model = state.settings.echoed_model(websocket.query_params.get("model"))  # an alias asked for is echoed
    protocol = RealtimeProtocol(session_id, model, settings.max_append_chars,
                                reply_input=reply_input_for(state.runtime.spec.inputs), served=served_model(state),
                                compat=settings.compat, usage_totals=state.metrics.usage)
    if beta_requested(websocket.scope.get("headers", []), offered):
        protocol.dialect.choose(BETA)
    return WebSocketLink(websocket, protocol, settings, state.metrics)


def register(link: WebSocketLink, state: ServerState) -> None:
    """The session's graph is open: list it with the live sessions (admin API), trace its turns."""
    state.sessions.add(link, "realtime", "websocket")
    if state.tracing is not None:
        link.trace = state.tracing.session(link.protocol.session_id, "websocket", link.protocol.usage)


def unregister(link: WebSocketLink, state: ServerState) -> None:
    """The session is over (its graph closed, its client told)."""
    state.sessions.forget(link)
    if link.trace is not None:
        link.trace.close()
        link.trace = None


def start_tasks(link: WebSocketLink, running: list[asyncio.Task[None]] | None = None) -> list[asyncio.Task[None]]:
    """The reader, and the feeder and pump (new, or still running while the session was detached)."""
    session_id = link.protocol.session_id
    reader = asyncio.create_task(link.reader(), name=f"{session_id}:reader")
    if running:
        return [reader, *running]
    return [reader, asyncio.create_task(link.feeder(), name=f"{session_id}:feeder"),
            asyncio.create_task(link.pump(), name=f"{session_id}:pump")]


async def end_link(link: WebSocketLink, writer: asyncio.Task[None], tasks: list[asyncio.Task[None]], state: ServerState) -> None:
    """The socket is gone or the session over: detach a resumable session (resume.py), else end it."""
    if link.detached.is_set() and not link.closed.is_set() and link.graph is not None and state.resumer is not None:
        for task in tasks:
            if task.get_name().endswith(":reader"):
                task.cancel()
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        state.resumer.park(link, [t for t in tasks if not t.get_name().endswith(":reader")])
        return
    try:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if link.graph is not None:
            await link.graph.close(link.close_reason or "client_closed")
            if state.resumer is not None:
                await state.resumer.ended(link)
        await _finish(link, writer)
    finally:
        unregister(link, state)  # even when cancelled: the admin API never lists a session that is gone



async def until_closed(link: WebSocketLink, tasks: list[asyncio.Task[None]]) -> None:
    closed = asyncio.create_task(link.closed.wait())
    detached = asyncio.create_task(link.detached.wait())
    try:
        while not link.closed.is_set() and not link.detached.is_set():
            done, _ = await asyncio.wait([closed, detached, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task not in (closed, detached) and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    if isinstance(exc, WebSocketDisconnect) and link.resume_token is not None and exc.code not in FINAL_CLOSE_CODES:
                        link.detach()
                        continue
                    link.disconnected = link.disconnected or isinstance(exc, WebSocketDisconnect)
                    if not isinstance(exc, WebSocketDisconnect):
                        log.error("realtime session %s: %s failed", link.protocol.session_id, task.get_name(), exc_info=exc)
                    link.apply(link.protocol.close("client_closed" if isinstance(exc, WebSocketDisconnect) else "internal_error"))
            tasks[:] = [t for t in tasks if not t.done()]
            if not tasks and not link.closed.is_set():
                link.apply(link.protocol.close("closed"))
    finally:
        closed.cancel()
        detached.cancel()


async def _finish(link: WebSocketLink, writer: asyncio.Task[None]) -> None:
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
