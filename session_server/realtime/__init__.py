"""Realtime voice sessions, OpenAI Realtime (GA) compatible.

`protocol.py` is the transport-free core; `websocket.py` serves it on `GET /v1/realtime`
(the WebRTC transport is a second adapter over the same core); `resume.py` keeps a session whose
socket dropped, and resumes or rebuilds it (snapshots in `session_store.py`: memory or Redis);
`live_websocket.py` serves OpenAI's Live API on `/v1/live/sessions` (`live_dialect.py`).
"""

from __future__ import annotations

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse

from session_server.state import ServerState


def install(app: FastAPI, state: ServerState) -> None:
    from session_server.realtime.resume import SessionResumer
    from session_server.realtime.session_store import StateConfig, session_store_for
    from session_server.realtime.websocket import serve

    store = session_store_for(StateConfig.from_profile(state.settings.profile or {}))
    state.resumer = SessionResumer(state, store, state.runtime.spec.limits.resume_ttl_s)

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        await serve(websocket, state)

    @app.get("/v1/realtime/capabilities")
    async def realtime_capabilities() -> JSONResponse:
        """What a new session is granted, for sglang-omni clients (realtime/sglang_session.py)."""
        from session_server.realtime.websocket import server_capabilities

        return JSONResponse(server_capabilities(state))

    from session_server.realtime.live_websocket import install_live

    install_live(app, state)  # OpenAI's Live API, a dialect of the same core (live_dialect.py)
