"""Where a slow turn's time went, from the unit traces a server wrote (graph/unit_trace.py).

    sgl-omni bench realtime --sessions 1,64 --spread-sessions 64 --unit-trace /tmp/units
    # or a profile with `compute: {unit_trace: /tmp/units}` under any load, then:
    python -m benchmarks.unit_trace /tmp/units

For each runtime (engine) that hosted turns: its turns split into the bench's levels (a pause of
more than `--level-gap` seconds between turn ends starts a new level); for each level, the time
from `speech_stopped` to first audio as the engine saw it, how busy the engine was and with what
(unit, reply phase), and for its slowest 10% of turns, what the engine ran between their stop
and their first audio, by phase (`first`: first-audio work of any turn, theirs included;
`playing`: replies already playing; `unasked`: utterances prefilled in their pause; `other`:
VAD and the rest).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

SLOWEST_SHARE = 0.1


def turns_of(trace: dict[str, Any]) -> list[tuple[float, float]]:
    """(speech_stopped, first_audio) of each turn that had both, by stop time."""
    stopped: dict[str, float] = {}
    turns = []
    for at, session_id, kind in trace["turns"]:
        if kind == "speech_stopped":
            stopped[session_id] = at
        elif kind == "first_audio" and session_id in stopped:
            turns.append((stopped.pop(session_id), at))
    return sorted(turns)


def levels_of(turns: list[tuple[float, float]], gap_s: float) -> list[list[tuple[float, float]]]:
    levels: list[list[tuple[float, float]]] = []
    for turn in turns:
        if not levels or turn[0] - levels[-1][-1][0] > gap_s:
            levels.append([])
        levels[-1].append(turn)
    return levels


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _by_phase(units: list[list[Any]], start: float, end: float) -> Counter[str]:
    """Seconds of unit time inside [start, end], shared among a unit's items by their phase."""
    spent: Counter[str] = Counter()
    for started, ended, _cpu, _name, phases in units:
        overlap = min(ended, end) - max(started, start)
        if overlap > 0:
            for phase in phases or ["other"]:
                spent[phase] += overlap / max(len(phases), 1)
    return spent


def level_summary(units: list[list[Any]], turns: list[tuple[float, float]]) -> dict[str, Any]:
    ttfa_ms = [1000 * (audio - stop) for stop, audio in turns]
    start, end = turns[0][0], turns[-1][1]
    inside = [u for u in units if u[1] > start and u[0] < end]
    busy: Counter[str] = Counter()
    for started, ended, _cpu, name, phases in inside:
        for phase in phases or ["other"]:
            busy[f"{name}/{phase}"] += (ended - started) / max(len(phases), 1)
    slowest = sorted(turns, key=lambda t: t[1] - t[0])[-max(1, int(SLOWEST_SHARE * len(turns))) :]
    waited: Counter[str] = Counter()
    for stop, audio in slowest:
        waited.update(_by_phase(inside, stop, audio))
    span = max(end - start, 1e-9)
    return {
        "turns": len(turns),
        "ttfa_ms": {"p50": round(_quantile(ttfa_ms, 0.5), 1), "p95": round(_quantile(ttfa_ms, 0.95), 1), "max": round(max(ttfa_ms), 1)},
        "busy_share": round(sum(busy.values()) / span, 3),
        "busy_s": {key: round(value, 3) for key, value in busy.most_common()},
        "cpu_per_wall": round(sum(u[2] for u in inside) / max(sum(u[1] - u[0] for u in inside), 1e-9), 2),
        "slowest": {
            "turns": len(slowest),
            "ttfa_ms_mean": round(1000 * sum(a - s for s, a in slowest) / len(slowest), 1),
            "engine_ms_by_phase": {phase: round(1000 * value / len(slowest), 1) for phase, value in waited.most_common()},
        },
    }


def summarize(directory: str, gap_s: float = 3.0, windows: list[tuple[str, float, float]] | None = None) -> list[dict[str, Any]]:
    """Per trace file (engine), per level. `windows`: the bench's levels as (label, start, end)
    on the same clock (`time.perf_counter`: CLOCK_MONOTONIC, shared by the processes of one
    machine); without them, levels are told apart by pauses of more than `gap_s` between turns."""
    summaries = []
    for path in sorted(Path(directory).glob("units-*.json")):
        trace = json.loads(path.read_text())
        turns = turns_of(trace)
        if not turns:
            continue
        if windows is None:
            levels = [(f"level {index + 1}", level) for index, level in enumerate(levels_of(turns, gap_s))]
        else:
            levels = [(label, [t for t in turns if start <= t[0] <= end]) for label, start, end in windows]
        summaries.append({"file": path.name, "levels": [{"level": label, **level_summary(trace["units"], level)} for label, level in levels if level],
                          "rebuilds": rebuilds_summary(trace.get("rebuilds", []))})
    return summaries


def rebuilds_summary(rebuilds: list[list[Any]]) -> dict[str, Any]:
    """The context rebuilds after truncations (graph/unit_trace.py `rebuilds`): how many, their
    wall time (queueing included), and the items they dropped and tokens they re-prefilled."""
    return {
        "count": len(rebuilds),
        "seconds": round(sum(ended - started for started, ended, *_ in rebuilds), 3),
        "items_dropped": sum(r[3] for r in rebuilds),
        "tokens_prefilled": sum(r[4] for r in rebuilds),
    }


def summarize_when_written(directory: str, windows: list[tuple[str, float, float]] | None = None, wait_s: float = 10.0) -> list[dict[str, Any]]:
    """`summarize`, once the runtimes have written their traces: each writes at its stop, which
    can come a little after the server's process has exited (an engine's own shutdown)."""
    deadline = time.monotonic() + wait_s
    while not list(Path(directory).glob("units-*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the other engines' files, written at the same moment
    return summarize(directory, windows=windows)


def print_summaries(summaries: list[dict[str, Any]], file: Any = sys.stdout) -> None:
    for summary in summaries:
        print(summary["file"], file=file)
        for level in summary["levels"]:
            ttfa, slowest = level["ttfa_ms"], level["slowest"]
            print(f"  {level['level']}: {level['turns']} turns, engine-side TTFA p50 {ttfa['p50']} / p95 {ttfa['p95']} / max {ttfa['max']} ms, "
                  f"engine busy {100 * level['busy_share']:.0f}% (CPU/wall {level['cpu_per_wall']})", file=file)
            print("    busy: " + ", ".join(f"{key} {value:.2f}s" for key, value in list(level["busy_s"].items())[:8]), file=file)
            print(f"    slowest {slowest['turns']} (mean {slowest['ttfa_ms_mean']} ms) waited on: "
                  + ", ".join(f"{phase} {ms} ms" for phase, ms in slowest["engine_ms_by_phase"].items()), file=file)
        rebuilds = summary.get("rebuilds") or {}
        if rebuilds.get("count"):
            print(f"  context rebuilds after truncations: {rebuilds['count']}, {rebuilds['seconds']} s, "
                  f"{rebuilds['items_dropped']} items dropped, {rebuilds['tokens_prefilled']} tokens re-prefilled", file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.unit_trace", description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="the profile's compute.unit_trace directory")
    parser.add_argument("--level-gap", type=float, default=3.0, help="seconds between turn ends that start a new level (default 3)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    summaries = summarize(args.directory, args.level_gap)
    if not summaries:
        print(f"no unit traces with turns in {args.directory}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summaries, indent=1))
    else:
        print_summaries(summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
