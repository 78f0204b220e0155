"""What the two pipecat drivers share (drive_pipecat.py: the GA service; drive_pipecat_live.py: the
Live one): the `get_weather` function, the minimal pipeline without a transport, the microphone
as InputAudioRawFrames, and a tap on the service's event parser (pipecat has no public hook for
the raw server events). Imported from the drivers' folder in the pipecat venv.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from pipecat.adapters.schemas.function_schema import FunctionSchema
from pipecat.frames.frames import InputAudioRawFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.workers.runner import WorkerRunner
from steps import RATE, WEATHER_TOOL, Report, ServerLog, run_weather_tool


async def get_weather(params: FunctionCallParams) -> None:
    await params.result_callback(run_weather_tool(params.arguments))


def weather_schema() -> FunctionSchema:
    return FunctionSchema(name=WEATHER_TOOL["name"], description=WEATHER_TOOL["description"],
                          properties=WEATHER_TOOL["parameters"]["properties"],
                          required=WEATHER_TOOL["parameters"]["required"])


def microphone(worker: PipelineWorker) -> Callable[[bytes], Awaitable[None]]:
    """`push` for steps.speak: each chunk an InputAudioRawFrame queued into the pipeline."""
    async def push(chunk: bytes) -> None:
        await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))

    return push


def tap_server_events(service_module: ModuleType, log: ServerLog, report: Report,
                      seen: Callable[[dict[str, Any]], None] = lambda _: None) -> None:
    """Record every server event the service's module parses into `log` (then `seen` it). An event
    pipecat cannot parse kills its receive loop: an error for the test, and no more waiting."""
    parse = service_module.events.parse_server_event

    def parse_and_record(message: str):
        try:
            event = parse(message)
        except Exception as exc:
            report.error(f"unparseable server event: {exc}")
            log.stopped = f"pipecat stopped reading server events at: {str(exc)[:120]}"
            raise
        raw = json.loads(message)
        log.add(raw)
        seen(raw)
        return event

    service_module.events.parse_server_event = parse_and_record


def pipeline_worker(processors: list[FrameProcessor], observer: BaseObserver) -> PipelineWorker:
    return PipelineWorker(
        Pipeline(processors),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        idle_timeout_secs=None,
        observers=[observer],
    )


async def run_worker(worker: PipelineWorker, walk: Awaitable[None]) -> None:
    """Run the pipeline while `walk` goes through the steps, then cancel it."""
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await walk
    finally:
        await worker.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
