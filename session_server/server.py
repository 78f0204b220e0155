"""Running the app under uvicorn, with a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting sessions (new ones get 503 /
`server_shutting_down`), gives in-flight replies the profile's grace period to finish, closes
the remaining sessions with reason `server_shutdown`, then exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

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


async def run_server(
    state: ServerState,
    create_app: Callable[..., FastAPI],
    host: str,
    port: int,
    log_level: str = "info",
) -> int:
    server: DrainingServer | None = None

    def fail_startup() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(state, on_startup_failure=fail_startup)
    server = DrainingServer(uvicorn_config(app, host, port, log_level), state)
    await server.serve()
    return 1 if state.startup_error else 0


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    # No permessage-deflate: realtime traffic is base64 audio, which barely compresses, and
    # (de)compressing every 20 ms chunk cost ~15% of the event loop at 16 sessions (py-spy).
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on",
        ws="websockets-sansio", ws_max_size=WS_MAX_MESSAGE_BYTES, ws_per_message_deflate=False,
    )


def run_blocking(coroutine) -> int:
    """Run on uvloop where available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)
