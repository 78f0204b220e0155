"""The one registry of live sessions: every transport registers the sessions it hosts; the admin
API (admin.py) lists, reads and ends them.

A realtime session is registered once its graph session is open (the WebSocket in
realtime/websocket.py, again under the same id when a resume rebuilds it; WebRTC in
webrtc/routes.py) and forgotten once it is over: its graph session closed and its client told;
a speech request (kind `speech`, speech/service.py `SpeechJob`) likewise, while it runs. A
WebSocket session whose socket dropped stays registered while it is parked for a resume
(realtime/resume.py); its record says `state: "parked"`.

The registry holds no session state of its own: each record is read from the session's host
(the transport's connection object) and its protocol when asked, so it cannot drift from them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from session_server.usage import SessionUsage, UsageRecord

Transport = Literal["websocket", "webrtc", "http", "twilio", "sip"]
# "closed": only in the answer to the DELETE that ended it.
ConnectionState = Literal["connected", "parked", "closed"]


class SessionProtocol(Protocol):
    """What the registry reads of a session's protocol (realtime/protocol.py `RealtimeProtocol`)."""

    session_id: str
    usage: SessionUsage
    last_activity_at: float


class SessionHost(Protocol):
    """A transport's side of one session (realtime/websocket_link.py `WebSocketLink`, webrtc/call.py `Call`,
    speech/service.py `SpeechJob`)."""

    protocol: SessionProtocol
    graph: Any  # the graph session; an engine's `RemoteSession` names its engine

    def parked_at(self) -> float | None:
        """When the client's connection dropped and the session was kept for a resume (wall
        clock); None while a client is connected."""

    def end(self, reason: str) -> None:
        """Start ending the session: the client gets `session.closed` {reason} and a close; the
        host forgets itself here once its graph session is closed."""


class EngineRecord(msgspec.Struct, kw_only=True):
    index: int
    pid: int | None
    device: str | None


class SessionRecord(msgspec.Struct, kw_only=True):
    """One session as the admin API shows it (times: Unix seconds)."""

    object: str = "admin.session"
    id: str
    kind: str
    transport: Transport
    state: ConnectionState
    created_at: float
    last_activity_at: float  # the client's last event or input audio (created_at before its first)
    parked_at: float | None
    turns: int
    kv_tokens: int
    usage: UsageRecord
    engine: EngineRecord | None  # None: the graph runs in the server process (`compute: {engines: 0}`)
    call_id: str | None = None  # a WebRTC call's id (`/v1/realtime/calls/{call_id}`), a phone call's (`twilio_...`)


@dataclass(eq=False)
class LiveSession:
    host: SessionHost
    kind: str
    transport: Transport
    created_at: float
    call_id: str | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return self.host.protocol.session_id

    def record(self) -> SessionRecord:
        protocol = self.host.protocol
        parked_at = self.host.parked_at()
        usage = protocol.usage
        state: ConnectionState = "closed" if self.gone.is_set() else "parked" if parked_at is not None else "connected"
        return SessionRecord(
            id=self.id, kind=self.kind, transport=self.transport, state=state,
            created_at=round(self.created_at, 3),
            last_activity_at=round(max(protocol.last_activity_at, self.created_at), 3),
            parked_at=round(parked_at, 3) if parked_at is not None else None, turns=usage.turns,
            kv_tokens=usage.kv_tokens, usage=usage.record(), engine=engine_of(self.host.graph), call_id=self.call_id,
        )


def engine_of(graph: Any) -> EngineRecord | None:
    engine = getattr(graph, "engine", None)
    if engine is None:
        return None
    return EngineRecord(index=engine.index, pid=engine.pid, device=engine.device)


class LiveSessions:
    """Sessions by id. A resume that rebuilds a session registers its new host under the same id;
    `forget` only removes the host it is given, so the old host's end cannot drop the new one."""

    def __init__(self) -> None:
        self._by_id: dict[str, LiveSession] = {}

    def add(self, host: SessionHost, kind: str, transport: Transport, call_id: str | None = None) -> LiveSession:
        session = LiveSession(host, kind, transport, time.time(), call_id)
        self._by_id[session.id] = session
        return session

    def forget(self, host: SessionHost) -> None:
        session = self._by_id.get(host.protocol.session_id)
        if session is not None and session.host is host:
            del self._by_id[session.id]
            session.gone.set()

    def get(self, session_id: str) -> LiveSession | None:
        return self._by_id.get(session_id)

    def __iter__(self) -> Iterator[LiveSession]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    async def end(self, session: LiveSession, reason: str, timeout_s: float) -> bool:
        """End `session` and wait until it is over (True), at most `timeout_s` (False: still ending)."""
        if not session.gone.is_set():
            session.host.end(reason)
        try:
            async with asyncio.timeout(timeout_s):
                await session.gone.wait()
        except TimeoutError:
            return False
        return True
