"""The live calls of one transport by call id (WebRTC calls, phone calls): so that a sideband or
the admin API's hangup can find one, and shutdown can end them all."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class LiveCall(Protocol):
    @property
    def id(self) -> str: ...

    async def close(self, reason: str) -> None: ...


C = TypeVar("C", bound=LiveCall)


class LiveCalls(Generic[C]):
    def __init__(self) -> None:
        self._calls: dict[str, C] = {}

    def add(self, call: C) -> None:
        self._calls[call.id] = call

    def get(self, call_id: str) -> C | None:
        return self._calls.get(call_id)

    def forget(self, call: C) -> None:
        """Drops `call`; a newer call that took its id since stays."""
        if self._calls.get(call.id) is call:
            del self._calls[call.id]

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._calls.values()))

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(call.close(reason) for call in list(self._calls.values())), return_exceptions=True)
