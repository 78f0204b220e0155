"""The `realtime` scenario: N concurrent voice sessions over the realtime WebSocket API.

Each simulated user is a raw `websockets` client speaking the OpenAI Realtime GA events, as
any client would: `session.update` (PCM16 24 kHz in, server VAD), then for each of K turns it
streams a spoken sentence as `input_audio_buffer.append` events of 20 ms at wall-clock pace,
followed by silence (still at wall-clock pace: server VAD needs to hear the pause) until the
reply's `response.done`, plus a short gap. Sessions start at seeded offsets within
`stagger_s`, so the load is the same run to run. Two arrival patterns are reported:
- `together` (stagger 1 s): the users start within a second of each other and their turns
  end close together, the worst case for time to first audio (turns queue behind each other);
- `spread` (stagger of about one turn cycle): start offsets cover a whole turn, as users who do
  not know of each other would; this is the load where the CPU is not saturated in bursts.

Per turn it records when the user's audio ended, when `speech_stopped`, the reply's
`response.created`, each `response.output_audio.delta` (arrival time and duration) and
`response.done` arrived; `summarize_level` turns those into the figures of the report.

A turn belongs to the reply whose `response.created` follows the turn's last `speech_stopped`,
which must come after the user's audio ended (if VAD split the sentence, the earlier replies
were interrupted: counted as `vad_splits`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fixtures import SAMPLE_RATE, Utterance, pcm16
from benchmarks.server import auth_headers
from benchmarks.stats import busy_seconds, simulate_playback, summarize

CHUNK_MS = 20
CHUNK_SAMPLES = SAMPLE_RATE * CHUNK_MS // 1000
OUTPUT_RATE = 24000
# A second player that waits this long before it starts (a typical client jitter buffer).
JITTER_BUFFER_S = 0.1


@dataclass
class Reply:
    response_id: str
    created_at: float
    first_audio_at: float | None = None
    done_at: float | None = None
    status: str | None = None
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (arrival, seconds)
    output_tokens: int | None = None
    text_tokens: int = 0  # usage.output_token_details: thinker tokens
    audio_tokens: int = 0  # ... and talker codec frames
    input_tokens: int | None = None  # usage: the model's context at the reply
    cached_tokens: int | None = None  # ... of it reused from the KV cache
    reason: str | None = None  # status_details.reason (or its error's code) when not completed


@dataclass
class TurnRecord:
    session: int
    turn: int
    user_audio_start: float = 0.0
    user_audio_end: float | None = None
    speech_started: int = 0
    speech_stopped_at: float | None = None
    replies: list[Reply] = field(default_factory=list)
    error: str | None = None

    @property
    def reply(self) -> Reply | None:
        """The reply that answers this turn: the first created after the last speech_stopped."""
        if self.speech_stopped_at is None:
            return None
        for reply in self.replies:
            if reply.created_at >= self.speech_stopped_at:
                return reply
        return None

    @property
    def complete(self) -> bool:
        """The user's audio is all sent, VAD closed the turn after it, and that turn's reply is done.

        The `speech_stopped` that ends the turn can only come after the audio ended (VAD must
        hear the silence that follows): an earlier one is a pause inside the sentence.
        """
        reply = self.reply
        return (
            self.user_audio_end is not None
            and self.speech_stopped_at is not None
            and self.speech_stopped_at >= self.user_audio_end
            and reply is not None
            and reply.done_at is not None
        )

    def metrics(self) -> dict[str, Any] | None:
        """This turn's figures, or None when it never got its reply."""
        reply = self.reply
        if not self.complete or reply is None or reply.done_at is None or self.speech_stopped_at is None:
            return None
        audio_s = sum(d for _, d in reply.chunks)
        playback = simulate_playback(reply.chunks, reply.done_at)
        buffered = simulate_playback(reply.chunks, reply.done_at, prebuffer_s=JITTER_BUFFER_S)
        generation_s = reply.done_at - reply.created_at
        return {
            "status": reply.status,
            "ttfa_from_speech_stopped_s": None if reply.first_audio_at is None else reply.first_audio_at - self.speech_stopped_at,
            "ttfa_from_user_audio_end_s": None if reply.first_audio_at is None or self.user_audio_end is None else reply.first_audio_at - self.user_audio_end,
            "turn_latency_s": reply.done_at - self.speech_stopped_at,
            "audio_s": audio_s,
            # Output real-time factor: seconds spent generating per second of reply audio
            # (response.created -> response.done); below 1 the server outpaces playback.
            "output_rtf": generation_s / audio_s if audio_s > 0 else None,
            "underruns": playback.underruns,
            "stall_s": playback.stall_s,
            "underruns_buffered": buffered.underruns,
            "vad_splits": max(self.speech_started - 1, 0),
            "speech_stopped_at": self.speech_stopped_at,
        }


@dataclass
class SessionResult:
    turns: list[TurnRecord]
    events: int = 0
    errors: list[str] = field(default_factory=list)
    client_lag_s: float = 0.0  # how late the client sent its worst 20 ms chunk (its own overload)


@dataclass
class RealtimeSettings:
    turns: int = 2
    stagger_s: float = 1.0
    gap_s: float = 0.5  # silence after a reply before the next turn
    turn_timeout_s: float = 60.0
    max_output_tokens: int | None = 16
    voice: str | None = None
    seed: int = 0


class _Session:
    def __init__(self, index: int, url: str, headers: dict[str, str], utterances: list[Utterance], settings: RealtimeSettings, start_delay_s: float):
        self.index = index
        self.url = url
        self.headers = headers
        self.utterances = utterances
        self.settings = settings
        self.start_delay_s = start_delay_s
        self.result = SessionResult(turns=[])
        self.turn: TurnRecord | None = None
        self.turn_done = asyncio.Event()
        self.updated = asyncio.Event()
        self.closed = asyncio.Event()
        self._replies: dict[str, Reply] = {}
        # Set once the server said why (an `error` event, `session.closed`): the dropped connection
        # that follows is the same failure, not another one.
        self._explained: set[str] = set()

    async def run(self) -> SessionResult:
        from websockets.asyncio.client import connect

        await asyncio.sleep(self.start_delay_s)
        try:
            async with connect(self.url, additional_headers=self.headers, max_size=None, open_timeout=30, close_timeout=5) as ws:
                receiver = asyncio.create_task(self._receive(ws))
                try:
                    await self._converse(ws)
                finally:
                    receiver.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await receiver
        except Exception as exc:  # noqa: BLE001 - every failure is a counted error, not a crash
            if not self._explained:
                self.result.errors.append(f"connection: {type(exc).__name__}: {exc}"[:200])
        return self.result

    async def _converse(self, ws: Any) -> None:
        await self._configure(ws)
        clock = Pacer()
        for turn_index, utterance in enumerate(self.utterances):
            if not await self._speak_turn(ws, clock, turn_index, utterance):
                break
        self.result.client_lag_s = clock.worst_lag_s

    def session_config(self) -> dict[str, Any]:
        """The `session.update` the user sends first (PCM16 in and out, server VAD)."""
        session: dict[str, Any] = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": SAMPLE_RATE},
                    "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500},
                },
                "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}},
            },
        }
        if self.settings.max_output_tokens:
            session["max_output_tokens"] = self.settings.max_output_tokens
        if self.settings.voice:
            session["audio"]["output"]["voice"] = self.settings.voice
        return session

    async def _configure(self, ws: Any) -> None:
        await ws.send(json.dumps({"type": "session.update", "session": self.session_config()}))
        await self._wait_updated(30)

    async def _speak_turn(self, ws: Any, clock: Pacer, turn_index: int, utterance: Utterance) -> bool:
        """One spoken turn at wall-clock pace, silence until its reply is done, then the gap.
        False: the session cannot go on (closed by the server, or the turn timed out)."""
        if self.closed.is_set():
            if not self._explained:
                self.result.errors.append("closed_by_server")
            return False
        self.turn = TurnRecord(self.index, turn_index, user_audio_start=time.perf_counter())
        self.turn_done.clear()
        self.result.turns.append(self.turn)
        for message in _append_messages(utterance):
            await clock.tick()
            await ws.send(message)
        self.turn.user_audio_end = time.perf_counter()
        self._check_done()
        deadline = time.perf_counter() + self.settings.turn_timeout_s
        while not self.turn_done.is_set() and not self.closed.is_set():
            if time.perf_counter() > deadline:
                self.turn.error = "turn_timeout"
                self.result.errors.append("turn_timeout")
                break
            await clock.tick()
            await ws.send(SILENCE_MESSAGE)
        if self.turn.error:
            return False
        gap_end = time.perf_counter() + self.settings.gap_s
        while time.perf_counter() < gap_end and not self.closed.is_set():
            await clock.tick()
            await ws.send(SILENCE_MESSAGE)
        return True

    async def _wait_updated(self, timeout: float) -> None:
        """Until `session.updated`; a server that closes first (e.g. `session_limit_reached`) ends the wait."""
        waits = [asyncio.ensure_future(self.updated.wait()), asyncio.ensure_future(self.closed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not self.updated.is_set():
            raise RuntimeError("closed before session.updated" if self.closed.is_set() else "no session.updated")

    async def _receive(self, ws: Any) -> None:
        try:
            async for raw in ws:
                now = time.perf_counter()
                self.result.events += 1
                if not isinstance(raw, str):
                    continue
                event = json.loads(raw)
                self._on_event(event.get("type", ""), event, now)
        except Exception as exc:  # noqa: BLE001 - a dropped connection is an error of this session
            if not self._explained:
                self.result.errors.append(f"connection dropped: {type(exc).__name__}")
                self._explained.add("dropped")
        finally:
            self.closed.set()
            self.turn_done.set()

    def _on_event(self, kind: str, event: dict[str, Any], now: float) -> None:
        turn = self.turn
        if kind == "session.updated":
            self.updated.set()
        elif kind == "error":
            error = event.get("error") or {}
            code = str(error.get("code") or error.get("type"))
            self.result.errors.append(f"error: {code}")
            self._explained.add(code)
        elif kind == "session.closed":
            reason = str(event.get("reason"))
            if reason not in self._explained:  # not the close that follows a fatal error event
                self.result.errors.append(f"session.closed: {reason}")
            self._explained.add(reason)
        elif turn is None:
            return
        elif kind == "input_audio_buffer.speech_started":
            turn.speech_started += 1
        elif kind == "input_audio_buffer.speech_stopped":
            turn.speech_stopped_at = now
        elif kind == "response.created":
            response_id = (event.get("response") or {}).get("id", "")
            reply = Reply(response_id, now)
            self._replies[response_id] = reply
            turn.replies.append(reply)
        elif kind == "response.output_audio.delta":
            reply = self._replies.get(event.get("response_id", ""))
            if reply is not None:
                if reply.first_audio_at is None:
                    reply.first_audio_at = now
                reply.chunks.append((now, _b64_bytes(event.get("delta", "")) / 2 / OUTPUT_RATE))
        elif kind == "response.done":
            response = event.get("response") or {}
            reply = self._replies.get(response.get("id", ""))
            if reply is not None:
                reply.done_at = now
                reply.status = response.get("status")
                usage = response.get("usage") or {}
                details = usage.get("output_token_details") or {}
                reply.output_tokens = usage.get("output_tokens")
                reply.text_tokens = int(details.get("text_tokens") or 0)
                reply.audio_tokens = int(details.get("audio_tokens") or 0)
                reply.input_tokens = usage.get("input_tokens")
                reply.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
                status_details = response.get("status_details") or {}
                reply.reason = status_details.get("reason") or (status_details.get("error") or {}).get("code")
                # `incomplete` is a reply cut at max_output_tokens, as asked: not an error.
                if reply.status in ("failed", "cancelled"):
                    self.result.errors.append(f"response_{reply.status}")
            self._check_done()

    def _check_done(self) -> None:
        if self.turn is not None and self.turn.complete:
            self.turn_done.set()


class Pacer:
    """Wall-clock pacing at one 20 ms chunk per tick, on an absolute schedule (no drift)."""

    def __init__(self) -> None:
        self.next_at: float | None = None
        self.worst_lag_s = 0.0

    async def tick(self) -> None:
        now = time.perf_counter()
        if self.next_at is None:
            self.next_at = now
        delay = self.next_at - now
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.worst_lag_s = max(self.worst_lag_s, -delay)
        self.next_at += CHUNK_MS / 1000


def _append_message(audio: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})


# The load generator encodes each utterance's events once, not per session and turn: on a small
# machine its CPU is taken from the server it measures.
SILENCE_MESSAGE = _append_message(bytes(CHUNK_SAMPLES * 2))
_ENCODED: dict[int, tuple[Utterance, list[str]]] = {}  # by id(); holds the utterance, so ids are not reused


def _append_messages(utterance: Utterance) -> list[str]:
    """The utterance as its `input_audio_buffer.append` events of CHUNK_MS each."""
    cached = _ENCODED.get(id(utterance))
    if cached is None:
        samples = utterance.samples
        cached = _ENCODED[id(utterance)] = (utterance, [_append_message(pcm16(samples[start : start + CHUNK_SAMPLES]))
                                                      for start in range(0, len(samples), CHUNK_SAMPLES)])
    return cached[1]


def _b64_bytes(text: str) -> int:
    """Decoded length of a base64 string, without decoding it."""
    return len(text) * 3 // 4 - text[-2:].count("=") if text else 0


def session_plans(rng: random.Random, sessions: int, utterances: list[Utterance],
                  settings: RealtimeSettings) -> list[tuple[list[Utterance], float]]:
    """Each session's utterances (one a turn, drawn with `rng`) and its start delay within the stagger."""
    plans = []
    for _ in range(sessions):
        picks = [utterances[rng.randrange(len(utterances))] for _ in range(settings.turns)]
        plans.append((picks, rng.uniform(0, settings.stagger_s) if sessions > 1 else 0.0))
    return plans


async def run_level(ws_url: str, model_id: str, api_key: str | None, sessions: int, utterances: list[Utterance], settings: RealtimeSettings) -> tuple[list[SessionResult], float]:
    """Run `sessions` concurrent sessions to the end; returns their results and the wall time."""
    rng = random.Random(settings.seed * 1000 + sessions)
    url = f"{ws_url}/v1/realtime?model={model_id}"
    headers = auth_headers(api_key)
    clients = [_Session(index, url, headers, picks, settings, delay)
               for index, (picks, delay) in enumerate(session_plans(rng, sessions, utterances, settings))]
    started = time.perf_counter()
    results = await asyncio.gather(*(client.run() for client in clients))
    return list(results), time.perf_counter() - started


def summarize_level(sessions: int, results: list[SessionResult], wall_s: float, settings: RealtimeSettings,
                    arrivals: str = "together") -> dict[str, Any]:
    """The report row for one concurrency level (`arrivals`: "together" or "spread", see the module docstring)."""
    turn_metrics = [m for r in results for t in r.turns if (m := t.metrics()) is not None]
    errors: dict[str, int] = {}
    for result in results:
        for error in result.errors:
            errors[error] = errors.get(error, 0) + 1

    def values(key: str) -> list[float]:
        return [m[key] for m in turn_metrics if m[key] is not None]

    underruns = values("underruns")
    replies = [t.reply for r in results for t in r.turns if t.complete]
    generating = busy_seconds([(reply.created_at, reply.done_at) for reply in replies if reply is not None and reply.done_at is not None])
    statuses: dict[str, int] = {}
    for m in turn_metrics:
        statuses[str(m["status"])] = statuses.get(str(m["status"]), 0) + 1
    return {
        "sessions": sessions,
        "arrivals": arrivals,
        "stagger_s": settings.stagger_s,
        "turns_planned": sessions * settings.turns,
        "turns_completed": len(turn_metrics),
        "ttfa_from_speech_stopped_ms": summarize(values("ttfa_from_speech_stopped_s"), 1000),
        "ttfa_from_user_audio_end_ms": summarize(values("ttfa_from_user_audio_end_s"), 1000),
        "turn_latency_ms": summarize(values("turn_latency_s"), 1000),
        "output_rtf": summarize(values("output_rtf"), 1, 3),
        "reply_audio_s": summarize(values("audio_s"), 1, 2),
        "underruns": {
            "total": int(sum(underruns)),
            "per_turn": round(sum(underruns) / len(underruns), 3) if underruns else None,
            "turns_with_underrun": sum(1 for u in underruns if u > 0),
            "stall_ms": summarize(values("stall_s"), 1000),
            "total_with_100ms_buffer": int(sum(values("underruns_buffered"))),
        },
        "reply_status": statuses,
        # Aggregate generation rate: tokens of all replies / the time at least one reply was
        # being generated (union of response.created -> response.done intervals).
        "generation_text_tok_per_s": round(sum(r.text_tokens for r in replies if r) / generating, 1) if generating else None,
        "generation_audio_frames_per_s": round(sum(r.audio_tokens for r in replies if r) / generating, 1) if generating else None,
        "vad_splits": int(sum(values("vad_splits"))),
        "events": sum(r.events for r in results),
        "events_per_s": round(sum(r.events for r in results) / wall_s, 1) if wall_s > 0 else None,
        "client_lag_ms_max": round(max((r.client_lag_s for r in results), default=0.0) * 1000, 1),
        "wall_s": round(wall_s, 2),
        "errors": {"count": sum(errors.values()), "by_kind": errors},
        # Every turn, in the order the users stopped speaking: when (s from the first stop) and
        # its time to first audio, to see whether slow turns are the ones that arrive together.
        "turn_samples": _turn_samples(turn_metrics),
    }


def _turn_samples(turn_metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
    timed = sorted((m for m in turn_metrics if m["ttfa_from_speech_stopped_s"] is not None), key=lambda m: m["speech_stopped_at"])
    if not timed:
        return []
    first = timed[0]["speech_stopped_at"]
    return [
        {"speech_stopped_s": round(m["speech_stopped_at"] - first, 3), "ttfa_ms": round(m["ttfa_from_speech_stopped_s"] * 1000, 1)}
        for m in timed
    ]
