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
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InboxClosed(Exception):
    """Raised by `get` once the inbox is closed and empty, and by `put` once it is closed."""


class Inbox(Generic[T]):
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("an inbox needs a capacity of at least 1")
        self.capacity = capacity
        self._items: deque[T] = deque()
        # Futures of the tasks waiting for an item / for room, woken one at a time in order (as
        # asyncio.Queue does): a put or get that need not wait costs no lock and no future.
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put_nowait(self, item: T) -> bool:
        """Queue `item` if there is room now (and no earlier producer is waiting); False if not."""
        if self._closed:
            raise InboxClosed
        if len(self._items) >= self.capacity or self._putters:
            return False
        self._items.append(item)
        _wake_one(self._getters)
        return True

    async def put(self, item: T) -> None:
        while not self._closed and (len(self._items) >= self.capacity or self._putters):
            await self._wait(self._putters, lambda: self._closed or len(self._items) < self.capacity)
            if not self._closed and len(self._items) < self.capacity:
                break
        if self._closed:
            raise InboxClosed
        self._items.append(item)
        _wake_one(self._getters)
        if len(self._items) < self.capacity:
            _wake_one(self._putters)  # room for the next producer in line too

    async def get(self) -> T:
        while not self._items:
            if self._closed:
                raise InboxClosed
            await self._wait(self._getters, lambda: self._closed or bool(self._items))
        item = self._items.popleft()
        _wake_one(self._putters)
        return item

    async def _wait(self, waiters: deque[asyncio.Future[None]], ready: Callable[[], bool]) -> None:
        waiter = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled() and ready():
                _wake_one(waiters)  # the wake-up this task was given passes to the next in line
            raise

    def purge(self, should_drop: Callable[[T], bool]) -> list[T]:
        """Drop every queued item for which `should_drop` is true; returns the dropped items.

        Synchronous on purpose: a control purges all edges in one go, with no await in between.
        """
        kept: list[T] = []
        dropped: list[T] = []
        for item in self._items:
            (dropped if should_drop(item) else kept).append(item)
        if dropped:
            self._items.clear()
            self._items.extend(kept)
            for _ in dropped:
                _wake_one(self._putters)
        return dropped

    def close(self) -> None:
        """Refuse further puts; queued items can still be taken, then `get` raises InboxClosed."""
        self._closed = True
        for waiters in (self._getters, self._putters):
            while waiters:
                _wake_one(waiters)


def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return
