"""Whether this server can take WebRTC calls: aiortc and PyAV are optional.

A machine that can carry only a few MiB of wheels (the GPU machines of docs/benchmarks.md,
"GPU probe and device kit": PyAV alone is 34 MiB) runs the server without them. Then
`POST /v1/realtime/calls` and its hangup answer 501 with code `webrtc_unavailable`, naming what
is missing, and speech serves wav, pcm and flac only (session_server/speech/encode.py);
WebSocket sessions, client secrets and the browser page are unchanged.
"""

from __future__ import annotations

import functools
import importlib

from fastapi.responses import JSONResponse

from session_server.errors import openai_error_response

WEBRTC_UNAVAILABLE = "webrtc_unavailable"
WEBRTC_MODULES = ("aiortc", "av")


@functools.cache
def missing_modules() -> tuple[str, ...]:
    """The WebRTC modules that do not import here (an installed aiortc without PyAV counts as missing)."""
    missing = []
    for name in WEBRTC_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return tuple(missing)


def unavailable_response(missing: tuple[str, ...]) -> JSONResponse:
    return openai_error_response(
        501,
        f"WebRTC calls are not available on this server: {', '.join(missing)} not installed "
        "(pip install aiortc av). Realtime sessions over the WebSocket (/v1/realtime) work.",
        type="server_error", code=WEBRTC_UNAVAILABLE,
    )
