"""Hooks the runtime calls so a transport layer can export metrics (Prometheus, logs...).

The graph knows nothing of any metrics library; `session_server` supplies an implementation.
"""

from __future__ import annotations


class GraphMetrics:
    """No-op base; override what you export."""

    def session_started(self, kind: str) -> None: ...

    def session_ended(self, kind: str, reason: str) -> None: ...

    def node_step(self, node: str, seconds: float) -> None: ...

    def node_steps(self, node: str, seconds: list[float]) -> None:
        """Several steps of one node at once (an engine's report)."""
        for value in seconds:
            self.node_step(node, value)
