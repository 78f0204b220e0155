"""The `soak` scenario: N sessions that keep talking for M minutes, reported per time window.

`sgl-omni bench soak --minutes M --sessions N [--window-minutes W] [--truncation MODE] [--max-seq-len T]`

Each simulated user is the realtime scenario's (benchmarks/realtime.py: the same speech, the
same 20 ms wall-clock appends, server VAD), speaking a turn, waiting for its reply and a pause of
a few seconds, again and again until M minutes have passed. Every `TEXT_EVERY`-th turn is
preceded by a text item (`conversation.item.create`, input_text) and every `CALL_EVERY`-th by a
function call and its output (client-created items), so the conversation holds what long real
sessions hold. The session asks for `--truncation` (`auto`, `disabled`, `retention_ratio:R` or
`retention_ratio:R:N` for `token_limits.post_instructions` N).

Per window of `--window-minutes` (5; less for short runs, so that they have several windows),
over the turns whose speech stopped in it: TTFA p50/p95 (from `speech_stopped`), underruns,
errors (by kind; `context_exhausted` counted apart), the model's context per session at a reply
(usage `input_tokens`: the KV it holds), mean `cached_tokens / input_tokens` per turn, the
truncations and their rebuild time (the thinker's counters on /metrics), and the resident memory
of the server process and of each engine at the window's end.

`--max-seq-len T` (the profile option) lowers the thinker's context (the model resource's
`max_seq_len` and `limits.max_seq_len`) so that the tiny model's sessions fill it within minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.fixtures import Utterance
from benchmarks.realtime import Pacer, RealtimeSettings, SessionResult, _Session
from benchmarks.server import auth_headers
from benchmarks.stats import summarize

TEXT_EVERY = 3  # every third turn brings a text item before it
CALL_EVERY = 5  # every fifth turn a function call and its output before it
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@dataclass
class SoakSettings:
    minutes: float = 10.0
    window_s: float = 300.0
    truncation: str | dict[str, Any] = "auto"
    realtime: RealtimeSettings = field(default_factory=lambda: RealtimeSettings(gap_s=3.0))
    sample_s: float = 5.0  # how often the server's memory and counters are read


def parse_truncation(text: str) -> str | dict[str, Any]:
    """`auto` | `disabled` | `retention_ratio:R[:N]` -> the GA `session.truncation` value."""
    if text in ("auto", "disabled"):
        return text
    kind, _, rest = text.partition(":")
    if kind != "retention_ratio" or not rest:
        raise ValueError(f"expected auto, disabled or retention_ratio:R[:N], got {text!r}")
    ratio, _, limit = rest.partition(":")
    mode: dict[str, Any] = {"type": "retention_ratio", "retention_ratio": float(ratio)}
    if limit:
        mode["token_limits"] = {"post_instructions": int(limit)}
    return mode


class TimedErrors(list):
    """A session's errors (strings, as `SessionResult.errors`), each remembered with when it came."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def append(self, error: str) -> None:  # type: ignore[override]
        super().append(error)
        self.at.append(time.perf_counter())


class _SoakSession(_Session):
    """A realtime user who keeps talking until `ends_at` (see the module docstring)."""

    def __init__(self, *args: Any, ends_at: float, truncation: str | dict[str, Any], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ends_at = ends_at
        self.truncation = truncation
        self.result = SessionResult(turns=[], errors=TimedErrors())
        self.rng = random.Random(self.index)

    def session_config(self) -> dict[str, Any]:
        return {**super().session_config(), "truncation": self.truncation, "tools": [WEATHER_TOOL], "tool_choice": "auto"}

    async def _converse(self, ws: Any) -> None:
        await self._configure(ws)
        clock = Pacer()
        turn_index = 0
        while time.perf_counter() < self.ends_at:
            if turn_index % CALL_EVERY == CALL_EVERY - 1:
                call_id = f"call_{self.index}_{turn_index}"
                await self._create_item(ws, {"type": "function_call", "call_id": call_id, "name": "get_weather",
                                             "arguments": json.dumps({"city": "Paris"})})
                await self._create_item(ws, {"type": "function_call_output", "call_id": call_id,
                                             "output": json.dumps({"temp_c": 12 + turn_index % 10})})
            elif turn_index % TEXT_EVERY == TEXT_EVERY - 1:
                await self._create_item(ws, {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": "I am still here, by the way."}]})
            utterance = self.utterances[self.rng.randrange(len(self.utterances))]
            if not await self._speak_turn(ws, clock, turn_index, utterance):
                break
            turn_index += 1
        self.result.client_lag_s = clock.worst_lag_s

    async def _create_item(self, ws: Any, item: dict[str, Any]) -> None:
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))


class ServerSampler:
    """Every `interval_s` in a thread: the resident memory of the server process and of each of
    its engine processes, and the thinker's truncation counters from /metrics."""

    def __init__(self, base_url: str, api_key: str | None, pid: int | None, interval_s: float):
        self.base_url, self.api_key, self.pid, self.interval_s = base_url, api_key, pid, interval_s
        # (perf_counter, {process: rss MB}, {counter: value})
        self.samples: list[tuple[float, dict[str, float], dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def __enter__(self) -> ServerSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), self.rss_mb(), self.counters()))

    def rss_mb(self) -> dict[str, float]:
        import psutil

        if self.pid is None:
            return {}
        found: dict[str, float] = {}
        with contextlib.suppress(psutil.Error):
            server = psutil.Process(self.pid)
            found["server"] = server.memory_info().rss / 2**20
            engines = [p for p in server.children(recursive=True) if "graph.engine_process" in " ".join(p.cmdline())]
            for number, engine in enumerate(sorted(engines, key=lambda p: p.pid)):
                with contextlib.suppress(psutil.Error):
                    found[f"engine{number}"] = engine.memory_info().rss / 2**20
        return found

    def counters(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = httpx.get(self.base_url + "/metrics", headers=auth_headers(self.api_key), timeout=10).text
        except httpx.HTTPError:
            return {}
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name != "sgl_omni_node_events":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("event", "").startswith("truncat"):
                    key = sample.labels["event"]
                    found[key] = found.get(key, 0.0) + sample.value
        return found


async def run_sessions(ws_url: str, model_id: str, api_key: str | None, sessions: int, utterances: list[Utterance],
                       settings: SoakSettings) -> tuple[list[SessionResult], float, float]:
    """Run the soak's sessions to their end; returns their results and the run's start and end."""
    rng = random.Random(settings.realtime.seed * 1000 + sessions)
    url = f"{ws_url}/v1/realtime?model={model_id}"
    started = time.perf_counter()
    ends_at = started + settings.minutes * 60.0
    clients = [
        _SoakSession(index, url, auth_headers(api_key), utterances, settings.realtime,
                     rng.uniform(0, settings.realtime.gap_s + 2.0) if sessions > 1 else 0.0,
                     ends_at=ends_at, truncation=settings.truncation)
        for index in range(sessions)
    ]
    results = await asyncio.gather(*(client.run() for client in clients))
    return list(results), started, time.perf_counter()


# The thinker's truncation counters (nodes/thinker.py) a window reports as its differences.
TRUNCATION_COUNTERS = ("truncations", "truncation_rebuild_ms", "truncations_ahead", "truncation_waits")


def summarize_windows(results: list[SessionResult], samples: list[tuple[float, dict[str, float], dict[str, float]]],
                      started: float, ended: float, window_s: float, minutes: float) -> list[dict[str, Any]]:
    """The report's rows: one per window of `window_s` over the run's `minutes` from `started`
    (see the module docstring); the turns that finish after the end (begun before it) count in
    the last window."""
    count = max(1, math.ceil(minutes * 60.0 / window_s - 1e-9))
    rows = []
    for number in range(count):
        low, high = started + number * window_s, started + (number + 1) * window_s
        if number == count - 1:
            high = max(high, ended + 1.0)
        metrics, replies = [], []
        for result in results:
            for turn in result.turns:
                if turn.speech_stopped_at is None or not low <= turn.speech_stopped_at < high:
                    continue
                reply = turn.reply
                if reply is not None and reply.done_at is not None:
                    replies.append(reply)
                if (m := turn.metrics()) is not None:
                    metrics.append(m)
        errors: dict[str, int] = {}
        for result in results:
            at = getattr(result.errors, "at", [ended] * len(result.errors))
            for error, when in zip(result.errors, at):
                if low <= when < high:
                    errors[error] = errors.get(error, 0) + 1
        exhausted = sum(1 for r in replies if r.reason == "context_exhausted")
        exhausted += sum(n for kind, n in errors.items() if "context_exhausted" in kind)
        ratios = [r.cached_tokens / r.input_tokens for r in replies if r.input_tokens and r.cached_tokens is not None]
        inside = [s for s in samples if s[0] < high + 1e-6]
        before = [s for s in samples if s[0] <= low + 1e-6] or samples[:1]
        last, first = (inside[-1] if inside else samples[-1]), before[-1]
        counts = {key: int(last[2].get(key, 0) - first[2].get(key, 0)) for key in TRUNCATION_COUNTERS}
        rows.append({
            "window": number,
            "start_s": round(low - started, 1),
            "end_s": round(min(high, started + (number + 1) * window_s) - started, 1),
            "turns": len(metrics),
            "ttfa_ms": summarize([m["ttfa_from_speech_stopped_s"] for m in metrics if m["ttfa_from_speech_stopped_s"] is not None], 1000),
            "underruns": int(sum(m["underruns"] for m in metrics)),
            "errors": {"count": sum(errors.values()), "by_kind": errors},
            "context_exhausted": exhausted,
            "kv_tokens_per_session": summarize([r.input_tokens for r in replies if r.input_tokens is not None], 1, 0),
            "cached_over_input": round(sum(ratios) / len(ratios), 3) if ratios else None,
            "truncations": counts["truncations"],
            "truncation_rebuild_ms": counts["truncation_rebuild_ms"],
            "truncations_ahead": counts["truncations_ahead"],
            "truncation_waits": counts["truncation_waits"],
            "rss_mb": {name: round(value, 1) for name, value in last[1].items()},
        })
    return rows


def run(server: Any, api_key: str | None, sessions: int, utterances: list[Utterance], settings: SoakSettings,
        loop_factory: Any = None) -> dict[str, Any]:
    """The soak against a running server (`server`: a benchmarks.server.ServerHandle)."""
    with ServerSampler(server.base_url, api_key, server.pid, settings.sample_s) as sampler:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            results, started, ended = runner.run(run_sessions(server.ws_url, server.model_id, api_key, sessions, utterances, settings))
    windows = summarize_windows(results, sampler.samples, started, ended, settings.window_s, settings.minutes)
    return {
        "sessions": sessions,
        "minutes": settings.minutes,
        "window_s": settings.window_s,
        "truncation": settings.truncation,
        "turns": sum(w["turns"] for w in windows),
        "windows": windows,
        "errors": sum(w["errors"]["count"] for w in windows),
        "context_exhausted": sum(w["context_exhausted"] for w in windows),
    }


def render(soak: dict[str, Any]) -> str:
    """The soak's table, one row per window (what docs/benchmarks.md shows)."""
    names = sorted({name for w in soak["windows"] for name in w["rss_mb"]}, key=lambda n: (n != "server", n))
    head = ["window", "turns", "TTFA p50/p95 ms", "underruns", "errors", "ctx exhausted", "KV tok/session p50/max",
            "cached/input", "truncations (ahead, waited)", "rebuild ms", *[f"RSS {n} MB" for n in names]]
    lines = [f"soak: {soak['sessions']} sessions, {soak['minutes']} min, truncation {json.dumps(soak['truncation'])}, "
             f"{soak['turns']} turns, {soak['errors']} errors, {soak['context_exhausted']} context_exhausted",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in soak["windows"]:
        kv = w["kv_tokens_per_session"]
        cells = [f"{w['start_s']:.0f}-{w['end_s']:.0f} s", str(w["turns"]), f"{w['ttfa_ms']['p50']} / {w['ttfa_ms']['p95']}",
                 str(w["underruns"]), str(w["errors"]["count"]), str(w["context_exhausted"]), f"{kv['p50']} / {kv['max']}",
                 str(w["cached_over_input"]), f"{w['truncations']} ({w['truncations_ahead']}, {w['truncation_waits']})",
                 str(w["truncation_rebuild_ms"]),
                 *[str(w["rss_mb"].get(n)) for n in names]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
