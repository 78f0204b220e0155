"""Where model compute runs: worker threads, never the event loop.

`ComputePool.run(fn, ...)` runs one call on one of the pool's worker threads, which take queued
calls most urgent first (FIFO within a priority). A `Batcher` is a shared executor: sessions
`await batcher.submit(item)`, a dedicated worker thread takes every ready item (up to
`max_batch`, most urgent first) and hands them to one `batch_fn(items) -> results` call, so the
work of many sessions goes through one forward. torch and onnxruntime release the GIL while they
compute, so the event loop keeps moving messages meanwhile.

Batch formation: with `linger_s` > 0, a worker that finds fewer items queued than its last batch
held waits up to `linger_s` for the rest (sessions that got a step's result usually resubmit at
once; without the wait the first one back starts a batch of one). 0 (the default) never waits.

Priority: lower numbers go first. Live sessions submit at `PRIORITY_REALTIME`; stateless speech
requests at `PRIORITY_SPEECH`, so they fill batches but never push live sessions out of one.
Both `ComputePool.run` and `Batcher.submit` default to `current_priority`, which the runtime sets
for each node task from its session's kind, so a node gets "sessions first" without naming a
priority. Calls whose caller was cancelled before they started are skipped.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

PRIORITY_REALTIME = 0
PRIORITY_SPEECH = 10

# The priority of compute submitted from the current task (set per node task by the runtime).
current_priority: contextvars.ContextVar[int] = contextvars.ContextVar(
    "graph_compute_priority", default=PRIORITY_REALTIME)

Item = TypeVar("Item")
Result = TypeVar("Result")


class ComputePool:
    """`threads` worker threads taking calls most urgent first (then in arrival order)."""

    def __init__(self, threads: int = 4):
        self._queue: list[tuple[int, int, _Pending]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._batchers: list[Batcher[Any, Any]] = []
        self._workers = [threading.Thread(target=self._work, name=f"compute-{i}", daemon=True) for i in range(threads)]
        for worker in self._workers:
            worker.start()

    async def run(self, fn: Callable[..., Result], *args: Any, priority: int | None = None) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        urgency = current_priority.get() if priority is None else priority
        with self._ready:
            if self._closed:
                raise RuntimeError("the compute pool is shut down")
            heapq.heappush(self._queue, (urgency, next(self._order), _Pending((fn, args), future, loop)))
            self._ready.notify()
        try:
            return await future
        finally:
            # A raised exception's traceback keeps this frame; the future holds that exception.
            del future, fn, args

    def queue_depth(self) -> int:
        return len(self._queue)

    def batcher(
        self,
        name: str,
        batch_fn: Callable[[list[Item]], Sequence[Result | BaseException]],
        max_batch: int = 32,
        linger_s: float = 0.0,
    ) -> Batcher[Item, Result]:
        batcher: Batcher[Item, Result] = Batcher(name, batch_fn, max_batch, linger_s)
        self._batchers.append(batcher)
        return batcher

    def shutdown(self) -> None:
        """Stop taking calls. Calls already running finish and deliver their result; queued calls
        fail with RuntimeError; later `run` calls raise it. Batchers are closed too."""
        for batcher in self._batchers:
            batcher.close()
        with self._ready:
            self._closed = True
            dropped, self._queue = self._queue, []
            self._ready.notify_all()
        for _, _, pending in dropped:
            _deliver(pending, RuntimeError("the compute pool is shut down"))

    def _next(self) -> _Pending | None:
        with self._ready:
            while not self._queue and not self._closed:
                self._ready.wait()
            if not self._queue:
                return None
            return heapq.heappop(self._queue)[2]

    def _work(self) -> None:
        while (pending := self._next()) is not None:
            if not pending.future.done():  # a caller cancelled before its call started is skipped
                _call(pending)
            # An idle worker keeps no reference to its last call: a cancelled caller's future and
            # the call's arguments hold that caller's state (a session's KV, its frames).
            del pending


def _call(pending: _Pending) -> None:
    fn, args = pending.item
    try:
        result: Any = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - delivered to the caller
        result = exc
    _deliver(pending, result)
    # An exception's traceback keeps this frame: it must not keep the call's arguments alive.
    del pending, fn, args, result


def _deliver(pending: _Pending, result: Any) -> None:
    try:
        pending.loop.call_soon_threadsafe(_settle, pending.future, result)
    except RuntimeError:  # the caller's event loop is closed: nobody is waiting any more
        pass


class _Pending:
    __slots__ = ("item", "future", "loop")

    def __init__(self, item: Any, future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop):
        self.item = item
        self.future = future
        self.loop = loop


class Batcher(Generic[Item, Result]):
    """A shared executor that batches ready work from many sessions into one call.

    `batch_fn` returns one result per item, in order; an exception object in place of a result
    fails that item alone. If `batch_fn` itself raises, every item of that batch fails with it.
    """

    def __init__(self, name: str, batch_fn: Callable[[list[Item]], Sequence[Result | BaseException]], max_batch: int,
                 linger_s: float = 0.0):
        self.name = name
        self._linger_s = linger_s
        self._last_batch = 0
        self._batch_fn = batch_fn
        self._max_batch = max_batch
        self._queue: list[tuple[int, int, _Pending]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self.batches_run = 0
        self.items_run = 0
        self._thread = threading.Thread(target=self._work, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    async def submit(self, item: Item, priority: int | None = None) -> Result:
        if priority is None:
            priority = current_priority.get()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        with self._ready:
            if self._closed:
                raise RuntimeError(f"executor {self.name!r} is closed")
            heapq.heappush(self._queue, (priority, next(self._order), _Pending(item, future, loop)))
            self._ready.notify()
        # If the caller is cancelled before the batch runs, the worker skips the item.
        return await future

    def queue_depth(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _take_batch(self) -> list[_Pending] | None:
        with self._ready:
            while not self._queue and not self._closed:
                self._ready.wait()
            if self._closed and not self._queue:
                return None
            if self._linger_s > 0:
                deadline = time.monotonic() + self._linger_s
                wanted = min(self._last_batch, self._max_batch)
                while len(self._queue) < wanted and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._ready.wait(left):
                        break
            batch: list[_Pending] = []
            while self._queue and len(batch) < self._max_batch:
                _, _, pending = heapq.heappop(self._queue)
                if not pending.future.done():  # cancelled callers drop out here
                    batch.append(pending)
            self._last_batch = len(batch)
            return batch

    def _work(self) -> None:
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue
            try:
                results: Sequence[Any] = self._batch_fn([p.item for p in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"executor {self.name!r} returned {len(results)} results for {len(batch)} items")
            except BaseException as exc:  # noqa: BLE001 - delivered to every waiting session
                results = [exc] * len(batch)
            self.batches_run += 1
            self.items_run += len(batch)
            for pending, result in zip(batch, results):
                pending.loop.call_soon_threadsafe(_settle, pending.future, result)
            # An idle worker must not keep its last batch alive: a cancelled caller's future holds
            # that caller's frames (and through them its session's state) until the next batch.
            del batch, results, pending, result


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
