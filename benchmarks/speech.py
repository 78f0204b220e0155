"""The `speech` scenario: /v1/audio/speech and /v1/audio/speech/batch under concurrency.

For each concurrency level C, C workers send requests back to back (sentences picked by a
seeded generator) until the level's time budget is spent; requests in flight then finish.
Two modes per level: `file` (the whole WAV in one response: latency = the full answer) and
`sse` (`stream_format: "sse"`, PCM: first-chunk latency = the first `speech.audio.delta`).
Throughput is reported as requests/s and as seconds of audio produced per wall second.
The batch endpoint is measured with one request of `batch_items` items.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.fixtures import SENTENCES
from benchmarks.server import auth_headers
from benchmarks.stats import summarize

OUTPUT_RATE = 24000


@dataclass
class SpeechSettings:
    concurrency: tuple[int, ...] = (1, 4, 16, 32)
    level_budget_s: float = 20.0
    batch_items: int = 8
    max_new_tokens: int | None = None
    voice: str | None = None
    request_timeout_s: float = 120.0
    seed: int = 0


@dataclass
class _Outcome:
    ok: bool
    latency_s: float
    first_chunk_s: float | None = None
    audio_s: float = 0.0
    error: str | None = None


def _body(text: str, settings: SpeechSettings, model_id: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model_id, "input": text, **extra}
    if settings.voice:
        body["voice"] = settings.voice
    if settings.max_new_tokens:
        body["max_new_tokens"] = settings.max_new_tokens
    return body


def _wav_seconds(data: bytes) -> float:
    import soundfile as sf

    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


def _http_error(status: int, body: bytes) -> str:
    """`http_503:speech_capacity_reached`: the status and, when the body is an OpenAI error, its code."""
    try:
        code = json.loads(body)["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = None
    return f"http_{status}:{code}" if code else f"http_{status}"


async def _whole_file(client: httpx.AsyncClient, body: dict[str, Any]) -> _Outcome:
    started = time.perf_counter()
    try:
        response = await client.post("/v1/audio/speech", json={**body, "response_format": "wav"})
        latency = time.perf_counter() - started
        if response.status_code != 200:
            return _Outcome(False, latency, error=_http_error(response.status_code, response.content))
        return _Outcome(True, latency, audio_s=_wav_seconds(response.content))
    except httpx.HTTPError as exc:
        return _Outcome(False, time.perf_counter() - started, error=type(exc).__name__)


async def _sse(client: httpx.AsyncClient, body: dict[str, Any]) -> _Outcome:
    started = time.perf_counter()
    first: float | None = None
    audio_bytes = 0
    try:
        async with client.stream("POST", "/v1/audio/speech", json={**body, "response_format": "pcm", "stream_format": "sse"}) as response:
            if response.status_code != 200:
                body = await response.aread()
                return _Outcome(False, time.perf_counter() - started, error=_http_error(response.status_code, body))
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:].strip())
                kind = event.get("type")
                if kind == "speech.audio.delta":
                    if first is None:
                        first = time.perf_counter() - started
                    audio_bytes += len(base64.b64decode(event.get("audio", "")))
                elif kind == "speech.audio.error":
                    return _Outcome(False, time.perf_counter() - started, first, error="speech.audio.error")
                elif kind == "speech.audio.done":
                    break
        return _Outcome(True, time.perf_counter() - started, first, audio_bytes / 2 / OUTPUT_RATE)
    except httpx.HTTPError as exc:
        return _Outcome(False, time.perf_counter() - started, first, error=type(exc).__name__)


async def run_level(client: httpx.AsyncClient, model_id: str, concurrency: int, mode: str, settings: SpeechSettings) -> dict[str, Any]:
    rng = random.Random(settings.seed * 1000 + concurrency)
    request = _whole_file if mode == "file" else _sse
    outcomes: list[_Outcome] = []
    started = time.perf_counter()
    stop_at = started + settings.level_budget_s

    async def worker() -> None:
        # Every worker sends at least one request, so each level has C samples at least.
        while True:
            text = SENTENCES[rng.randrange(len(SENTENCES))]
            outcomes.append(await request(client, _body(text, settings, model_id)))
            if time.perf_counter() >= stop_at:
                return

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    good = [o for o in outcomes if o.ok]
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.error:
            errors[outcome.error] = errors.get(outcome.error, 0) + 1
    return {
        "concurrency": concurrency,
        "mode": mode,
        "requests": len(outcomes),
        "ok": len(good),
        "latency_ms": summarize((o.latency_s for o in good), 1000),
        "first_chunk_ms": summarize((o.first_chunk_s for o in good if o.first_chunk_s is not None), 1000),
        "requests_per_s": round(len(good) / wall, 3),
        "audio_s_per_s": round(sum(o.audio_s for o in good) / wall, 3),
        "wall_s": round(wall, 2),
        "errors": {"count": sum(errors.values()), "by_kind": errors},
    }


async def run_batch(client: httpx.AsyncClient, model_id: str, settings: SpeechSettings) -> dict[str, Any]:
    items = [{"input": SENTENCES[i % len(SENTENCES)]} for i in range(settings.batch_items)]
    body: dict[str, Any] = {"model": model_id, "items": items, "response_format": "wav"}
    if settings.voice:
        body["voice"] = settings.voice
    if settings.max_new_tokens:
        body["max_new_tokens"] = settings.max_new_tokens
    started = time.perf_counter()
    result: dict[str, Any] = {"items": settings.batch_items}
    try:
        response = await client.post("/v1/audio/speech/batch", json=body)
    except httpx.HTTPError as exc:
        return {**result, "error": type(exc).__name__, "wall_s": round(time.perf_counter() - started, 2)}
    wall = time.perf_counter() - started
    if response.status_code != 200:
        return {**result, "error": f"http_{response.status_code}", "wall_s": round(wall, 2)}
    payload = response.json()
    audio = sum(_wav_seconds(base64.b64decode(r["audio_data"])) for r in payload.get("results", []) if r.get("status") == "success")
    return {
        **result,
        "succeeded": payload.get("succeeded"),
        "failed": payload.get("failed"),
        "wall_s": round(wall, 2),
        "items_per_s": round((payload.get("succeeded") or 0) / wall, 3),
        "audio_s_per_s": round(audio / wall, 3),
    }


async def run(base_url: str, model_id: str, api_key: str | None, settings: SpeechSettings, deadline: float | None = None) -> dict[str, Any]:
    """Every level (file and SSE), then the batch request; levels past `deadline` (monotonic) are skipped."""
    headers = auth_headers(api_key)
    limits = httpx.Limits(max_connections=max(settings.concurrency) + 4, max_keepalive_connections=max(settings.concurrency) + 4)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=settings.request_timeout_s, limits=limits) as client:
        levels: list[dict[str, Any]] = []
        skipped: list[str] = []
        for concurrency in settings.concurrency:
            for mode in ("file", "sse"):
                if deadline is not None and time.monotonic() > deadline:
                    skipped.append(f"C={concurrency} {mode}")
                    continue
                levels.append(await run_level(client, model_id, concurrency, mode, settings))
        if deadline is not None and time.monotonic() > deadline:
            skipped.append("batch")
            batch: dict[str, Any] = {}
        else:
            batch = await run_batch(client, model_id, settings)
    result: dict[str, Any] = {"levels": levels, "batch": batch}
    if skipped:
        result["skipped_levels"] = {"reason": "deadline reached", "levels": skipped}
    return result
