"""Bounded in-order queues between nodes.

An `Inbox` holds at most `capacity` messages: `put` waits while it is full, which is how a slow
consumer slows its producer instead of growing memory (backpressure). Memory cost per edge is
bounded by `capacity` messages (an audio chunk is typically 20-100 ms of float32 audio, so 64
queued chunks cost well under 1 MiB).

Unlike `asyncio.Queue` it can `purge` queued messages, which is how a control (an interrupt)
removes the data of the turn it cancels from every edge without waiting behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from graph.background import spawn

T = TypeVar("T")


class InboxClosed(Exception):
    """Raised by `get` once the inbox is closed and empty, and by `put` once it is closed."""


class Inbox(Generic[T]):
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("an inbox needs a capacity of at least 1")
        self.capacity = capacity
        self._items: deque[T] = deque()
        self._changed = asyncio.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, item: T) -> None:
        async with self._changed:
            # Invariant: check and append with no await in between, so capacity is never exceeded.
            await self._changed.wait_for(lambda: self._closed or len(self._items) < self.capacity)
            if self._closed:
                raise InboxClosed
            self._items.append(item)
            self._changed.notify_all()

    async def get(self) -> T:
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self._items)
            if not self._items:
                raise InboxClosed
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def purge(self, should_drop: Callable[[T], bool]) -> list[T]:
        """Drop every queued item for which `should_drop` is true; returns the dropped items.

        Synchronous on purpose: a control purges all edges in one go, with no await in between.
        Waiting producers are woken by the next put/get (or `wake`).
        """
        kept: list[T] = []
        dropped: list[T] = []
        for item in self._items:
            (dropped if should_drop(item) else kept).append(item)
        if dropped:
            self._items.clear()
            self._items.extend(kept)
            spawn(self._notify())
        return dropped

    def close(self) -> None:
        """Refuse further puts; queued items can still be taken, then `get` raises InboxClosed."""
        self._closed = True
        spawn(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
