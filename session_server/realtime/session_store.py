"""Where realtime session snapshots live between connections: this process, or Redis.

A snapshot (`snapshot.py`) is what rebuilding a session needs: its settings, its conversation
items, the SHA-256 of its resume token, and its owner (the replica serving it: the session ->
replica map). One Redis hash per session, `sglang:session:<id>`, fields `snapshot` (JSON) and
`owner`, expiring `limits.resume_ttl_s` after the last write or `touch`: the owner touches it
while a client is attached, so a snapshot outlives its owner (SIGKILL, lost node) by at most
the resume TTL, and nobody has to clean up after a dead replica.

`--state-url redis://HOST:PORT/DB` (profile `state: {url: ...}`) picks Redis; without it the
store is this process's memory, and a session can be resumed on this replica only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

_KEY_PREFIX = "sglang:session:"

# Deletes the session's hash only while `owner` is still the caller: a replica whose parked
# session expired must not delete the snapshot of a session another replica has taken over.
_DELETE_IF_OWNER = """
if redis.call('hget', KEYS[1], 'owner') == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class StateConfig:
    """The profile's optional `state:` section."""

    url: str | None = None

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> StateConfig:
        section = profile.get("state")
        if section is None:
            return cls()
        if not isinstance(section, dict):
            raise ValueError("state: must be a mapping (state: {url: redis://HOST:PORT/DB})")
        unknown = sorted(set(section) - {"url"})
        if unknown:
            raise ValueError(f"state.{unknown[0]}: unknown key (known: url)")
        url = section.get("url")
        if url is not None and (not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://"))):
            raise ValueError(f"state.url: {url!r} is not a Redis URL (redis://HOST:PORT/DB)")
        return cls(url=url)


class SessionStore(Protocol):
    async def save(self, session_id: str, snapshot: dict[str, Any], owner: str, ttl_s: float) -> None: ...
    async def load(self, session_id: str) -> tuple[dict[str, Any], str] | None: ...
    async def touch(self, session_id: str, ttl_s: float) -> None: ...
    async def delete_if_owner(self, session_id: str, owner: str) -> None: ...
    async def close(self) -> None: ...


class LocalSessionStore:
    """Snapshots in this process's memory (one replica)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[dict[str, Any], str, float]] = {}

    async def save(self, session_id: str, snapshot: dict[str, Any], owner: str, ttl_s: float) -> None:
        self._expire()
        self._entries[session_id] = (snapshot, owner, time.monotonic() + ttl_s)

    async def load(self, session_id: str) -> tuple[dict[str, Any], str] | None:
        self._expire()
        entry = self._entries.get(session_id)
        return None if entry is None else (entry[0], entry[1])

    async def touch(self, session_id: str, ttl_s: float) -> None:
        entry = self._entries.get(session_id)
        if entry is not None:
            self._entries[session_id] = (entry[0], entry[1], time.monotonic() + ttl_s)

    async def delete_if_owner(self, session_id: str, owner: str) -> None:
        entry = self._entries.get(session_id)
        if entry is not None and entry[1] == owner:
            del self._entries[session_id]

    async def close(self) -> None:
        self._entries.clear()

    def _expire(self) -> None:
        now = time.monotonic()
        for session_id in [key for key, (_, _, until) in self._entries.items() if until <= now]:
            del self._entries[session_id]


class RedisSessionStore:
    """Snapshots in Redis, shared by every replica (redis-py's asyncio client)."""

    def __init__(self, url: str):
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._delete_if_owner = self._redis.register_script(_DELETE_IF_OWNER)

    async def save(self, session_id: str, snapshot: dict[str, Any], owner: str, ttl_s: float) -> None:
        key = _KEY_PREFIX + session_id
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"snapshot": json.dumps(snapshot), "owner": owner})
            pipe.pexpire(key, int(ttl_s * 1000))
            await pipe.execute()

    async def load(self, session_id: str) -> tuple[dict[str, Any], str] | None:
        snapshot, owner = await self._redis.hmget(_KEY_PREFIX + session_id, ["snapshot", "owner"])
        if snapshot is None or owner is None:
            return None
        return json.loads(snapshot), owner.decode()

    async def touch(self, session_id: str, ttl_s: float) -> None:
        await self._redis.pexpire(_KEY_PREFIX + session_id, int(ttl_s * 1000))

    async def delete_if_owner(self, session_id: str, owner: str) -> None:
        await self._delete_if_owner(keys=[_KEY_PREFIX + session_id], args=[owner])

    async def close(self) -> None:
        await self._redis.aclose()


def session_store_for(config: StateConfig) -> SessionStore:
    return RedisSessionStore(config.url) if config.url else LocalSessionStore()
