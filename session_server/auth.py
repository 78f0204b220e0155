"""API-key checks: `Authorization: Bearer KEY` everywhere but /health and /ready (probes).

Browsers cannot set headers on a WebSocket, so the realtime socket also accepts the key as a
subprotocol `openai-insecure-api-key.KEY` (offered next to `realtime`), as OpenAI's does.

`/v1/admin/*` (admin.py), once an admin key is configured, takes that key alone in the Bearer
header: the client key (and an ephemeral one) gets 401 `invalid_admin_key` there. Without an
admin key those paths are checked like any other, and answer 404 as absent ones do.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from session_server.errors import openai_error_body
from session_server.state import ServerState

# "/" and "/playground": the static browser page (session_server/webrtc/page.py), which holds no secret.
OPEN_PATHS = frozenset({"/health", "/ready", "/", "/playground"})
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
ADMIN_PREFIX = "/v1/admin"


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


def bearer_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def subprotocols(headers: list[tuple[bytes, bytes]]) -> list[str]:
    offered: list[str] = []
    for name, value in headers:
        if name == b"sec-websocket-protocol":
            offered.extend(p.strip() for p in value.decode("latin-1").split(",") if p.strip())
    return offered


def subprotocol_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for protocol in subprotocols(headers):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def request_key(scope: Scope) -> str | None:
    headers = scope.get("headers", [])
    key = bearer_key(headers)
    if key is None and scope["type"] == "websocket":
        key = subprotocol_key(headers)
    return key


_UNAUTHORIZED = openai_error_body(
    "Incorrect or missing API key. Send `Authorization: Bearer <key>`.", "invalid_request_error", None, "invalid_api_key"
)
_ADMIN_UNAUTHORIZED = openai_error_body(
    "Incorrect or missing admin key. Send `Authorization: Bearer <admin key>` (`--admin-key`; the client API key is "
    "not accepted here).", "invalid_request_error", None, "invalid_admin_key"
)


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.state.settings.admin_key is not None and is_admin_path(scope["path"]):
            if self.state.admin_key_is_valid(bearer_key(scope.get("headers", []))):
                await self.app(scope, receive, send)
            else:
                await _refuse(scope, send, _ADMIN_UNAUTHORIZED)
            return
        if self.state.key_is_valid(request_key(scope), scope["path"]):
            await self.app(scope, receive, send)
            return
        await _refuse(scope, send, _UNAUTHORIZED)


async def _refuse(scope: Scope, send: Send, error: dict) -> None:
    body = json.dumps(error).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": error["error"]["code"]})
