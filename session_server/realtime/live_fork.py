"""Forks of Live sessions: a new session seeded with the conversation of another one.

Live's `/v1/live/sessions/{id}/fork` (the SDK's `client.live.forks.connect`, a WebSocket; and
`client.live.sessions.fork`, `POST` with a WebRTC offer) is mapped onto this server's resume
snapshots (snapshot.py): the fork takes, at the moment it is asked for, the source's snapshot (its
GA session settings and conversation items) and its Live session object (model, instructions,
voice, delegation, startup input, open delegations), and opens a *new* session (its own id) from
them. The conversation is replayed into a new graph session as a rebuilt resume replays it (the
KV is rebuilt by the next turn's prefill; user audio reaches the model as its transcript). The
source is not touched: it goes on, and the two share nothing after the fork.

Sources: the Live sessions of this server that are open (WebSocket or WebRTC) and have started.
Live forks *stored* sessions; here every open session can be forked, and none is stored past its
end (`store: true` is refused), so a session that has ended cannot be: `session_not_found`.
A fork starts as Live defines it: on the WebSocket, a `session.start` with overrides (which may be
empty: `audio.format` only; the model, voice and instructions are the source's), answered by
`session.started`; over WebRTC, at creation, with `session.started` on the data channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from session_server.realtime import snapshot
from session_server.realtime.protocol import RealtimeProtocol, SendToGraph

NOT_FOUND = "session_not_found"


@dataclass(frozen=True)
class ForkSource:
    session_id: str
    snapshot: dict[str, Any]  # snapshot.snapshot_of: settings and conversation, copied
    live: dict[str, Any]  # LiveDialect.fork_state: the Live session object, open delegations


def fork_source(protocol: RealtimeProtocol) -> ForkSource | None:
    """What a fork of this (open) Live session starts from; None before its `session.started`."""
    dialect: Any = protocol.dialect
    if not getattr(dialect, "started", False):
        return None
    return ForkSource(protocol.session_id, snapshot.snapshot_of(protocol, token_sha256=""), dialect.fork_state())


def seed(protocol: RealtimeProtocol, source: ForkSource, media: bool) -> list[SendToGraph]:
    """Make `protocol` (new, not yet opened, its dialect a `LiveDialect`) a fork of `source`;
    returns the commands that replay the conversation into its graph session, in order."""
    replay = snapshot.restore(protocol, source.snapshot)
    protocol.dialect.seed_fork(source.session_id, source.live, media)  # type: ignore[attr-defined]
    return replay


def unknown_source(session_id: str) -> str:
    return (f"No open Live session {session_id!r} on this server to fork (unknown, ended, or not started yet; "
            "stored sessions are not served).")
