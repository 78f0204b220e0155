"""The request-body bound, at the ASGI layer: a body is refused before it is read, not after.

Every HTTP request's body may be at most `limits.max_request_bytes` (default 4 MiB: a full
speech batch, 32 items of 4,096 characters each with instructions, fits even \\u-escaped), or
the bound a route registers for its own path (a voice upload: `speech.voice_max_bytes` plus
the multipart overhead). Past it the client gets 413 `request_too_large` in the OpenAI error
shape: at once when `Content-Length` says so, else as soon as the streamed body passes the
bound (at most bound + one chunk is ever held).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from session_server.errors import openai_error_body

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


class _BodyTooLarge(Exception):
    pass


class RequestSizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: dict[str, int]):
        self.app = app
        self.max_bytes = max_bytes
        # Filled by feature packages as they install their routes (path -> bound); read per request.
        self.path_limits = path_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if not started:
                await _refuse(send, limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps(
        openai_error_body(f"The request body is larger than {limit} bytes.", "invalid_request_error", None, "request_too_large")
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
