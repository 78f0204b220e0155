"""The ASGI app: operations routes here, feature routes installed by their packages.

The port opens before the model is loaded: `/health` answers 503 while the graph loads and
warms up, then 200. The profile itself was validated before the port opened (see cli.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from graph import heap
from session_server.auth import ApiKeyMiddleware
from session_server.http_errors import install_error_handlers
from session_server.request_size import RequestSizeLimit
from session_server.state import ServerState

log = logging.getLogger("session_server")


def create_app(state: ServerState, on_startup_failure: Callable[[], None] | None = None,
               on_ready: Callable[[], None] | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(_load(state, on_startup_failure, on_ready))
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await state.runtime.stop(0 if not state.runtime.ready else None)
            if state.tracing is not None:
                # The last turns' spans are exported; off the loop (a slow collector waits out its timeout).
                await asyncio.to_thread(state.tracing.shutdown)

    app = FastAPI(title="sgl-omni session server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)
    state.metrics.watch(lambda: state.runtime, state.free_session_slots, state.parked_sessions)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.startup_error:
            return JSONResponse({"status": "failed", "error": state.startup_error}, status_code=503)
        if state.shutting_down:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        if not state.runtime.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "model": state.settings.model_id})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness (load balancers, Kubernetes): 503 while loading, draining, or without a free session slot."""
        if not state.ready:
            return JSONResponse({"status": "shutting_down" if state.shutting_down else "loading"}, status_code=503)
        free = state.free_session_slots()
        if free <= 0:
            return JSONResponse({"status": "full", "free_session_slots": 0}, status_code=503)
        return JSONResponse({"status": "ready", "free_session_slots": free})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        """Every name the server answers to, its own first (model_names.py); `root`: the model behind them."""
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": name, "object": "model", "created": int(_STARTED), "owned_by": "sgl-omni",
                          "root": state.settings.model_root} for name in state.settings.model_names],
            }
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    _install_features(app, state)
    # Operators: the admin API exists only behind its own key (auth.py checks it).
    if state.settings.admin_key is not None:
        from session_server import admin

        admin.install(app, state)
    app.add_middleware(RequestSizeLimit, max_bytes=state.runtime.spec.limits.max_request_bytes, path_limits=state.request_size_limits)
    app.add_middleware(ApiKeyMiddleware, state=state)
    return app


_STARTED = time.time()


def _install_features(app: FastAPI, state: ServerState) -> None:
    from session_server import realtime, speech, webrtc

    speech.install(app, state)
    webrtc.install(app, state)  # the browser page always; calls only with --enable-realtime
    if state.settings.enable_realtime:
        realtime.install(app, state)
        # Phone calls (carrier media streams): after webrtc, whose sideband hook it extends.
        from session_server import telephony

        telephony.install(app, state)
    else:
        from session_server.realtime.disabled import install_disabled

        install_disabled(app)  # 403 `realtime_disabled`, naming --enable-realtime


async def _load(state: ServerState, on_failure: Callable[[], None] | None, on_ready: Callable[[], None] | None = None) -> None:
    started = time.perf_counter()
    try:
        await state.runtime.start()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported once, clearly, then the server exits
        state.startup_error = f"{type(exc).__name__}: {exc}"
        log.error("startup failed: %s", state.startup_error)
        if on_failure is not None:
            on_failure()
        return
    heap.settle()  # what startup loaded (here, or in the engines: each settles its own) is never walked again
    log.info("ready in %.2fs: model %s", time.perf_counter() - started, state.settings.model_id)
    if on_ready is not None:
        on_ready()
