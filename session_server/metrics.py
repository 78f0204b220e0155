"""Prometheus metrics for the server, fed by the graph's metric hooks and the transports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from graph.metrics import GraphMetrics

if TYPE_CHECKING:
    from graph.runtime import GraphRuntime

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics(GraphMetrics):
    """One registry per server (tests run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._started = Counter("sgl_omni_sessions_started", "Sessions started", ["kind"], registry=self.registry)
        self._ended = Counter("sgl_omni_sessions_ended", "Sessions ended, by reason", ["kind", "reason"], registry=self.registry)
        self._node_step = Histogram(
            "sgl_omni_node_step_seconds", "Time a node took to handle one message", ["node"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self._first_audio = Histogram(
            "sgl_omni_time_to_first_audio_seconds",
            "From the end of the user's turn (speech stopped / commit / request) to the first reply audio sent",
            ["transport"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def watch(self, runtime_getter: Callable[[], GraphRuntime | None], free_slots: Callable[[], int] | None = None) -> None:
        self.registry.register(_RuntimeCollector(runtime_getter, free_slots))

    def session_started(self, kind: str) -> None:
        self._started.labels(kind).inc()

    def session_ended(self, kind: str, reason: str) -> None:
        self._ended.labels(kind, reason).inc()

    def node_step(self, node: str, seconds: float) -> None:
        self._node_step.labels(node).observe(seconds)

    def node_steps(self, node: str, seconds: list[float]) -> None:
        observe = self._node_step.labels(node).observe
        for value in seconds:
            observe(value)

    def first_audio(self, transport: str, seconds: float) -> None:
        self._first_audio.labels(transport).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RuntimeCollector(Collector):
    """Gauges read from the runtime at scrape time (nothing to keep in sync)."""

    def __init__(self, runtime_getter: Callable[[], GraphRuntime | None], free_slots: Callable[[], int] | None = None):
        self._runtime = runtime_getter
        self._free_slots = free_slots

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        runtime = self._runtime()
        active = GaugeMetricFamily("sgl_omni_active_sessions", "Sessions open now", labels=["kind"])
        depth = GaugeMetricFamily("sgl_omni_node_queue_depth", "Messages waiting in each node's inboxes, all sessions", labels=["node"])
        if runtime is not None:
            for kind in ("realtime", "speech"):
                active.add_metric([kind], runtime.count(kind))
            for node, n in runtime.queue_depths().items():
                depth.add_metric([node], n)
        # Counters kept by the engines; an engine restarted after a crash starts again from zero.
        batches = CounterMetricFamily("sgl_omni_batches", "Batched model calls run, per shared executor", labels=["executor"])
        items = CounterMetricFamily("sgl_omni_batch_items", "Items (session steps) those calls held, per shared executor",
                                    labels=["executor"])
        events = CounterMetricFamily("sgl_omni_node_events", "Events the nodes count (the thinker's early prefills by outcome)",
                                     labels=["node", "event"])
        if runtime is not None:
            for name, (runs, held) in sorted(runtime.batch_counts().items()):
                batches.add_metric([name], runs)
                items.add_metric([name], held)
            for node, counts in sorted(runtime.node_counters().items()):
                for event, n in sorted(counts.items()):
                    events.add_metric([node, event], n)
        yield active
        yield depth
        yield batches
        yield items
        yield events
        if self._free_slots is not None:
            # What autoscalers and `/ready` read: realtime sessions this replica can still admit.
            yield GaugeMetricFamily("sgl_omni_free_session_slots", "Realtime sessions this server can still admit",
                                    value=self._free_slots() if runtime is not None and runtime.ready else 0)
