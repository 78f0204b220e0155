"""`GET /v1/live/sessions`: OpenAI's Live API over WebSocket, the Realtime adapter with Live words.

The session is the Realtime WebSocket's (`websocket_link.WebSocketLink`: the same protocol core, graph
session, queues and bounds); only the vocabulary differs: each client text frame goes through
`LiveDialect.incoming` (live_dialect.py) to become GA events for the core, and every event the
core emits leaves through `LiveDialect.outgoing` as for any dialect. The graph opens at the
handshake, as a Realtime session's does; `session.start` configures it.

`GET /v1/live/sessions/{id}/attach` is a sideband on a session of this server (live_sideband.py).

Not served, each with a coded error rather than a bare 404 (docs/live.md):
- `POST /v1/live/sessions` (WebRTC: `transport: {type: "webrtc", sdp}`): 501 `unsupported`;
- `POST /v1/live/sessions/{id}/fork`, `accept`, `reject`, `refer`, `hangup`, and
  `GET .../content` (recordings): 501 `unsupported`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from graph.errors import SessionRejected
from session_server.errors import openai_error_response
from session_server.realtime.live_dialect import LiveDialect
from session_server.realtime.live_sideband import Sideband, serve_attach
from session_server.realtime.protocol import CLOSE_POLICY, SendEvent, realtime_unavailable
from session_server.realtime.voice_lookups import look_up_voices
from session_server.realtime.websocket_link import (
    RealtimeSettings,
    WebSocketLink,
    end_link,
    new_link,
    register,
    session_headers,
    start_tasks,
    until_closed,
)
from session_server.auth import subprotocols
from session_server.state import ServerState

NOT_SERVED = "unsupported"


class LiveLink(WebSocketLink):
    """A Realtime link whose client speaks Live: its frames are translated before the core."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sidebands: list[Sideband] = []  # attached sockets (live_sideband.py)

    async def receive_text(self, text: str) -> None:
        dialect: LiveDialect = self.protocol.dialect  # type: ignore[assignment]
        translated = dialect.incoming(text)
        if translated.refusal is not None:
            self.apply([SendEvent(translated.refusal)])
            return
        if translated.input_audio is not None:
            for sideband in self.sidebands:
                sideband.reflect_input(translated.input_audio)
        for ga_event in translated.ga_events:
            ga_text = json.dumps(ga_event)
            await look_up_voices(self.protocol, ga_text)  # uploaded voices, as for a Realtime client
            actions = self.protocol.receive_text(ga_text)
            self.apply(actions)
            if any(isinstance(a, SendEvent) and a.event["type"] == "error" for a in actions):
                return  # the core refused it: what follows it in this client event is not sent
        if translated.ack is not None:
            self.apply([SendEvent(translated.ack)])


async def serve_live(websocket: WebSocket, state: ServerState, links: dict[str, LiveLink]) -> None:
    settings = RealtimeSettings.from_profile(state.settings.profile)
    offered = subprotocols(websocket.scope.get("headers", []))
    session_id = f"sess_{secrets.token_hex(12)}"
    await websocket.accept(headers=session_headers(session_id))
    base = new_link(websocket, state, settings, offered, session_id)  # the protocol as a Realtime session gets it
    base.protocol.dialect = LiveDialect(session_id, state.settings.model_id, aliases=state.settings.model_names)  # type: ignore[assignment]
    link = LiveLink(websocket, base.protocol, settings, state.metrics)
    writer = asyncio.create_task(link.writer(), name=f"{session_id}:writer")
    tasks: list[asyncio.Task[None]] = []
    try:
        why = realtime_unavailable(state.runtime.spec.inputs)
        if why is not None:
            link.apply(link.protocol.reject("realtime_unavailable", why, CLOSE_POLICY))
        else:
            try:
                link.graph = await state.runtime.open_session(session_id, "realtime", link.protocol.graph_config())
            except SessionRejected as rejected:
                link.apply(link.protocol.reject(rejected.code, rejected.message))
        if link.graph is not None:
            register(link, state)
            links[session_id] = link  # a sideband may attach (live_sideband.py)
            link.apply(link.protocol.open())  # `session.created`: not a Live event, not sent
            tasks = start_tasks(link)
            await until_closed(link, tasks)
    finally:
        links.pop(session_id, None)
        await end_link(link, writer, tasks, state)


def not_served(what: str) -> JSONResponse:
    return openai_error_response(501, f"{what} is not served by this server; Live sessions are served over the "
                                 "WebSocket `GET /v1/live/sessions` (docs/live.md).", code=NOT_SERVED)


def install_live(app: FastAPI, state: ServerState) -> None:
    links: dict[str, LiveLink] = {}  # this server's Live sessions by id, for their sidebands

    @app.websocket("/v1/live/sessions")
    async def live(websocket: WebSocket) -> None:
        await serve_live(websocket, state, links)

    @app.websocket("/v1/live/sessions/{session_id}/attach")
    async def attach(websocket: WebSocket, session_id: str) -> None:
        await serve_attach(websocket, links, session_id)

    async def create(request: Request) -> JSONResponse:
        return not_served("Creating a Live session over HTTP (WebRTC, SIP)")

    async def session_action(request: Request, session_id: str, action: str) -> JSONResponse:
        return not_served(f"`{request.method} /v1/live/sessions/{{session_id}}/{action}`")

    app.add_api_route("/v1/live/sessions", create, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/live/sessions/{session_id}/{action}", session_action, methods=["GET", "POST"],
                      include_in_schema=False)
