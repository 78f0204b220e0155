"""`GET /v1/realtime`: the WebSocket adapter over the sans-I/O protocol core.

All protocol rules live in `protocol.py`; one connection's plumbing (its queues, tasks and
bounds) is `websocket_link.py`, shared with the Live WebSocket and resumes. This module is the
route: who may open a session and how.

Auth runs before the handshake (session_server/auth.py: Bearer header, or the subprotocol
`openai-insecure-api-key.KEY` offered next to `realtime`, which browsers must use); the server
answers with the `realtime` subprotocol when offered. The `OpenAI-Beta: realtime=v1` header or
the `openai-beta.realtime-v1` subprotocol chooses the beta dialect (realtime/dialect.py): events
are renamed as they are serialized.

`GET /v1/realtime?session_id=ID&resume_token=T` resumes a session whose socket dropped
(resume.py): a socket lost without a close frame of 1000/1001 detaches its session
(`WebSocketLink.detach`) instead of ending it, and the handshake names the session
(`x-sglang-session-id`) for the proxy.

`GET /v1/realtime?call_id=rtc_...` is not a session of its own: it attaches the socket to a live
WebRTC call (the sideband, `session_server/webrtc/sideband.py`).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from starlette.websockets import WebSocket

from graph.errors import SessionRejected
from session_server.auth import request_key, subprotocols
from session_server.realtime.compat import initial_config
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import CLOSE_POLICY, RealtimeProtocol, realtime_unavailable
from session_server.realtime.resume import serve_resume
from session_server.realtime.served import served_model
from session_server.realtime.session_config import SessionConfig
from session_server.realtime.sglang_session import capabilities
from session_server.realtime.voice_lookups import look_up_voices
from session_server.realtime.websocket_link import (
    RealtimeSettings,
    end_link,
    new_link,
    register,
    session_headers,
    start_tasks,
    until_closed,
)
from session_server.state import ServerState


async def serve(websocket: WebSocket, state: ServerState) -> None:
    call_id = websocket.query_params.get("call_id")
    attach_to_call = getattr(websocket.app.state, "attach_to_call", None)
    if call_id is not None and attach_to_call is not None:
        await attach_to_call(websocket, call_id)  # a sideband of a WebRTC call, not a session of its own
        return
    settings = RealtimeSettings.from_profile(state.settings.profile)
    offered = subprotocols(websocket.scope.get("headers", []))
    resumer = state.resumer
    if resumer is not None and ("session_id" in websocket.query_params or "resume_token" in websocket.query_params):
        await serve_resume(websocket, state, settings, offered)
        return
    session_id = f"sess_{secrets.token_hex(12)}"
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None, headers=session_headers(session_id))
    link = new_link(websocket, state, settings, offered, session_id)
    writer = asyncio.create_task(link.writer(), name=f"{session_id}:writer")
    tasks: list[asyncio.Task[None]] = []
    try:
        refusal = await _refusal(websocket, state, link.protocol)
        if refusal is not None:
            link.apply(link.protocol.reject(*refusal, CLOSE_POLICY))
        else:
            try:
                if resumer is not None:
                    await resumer.make_room()
                link.graph = await state.runtime.open_session(session_id, "realtime", link.protocol.graph_config())
            except SessionRejected as rejected:
                _unspend_key(websocket)  # no session: the ephemeral key stays good
                link.apply(link.protocol.reject(rejected.code, rejected.message))
        if link.graph is not None:
            if resumer is not None:
                resumer.track(link)
            register(link, state)
            link.apply(link.protocol.open())
            tasks = start_tasks(link)
            await until_closed(link, tasks)
    finally:
        await end_link(link, writer, tasks, state)


def server_capabilities(state: ServerState) -> dict[str, Any]:
    """`GET /v1/realtime/capabilities` (sglang_session.py): a new WebSocket session's grant, and
    the bounds a client meets (each named for this server's own limit)."""
    settings = RealtimeSettings.from_profile(state.settings.profile)
    served = served_model(state)
    config = initial_config(settings.compat, SessionConfig(model=state.settings.model_id, served=served))
    limits = state.runtime.spec.limits
    bounds = {
        "max_append_bytes": settings.max_append_chars * 3 // 4,
        "max_output_bytes": settings.max_output_buffer_bytes,
        "max_output_stall_s": settings.max_output_stall_s,
        "max_text_tokens": limits.max_text_tokens,
        "max_image_pixels": limits.max_image_pixels,
        "max_output_tokens": served.max_output_tokens,
        "idle_timeout_s": limits.idle_timeout_s,
        "max_session_s": limits.max_session_s,
    }
    return capabilities(state.settings.model_id, config, settings.max_append_chars * 3 // 4, bounds)


async def _refusal(websocket: WebSocket, state: ServerState, protocol: RealtimeProtocol) -> tuple[str, str] | None:
    """Why this connection cannot become a session, as (code, message); None when it can.

    Also applies the session config minted into an ephemeral key (`POST /v1/realtime/client_secrets`),
    so the graph starts with it."""
    requested = websocket.query_params.get("model")
    if requested and not state.settings.serves(requested):
        return "model_not_found", state.settings.not_served(requested)
    if (why := realtime_unavailable(state.runtime.spec.inputs)) is not None:
        return "realtime_unavailable", why
    minted_by = getattr(websocket.app.state, "client_secrets", None)
    key = request_key(websocket.scope)
    minted = minted_by.session_of(key) if minted_by is not None else None
    if minted is not None and not minted_by.redeem(key) and state.settings.api_key is not None:
        return "invalid_api_key", "This ephemeral key was already used or has expired."
    if minted:
        try:
            await look_up_voices(protocol, {"type": "session.update", "session": minted})
            protocol.configure_initial(minted)
        except RealtimeError as error:
            return error.code, error.message
    return None


def _unspend_key(websocket: WebSocket) -> None:
    minted_by = getattr(websocket.app.state, "client_secrets", None)
    key = request_key(websocket.scope)
    if minted_by is not None and key and minted_by.session_of(key) is not None:
        minted_by.release(key)
