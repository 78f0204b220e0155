"""The admin API: the live sessions of this server, read and ended by an operator.

    GET    /v1/admin/sessions        -> {object: "list", data: [session, ...]}, oldest first
    GET    /v1/admin/sessions/{id}   -> session; 404 `session_not_found`
    DELETE /v1/admin/sessions/{id}   -> {id, object: "admin.session.deleted", deleted: true, session};
                                        404 `session_not_found`

A session (live_sessions.py `SessionRecord`): id, kind (realtime | speech: a speech request
while it runs), transport (websocket | webrtc | http), state (connected | parked: its client
dropped and it waits for a resume), created_at,
last_activity_at, parked_at, turns, kv_tokens, usage so far (usage.py), engine (the engine
process hosting it), call_id (WebRTC). Shaped after LiveKit's room service (ListParticipants,
RemoveParticipant) and Ultravox's call management (GET/DELETE a call).

DELETE ends the session as the server's other limits do: a connected client gets
`session.closed` {reason: "admin_closed"} and the close (close frame 1000; a WebRTC call's peer
connection closed); a parked session is dropped with its snapshot, so it cannot be resumed; a
speech request ends with error `admin_closed` (its stream breaks off if it was streaming). The
answer comes once the session is over (its graph session closed, the client's close sent), or
with 202 and the session still ending after `END_WAIT_S`.

Installed only with an admin key (`--admin-key`, env `SGL_OMNI_ADMIN_KEY`); auth.py checks it
(and only it) on every `/v1/admin` path. Without one the paths are absent (404). The registry
holds this process's sessions; snapshots in a shared store whose replica died are not sessions
of any replica until a client resumes them.
"""

from __future__ import annotations

import msgspec
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from session_server.errors import openai_error_response
from session_server.state import ServerState

ADMIN_CLOSED = "admin_closed"  # `session.closed`'s reason when an operator ends a session
# How long DELETE waits for the session to end: the final `session.closed` may take the
# WebSocket's `close_timeout_s` (2 s) and then the close frame as long again.
END_WAIT_S = 5.0


def install(app: FastAPI, state: ServerState) -> None:
    sessions = state.sessions

    @app.get("/v1/admin/sessions")
    async def list_sessions() -> Response:
        records = sorted((session.record() for session in sessions), key=lambda record: record.created_at)
        return _json({"object": "list", "data": records})

    @app.get("/v1/admin/sessions/{session_id}")
    async def get_session(session_id: str) -> Response:
        session = sessions.get(session_id)
        if session is None:
            return _not_found(session_id)
        return _json(session.record())

    @app.delete("/v1/admin/sessions/{session_id}")
    async def delete_session(session_id: str) -> Response:
        session = sessions.get(session_id)
        if session is None:
            return _not_found(session_id)
        ended = await sessions.end(session, ADMIN_CLOSED, END_WAIT_S)
        body = {"id": session_id, "object": "admin.session.deleted", "deleted": ended, "session": session.record()}
        return _json(body, status_code=200 if ended else 202)


def _json(body: object, status_code: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status_code, media_type="application/json")


def _not_found(session_id: str) -> JSONResponse:
    return openai_error_response(404, f"No live session {session_id!r} on this server.", param="session_id", code="session_not_found")
