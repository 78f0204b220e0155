"""Realtime voice sessions, OpenAI Realtime (GA) compatible.

`protocol.py` is the transport-free core; `websocket.py` serves it on `GET /v1/realtime`
(the WebRTC transport is a second adapter over the same core).
"""

from __future__ import annotations

from fastapi import FastAPI, WebSocket

from session_server.state import ServerState


def install(app: FastAPI, state: ServerState) -> None:
    from session_server.realtime.websocket import serve

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        await serve(websocket, state)
