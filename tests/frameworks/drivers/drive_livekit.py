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
import time
from typing import Any

from livekit import rtc
from livekit.agents import function_tool, llm
from livekit.plugins import openai
from openai.types.realtime import AudioTranscription
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad
from steps import INSTRUCTIONS, RATE, RealtimeWalk, Report, load_config, run_weather_tool, until

TYPED = ("What can you do for me?", "And the day after?")


@function_tool
async def get_weather(city: str) -> dict[str, Any]:
    """The current weather in a city."""
    return run_weather_tool({"city": city})


class LivekitWalk(RealtimeWalk):
    """The steps on the model's RealtimeSession, the driver in AgentActivity's part; the session's
    events feed the log, errors and generations (audio, function calls)."""

    settle_s = 0.1  # the audio stream's last frames reach the driver after `response.done`

    def __init__(self, report: Report, config: dict[str, Any], session: openai.realtime.RealtimeSession) -> None:
        super().__init__(report, config)
        self.session = session
        self.function_calls: list[llm.FunctionCall] = []
        self.speech_started = 0
        self.playing: tuple[str, float] | None = None  # (message_id, first audio at) of the reply in progress
        self.tasks: set[asyncio.Task] = set()
        session.on("openai_server_event_received", self.server.add)
        session.on("error", lambda error: report.error(f"{error.label}: {error.error}"))
        session.on("generation_created", lambda event: self.spawn(self.read_generation(event)))
        session.on("input_speech_started", self.on_speech_started)

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

    async def say(self, text: str) -> None:
        """A typed user turn, as livekit's AgentActivity sends one: chat context, then generate_reply."""
        chat_ctx = self.session.chat_ctx.copy()
        chat_ctx.add_message(role="user", content=text)
        await self.session.update_chat_ctx(chat_ctx)
        await self.session.generate_reply()

    async def configure(self) -> None:
        await self.session.update_instructions(INSTRUCTIONS)
        await self.session.update_tools([get_weather])

    async def push_audio(self, chunk: bytes) -> None:
        self.session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))

    async def text_turn(self) -> None:
        await self.say(TYPED[0])

    async def set_instructions(self, instructions: str) -> None:
        await self.session.update_instructions(instructions)

    async def turn_after_new_instructions(self) -> None:
        await self.say(TYPED[1])

    async def force_tool_call(self) -> None:
        await self.session.generate_reply(tool_choice={"type": "function", "function": {"name": "get_weather"}})

    async def answer_tool_call(self, mark: int) -> None:
        """Run the tool as AgentActivity does, send its output through the chat context and ask for
        the spoken follow-up."""
        await until(lambda: bool(self.function_calls))
        call = self.function_calls[-1]
        result = await llm.utils.execute_function_call(
            llm.FunctionToolCall(name=call.name, arguments=call.arguments, call_id=call.call_id), self.session.tools)
        chat_ctx = self.session.chat_ctx.copy()
        chat_ctx.items.append(result.fnc_call_out)
        await self.session.update_chat_ctx(chat_ctx)
        await self.session.generate_reply()

    def interruptions(self) -> int:
        return self.speech_started

    def history_transcripts(self) -> list[str]:
        return [item.text_content or "" for item in self.session.chat_ctx.items
                if item.type == "message" and item.role == "user" and item.text_content not in TYPED]


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
    try:
        await LivekitWalk(report, config, session).walk()
    finally:
        await session.aclose()
        await model.aclose()
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
