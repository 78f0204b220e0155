"""What every framework driver shares (standard library only: it runs in the framework's venv).

A driver walks the steps of tests/frameworks against a server and prints one JSON line per step:
`{"step": name, ...what it observed}`. It asserts nothing: the pytest module does. A step whose
awaited event never comes is reported with `"timed_out": true`, and the driver goes on to the
next step, so one missing server feature shows as one failing test, not nine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

STEPS = ("connect", "session_update", "text_turn", "spoken_turn", "second_spoken_turn",
         "barge_in", "new_instructions", "forced_tool_call", "user_transcripts")
STEP_TIMEOUT_S = 30.0  # a passing step takes a few seconds
TRANSCRIPT_WAIT_S = 15.0
RATE = 24000
CHUNK_MS = 100
INSTRUCTIONS = "You are a terse weather assistant."
NEW_INSTRUCTIONS = "You are a cheerful weather assistant. Answer in one short sentence."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def weather_report(city: str) -> dict[str, Any]:
    """What every driver's `get_weather` tool function answers."""
    return {"city": city, "forecast": "sunny", "celsius": 21}


def load_config() -> dict[str, Any]:
    """The run's config, written by the test: url, base_url, model, voice, audio (name -> PCM path)."""
    with open(sys.argv[1]) as config:
        return json.load(config)


def pcm(path: str) -> bytes:
    """PCM16 mono 24 kHz, as the test wrote it."""
    with open(path, "rb") as audio:
        return audio.read()


BARGE_IN_SPEEDUP = 20.0  # the tiny model's replies are short: speak over one before it is done


async def paced_chunks(audio: bytes, speedup: float = 2.0) -> AsyncIterator[bytes]:
    """100 ms chunks at `speedup` x real time, as a microphone would deliver them (only faster)."""
    step = RATE * 2 * CHUNK_MS // 1000
    for start in range(0, len(audio), step):
        yield audio[start : start + step]
        await asyncio.sleep(CHUNK_MS / 1000 / speedup)


class Report:
    """The facts of the step in progress; `finish` prints them as one JSON line."""

    def __init__(self) -> None:
        self.step = "setup"
        self.facts: dict[str, Any] = {}
        self.all_errors: list[tuple[str, str]] = []  # (step, error), errors between steps included

    def begin(self, step: str) -> None:
        self.step, self.facts = step, {}

    def note(self, **facts: Any) -> None:
        self.facts.update(facts)

    def error(self, what: Any) -> None:
        """An error the framework surfaced (an `error` event, a failed request...)."""
        text = str(what)
        if len(text) > 600:  # pydantic's messages put the useful part last
            text = text[:200] + " ... " + text[-400:]
        if (self.step, text) not in self.all_errors:  # a dead connection repeats itself
            self.all_errors.append((self.step, text))

    def finish(self) -> None:
        errors = [error for step, error in self.all_errors if step == self.step]
        _print({"step": self.step, **self.facts, "errors": errors})
        self.begin("between_steps")

    def end(self) -> None:
        """The last line: every error of the run, with the step it arrived in."""
        _print({"step": "end", "errors": self.all_errors})

    @contextlib.asynccontextmanager
    async def stepping(self, step: str) -> AsyncIterator[None]:
        """Run one step; a timeout or exception is recorded and the walk goes on."""
        self.begin(step)
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                yield
        except TimeoutError:
            self.note(timed_out=True)
        except Exception as exc:  # the step's failure is a fact for the test to assert on
            self.note(exception=f"{type(exc).__name__}: {exc}"[:500])
        self.finish()


def _print(line: dict[str, Any]) -> None:
    print(json.dumps(line, default=str), flush=True)


async def until(predicate: Callable[[], bool], step_s: float = 0.02) -> None:
    while not predicate():
        await asyncio.sleep(step_s)


class ServerLog:
    """The raw server events a framework let us see, in order (audio payloads dropped)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stopped: str | None = None  # why the framework stopped reading: waiting is pointless


    def add(self, event: dict[str, Any]) -> None:
        if event.get("type") in ("response.output_audio.delta", "input_audio_buffer.append"):
            event = {**event, "delta": len(event.get("delta") or "")}
        self.events.append(event)

    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events[mark:] if event.get("type") == kind]

    async def next(self, mark: int, kind: str, where: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any]:
        """The first `kind` event after `mark` that satisfies `where` (waits for it)."""
        while True:
            if self.stopped:
                raise ConnectionError(self.stopped)
            for event in self.since(mark, kind):
                if where(event):
                    return event
            await asyncio.sleep(0.02)

    def types_since(self, mark: int) -> list[str]:
        """Event types after `mark`, runs of deltas collapsed, for a failing test's message."""
        kinds: list[str] = []
        for event in self.events[mark:]:
            if not kinds or kinds[-1] != event["type"]:
                kinds.append(event["type"])
        return kinds


def session_facts(session: dict[str, Any]) -> dict[str, Any]:
    """What step 2 checks in a `session.updated` echo."""
    audio = session.get("audio") or {}
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    return {
        "instructions": session.get("instructions"),
        "voice": audio_out.get("voice"),
        "turn_detection": (audio_in.get("turn_detection") or {}).get("type"),
        "transcription": audio_in.get("transcription"),
        "tools": [tool.get("name") for tool in session.get("tools") or []],
    }


def response_facts(done: dict[str, Any]) -> dict[str, Any]:
    """What the steps check in a `response.done`."""
    response = done.get("response") or {}
    output = response.get("output") or []
    return {
        "response_id": response.get("id"),
        "status": response.get("status"),
        "status_details": response.get("status_details"),
        "output_types": [item.get("type") for item in output],
    }


def reply_facts(done: dict[str, Any], audio_bytes: dict[str, int]) -> dict[str, Any]:
    """`response_facts` and how many bytes of the reply's audio the framework handed on."""
    facts = response_facts(done)
    return {**facts, "audio_bytes": audio_bytes.get(facts["response_id"], 0)}


# The Live drivers' delegation round trip, against a server whose fake reply node delegates a turn
# that asks for it (tests/live/fakes.py): the embedded model answers every turn "Okay, sure!" and
# Live, unlike the GA dialect, has no `tool_choice` that could force a call.
DELEGATE_ASK = "The user wants the weather in Paris: delegate it."


def weather_sentence(report: dict[str, Any]) -> str:
    """How a Live driver's client answers a delegation with `weather_report`'s result."""
    return f"It is {report['forecast']} in {report['city']}, {report['celsius']} degrees."
