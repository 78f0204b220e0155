"""Phone calls as realtime sessions: carrier media streams today (SIP is not served yet).

`install(app, state)` (with `--enable-realtime`) adds:
- `/v1/telephony/twilio`: a WebSocket speaking Twilio Media Streams' JSON protocol (twilio.py);
- sidebands: `GET /v1/realtime?call_id=twilio_...` attaches to a live phone call as to a WebRTC
  call (webrtc/sideband.py, unchanged: a `PhoneCall` offers the same attach/detach/receive);
- a shutdown step that ends every phone call before the runtime stops.

Every call runs on the realtime protocol core through `phone_call.PhoneCall` (the link the
phone wires share); the profile's `sip:` section (config.py) gives their session settings.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI, WebSocket

from session_server.state import ServerState
from session_server.telephony.registry import PhoneCalls


def install(app: FastAPI, state: ServerState) -> None:
    from session_server.telephony.twilio import PATH, serve_twilio
    from session_server.webrtc.sideband import serve_sideband

    calls = PhoneCalls()
    app.state.phone_calls = calls

    @app.websocket(PATH)
    async def twilio_stream(websocket: WebSocket) -> None:
        await serve_twilio(websocket, state, calls)

    # `GET /v1/realtime?call_id=`: a phone call's id here, anything else as before (WebRTC).
    attach_elsewhere = getattr(app.state, "attach_to_call", None)

    async def attach_to_call(websocket: WebSocket, call_id: str) -> None:
        if calls.get(call_id) is not None or attach_elsewhere is None:
            await serve_sideband(websocket, state, calls, call_id)  # type: ignore[arg-type]  # same interface as a WebRTC Call
        else:
            await attach_elsewhere(websocket, call_id)

    app.state.attach_to_call = attach_to_call

    serve_app = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: FastAPI):
        async with serve_app(app_) as value:
            try:
                yield value
            finally:
                await calls.close_all("server_shutdown")

    app.router.lifespan_context = lifespan
