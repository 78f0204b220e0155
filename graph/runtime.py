"""The loaded graph: resources and nodes built once, a `GraphSession` per live session.

Startup (`start`) imports the node modules a profile names, validates the spec, builds shared
resources (loaded models) in a worker thread, starts every node (load + warm-up), and only then
reports ready. Each stage is logged with its duration, so someone waiting on a large checkpoint
sees progress.

Admission: live (`realtime`) sessions are capped by `limits.effective_max_sessions` (a safety
cap and the KV budget) and by what the nodes' KV allocated at start holds (`Node.kv_rows`);
stateless speech requests (`speech`) by `limits.max_speech_sessions`. Past either, `open_session`
waits up to `SLOT_WAIT_S` (1 s) for a closing session to free its slot, then raises
`SessionRejected` and nothing is allocated. A live session is also refused, at once, when the
compute could not give its turns their first audio within `limits.first_audio_goal_ms` once it
speaks too (graph/load.py: from the pool's measured step times and the sessions speaking).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from graph import registry
from graph.errors import SessionRejected
from graph.executor import PRIORITY_IDLE, ComputePool
from graph.limits import SessionLimits
from graph.load import ComputeLoad, LoadSnapshot, first_audio_estimate_s
from graph.messages import ReplyParams, Turn, TurnDone
from graph.metrics import GraphMetrics
from graph.node import Node, NodeContext, SessionInfo
from graph.session import GraphSession, Wiring
from graph.spec import GraphSpec, parse_spec, validate_spec
from graph.unit_trace import UnitTrace

log = logging.getLogger("graph.runtime")

SESSION_KINDS = ("realtime", "speech")

# Keep-warm runs only on an engine whose compute was busy less than this share of the last interval.
KEEP_WARM_MAX_BUSY = 0.25


class GraphRuntime:
    def __init__(self, spec: GraphSpec, metrics: GraphMetrics | None = None, inline_compute: bool = False,
                 admit_by_load: bool = True):
        """`admit_by_load` False: this runtime leaves the first-audio goal to its caller (an
        engine: the server decides, seeing every engine's load)."""
        self.spec = spec
        self.admit_by_load = admit_by_load
        self.limits = spec.limits
        self.metrics = metrics or GraphMetrics()
        # inline: compute runs on this event loop's thread (an engine process, whose loop only
        # serves the graph); else on `compute.threads` workers, off the loop.
        self.compute = ComputePool(0 if inline_compute else spec.compute_threads)
        if spec.compute_unit_trace is not None:
            self.compute.trace = UnitTrace(spec.compute_unit_trace)
        self.resources: dict[str, Any] = {}
        self.nodes: dict[str, Node] = {}
        self.sessions: dict[str, GraphSession] = {}
        self.ready = False
        self.shutting_down = False
        self._wiring: Wiring | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._warmer: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, profile: dict[str, Any], metrics: GraphMetrics | None = None,
                    inline_compute: bool = False, admit_by_load: bool = True) -> GraphRuntime:
        """Parse a profile and validate it fully (types, streams, cycles) before anything loads."""
        return cls(validated_spec(profile), metrics, inline_compute, admit_by_load)

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    async def start(self) -> None:
        for name, resource in self.spec.resources.items():
            factory = registry.resource_factory(resource.type)
            assert factory is not None  # validated
            with _stage(f"loading resource {name} ({resource.type})"):
                self.resources[name] = await self.compute.run(factory, resource.params)
        context = NodeContext(self.resources, self.compute, self.limits, self.spec.compute_graphs)
        for name, node_spec in self.spec.nodes.items():
            cls = registry.node_class(node_spec.type)
            assert cls is not None  # validated
            with _stage(f"starting node {name} ({node_spec.type})"):
                node = cls(name, node_spec.params, context)
                await node.start()
            self.nodes[name] = node
        self._wiring = Wiring.from_spec(self.spec)
        warmup = self.spec.extra.get("warmup")
        if warmup:
            with _stage("warming up (one reply through the graph)"):
                await self._warm_up(warmup)
        self._reaper = asyncio.create_task(self._reap_expired_sessions(), name="session-reaper")
        if self.spec.compute_keep_warm_s is not None:
            units = [unit for node in self.nodes.values() if (unit := node.keep_warm()) is not None]
            self._warmer = asyncio.create_task(self._keep_warm(units, self.spec.compute_keep_warm_s), name="keep-warm")
        # The load of serving starts now: loading and warm-ups are not it.
        self.compute.load = ComputeLoad(since=time.perf_counter())
        self.ready = True

    async def _keep_warm(self, units: list[Any], interval_s: float) -> None:
        """While a live session is open and nothing else waits, run the nodes' `keep_warm` units
        every `interval_s`. After a few seconds of other work (or none), a CPU has evicted what a
        turn's first stages touch, and the turn's first units then run several times their warm
        time (docs/batching.md, rule 13). Under
        load the stages run all the time and this does not run: only while the compute was busy
        less than `KEEP_WARM_MAX_BUSY` of the last interval (one session's VAD is ~2%). Nor for
        sessions whose turns are prefilled in their pause (`GraphSession.warms_ahead`: server
        VAD with early prefill): that prefill warms the same stages just before the turn ends."""
        busy_before = self.compute.busy_s
        while True:
            await asyncio.sleep(interval_s)
            busy, busy_before = self.compute.busy_s - busy_before, self.compute.busy_s
            if busy > KEEP_WARM_MAX_BUSY * interval_s:
                continue  # a busy engine's stages are warm already, and it needs the CPU
            if not any(session.kind == "realtime" and not session.warms_ahead() for session in self.sessions.values()):
                continue  # no live session, or each one's turns are prefilled in their pause (warm then)
            for unit in units:
                if not self.compute.idle():
                    break
                try:
                    await self.compute.run(unit, priority=PRIORITY_IDLE)
                except Exception:  # noqa: BLE001 - keeping warm is best effort; sessions never see it
                    log.exception("a keep-warm unit failed; no more keeping warm")
                    return

    async def _warm_up(self, warmup: dict[str, Any]) -> None:
        """Run one spoken reply through the graph so the first real session pays no first-call costs.

        Profile: `warmup: {input: speech, text: "Hello."}` sends a speech turn into that input and
        waits for its TurnDone.
        """
        assert self._wiring is not None
        used = self._wiring.reached_from([warmup.get("input", "speech")])
        session = GraphSession(
            SessionInfo("warmup", "speech", {}), {name: node for name, node in self.nodes.items() if name in used}, self._wiring,
            self.limits.edge_capacity, self.limits.output_capacity, self.metrics,
        )
        await session.start()
        try:
            reply = ReplyParams(response_id="warmup")
            await session.send(warmup.get("input", "speech"), Turn(role="assistant", speak=True, text=warmup.get("text", "Hello."), reply=reply))
            async with asyncio.timeout(float(warmup.get("timeout_s", 300))):
                async for message in session.outputs():
                    if isinstance(message, TurnDone):
                        if message.status == "failed":
                            raise RuntimeError(f"warm-up reply failed: {message.reason}")
                        break
            if session.error:
                raise RuntimeError(f"warm-up failed: {session.error[1]}")
        finally:
            await session.close("warmup_done")

    def capacity(self, kind: str) -> int:
        return capacity_of(self.limits, kind, self.kv_rows(), self.count)

    def kv_rows(self) -> int | None:
        """Live sessions the nodes' KV allocated at start holds (the fewest rows of any node's
        preallocated cache: the thinker's and the talker's); None: every node's KV grows."""
        rows = [n for node in self.nodes.values() if (n := node.kv_rows()) is not None]
        return min(rows) if rows else None

    def count(self, kind: str) -> int:
        return sum(1 for session in self.sessions.values() if session.kind == kind)

    def speaking(self) -> int:
        """Live sessions with a reply in flight (graph/replies.py)."""
        return sum(1 for session in self.sessions.values() if session.kind == "realtime" and len(session.replies))

    def load(self) -> LoadSnapshot:
        """This runtime's compute load now (graph/load.py)."""
        return self.compute.load.snapshot(time.perf_counter(), self.speaking())

    def first_audio_estimate_s(self) -> float:
        """The first audio one more speaking session would get here (0 when admission by load
        is left to the caller)."""
        return first_audio_estimate_s(self.load()) if self.admit_by_load else 0.0

    def batch_counts(self) -> dict[str, tuple[int, int]]:
        """(batches run, items batched) per shared executor since start (for metrics)."""
        return self.compute.batch_counts()

    def node_counters(self) -> dict[str, dict[str, int]]:
        """Each node's `counters()` since start, by node name (for metrics)."""
        return {name: counts for name, node in self.nodes.items() if (counts := node.counters())}

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each node's inboxes, all sessions together (for metrics)."""
        totals = dict.fromkeys(self.spec.nodes, 0)
        for session in list(self.sessions.values()):
            for node, n in session.queue_depths().items():
                totals[node] += n
        return totals

    async def open_session(self, session_id: str, kind: str = "realtime", config: dict[str, Any] | None = None,
                           inputs: Collection[str] | None = None) -> GraphSession:
        """`inputs`: the graph inputs the session will use (None: all); it opens only the nodes
        those reach (a speech request: no VAD, no dialog)."""
        await wait_for_slot(self, kind)
        admit(self, session_id, kind, inputs, loaded=self.ready and self._wiring is not None)
        assert self._wiring is not None
        used = self._wiring.reached_from(inputs if inputs is not None else self.spec.inputs)
        session = GraphSession(
            SessionInfo(session_id, kind, config),
            {name: node for name, node in self.nodes.items() if name in used},
            self._wiring,
            self.limits.edge_capacity,
            self.limits.output_capacity,
            self.metrics,
            on_closed=self._forget,
            # Live listeners play in real time; a speech request is a download: never held back.
            lookahead_s=self.spec.compute_lookahead_s if kind == "realtime" else None,
            trace=self.compute.trace,
        )
        # Registered before any await so a concurrent open sees the slot as taken.
        self.sessions[session_id] = session
        try:
            await session.start()
        except BaseException:
            self.sessions.pop(session_id, None)
            raise
        self.metrics.session_started(kind)
        log.info("session %s started (%s)", session_id, kind)
        return session

    def _forget(self, session: GraphSession) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.metrics.session_ended(session.kind, _reason_label(session.end_reason))
            log.info(
                "session %s ended (%s): duration %.1fs, turns %d, reason %s",
                session.id,
                session.kind,
                time.monotonic() - session.started_at,
                session.turns,
                session.end_reason,
            )

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop admitting sessions, let open replies finish (up to the grace period), close the rest."""
        self.shutting_down = True
        grace = self.limits.shutdown_grace_s if grace_s is None else grace_s
        sessions = list(self.sessions.values())
        if sessions:
            log.info("draining %d sessions (grace %.1fs)", len(sessions), grace)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(s.wait_replies_done() for s in sessions)), grace)
        await asyncio.gather(*(s.close("server_shutdown") for s in list(self.sessions.values())))

    async def stop(self, grace_s: float | None = None) -> None:
        await self.drain(grace_s)
        for task in (self._reaper, self._warmer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for node in self.nodes.values():
            try:
                await node.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                log.exception("stopping node %s failed", node.name)
        self.compute.shutdown()
        await asyncio.to_thread(self.compute.join, 30.0)
        if self.compute.trace is not None:
            log.info("unit trace written to %s", self.compute.trace.write())
        self.ready = False

    async def _reap_expired_sessions(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if now - session.started_at > self.limits.max_session_s:
                    await session.close("max_duration_reached")
                elif now - session.last_input_at > self.limits.idle_timeout_s and not session.replies:
                    await session.close("idle_timeout")
            session = None  # an ended session must not stay reachable from the sleeping reaper


def validated_spec(profile: dict[str, Any]) -> GraphSpec:
    """A profile parsed and validated fully (types, streams, cycles): its node modules imported."""
    spec = parse_spec(profile)
    registry.import_modules(spec.imports)
    validate_spec(spec)
    return spec


# How long an open waits for a slot when the server is full. A client that closes and reconnects
# at once must get its slot back: its old session ends a few ms after the close reaches the
# transport (and, with engines, once the engine has freed its KV row), not before the reconnect.
SLOT_WAIT_S = 1.0


async def wait_for_slot(runtime: Any, kind: str) -> None:
    """Return once `runtime` has a free slot of `kind`, or after SLOT_WAIT_S (then `admit` refuses)."""
    if kind not in SESSION_KINDS or runtime.count(kind) < runtime.capacity(kind):
        return
    deadline = time.monotonic() + SLOT_WAIT_S
    while runtime.count(kind) >= runtime.capacity(kind) and time.monotonic() < deadline and not runtime.shutting_down:
        await asyncio.sleep(0.01)


def capacity_of(limits: SessionLimits, kind: str, kv_rows: int | None, count: Callable[[str], int]) -> int:
    """Sessions of `kind` one runtime may host: its caps, and where its KV was allocated at start,
    the rows the sessions of the other kind leave (live sessions and speech requests both hold a
    row while they run)."""
    cap = limits.effective_max_sessions if kind == "realtime" else limits.max_speech_sessions
    if kv_rows is None:
        return cap
    return max(0, min(cap, kv_rows - count("speech" if kind == "realtime" else "realtime")))


def free_slots(runtime: Any) -> int:
    """Live sessions `runtime` (a GraphRuntime or an EngineRuntime) could admit now: its free
    rows, or none while it is too busy for the first-audio goal (what `/ready` and the free-slots
    gauge read, so that a proxy or an autoscaler sees a busy replica as full)."""
    goal = runtime.limits.first_audio_goal_s
    if goal is not None and runtime.first_audio_estimate_s() > goal:
        return 0
    return max(0, runtime.capacity("realtime") - runtime.count("realtime"))


def admit(runtime: Any, session_id: str, kind: str, inputs: Collection[str] | None, loaded: bool) -> None:
    """Raise why `runtime` (a GraphRuntime or an EngineRuntime) cannot open this session now:
    SessionRejected with the code a client sees, or ValueError for a caller's mistake."""
    if kind not in SESSION_KINDS:
        raise ValueError(f"unknown session kind {kind!r}")
    unknown = sorted(set(inputs or ()) - set(runtime.spec.inputs))
    if unknown:
        raise ValueError(f"graph has no input {unknown[0]!r}")
    if runtime.shutting_down:
        raise SessionRejected("server_shutting_down", "The server is shutting down and accepts no new sessions.")
    if not loaded:
        raise SessionRejected("server_not_ready", "The server is still loading the model.")
    if session_id in runtime.sessions:
        raise SessionRejected("session_exists", f"Session {session_id!r} already exists.")
    capacity = runtime.capacity(kind)
    if runtime.count(kind) >= capacity:
        if kind == "realtime":
            raise SessionRejected(
                "session_limit_reached",
                f"The server already runs its maximum of {capacity} concurrent sessions; try again later.",
            )
        raise SessionRejected("speech_capacity_reached", f"The server already serves {capacity} speech requests.")
    goal = runtime.limits.first_audio_goal_s
    if kind == "realtime" and goal is not None and (estimate := runtime.first_audio_estimate_s()) > goal:
        raise SessionRejected(
            "session_limit_reached",
            f"The server is too busy to answer another session within its first-audio goal of {goal * 1000:.0f} ms "
            f"({_ms(estimate)} estimated); try again later.",
        )


def _ms(seconds: float) -> str:
    return "no time it could keep" if seconds == float("inf") else f"{seconds * 1000:.0f} ms"


def _reason_label(reason: str | None) -> str:
    # Keeps metric label cardinality bounded: "error: internal_error" -> "error".
    return (reason or "closed").split(":", 1)[0]


@contextlib.contextmanager
def _stage(what: str):
    log.info("%s ...", what)
    started = time.perf_counter()
    yield
    log.info("%s: done in %.2fs", what, time.perf_counter() - started)
