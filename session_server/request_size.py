"""The request-body bound, at the ASGI layer: a body is refused before it is read, not after.

Every HTTP request's body may be at most `limits.max_request_bytes` (default 4 MiB: a full
speech batch, 32 items of 4,096 characters each with instructions, fits even \\u-escaped), or
the bound a route registers for its own path (a voice upload: `speech.voice_max_bytes` plus
the multipart overhead). Past it the client gets 413 `request_too_large` in the OpenAI error
shape: at once when `Content-Length` says so, else as soon as the streamed body passes the
bound (at most bound + one chunk is ever held).

The refusal reaches a client that is still sending: before answering, the server reads and
discards the rest of the body (a lingering close, as nginx's `lingering_close`), at most
`drain_bytes` (128 MiB), for at most `drain_seconds` (30 s) and while the next bytes come within
`drain_idle_s` (2 s: nginx's `lingering_timeout`, so a client that stops sending mid-body gets
its answer then), nothing of it kept. Answering and
closing with the client's bytes unread would make the kernel reset the connection, and the client
would see a reset instead of its 413. A body declared larger than `drain_bytes`, or one still
coming past either bound, is answered at once and the connection closed: such a client may see a
reset, the price of not reading without end. Cost: reading what the client sends, up to the bound.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from session_server.errors import openai_error_body

DRAIN_BYTES = 128 * 1024 * 1024
DRAIN_SECONDS = 30.0
DRAIN_IDLE_S = 2.0


class _BodyTooLarge(Exception):
    pass


class RequestSizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: dict[str, int],
                 drain_bytes: int = DRAIN_BYTES, drain_seconds: float = DRAIN_SECONDS, drain_idle_s: float = DRAIN_IDLE_S):
        self.app = app
        self.max_bytes = max_bytes
        self.drain_bytes = drain_bytes
        self.drain_seconds = drain_seconds
        self.drain_idle_s = drain_idle_s
        # Filled by feature packages as they install their routes (path -> bound); read per request.
        self.path_limits = path_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            if declared <= self.drain_bytes:
                await self._drain(receive, 0)
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
                await self._drain(receive, received)
                await _refuse(send, limit)

    async def _drain(self, receive: Receive, received: int) -> None:
        """Read and discard the rest of the body, within the drain bounds (see the module's doc)."""
        try:
            async with asyncio.timeout(self.drain_seconds):
                while received <= self.drain_bytes:
                    message = await asyncio.wait_for(receive(), self.drain_idle_s)
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return
                    received += len(message.get("body", b""))
        except TimeoutError:
            pass


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
