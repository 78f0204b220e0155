"""pipecat (OpenAIRealtimeLLMService, GA realtime) walks the steps against the server.

No transport: a minimal pipeline (user aggregator -> LLM service -> assistant aggregator) fed
with pipecat's own frames (InputAudioRawFrame for the microphone, LLMRunFrame,
LLMUpdateSettingsFrame). Run by tests/frameworks/test_pipecat.py with the
framework's own venv: `python drive_pipecat.py CONFIG.json`; prints one JSON line per step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat.adapters.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import ErrorFrame, InterruptionFrame, LLMRunFrame, LLMUpdateSettingsFrame, TTSAudioRawFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime import llm as realtime_llm
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat_pipeline import get_weather, microphone, pipeline_worker, run_worker, tap_server_events, weather_schema
from steps import INSTRUCTIONS, RealtimeWalk, Report, load_config, pcm, tool_calls, until

TYPED = "What can you do for me?"


class Frames(BaseObserver):
    """The frames the LLM service pushes: reply audio (counted per response), errors, their types."""

    def __init__(self, walk: PipecatWalk) -> None:
        super().__init__()
        self.walk = walk
        self.service: OpenAIRealtimeLLMService | None = None
        self.kinds: list[str] = []  # the service's frame types, in order

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if data.source is not self.service:
            return
        self.kinds.append(type(frame).__name__)
        response_id = self.walk.response_id
        if isinstance(frame, TTSAudioRawFrame) and response_id:
            self.walk.audio_bytes[response_id] = self.walk.audio_bytes.get(response_id, 0) + len(frame.audio)
        elif isinstance(frame, ErrorFrame):
            self.walk.report.error(frame.error)


class PipecatWalk(RealtimeWalk):
    def __init__(self, report: Report, config: dict[str, Any]) -> None:
        super().__init__(report, config)
        self.response_id: str | None = None  # the response in progress, for counting its audio
        self.frames = Frames(self)
        self.worker: PipelineWorker | None = None
        self.service: OpenAIRealtimeLLMService | None = None
        self.context = LLMContext([{"role": "user", "content": TYPED}])
        tap_server_events(realtime_llm, self.server, report, self.on_server_event)

    def on_server_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.created":
            self.response_id = event["response"]["id"]

    async def push_audio(self, chunk: bytes) -> None:
        await microphone(self.worker)(chunk)

    async def text_turn(self) -> None:
        await self.worker.queue_frame(LLMRunFrame())  # the context holds the user's first message

    async def set_instructions(self, instructions: str) -> None:
        settings = OpenAIRealtimeLLMService.Settings(system_instruction=instructions)
        await self.worker.queue_frame(LLMUpdateSettingsFrame(delta=settings))

    async def turn_after_new_instructions(self) -> None:
        # A spoken turn: pipecat's realtime service sends the server no context message mid-session
        # (LLMMessagesAppendFrame stops at the user aggregator), only function results.
        await self.speak(pcm(self.config["audio"]["second"]))

    async def force_tool_call(self) -> None:
        """pipecat's only forcing choice, tool_choice: "required"; the service runs the registered
        function, sends its result and asks for the spoken follow-up."""
        forced = events.ResponseCreateEvent(response=events.ResponseProperties(tool_choice="required"))
        await self.service.send_client_event(forced)

    async def answer_tool_call(self, mark: int) -> None:
        await until(lambda: bool(tool_calls))

    def interruptions(self) -> int:
        return self.frames.kinds.count(InterruptionFrame.__name__)

    def history_transcripts(self) -> list[Any]:
        """The context's user messages other than the typed one: what transcripts put there."""
        return [
            message.get("content") for message in self.context.get_messages()
            if isinstance(message, dict) and message.get("role") == "user" and message.get("content") != TYPED
        ]


async def main() -> None:
    config = load_config()
    report = Report()
    walk = PipecatWalk(report, config)
    service = OpenAIRealtimeLLMService(
        api_key=config["api_key"],
        base_url=config["ws_base_url"],
        settings=OpenAIRealtimeLLMService.Settings(
            model=config["model"],
            system_instruction=INSTRUCTIONS,
            session_properties=events.SessionProperties(
                audio=events.AudioConfiguration(
                    input=events.AudioInput(
                        transcription=events.InputAudioTranscription(model=config["transcription_model"]),
                        turn_detection=events.TurnDetection(type="server_vad"),
                    ),
                    output=events.AudioOutput(voice=config["voice"]),
                ),
                tools=ToolsSchema(standard_tools=[weather_schema()]),
            ),
        ),
    )
    service.register_function("get_weather", get_weather)
    walk.service = walk.frames.service = service
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(walk.context)
    walk.worker = pipeline_worker([user_aggregator, service, assistant_aggregator], walk.frames)
    await run_worker(walk.worker, walk.walk())
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
