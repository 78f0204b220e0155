"""benchmarks/rest_rss.py: every abusive request is answered (no reset) and memory is read per process."""

from __future__ import annotations

import json

from benchmarks import rest_rss


def test_a_short_run_answers_every_shape_and_reads_each_process_per_round(tmp_path, capsys):
    report = tmp_path / "rss.json"
    assert rest_rss.main(["--rounds", "2", "--per-round", "8", "--json", str(report)]) == 0
    figures = json.loads(report.read_text())
    # One cycle of eight shapes per round: three rendered or listed, three refused as bad, two too large.
    assert figures["statuses"] == {"200": 6, "400": 6, "413": 4}
    assert [row["requests"] for row in figures["rss_mb"]] == [0, 8, 16]
    assert {"server", "engine0", "engine1"} <= set(figures["rss_mb"][0])
    assert "| requests | server MB |" in capsys.readouterr().out
