"""Ephemeral client secrets: `POST /v1/realtime/client_secrets` mints an `ek_...` key.

A browser must never hold the server's API key. The page's backend (or the page itself, when
the server has no key) mints a short-lived key, and the browser uses it once, for
`POST /v1/realtime/calls` or the realtime WebSocket. The key carries the `session` config given
at minting; the call it opens starts with that config.

Each key opens exactly one session and is never accepted after `expires_at`. The auth
middleware only checks a key (`is_usable`); it is spent (`redeem`) by the call or WebSocket
session that it really opens, so a request that never used it (a 404, an offer refused for bad
SDP, a session refused for capacity: `release`) leaves it good for the real one. Outstanding keys are bounded (`MAX_OUTSTANDING`):
past that, minting answers 429 until some expire or are used. Memory: about 1 KiB per key.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "ek_"
MIN_SECONDS = 10
MAX_SECONDS = 7200
DEFAULT_SECONDS = 600
MAX_OUTSTANDING = 10000
# A redeemed key's session config stays readable this long, for the request that redeemed it.
REDEEMED_TTL_S = 60.0


class ClientSecretError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass
class ClientSecret:
    value: str
    expires_at: float
    session: dict[str, Any] = field(default_factory=dict)
    redeemed_at: float | None = None


def parse_request(body: Any) -> tuple[int, dict[str, Any]]:
    """A client_secrets request body -> (lifetime seconds, session config). Raises ClientSecretError."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ClientSecretError("The request body must be a JSON object.")
    expires_after = {} if body.get("expires_after") is None else body["expires_after"]
    if not isinstance(expires_after, dict):
        raise ClientSecretError("`expires_after` must be an object {anchor, seconds}.", "expires_after")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        raise ClientSecretError(f"`expires_after.anchor` must be 'created_at', got {anchor!r}.", "expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ClientSecretError(
            f"`expires_after.seconds` must be an integer from {MIN_SECONDS} to {MAX_SECONDS}, got {seconds!r}.",
            "expires_after.seconds",
        )
    session = {} if body.get("session") is None else body["session"]
    if not isinstance(session, dict):
        raise ClientSecretError("`session` must be an object.", "session")
    session_type = session.get("type", "realtime")
    if session_type != "realtime":
        raise ClientSecretError(f"Only `realtime` sessions are served, got session.type {session_type!r}.", "session.type")
    return seconds, session


class ClientSecrets:
    """The minted keys. `redeem` is registered in `ServerState.key_validators`."""

    def __init__(self, clock: Callable[[], float] = time.time, max_outstanding: int = MAX_OUTSTANDING):
        self._clock = clock
        self._max_outstanding = max_outstanding
        self._keys: dict[str, ClientSecret] = {}
        # The auth middleware may call `redeem` from any task; the check-and-mark must be atomic.
        self._lock = threading.Lock()

    def mint(self, seconds: int, session: dict[str, Any]) -> ClientSecret:
        with self._lock:
            self._prune()
            if sum(1 for s in self._keys.values() if s.redeemed_at is None) >= self._max_outstanding:
                raise ClientSecretError(
                    f"Too many outstanding client secrets ({self._max_outstanding}); try again later.",
                    status=429,
                    code="rate_limit_exceeded",
                )
            secret = ClientSecret(PREFIX + secrets.token_urlsafe(24), int(self._clock()) + seconds, dict(session))
            self._keys[secret.value] = secret
            return secret

    def is_usable(self, key: str) -> bool:
        """A minted, unexpired key not spent yet (the auth check; spends nothing)."""
        if not key.startswith(PREFIX):
            return False
        with self._lock:
            secret = self._keys.get(key)
            return secret is not None and secret.redeemed_at is None and self._clock() < secret.expires_at

    def release(self, key: str) -> None:
        """Un-spend a key whose session did not start after all (refused offer, no capacity)."""
        with self._lock:
            secret = self._keys.get(key)
            if secret is not None:
                secret.redeemed_at = None

    def redeem(self, key: str) -> bool:
        """True once for a minted, unexpired key; False for any later use or an unknown key."""
        if not key.startswith(PREFIX):
            return False
        with self._lock:
            secret = self._keys.get(key)
            now = self._clock()
            if secret is None or secret.redeemed_at is not None or now >= secret.expires_at:
                return False
            secret.redeemed_at = now
            return True

    def session_of(self, key: str | None) -> dict[str, Any] | None:
        """The session config minted with `key` (None: not a minted key)."""
        if key is None:
            return None
        with self._lock:
            secret = self._keys.get(key)
            return dict(secret.session) if secret is not None else None

    def outstanding(self) -> int:
        with self._lock:
            self._prune()
            return sum(1 for s in self._keys.values() if s.redeemed_at is None)

    def _prune(self) -> None:
        now = self._clock()
        expired = [
            key
            for key, s in self._keys.items()
            if now >= s.expires_at or (s.redeemed_at is not None and now - s.redeemed_at > REDEEMED_TTL_S)
        ]
        for key in expired:
            del self._keys[key]
