"""WebRTC realtime sessions (OpenAI Realtime GA flow) and the browser page.

`install(app, state)` adds:
- `POST /v1/realtime/calls` (SDP offer -> answer), `POST /v1/realtime/calls/{id}/hangup`,
  `POST /v1/realtime/client_secrets` (ephemeral `ek_` keys, registered as a key validator);
- the browser page at `/` and `/playground` (clients/web, from package data);
- the sideband: `GET /v1/realtime?call_id=...` attaches a WebSocket to a live call (sideband.py);
- Live sessions over WebRTC (live_calls.py): `app.state.live_webrtc`, for the `POST
  /v1/live/sessions` and `.../fork` routes of realtime/live_websocket.py;
- a shutdown step that ends every call (peer connections closed) before the runtime stops.

Without aiortc and PyAV installed (availability.py) the server starts all the same: the call
routes answer 501 `webrtc_unavailable`, said once in the log at startup.

Calls run on the same protocol core (`session_server.realtime.protocol`) and graph as the
WebSocket sessions; see call.py for what differs on WebRTC, and docs/webrtc.md.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, WebSocket

from session_server.state import ServerState
from session_server.webrtc.availability import missing_modules
from session_server.webrtc.client_secrets import ClientSecrets
from session_server.webrtc.config import WebRTCConfig
from session_server.webrtc.page import add_page_routes
from session_server.webrtc.registry import CallRegistry
from session_server.webrtc.routes import add_routes
from session_server.webrtc.sideband import serve_sideband


def install(app: FastAPI, state: ServerState) -> None:
    config = WebRTCConfig.from_profile(state.settings.profile)
    client_secrets = ClientSecrets()
    # An ephemeral key opens one realtime session, over WebRTC or the WebSocket, and nothing else.
    state.add_key_validator(client_secrets.is_usable, frozenset({"/v1/realtime/calls", "/v1/realtime"}))
    add_page_routes(app)
    if not state.settings.enable_realtime:
        return
    if missing := missing_modules():
        logging.getLogger("session_server.webrtc").warning(
            "WebRTC calls are off: %s not installed (POST /v1/realtime/calls answers 501)", ", ".join(missing))
    calls = CallRegistry()
    app.state.webrtc_calls = calls
    app.state.client_secrets = client_secrets
    add_routes(app, state, config, calls, client_secrets)

    async def attach_to_call(websocket: WebSocket, call_id: str) -> None:
        await serve_sideband(websocket, state, calls, call_id)

    app.state.attach_to_call = attach_to_call  # `GET /v1/realtime?call_id=` (realtime/websocket.py)
    from session_server.webrtc.live_calls import LiveWebRTC

    app.state.live_webrtc = LiveWebRTC(state, config, calls)  # Live over WebRTC (realtime/live_websocket.py)

    serve_app = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: FastAPI):
        async with serve_app(app_) as value:
            try:
                yield value
            finally:
                await calls.close_all("server_shutdown")

    app.router.lifespan_context = lifespan
