"""Sessions that survive a dropped connection: parking, snapshots, and the resume handshake.

Every realtime session gets a resume token (256 random bits, `session.sglang.resume_token` in
`session.created`; only its SHA-256 is stored). A socket lost without a normal close (no close
frame, or a code other than 1000/1001) *detaches* the session instead of ending it: a reply that
was streaming ends `cancelled`, truncated to the audio sent (RealtimeProtocol.detach), and the session is
*parked* here with its graph session, KV included, for `limits.resume_ttl_s` (120 s).

`GET /v1/realtime?session_id=ID&resume_token=T` (same auth as any session) then:
- on the replica that parked it (and still owns it in the store): re-attaches the live session,
  `kv: "kept"`;
- elsewhere, or once the owner died: rebuilds it from its snapshot in the store (session_store.py:
  this process's memory, or Redis with `--state-url`), replaying the conversation into a new
  graph session, `kv: "rebuilt"` (the next turn's prefill rebuilds the KV);
- a wrong token, an unknown or an expired id: `error` `session_not_found` and close 1008, the same
  answer for all three.
The client gets `session.created` (the same id), then `sglang.session.resumed` {session_id,
items, kv}.

Snapshots are written after each change to the conversation or the settings, and touched while a
client is attached, so they expire `resume_ttl_s` after the owner stops (or dies). A session that
ends (session.close, a normal close frame, timeouts) deletes its snapshot; one closed by the
server's shutdown keeps it and its `session.closed` says `resumable: true`.

Parked sessions hold a session slot (and their KV) but give it up first: a new session that finds
the replica full closes the oldest parked one (its snapshot stays, so it can still be rebuilt).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

from graph.background import spawn
from graph.errors import SessionRejected
from graph.runtime import free_slots
from session_server.realtime import snapshot
from session_server.realtime.protocol import CLOSE_POLICY, RealtimeProtocol
from session_server.realtime.session_store import SessionStore
from session_server.realtime.websocket_link import (
    RealtimeSettings,
    WebSocketLink,
    end_link,
    new_link,
    register,
    session_headers,
    start_tasks,
    unregister,
    until_closed,
)
from session_server.state import ServerState

log = logging.getLogger("session_server.realtime.resume")

# Events after which the snapshot is written again (the conversation or the settings changed).
_SNAPSHOT_EVENTS = frozenset({
    "session.created", "session.updated", "conversation.item.done", "conversation.item.deleted",
    "conversation.item.truncated", "conversation.item.input_audio_transcription.completed", "response.done",
})
# How long a resume waits for the connection it replaces to let its session go.
_TAKEOVER_WAIT_S = 2.0
NOT_FOUND = ("session_not_found", "No resumable session has this id and token (unknown, expired, or a wrong token).")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Tracked:
    """A resumable session's bookkeeping on its owner."""

    token_sha256: str
    save_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    save_pending: bool = False
    heartbeat: asyncio.Task[None] | None = None
    link: WebSocketLink | None = None  # the connection serving it now


@dataclass
class _Parked:
    link: WebSocketLink
    tasks: list[asyncio.Task[None]]  # the feeder and the pump, still running
    parked_at: float
    claimed: asyncio.Event = field(default_factory=asyncio.Event)


class SessionResumer:
    def __init__(self, state: ServerState, store: SessionStore, ttl_s: float, replica_id: str | None = None):
        self.state = state
        self.store = store
        self.ttl_s = ttl_s
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.parked: dict[str, _Parked] = {}
        self._tracked: dict[str, _Tracked] = {}

    # ------------------------------------------------------------------ attached sessions

    def track(self, link: WebSocketLink) -> None:
        """Make `link`'s session resumable: with a new token, or the one it was resumed with."""
        if link.resume_token is None:
            link.resume_token = secrets.token_urlsafe(32)  # 256 bits
        token = link.resume_token
        session_id = link.protocol.session_id
        tracked = self._tracked.get(session_id) or _Tracked(token_digest(token))
        self._tracked[session_id] = tracked
        tracked.link = link
        link.on_event = lambda event: self._observe(link, tracked, event, token)
        tracked.heartbeat = spawn(self._heartbeat(session_id), name=f"{session_id}:snapshot-heartbeat")

    def _observe(self, link: WebSocketLink, tracked: _Tracked, event: dict[str, Any], token: str) -> None:
        kind = event["type"]
        if kind == "session.created":
            event["session"].setdefault("sglang", {})["resume_token"] = token
        elif kind == "session.closed" and event.get("reason") == "server_shutdown":
            event["resumable"] = True
        if kind in _SNAPSHOT_EVENTS and not tracked.save_pending:
            tracked.save_pending = True
            spawn(self._save(link, tracked), name=f"{link.protocol.session_id}:snapshot")

    async def _save(self, link: WebSocketLink, tracked: _Tracked) -> None:
        await asyncio.sleep(0)  # one write for all the events of one protocol step
        async with tracked.save_lock:  # writes land in order: the last one holds the latest state
            tracked.save_pending = False
            try:
                await self.store.save(link.protocol.session_id, snapshot.snapshot_of(link.protocol, tracked.token_sha256),
                                      self.replica_id, self.ttl_s)
            except Exception as exc:  # noqa: BLE001 - the session goes on; only a rebuild would miss this state
                log.warning("session %s: snapshot not saved: %s", link.protocol.session_id, exc)

    async def _heartbeat(self, session_id: str) -> None:
        while True:
            await asyncio.sleep(max(self.ttl_s / 3, 0.05))
            with contextlib.suppress(Exception):
                await self.store.touch(session_id, self.ttl_s)

    def _stop_heartbeat(self, session_id: str) -> None:
        tracked = self._tracked.get(session_id)
        if tracked is not None and tracked.heartbeat is not None:
            tracked.heartbeat.cancel()
            tracked.heartbeat = None

    async def ended(self, link: WebSocketLink) -> None:
        """The session is over: forget it (its snapshot too, unless the server's shutdown ended it)."""
        session_id = link.protocol.session_id
        self._stop_heartbeat(session_id)
        self._tracked.pop(session_id, None)
        if link.protocol.close_reason != "server_shutdown":
            with contextlib.suppress(Exception):
                await self.store.delete_if_owner(session_id, self.replica_id)

    # ------------------------------------------------------------------ parked sessions

    def park(self, link: WebSocketLink, tasks: list[asyncio.Task[None]]) -> None:
        session_id = link.protocol.session_id
        link.apply(link.protocol.detach())
        self._stop_heartbeat(session_id)
        parked = _Parked(link, tasks, time.monotonic())
        self.parked[session_id] = parked
        log.info("session %s detached: resumable for %.0fs", session_id, self.ttl_s)
        spawn(self._expire(parked), name=f"{session_id}:parked")

    async def _expire(self, parked: _Parked) -> None:
        """End a parked session when its TTL passes or its graph ends, unless a client claims it first."""
        link = parked.link
        waits = [asyncio.ensure_future(parked.claimed.wait()), asyncio.ensure_future(link.closed.wait())]
        try:
            await asyncio.wait(waits, timeout=self.ttl_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if parked.claimed.is_set():
            return
        await self._end_parked(parked, "resume_expired")

    async def _end_parked(self, parked: _Parked, reason: str) -> None:
        link = parked.link
        session_id = link.protocol.session_id
        if self.parked.get(session_id) is parked:
            del self.parked[session_id]
        parked.claimed.set()
        link.apply(link.protocol.close(reason))
        for task in parked.tasks:
            task.cancel()
        await asyncio.gather(*parked.tasks, return_exceptions=True)
        if link.graph is not None:
            await link.graph.close(link.close_reason or reason)
        await self.ended(link)
        unregister(link, self.state)

    async def claim(self, session_id: str, token: str) -> _Parked | None:
        """The live session, taken from its parking place; None when this replica has none (or the
        token is wrong). A resume can arrive before the server noticed that the old socket died:
        the old socket is then let go, as if it had dropped."""
        tracked = self._tracked.get(session_id)
        if tracked is None or not hmac.compare_digest(token_digest(token), tracked.token_sha256):
            return None
        if session_id not in self.parked and tracked.link is not None and not tracked.link.closed.is_set():
            tracked.link.detach()
            for _ in range(int(_TAKEOVER_WAIT_S / 0.01)):
                if session_id in self.parked or tracked.link.closed.is_set():
                    break
                await asyncio.sleep(0.01)
        parked = self.parked.pop(session_id, None)
        if parked is not None:
            parked.claimed.set()
        return parked

    async def make_room(self) -> None:
        """A new session on a full replica: close the oldest parked session (it stays rebuildable)."""
        runtime = self.state.runtime
        while self.parked and runtime.count("realtime") >= runtime.capacity("realtime"):
            oldest = min(self.parked.values(), key=lambda p: p.parked_at)
            log.info("session %s: parked session closed to make room", oldest.link.protocol.session_id)
            self._stop_heartbeat(oldest.link.protocol.session_id)
            self._tracked.pop(oldest.link.protocol.session_id, None)  # keep its snapshot: no `ended`
            if self.parked.get(oldest.link.protocol.session_id) is oldest:
                del self.parked[oldest.link.protocol.session_id]
            oldest.claimed.set()
            oldest.link.apply(oldest.link.protocol.close("evicted"))
            for task in oldest.tasks:
                task.cancel()
            await asyncio.gather(*oldest.tasks, return_exceptions=True)
            if oldest.link.graph is not None:
                await oldest.link.graph.close("evicted")
            unregister(oldest.link, self.state)

    def free_slots(self) -> int:
        """Sessions this replica can still admit: free slots plus parked sessions it would close."""
        return free_slots(self.state.runtime) + len(self.parked)

    async def close(self) -> None:
        for parked in list(self.parked.values()):
            await self._end_parked(parked, "server_shutdown")
        await self.store.close()


async def serve_resume(websocket: WebSocket, state: ServerState, settings: RealtimeSettings, offered: list[str]) -> None:
    """`GET /v1/realtime?session_id=ID&resume_token=T`."""
    resumer: SessionResumer = state.resumer
    session_id = websocket.query_params.get("session_id") or ""
    token = websocket.query_params.get("resume_token") or ""
    subprotocol = "realtime" if "realtime" in offered else None
    requested = websocket.query_params.get("model")
    if requested and not state.settings.serves(requested):
        await _refuse(websocket, state, settings, subprotocol, "model_not_found", state.settings.not_served(requested))
        return
    parked = await resumer.claim(session_id, token) if session_id and token else None
    if parked is not None and not await _still_owner(resumer, session_id):
        await resumer._end_parked(parked, "resumed_elsewhere")  # another replica rebuilt it meanwhile
        parked = None
    saved = None
    if parked is None and session_id and token:
        saved = await _load(resumer, session_id, token)
    if parked is None and saved is None:
        await _refuse(websocket, state, settings, subprotocol, *NOT_FOUND)
        return
    await websocket.accept(subprotocol=subprotocol, headers=session_headers(session_id))
    writer: asyncio.Task[None] | None = None
    tasks: list[asyncio.Task[None]] = []
    if parked is not None:
        link, kv = parked.link, "kept"
        link.attach(websocket)
        resumer.track(link)
    else:
        link, kv = new_link(websocket, state, settings, offered, session_id), "rebuilt"
        replay = snapshot.restore(link.protocol, saved)
        link.resume_token = token
        try:
            stale = resumer.parked.get(session_id)
            if stale is not None:
                await resumer._end_parked(stale, "resumed_elsewhere")
            await resumer.make_room()
            link.graph = await state.runtime.open_session(session_id, "realtime", link.protocol.graph_config())
        except SessionRejected as rejected:
            writer = asyncio.create_task(link.writer(), name=f"{session_id}:writer")
            link.apply(link.protocol.reject(rejected.code, rejected.message))
            await end_link(link, writer, tasks, state)
            return
        resumer.track(link)
        register(link, state)
        link.apply(replay)
        log.info("session %s rebuilt from its snapshot (%d items)", session_id, len(link.protocol.items))
    writer = asyncio.create_task(link.writer(), name=f"{session_id}:writer")
    try:
        link.apply(link.protocol.resumed(kv))
        tasks = start_tasks(link, parked.tasks if parked is not None else None)
        await until_closed(link, tasks)
    finally:
        await end_link(link, writer, tasks, state)


async def _still_owner(resumer: SessionResumer, session_id: str) -> bool:
    try:
        saved = await resumer.store.load(session_id)
    except Exception:  # noqa: BLE001 - the store is down: the live session is the best we have
        return True
    return saved is None or saved[1] == resumer.replica_id


async def _load(resumer: SessionResumer, session_id: str, token: str) -> dict[str, Any] | None:
    try:
        saved = await resumer.store.load(session_id)
    except Exception as exc:  # noqa: BLE001 - answered as not found; the log says why
        log.warning("session %s: snapshot store unavailable: %s", session_id, exc)
        return None
    if saved is None or not hmac.compare_digest(token_digest(token), str(saved[0].get("token_sha256", ""))):
        return None
    return saved[0]


async def _refuse(websocket: WebSocket, state: ServerState, settings: RealtimeSettings, subprotocol: str | None,
                  code: str, message: str) -> None:
    await websocket.accept(subprotocol=subprotocol)
    protocol = RealtimeProtocol("", state.settings.model_id, settings.max_append_chars)
    link = WebSocketLink(websocket, protocol, settings)
    writer = asyncio.create_task(link.writer())
    link.apply(protocol.reject(code, message, CLOSE_POLICY))
    await end_link(link, writer, [], state)
