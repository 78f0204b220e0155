"""An engine process: one `GraphRuntime` (models, nodes, compute pool) serving sessions over a link.

`python -m graph.engine_process --fd N` is started by the server (graph/engine_client.py) with
one end of a socket pair. The first record names the profile; the engine builds its runtime
from it, answers `READY` (or `FAILED`), and from then on hosts the sessions the server opens:

    server -> engine                            engine -> server
    (OPEN, id, (kind, config, inputs, n))       (OPENED, id, None) | (REJECTED, id, (code, message))
    (SEND, id, (input, message))                (OUT, id, message)          graph output, in order
    (CONTROL, id, control)                      (ENDED, id, (reason, error))
    (CLOSE, id, reason)                         (STATS, "", {...})          queue depths, node step times, batch counts, load
    (DRAIN, "", grace_s)                        (DRAINED, "", None)
    (CREDIT, "", {id: n})                       (CREDIT, "", {(id, input): n})  messages taken

(the ops are graph/wire.py's `Op`).

Inputs wait in a queue per session and graph input here until the node they go to has room: a
session whose graph is backed up holds up no other session, and a reply request on `replies`
does not wait behind audio on `audio`. Controls are applied as they arrive,
ahead of that queue (an interrupt also drops the queued input of the turn it cancels).

The engine lives as long as its link: when the server process goes away the socket closes and
the engine exits. It ignores Ctrl-C (the terminal signals the whole process group; the server
drains the sessions and then closes the link).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import signal
import socket
import sys
from typing import Any

import msgspec

from graph import heap, native_heap, sched
from graph.background import spawn
from graph.errors import SessionRejected
from graph.messages import Interrupt, Message
from graph.metrics import GraphMetrics
from graph.runtime import GraphRuntime
from graph.session import GraphSession, belongs_to
from graph.wire import Link, LinkClosed, Op, Window, credit_delay_s

log = logging.getLogger("graph.engine")

STATS_INTERVAL_S = 0.5


class _StepTimes(GraphMetrics):
    """Collects node step times to ship to the server with the next stats record."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = collections.defaultdict(list)

    def node_step(self, node: str, seconds: float) -> None:
        self.steps[node].append(seconds)

    def take(self) -> dict[str, list[float]]:
        steps, self.steps = dict(self.steps), collections.defaultdict(list)
        return steps


class _Input:
    """One graph input of one session: what waits for room in its first node's inbox."""

    def __init__(self, hosted: _Hosted, name: str):
        self.name = name
        self.queue: collections.deque[Message] = collections.deque()
        self.sending = False  # a message taken off `queue` is waiting for room: later ones wait too
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(self._feed(hosted), name=f"{hosted.session.id}:{name}")

    async def _feed(self, hosted: _Hosted) -> None:
        session, key = hosted.session, (hosted.session.id, self.name)
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            message = self.queue.popleft()
            self.sending = True
            try:
                await session.send(self.name, message)
            except RuntimeError:
                return  # the session ended; the pump reports it
            except KeyError as exc:  # no such input: the server checks, so this is a bug there
                log.error("session %s: %s", session.id, exc)
            finally:
                self.sending = False
            hosted.link.credit(key)


class _Hosted:
    """One session hosted here: its queued inputs (one queue per graph input, so an automatic
    reply sent to `replies` never waits behind audio for the VAD), and the task that drains it."""

    def __init__(self, session: GraphSession, link: Link, output_window: int):
        self.session = session
        self.link = link
        self.inputs: dict[str, _Input] = {}
        self.outputs = Window(output_window)
        self.pump = asyncio.create_task(self._pump(), name=f"{session.id}:pump")

    def queue(self, input_name: str, message: Message) -> None:
        entry = self.inputs.get(input_name)
        if entry is None or not (entry.queue or entry.sending):
            # Straight into the node's inbox when it has room: no hop through the feeder task.
            try:
                if self.session.send_nowait(input_name, message):
                    self.link.credit((self.session.id, input_name))
                    return
            except RuntimeError:
                return  # the session ended; the pump reports it
            except KeyError as exc:  # no such input: the server checks, so this is a bug there
                log.error("session %s: %s", self.session.id, exc)
                self.link.credit((self.session.id, input_name))
                return
            if entry is None:
                entry = self.inputs[input_name] = _Input(self, input_name)
        entry.queue.append(message)
        entry.ready.set()

    def interrupt(self, control: Interrupt) -> None:
        for entry in self.inputs.values():
            kept = [message for message in entry.queue if not belongs_to(message, control)]
            if len(kept) != len(entry.queue):
                self.link.credit((self.session.id, entry.name), len(entry.queue) - len(kept))
                entry.queue = collections.deque(kept)

    async def _pump(self) -> None:
        session = self.session
        async for message in session.outputs():
            await self.outputs.take()
            self.link.send(Op.OUT, session.id, message)
        await session.ended.wait()
        for entry in self.inputs.values():
            entry.task.cancel()
        self.link.send(Op.ENDED, session.id, (session.end_reason, session.error))


class EngineServer:
    def __init__(self, link: Link, runtime: GraphRuntime, steps: _StepTimes):
        self.link = link
        self.runtime = runtime
        self.steps = steps
        self.hosted: dict[str, _Hosted] = {}

    async def serve(self) -> None:
        stats = asyncio.create_task(self._report_stats(), name="engine-stats")
        try:
            while True:
                for op, session_id, payload in await self.link.receive():
                    self._handle(op, session_id, payload)
        except LinkClosed:
            log.info("engine: the server closed the link; stopping (%d sessions left)", len(self.hosted))
        finally:
            stats.cancel()
            await self.runtime.stop(0)

    def _handle(self, op: str, session_id: str, payload: Any) -> None:
        hosted = self.hosted.get(session_id)
        if op is Op.SEND:
            if hosted is not None:
                hosted.queue(*payload)
            else:  # ended meanwhile: the input is dropped, its credit returned
                self.link.credit((session_id, payload[0]))
        elif op is Op.CONTROL:
            if hosted is not None:
                if isinstance(payload, Interrupt):
                    hosted.interrupt(payload)
                hosted.session.control(payload)
        elif op is Op.CREDIT:
            for credited_id, n in payload.items():
                if (target := self.hosted.get(credited_id)) is not None:
                    target.outputs.give(n)
        elif op is Op.OPEN:
            spawn(self._open(session_id, *payload), name=f"{session_id}:open")
        elif op is Op.CLOSE:
            if hosted is not None:
                hosted.outputs.open_wide()
                spawn(hosted.session.close(payload), name=f"{session_id}:close")
        elif op is Op.DRAIN:
            spawn(self._drain(payload), name="engine-drain")
        else:
            log.error("engine: unknown record %r", op)

    async def _open(self, session_id: str, kind: str, config: dict[str, Any], inputs: list[str] | None,
                    output_window: int) -> None:
        try:
            session = await self.runtime.open_session(session_id, kind, config, inputs)
        except SessionRejected as rejected:
            self.link.send(Op.REJECTED, session_id, (rejected.code, rejected.message))
            return
        except Exception as exc:  # noqa: BLE001 - a session that cannot open must not end the engine
            log.exception("engine: opening session %s failed", session_id)
            self.link.send(Op.REJECTED, session_id, ("internal_error", f"the session could not start: {exc}"))
            return
        hosted = self.hosted[session_id] = _Hosted(session, self.link, output_window)
        hosted.pump.add_done_callback(lambda _: self.hosted.pop(session_id, None))
        self.link.send(Op.OPENED, session_id)

    async def _drain(self, grace_s: float | None) -> None:
        await self.runtime.drain(grace_s)
        self.link.send(Op.DRAINED)

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            self.link.send(Op.STATS, "", {"queue_depths": self.runtime.queue_depths(), "node_steps": self.steps.take(),
                                         "batch_counts": self.runtime.batch_counts(),
                                         "node_counters": self.runtime.node_counters(),
                                         "load": msgspec.structs.asdict(self.runtime.load())})


def apply_device(profile: dict[str, Any], device: str | None) -> None:
    """Put every resource that names a `device` on this engine's device."""
    if device is None:
        return
    for resource in (profile.get("resources") or {}).values():
        params = resource.get("params") if isinstance(resource, dict) else None
        if isinstance(params, dict) and "device" in params:
            params["device"] = device


def resource_facts(runtime: GraphRuntime) -> dict[str, dict[str, Any]]:
    """What the server may read of each loaded resource without holding it (plain values only):
    the attributes the speech service reads (session_server/speech/service.py)."""
    names = ("speakers", "default_speaker", "output_sample_rate")
    return {name: {attr: getattr(resource, attr, None) for attr in names} for name, resource in runtime.resources.items()}


async def _main(fd: int, name: str) -> int:
    sock = socket.socket(fileno=fd)
    link = await Link.over(sock)
    records = await link.receive()
    _, _, start = records[0]
    profile = start["profile"]
    apply_device(profile, start.get("device"))
    steps = _StepTimes()
    try:
        # The server decides admission by load: it sees every engine's (graph/engine_client.py).
        runtime = GraphRuntime.from_config(profile, steps, inline_compute=True, admit_by_load=False)
        await runtime.start()
    except Exception as exc:  # noqa: BLE001 - reported to the server, which decides
        log.debug("%s: start failed", name, exc_info=exc)  # the server logs the one-line reason
        link.send(Op.FAILED, "", f"{type(exc).__name__}: {exc}")
        await link.drain()
        return 1
    heap.settle()  # the loaded model must not stall the loop in a full garbage collection
    native_heap.return_large_buffers()  # a long context's freed temporaries must not stay resident
    link.credit_delay_s = credit_delay_s(min(runtime.limits.edge_capacity, runtime.limits.output_capacity))
    link.send(Op.READY, "", {"resources": resource_facts(runtime), "kv_rows": runtime.kv_rows()})  # the server logs the time
    await EngineServer(link, runtime, steps).serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph.engine_process")
    parser.add_argument("--fd", type=int, required=True, help="this end of the server's socket pair")
    parser.add_argument("--name", default="engine", help="for the logs")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sched.normal_for_compute()  # the server's SCHED_BATCH is inherited; compute must not wait behind its wake-ups
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {args.name} %(name)s: %(message)s")
    # The stock loop, not uvloop: the inline compute pool reads what the loop is about to run
    # (graph/executor.py); the engine's I/O is one socket, where uvloop gains little.
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(args.fd, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
