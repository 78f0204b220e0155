"""HTTP signalling: `POST /v1/realtime/calls` (offer -> answer), hangup, client secrets.

    POST /v1/realtime/calls            body: the SDP offer (application/sdp), or multipart/form-data
                                       with `sdp` and an optional `session` (JSON session config)
        -> 201, body: the SDP answer (application/sdp), Location: /v1/realtime/calls/{call_id}
    POST /v1/realtime/calls/{id}/hangup  -> 200 (ends the call)
    POST /v1/realtime/client_secrets   {expires_after: {anchor, seconds}, session} -> {value: "ek_...", expires_at, session}

Errors use the OpenAI shape. Order of checks, cheapest first, so that a refused call never
allocates a peer connection: content type, SDP text (version line, an audio m-line), session
config, then admission (the graph session), then the peer connection itself; a failure at any
step releases what the earlier steps took. Without aiortc and PyAV (optional: availability.py)
the call and hangup routes answer 501 `webrtc_unavailable`; client secrets still work.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from graph.errors import SessionRejected
from session_server import strict_json
from session_server.auth import bearer_key
from session_server.errors import openai_error_response
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import (
    RealtimeProtocol,
    realtime_unavailable,
    reply_input_for,
)
from session_server.realtime.served import served_model
from session_server.realtime.voice_lookups import look_up_voices
from session_server.request_body import declared_body
from session_server.state import ServerState
from session_server.webrtc.client_secrets import (
    MAX_SECONDS,
    MIN_SECONDS,
    PREFIX,
    ClientSecretError,
    ClientSecrets,
    parse_request,
)
from session_server.webrtc.config import WebRTCConfig
from session_server.webrtc.availability import missing_modules, unavailable_response
from session_server.webrtc.registry import CallRegistry

if not missing_modules():  # aiortc and PyAV are optional: without them the call routes answer 501
    from session_server.webrtc.call import Call, OfferError, new_call_id

log = logging.getLogger("session_server.webrtc")

MAX_OFFER_BYTES = 64 * 1024

# The request bodies, for the OpenAPI schema (the routes read and check them themselves).
_SDP = {"type": "string", "maxLength": MAX_OFFER_BYTES, "description": "the SDP offer, starting with `v=0`, with an audio m-line"}
OFFER_BODIES = {
    "application/sdp": _SDP,
    "multipart/form-data": {
        "type": "object",
        "required": ["sdp"],
        "properties": {"sdp": _SDP, "session": {"type": "string", "description": "a JSON session config, as in `session.update`"}},
    },
}
CLIENT_SECRET_REQUEST_SCHEMA = {
    "type": ["object", "null"],  # null, like no body: the defaults
    "properties": {
        "expires_after": {
            "type": ["object", "null"],
            "properties": {
                "anchor": {"type": "string", "enum": ["created_at"]},
                "seconds": {"type": "integer", "minimum": MIN_SECONDS, "maximum": MAX_SECONDS},
            },
        },
        "session": {"type": ["object", "null"], "description": "a realtime session config, as in `session.update`"},
    },
}


class CallRefused(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type

    def response(self) -> JSONResponse:
        return openai_error_response(self.status, self.message, self.type, self.param, self.code)


def add_routes(app: FastAPI, state: ServerState, config: WebRTCConfig, calls: CallRegistry, client_secrets: ClientSecrets) -> None:
    missing = missing_modules()

    @app.post("/v1/realtime/calls", openapi_extra=declared_body(OFFER_BODIES))
    async def create_call(request: Request) -> Response:
        if missing:
            return unavailable_response(missing)
        try:
            _check_realtime_input(state)
            offer, session = await _read_offer(request)
            key = bearer_key(request.headers.raw)
            minted = client_secrets.session_of(key) or {}
            requested = request.query_params.get("model") or session.get("model") or minted.get("model")
            _check_model(state, requested)
            call_id, session_id = new_call_id()
            # audio_deltas=False: reply audio comes out as SendAudio for the media track, not as base64 events
            protocol = RealtimeProtocol(session_id, state.settings.echoed_model(requested), audio_deltas=False,
                                        reply_input=reply_input_for(state.runtime.spec.inputs), served=served_model(state),
                                        usage_totals=state.metrics.usage)
            # The key's config first, then what came with the offer, each as a session.update patch.
            await _initial_config(protocol, minted)
            await _initial_config(protocol, session)
            spent = _spend(client_secrets, key, state)
            try:
                answer = await _start_call(state, config, calls, call_id, protocol, offer)
            except BaseException:
                if spent:
                    client_secrets.release(key)  # the call never started: the key stays good
                raise
        except CallRefused as refused:
            return refused.response()
        return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": f"/v1/realtime/calls/{call_id}"})

    @app.post("/v1/realtime/calls/{call_id}/hangup")
    async def hangup(call_id: str) -> Response:
        elsewhere = getattr(app.state, "hang_up_elsewhere", None)  # a phone call's id (telephony/sip_control.py)
        if elsewhere is not None and (answer := await elsewhere(call_id)) is not None:
            return answer
        if missing:
            return unavailable_response(missing)
        call = calls.get(call_id)
        if call is None:
            return openai_error_response(404, f"No call {call_id!r}.", code="call_not_found", param="call_id")
        await call.close("hangup")
        return JSONResponse({})

    @app.post("/v1/realtime/client_secrets", openapi_extra=declared_body({"application/json": CLIENT_SECRET_REQUEST_SCHEMA}, required=False))
    async def create_client_secret(request: Request) -> Response:
        if (bearer_key(request.headers.raw) or "").startswith("ek_"):
            return openai_error_response(403, "An ephemeral key cannot mint client secrets.", code="invalid_api_key")
        try:
            raw = await request.body()
            body = strict_json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            return openai_error_response(400, "The request body is not valid JSON.", code="invalid_json")
        try:
            seconds, session = parse_request(body)
            _check_model(state, session.get("model"))
            protocol = RealtimeProtocol("sess_client_secret", state.settings.echoed_model(session.get("model")), served=served_model(state))
            await _initial_config(protocol, session)
            secret = client_secrets.mint(seconds, session)
        except ClientSecretError as exc:
            return openai_error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except CallRefused as refused:
            return refused.response()
        wire = protocol.config.to_wire("sess_client_secret")
        wire.pop("id", None)
        return JSONResponse({"value": secret.value, "expires_at": int(secret.expires_at), "session": wire})


async def _read_offer(request: Request) -> tuple[str, dict[str, Any]]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    session: Any = {}
    if content_type == "multipart/form-data":
        try:
            form = await request.form(max_files=2, max_fields=2)
        except Exception as exc:  # noqa: BLE001 - any malformed form is the client's error
            raise CallRefused(400, f"Malformed multipart form: {getattr(exc, 'detail', exc)}", "invalid_form") from None
        sdp = form.get("sdp")
        raw_session = form.get("session")
        if isinstance(sdp, UploadFile):
            sdp = (await sdp.read()).decode("utf-8", "replace")
        if isinstance(raw_session, UploadFile):
            raw_session = (await raw_session.read()).decode("utf-8", "replace")
        if raw_session:
            try:
                session = strict_json.loads(raw_session)
            except (ValueError, RecursionError):
                raise CallRefused(400, "The `session` part is not valid JSON.", "invalid_json", "session") from None
            if not isinstance(session, dict):
                raise CallRefused(400, "The `session` part must be a JSON object.", "invalid_type", "session")
    elif content_type in ("application/sdp", "text/plain", ""):
        body = await request.body()
        if len(body) > MAX_OFFER_BYTES:
            raise CallRefused(413, f"The SDP offer is larger than {MAX_OFFER_BYTES} bytes.", "invalid_offer", "sdp")
        sdp = body.decode("utf-8", "replace")
    else:
        raise CallRefused(
            415,
            f"Send the SDP offer as application/sdp, or multipart/form-data with `sdp` and `session`; got {content_type!r}.",
            "unsupported_content_type",
        )
    check_sdp_text(sdp, "sdp")
    return sdp, session


def check_sdp_text(sdp: Any, param: str) -> None:
    """The cheap checks of an offer's text, before anything is allocated for it."""
    if not isinstance(sdp, str) or not sdp.strip():
        raise CallRefused(400, "The request carries no SDP offer.", "missing_required_parameter", param)
    if len(sdp) > MAX_OFFER_BYTES:
        raise CallRefused(413, f"The SDP offer is larger than {MAX_OFFER_BYTES} bytes.", "invalid_offer", param)
    lines = [line.strip() for line in sdp.strip().splitlines()]
    if lines[0] != "v=0":
        raise CallRefused(400, "The body is not an SDP offer (it must start with `v=0`).", "invalid_offer", param)
    if not any(line.startswith("m=audio ") for line in lines):
        raise CallRefused(400, "The SDP offer has no audio m-line; a realtime call needs one audio track.", "missing_audio", param)


def _check_model(state: ServerState, requested: Any) -> None:
    if requested and not state.settings.serves(requested):
        raise CallRefused(
            400,
            state.settings.not_served(requested),
            "model_not_found",
            "model",
        )


def _check_realtime_input(state: ServerState) -> None:
    """A profile without the realtime input (e.g. the speech-only one) serves no calls."""
    if (why := realtime_unavailable(state.runtime.spec.inputs)) is not None:
        raise CallRefused(501, why, "realtime_unavailable", type="server_error")


def _spend(client_secrets: ClientSecrets, key: str | None, state: ServerState) -> bool:
    """Spend an ephemeral key on the call it is about to open (True: spent here)."""
    if not key or not key.startswith(PREFIX):
        return False
    if client_secrets.redeem(key):
        return True
    if state.settings.api_key is not None:  # used meanwhile by a concurrent request
        raise CallRefused(401, "This ephemeral key was already used or has expired.", "invalid_api_key")
    return False


async def _initial_config(protocol: RealtimeProtocol, session: dict[str, Any]) -> None:
    """Apply a `session` config given with the offer (or minted into the key) before the session opens."""
    try:
        await look_up_voices(protocol, {"type": "session.update", "session": session})
        protocol.configure_initial(session)
    except RealtimeError as error:
        raise CallRefused(400, error.message, error.code, error.param) from None
    except RecursionError:
        raise CallRefused(400, "The session config is nested too deeply.", "invalid_json", "session") from None


async def _start_call(state: ServerState, config: WebRTCConfig, calls: CallRegistry, call_id: str, protocol: RealtimeProtocol, offer: str,
                      call_type: Any = None, on_closed: Any = None, begin: Any = None) -> str:
    """Open the graph session, answer the offer and start the call. `call_type` (Call), `on_closed`
    (more to do when it ends) and `begin(call)` (run once it started, before any client event:
    a Live call's start, live_calls.py) are for the Live adapter."""
    try:
        graph = await state.runtime.open_session(protocol.session_id, "realtime", protocol.graph_config())
    except SessionRejected as rejected:
        status = 429 if rejected.code == "session_limit_reached" else 503
        raise CallRefused(status, rejected.message, rejected.code, type="invalid_request_error" if status == 429 else "server_error") from None
    def closed(call: Call) -> None:
        calls.forget(call)
        state.sessions.forget(call)
        if call.trace is not None:
            call.trace.close()
        if on_closed is not None:
            on_closed(call)

    call = (call_type or Call)(call_id, protocol, config, on_closed=closed, metrics=state.metrics)
    calls.add(call)
    try:
        answer = await call.answer(offer)
    except OfferError as error:
        await graph.close("invalid_offer")
        await call.close("invalid_offer")
        raise CallRefused(400, error.message, error.code, "sdp") from None
    except BaseException:
        await graph.close("internal_error")
        await call.close("internal_error")
        raise
    # Listed with the live sessions (admin API) and traced, before its first event.
    state.sessions.add(call, "realtime", "webrtc", call_id=call_id)
    if state.tracing is not None:
        call.trace = state.tracing.session(protocol.session_id, "webrtc", protocol.usage)
    call.start(graph)
    if begin is not None:
        begin(call)
    log.info("call %s: session %s answered", call_id, protocol.session_id)
    return answer
