"""`sgl-omni bench [realtime] [speech] [components] [soak] [sip] [options]`; `sgl-omni bench --compare A.json B.json`.

With no scenario named, all but `soak` and `sip` run (`sip`: phone calls over SIP/RTP, benchmarks/sip.py) (`soak`: minutes of sessions that keep talking,
benchmarks/soak.py; named alone, it is the only one). Without `--url` the harness starts the server itself
(`python -m session_server.cli serve --enable-realtime` on 127.0.0.1, a free port, the profile
of `--config` or the embedded default), waits for /health, runs, and stops it. The direct
`components` scenario runs after the server has stopped, so the two never compete for CPU.

Every scenario stops by itself: levels have time budgets, turns have timeouts, and once the
run's `--deadline` has passed the remaining levels are skipped (and say so).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from benchmarks import report
from benchmarks.fixtures import QUICK_SENTENCE, SENTENCES, make_utterance
from graph.sched import POLICIES, SERVER_DEFAULT, policy_of

SCENARIOS = ("realtime", "webrtc", "speech", "components", "soak", "sip")
DEFAULT_SCENARIOS = ("realtime", "webrtc", "speech", "components")


def event_loop_factory() -> Any:
    """uvloop where installed (as the server runs): the load generator's CPU is taken from the
    server on a small machine."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgl-omni bench", description="Benchmark the session server: realtime sessions, speech endpoints, direct model compute.")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="print the differences between two reports and exit")
    parser.add_argument("--quick", action="store_true", help="a small, fast run (1-2 sessions, 1 turn, short budgets): for tests and smoke checks")
    target = parser.add_argument_group("server")
    target.add_argument("--url", help="benchmark a running server (http://host:port) instead of starting one")
    target.add_argument("--server-pid", type=int, help="with --url: the server's pid, to sample its CPU and memory")
    target.add_argument("--config", help="profile for the server the harness starts (and for `components`); default: the embedded CPU profile")
    target.add_argument("--api-key", default=os.environ.get("SGL_OMNI_API_KEY"), help="Bearer key (env SGL_OMNI_API_KEY)")
    target.add_argument("--server-sched", choices=POLICIES, help=f"the started server's `serve --server-sched` (default: {SERVER_DEFAULT}); the report records "
                        "it, and each level how much of it the server ran as SCHED_BATCH")
    target.add_argument("--unit-trace", metavar="DIR", help="the server the harness starts records its engines' units of compute into DIR "
                        "(compute.unit_trace); the report then says what the slowest turns of each level waited on (benchmarks/unit_trace.py)")
    load = parser.add_argument_group("load")
    load.add_argument("--sessions", type=_ints, help="realtime: concurrent sessions per level (default 1,4,16; quick 1,2)")
    load.add_argument("--turns", type=int, help="realtime: spoken turns per session (default 2; quick 1)")
    load.add_argument("--max-output-tokens", type=int, default=16, help="realtime: thinker tokens per reply (bounds the run; default 16)")
    load.add_argument("--stagger", type=float, default=1.0, help="realtime: sessions start at seeded offsets within this many seconds")
    load.add_argument("--spread-sessions", type=_ints, help="realtime: levels run again with start offsets spread over --spread seconds (default 16 when --sessions is not given; quick none)")
    load.add_argument("--spread", type=float, default=6.0, help="realtime: the spread levels' start window, about one turn cycle of the default load (default 6 s)")
    load.add_argument("--spread-turns", type=int, default=4, help="realtime: turns per session in the spread levels (default 4: enough turns for a steady p95)")
    load.add_argument("--find-capacity", action="store_true", help="realtime: then search spread levels for the largest session count meeting the scale goal (benchmarks/capacity.py)")
    load.add_argument("--capacity-limit", type=int, default=160, help="realtime: the largest session count the capacity search tries (default 160)")
    load.add_argument("--turn-timeout", type=float, default=60.0, help="realtime: seconds a turn may wait for its reply")
    load.add_argument("--webrtc-sessions", type=_ints, help="webrtc: concurrent calls per level (default 1,2; quick 1)")
    load.add_argument("--calls", type=_ints, help="sip: concurrent calls per level (default 1,20; quick 1)")
    load.add_argument("--sip", metavar="HOST:PORT", help="sip, with --url: the server's SIP endpoint (its sip.webhook_url must reach "
                      "http://127.0.0.1:<--sip-webhook-port>/webhook, its secret benchmarks.sip.WEBHOOK_SECRET)")
    load.add_argument("--sip-webhook-port", type=int, help="sip: the port the callers take webhooks on (default: a free one)")
    load.add_argument("--concurrency", type=_ints, help="speech: concurrent requests per level (default 1,4,16,32; quick 1,2)")
    load.add_argument("--level-budget", type=float, help="speech: seconds each level keeps sending (default 15; quick 2)")
    load.add_argument("--batch-items", type=int, help="speech: items in the batch request (default 8; quick 2)")
    load.add_argument("--speech-max-new-tokens", type=int, help="speech: max_new_tokens per request (default: the server's)")
    load.add_argument("--voice", help="voice for replies and speech (default: the model's)")
    load.add_argument("--fixtures", choices=["auto", "espeak", "synthetic"], default="auto", help="speech input: espeak-ng if installed (auto), or a synthetic voiced signal")
    load.add_argument("--minutes", type=float, default=10.0, help="soak: minutes the sessions keep talking (default 10)")
    load.add_argument("--window-minutes", type=float, default=5.0, help="soak: the report's window (default 5; shorter for short runs)")
    load.add_argument("--truncation", default="auto", help="soak: the sessions' session.truncation: auto | disabled | retention_ratio:R[:N] (default auto)")
    load.add_argument("--max-seq-len", type=int, help="the started server's thinker context (the model's max_seq_len and limits.max_seq_len), "
                      "e.g. 2048 so that soak sessions truncate within minutes")
    load.add_argument("--kv-cache", choices=["auto", "preallocate", "grow"],
                      help="the started server's KV caches (the model's kv_cache; default: the profile's). preallocate: a row per "
                      "session of the longest context from the start, as on CUDA, so RSS shows what else grows")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--deadline", type=float, default=540.0, help="seconds after which remaining levels are skipped (default 540)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default="bench-results", help="directory for the JSON, PNG and server log (default ./bench-results)")
    output.add_argument("--name", help="file stem (default bench-<UTC time>)")
    output.add_argument("--note", help="free text stored in the report (e.g. 'machine shared with other jobs')")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        try:
            a, b = (report.load_json(path) for path in args.compare)
        except (OSError, ValueError) as exc:  # ReportError and JSONDecodeError are ValueErrors
            print(f"--compare: {exc}", file=sys.stderr)
            return 2
        print(f"A = {args.compare[0]} ({a['created']})\nB = {args.compare[1]} ({b['created']})")
        print(report.render_compare(report.compare(a, b)))
        return 0
    for scenario in args.scenarios:
        if scenario not in SCENARIOS:
            print(f"unknown scenario {scenario!r} (choose from {', '.join(SCENARIOS)})", file=sys.stderr)
            return 2
    from benchmarks.server import ServerStartError

    # One stem for the run's files: <stem>.json, <stem>.png, <stem>-server.log, <stem>-profile.yaml.
    args.name = args.name or "bench-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    try:
        doc = run(args)
    except ServerStartError as exc:
        print(f"sgl-omni bench: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out)
    stem = args.name
    json_path = out / f"{stem}.json"
    report.write_json(doc, json_path)
    print(report.render(doc))
    print()
    print(f"report: {json_path}")
    png_path = out / f"{stem}.png"
    if report.plot(doc, png_path):
        print(f"plot:   {png_path}")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen scenarios; returns the report document."""
    from benchmarks.realtime import RealtimeSettings
    from benchmarks.speech import SpeechSettings

    started = time.monotonic()
    scenarios = list(dict.fromkeys(args.scenarios)) or list(DEFAULT_SCENARIOS)
    quick = args.quick
    realtime_settings = RealtimeSettings(
        turns=args.turns or (1 if quick else 2),
        stagger_s=args.stagger if not quick else min(args.stagger, 0.3),
        turn_timeout_s=args.turn_timeout,
        max_output_tokens=args.max_output_tokens,
        voice=args.voice,
        seed=args.seed,
    )
    sessions = args.sessions or ((1, 2) if quick else (1, 4, 16))
    spread_sessions = args.spread_sessions if args.spread_sessions is not None else (() if quick or args.sessions else (16,))
    speech_settings = SpeechSettings(
        concurrency=args.concurrency or ((1, 2) if quick else (1, 4, 16, 32)),
        level_budget_s=args.level_budget or (2.0 if quick else 15.0),
        batch_items=args.batch_items or (2 if quick else 8),
        max_new_tokens=args.speech_max_new_tokens,
        voice=args.voice,
        seed=args.seed,
    )
    doc: dict[str, Any] = {
        "schema": report.SCHEMA,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "server": {},
        "settings": {
            "quick": quick,
            "seed": args.seed,
            "scenarios": scenarios,
            "webrtc": {"sessions": list(args.webrtc_sessions or ((1,) if quick else (1, 2)))},
            "realtime": {"sessions": list(sessions), "spread_sessions": list(spread_sessions), "spread_s": args.spread, "spread_turns": args.spread_turns,
                         **{k: getattr(realtime_settings, k) for k in ("turns", "stagger_s", "turn_timeout_s", "max_output_tokens")}},
            "speech": {"concurrency": list(speech_settings.concurrency), "level_budget_s": speech_settings.level_budget_s, "batch_items": speech_settings.batch_items},
        },
    }
    if args.note:
        doc["note"] = args.note
    deadline = started + args.deadline
    out = Path(args.out)
    if {"realtime", "webrtc", "speech", "soak"} & set(scenarios):
        _run_against_server(args, doc, scenarios, sessions, spread_sessions, realtime_settings, speech_settings, deadline, out)
        if args.unit_trace and not args.url:
            from benchmarks import unit_trace

            windows = [(f"N={report.level_label(level)}", *level["window_perf_counter"])
                       for level in doc.get("realtime", {}).get("levels", []) if "window_perf_counter" in level]
            doc["unit_trace"] = unit_trace.summarize_when_written(args.unit_trace, windows or None)
            unit_trace.print_summaries(doc["unit_trace"], file=sys.stderr)
    if "sip" in scenarios and "sip" not in doc:  # alone: on a server of its own
        doc["sip"] = _run_sip(args, deadline, out)
    if "components" in scenarios:
        from benchmarks import components
        from benchmarks.server import ResourceMonitor

        with ResourceMonitor(os.getpid(), include_children=False) as harness:
            doc["components"] = components.run(args.config, quick=quick, seed=args.seed, deadline=deadline, max_output_tokens=args.max_output_tokens)
        # Direct figures are only limits if nothing else ran meanwhile: say how busy the machine was.
        doc["components_load"] = {"harness_cpu_percent": harness.cpu_percent(), "machine_cpu_percent": harness.summary(1)["machine_cpu_percent"]}
        doc["ratios"] = components.ratios(doc)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    return doc


def _session_probe(sessions: int, probe: Any) -> dict[str, Any]:
    """Run one of the probes that hold `sessions` sessions open (capacity.py) on the load
    generator's loop, as the levels run; a server that refuses or drops them (its session limit)
    gives the reason, not a traceback that ends the run."""
    import websockets

    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(probe)
    except (OSError, websockets.exceptions.WebSocketException) as exc:
        return {"sessions": sessions, "error": f"{type(exc).__name__}: {exc}"[:200]}


def _run_against_server(args, doc, scenarios, sessions, spread_sessions, realtime_settings, speech_settings, deadline, out) -> None:
    from benchmarks import capacity, realtime, speech
    from benchmarks.server import ManagedServer, ResourceMonitor, ServerHandle, remote_model_id

    texts = [QUICK_SENTENCE] if args.quick else list(SENTENCES)
    utterances = [make_utterance(text, args.fixtures) for text in texts]
    doc["settings"]["fixtures"] = {"source": utterances[0].source, "seconds": [round(u.seconds, 2) for u in utterances]}
    if args.url:
        base_url = args.url.rstrip("/")
        handle = ServerHandle(base_url, args.server_pid, remote_model_id(base_url, args.api_key))
        context: Any = _Given(handle)
    else:
        log_path = out / f"{args.name}-server.log"
        needed = [*((*sessions, *spread_sessions) if "realtime" in scenarios else ()), *(doc["settings"]["webrtc"]["sessions"] if "webrtc" in scenarios else ()), 1]
        if "realtime" in scenarios and args.find_capacity:
            needed.append(args.capacity_limit)
        if "soak" in scenarios:
            needed.append(sessions[0])
        sip_target = _sip_target(args) if "sip" in scenarios else None
        if sip_target is not None:
            needed += list(_sip_counts(args))
        context = ManagedServer(args.config, max(needed), log_path, args.api_key, unit_trace=args.unit_trace, sched=args.server_sched,
                                max_seq_len=args.max_seq_len, sip=sip_target[2] if sip_target else None, kv_cache=args.kv_cache)
    with context as server:
        doc["server"] = {"url": server.base_url, "model_id": server.model_id, "started_by_harness": server.started_by_harness, "startup_s": server.startup_s, "config": args.config or "embedded_cpu.yaml", "profile": server.profile_path, "log": server.log_path,
                         "sched": (args.server_sched or SERVER_DEFAULT) if server.started_by_harness else policy_of(server.pid)}
        if "realtime" in scenarios:
            levels = []
            spread_settings = dataclasses.replace(realtime_settings, stagger_s=args.spread, turns=args.spread_turns)
            plan = [(count, "together", realtime_settings) for count in sessions]
            plan += [(count, "spread", spread_settings) for count in spread_sessions]

            def run_level(count: int, arrivals: str, settings: Any) -> dict[str, Any]:
                before = server_counts(server.base_url, args.api_key)
                window_start = time.perf_counter()
                with ResourceMonitor(server.pid) as monitor, ResourceMonitor(os.getpid(), include_children=False) as client:
                    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:  # the server's loop, uvloop
                        results, wall = runner.run(realtime.run_level(server.ws_url, server.model_id, args.api_key, count, utterances, settings))
                level = realtime.summarize_level(count, results, wall, settings, arrivals)
                level["window_perf_counter"] = [round(window_start, 3), round(time.perf_counter(), 3)]  # for --unit-trace
                level["server"] = monitor.summary(count)
                after = server_counts(server.base_url, args.api_key)
                level["batch_sizes"] = mean_batch_sizes(before.batches, after.batches)
                level["node_events"] = node_event_deltas(before.events, after.events)
                # The load generator's own CPU: on a small machine it competes with the server.
                level["client_cpu_percent"] = client.cpu_percent()
                print(f"realtime N={report.level_label(level)}: {level['turns_completed']}/{level['turns_planned']} turns, TTFA p50 {level['ttfa_from_speech_stopped_ms']['p50']} ms, {level['errors']['count']} errors, {level['wall_s']} s", file=sys.stderr)
                time.sleep(0.5)  # let the server free the sessions before the next level
                return level

            if args.find_capacity and 1 not in sessions:
                plan.insert(0, (1, "together", realtime_settings))  # the search's yardstick
            for count, arrivals, settings in plan:
                if time.monotonic() > deadline:
                    levels.append({**_skipped_level(count, "deadline reached"), "arrivals": arrivals})
                    continue
                levels.append(run_level(count, arrivals, settings))
            doc["realtime"] = {"levels": levels}
            idle_count = max((*sessions, *spread_sessions))
            if server.pid is not None and time.monotonic() < deadline:
                with ResourceMonitor(server.pid) as monitor:
                    doc["realtime"]["idle_memory"] = _session_probe(idle_count, capacity.idle_memory(
                        server.ws_url, server.model_id, args.api_key, idle_count, monitor.rss_mb))
                    doc["realtime"]["streaming"] = _session_probe(idle_count, capacity.streaming_cost(
                        server.ws_url, server.model_id, args.api_key, idle_count, monitor.cpu_seconds,
                        seconds=1.0 if args.quick else 10.0, warmup_s=0.5 if args.quick else 2.0))
                time.sleep(0.5)
            one = next((n for n in levels if n["sessions"] == 1 and n.get("arrivals") != "spread" and "skipped" not in n), None)
            if args.find_capacity and one is not None and one["ttfa_from_speech_stopped_ms"].get("p50"):

                def probe(count: int) -> dict[str, Any]:
                    levels.append(run_level(count, "spread", spread_settings))  # a row of the table too
                    return levels[-1]

                doc["realtime"]["capacity"] = capacity.search(
                    probe, list(levels),
                    one["ttfa_from_speech_stopped_ms"]["p50"], deadline, args.capacity_limit)
                print(f"capacity: {doc['realtime']['capacity']['sessions']} sessions", file=sys.stderr)
        if "sip" in scenarios and not args.url:  # on the same server: its TTFA is the realtime levels' to compare with
            assert sip_target is not None
            doc["sip"] = _sip_levels(args, server, sip_target[0], sip_target[1], deadline)
        if "soak" in scenarios:
            doc["soak"] = _run_soak(server, args, sessions[0], utterances, realtime_settings)
        if "webrtc" in scenarios:
            doc["webrtc"] = _run_webrtc(server, args, doc["settings"]["webrtc"]["sessions"], utterances, realtime_settings, deadline)
        if "speech" in scenarios:
            if time.monotonic() > deadline:
                doc["speech"] = {"skipped": "deadline reached"}
            else:
                with ResourceMonitor(server.pid) as monitor, ResourceMonitor(os.getpid(), include_children=False) as client:
                    doc["speech"] = asyncio.run(speech.run(server.base_url, server.model_id, args.api_key, speech_settings, deadline))
                doc["speech"]["server"] = monitor.summary(1)
                doc["speech"]["client_cpu_percent"] = client.cpu_percent()
                print(f"speech: {len(doc['speech']['levels'])} levels done", file=sys.stderr)


def _sip_counts(args) -> tuple[int, ...]:
    return args.calls or ((1,) if args.quick else (1, 20))


def _sip_target(args) -> tuple[tuple[str, int], int, dict[str, Any]]:
    """For a server the harness starts: its SIP address, the callers' webhook port, its `sip:` section."""
    from benchmarks import sip
    from benchmarks.server import free_port

    address = ("127.0.0.1", free_port())
    webhook_port = args.sip_webhook_port or free_port()
    return address, webhook_port, sip.sip_section(address[1], webhook_port)


def _run_sip(args, deadline: float, out: Path) -> dict[str, Any]:
    """The `sip` scenario alone: against `--url` and `--sip`, or a server the harness starts
    with `--sip` on a free port."""
    from benchmarks.server import ManagedServer, ServerHandle, free_port

    if args.url:
        if not args.sip:
            return {"skipped": "--url needs --sip HOST:PORT (the server's SIP endpoint)"}
        host, port = args.sip.rsplit(":", 1)
        handle = ServerHandle(args.url.rstrip("/"), args.server_pid, "")
        return _sip_levels(args, handle, (host, int(port)), args.sip_webhook_port or free_port(), deadline)
    address, webhook_port, section = _sip_target(args)
    with ManagedServer(args.config, max(_sip_counts(args)), out / f"{args.name}-sip-server.log", args.api_key, sched=args.server_sched, sip=section) as server:
        return _sip_levels(args, server, address, webhook_port, deadline)


def _sip_levels(args, server, address: tuple[str, int], webhook_port: int, deadline: float) -> dict[str, Any]:
    from benchmarks import sip

    utterance = make_utterance(QUICK_SENTENCE, args.fixtures)
    levels = []
    for count in _sip_counts(args):
        if time.monotonic() > deadline:
            levels.append({"calls": count, "skipped": "deadline reached"})
            continue
        level = sip.run_level(server.base_url, address, webhook_port, count, utterance, args.api_key)
        levels.append(level)
        print(f"sip N={count}: {level['answered']}/{count} answered, {level['errors']['count']} errors", file=sys.stderr)
    print(sip.render([level for level in levels if "skipped" not in level]))
    return {"levels": levels, "speech_s": round(utterance.seconds, 2), "source": utterance.source}


def _run_soak(server, args, sessions: int, utterances, settings) -> dict[str, Any]:
    from benchmarks import soak

    soak_settings = soak.SoakSettings(
        minutes=args.minutes, window_s=args.window_minutes * 60.0, truncation=soak.parse_truncation(args.truncation),
        realtime=dataclasses.replace(settings, gap_s=3.0), sample_s=min(5.0, args.window_minutes * 60.0 / 4))
    result = soak.run(server, args.api_key, sessions, utterances, soak_settings, event_loop_factory())
    result["max_seq_len"] = args.max_seq_len
    result["kv_cache"] = args.kv_cache
    print(soak.render(result), file=sys.stderr)
    return result


def _run_webrtc(server, args, counts, utterances, settings, deadline) -> dict[str, Any]:
    import importlib.util

    from benchmarks import webrtc

    if importlib.util.find_spec("clients.python.webrtc") is None:
        return {"skipped": "the WebRTC client (clients/python/webrtc.py) is not installed"}
    levels = []
    for count in counts:
        if time.monotonic() > deadline:
            levels.append(_skipped_level(count, "deadline reached"))
            continue
        level = asyncio.run(webrtc.run_level(server.base_url, server.model_id, args.api_key, count, utterances, settings))
        levels.append(level)
        print(f"webrtc N={count}: {level['turns_completed']}/{level['turns_planned']} turns, TTFA p50 {level['ttfa_from_speech_stopped_ms']['p50']} ms, {level['errors']['count']} errors", file=sys.stderr)
    return {"levels": levels}


class ServerCounts(NamedTuple):
    """The server's counters a level reads before and after itself, from /metrics."""

    batches: dict[str, tuple[float, float]]  # per shared executor: (batched calls, items they held)
    events: dict[str, float]  # per "node.event" (`sgl_omni_node_events_total`)


def server_counts(base_url: str, api_key: str | None) -> ServerCounts:
    """The server's batch and node-event counters; empty if /metrics is unreadable."""
    from prometheus_client.parser import text_string_to_metric_families

    from benchmarks.server import auth_headers

    counts = ServerCounts({}, {})
    try:
        text = httpx.get(base_url + "/metrics", headers=auth_headers(api_key), timeout=10).text
    except httpx.HTTPError:
        return counts
    batches: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name in ("sgl_omni_batches", "sgl_omni_batch_items"):
                slot = 0 if family.name == "sgl_omni_batches" else 1
                batches.setdefault(sample.labels["executor"], [0.0, 0.0])[slot] = sample.value
            elif family.name == "sgl_omni_node_events":
                counts.events[f"{sample.labels['node']}.{sample.labels['event']}"] = sample.value
    counts.batches.update({name: (runs, items) for name, (runs, items) in batches.items()})
    return counts


def node_event_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """How often each node event (e.g. thinker.early_prefill_confirmed) happened over a level."""
    return {name: int(count - before.get(name, 0.0)) for name, count in after.items() if count > before.get(name, 0.0)}


def mean_batch_sizes(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Items per batched call of each executor over a level (executors that ran during it)."""
    sizes = {}
    for name, (runs, items) in after.items():
        runs_before, items_before = before.get(name, (0.0, 0.0))
        if runs > runs_before:
            sizes[name] = round((items - items_before) / (runs - runs_before), 2)
    return sizes


def _skipped_level(sessions: int, why: str) -> dict[str, Any]:
    empty = {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "sessions": sessions,
        "skipped": why,
        "turns_planned": 0,
        "turns_completed": 0,
        "ttfa_from_speech_stopped_ms": empty,
        "ttfa_from_user_audio_end_ms": empty,
        "turn_latency_ms": empty,
        "underruns": {"total": 0, "per_turn": None, "turns_with_underrun": 0, "stall_ms": empty},
        "events_per_s": None,
        "errors": {"count": 0, "by_kind": {}},
    }


class _Given:
    """A server someone else runs: nothing to start or stop."""

    def __init__(self, handle: Any):
        self.handle = handle

    def __enter__(self) -> Any:
        return self.handle

    def __exit__(self, *exc_info: Any) -> None:
        return None


def machine_info() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "packages": {name: version(name) for name in ("torch", "transformers", "onnxruntime", "sgl-omni-server")},
    }
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


if __name__ == "__main__":
    sys.exit(main())
