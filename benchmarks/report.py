"""What a run leaves behind: tables on stdout, a JSON document, a PNG plot; and `--compare`.

The JSON document (`SCHEMA`) is the source of every other view:

    {"schema": "sgl-omni-bench/1", "created": ISO time, "machine": {...}, "server": {...},
     "settings": {...},
     "realtime":   {"levels": [{"sessions": N, "ttfa_from_speech_stopped_ms": {p50, p95, ...}, ...}]},
     "webrtc":     {"levels": [{"sessions": N, "ttfa_from_speech_stopped_ms": {...}, ...}]},
     "speech":     {"levels": [{"concurrency": C, "mode": "file"|"sse", ...}], "batch": {...}},
     "components": {"<name>": {...}, ...},
     "ratios":     {"<name>": number, ...},
     "unit_trace": [{"file": ..., "levels": [...]}]}   (with --unit-trace: benchmarks/unit_trace.py)

A scenario that was not run is absent; one that could not run is `{"skipped": "why"}`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA = "sgl-omni-bench/1"


class ReportError(ValueError):
    pass


def validate(doc: Any) -> None:
    """Raise ReportError naming the first thing that makes `doc` not a report of this schema."""
    if not isinstance(doc, dict):
        raise ReportError("a report is a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ReportError(f"schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    for key in ("created", "machine", "server", "settings"):
        if key not in doc:
            raise ReportError(f"missing {key!r}")
    realtime = doc.get("realtime")
    if realtime is not None and "skipped" not in realtime:
        for i, level in enumerate(_list(realtime, "levels", "realtime")):
            for key in ("sessions", "ttfa_from_speech_stopped_ms", "ttfa_from_user_audio_end_ms", "turn_latency_ms", "underruns", "events_per_s", "errors"):
                if key not in level:
                    raise ReportError(f"realtime.levels[{i}] is missing {key!r}")
            for key in ("p50", "p95", "p99"):
                if key not in level["ttfa_from_speech_stopped_ms"]:
                    raise ReportError(f"realtime.levels[{i}].ttfa_from_speech_stopped_ms is missing {key!r}")
    webrtc = doc.get("webrtc")
    if webrtc is not None and "skipped" not in webrtc:
        for i, level in enumerate(_list(webrtc, "levels", "webrtc")):
            for key in ("sessions", "ttfa_from_speech_stopped_ms", "turn_latency_ms", "errors"):
                if key not in level:
                    raise ReportError(f"webrtc.levels[{i}] is missing {key!r}")
    speech = doc.get("speech")
    if speech is not None and "skipped" not in speech:
        for i, level in enumerate(_list(speech, "levels", "speech")):
            for key in ("concurrency", "mode", "latency_ms", "requests_per_s", "errors"):
                if key not in level:
                    raise ReportError(f"speech.levels[{i}] is missing {key!r}")
    for key in ("components", "ratios"):
        if key in doc and not isinstance(doc[key], dict):
            raise ReportError(f"{key} must be an object")


def _list(section: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    value = section.get(key)
    if not isinstance(value, list):
        raise ReportError(f"{where}.{key} must be a list")
    return value


def write_json(doc: dict[str, Any], path: Path) -> None:
    validate(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def load_json(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    validate(doc)
    return doc


# --------------------------------------------------------------------------- tables


def level_label(level: dict[str, Any]) -> str:
    """A realtime level's name: `16`, or `16 spread` when its sessions' start offsets cover a
    whole turn cycle instead of one second (benchmarks/realtime.py)."""
    return f"{level['sessions']} spread" if level.get("arrivals") == "spread" else str(level["sessions"])


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pcts(summary: dict[str, Any] | None, keys: Iterable[str] = ("p50", "p95", "p99")) -> str:
    summary = summary or {}
    return "/".join(_fmt(summary.get(k)) for k in keys)


def _table(header: list[str], rows: list[list[str]], left_first: bool = False) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if left_first and i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), *(line(row) for row in rows)])


def _errors_line(levels: list[dict[str, Any]]) -> list[str]:
    """The errors of a scenario's levels by kind, as one line; none when there were none."""
    errors = {k: v for level in levels for k, v in level["errors"]["by_kind"].items()}
    return ["errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))] if errors else []


def _render_realtime(doc: dict[str, Any], realtime: dict[str, Any]) -> list[str]:
    out: list[str] = []
    settings = doc.get("settings", {}).get("realtime", {})
    server_sched = doc.get("server", {}).get("sched")
    out.append(f"realtime over WebSocket: {settings.get('turns', '?')} turns/session, 20 ms chunks at wall-clock pace, max_output_tokens {settings.get('max_output_tokens')}"
               + (f", server scheduled {server_sched}" if server_sched else ""))
    rows = []
    for level in realtime["levels"]:
        server = level.get("server") or {}
        underruns = level["underruns"]
        rows.append(
            [
                level_label(level),
                f"{level.get('turns_completed', '-')}/{level.get('turns_planned', '-')}",
                _pcts(level["ttfa_from_speech_stopped_ms"]),
                _fmt(level["ttfa_from_user_audio_end_ms"].get("p50")),
                _pcts(level["turn_latency_ms"], ("p50", "p95")),
                _fmt((level.get("output_rtf") or {}).get("p50"), 2),
                _fmt(level.get("generation_text_tok_per_s")),
                f"{underruns['total']} ({underruns['turns_with_underrun']})",
                _fmt(underruns.get("total_with_100ms_buffer")),
                _fmt(level["events_per_s"]),
                _fmt(server.get("cpu_percent")),
                _fmt(server.get("cpu_percent_per_session")),
                _fmt(server.get("rss_mb_per_session"), 1),
                _fmt(level.get("client_cpu_percent")),
                _fmt(server.get("machine_cpu_percent")),
                str(level["errors"]["count"]),
            ]
        )
    header = ["N", "turns", "TTFA stop p50/95/99 ms", "TTFA end p50", "turn p50/95 ms", "RTF p50", "gen tok/s", "underruns (turns)", "w/100ms buf", "ev/s", "srv CPU%", "CPU%/sess", "RSS MB/sess", "client CPU%", "machine CPU%", "errors"]
    out.append(_table(header, rows))
    out.append("N spread: session start offsets cover a whole turn cycle (otherwise within 1 s, so turns end together)")
    out.append("TTFA stop: from speech_stopped; TTFA end: from the end of the user's audio; RTF: generation time / reply audio; gen tok/s: thinker tokens of all replies / time any reply was generating; CPU% of one core; machine CPU% of all cores")
    sized = [level for level in realtime["levels"] if level.get("batch_sizes")]
    if sized:
        out.append("mean batch (session steps per model call): " + "; ".join(
            f"N={level_label(level)} " + ", ".join(f"{name} {size:g}" for name, size in sorted(level["batch_sizes"].items()))
            for level in sized))
    early = [level for level in realtime["levels"] if (level.get("node_events") or {}).get("thinker.early_prefill")]
    if early:
        out.append("early prefill (utterances prefilled in the pause before their turn ended): " + "; ".join(
            f"N={level_label(level)} {level['node_events'].get('thinker.early_prefill_confirmed', 0)} confirmed, "
            f"{level['node_events'].get('thinker.early_prefill_dropped', 0)} dropped of {level['node_events']['thinker.early_prefill']}"
            for level in early))
    scheduled = [level for level in realtime["levels"] if (level.get("server") or {}).get("sched_batch_share") is not None]
    if scheduled and server_sched == "adaptive":
        out.append("server as SCHED_BATCH (share of the level; adaptive: batch once the machine is busy): " + ", ".join(
            f"N={level_label(level)} {level['server']['sched_batch_share']:.0%}" for level in scheduled))
    idle = realtime.get("idle_memory")
    if idle and "error" in idle:
        out.append(f"memory: not measured ({idle['sessions']} idle sessions: {idle['error']})")
    elif idle:
        out.append(f"memory: {_fmt(idle['rss_mb_per_idle_session'], 2)} MB per idle session ({idle['sessions']} connected, silent); "
                   "RSS MB/sess above: per talking session (peak during the level)")
    streaming = realtime.get("streaming")
    if streaming and "error" in streaming:
        out.append(f"streaming: not measured ({streaming['sessions']} sessions: {streaming['error']})")
    elif streaming:
        out.append(f"streaming: {streaming['sessions']} sessions sending silence ({streaming['chunk_ms']} ms appends, server VAD, nobody speaking): "
                   f"server {_fmt(streaming['server_cpu_percent'], 1)}% of a core ({_fmt(streaming['server_us_per_append'], 1)} us per append), "
                   f"load generator {_fmt(streaming['client_cpu_percent'], 1)}% ({_fmt(streaming['client_us_per_append'], 1)} us per append)")
    found = realtime.get("capacity")
    if found:
        tried = ", ".join(f"{n} {'pass' if ok else 'fail'}" for n, ok in found["tried"].items())
        out.append(f"capacity: {found['sessions']} sessions{'' if found['complete'] else ' (search cut short by the deadline)'}: "
                   f"the largest count meeting the goal ({found['goal']}); tried {tried}")
    out.extend(_errors_line(realtime["levels"]))
    return out


def _render_webrtc(doc: dict[str, Any], webrtc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    out.append("realtime over WebRTC (Opus tracks, events on the data channel): TTFA = first audible frame of the server's track")
    rows = [
        [
            str(level["sessions"]),
            f"{level.get('turns_completed', '-')}/{level.get('turns_planned', '-')}",
            _pcts(level["ttfa_from_speech_stopped_ms"]),
            _fmt(level["ttfa_from_user_audio_end_ms"].get("p50")),
            _pcts(level["turn_latency_ms"], ("p50", "p95")),
            str(level["errors"]["count"]),
        ]
        for level in webrtc["levels"]
    ]
    out.append(_table(["N", "turns", "TTFA stop p50/95/99 ms", "TTFA end p50", "turn p50/95 ms", "errors"], rows))
    out.extend(_errors_line(webrtc["levels"]))
    return out


def _render_speech(doc: dict[str, Any], speech: dict[str, Any]) -> list[str]:
    out: list[str] = []
    out.append("speech: /v1/audio/speech (file = whole WAV; sse = first speech.audio.delta)")
    rows = [
        [
            str(level["concurrency"]),
            level["mode"],
            f"{level['ok']}/{level['requests']}",
            _pcts(level["latency_ms"], ("p50", "p95")),
            _pcts(level.get("first_chunk_ms"), ("p50", "p95")) if level["mode"] == "sse" else "",
            _fmt(level["requests_per_s"], 2),
            _fmt(level["audio_s_per_s"], 2),
            str(level["errors"]["count"]),
        ]
        for level in speech["levels"]
    ]
    out.append(_table(["C", "mode", "ok", "latency p50/95 ms", "1st chunk p50/95", "req/s", "audio s/s", "errors"], rows))
    if speech.get("skipped_levels"):
        out.append(f"skipped ({speech['skipped_levels']['reason']}): {', '.join(speech['skipped_levels']['levels'])}")
    batch = speech.get("batch") or {}
    if batch:
        if "error" in batch:
            out.append(f"batch of {batch.get('items')}: {batch['error']}")
        else:
            out.append(f"batch of {batch['items']}: {batch.get('succeeded')} ok in {batch['wall_s']} s = {batch['items_per_s']} items/s, {batch['audio_s_per_s']} audio s/s")
    return out


def render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    machine = doc.get("machine", {})
    out.append(f"sgl-omni bench  {doc.get('created', '')}  model {doc.get('server', {}).get('model_id', '?')}  " f"{machine.get('cpu_count', '?')} CPUs  {machine.get('platform', '')}")
    for name, render_scenario in (("realtime", _render_realtime), ("webrtc", _render_webrtc), ("speech", _render_speech)):
        scenario = doc.get(name)
        if scenario is not None:
            out.append("")
            out.extend([f"{name}: skipped ({scenario['skipped']})"] if "skipped" in scenario else render_scenario(doc, scenario))
    components = doc.get("components")
    if components is not None:
        out.append("")
        load = doc.get("components_load") or {}
        out.append(f"components (direct calls, no server, best of repeated runs): the limit beside each figure; machine CPU {_fmt(load.get('machine_cpu_percent'))}% meanwhile")
        rows = []
        for name, figures in components.items():
            if "skipped" in figures:
                rows.append([name, f"skipped: {figures['skipped']}"])
            else:
                rows.append([name, ", ".join(f"{k} {_short(v)}" for k, v in figures.items())])
        out.append("\n".join(f"  {name.ljust(9)} {text}" for name, text in rows))
    ratios = doc.get("ratios")
    if ratios:
        out.append("")
        out.append("ratios (server / direct; 1.0 = the server adds nothing)")
        out.append(_table(["ratio", "value"], [[k, _fmt(v, 2)] for k, v in ratios.items()], left_first=True))
    return "\n".join(out)


# --------------------------------------------------------------------------- plot


def plot(doc: dict[str, Any], path: Path) -> bool:
    """TTFA percentiles and underruns against concurrent sessions. False when there is nothing to plot."""
    realtime = doc.get("realtime") or {}
    measured = [level for level in realtime.get("levels", []) if level["ttfa_from_speech_stopped_ms"].get("p50") is not None]
    levels = [level for level in measured if level.get("arrivals") != "spread"]
    spread = [level for level in measured if level.get("arrivals") == "spread"]
    if not levels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sessions = [level["sessions"] for level in levels]
    fig, (ttfa_ax, underrun_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        ttfa_ax.plot(sessions, [level["ttfa_from_speech_stopped_ms"][key] for level in levels], style, label=f"TTFA {key}")
    ttfa_ax.plot(sessions, [level["ttfa_from_user_audio_end_ms"]["p50"] for level in levels], "x-", alpha=0.6, label="from end of user audio, p50")
    for key, marker in (("p50", "o"), ("p95", "s")):
        if spread:
            ttfa_ax.scatter([level["sessions"] for level in spread], [level["ttfa_from_speech_stopped_ms"][key] for level in spread],
                            marker=marker, facecolors="none", edgecolors="black", zorder=3, label=f"TTFA {key}, arrivals spread")
    ttfa_ax.set_xscale("log", base=2)
    ttfa_ax.set_xticks(sessions, [str(n) for n in sessions])
    ttfa_ax.set_xlabel("concurrent sessions")
    ttfa_ax.set_ylabel("time to first audio (ms)")
    ttfa_ax.set_title("Time to first audio (from speech_stopped)")
    ttfa_ax.grid(True, alpha=0.3)
    ttfa_ax.legend()
    per_turn = [level["underruns"]["per_turn"] or 0 for level in levels]
    turns_hit = [level["underruns"]["turns_with_underrun"] / max(level["turns_completed"], 1) * 100 for level in levels]
    positions = range(len(sessions))
    underrun_ax.bar([p - 0.2 for p in positions], per_turn, 0.4, label="underruns per turn")
    underrun_ax.set_ylabel("underruns per turn")
    underrun_ax.set_ylim(0, max(max(per_turn) * 1.2, 1.0))
    share_ax = underrun_ax.twinx()
    share_ax.bar([p + 0.2 for p in positions], turns_hit, 0.4, color="tab:red", alpha=0.6, label="% of turns with an underrun")
    share_ax.set_ylabel("% of turns with an underrun")
    share_ax.set_ylim(0, 100)
    underrun_ax.set_xticks(list(positions), [str(n) for n in sessions])
    underrun_ax.set_xlabel("concurrent sessions")
    underrun_ax.set_title("Playback underruns (real-time player)")
    handles = underrun_ax.get_legend_handles_labels()[0] + share_ax.get_legend_handles_labels()[0]
    underrun_ax.legend(handles, [h.get_label() for h in handles], loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize="small")
    machine = doc.get("machine", {})
    fig.suptitle(f"sgl-omni bench, {doc.get('server', {}).get('model_id', '')}, {machine.get('cpu_count', '?')} CPUs, {doc.get('created', '')[:16]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- compare


def flatten(doc: dict[str, Any]) -> dict[str, float]:
    """Every number of the scenarios, under a stable path: `realtime[N=4].turn_latency_ms.p95`."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            if not (isinstance(value, float) and math.isnan(value)):
                flat[prefix] = float(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)

    for level in (doc.get("realtime") or {}).get("levels", []):
        walk(f"realtime[N={level_label(level)}]", {k: v for k, v in level.items() if k != "sessions"})
    for level in (doc.get("webrtc") or {}).get("levels", []):
        walk(f"webrtc[N={level['sessions']}]", {k: v for k, v in level.items() if k != "sessions"})
    speech = doc.get("speech") or {}
    for level in speech.get("levels", []):
        walk(f"speech[C={level['concurrency']},{level['mode']}]", {k: v for k, v in level.items() if k not in ("concurrency", "mode")})
    if isinstance(speech.get("batch"), dict):
        walk("speech.batch", speech["batch"])
    walk("components", doc.get("components") or {})
    walk("ratios", doc.get("ratios") or {})
    return flat


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float | None, float | None, float | None, float | None]]:
    """(path, A, B, B - A, percent change) for every number in either report, in A's order."""
    flat_a, flat_b = flatten(a), flatten(b)
    rows = []
    for path in list(flat_a) + [p for p in flat_b if p not in flat_a]:
        va, vb = flat_a.get(path), flat_b.get(path)
        delta = None if va is None or vb is None else vb - va
        percent = None if delta is None or va == 0 else 100.0 * delta / abs(va)
        rows.append((path, va, vb, delta, percent))
    return rows


def render_compare(rows: list[tuple[str, float | None, float | None, float | None, float | None]], only_changed: bool = False) -> str:
    table = []
    for path, va, vb, delta, percent in rows:
        if only_changed and delta == 0:
            continue
        table.append([path, _num(va), _num(vb), _num(delta, signed=True), "-" if percent is None else f"{percent:+.1f}%"])
    return _table(["metric", "A", "B", "B-A", "change"], table, left_first=True) if table else "(nothing to compare)"


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:+.3f}" if signed else f"{value:.3f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
