"""A unit trace records each context rebuild after a truncation, and its summary counts them."""

from __future__ import annotations

import json

from benchmarks.unit_trace import rebuilds_summary
from graph.unit_trace import UnitTrace


def test_rebuilds_are_written_and_summarized(tmp_path):
    trace = UnitTrace(str(tmp_path))
    trace.rebuild("s1", 10.0, 10.25, 2, 120)
    trace.rebuild("s2", 11.0, 11.5, 1, 80)
    written = json.loads(trace.write().read_text())
    assert written["rebuilds"] == [[10.0, 10.25, "s1", 2, 120], [11.0, 11.5, "s2", 1, 80]]
    assert rebuilds_summary(written["rebuilds"]) == {"count": 2, "seconds": 0.75, "items_dropped": 3, "tokens_prefilled": 200}
