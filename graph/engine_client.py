"""The server's side of the engine processes: a runtime whose sessions live in other processes.

`EngineRuntime` has the interface of `GraphRuntime` (`start`, `open_session`, `drain`, `stop`,
`ready`, `sessions`...) so the transports cannot tell them apart, but the graph runs in
`compute.engines` child processes (graph/engine_process.py), each with its own models, compute
pool and event loop. This process keeps the network, the protocols and audio coding; the engines
keep the model work. Each engine is a Python interpreter of its own, so the server uses as many
cores (or GPUs, one per engine with `compute.devices`) as it has engines plus one.

Sessions are spread across engines: a new session goes to the ready engine hosting the fewest
(data parallel, as vLLM's and SGLang's engine replicas; a session's KV never leaves its engine)
among those that have a free KV row and, with `limits.first_audio_goal_ms`, whose last reported
load (graph/load.py; every 0.5 s with the engine's stats) says they can give one more speaking
session its first audio within the goal. None can: `session_limit_reached`.

An engine that dies (a crash, the OOM killer) ends each of its sessions with the error
`engine_failed`; the server stays up, starts a new engine in its place, and meanwhile sends new
sessions to the others (none left: `server_not_ready`, /health 503 until it is back).

`RemoteSession` mirrors `GraphSession` for a transport: `send` (waits while the session's
window of unconsumed inputs is full: backpressure across the process boundary), `control`
(overtakes queued input, here and in the engine), `outputs`, `close`, `error`, `end_reason`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

from graph.errors import SessionRejected
from graph.limits import SessionLimits
from graph.load import EngineLoads, LoadSnapshot
from graph.messages import AudioChunk, Close, Control, Interrupt, Message
from graph.metrics import GraphMetrics
from graph.session import belongs_to
from graph.runtime import admit, capacity_of, validated_spec, wait_for_slot
from graph.spec import GraphSpec
from graph.wire import Link, LinkClosed, Op, Window, credit_delay_s

log = logging.getLogger("graph.engines")

# Audio bound for one engine goes out together, at most AUDIO_BATCH_S after the first chunk:
# one frame (a write, a read, a wake-up of the engine) per few milliseconds instead of one per
# 20 ms chunk per session, and the sessions' VAD windows reach the engine together and share a
# model call. What the VAD hears is late by at most this much; anything else (a control, a
# reply request) goes at the end of the loop turn and takes the waiting audio with it.
AUDIO_BATCH_S = 0.005

# How long a failed engine waits before it is started again (a crash loop must not spin).
RESTART_DELAY_S = 1.0


class RemoteSession:
    def __init__(self, session_id: str, kind: str, engine: EngineHandle, input_window: int, inputs: frozenset[str]):
        self.id = session_id
        self.kind = kind
        self.engine = engine
        # Inputs in flight per graph input (each has its own window, as each has its own edge).
        self._input_windows = {name: Window(input_window) for name in inputs}
        self._output: collections.deque[Message] = collections.deque()
        self._has_output = asyncio.Event()
        self._closing = False
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self.error: tuple[str, str] | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    async def send(self, input_name: str, message: Message) -> None:
        """Put a message into a graph input. Waits while the session's input window is full."""
        await self._window(input_name).take()  # once the session has ended, every window is wide open
        self._send(input_name, message)

    def send_nowait(self, input_name: str, message: Message) -> bool:
        """`send` if the input's window has room now; False (nothing sent) if it is full."""
        if not self._window(input_name).try_take():
            return False
        self._send(input_name, message)
        return True

    def _window(self, input_name: str) -> Window:
        window = self._input_windows.get(input_name)
        if window is None:
            raise KeyError(f"this session does not use input {input_name!r}")
        return window

    def _send(self, input_name: str, message: Message) -> None:
        if self._closing or self.ended.is_set():
            raise RuntimeError(f"session {self.id} is closed")
        message.session_id = self.id
        if isinstance(message, AudioChunk) and message.received_at is None:
            message.received_at = time.monotonic()  # CLOCK_MONOTONIC: the same clock in the engine
        self.engine.link.send(Op.SEND, self.id, (input_name, message), within_s=AUDIO_BATCH_S if isinstance(message, AudioChunk) else 0.0)

    def control(self, control: Control) -> None:
        """Deliver a control now, ahead of queued input and output."""
        if self._closing or self.ended.is_set():
            return
        control.session_id = self.id
        if isinstance(control, Interrupt):
            kept = [m for m in self._output if not belongs_to(m, control)]
            if len(kept) != len(self._output):
                self.engine.link.credit(self.id, len(self._output) - len(kept))
                self._output = collections.deque(kept)
        if isinstance(control, Close):
            self._closing = True
        self.engine.link.send(Op.CONTROL, self.id, control)

    async def outputs(self) -> AsyncIterator[Message]:
        """Messages from the graph's outputs, in order; ends once the session has ended."""
        while True:
            while not self._output:
                if self.ended.is_set():
                    return
                self._has_output.clear()
                await self._has_output.wait()
            message = self._output.popleft()
            self.engine.link.credit(self.id)
            yield message

    async def close(self, reason: str = "closed") -> None:
        """End the session and wait until the engine has freed it. Idempotent."""
        if not self._closing and not self.ended.is_set():
            self._closing = True
            self.engine.link.send(Op.CLOSE, self.id, reason)
        await self.ended.wait()

    # ------------------------------------------------------------------ from the engine

    def _received(self, message: Message) -> None:
        self._output.append(message)
        self._has_output.set()

    def _credited(self, input_name: str, n: int) -> None:
        self._input_windows[input_name].give(n)

    def _end(self, reason: str | None, error: tuple[str, str] | None) -> None:
        if self.ended.is_set():
            return
        self.end_reason = reason or "closed"
        self.error = error
        self.ended.set()
        for window in self._input_windows.values():
            window.open_wide()
        self._has_output.set()


class EngineHandle:
    """One engine process: its link, the sessions it hosts, and what it last reported."""

    def __init__(self, index: int, device: str | None):
        self.index = index
        self.name = f"engine-{index}"
        self.device = device
        self.process: subprocess.Popen[bytes] | None = None
        self.link: Link = None  # type: ignore[assignment]  # set by start()
        self.ready = False
        self.sessions: dict[str, RemoteSession] = {}
        self.facts: dict[str, Any] = {}
        self.queue_depths: dict[str, int] = {}
        self.batch_counts: dict[str, tuple[int, int]] = {}  # since this engine started
        self.node_counters: dict[str, dict[str, int]] = {}  # likewise
        self.load = EngineLoads()  # its last reported load and the sessions admitted since
        self._replies: dict[str, asyncio.Future[Any]] = {}
        self._drained: asyncio.Future[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self, profile: dict[str, Any], log_level: str) -> None:
        """Spawn the process and wait until its runtime is loaded and warm."""
        parent, child = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "graph.engine_process", "--fd", str(child.fileno()),
                 "--name", self.name, "--log-level", log_level],
                pass_fds=(child.fileno(),),
                start_new_session=True,  # the terminal's Ctrl-C goes to the server, which drains
            )
        finally:
            child.close()
        self.link = await Link.over(parent)
        self.link.send(Op.START, "", {"profile": profile, "device": self.device})  # pickled: a copy
        try:
            records = await self.link.receive()
        except LinkClosed:
            code = await asyncio.to_thread(self.process.wait)
            raise RuntimeError(f"{self.name} exited with code {code} while starting") from None
        op, _, payload = records[0]
        if op is not Op.READY:
            raise RuntimeError(f"{self.name} failed to start: {payload}")
        self.facts = payload
        self.load = EngineLoads()
        self.ready = True

    def capacity(self, limits: SessionLimits, kind: str = "realtime") -> int:
        """Sessions of `kind` this engine may host (graph/runtime.py `capacity_of`)."""
        return capacity_of(limits, kind, self.facts.get("kv_rows"), self.count)

    def count(self, kind: str) -> int:
        return sum(1 for session in self.sessions.values() if session.kind == kind)

    async def request_open(self, session: RemoteSession, config: dict[str, Any] | None, inputs: list[str] | None,
                           output_window: int) -> None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[session.id] = future
        self.sessions[session.id] = session
        self.link.send(Op.OPEN, session.id, (session.kind, dict(config or {}), inputs, output_window))
        try:
            op, payload = await future
        except BaseException:
            self.sessions.pop(session.id, None)
            raise
        finally:
            self._replies.pop(session.id, None)
        if op is Op.REJECTED:
            self.sessions.pop(session.id, None)
            raise SessionRejected(*payload)

    async def drain(self, grace_s: float | None) -> None:
        if not self.ready or self.link.closed:
            return
        self._drained = asyncio.get_running_loop().create_future()
        self.link.send(Op.DRAIN, "", grace_s)
        with contextlib.suppress(LinkClosed):
            await self._drained

    async def read(self, metrics: GraphMetrics, on_session_end) -> None:
        """Route the engine's records until its link closes."""
        try:
            while True:
                for op, session_id, payload in await self.link.receive():
                    if op is Op.OUT:
                        if (session := self.sessions.get(session_id)) is not None:
                            session._received(payload)
                    elif op is Op.CREDIT:
                        for (credited_id, input_name), n in payload.items():
                            if (session := self.sessions.get(credited_id)) is not None:
                                session._credited(input_name, n)
                    elif op is Op.ENDED:
                        if (session := self.sessions.pop(session_id, None)) is not None:
                            session._end(*payload)
                            on_session_end(session)
                    elif op in (Op.OPENED, Op.REJECTED):
                        if (future := self._replies.get(session_id)) is not None and not future.done():
                            future.set_result((op, payload))
                    elif op is Op.STATS:
                        self.queue_depths = payload["queue_depths"]
                        self.batch_counts = payload.get("batch_counts", {})
                        self.node_counters = payload.get("node_counters", {})
                        for node, seconds in payload["node_steps"].items():
                            metrics.node_steps(node, seconds)
                        if "load" in payload:
                            self.load.report(LoadSnapshot(**payload["load"]))
                    elif op is Op.DRAINED:
                        if self._drained is not None and not self._drained.done():
                            self._drained.set_result(None)
        except LinkClosed:
            pass
        finally:
            self.ready = False

    def fail_sessions(self, code: str, message: str, on_session_end) -> None:
        for future in self._replies.values():
            if not future.done():
                future.set_result((Op.REJECTED, (code, message)))
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        sessions, self.sessions = self.sessions, {}
        for session in sessions.values():
            session._end(f"error: {code}", (code, message))
            on_session_end(session)


class EngineRuntime:
    """`GraphRuntime`'s interface over `spec.compute_engines` engine processes."""

    def __init__(self, spec: GraphSpec, profile: dict[str, Any], metrics: GraphMetrics | None = None,
                 log_level: str = "info"):
        self.spec = spec
        self.limits = spec.limits
        self.metrics = metrics or GraphMetrics()
        self._profile = profile
        self._log_level = log_level
        count = max(1, spec.compute_engines)
        devices = spec.compute_devices or (None,) * count
        self.engines = [EngineHandle(i, devices[i]) for i in range(count)]
        self.sessions: dict[str, RemoteSession] = {}
        self.started = False
        self.shutting_down = False
        self._watchers: list[asyncio.Task[None]] = []
        self._inputs = frozenset(spec.inputs)

    @classmethod
    def from_config(cls, profile: dict[str, Any], metrics: GraphMetrics | None = None, log_level: str = "info") -> EngineRuntime:
        """Parse and validate the profile here, before any engine starts (a bad one fails fast)."""
        return cls(validated_spec(profile), profile, metrics, log_level)

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def ready(self) -> bool:
        return self.started and any(engine.ready for engine in self.engines)

    @property
    def resources(self) -> dict[str, Any]:
        """Plain facts about the first engine's resources (speakers, output rate)."""
        from types import SimpleNamespace

        facts = next((e.facts for e in self.engines if e.facts), {})
        return {name: SimpleNamespace(**values) for name, values in facts.get("resources", {}).items()}

    def engine_pids(self) -> list[int]:
        return [engine.pid for engine in self.engines if engine.pid is not None and engine.ready]

    async def start(self) -> None:
        # The first engine alone: it may build the embedded checkpoint into the shared cache.
        await self._start_engine(self.engines[0])
        await asyncio.gather(*(self._start_engine(engine) for engine in self.engines[1:]))
        self.started = True

    async def _start_engine(self, engine: EngineHandle) -> None:
        started = time.perf_counter()
        log.info("starting %s%s ...", engine.name, f" on {engine.device}" if engine.device else "")
        await engine.start(self._profile, self._log_level)
        engine.link.credit_delay_s = credit_delay_s(min(self.limits.edge_capacity, self.limits.output_capacity))
        log.info("%s: ready in %.2fs (pid %s)", engine.name, time.perf_counter() - started, engine.pid)
        self._watchers.append(asyncio.create_task(self._watch(engine), name=f"{engine.name}-watch"))

    async def _watch(self, engine: EngineHandle) -> None:
        await engine.read(self.metrics, self._forget)
        if self.shutting_down and not engine.sessions:
            return
        assert engine.process is not None
        code = await asyncio.to_thread(engine.process.wait)
        log.error("%s (pid %s) ended unexpectedly with code %s; ending its %d sessions",
                  engine.name, engine.pid, code, len(engine.sessions))
        engine.fail_sessions("engine_failed", f"The engine serving this session stopped unexpectedly (exit code {code}); please reconnect.",
                             self._forget)
        while not self.shutting_down:
            await asyncio.sleep(RESTART_DELAY_S)
            try:
                await self._start_engine(engine)
                return
            except Exception:  # noqa: BLE001 - keep trying; the other engines keep serving
                log.exception("restarting %s failed", engine.name)

    def capacity(self, kind: str) -> int:
        if kind != "realtime":
            return self.limits.max_speech_sessions
        # Each engine's cap and KV rows, the safety cap for the whole server.
        engines = [engine for engine in self.engines if engine.ready] or self.engines
        return min(self.limits.max_sessions, sum(engine.capacity(self.limits) for engine in engines))

    def first_audio_estimate_s(self) -> float:
        """The first audio one more speaking session would get on the least loaded ready engine
        with a free row (inf: none has a row)."""
        return min((engine.load.estimate_s() for engine in self._open_engines()), default=math.inf)

    def _engine_for(self, kind: str) -> EngineHandle:
        """The engine the next session of `kind` goes to (after `admit`): the ready one hosting the
        fewest, among those with a free row and room in their load for a live one."""
        candidates = [engine for engine in self.engines if engine.ready]
        if kind == "realtime":
            goal = self.limits.first_audio_goal_s
            candidates = [engine for engine in self._open_engines() if engine.load.admits(goal)]
            if not candidates:  # `admit` judged the best of them; only a tie of full engines gets here
                raise SessionRejected("session_limit_reached", "Every engine is full or too busy for another session; try again later.")
        engine = min(candidates, key=lambda e: (len(e.sessions), e.index))
        if kind == "realtime":
            engine.load.admitted_since += 1
        return engine

    def _open_engines(self) -> list[EngineHandle]:
        """Ready engines with a free row for a live session."""
        return [e for e in self.engines if e.ready and e.count("realtime") < e.capacity(self.limits)]

    def count(self, kind: str) -> int:
        return sum(1 for session in self.sessions.values() if session.kind == kind)

    async def open_session(self, session_id: str, kind: str = "realtime", config: dict[str, Any] | None = None,
                           inputs: Collection[str] | None = None) -> RemoteSession:
        """As `GraphRuntime.open_session`: `inputs` (None: all) are the graph inputs it will use."""
        await wait_for_slot(self, kind)
        ready = [engine for engine in self.engines if engine.ready]
        admit(self, session_id, kind, inputs, loaded=self.started and bool(ready))
        engine = self._engine_for(kind)
        used = frozenset(inputs) if inputs is not None else self._inputs
        session = RemoteSession(session_id, kind, engine, self.limits.edge_capacity, used)
        self.sessions[session_id] = session  # before any await: a concurrent open sees the slot taken
        try:
            await engine.request_open(session, config, None if inputs is None else sorted(used), self.limits.output_capacity)
        except BaseException:
            self.sessions.pop(session_id, None)
            raise
        self.metrics.session_started(kind)
        return session

    def _forget(self, session: RemoteSession) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.metrics.session_ended(session.kind, (session.end_reason or "closed").split(":", 1)[0])

    def batch_counts(self) -> dict[str, tuple[int, int]]:
        totals: dict[str, tuple[int, int]] = {}
        for engine in self.engines:
            for name, (batches, items) in engine.batch_counts.items():
                before = totals.get(name, (0, 0))
                totals[name] = (before[0] + batches, before[1] + items)
        return totals

    def node_counters(self) -> dict[str, dict[str, int]]:
        totals: dict[str, dict[str, int]] = {}
        for engine in self.engines:
            for node, counts in engine.node_counters.items():
                node_totals = totals.setdefault(node, {})
                for event, n in counts.items():
                    node_totals[event] = node_totals.get(event, 0) + n
        return totals

    def queue_depths(self) -> dict[str, int]:
        totals = dict.fromkeys(self.spec.nodes, 0)
        for engine in self.engines:
            for node, n in engine.queue_depths.items():
                totals[node] = totals.get(node, 0) + n
        return totals

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop admitting sessions; each engine lets open replies finish, then closes the rest."""
        self.shutting_down = True
        await asyncio.gather(*(engine.drain(grace_s) for engine in self.engines))
        remaining = [session.ended.wait() for session in list(self.sessions.values())]
        if remaining:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*remaining), 5.0)

    async def stop(self, grace_s: float | None = None) -> None:
        await self.drain(grace_s)
        for engine in self.engines:
            if engine.link is not None:
                engine.link.close()
        for engine in self.engines:
            if engine.process is not None:
                try:
                    await asyncio.wait_for(asyncio.to_thread(engine.process.wait), 30.0)
                except TimeoutError:
                    log.warning("%s did not exit; killing it", engine.name)
                    engine.process.kill()
                    await asyncio.to_thread(engine.process.wait)
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self.started = False

