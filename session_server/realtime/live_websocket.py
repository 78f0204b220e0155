"""`/v1/live/sessions`: OpenAI's Live API, the Realtime adapters with Live words.

The session is the Realtime WebSocket's (`websocket_link.WebSocketLink`: the same protocol core, graph
session, queues and bounds); only the vocabulary differs: each client text frame goes through
`LiveDialect.incoming` (live_dialect.py) to become GA events for the core (`feed`), and every
event the core emits leaves through `LiveDialect.outgoing` as for any dialect. The graph opens at
the handshake, as a Realtime session's does; `session.start` configures it.

Routes (docs/live.md):
- `GET /v1/live/sessions` (WebSocket): a Live session;
- `POST /v1/live/sessions` with `transport: {type: "webrtc", sdp}`: a Live session over WebRTC,
  answered `{session: {id}, transport: {type: "webrtc", sdp}}` (session_server/webrtc/live_calls.py;
  without aiortc and PyAV: 501 `webrtc_unavailable`, as `POST /v1/realtime/calls`);
- `GET /v1/live/sessions/{id}/fork` (WebSocket) and `POST .../fork` (WebRTC): a new session
  seeded with the conversation of session `id`, open or stored (live_fork.py); unknown:
  `session_not_found` (an `error` and close 1008 on the WebSocket, 404 over HTTP);
- `GET /v1/live/sessions/{id}/attach`: a sideband on a session of this server (live_sideband.py);
- `POST /v1/live/sessions/{id}/hangup`: ends the session (`close_requested`).
Not served, each with a coded error rather than a bare 404: SIP (`accept`, `reject`, `refer`)
and recordings (`GET .../content`): 501 `unsupported`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from graph.errors import SessionRejected
from session_server.errors import openai_error_response
from session_server.realtime.live_dialect import LiveDialect, LiveInput
from session_server.realtime.live_fork import NOT_FOUND, ForkSource, StoredSessions, fork_source, seed, unknown_source
from session_server.realtime.live_sideband import Sideband, refusal, serve_attach
from session_server.realtime.protocol import CLOSE_POLICY, Action, RealtimeProtocol, SendEvent, realtime_unavailable
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


def feed(protocol: RealtimeProtocol, translated: LiveInput, apply: Callable[[list[Action]], None]) -> None:
    """One translated Live client event into the core, for every Live transport: its refusal, or
    its GA events in order (stopping at the first the core refuses), then its acknowledgement."""
    if translated.refusal is not None:
        apply([SendEvent(translated.refusal)])
        return
    for ga_event in translated.ga_events:
        actions = protocol.receive_text(json.dumps(ga_event))
        apply(actions)
        if any(isinstance(a, SendEvent) and a.event["type"] == "error" for a in actions):
            return  # the core refused it: what follows it in this client event is not sent
    if translated.ack is not None:
        apply([SendEvent(translated.ack)])


class LiveLink(WebSocketLink):
    """A Realtime link whose client speaks Live: its frames are translated before the core."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.live_sidebands: list[Sideband] = []  # attached sockets (live_sideband.py)

    async def receive_text(self, text: str) -> None:
        dialect: LiveDialect = self.protocol.dialect  # type: ignore[assignment]
        translated = dialect.incoming(text)
        if translated.input_audio is not None:
            for sideband in self.live_sidebands:
                sideband.reflect_input(translated.input_audio)
        for ga_event in translated.ga_events:
            await look_up_voices(self.protocol, json.dumps(ga_event))  # uploaded voices, as for a Realtime client
        feed(self.protocol, translated, self.apply)


async def serve_live(websocket: WebSocket, state: ServerState, links: dict[str, Any], stored: StoredSessions | None,
                     fork: ForkSource | None = None) -> None:
    """A Live session on `websocket`; `fork`: a fork of that source (it then waits for the fork's
    `session.start`); `stored`: where it is kept if its client asks for `store` (live_fork.py)."""
    settings = RealtimeSettings.from_profile(state.settings.profile)
    offered = subprotocols(websocket.scope.get("headers", []))
    session_id = f"sess_{secrets.token_hex(12)}"
    await websocket.accept(headers=session_headers(session_id))
    base = new_link(websocket, state, settings, offered, session_id)  # the protocol as a Realtime session gets it
    base.protocol.dialect = LiveDialect(session_id, state.settings.model_id, aliases=state.settings.model_names)  # type: ignore[assignment]
    link = LiveLink(websocket, base.protocol, settings, state.metrics)
    replay = seed(link.protocol, fork, media=False) if fork is not None else []
    if stored is not None:
        stored.keep(link.protocol)
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
            links[session_id] = link  # a sideband may attach (live_sideband.py), a fork copy it
            link.apply(replay)  # a fork's conversation, before anything its client sends
            link.apply(link.protocol.open())  # `session.created`: not a Live event, not sent
            tasks = start_tasks(link)
            await until_closed(link, tasks)
    finally:
        links.pop(session_id, None)
        await end_link(link, writer, tasks, state)


def not_served(what: str) -> JSONResponse:
    return openai_error_response(501, f"{what} is not served by this server; Live sessions are served over the "
                                 "WebSocket `GET /v1/live/sessions` and WebRTC `POST /v1/live/sessions` (docs/live.md).",
                                 code=NOT_SERVED)


def install_live(app: FastAPI, state: ServerState) -> None:
    # This server's open Live sessions by id (WebSocket links and WebRTC calls): for their
    # sidebands, forks and hangups.
    links: dict[str, Any] = {}
    resumer = state.resumer  # its session store keeps the stored sessions (`store: true`) too
    stored = StoredSessions(resumer) if resumer is not None else None

    async def source_of(session_id: str) -> ForkSource | None:
        """An open session as it is now, else a stored one as it was last written."""
        session = links.get(session_id)
        if session is not None:
            return fork_source(session.protocol)
        return await stored.load(session_id) if stored is not None else None

    @app.websocket("/v1/live/sessions")
    async def live(websocket: WebSocket) -> None:
        await serve_live(websocket, state, links, stored)

    @app.websocket("/v1/live/sessions/{session_id}/attach")
    async def attach(websocket: WebSocket, session_id: str) -> None:
        await serve_attach(websocket, links, session_id)

    @app.websocket("/v1/live/sessions/{session_id}/fork")
    async def fork_socket(websocket: WebSocket, session_id: str) -> None:
        source = await source_of(session_id)
        if source is None:
            await websocket.accept()
            await websocket.send_text(refusal(NOT_FOUND, unknown_source(session_id)))
            await websocket.close(code=1008, reason=NOT_FOUND)
            return
        await serve_live(websocket, state, links, stored, fork=source)

    def webrtc() -> Any:
        return getattr(app.state, "live_webrtc", None)  # session_server/webrtc/live_calls.py

    async def create(request: Request) -> Response:
        if webrtc() is None:
            return not_served("WebRTC")
        return await webrtc().create(request, links, stored)

    async def fork(request: Request, session_id: str) -> Response:
        source = await source_of(session_id)
        if source is None:
            return openai_error_response(404, unknown_source(session_id), code=NOT_FOUND, param="session_id")
        if webrtc() is None:
            return not_served("WebRTC")
        return await webrtc().fork(request, source, links, stored)

    async def hangup(request: Request, session_id: str) -> Response:
        session = links.get(session_id)
        if session is None:
            return openai_error_response(404, f"No open Live session {session_id!r} on this server.", code=NOT_FOUND,
                                         param="session_id")
        session.end("hangup")
        return JSONResponse({})

    async def session_action(request: Request, session_id: str, action: str) -> JSONResponse:
        return not_served(f"`{request.method} /v1/live/sessions/{{session_id}}/{action}` (SIP, recordings)")

    app.add_api_route("/v1/live/sessions", create, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/live/sessions/{session_id}/fork", fork, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/live/sessions/{session_id}/hangup", hangup, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/live/sessions/{session_id}/{action}", session_action, methods=["GET", "POST"],
                      include_in_schema=False)
