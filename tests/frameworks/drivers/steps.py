"""What every framework driver shares (standard library only: it runs in the framework's venv,
imported as `steps` from the drivers' folder, the driver's working directory).

A driver walks the steps of tests/frameworks against a server and prints one JSON line per step:
`{"step": name, ...what it observed}`. It asserts nothing: the pytest module does. A step whose
awaited event never comes is reported with `"timed_out": true`, and the driver goes on to the
next step, so one missing server feature shows as one failing test, not nine.

The GA drivers subclass `RealtimeWalk` (the nine steps; each says what its framework does at a
step); the Live drivers share `live_spoken_turn`, `live_barge_in` and the log readers below.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
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


tool_calls: list[dict[str, Any]] = []  # the arguments of every `get_weather` call the framework made


def run_weather_tool(arguments: dict[str, Any]) -> dict[str, Any]:
    """The body of every driver's `get_weather` tool function: record the call, answer the report."""
    tool_calls.append(dict(arguments))
    return weather_report(arguments.get("city"))


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


async def speak(push: Callable[[bytes], Awaitable[None]], audio: bytes, speedup: float = 2.0) -> None:
    """One utterance through the framework's audio input; `push` hands it one chunk."""
    async for chunk in paced_chunks(audio, speedup):
        await push(chunk)


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


class RealtimeWalk(abc.ABC):
    """The nine steps of tests/frameworks/spec.py over the GA dialect, the same for every framework;
    a driver's subclass says what its framework does at each step and feeds what the framework let
    it see into `server` (raw server events) and `audio_bytes`."""

    settle_s = 0.0  # how long the framework's last audio may trail `response.done` to the driver

    def __init__(self, report: Report, config: dict[str, Any]) -> None:
        self.report, self.config = report, config
        self.server = ServerLog()
        self.audio_bytes: dict[str, int] = {}  # response_id -> bytes of reply audio the framework handed on

    async def open(self) -> None:
        """Step 1, before `session.created` is awaited: what connects (most frameworks already did)."""

    async def configure(self) -> None:
        """Step 2: what the framework sends after connecting (most send their settings on their own)."""

    @abc.abstractmethod
    async def push_audio(self, chunk: bytes) -> None:
        """One chunk of microphone audio through the framework's audio input."""

    @abc.abstractmethod
    async def text_turn(self) -> None:
        """Step 3: a typed user turn, asking for a reply."""

    @abc.abstractmethod
    async def set_instructions(self, instructions: str) -> None:
        """Step 7: new instructions mid-session."""

    @abc.abstractmethod
    async def turn_after_new_instructions(self) -> None:
        """Step 7: the user turn whose reply should come under the new instructions."""

    @abc.abstractmethod
    async def force_tool_call(self) -> None:
        """Step 8: a response that must call `get_weather`."""

    @abc.abstractmethod
    async def answer_tool_call(self, mark: int) -> None:
        """Step 8: return once the framework ran the tool and sent its output (and asked for the
        follow-up where the framework leaves that to the application)."""

    @abc.abstractmethod
    def interruptions(self) -> int:
        """How many times so far the framework showed the application that the user spoke over a reply."""

    @abc.abstractmethod
    def history_transcripts(self) -> list[Any]:
        """The spoken user turns' transcripts in the framework's own history."""

    async def speak(self, audio: bytes, speedup: float = 2.0) -> None:
        await speak(self.push_audio, audio, speedup)

    async def reply(self, mark: int, where: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any]:
        """`reply_facts` of the first `response.done` after `mark` that satisfies `where`."""
        done = await self.server.next(mark, "response.done", where)
        await asyncio.sleep(self.settle_s)
        return reply_facts(done, self.audio_bytes)

    async def walk(self) -> None:
        report, log = self.report, self.server
        async with report.stepping("connect"):
            await self.open()
            created = await log.next(0, "session.created")
            report.note(session_created=True, model=created["session"].get("model"))

        async with report.stepping("session_update"):
            await self.configure()
            updated = await log.next(0, "session.updated", lambda e: bool(e["session"].get("tools")))
            report.note(**session_facts(updated["session"]))

        async with report.stepping("text_turn"):
            mark = log.mark()
            await self.text_turn()
            report.note(**await self.reply(mark), events=log.types_since(mark))

        for step, utterance in (("spoken_turn", "first"), ("second_spoken_turn", "second")):
            async with report.stepping(step):
                mark = log.mark()
                await self.speak(pcm(self.config["audio"][utterance]))
                report.note(**await self.reply(mark), events=log.types_since(mark))

        async with report.stepping("barge_in"):
            await self.barge_in()

        async with report.stepping("new_instructions"):
            mark = log.mark()
            await self.set_instructions(NEW_INSTRUCTIONS)
            updated = await log.next(mark, "session.updated")
            report.note(echoed_instructions=updated["session"].get("instructions"))
            await self.turn_after_new_instructions()
            report.note(reply=await self.reply(mark), events=log.types_since(mark))

        async with report.stepping("forced_tool_call"):
            await self.forced_tool_call()

        async with report.stepping("user_transcripts"):
            # Transcripts may trail the replies (they are made below first-audio work).
            def server_transcripts() -> list[Any]:
                return [e.get("transcript") for e in log.since(0, "conversation.item.input_audio_transcription.completed")]

            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                    await until(lambda: len(server_transcripts()) >= 4 and len(self.history_transcripts()) >= 2
                                and all(self.history_transcripts()))
            report.note(server_transcripts=server_transcripts(), history_transcripts=self.history_transcripts())

    async def barge_in(self) -> None:
        """Speak; once the reply's audio is arriving, speak over it."""
        log, audio = self.server, self.config["audio"]
        mark = log.mark()
        speaking = asyncio.create_task(self.speak(pcm(audio["first"])))
        # The reply is playing (the rest of the first utterance is silence): the user speaks over it.
        await log.next(mark, "response.output_audio.delta")
        speaking.cancel()
        barge_mark, interruptions = log.mark(), self.interruptions()
        await self.speak(pcm(audio["barge_in"]), BARGE_IN_SPEEDUP)
        interrupted = await log.next(mark, "response.done")
        following = await self.reply(barge_mark, lambda e: e is not interrupted)
        self.report.note(
            interrupted=response_facts(interrupted),
            framework_saw_interruption=self.interruptions() > interruptions,
            truncated=bool(log.since(barge_mark, "conversation.item.truncated")),
            following=following,
            events=log.types_since(mark),
        )

    async def forced_tool_call(self) -> None:
        log = self.server
        mark = log.mark()
        await self.force_tool_call()
        call_done = await log.next(mark, "response.done")
        self.report.note(call=response_facts(call_done), events=log.types_since(mark))
        if "function_call" not in response_facts(call_done)["output_types"]:
            return
        await self.answer_tool_call(mark)
        follow_up = await self.reply(mark, lambda e: e is not call_done)
        outputs = [e["item"] for e in log.since(mark, "conversation.item.added") if e["item"].get("type") == "function_call_output"]
        self.report.note(
            tool_function_calls=list(tool_calls),
            arguments=[event.get("arguments") for event in log.since(mark, "response.function_call_arguments.done")],
            function_call_outputs=[item.get("output") for item in outputs],
            follow_up=follow_up,
            events=log.types_since(mark),
        )


# The Live API drivers' readers of the server's log.
def transcript(log: ServerLog, mark: int, kind: str) -> str:
    """The text of the `kind` deltas (a transcript) after `mark`."""
    return "".join(event.get("delta") or "" for event in log.since(mark, kind))


def live_audio_bytes(log: ServerLog, start: int, end: int | None = None) -> int:
    """Bytes of reply audio the server sent between two marks of its log."""
    return sum(len(base64.b64decode(event["delta"])) for event in log.events[start:end]
               if event["type"] == "session.output_audio.delta")


async def live_spoken_turn(push: Callable[[bytes], Awaitable[None]], log: ServerLog, audio: bytes,
                           played: Callable[[], int] | None = None) -> dict[str, Any]:
    """Speak one utterance and wait for its reply's `session.usage.updated`: what was heard, said and
    how many bytes of audio came (`played`: the framework's running count, else the server's log)."""
    mark, played_before = log.mark(), played() if played else 0
    await speak(push, audio)
    await log.next(mark, "session.usage.updated")
    with contextlib.suppress(TimeoutError):  # transcripts may trail the reply
        async with asyncio.timeout(TRANSCRIPT_WAIT_S):
            await log.next(mark, "session.input_transcript.delta")
    return {"heard": transcript(log, mark, "session.input_transcript.delta"),
            "said": transcript(log, mark, "session.output_transcript.delta"),
            "audio_bytes": played() - played_before if played else live_audio_bytes(log, mark)}


async def live_barge_in(push: Callable[[bytes], Awaitable[None]], log: ServerLog, config: dict[str, Any]) -> dict[str, Any]:
    """Speak; once the reply's audio is arriving, speak over it. The reply stops short (its
    `session.usage.updated` comes with less audio than a whole reply) and the speech over it is
    the next turn, answered: a duplex model handles it itself."""
    mark = log.mark()
    speaking = asyncio.create_task(speak(push, pcm(config["audio"]["first"])))
    await log.next(mark, "session.output_audio.delta")
    speaking.cancel()
    barge_mark = log.mark()
    await speak(push, pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
    cut = await log.next(mark, "session.usage.updated")
    cut_at = log.events.index(cut) + 1
    await log.next(cut_at, "session.usage.updated")
    return {"interrupted_audio_bytes": live_audio_bytes(log, mark, cut_at),
            "following_audio_bytes": live_audio_bytes(log, cut_at),
            "following_said": transcript(log, cut_at, "session.output_transcript.delta"),
            "heard": transcript(log, barge_mark, "session.input_transcript.delta")}
