"""Running the app under uvicorn, with a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting sessions (new ones get 503 /
`server_shutting_down`), gives in-flight replies the profile's grace period to finish, closes
the remaining sessions with reason `server_shutdown`, then exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from session_server.log_redaction import redact_access_log
from session_server.state import ServerState

log = logging.getLogger("session_server")

# Largest WebSocket message uvicorn accepts. Above the realtime append limit (15 MiB of base64)
# so an oversized append gets a protocol `error` event; past this, the socket closes with 1009.
WS_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self._state = state
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame) -> None:  # called from the signal handler
        if self._draining is not None:
            super().handle_exit(sig, frame)  # second signal: exit now
            return
        loop = asyncio.get_event_loop()
        self._draining = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        log.info("shutdown requested: draining sessions")
        try:
            await self._state.runtime.drain()
        finally:
            self.should_exit = True


class PortUnavailable(OSError):
    """The address cannot be listened on; the message says which and what to do."""


def bound_socket(host: str, port: int) -> socket.socket:
    """Bind (host, port) now, before anything loads, so that a port in use is reported at once
    (uvicorn binds only after the app's startup has begun loading the model). Not listening yet:
    connections are refused until uvicorn serves it (asyncio's create_server calls listen)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise PortUnavailable(f"--host {host}: cannot resolve this address ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart despite TIME_WAIT
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(
                f"port {port} on {host} is already in use (another server?): stop it, or choose another port with --port"
            ) from None
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror} (choose another with --host / --port)") from None
    sock.setblocking(False)
    return sock


def ready_message(host: str, port: int, realtime: bool) -> str:
    """The line that says the server is ready, with the URLs to open."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    if not realtime:
        return f"ready: speech API at {base}/v1/audio/speech (realtime sessions are off: add --enable-realtime)"
    return f"ready: open {base}/ (playground) | realtime ws://{shown}:{port}/v1/realtime, WebRTC {base}/v1/realtime/calls | speech {base}/v1/audio/speech"


async def run_server(
    state: ServerState,
    create_app: Callable[..., FastAPI],
    host: str,
    port: int,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> int:
    """Serve until shutdown. `sock`: already bound (`bound_socket`), else uvicorn binds."""
    server: DrainingServer | None = None

    def fail_startup() -> None:
        if server is not None:
            server.should_exit = True

    def announce_ready() -> None:
        log.info(ready_message(host, port, state.settings.enable_realtime))

    app = create_app(state, on_startup_failure=fail_startup, on_ready=announce_ready)
    server = DrainingServer(uvicorn_config(app, host, port, log_level), state)
    await server.serve(sockets=[sock] if sock is not None else None)
    return 1 if state.startup_error else 0


class BadTextFrameInOneLine(logging.Filter):
    """A client's WebSocket text frame that is not UTF-8: uvicorn closes the socket with 1007, as
    RFC 6455 says, and logs `Invalid UTF-8 sequence received from client.` with a traceback at
    ERROR. That is the client's fault, one per bad frame, and no server failure: one WARNING line
    saying what was refused and where the bad byte is."""

    MESSAGE = "Invalid UTF-8 sequence received from client."

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.MESSAGE and record.exc_info:
            error = record.exc_info[1]
            where = f" ({error.reason} at byte {error.start})" if isinstance(error, UnicodeDecodeError) else ""
            record.msg, record.args = "WebSocket text frame that is not UTF-8%s: closed with 1007", (where,)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


BAD_TEXT_FRAME_FILTER = BadTextFrameInOneLine()


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    # No permessage-deflate: realtime traffic is base64 audio, which barely compresses, and
    # (de)compressing every 20 ms chunk cost ~15% of the event loop at 16 sessions (py-spy).
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on",
        ws="websockets-sansio", ws_max_size=WS_MAX_MESSAGE_BYTES, ws_per_message_deflate=False,
    )
    redact_access_log()  # after Config, which (re)configures uvicorn's loggers
    logging.getLogger("uvicorn.error").addFilter(BAD_TEXT_FRAME_FILTER)
    return config


def run_blocking(coroutine) -> int:
    """Run on uvloop where available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)
