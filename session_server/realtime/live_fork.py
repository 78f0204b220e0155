"""Forks of Live sessions: a new session seeded with the conversation of another one.

Live's `/v1/live/sessions/{id}/fork` (the SDK's `client.live.forks.connect`, a WebSocket; and
`client.live.sessions.fork`, `POST` with a WebRTC offer) is mapped onto this server's resume
snapshots (snapshot.py): the fork takes, at the moment it is asked for, the source's snapshot (its
GA session settings and conversation items) and its Live session object (model, instructions,
voice, delegation, startup input, open delegations), and opens a *new* session (its own id) from
them. The conversation is replayed into a new graph session as a rebuilt resume replays it (the
KV is rebuilt by the next turn's prefill; user audio reaches the model as its transcript). The
source is not touched: it goes on, and the two share nothing after the fork.

Sources: the Live sessions of this server that are open (WebSocket or WebRTC) and have started,
whatever their `store`; and *stored* ones (`store: true`), open or ended, on any replica sharing
the session store (session_store.py: this process's memory, or Redis with `--state-url`). A
stored session writes its fork source to the store (`live:<id>`) after each change to its
conversation (`StoredSessions.keep`), and it stays there `limits.resume_ttl_s` (120 s) after the
last write: a stored session can be forked for that long after it ended. An unknown id, a
session that ended unstored or longer ago, or one not started yet: `session_not_found`.
A fork starts as Live defines it: on the WebSocket, a `session.start` with overrides (which may be
empty: `audio.format` only; the model, voice and instructions are the source's), answered by
`session.started`; over WebRTC, at creation, with `session.started` on the data channel.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from graph.background import spawn
from session_server.realtime import snapshot
from session_server.realtime.protocol import RealtimeProtocol, SendToGraph
from session_server.realtime.session_store import SessionStore

log = logging.getLogger("session_server.realtime.live")

NOT_FOUND = "session_not_found"
_KEY_PREFIX = "live:"  # stored Live sessions, beside (never mistaken for) resume snapshots
# Live events after which a stored session's conversation or settings may have changed.
_CHANGE_EVENTS = frozenset({
    "session.started", "session.updated", "session.instructions.appended", "session.thinking.appended",
    "session.commentary.appended", "session.input_transcript.delta", "session.delegation.created",
    "session.usage.updated", "session.closed",
})


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
    return (f"No Live session {session_id!r} to fork: unknown, not started yet, or ended (unstored, or stored "
            "longer ago than the store keeps it).")


class StoredSessions:
    """The fork sources of stored Live sessions (`store: true`), in the resume snapshots' store
    (`resumer`: resume.py's `SessionResumer`, whose store, replica id and TTL it uses)."""

    def __init__(self, resumer: Any):
        self.resumer = resumer

    @property
    def store(self) -> SessionStore:
        return self.resumer.store

    def keep(self, protocol: RealtimeProtocol) -> None:
        """Watch this Live session (its dialect's events): once stored, write its fork source after
        each change, one write per protocol step."""
        pending = False
        lock = asyncio.Lock()  # writes land in order: the last one holds the latest state

        async def save() -> None:
            nonlocal pending
            await asyncio.sleep(0)  # one write for all the events of one protocol step
            async with lock:
                pending = False
                source = fork_source(protocol)
                if source is None:
                    return
                try:
                    await self.store.save(_KEY_PREFIX + source.session_id, {"snapshot": source.snapshot, "live": source.live},
                                          self.resumer.replica_id, self.resumer.ttl_s)
                except Exception as exc:  # noqa: BLE001 - the session goes on; only a later fork would miss this state
                    log.warning("session %s: stored session not saved: %s", source.session_id, exc)

        def observe(event: dict[str, Any]) -> None:
            nonlocal pending
            if event["type"] in _CHANGE_EVENTS and not pending and protocol.dialect.session.get("store"):  # type: ignore[attr-defined]
                pending = True
                spawn(save(), name=f"{protocol.session_id}:stored")

        protocol.dialect.observers.append(observe)  # type: ignore[attr-defined]

    async def load(self, session_id: str) -> ForkSource | None:
        try:
            saved = await self.store.load(_KEY_PREFIX + session_id)
        except Exception as exc:  # noqa: BLE001 - answered as not found; the log says why
            log.warning("session %s: session store unavailable: %s", session_id, exc)
            return None
        if saved is None:
            return None
        return ForkSource(session_id, saved[0]["snapshot"], saved[0]["live"])
