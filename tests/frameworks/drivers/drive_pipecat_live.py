"""pipecat's OpenAILiveLLMService (OpenAI's Live API) against the server's `/v1/live/sessions`.

The same minimal pipeline as drive_pipecat.py (no transport; pipecat's own frames). The steps:
`connect` (session.start -> session.started), `typed_turn` (a trailing developer message, which
pipecat delivers as `session.commentary.append` once the session started), `spoken_turn`,
`barge_in` (speech over a reply: the live model handles it, pipecat broadcasts no interruption),
`instructions_append` (pipecat's own `SessionInstructionsAppendEvent` through its public
`send_client_event`: the service forwards no context message mid-session), `mute` (pipecat's
user mute strategies: the user aggregator drops the audio, so the service has no mute event to
send), `close` (an `EndFrame`: the service sends `session.close` and waits for `session.closed`).
With `"delegating": true` in its config, the one step `delegation`: a
`ClientDelegation` backend worker runs `get_weather` through pipecat's function calling.
Run by tests/live/test_live_frameworks.py with the pipecat venv: `python drive_pipecat_live.py CONFIG.json`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pipecat.adapters.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMRunFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import FunctionCallFromLLM, LLMService
from pipecat.services.openai.live import events
from pipecat.services.openai.live import llm as live_llm
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.turns.user_mute.base_user_mute_strategy import BaseUserMuteStrategy
from pipecat.workers.llm.backend_llm_worker import BackendLLMWorker
from pipecat_pipeline import get_weather, microphone, pipeline_worker, run_worker, tap_server_events, weather_schema
from steps import (
    BARGE_IN_SPEEDUP,
    DELEGATE_ASK,
    INSTRUCTIONS,
    NEW_INSTRUCTIONS,
    RATE,
    Report,
    ServerLog,
    live_audio_bytes,
    live_barge_in,
    live_spoken_turn,
    load_config,
    pcm,
    speak,
    tool_calls,
    transcript,
    until,
    weather_sentence,
)

OPENING = "Greet the user in one short sentence."


class WeatherBackendLLM(LLMService):
    """The text model of the delegation backend, scripted (no text model is served here): to a
    request it calls `get_weather` for Paris through pipecat's function calling, and once the
    result is in the context it says it, marked to be spoken (BackendLLMWorker's `>>`)."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        results = [m for m in frame.context.get_messages() if isinstance(m, dict) and m.get("role") == "tool"]
        if not results:
            await self.run_function_calls([FunctionCallFromLLM(context=frame.context, tool_call_id="call_weather",
                                                               function_name="get_weather", arguments={"city": "Paris"})])
        elif results[-1].get("content") not in (None, "IN_PROGRESS"):
            await self.push_frame(LLMFullResponseStartFrame())
            await self.push_frame(LLMTextFrame(">> " + weather_sentence(json.loads(results[-1]["content"]))))
            await self.push_frame(LLMFullResponseEndFrame())


class UserMute(BaseUserMuteStrategy):
    """Mutes the user while `muted`: pipecat's user aggregator then drops their audio frames."""

    muted = False

    async def process_frame(self, frame: Frame) -> bool:
        return self.muted


class Observer(BaseObserver):
    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report
        self.server = ServerLog()
        self.service: OpenAILiveLLMService | None = None
        self.audio_bytes = 0
        self.audio_frames_in = 0  # InputAudioRawFrames that reached the service
        self.interruptions = 0
        self.delegations: list[str] = []  # ids pipecat's on_delegation_created gave
        self.context_appends: list[dict[str, Any]] = []  # as pipecat sent them
        self.user_muted = False

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.destination is self.service and isinstance(data.frame, InputAudioRawFrame):
            self.audio_frames_in += 1
        if data.source is not self.service:
            return
        if isinstance(data.frame, OutputAudioRawFrame):  # SpeechOutputAudioRawFrame
            self.audio_bytes += len(data.frame.audio)
        elif isinstance(data.frame, InterruptionFrame):
            self.interruptions += 1
        elif isinstance(data.frame, ErrorFrame):
            self.report.error(data.frame.error)


async def spoken_turn(worker: PipelineWorker, observed: Observer, audio: bytes) -> dict[str, Any]:
    """steps.live_spoken_turn, with the audio pipecat pushed on, not the server's bytes."""
    return await live_spoken_turn(microphone(worker), observed.server, audio, played=lambda: observed.audio_bytes)


async def barge_in(worker: PipelineWorker, observed: Observer, report: Report, config: dict) -> None:
    interruptions = observed.interruptions
    report.note(**await live_barge_in(microphone(worker), observed.server, config),
                interruption_frames=observed.interruptions - interruptions)


async def walk(worker: PipelineWorker, service: OpenAILiveLLMService, mute: UserMute, observed: Observer,
               report: Report, config: dict) -> None:
    async with report.stepping("connect"):
        await worker.queue_frame(LLMRunFrame())  # the Live session starts on the first context
        started = await observed.server.next(0, "session.started")
        report.note(model=started["session"]["model"], instructions=started["session"].get("instructions"),
                    served_model=started["session"].get("sglang", {}).get("served_model"))

    async with report.stepping("typed_turn"):
        done = await observed.server.next(0, "session.usage.updated")
        report.note(commentary_appended=bool(observed.server.since(0, "session.commentary.appended")),
                    said=transcript(observed.server, 0, "session.output_transcript.delta"),
                    # The reply's audio as the server sent it (as the mute step counts it): what
                    # pipecat has handed on by now may still lag its last frames.
                    audio_bytes=live_audio_bytes(observed.server, 0), framework_audio_bytes=observed.audio_bytes,
                    usage=done["usage"])

    async with report.stepping("spoken_turn"):
        report.note(**await spoken_turn(worker, observed, pcm(config["audio"]["first"])))

    async with report.stepping("barge_in"):
        await barge_in(worker, observed, report, config)

    async with report.stepping("instructions_append"):
        mark = observed.server.mark()
        append = events.SessionInstructionsAppendEvent(delegation_id=None, content=NEW_INSTRUCTIONS)
        await service.send_client_event(append)
        acked = await observed.server.next(mark, "session.instructions.appended")
        report.note(acknowledged=acked.get("client_event_id") == append.event_id,
                    next_turn=await spoken_turn(worker, observed, pcm(config["audio"]["second"])))

    async with report.stepping("mute"):
        mute.muted = True
        # pipecat asks the strategies after each frame whether to mute the next ones: one frame of
        # silence, and the user aggregator says it muted.
        await worker.queue_frame(InputAudioRawFrame(audio=bytes(RATE * 2 // 10), sample_rate=RATE, num_channels=1))
        await until(lambda: observed.user_muted)
        # Speech over a reply while muted: heard, it would cut the reply short (as in barge_in).
        mark, frames_before = observed.server.mark(), observed.audio_frames_in
        await service.send_client_event(events.SessionCommentaryAppendEvent(delegation_id=None, content=OPENING))
        await observed.server.next(mark, "session.output_audio.delta")
        await speak(microphone(worker), pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
        await observed.server.next(mark, "session.usage.updated")
        report.note(audio_frames_sent_while_muted=observed.audio_frames_in - frames_before,
                    reply_audio_bytes=live_audio_bytes(observed.server, mark))
        mute.muted = False
        report.note(after_unmute=await spoken_turn(worker, observed, pcm(config["audio"]["first"])))

    async with report.stepping("close"):
        mark = observed.server.mark()
        await worker.queue_frame(EndFrame())
        closed = await observed.server.next(mark, "session.closed")
        report.note(reason=closed["reason"], usage=closed.get("usage"))


async def walk_delegation(worker: PipelineWorker, observed: Observer, report: Report) -> None:
    async with report.stepping("delegation"):
        await worker.queue_frame(LLMRunFrame())  # the opening developer message asks the model to delegate
        created = await observed.server.next(0, "session.delegation.created")
        answered = await observed.server.next(observed.server.events.index(created), "session.commentary.appended")
        after = observed.server.events.index(answered)
        await observed.server.next(after, "session.usage.updated")
        report.note(delegation=created["delegation"], framework_delegations=observed.delegations,
                    tool_function_calls=list(tool_calls), context_appends=observed.context_appends,
                    said_after_answer=transcript(observed.server, after, "session.output_transcript.delta"))


async def main() -> None:
    config = load_config()
    delegating = config.get("delegating", False)
    report = Report()
    observed = Observer(report)
    tap_server_events(live_llm, observed.server, report)
    delegation = None
    if delegating:
        backend_llm = WeatherBackendLLM()
        backend_llm.register_function("get_weather", get_weather)
        backend = BackendLLMWorker(llm=backend_llm, context=LLMContext(tools=ToolsSchema(standard_tools=[weather_schema()])))
        delegation = OpenAILiveLLMService.ClientDelegation(backend=backend)
    service = OpenAILiveLLMService(api_key=config["api_key"], base_url=config["live_url"], delegation=delegation,
                                   settings=OpenAILiveLLMService.Settings(model="gpt-live-1"))
    observed.service = service

    @service.event_handler("on_delegation_created")
    async def on_delegation_created(_service, delegation) -> None:
        observed.delegations.append(delegation.id)

    send = service.send_client_event

    async def send_and_record(event: events.ClientEvent) -> None:  # no public hook for what pipecat sends
        if isinstance(event, events.ContextAppendEvent):
            observed.context_appends.append(event.to_payload())
        await send(event)

    service.send_client_event = send_and_record

    opening = DELEGATE_ASK if delegating else OPENING
    context = LLMContext([{"role": "system", "content": INSTRUCTIONS}, {"role": "developer", "content": opening}])
    mute = UserMute()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(user_mute_strategies=[mute]))

    @user_aggregator.event_handler("on_user_mute_started")
    async def on_user_mute_started(_aggregator) -> None:
        observed.user_muted = True

    @user_aggregator.event_handler("on_user_mute_stopped")
    async def on_user_mute_stopped(_aggregator) -> None:
        observed.user_muted = False

    worker = pipeline_worker([user_aggregator, service, assistant_aggregator], observed)
    walking = walk_delegation(worker, observed, report) if delegating else walk(worker, service, mute, observed, report, config)
    await run_worker(worker, walking)
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
