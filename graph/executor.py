"""Where model compute runs: the compute pool's worker threads, never the event loop.

One scheduler for all of a runtime's compute. `ComputePool.run(fn, ...)` queues one call; a
`Batcher` is a shared executor: sessions `await batcher.submit(item)`, and a worker takes every
ready item of that batcher (up to `max_batch`, most urgent first) and hands them to one
`batch_fn(items) -> results` call, so the work of many sessions goes through one forward. The
pool's `threads` workers (one by default) each take the most urgent unit of work of the whole
pool next: a queued call, or a batch of the batcher whose first item is the most urgent; a
batcher never runs two batches at once.

Why one worker by default: torch and onnxruntime release the GIL inside each operator and take it
back after, and a model forward is hundreds of operators with Python in between. Two threads that
both run model code hand the GIL back and forth at every operator (each return waits for the
other thread's switch interval), so on CPU each forward of a small model ran several times
slower with one thread per stage than the same work done by one thread in turn (docs/batching.md,
"Where compute runs"). One thread that runs every stage's batches in priority order keeps each forward at its
direct speed and lets batches grow while other stages run. `compute: {threads: N}` in a profile
sets more workers (stages then run concurrently) where that measures faster.

Urgency: (priority, due, arrival); lower goes first. Live sessions submit at `PRIORITY_REALTIME`;
stateless speech requests at `PRIORITY_SPEECH`, so they fill batches but never push live sessions
out of one. Within a priority, earliest due first: work is due when it is submitted, except where
the submitting task has a `current_due` clock: the runtime gives one to reply-side nodes
(`Node.follows_playback`), which says when the session's listener would run out of reply audio
(graph/session.py), or the caller names the due time (the VAD: when the window's audio reached
the server, so a session whose VAD fell behind catches up first instead of one window per round
of everyone else's work). So a turn waiting for its first audio goes before a reply that is
seconds ahead of its playback, and that reply becomes urgent again as its lead shrinks; with no
reply playing, work runs in arrival order across all stages, so no stage starves. A long job run
in slices (a long prefill, chunk by chunk) submits each slice after the first at
`continuation_due()`, not earlier than now: otherwise its early due time would put every slice
before another session's first-audio work, which would wait for the whole job. `run` and `submit`
default to `current_priority` and `current_due`, which the runtime sets for each node task, so a
node gets all this without naming either. Work whose caller was cancelled before it started is
skipped.

Release times: a task may also have a `current_release` clock: its work is not started before
then (the clock is read again whenever the worker looks, so a reply that is interrupted releases
its held work at once: the step runs and sees the interrupt). The runtime gives one to live
sessions' reply-side nodes (`PlaybackClock.release`: the due time minus the profile's
`compute: {lookahead_ms}`, once the reply plays), so a reply is made at most that far ahead of
its listener instead of all at once: the worker, which never preempts a unit, is then free more
often when a new turn's first-audio work arrives (docs/batching.md, rule 8). A batcher runs once its most urgent released item
is; its batch takes the queued items as always (rows ride along in the same forward), but for
one case: a batch led by the first-audio work of a turn that has just ended leaves out the items
not due yet (`_first_audio_alone`), so the forward the turn waits on carries no rows that are
not needed for hundreds of ms.

Batch formation: with `linger_s` > 0, a batcher holding fewer items than its last batch is not
ready until its oldest item has waited `linger_s` (sessions that got a step's result usually
resubmit at once; without the wait the first one back starts a batch of one). Meanwhile the
workers run other work; 0 (the default) is ready at once, as is a batcher holding a turn's
first-audio work (it would wait the linger behind whatever unit the worker took meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from graph.load import ComputeLoad

if TYPE_CHECKING:
    from graph.unit_trace import UnitTrace

PRIORITY_REALTIME = 0
PRIORITY_SPEECH = 10
PRIORITY_IDLE = 100  # runs only when nothing else waits (keeping caches warm: graph/runtime.py)

# The priority of compute submitted from the current task (set per node task by the runtime).
current_priority: contextvars.ContextVar[int] = contextvars.ContextVar(
    "graph_compute_priority", default=PRIORITY_REALTIME)
# When compute submitted from the current task is due (time.monotonic()); None: when submitted.
current_due: contextvars.ContextVar[Callable[[], float] | None] = contextvars.ContextVar(
    "graph_compute_due", default=None)
# Before when compute submitted from the current task must not start; None: at once.
current_release: contextvars.ContextVar[Callable[[], float] | None] = contextvars.ContextVar(
    "graph_compute_release", default=None)
# The phase of the reply compute submitted from the current task serves ("first", "playing",
# "unasked": PlaybackClock.phase): the batchers' riders rule (`_first_audio_alone`), unit traces.
current_phase: contextvars.ContextVar[Callable[[], str] | None] = contextvars.ContextVar(
    "graph_compute_phase", default=None)

Item = TypeVar("Item")
Result = TypeVar("Result")

# A queue entry: (priority, due, arrival number, the work). Arrival numbers are shared by the pool
# and its batchers, so heads of different queues compare.
_Entry = tuple[int, float, int, "_Pending"]


def submission_due() -> float:
    """When work submitted now from the current task is due (its `current_due` clock, else now).
    A caller that resubmits work none of which has run yet keeps the earlier of this and its
    first submission's (see `continuation_due` for work already under way)."""
    clock = current_due.get()
    return time.monotonic() if clock is None else clock()


def continuation_due() -> float:
    """The due time for the next slice of work already under way (a long prefill's next chunk):
    its task's due time, but never earlier than now. Work that has waited since before then
    (another session's first audio) goes first, so a long job gets one slice per round and holds
    the worker for at most one slice at a time, however early it was due."""
    return max(submission_due(), time.monotonic())


def detach_from_playback(*, keep_phase: bool = False) -> None:
    """From here on, compute the current task submits follows no reply's playback: due when
    submitted and never held back (`current_due`, `current_release` cleared), and counted as no
    reply's phase (`current_phase` cleared) unless `keep_phase`.

    For work a node starts in a task of its own that no listener waits on (a truncation built
    ahead, a transcript pass). Such a task inherits its node's clocks (graph/session.py), and
    under them its work would be dated by a reply it does not serve: due since that reply was
    asked for, it would go before other turns' first audio; held back until the reply's playback
    nears, it would wait on a listener it has nothing for. Call it first thing in the task: a task
    runs in a copy of the context it was started from, so the node's own clocks stay as they are."""
    current_due.set(None)
    current_release.set(None)
    if not keep_phase:
        current_phase.set(None)


class ComputePool:
    """`threads` worker threads taking the pool's most urgent work first (then in arrival order)."""

    def __init__(self, threads: int = 1):
        if threads < 0:
            raise ValueError("a compute pool needs zero (inline) or more threads")
        self._calls: list[_Entry] = []
        self.busy_s = 0.0  # seconds units have run, all workers together
        # Step-time averages and busy share, for admission by load (graph/load.py).
        self.load = ComputeLoad()
        self.trace: UnitTrace | None = None  # records every unit when set (graph/unit_trace.py)
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._batchers: list[Batcher[Any, Any]] = []
        self._workers = [threading.Thread(target=self._work, name=f"compute-{i}", daemon=True) for i in range(threads)]
        for worker in self._workers:
            worker.start()
        # threads=0: the work runs on the event loop's own thread, between its other callbacks
        # (an engine process's busy loop; see `_drive`). Started by the first queued work.
        self.inline = threads == 0
        self._driver: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    async def run(self, fn: Callable[..., Result], *args: Any, priority: int | None = None,
                  due: float | None = None) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._enqueue(self._calls, priority, due, _Pending((fn, args), future, loop), "the compute pool is shut down")
        try:
            return await future
        finally:
            # A raised exception's traceback keeps this frame; the future holds that exception.
            del future, fn, args

    def queue_depth(self) -> int:
        return len(self._calls)

    def idle(self) -> bool:
        """Nothing queued or running."""
        with self._ready:
            return not self._calls and not any(b._queue or b._running for b in self._batchers)

    def batcher(
        self,
        name: str,
        batch_fn: Callable[[list[Item]], Sequence[Result | BaseException]],
        max_batch: int = 32,
        linger_s: float = 0.0,
    ) -> Batcher[Item, Result]:
        batcher: Batcher[Item, Result] = Batcher(self, name, batch_fn, max_batch, linger_s)
        with self._ready:
            self._batchers.append(batcher)
        return batcher

    def batch_counts(self) -> dict[str, tuple[int, int]]:
        """Batches run and items they held since start, per batcher name (summed over batchers of
        one name): their ratio is the stage's mean batch size."""
        counts: dict[str, tuple[int, int]] = {}
        for batcher in list(self._batchers):
            batches, items = counts.get(batcher.name, (0, 0))
            counts[batcher.name] = (batches + batcher.batches_run, items + batcher.items_run)
        return counts

    def shutdown(self) -> None:
        """Stop taking work. Work already running finishes and delivers its result; queued calls
        and batcher items fail with RuntimeError; later `run`/`submit` calls raise it."""
        with self._ready:
            self._closed = True
            dropped, self._calls = self._calls, []
            for batcher in self._batchers:
                dropped += batcher._queue
                batcher._queue = []
            self._ready.notify_all()
        for *_, pending in dropped:
            _deliver(pending, RuntimeError("the compute pool is shut down"))
        if self._wake is not None and self._driver is not None:
            with contextlib.suppress(RuntimeError):  # its loop is gone: so is the driver
                self._driver.get_loop().call_soon_threadsafe(self._wake.set)

    def join(self, timeout: float | None = None) -> None:
        """After `shutdown`: wait for the workers to finish the work they are running (blocking).
        A native library (onnxruntime) must not be mid-call in a worker when the process exits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ workers

    def _enqueue(self, queue: list[_Entry], priority: int | None, due: float | None, pending: _Pending,
                 closed_message: str) -> None:
        """Queue a call or a batcher's item at its urgency (the task's priority and due time unless
        given); raises RuntimeError(closed_message) once the pool is shut down."""
        urgency = current_priority.get() if priority is None else priority
        with self._ready:
            if self._closed:
                raise RuntimeError(closed_message)
            pending.release = current_release.get()
            pending.priority = urgency
            phase = current_phase.get()  # the batchers read it (`_first_audio_alone`), as does a trace
            pending.phase = "other" if phase is None else phase()
            heapq.heappush(queue, (urgency, submission_due() if due is None else due, next(self._order), pending))
            self._ready.notify()
        if self.inline:
            self._wake_driver(pending.loop)

    def _pick(self, now: float) -> tuple[tuple[Batcher[Any, Any] | None, list[_Pending]] | None, float]:
        """With the lock held: the most urgent released unit of work, (None, [call]) or
        (batcher, batch), and else None with when to look again (inf: when work arrives)."""
        chosen: Batcher[Any, Any] | None = None
        best, call, wake_at = _released_head(self._calls, now)
        for batcher in self._batchers:
            if batcher._running:
                continue
            head, _, released_at = _released_head(batcher._queue, now)
            wake_at = min(wake_at, released_at)
            if head is None:
                continue
            ready_at = batcher._ready_at()
            if ready_at > now:
                wake_at = min(wake_at, ready_at)
            elif best is None or head < best:
                best, chosen = head, batcher
        if best is None:
            return None, wake_at
        if chosen is None:
            assert call is not None
            entry = self._calls.pop(call)
            heapq.heapify(self._calls)
            return (None, [entry[-1]]), now
        chosen._running = True
        return (chosen, chosen._take(now)), now

    def _next(self) -> tuple[Batcher[Any, Any] | None, list[_Pending]] | None:
        """The next unit of work for a worker thread (blocks until there is one); None once shut down."""
        with self._ready:
            while not self._closed:
                now = time.monotonic()
                work, wake_at = self._pick(now)
                if work is not None:
                    return work
                self._ready.wait(None if wake_at == math.inf else wake_at - now)
            return None

    def _run_unit(self, batcher: Batcher[Any, Any] | None, batch: list[_Pending]) -> None:
        trace = self.trace
        # What the unit is, read before the call takes its item apart.
        name = batcher.name if batcher is not None else getattr(batch[0].item[0], "__qualname__", "call")
        first_audio = any(p.phase == "first" for p in batch)
        reply = any(p.phase != "other" for p in batch)  # a reply-side stage's (PlaybackClock.phase)
        # Only live sessions' units are the load a live turn waits behind (speech requests and
        # keep-warm give way to it: graph/load.py).
        live = any(p.priority <= PRIORITY_REALTIME for p in batch)
        if trace is not None:
            phases = [p.phase for p in batch]
            cpu_started = time.thread_time()
        started = time.perf_counter()
        if batcher is None:
            _call(batch[0])
        else:
            batcher._run(batch)
            with self._ready:
                batcher._running = False
                self._ready.notify_all()  # its queued items may be the most urgent now
        ended = time.perf_counter()
        self.busy_s += ended - started
        if live:
            self.load.record(name, started, ended, first_audio, reply)
        if trace is not None:
            trace.unit(started, ended, time.thread_time() - cpu_started, name, phases)
        # A raised exception's traceback reaches this frame (f_back of the call's): it must not
        # keep the batch, and through it the callers' arguments, alive.
        del batch

    def _work(self) -> None:
        while (work := self._next()) is not None:
            self._run_unit(*work)
            # An idle worker keeps no reference to its last work: a cancelled caller's future and
            # the work's arguments hold that caller's state (a session's KV, its frames).
            del work

    # ------------------------------------------------------------------ inline (threads=0)

    def _wake_driver(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:  # queued from another thread: hop onto the loop first
            loop.call_soon_threadsafe(self._wake_driver, loop)
            return
        if self._driver is None:
            self._wake = asyncio.Event()
            self._driver = loop.create_task(self._drive(), name="compute-inline")
        assert self._wake is not None
        self._wake.set()

    async def _drive(self) -> None:
        """The engine loop of an inline pool: run the most urgent unit, then let the event loop
        run everything that unit woke (sessions take their results and queue their next steps,
        so the next batch sees them all), then the next unit. One thread, no GIL hand-offs
        between the loop and a worker (graph/engine_process.py says why that matters)."""
        assert self._wake is not None
        # asyncio's loop shows what it is about to run (uvloop does not: then a fixed number of turns)
        ready = getattr(asyncio.get_running_loop(), "_ready", None)
        while True:
            for turn in range(_INLINE_MAX_YIELDS):
                if ready is None and turn >= _INLINE_YIELDS or ready is not None and turn > 0 and not ready:
                    break
                await asyncio.sleep(0)
            with self._ready:
                if self._closed:
                    return
                now = time.monotonic()
                work, wake_at = self._pick(now)
            if work is None:
                self._wake.clear()
                timeout = None if wake_at == math.inf else max(wake_at - now, 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            self._run_unit(*work)
            del work


# Between units an inline pool lets the event loop run until nothing else is ready (at most
# _INLINE_MAX_YIELDS turns): a unit's results are settled in the first turn, the tasks waiting on
# them resume and queue their next steps, and those wake the next node in turn. A turn's next
# step is then queued before the next unit is chosen, so it is not left behind someone else's
# batch at every hop. Where the loop cannot tell (uvloop), _INLINE_YIELDS turns.
_INLINE_YIELDS = 3
_INLINE_MAX_YIELDS = 32

# A batch whose most urgent item is a turn's first-audio work due less than this long ago takes
# no item that is not due yet (`_first_audio_alone`). First-audio work is due the playback margin
# (0.2 s, graph/session.py) before its turn asked for the reply: so, 50 ms after the request.
FIRST_AUDIO_ALONE_S = 0.25

# While work is held back, the worker looks again at least this often: a release clock can move
# earlier without telling the pool (an interrupt ends the reply, and its held work must run now
# to see that).
_HELD_RECHECK_S = 0.02


def _release_at(pending: _Pending) -> float:
    """When the work may start; read from its task's clock each time (the clock can move)."""
    return -math.inf if pending.release is None else pending.release()


def _released_head(queue: list[_Entry], now: float) -> tuple[tuple[int, float, int] | None, int | None, float]:
    """(priority, due, arrival) of the queue's most urgent item that is released and whose caller
    still waits, its index in the queue, and when to look again for held-back items (inf: none
    held). Drops the cancelled items in front of it."""
    while queue and queue[0][-1].future.done():
        heapq.heappop(queue)
    if not queue:
        return None, None, math.inf
    if _release_at(queue[0][-1]) <= now:  # the common case: nothing held back in front
        return queue[0][:3], 0, math.inf
    best: tuple[int, float, int] | None = None
    index: int | None = None
    wake_at = math.inf
    for i, entry in enumerate(queue):
        if entry[-1].future.done():
            continue
        release = _release_at(entry[-1])
        if release > now:
            wake_at = min(wake_at, release, now + _HELD_RECHECK_S)
        elif best is None or entry[:3] < best:
            best, index = entry[:3], i
    return best, index, wake_at


def _first_audio_alone(head: _Entry, now: float) -> bool:
    """Whether a batch led by `head` leaves out the items that are not due yet (replies ahead of
    their listeners): when `head` is the first-audio work of a turn that has just ended. Riding
    along, they make the forward that the new turn waits on longer, for work not needed for
    hundreds of ms (docs/batching.md, rule 9). The work of a
    turn that has waited longer (turns ending together) takes riders again, so the replies that
    play meanwhile are not held back until the whole burst has its first audio. Live sessions
    only: speech requests are downloads, where batching everything ready is what pays."""
    return head[0] == PRIORITY_REALTIME and head[-1].phase == "first" and now - head[1] < FIRST_AUDIO_ALONE_S


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
    if asyncio._get_running_loop() is pending.loop:  # an inline pool: already on the caller's loop
        _settle(pending.future, result)
        return
    try:
        pending.loop.call_soon_threadsafe(_settle, pending.future, result)
    except RuntimeError:  # the caller's event loop is closed: nobody is waiting any more
        pass


class _Pending:
    __slots__ = ("item", "future", "loop", "queued_at", "release", "phase", "priority")

    def __init__(self, item: Any, future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop):
        self.item = item
        self.future = future
        self.loop = loop
        self.queued_at = time.monotonic()
        self.release: Callable[[], float] | None = None
        self.phase = "other"
        self.priority = PRIORITY_REALTIME


class Batcher(Generic[Item, Result]):
    """A shared executor that batches ready work from many sessions into one call.

    `batch_fn` returns one result per item, in order; an exception object in place of a result
    fails that item alone. If `batch_fn` itself raises, every item of that batch fails with it.
    `batch_fn` never runs twice at once. Made by `ComputePool.batcher`; runs on the pool's workers.
    """

    def __init__(self, pool: ComputePool, name: str, batch_fn: Callable[[list[Item]], Sequence[Result | BaseException]],
                 max_batch: int, linger_s: float = 0.0):
        self.name = name
        self._pool = pool
        self._batch_fn = batch_fn
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._last_batch = 0
        self._queue: list[_Entry] = []  # guarded by the pool's lock
        self._running = False
        self.batches_run = 0
        self.items_run = 0

    async def submit(self, item: Item, priority: int | None = None, due: float | None = None) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pool._enqueue(self._queue, priority, due, _Pending(item, future, loop), f"executor {self.name!r} is closed")
        # If the caller is cancelled before the batch runs, the worker skips the item.
        return await future

    def queue_depth(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ pool side (its lock held)

    def _ready_at(self) -> float:
        """When this batcher's queued items should run (see batch formation, module docstring)."""
        if self._linger_s <= 0 or len(self._queue) >= min(self._last_batch, self._max_batch):
            return 0.0
        if any(entry[-1].phase == "first" for entry in self._queue):
            return 0.0  # a turn waits for its first audio: no lingering for the others to come back
        return min(entry[-1].queued_at for entry in self._queue) + self._linger_s

    def _take(self, now: float) -> list[_Pending]:
        """Up to `max_batch` items, most urgent first: the released ones, then held-back ones
        riding along in the same call while there is room."""
        live = [entry for entry in self._queue if not entry[-1].future.done()]  # cancelled callers drop out
        live.sort(key=lambda entry: (_release_at(entry[-1]) > now, entry[:3]))
        if live and _first_audio_alone(live[0], now):
            taken, rest = [], []
            for entry in live:
                rides = entry[-1].phase == "first" or entry[1] < now
                (taken if rides and len(taken) < self._max_batch else rest).append(entry)
        else:
            taken, rest = live[: self._max_batch], live[self._max_batch :]
        heapq.heapify(rest)
        self._queue = rest
        self._last_batch = len(taken)
        return [entry[-1] for entry in taken]

    # ------------------------------------------------------------------ worker side

    def _run(self, batch: list[_Pending]) -> None:
        try:
            results: Sequence[Any] = self._batch_fn([p.item for p in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"executor {self.name!r} returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiting session
            results = [exc] * len(batch)
        self.batches_run += 1
        self.items_run += len(batch)
        for pending, result in zip(batch, results):
            _deliver(pending, result)
        del batch, results


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
