"""POST /v1/audio/speech: a whole file, an SSE stream, or a raw audio stream.

- Whole file (default): the clip in `response_format`, with the usage in response headers named
  `x-sgl-omni-input-tokens`, `-output-tokens`, `-total-tokens`, `-input-text-tokens`,
  `-input-audio-tokens` (prefix `USAGE_HEADER_PREFIX`), plus `x-sgl-omni-request-id`.
- `stream=true` or `stream_format="sse"`: `speech.audio.delta` events (base64 audio as decoded),
  then `speech.audio.done` with the usage, or `speech.audio.error` if generation fails.
- `stream_format="audio"`: the bytes as they are decoded; a wav stream starts with a streaming
  WAV header (sizes 0xFFFFFFFF). A failure mid-stream aborts the connection (no clean end), so a
  client never takes a cut-off clip for a whole one.

Streams require `pcm` or `wav` and speed 1.0. When the client goes away, the request's graph
session is closed at once: its queued executor work is dropped and no further model steps run
for it (see `JobStreamingResponse`; the non-streaming path watches for the disconnect too).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from graph.errors import SessionRejected
from graph.messages import Usage
from session_server import strict_json
from session_server.errors import openai_error_response
from session_server.speech import encode
from session_server.request_body import declared_body
from session_server.speech.params import SPEECH_REQUEST_SCHEMA, SpeechError, SpeechParams, parse_speech
from session_server.speech.service import SPEECH_INPUT, SpeechFailed, SpeechJob, SpeechService, usage_body

log = logging.getLogger("session_server.speech")

USAGE_HEADER_PREFIX = "x-sgl-omni-"


def error_response(error: SpeechError) -> Response:
    return openai_error_response(error.status, error.message, error.type, error.param, error.code)


def ensure_available(service: SpeechService) -> None:
    runtime = service.runtime
    if runtime.shutting_down:
        raise SpeechError(503, "The server is shutting down.", None, "server_shutting_down", "server_error")
    if not runtime.ready:
        raise SpeechError(503, "The server is still loading the model.", None, "server_not_ready", "server_error")
    if SPEECH_INPUT not in runtime.spec.inputs:
        raise SpeechError(501, "This server's graph has no `speech` input: it does not serve speech.", None, "speech_unsupported", "server_error")


async def read_json(request: Request) -> Any:
    try:
        return strict_json.loads(await request.body())
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise SpeechError(400, "The request body is not valid JSON (or is nested too deeply)", None, "invalid_json") from None


def rejected(exc: SessionRejected) -> SpeechError:
    return SpeechError(503, exc.message, None, exc.code, "server_error")


def new_job(service: SpeechService, params: SpeechParams, transport: str = "http") -> SpeechJob:
    return service.job(
        transport=transport,
        text=params.input,
        voice=params.voice,
        instructions=params.instructions,
        max_new_tokens=params.max_new_tokens,
        seed=params.seed,
    )


def usage_headers(job: SpeechJob) -> dict[str, str]:
    usage = job.usage or Usage()
    p = USAGE_HEADER_PREFIX
    return {
        f"{p}request-id": job.id,
        f"{p}input-tokens": str(usage.input_tokens),
        f"{p}output-tokens": str(usage.output_tokens),
        f"{p}total-tokens": str(usage.total_tokens),
        f"{p}input-text-tokens": str(usage.input_text_tokens),
        f"{p}input-audio-tokens": str(usage.input_audio_tokens),
    }


def render_clip(chunks: list[np.ndarray], source_rate: int, params: SpeechParams) -> bytes:
    """The whole clip in the requested speed, rate and format (blocking: run it in a thread)."""
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, dtype=np.float32)
    samples = encode.time_stretch(samples, source_rate, params.speed)
    target_rate = params.sample_rate or source_rate
    samples = encode.resample(samples, source_rate, target_rate)
    return encode.encode(samples, target_rate, params.response_format)


async def synthesize_clip(service: SpeechService, params: SpeechParams) -> tuple[bytes, SpeechJob]:
    """Run a job to the end and encode it. Raises SessionRejected / SpeechFailed."""
    job = new_job(service, params)
    async with job:
        chunks: list[np.ndarray] = []
        source_rate = service.model_voices().sample_rate
        async for out in job.audio():
            chunks.append(np.asarray(out.samples, dtype=np.float32))
            source_rate = out.sample_rate
    audio = await asyncio.to_thread(render_clip, chunks, source_rate, params)
    return audio, job


class JobStreamingResponse(StreamingResponse):
    """A streamed response that always closes its job, however the response ends.

    Starlette cancels the body iterator when the client disconnects; a body iterator that never
    started (the client left before the headers went out) would never run its own `finally`,
    so the job is closed here, around the whole response.
    """

    def __init__(self, job: SpeechJob, content: AsyncIterator[bytes | str], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The body closes the job as soon as the audio has ended; this is the safety net for a
            # client that left before (or a body that never started).
            if not self.job.closed:
                log.info("speech %s: stream ended before the audio did; generation cancelled", self.job.id)
            await self.job.close("client_disconnected")  # idempotent: keeps the first reason


def _sse(event: str, payload: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n"


async def sse_events(job: SpeechJob, params: SpeechParams, target_rate: int) -> AsyncIterator[str]:
    encoder: encode.StreamEncoder | None = None
    prefix = encode.wav_header(target_rate) if params.response_format == "wav" else b""

    def delta(data: bytes) -> str:
        return _sse(
            "speech.audio.delta",
            {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii"), "response_format": params.response_format},
        )

    try:
        async for out in job.audio():
            if encoder is None:
                encoder = encode.StreamEncoder(params.response_format, out.sample_rate, target_rate)
            data = prefix + encoder.push(out.samples)
            prefix = b""
            if data:
                yield delta(data)
    except SpeechFailed as exc:
        log.warning("speech %s failed: %s", job.id, exc.message)
        await job.close("failed")  # before the terminal event: a client may retry at once
        error = {"message": exc.message, "type": "server_error", "param": None, "code": exc.code}
        yield _sse("speech.audio.error", {"type": "speech.audio.error", "error": error})
        return
    # The audio has ended: free the speech slot before the terminal event, so a client that
    # sends its next request as soon as it sees `speech.audio.done` finds it free.
    await job.close("completed")
    tail = prefix + (encoder.finish() if encoder is not None else b"")
    if tail:
        yield delta(tail)
    yield _sse("speech.audio.done", {"type": "speech.audio.done", "usage": usage_body(job.usage)})


async def audio_bytes(job: SpeechJob, params: SpeechParams, target_rate: int) -> AsyncIterator[bytes]:
    if params.response_format == "wav":
        yield encode.wav_header(target_rate)
    encoder: encode.StreamEncoder | None = None
    try:
        async for out in job.audio():
            if encoder is None:
                encoder = encode.StreamEncoder(params.response_format, out.sample_rate, target_rate)
            data = encoder.push(out.samples)
            if data:
                yield data
    except SpeechFailed as exc:
        # Raising aborts the chunked body, so the client sees a broken stream, not a short clip.
        log.warning("speech %s failed mid-stream: %s", job.id, exc.message)
        await job.close("failed")
        raise
    # The audio has ended: free the speech slot before the last bytes and the end of the body, so
    # a client that sends its next request as soon as this one ends finds it free.
    await job.close("completed")
    if encoder is not None and (tail := encoder.finish()):
        yield tail


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def install_speech_route(app: FastAPI, service: SpeechService) -> None:
    @app.post("/v1/audio/speech", openapi_extra=declared_body({"application/json": SPEECH_REQUEST_SCHEMA}))
    async def create_speech(request: Request) -> Response:
        try:
            ensure_available(service)
            params = parse_speech(await read_json(request), service)
        except SpeechError as error:
            return error_response(error)

        if params.stream_format is not None:
            job = new_job(service, params)
            try:
                await job.open()
            except SessionRejected as exc:
                return error_response(rejected(exc))
            target_rate = params.sample_rate or service.model_voices().sample_rate
            headers = {f"{USAGE_HEADER_PREFIX}request-id": job.id, "Cache-Control": "no-cache"}
            if params.stream_format == "sse":
                return JobStreamingResponse(
                    job, sse_events(job, params, target_rate), media_type="text/event-stream", headers=headers | {"X-Accel-Buffering": "no"}
                )
            return JobStreamingResponse(
                job, audio_bytes(job, params, target_rate), media_type=encode.MEDIA_TYPES[params.response_format], headers=headers
            )

        # Whole file: generate while watching for the client going away.
        synthesis = asyncio.create_task(synthesize_clip(service, params))
        disconnect = asyncio.create_task(wait_for_disconnect(request))
        try:
            await asyncio.wait({synthesis, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            synthesis.cancel()  # the handler itself was cancelled (server shutdown): stop the work too
            raise
        finally:
            disconnect.cancel()
        if not synthesis.done():
            synthesis.cancel()  # the job's `async with` closes its graph session
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await synthesis
            return Response(status_code=499)  # nobody is listening; logged as client closed request
        try:
            audio, job = synthesis.result()
        except SessionRejected as exc:
            return error_response(rejected(exc))
        except SpeechFailed as exc:
            log.warning("speech failed: %s", exc.message)
            return openai_error_response(500, exc.message, "server_error", None, exc.code)
        return Response(audio, media_type=encode.MEDIA_TYPES[params.response_format], headers=usage_headers(job))
