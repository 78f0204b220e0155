"""How many live sessions the server holds: the capacity search and the idle-session memory probe.

Capacity (`sgl-omni bench realtime --find-capacity`): the largest session count whose spread-
arrival level (start offsets over one turn cycle, `--spread-turns` turns each) still meets the
scale goal of issue 12: time to first audio p95 <= 2x the 1-session p50 of the same run, no
underrun with a 100 ms playback buffer, no error, every turn answered. Levels already run count;
the search then grows the count by half until a level fails, and halves the gap between the
largest pass and the smallest failure until it is within `resolution` sessions. Each probe is a
full spread level (about half a minute), so the run's `--deadline` bounds the search; what it
found by then is reported, with the levels it tried.

Idle memory: `idle_memory` opens N sessions that send nothing and reads the server's resident
memory (engine processes included) before and after: the cost of a connected, silent session.

Streaming cost: `streaming_cost` opens N sessions that stream silence at wall-clock pace (20 ms
appends, server VAD on, as a listening user's microphone) and measures the CPU time the server
(engines included) and the load generator spend per append: what every live session costs
before anyone speaks. At 64 sessions on the 2-vCPU development VM that was about half of all
the CPU of a 64-session level (docs/notebook/2026-12-02-streaming-load.md). It moves less
with how busy the machine is than time to first audio, so alternated runs show small changes to the audio path.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import websockets

from benchmarks.realtime import CHUNK_MS, SAMPLE_RATE, SILENCE_MESSAGE, Pacer
from benchmarks.server import auth_headers

GOAL_RATIO = 2.0


def meets_goal(level: dict[str, Any], one_session_p50_ms: float) -> bool:
    p95 = level["ttfa_from_speech_stopped_ms"].get("p95")
    return (
        "skipped" not in level
        and p95 is not None
        and p95 <= GOAL_RATIO * one_session_p50_ms
        and level["underruns"].get("total_with_100ms_buffer", 0) == 0
        and level["errors"]["count"] == 0
        and level["turns_completed"] == level["turns_planned"]
    )


def search(run_spread_level: Callable[[int], dict[str, Any]], levels: list[dict[str, Any]], one_session_p50_ms: float,
           deadline: float, limit: int, resolution: int = 8) -> dict[str, Any]:
    """Probe spread levels (`run_spread_level(n)` runs one and returns its row) for the largest
    count meeting the goal. `levels`: rows already run (their spread ones count)."""
    outcome = {n["sessions"]: meets_goal(n, one_session_p50_ms) for n in levels if n.get("arrivals") == "spread" and "skipped" not in n}

    def bounds() -> tuple[int, int | None]:
        passed = max((n for n, ok in outcome.items() if ok), default=0)
        failed = min((n for n, ok in outcome.items() if not ok and n > passed), default=None)
        return passed, failed

    while time.monotonic() < deadline:
        passed, failed = bounds()
        if failed is None:
            if passed >= limit:
                break
            count = min(limit, max(passed + resolution, passed * 3 // 2, 1))
        elif failed - passed <= resolution:
            break
        else:
            count = (passed + failed) // 2
        outcome[count] = meets_goal(run_spread_level(count), one_session_p50_ms)
    passed, failed = bounds()
    return {
        "sessions": passed,
        "first_failing": failed,
        "limit": limit,
        "goal": f"spread arrivals: TTFA p95 <= {GOAL_RATIO:g}x the 1-session p50 ({GOAL_RATIO * one_session_p50_ms:.0f} ms), "
                "0 underruns with a 100 ms buffer, 0 errors",
        "one_session_p50_ms": one_session_p50_ms,
        "tried": {str(n): ok for n, ok in sorted(outcome.items())},
        "complete": failed is not None and failed - passed <= resolution or passed >= limit,
    }


async def _open(ws_url: str, model_id: str, api_key: str | None, sessions: int, sockets: list[Any]) -> None:
    """Open `sessions` realtime sessions into `sockets` (the caller closes them), each confirmed by
    its `session.created`. A session the server refuses raises websockets' `ConnectionClosed`
    (its close reason, e.g. `session_limit_reached`)."""
    for _ in range(sessions):
        ws = await websockets.connect(f"{ws_url}/v1/realtime?model={model_id}", additional_headers=auth_headers(api_key), max_size=None)
        sockets.append(ws)
        while json.loads(await ws.recv())["type"] != "session.created":
            pass


async def idle_memory(ws_url: str, model_id: str, api_key: str | None, sessions: int,
                      rss_mb: Callable[[], float], settle_s: float = 2.0) -> dict[str, Any]:
    """Resident memory of the server with `sessions` connected, silent sessions, per session."""
    before = rss_mb()
    sockets: list[Any] = []
    try:
        await _open(ws_url, model_id, api_key, sessions, sockets)
        await asyncio.sleep(settle_s)
        after = rss_mb()
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {"sessions": sessions, "rss_mb_before": round(before, 1), "rss_mb_after": round(after, 1),
            "rss_mb_per_idle_session": round(max(after - before, 0.0) / max(sessions, 1), 2)}


async def streaming_cost(ws_url: str, model_id: str, api_key: str | None, sessions: int,
                         server_cpu_s: Callable[[], float], seconds: float = 10.0, warmup_s: float = 2.0) -> dict[str, Any]:
    """CPU per append of `sessions` sessions streaming silence for `seconds` (after `warmup_s`):
    the server's (`server_cpu_s()`: its CPU seconds so far, engines included) and this process's."""
    update = json.dumps({"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["audio"],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": {"type": "server_vad"}}}}})
    sent = 0

    async def stream(ws: Any, phase_s: float) -> None:  # until cancelled
        nonlocal sent
        await asyncio.sleep(phase_s)
        pacer = Pacer()
        while True:
            await pacer.tick()
            await ws.send(SILENCE_MESSAGE)
            sent += 1

    async def drain(ws: Any) -> None:
        async for _ in ws:
            pass

    sockets: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await _open(ws_url, model_id, api_key, sessions, sockets)
        # Independent microphones: the sessions' 20 ms ticks spread evenly over a tick. Started in
        # step, they measured 135-143 us per append against 189-190 spread (two pairs): the server
        # then takes many appends per wake-up, and the engines make larger VAD batches.
        for index, ws in enumerate(sockets):
            await ws.send(update)
            tasks += [asyncio.create_task(stream(ws, index / len(sockets) * CHUNK_MS / 1000)), asyncio.create_task(drain(ws))]
        await asyncio.sleep(warmup_s)
        appends, server_before, client_before, started = sent, server_cpu_s(), time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        appends, server_cpu, client_cpu = sent - appends, server_cpu_s() - server_before, time.process_time() - client_before
        wall = time.perf_counter() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    per_append = 1e6 / max(appends, 1)
    return {
        "sessions": sessions, "seconds": round(wall, 2), "appends": appends, "chunk_ms": CHUNK_MS,
        "server_cpu_percent": round(100 * server_cpu / wall, 1), "server_us_per_append": round(server_cpu * per_append, 1),
        "client_cpu_percent": round(100 * client_cpu / wall, 1), "client_us_per_append": round(client_cpu * per_append, 1),
    }
