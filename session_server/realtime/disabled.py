"""The realtime routes of a server started without `--enable-realtime`: each answers why.

Without this, a client met a bare 404 (`{"detail": "Not Found"}`) or a WebSocket handshake
refused with 403 and no body. Here every realtime route answers 403 in the OpenAI error shape,
code `realtime_disabled`, with a message naming the flag; the WebSocket gets the same body as
its handshake response (the ASGI denial-response extension), or close 1008 where the server
lacks that extension.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from session_server.errors import openai_error_response

REALTIME_DISABLED = "realtime_disabled"
REALTIME_DISABLED_MESSAGE = (
    "Realtime sessions are off on this server: restart it with `sgl-omni serve --enable-realtime` "
    "(`make serve` passes it). Speech endpoints (/v1/audio/speech) work without it."
)


def realtime_disabled_response() -> JSONResponse:
    return openai_error_response(403, REALTIME_DISABLED_MESSAGE, code=REALTIME_DISABLED)


def install_disabled(app: FastAPI) -> None:
    async def refuse(request: Request) -> JSONResponse:
        return realtime_disabled_response()

    for path in ("/v1/realtime", "/v1/realtime/calls", "/v1/realtime/calls/{call_id}/hangup", "/v1/realtime/client_secrets",
                 "/v1/realtime/capabilities", "/v1/live/sessions"):
        app.add_api_route(path, refuse, methods=["GET", "POST"], include_in_schema=False)

    @app.websocket("/v1/realtime")
    @app.websocket("/v1/live/sessions")
    async def refuse_session(websocket: WebSocket) -> None:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(realtime_disabled_response())
        else:
            await websocket.close(code=1008, reason=REALTIME_DISABLED)
