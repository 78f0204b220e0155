"""livekit-agents + livekit-plugins-openai (`openai.realtime.RealtimeModel(base_url=...)`) walks
the steps against the server.

No LiveKit room: the driver plays the part of livekit's AgentActivity on the model's own
RealtimeSession (push_audio, update_chat_ctx + generate_reply, update_instructions,
update_tools, interrupt + truncate on the user's speech, execute_function_call with the tool's
result sent back through the chat context). Run by tests/frameworks/test_livekit.py with the
framework's own venv: `python drive_livekit.py CONFIG.json`; prints one JSON line per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from livekit import rtc
from livekit.agents import function_tool, llm
from livekit.plugins import openai
from openai.types.realtime import AudioTranscription
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad
from steps import (
    BARGE_IN_SPEEDUP,
    INSTRUCTIONS,
    NEW_INSTRUCTIONS,
    RATE,
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
async def get_weather(city: str) -> dict[str, Any]:
    """The current weather in a city."""
    tool_calls.append({"city": city})
    return weather_report(city)


class Observer:
    """The session's events: raw server events, errors, generations (audio, function calls)."""

    def __init__(self, session: openai.realtime.RealtimeSession, report: Report) -> None:
        self.report = report
        self.server = ServerLog()
        self.audio_bytes: dict[str, int] = {}  # response_id -> bytes of audio the session streamed
        self.function_calls: list[llm.FunctionCall] = []
        self.speech_started = 0
        self.playing: tuple[str, float] | None = None  # (message_id, first audio at) of the reply in progress
        self.tasks: set[asyncio.Task] = set()
        session.on("openai_server_event_received", self.server.add)
        session.on("error", lambda error: report.error(f"{error.label}: {error.error}"))
        session.on("generation_created", lambda event: self.spawn(self.read_generation(event)))
        session.on("input_speech_started", self.on_speech_started)
        self.session = session

    def spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def read_generation(self, event: llm.GenerationCreatedEvent) -> None:
        async def read_functions() -> None:
            async for call in event.function_stream:
                self.function_calls.append(call)

        self.spawn(read_functions())
        async for message in event.message_stream:
            self.spawn(self.read_message(event.response_id or "", message))

    async def read_message(self, response_id: str, message: llm.MessageGeneration) -> None:
        async def drain_text() -> None:
            async for _ in message.text_stream:
                pass

        self.spawn(drain_text())
        async for frame in message.audio_stream:
            if self.playing is None or self.playing[0] != message.message_id:
                self.playing = (message.message_id, time.monotonic())
            self.audio_bytes[response_id] = self.audio_bytes.get(response_id, 0) + len(frame.data.tobytes())

    def on_speech_started(self, _event: llm.InputSpeechStartedEvent) -> None:
        """What livekit's AgentActivity does when the user speaks over a reply: cancel it and
        truncate the assistant message to what was played."""
        self.speech_started += 1
        if self.session.has_active_generation and self.playing is not None:
            message_id, started = self.playing
            self.session.interrupt()
            self.session.truncate(message_id=message_id, modalities=["audio"],
                                  audio_end_ms=int((time.monotonic() - started) * 1000))
            self.playing = None

    def user_transcripts(self) -> list[str]:
        return [item.text_content or "" for item in self.session.chat_ctx.items
                if item.type == "message" and item.role == "user" and item.text_content not in TYPED]


TYPED = ("What can you do for me?", "And the day after?")


async def send_speech(session: openai.realtime.RealtimeSession, audio: bytes, speedup: float = 2.0) -> None:
    async for chunk in paced_chunks(audio, speedup):
        session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))


async def say(session: openai.realtime.RealtimeSession, text: str) -> None:
    """A typed user turn, as livekit's AgentActivity sends one: chat context, then generate_reply."""
    chat_ctx = session.chat_ctx.copy()
    chat_ctx.add_message(role="user", content=text)
    await session.update_chat_ctx(chat_ctx)
    await session.generate_reply()



async def spoken_turn(session, observed: Observer, report: Report, audio: bytes) -> None:
    mark = observed.server.mark()
    await send_speech(session, audio)
    done = await observed.server.next(mark, "response.done")
    await asyncio.sleep(0.1)  # let the audio stream's last frames reach the observer
    report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))


async def barge_in(session, observed: Observer, report: Report, config: dict[str, Any]) -> None:
    """Speak; once the reply's audio is arriving, speak over it."""
    mark = observed.server.mark()
    speaking = asyncio.create_task(send_speech(session, pcm(config["audio"]["first"])))
    await observed.server.next(mark, "response.output_audio.delta")
    speaking.cancel()
    barge_mark, speech_started = observed.server.mark(), observed.speech_started
    await send_speech(session, pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
    interrupted = await observed.server.next(mark, "response.done")
    following = await observed.server.next(barge_mark, "response.done", lambda e: e is not interrupted)
    report.note(
        interrupted=response_facts(interrupted),
        framework_saw_interruption=observed.speech_started > speech_started,
        truncated=bool(observed.server.since(barge_mark, "conversation.item.truncated")),
        following=reply_facts(following, observed.audio_bytes),
        events=observed.server.types_since(mark),
    )


async def forced_tool_call(session, observed: Observer, report: Report) -> None:
    """generate_reply(tool_choice=get_weather); run the tool as AgentActivity does, send its output
    through the chat context and ask for the spoken follow-up."""
    mark = observed.server.mark()
    await session.generate_reply(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call_done = await observed.server.next(mark, "response.done")
    report.note(call=response_facts(call_done), events=observed.server.types_since(mark))
    if "function_call" not in response_facts(call_done)["output_types"]:
        return
    await until(lambda: bool(observed.function_calls))
    call = observed.function_calls[-1]
    result = await llm.utils.execute_function_call(
        llm.FunctionToolCall(name=call.name, arguments=call.arguments, call_id=call.call_id), session.tools)
    chat_ctx = session.chat_ctx.copy()
    chat_ctx.items.append(result.fnc_call_out)
    await session.update_chat_ctx(chat_ctx)
    await session.generate_reply()
    follow_up = await observed.server.next(mark, "response.done", lambda e: e is not call_done)
    await asyncio.sleep(0.1)
    arguments = observed.server.since(mark, "response.function_call_arguments.done")
    outputs = [e["item"] for e in observed.server.since(mark, "conversation.item.added") if e["item"].get("type") == "function_call_output"]
    report.note(
        tool_function_calls=list(tool_calls),
        arguments=[event.get("arguments") for event in arguments],
        function_call_outputs=[item.get("output") for item in outputs],
        follow_up=reply_facts(follow_up, observed.audio_bytes),
        events=observed.server.types_since(mark),
    )


async def walk(session, observed: Observer, report: Report, config: dict[str, Any]) -> None:
    async with report.stepping("connect"):
        created = await observed.server.next(0, "session.created")
        report.note(session_created=True, model=created["session"].get("model"))

    async with report.stepping("session_update"):
        await session.update_instructions(INSTRUCTIONS)
        await session.update_tools([get_weather])
        updated = await observed.server.next(0, "session.updated", lambda e: bool(e["session"].get("tools")))
        report.note(**session_facts(updated["session"]))

    async with report.stepping("text_turn"):
        mark = observed.server.mark()
        await say(session, TYPED[0])
        done = await observed.server.next(mark, "response.done")
        await asyncio.sleep(0.1)
        report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("spoken_turn"):
        await spoken_turn(session, observed, report, pcm(config["audio"]["first"]))

    async with report.stepping("second_spoken_turn"):
        await spoken_turn(session, observed, report, pcm(config["audio"]["second"]))

    async with report.stepping("barge_in"):
        await barge_in(session, observed, report, config)

    async with report.stepping("new_instructions"):
        mark = observed.server.mark()
        await session.update_instructions(NEW_INSTRUCTIONS)
        updated = await observed.server.next(mark, "session.updated")
        report.note(echoed_instructions=updated["session"].get("instructions"))
        await say(session, TYPED[1])
        done = await observed.server.next(mark, "response.done")
        report.note(reply=reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("forced_tool_call"):
        await forced_tool_call(session, observed, report)

    async with report.stepping("user_transcripts"):
        # Transcripts may trail the replies (they are made below first-audio work).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                await until(lambda: len(observed.user_transcripts()) >= 4 and all(observed.user_transcripts()))
        completed = observed.server.since(0, "conversation.item.input_audio_transcription.completed")
        report.note(server_transcripts=[event.get("transcript") for event in completed],
                    history_transcripts=observed.user_transcripts())


async def main() -> None:
    config = load_config()
    report = Report()
    model = openai.realtime.RealtimeModel(
        model=config["model"],
        voice=config["voice"],
        base_url=config["http_base_url"],
        api_key=config["api_key"],
        modalities=["audio"],
        input_audio_transcription=AudioTranscription(model=config["transcription_model"]),
        turn_detection=ServerVad(type="server_vad", create_response=True, interrupt_response=True),
    )
    session = model.session()
    observed = Observer(session, report)
    try:
        await walk(session, observed, report, config)
    finally:
        await session.aclose()
        await model.aclose()
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
