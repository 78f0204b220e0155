"""The `webrtc` scenario: the realtime turns of `realtime.py`, over WebRTC, for small N.

Each simulated user is the project's Python WebRTC client (`clients.python.webrtc`, aiortc):
the offer goes to `POST /v1/realtime/calls`, events come on the `oai-events` data channel, the
spoken sentence is played into the Opus microphone track in real time (silence otherwise), and
the reply arrives on the server's audio track, which the server paces in real time.

Per turn: time to first audio = the first audible frame of the server's track after
`speech_stopped` (and after the end of the user's audio, when the microphone queue drained);
turn latency = `response.done`. Underruns are not counted here: the server's track is paced
and fills gaps with silence, so a gap is not visible as a late packet; the WebSocket scenario
measures them.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any
from urllib.parse import urlparse

from benchmarks.fixtures import SAMPLE_RATE, Utterance
from benchmarks.realtime import RealtimeSettings, session_plans
from benchmarks.stats import summarize

AUDIBLE_RMS = 0.003


async def _session(base_url: str, api_key: str | None, model_id: str, utterances: list[Utterance], settings: RealtimeSettings, delay_s: float) -> tuple[list[dict[str, float]], list[str], int]:
    from clients.python.webrtc import WebRTCSession

    await asyncio.sleep(delay_s)
    host = urlparse(base_url).hostname or ""
    session: dict[str, Any] = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}}},
    }
    if settings.max_output_tokens:
        session["max_output_tokens"] = settings.max_output_tokens
    turns: list[dict[str, float]] = []
    errors: list[str] = []
    try:
        async with WebRTCSession.connect(base_url, api_key=api_key, session=session, loopback=host in ("127.0.0.1", "localhost"), model=model_id) as call:
            for utterance in utterances:
                mark = time.monotonic()
                call.microphone.play(utterance.samples, SAMPLE_RATE)
                await call.microphone.drained.wait()
                user_end = time.monotonic()
                try:
                    while True:
                        done = await call.next_event("response.done", timeout=settings.turn_timeout_s)
                        done_at = time.monotonic()
                        stopped = call.event_time("input_audio_buffer.speech_stopped", after=mark)
                        if stopped is not None and done_at >= user_end:
                            break
                except TimeoutError:
                    errors.append("turn_timeout")
                    break
                status = (done.get("response") or {}).get("status")
                if status in ("failed", "cancelled"):
                    errors.append(f"response_{status}")
                # The paced track may still be playing the reply: give its first frame time to come.
                first = None
                wait_until = time.monotonic() + 5.0
                while first is None and time.monotonic() < wait_until:
                    first = call.first_sound_after(stopped, AUDIBLE_RMS)
                    if first is None:
                        await asyncio.sleep(0.02)
                if first is None:
                    errors.append("no_audio")
                    continue
                turns.append({"ttfa_from_speech_stopped_s": first - stopped, "ttfa_from_user_audio_end_s": first - user_end, "turn_latency_s": done_at - stopped})
                await asyncio.sleep(settings.gap_s)
            events = len(call.log)
    except Exception as exc:  # noqa: BLE001 - a failed call is a counted error
        errors.append(f"call: {type(exc).__name__}: {exc}"[:200])
        events = 0
    return turns, errors, events


async def run_level(base_url: str, model_id: str, api_key: str | None, sessions: int, utterances: list[Utterance], settings: RealtimeSettings) -> dict[str, Any]:
    rng = random.Random(settings.seed * 1000 + sessions + 500)
    jobs = [_session(base_url, api_key, model_id, picks, settings, delay)
            for picks, delay in session_plans(rng, sessions, utterances, settings)]
    started = time.perf_counter()
    results = await asyncio.gather(*jobs)
    wall = time.perf_counter() - started
    turns = [t for r in results for t in r[0]]
    errors: dict[str, int] = {}
    for _, errs, _ in results:
        for error in errs:
            errors[error] = errors.get(error, 0) + 1
    return {
        "sessions": sessions,
        "turns_planned": sessions * settings.turns,
        "turns_completed": len(turns),
        "ttfa_from_speech_stopped_ms": summarize((t["ttfa_from_speech_stopped_s"] for t in turns), 1000),
        "ttfa_from_user_audio_end_ms": summarize((t["ttfa_from_user_audio_end_s"] for t in turns), 1000),
        "turn_latency_ms": summarize((t["turn_latency_s"] for t in turns), 1000),
        "events_per_s": round(sum(r[2] for r in results) / wall, 1) if wall > 0 else None,
        "wall_s": round(wall, 2),
        "errors": {"count": sum(errors.values()), "by_kind": errors},
    }
