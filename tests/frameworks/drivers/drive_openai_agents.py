"""openai-agents (RealtimeAgent / RealtimeRunner) walks the steps against the server.

Run by tests/frameworks/test_openai_agents.py with the framework's own venv:
`python drive_openai_agents.py CONFIG.json`; prints one JSON line per step (steps.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage
from steps import (
    BARGE_IN_SPEEDUP,
    INSTRUCTIONS,
    NEW_INSTRUCTIONS,
    TRANSCRIPT_WAIT_S,
    Report,
    ServerLog,
    load_config,
    paced_chunks,
    pcm,
    reply_facts,
    response_facts,
    session_facts,
    until,
    weather_report,
)

tool_calls: list[dict[str, Any]] = []


@function_tool
def get_weather(city: str) -> dict[str, Any]:
    """The current weather in a city."""
    tool_calls.append({"city": city})
    return weather_report(city)


class Observer:
    """Consumes the session's events: raw server events, audio, errors, history."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.server = ServerLog()
        self.audio_bytes: dict[str, int] = {}  # response_id -> bytes of audio the framework played
        self.kinds: list[str] = []  # the session's own event types, in order
        self.history: dict[str, Any] = {}  # item_id -> item, as the session's history events say

    async def consume(self, session) -> None:
        async for event in session:
            self.kinds.append(event.type)
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                self.server.add(event.data.data)
            elif event.type == "audio":
                response = event.audio.response_id
                self.audio_bytes[response] = self.audio_bytes.get(response, 0) + len(event.audio.data)
            elif event.type == "error":
                self.report.error(event.error)
            elif event.type == "history_updated":
                self.history = {item.item_id: item for item in event.history}
            elif event.type == "history_added":
                self.history[event.item.item_id] = event.item

    def user_transcripts(self) -> list[str | None]:
        return [
            content.transcript
            for item in self.history.values()
            if getattr(item, "role", None) == "user"
            for content in item.content
            if content.type == "input_audio"
        ]



async def send_speech(session, audio: bytes, speedup: float = 2.0) -> None:
    async for chunk in paced_chunks(audio, speedup):
        await session.send_audio(chunk)


async def spoken_turn(session, observed: Observer, report: Report, audio: bytes) -> None:
    mark = observed.server.mark()
    await send_speech(session, audio)
    done = await observed.server.next(mark, "response.done")
    report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))


async def barge_in(session, observed: Observer, report: Report, config: dict[str, Any]) -> None:
    """Speak; once the reply's audio is arriving, speak over it."""
    mark = observed.server.mark()
    speaking = asyncio.create_task(send_speech(session, pcm(config["audio"]["first"])))
    # The reply is playing (the rest of the first utterance is silence): the user speaks over it.
    await observed.server.next(mark, "response.output_audio.delta")
    speaking.cancel()
    barge_mark = observed.server.mark()
    kinds_mark = len(observed.kinds)
    await send_speech(session, pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
    interrupted = await observed.server.next(mark, "response.done")
    following = await observed.server.next(barge_mark, "response.done", lambda e: e is not interrupted)
    report.note(
        interrupted=response_facts(interrupted),
        framework_saw_interruption="audio_interrupted" in observed.kinds[kinds_mark:],
        truncated=bool(observed.server.since(barge_mark, "conversation.item.truncated")),
        following=reply_facts(following, observed.audio_bytes),
        events=observed.server.types_since(mark),
    )


async def forced_tool_call(session, observed: Observer, report: Report) -> None:
    """A response.create forcing get_weather; the session runs the tool and answers with its result."""
    mark = observed.server.mark()
    await session.model.send_event(RealtimeModelSendRawMessage(message={
        "type": "response.create",
        "other_data": {"response": {"tool_choice": {"type": "function", "name": "get_weather"}}},
    }))
    call_done = await observed.server.next(mark, "response.done")
    report.note(call=response_facts(call_done), events=observed.server.types_since(mark))
    if "function_call" not in response_facts(call_done)["output_types"]:
        return
    await observed.server.next(mark, "conversation.item.added", lambda e: e["item"].get("type") == "function_call_output")
    follow_up = await observed.server.next(mark, "response.done", lambda e: e is not call_done)
    arguments = observed.server.since(mark, "response.function_call_arguments.done")
    outputs = [e["item"] for e in observed.server.since(mark, "conversation.item.added") if e["item"].get("type") == "function_call_output"]
    report.note(
        tool_function_calls=list(tool_calls),
        arguments=[event.get("arguments") for event in arguments],
        function_call_outputs=[item.get("output") for item in outputs],
        follow_up=reply_facts(follow_up, observed.audio_bytes),
        events=observed.server.types_since(mark),
    )


async def main() -> None:
    config = load_config()
    report = Report()
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS, tools=[get_weather])
    runner = RealtimeRunner(agent, config={"model_settings": {
        "model_name": config["model"],
        "voice": config["voice"],
        "modalities": ["audio"],
        "turn_detection": {"type": "server_vad", "interrupt_response": True, "create_response": True},
        "input_audio_transcription": {"model": config["transcription_model"]},
    }})
    observed = Observer(report)
    session = await runner.run(model_config={"url": config["url"], "api_key": config["api_key"]})
    consumer: asyncio.Task | None = None

    async with report.stepping("connect"):
        await session.enter()
        consumer = asyncio.create_task(observed.consume(session))
        created = await observed.server.next(0, "session.created")
        report.note(session_created=True, model=created["session"].get("model"))

    async with report.stepping("session_update"):
        updated = await observed.server.next(0, "session.updated", lambda e: bool(e["session"].get("tools")))
        report.note(**session_facts(updated["session"]))

    async with report.stepping("text_turn"):
        mark = observed.server.mark()
        await session.send_message("What can you do for me?")
        done = await observed.server.next(mark, "response.done")
        report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("spoken_turn"):
        await spoken_turn(session, observed, report, pcm(config["audio"]["first"]))

    async with report.stepping("second_spoken_turn"):
        await spoken_turn(session, observed, report, pcm(config["audio"]["second"]))

    async with report.stepping("barge_in"):
        await barge_in(session, observed, report, config)

    async with report.stepping("new_instructions"):
        mark = observed.server.mark()
        await session.update_agent(RealtimeAgent(name="Cheerful", instructions=NEW_INSTRUCTIONS, tools=[get_weather]))
        updated = await observed.server.next(mark, "session.updated")
        report.note(echoed_instructions=updated["session"].get("instructions"))
        await session.send_message("And the day after?")
        done = await observed.server.next(mark, "response.done")
        report.note(reply=reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("forced_tool_call"):
        await forced_tool_call(session, observed, report)

    async with report.stepping("user_transcripts"):
        # Transcripts may trail the replies (they are made below first-audio work).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                await until(lambda: all(observed.user_transcripts()) and len(observed.user_transcripts()) >= 2)
        completed = observed.server.since(0, "conversation.item.input_audio_transcription.completed")
        report.note(server_transcripts=[event.get("transcript") for event in completed],
                    history_transcripts=observed.user_transcripts())

    await session.close()
    if consumer is not None:
        consumer.cancel()
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
