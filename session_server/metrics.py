"""Prometheus metrics for the server, fed by the graph's metric hooks and the transports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from graph.metrics import GraphMetrics
from session_server.usage import UsageTotals

if TYPE_CHECKING:
    from graph.runtime import GraphRuntime

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics(GraphMetrics):
    """One registry per server (tests run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Every realtime session's usage, added as it arises (usage.py); read at scrape time.
        self.usage = UsageTotals()
        self.registry.register(_UsageCollector(self.usage))
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

    def watch(self, runtime_getter: Callable[[], GraphRuntime | None], free_slots: Callable[[], int] | None = None,
              parked: Callable[[], int] | None = None) -> None:
        self.registry.register(_RuntimeCollector(runtime_getter, free_slots, parked))

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

    def __init__(self, runtime_getter: Callable[[], GraphRuntime | None], free_slots: Callable[[], int] | None = None,
                 parked: Callable[[], int] | None = None):
        self._runtime = runtime_getter
        self._free_slots = free_slots
        self._parked = parked

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
        # Context truncations (session.truncation) and the time their KV rebuilds took, from the
        # thinker's counters (also among the node events): rebuild seconds / truncations = the mean.
        truncations = CounterMetricFamily("sgl_omni_context_truncations", "Times a session's oldest items left the model's context")
        rebuild = CounterMetricFamily("sgl_omni_truncation_rebuild_seconds", "Seconds the KV rebuilds after truncations took, queueing included")
        if runtime is not None:
            counted = runtime.node_counters()
            truncations.add_metric([], sum(c.get("truncations", 0) for c in counted.values()))
            rebuild.add_metric([], sum(c.get("truncation_rebuild_ms", 0) for c in counted.values()) / 1000.0)
            for name, (runs, held) in sorted(runtime.batch_counts().items()):
                batches.add_metric([name], runs)
                items.add_metric([name], held)
            for node, counts in sorted(runtime.node_counters().items()):
                for event, n in sorted(counts.items()):
                    events.add_metric([node, event], n)
        yield active
        if self._parked is not None:
            # Of the active realtime sessions, those whose client dropped and that wait for a resume
            # (realtime/resume.py): they hold their slots; connected = active - parked.
            yield _parked_family(self._parked() if runtime is not None else 0)
        yield depth
        yield batches
        yield items
        yield events
        if runtime is not None:
            yield truncations
            yield rebuild
        if self._free_slots is not None:
            # What autoscalers and `/ready` read: realtime sessions this replica can still admit.
            yield GaugeMetricFamily("sgl_omni_free_session_slots", "Realtime sessions this server can still admit",
                                    value=self._free_slots() if runtime is not None and runtime.ready else 0)
        if runtime is not None and runtime.ready and hasattr(runtime, "first_audio_estimate_s"):
            # What admission by load compares with `limits.first_audio_goal_ms` (graph/load.py).
            estimate = runtime.first_audio_estimate_s()
            yield GaugeMetricFamily("sgl_omni_first_audio_estimate_seconds",
                                    "First audio one more speaking session would get (admission by load; +Inf: saturated)",
                                    value=estimate)


def _parked_family(parked: int) -> GaugeMetricFamily:
    family = GaugeMetricFamily("sgl_omni_parked_sessions",
                               "Realtime sessions whose client dropped, waiting for a resume (a part of sgl_omni_active_sessions)",
                               labels=["kind"])
    family.add_metric(["realtime"], parked)
    return family


class _UsageCollector(Collector):
    """The usage counters, read from the server's `UsageTotals` at scrape time."""

    def __init__(self, totals: UsageTotals):
        self._totals = totals

    def collect(self) -> Iterator[CounterMetricFamily]:
        tokens = self._totals.tokens
        family = CounterMetricFamily("sgl_omni_tokens", "Tokens of realtime replies (their response.done usage), by kind and modality",
                                     labels=["kind", "modality"])
        for kind, modality, value in (("input", "text", tokens.input_text), ("input", "audio", tokens.input_audio),
                                      ("input", "image", tokens.input_image), ("output", "text", tokens.output_text),
                                      ("output", "audio", tokens.output_audio)):
            family.add_metric([kind, modality], value)
        yield family
        # A part of the input tokens, so not a `kind` of sgl_omni_tokens (a sum over it would count them twice).
        yield CounterMetricFamily("sgl_omni_cached_tokens", "Input tokens of realtime replies read from the KV cache",
                                  value=tokens.cached)
        audio = CounterMetricFamily("sgl_omni_audio_seconds", "Seconds of realtime audio: in from clients, out in replies",
                                    labels=["direction"])
        audio.add_metric(["in"], self._totals.audio_in_s)
        audio.add_metric(["out"], self._totals.audio_out_s)
        yield audio
