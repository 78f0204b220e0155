"""Phone calls as realtime sessions: SIP calls and carrier media streams.

`install(app, state)` (with `--enable-realtime`) adds:
- `/v1/telephony/twilio`: a WebSocket speaking Twilio Media Streams' JSON protocol (twilio.py);
- with `sip.listen` (`serve --sip udp:HOST:PORT`): the SIP endpoint (sip.py), started with the
  app and stopped after its calls, and OpenAI's SIP control plane (sip_control.py:
  `POST /v1/realtime/calls/{call_id}/accept | reject | refer | hangup`, the webhook);
- sidebands: `GET /v1/realtime?call_id=twilio_... | sip_...` attaches to a live phone call as to
  a WebRTC call (webrtc/sideband.py, unchanged: a `PhoneCall` offers the same attach/detach/receive);
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
    from session_server.telephony.config import TelephonyConfig
    from session_server.telephony.sip_control import add_routes
    from session_server.telephony.twilio import PATH, serve_twilio
    from session_server.webrtc.sideband import serve_sideband

    calls = PhoneCalls()
    app.state.phone_calls = calls
    app.state.sip = None  # the SipEndpoint while it runs
    config = TelephonyConfig.from_profile(state.settings.profile)
    add_routes(app, lambda: app.state.sip)

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
            sip = webhooks = None
            try:
                if config.listen is not None:
                    from session_server.telephony.sip import SipEndpoint
                    from session_server.telephony.sip_control import Webhooks

                    if config.webhook_url is not None and config.webhook_secret is not None:
                        webhooks = Webhooks(config.webhook_url, config.webhook_secret)
                    sip = SipEndpoint(state, calls, config, webhooks)
                    await sip.start()
                    app.state.sip = sip
                yield value
            finally:
                app.state.sip = None
                await calls.close_all("server_shutdown")
                if sip is not None:
                    await sip.stop()
                if webhooks is not None:
                    await webhooks.close()

    app.router.lifespan_context = lifespan
