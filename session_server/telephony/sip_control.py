"""OpenAI's SIP control plane: the `realtime.call.incoming` webhook and the call routes.

    webhook   POST {sip.webhook_url}  {object: "event", id, type: "realtime.call.incoming", created_at,
                                       data: {call_id, sip_headers: [{name, value}], sip_media_security: "rtp"}}
              signed per Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`
              (`v1,` + base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`, keyed with `sip.webhook_secret`:
              the base64 after `whsec_`, else its bytes), so `client.webhooks.unwrap(body, headers,
              secret=...)` of the `openai` SDK verifies it
    POST /v1/realtime/calls/{call_id}/accept  a GA session object ({type: "realtime", instructions, audio, tools...})
    POST /v1/realtime/calls/{call_id}/reject  {status_code} (default 603 Decline)
    POST /v1/realtime/calls/{call_id}/refer   {target_uri} (a sip: or tel: URI): SIP REFER, the call ends once transferred
    POST /v1/realtime/calls/{call_id}/hangup  BYE (a WebRTC call's id: as before, webrtc/routes.py)

each -> 200 with an empty body, or an OpenAI-shaped error: 404 `call_not_found`, 409
`call_already_accepted`, 400 for a body or session config refused (its code), 429/503 when no
session can be opened (the caller then gets 486/503). `POST /v1/realtime/calls` itself stays
WebRTC's offer route.

Secrets: the headers sent are the INVITE's, less `Authorization` and `Proxy-Authorization`; they
are what the caller (or the trunk) wrote, untrusted, as OpenAI says of its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from session_server import strict_json
from session_server.errors import openai_error_response
from session_server.request_body import declared_body
from session_server.telephony.sip import WEBHOOK_TIMEOUT_S, CallRefusal, SipEndpoint

log = logging.getLogger("session_server.telephony")

MAX_BODY_BYTES = 256 * 1024
# The bodies, for the OpenAPI schema (the routes read and check them themselves).
ACCEPT_BODY = {"type": "object", "description": "a GA realtime session config (as in `session.update`), `type` \"realtime\"",
               "properties": {"type": {"type": "string", "enum": ["realtime"]}, "model": {"type": "string"},
                              "instructions": {"type": "string"}}}
REJECT_BODY = {"type": "object", "properties": {"status_code": {"type": "integer", "minimum": 400, "maximum": 699}}}
REFER_BODY = {"type": "object", "required": ["target_uri"],
              "properties": {"target_uri": {"type": "string", "pattern": "^(sip|sips|tel):[^\\r\\n<>]+$"}}}
_PRIVATE_HEADERS = frozenset({"authorization", "proxy-authorization"})


def signature(secret: str, webhook_id: str, timestamp: str, body: str) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class Webhooks:
    """Sends `realtime.call.incoming` for each ringing call."""

    def __init__(self, url: str, secret: str):
        self.url = url
        self.secret = secret
        self.client = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S)

    def event(self, call_id: str, headers: list[tuple[str, str]]) -> tuple[str, dict[str, str]]:
        """The body and headers of the webhook for `call_id` (signed now)."""
        body = json.dumps({
            "object": "event", "id": f"evt_{secrets.token_hex(12)}", "type": "realtime.call.incoming",
            "created_at": int(time.time()),
            "data": {"call_id": call_id, "sip_media_security": "rtp",
                     "sip_headers": [{"name": name, "value": value} for name, value in headers if name.lower() not in _PRIVATE_HEADERS]},
        }, separators=(",", ":"))
        webhook_id, timestamp = f"wh_{secrets.token_hex(12)}", str(int(time.time()))
        return body, {"content-type": "application/json", "webhook-id": webhook_id, "webhook-timestamp": timestamp,
                      "webhook-signature": signature(self.secret, webhook_id, timestamp, body)}

    async def call_incoming(self, call_id: str, headers: list[tuple[str, str]]) -> bool:
        """True when the webhook was delivered (a 2xx); else said once in the log."""
        body, signed = self.event(call_id, headers)
        try:
            answer = await self.client.post(self.url, content=body.encode(), headers=signed)
        except httpx.HTTPError as error:
            log.info("sip: call %s: webhook to %s failed: %s", call_id, self.url, error or type(error).__name__)
            return False
        if not answer.is_success:
            log.info("sip: call %s: webhook to %s answered %d", call_id, self.url, answer.status_code)
            return False
        return True

    async def close(self) -> None:
        await self.client.aclose()


def add_routes(app: FastAPI, endpoint: Any) -> None:
    """The call routes; `endpoint()` is the live SipEndpoint, or None while SIP is off."""

    def refused(refusal: CallRefusal) -> Response:
        return openai_error_response(refusal.status, refusal.message, param=refusal.param, code=refusal.code)

    def live(call_id: str) -> SipEndpoint:
        sip = endpoint()
        if sip is None:
            raise CallRefusal(404, "call_not_found", f"No SIP call {call_id!r} (the SIP endpoint is off).", "call_id")
        return sip

    @app.post("/v1/realtime/calls/{call_id}/accept", openapi_extra=declared_body({"application/json": ACCEPT_BODY}, required=False))
    async def accept(call_id: str, request: Request) -> Response:
        try:
            body = await _json_body(request)
            if body.get("type", "realtime") != "realtime":
                raise CallRefusal(400, "invalid_value", "`type` must be \"realtime\".", "type")
            model = body.get("model")
            if model is not None and not app.state.server.settings.serves(model):
                raise CallRefusal(400, "model_not_found", app.state.server.settings.not_served(model), "model")
            await live(call_id).accept(call_id, body)
        except CallRefusal as refusal:
            return refused(refusal)
        return Response(status_code=200)

    @app.post("/v1/realtime/calls/{call_id}/reject", openapi_extra=declared_body({"application/json": REJECT_BODY}, required=False))
    async def reject(call_id: str, request: Request) -> Response:
        try:
            body = await _json_body(request)
            status = body.get("status_code", 603)
            if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 699:
                raise CallRefusal(400, "invalid_value", "`status_code` must be a SIP final status from 400 to 699.", "status_code")
            live(call_id).reject(call_id, status)
        except CallRefusal as refusal:
            return refused(refusal)
        return Response(status_code=200)

    @app.post("/v1/realtime/calls/{call_id}/refer", openapi_extra=declared_body({"application/json": REFER_BODY}))
    async def refer(call_id: str, request: Request) -> Response:
        try:
            body = await _json_body(request)
            target = body.get("target_uri")
            if not isinstance(target, str) or not target.startswith(("sip:", "sips:", "tel:")) or any(c in target for c in "\r\n<>"):
                raise CallRefusal(400, "invalid_value", "`target_uri` must be a sip:, sips: or tel: URI.", "target_uri")
            live(call_id).refer(call_id, target)
        except CallRefusal as refusal:
            return refused(refusal)
        return Response(status_code=200)

    async def hang_up(call_id: str) -> Response | None:
        """WebRTC's hangup route asks here first: a SIP call's id is ended here."""
        sip = endpoint()
        if sip is None or not await sip.hangup(call_id):
            return None
        return Response(status_code=200)

    app.state.hang_up_elsewhere = hang_up


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    if len(raw) > MAX_BODY_BYTES:
        raise CallRefusal(413, "request_too_large", f"The body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        body = strict_json.loads(raw)
    except (ValueError, RecursionError):
        raise CallRefusal(400, "invalid_json", "The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise CallRefusal(400, "invalid_type", "The body must be a JSON object.")
    return body
