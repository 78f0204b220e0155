"""openai-agents (RealtimeAgent / RealtimeRunner) walks the steps against the server.

Run by tests/frameworks/test_openai_agents.py with the framework's own venv:
`python drive_openai_agents.py CONFIG.json`; prints one JSON line per step (steps.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage
from steps import INSTRUCTIONS, RealtimeWalk, Report, load_config, run_weather_tool


@function_tool
def get_weather(city: str) -> dict[str, Any]:
    """The current weather in a city."""
    return run_weather_tool({"city": city})


class AgentsWalk(RealtimeWalk):
    """The steps through a RealtimeSession; its event stream feeds the log, audio, errors, history."""

    def __init__(self, report: Report, config: dict[str, Any], runner: RealtimeRunner) -> None:
        super().__init__(report, config)
        self.runner = runner
        self.session: Any = None
        self.consumer: asyncio.Task | None = None
        self.kinds: list[str] = []  # the session's own event types, in order
        self.history: dict[str, Any] = {}  # item_id -> item, as the session's history events say

    async def consume(self) -> None:
        async for event in self.session:
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

    async def open(self) -> None:
        self.session = await self.runner.run(model_config={"url": self.config["url"], "api_key": self.config["api_key"]})
        await self.session.enter()
        self.consumer = asyncio.create_task(self.consume())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.consumer is not None:
            self.consumer.cancel()

    async def push_audio(self, chunk: bytes) -> None:
        await self.session.send_audio(chunk)

    async def text_turn(self) -> None:
        await self.session.send_message("What can you do for me?")

    async def set_instructions(self, instructions: str) -> None:
        await self.session.update_agent(RealtimeAgent(name="Cheerful", instructions=instructions, tools=[get_weather]))

    async def turn_after_new_instructions(self) -> None:
        await self.session.send_message("And the day after?")

    async def force_tool_call(self) -> None:
        """A raw response.create forcing get_weather; the session runs the tool and answers on its own."""
        await self.session.model.send_event(RealtimeModelSendRawMessage(message={
            "type": "response.create",
            "other_data": {"response": {"tool_choice": {"type": "function", "name": "get_weather"}}},
        }))

    async def answer_tool_call(self, mark: int) -> None:
        await self.server.next(mark, "conversation.item.added", lambda e: e["item"].get("type") == "function_call_output")

    def interruptions(self) -> int:
        return self.kinds.count("audio_interrupted")

    def history_transcripts(self) -> list[str | None]:
        return [
            content.transcript
            for item in self.history.values()
            if getattr(item, "role", None) == "user"
            for content in item.content
            if content.type == "input_audio"
        ]


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
    walk = AgentsWalk(report, config, runner)
    try:
        await walk.walk()
    finally:
        await walk.close()
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
