"""pipecat (OpenAIRealtimeLLMService, GA realtime) walks the steps against the server.

No transport: a minimal pipeline (user aggregator -> LLM service -> assistant aggregator) fed
with pipecat's own frames (InputAudioRawFrame for the microphone, LLMRunFrame,
LLMUpdateSettingsFrame). Run by tests/frameworks/test_pipecat.py with the
framework's own venv: `python drive_pipecat.py CONFIG.json`; prints one JSON line per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from pipecat.adapters.schemas.function_schema import FunctionSchema
from pipecat.adapters.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMRunFrame,
    LLMUpdateSettingsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
)
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime import llm as realtime_llm
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner
from steps import (
    BARGE_IN_SPEEDUP,
    INSTRUCTIONS,
    NEW_INSTRUCTIONS,
    RATE,
    TRANSCRIPT_WAIT_S,
    WEATHER_TOOL,
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


async def get_weather(params: FunctionCallParams) -> None:
    tool_calls.append(dict(params.arguments))
    await params.result_callback(weather_report(params.arguments.get("city")))


class Observer(BaseObserver):
    """The frames the LLM service pushes (audio, errors, interruptions, transcripts) and, through a
    tap on the service's event parser, the raw server events (pipecat has no public hook for them)."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report
        self.server = ServerLog()
        self.service: OpenAIRealtimeLLMService | None = None
        self.audio_bytes: dict[str, int] = {}  # response_id -> bytes of audio the service pushed
        self.frames: list[str] = []  # the service's frame types, in order
        self.response_id: str | None = None

    def tap_server_events(self) -> None:
        parse = events.parse_server_event

        def parse_and_record(message: str):
            try:
                event = parse(message)
            except Exception as exc:  # the service's receive loop dies on it: an error for the test
                self.report.error(f"unparseable server event: {exc}")
                self.server.stopped = f"pipecat stopped reading server events at: {str(exc)[:120]}"
                raise
            raw = json.loads(message)
            self.server.add(raw)
            if raw["type"] == "response.created":
                self.response_id = raw["response"]["id"]
            return event

        realtime_llm.events.parse_server_event = parse_and_record

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if data.source is not self.service:
            return
        self.frames.append(type(frame).__name__)
        if isinstance(frame, TTSAudioRawFrame) and self.response_id:
            self.audio_bytes[self.response_id] = self.audio_bytes.get(self.response_id, 0) + len(frame.audio)
        elif isinstance(frame, ErrorFrame):
            self.report.error(frame.error)


async def send_speech(worker: PipelineWorker, audio: bytes, speedup: float = 2.0) -> None:
    async for chunk in paced_chunks(audio, speedup):
        await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))



async def spoken_turn(worker: PipelineWorker, observed: Observer, report: Report, audio: bytes) -> None:
    mark = observed.server.mark()
    await send_speech(worker, audio)
    done = await observed.server.next(mark, "response.done")
    report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))


async def barge_in(worker: PipelineWorker, observed: Observer, report: Report, config: dict[str, Any]) -> None:
    """Speak; once the reply's audio is arriving, speak over it."""
    mark = observed.server.mark()
    speaking = asyncio.create_task(send_speech(worker, pcm(config["audio"]["first"])))
    await observed.server.next(mark, "response.output_audio.delta")
    speaking.cancel()
    barge_mark, frames_mark = observed.server.mark(), len(observed.frames)
    await send_speech(worker, pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
    interrupted = await observed.server.next(mark, "response.done")
    following = await observed.server.next(barge_mark, "response.done", lambda e: e is not interrupted)
    report.note(
        interrupted=response_facts(interrupted),
        framework_saw_interruption=InterruptionFrame.__name__ in observed.frames[frames_mark:],
        truncated=bool(observed.server.since(barge_mark, "conversation.item.truncated")),
        following=reply_facts(following, observed.audio_bytes),
        events=observed.server.types_since(mark),
    )


async def forced_tool_call(service: OpenAIRealtimeLLMService, observed: Observer, report: Report) -> None:
    """A response that must call a tool (pipecat's tool_choice: "required"); the service runs the
    registered function, sends its result and asks for the spoken follow-up."""
    mark = observed.server.mark()
    await service.send_client_event(events.ResponseCreateEvent(response=events.ResponseProperties(tool_choice="required")))
    call_done = await observed.server.next(mark, "response.done")
    report.note(call=response_facts(call_done), events=observed.server.types_since(mark))
    if "function_call" not in response_facts(call_done)["output_types"]:
        return
    await until(lambda: bool(tool_calls))
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


TYPED = "What can you do for me?"


def spoken_user_messages(context: LLMContext) -> list[Any]:
    """The context's user messages other than the typed one: what transcripts put there."""
    return [
        message.get("content") for message in context.get_messages()
        if isinstance(message, dict) and message.get("role") == "user" and message.get("content") != TYPED
    ]


async def walk(worker: PipelineWorker, service: OpenAIRealtimeLLMService, context: LLMContext,
               observed: Observer, report: Report, config: dict[str, Any]) -> None:
    async with report.stepping("connect"):
        created = await observed.server.next(0, "session.created")
        report.note(session_created=True, model=created["session"].get("model"))

    async with report.stepping("session_update"):
        updated = await observed.server.next(0, "session.updated", lambda e: bool(e["session"].get("tools")))
        report.note(**session_facts(updated["session"]))

    async with report.stepping("text_turn"):
        mark = observed.server.mark()
        await worker.queue_frame(LLMRunFrame())  # the context holds the user's first message
        done = await observed.server.next(mark, "response.done")
        report.note(**reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("spoken_turn"):
        await spoken_turn(worker, observed, report, pcm(config["audio"]["first"]))

    async with report.stepping("second_spoken_turn"):
        await spoken_turn(worker, observed, report, pcm(config["audio"]["second"]))

    async with report.stepping("barge_in"):
        await barge_in(worker, observed, report, config)

    async with report.stepping("new_instructions"):
        mark = observed.server.mark()
        await worker.queue_frame(LLMUpdateSettingsFrame(delta=OpenAIRealtimeLLMService.Settings(system_instruction=NEW_INSTRUCTIONS)))
        updated = await observed.server.next(mark, "session.updated")
        report.note(echoed_instructions=updated["session"].get("instructions"))
        # A spoken turn: pipecat's realtime service sends the server no context message mid-session
        # (LLMMessagesAppendFrame stops at the user aggregator), only function results.
        await send_speech(worker, pcm(config["audio"]["second"]))
        done = await observed.server.next(mark, "response.done")
        report.note(reply=reply_facts(done, observed.audio_bytes), events=observed.server.types_since(mark))

    async with report.stepping("forced_tool_call"):
        await forced_tool_call(service, observed, report)

    async with report.stepping("user_transcripts"):
        # Transcripts may trail the replies (they are made below first-audio work).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                await until(lambda: len(observed.server.since(0, "conversation.item.input_audio_transcription.completed")) >= 4)
        completed = observed.server.since(0, "conversation.item.input_audio_transcription.completed")
        report.note(server_transcripts=[event.get("transcript") for event in completed],
                    transcription_frames=observed.frames.count(TranscriptionFrame.__name__),
                    history_transcripts=spoken_user_messages(context))


async def main() -> None:
    config = load_config()
    report = Report()
    observed = Observer(report)
    observed.tap_server_events()
    weather = FunctionSchema(name=WEATHER_TOOL["name"], description=WEATHER_TOOL["description"],
                             properties=WEATHER_TOOL["parameters"]["properties"],
                             required=WEATHER_TOOL["parameters"]["required"])
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
                tools=ToolsSchema(standard_tools=[weather]),
            ),
        ),
    )
    service.register_function("get_weather", get_weather)
    observed.service = service
    context = LLMContext([{"role": "user", "content": TYPED}])
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
    worker = PipelineWorker(
        Pipeline([user_aggregator, service, assistant_aggregator]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        idle_timeout_secs=None,
        observers=[observed],
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await walk(worker, service, context, observed, report, config)
    finally:
        await worker.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
