"""pipecat's OpenAILiveLLMService (OpenAI's Live API) against the server's `/v1/live/sessions`.

The same minimal pipeline as drive_pipecat.py (no transport; pipecat's own frames). The steps:
`connect` (session.start -> session.started), `typed_turn` (a trailing developer message, which
pipecat delivers as `session.commentary.append` once the session started), `spoken_turn`.
Run by tests/live/test_live_frameworks.py with the pipecat venv: `python drive_pipecat_live.py CONFIG.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from pipecat.frames.frames import ErrorFrame, InputAudioRawFrame, LLMRunFrame, OutputAudioRawFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.openai.live import events
from pipecat.services.openai.live import llm as live_llm
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.workers.runner import WorkerRunner
from steps import INSTRUCTIONS, RATE, TRANSCRIPT_WAIT_S, Report, ServerLog, load_config, paced_chunks, pcm

OPENING = "Greet the user in one short sentence."


class Observer(BaseObserver):
    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report
        self.server = ServerLog()
        self.service: OpenAILiveLLMService | None = None
        self.audio_bytes = 0

    def tap_server_events(self) -> None:
        parse = events.parse_server_event

        def parse_and_record(message: str):
            event = parse(message)
            self.server.add(json.loads(message))
            return event

        live_llm.events.parse_server_event = parse_and_record

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.source is not self.service:
            return
        if isinstance(data.frame, OutputAudioRawFrame):  # SpeechOutputAudioRawFrame
            self.audio_bytes += len(data.frame.audio)
        elif isinstance(data.frame, ErrorFrame):
            self.report.error(data.frame.error)


def transcript(observed: Observer, mark: int, kind: str) -> str:
    return "".join(event["delta"] for event in observed.server.since(mark, kind))


async def walk(worker: PipelineWorker, observed: Observer, report: Report, config: dict) -> None:
    async with report.stepping("connect"):
        await worker.queue_frame(LLMRunFrame())  # the Live session starts on the first context
        started = await observed.server.next(0, "session.started")
        report.note(model=started["session"]["model"], instructions=started["session"].get("instructions"),
                    served_model=started["session"].get("sglang", {}).get("served_model"))

    async with report.stepping("typed_turn"):
        done = await observed.server.next(0, "session.usage.updated")
        report.note(commentary_appended=bool(observed.server.since(0, "session.commentary.appended")),
                    said=transcript(observed, 0, "session.output_transcript.delta"), audio_bytes=observed.audio_bytes,
                    usage=done["usage"])

    async with report.stepping("spoken_turn"):
        mark, audio_before = observed.server.mark(), observed.audio_bytes
        async for chunk in paced_chunks(pcm(config["audio"]["first"])):
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))
        await observed.server.next(mark, "session.usage.updated")
        with contextlib.suppress(TimeoutError):  # transcripts may trail the reply
            async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                await observed.server.next(mark, "session.input_transcript.delta")
        report.note(heard=transcript(observed, mark, "session.input_transcript.delta"),
                    said=transcript(observed, mark, "session.output_transcript.delta"),
                    audio_bytes=observed.audio_bytes - audio_before)


async def main() -> None:
    config = load_config()
    report = Report()
    observed = Observer(report)
    observed.tap_server_events()
    service = OpenAILiveLLMService(api_key=config["api_key"], base_url=config["live_url"],
                                   settings=OpenAILiveLLMService.Settings(model="gpt-live-1"))
    observed.service = service
    context = LLMContext([{"role": "system", "content": INSTRUCTIONS}, {"role": "developer", "content": OPENING}])
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
        await walk(worker, observed, report, config)
    finally:
        await worker.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
