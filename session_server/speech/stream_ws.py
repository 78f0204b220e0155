"""WS /v1/audio/speech/stream: text arrives a piece at a time, audio goes back per unit.

Client -> server (JSON text messages):
    {"type": "session.config", ...}   first message; sticky; may be resent between utterances
    {"type": "input.text", "text": "..."}
    {"type": "input.done"}            flush: speak what is buffered; the connection stays open
    {"type": "session.close"}         finish what was flushed, then close (unflushed text is dropped)

Server -> client:
    {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format", "sample_rate"}
    binary frames                     one whole clip per unit, or PCM/WAV chunks with `stream_audio`
    {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
    {"type": "session.done", "utterance_index", "total_sentences"}
    {"type": "error", "message", "code"}   non-fatal unless followed by a close

`session.config` takes every field of POST /v1/audio/speech except `input`/`stream`/
`stream_format`, plus `stream_audio` (bool) and `split_granularity` (none | sentence | clause,
see `text_split.py`). A config sent while an utterance has text buffered or units spoken is
rejected (`config_mid_utterance`): no pending input is silently dropped and no utterance is
spoken half in one voice and half in another.

The reader and the speaker are two tasks: text keeps arriving while earlier units are spoken, in
order, one graph speech request per unit.

Limits (what the client sees):
- no `session.config` within `speech.ws_config_timeout_s` (10 s): `error` `config_timeout`, close 1008;
  a first message of another type: `error` `config_required`, close 1008.
- no client message for `speech.ws_idle_timeout_s` (120 s) while nothing is being spoken:
  `error` `idle_timeout`, close 1000.
- a message over `speech.ws_max_message_bytes` (64 KiB): `error` `message_too_large`, close 1009.
- more than `speech.ws_max_utterance_chars` (4096, the REST `input` bound) buffered for one
  utterance: `error` `utterance_too_long`; that text is refused, the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from graph.errors import SessionRejected
from session_server.speech import encode
from session_server.speech.params import SpeechError, SpeechParams, parse_speech
from session_server.speech.routes import new_job, render_clip
from session_server.speech.service import SpeechFailed, SpeechService
from session_server.speech.text_split import GRANULARITIES, TextSplitter

log = logging.getLogger("session_server.speech")

_NOT_CONFIG = ("input", "stream", "stream_format", "type", "stream_audio", "split_granularity")


@dataclass(frozen=True)
class StreamConfig:
    params: SpeechParams
    stream_audio: bool
    split_granularity: str
    sample_rate: int


@dataclass(frozen=True)
class Unit:
    utterance_index: int
    sentence_index: int
    text: str
    config: StreamConfig


@dataclass(frozen=True)
class UtteranceEnd:
    utterance_index: int
    total_sentences: int


class _Closed(Exception):
    def __init__(self, code: int, reason: str = ""):
        self.code = code
        self.reason = reason


class SpeechStream:
    def __init__(self, websocket: WebSocket, service: SpeechService):
        self.ws = websocket
        self.service = service
        self.limits = service.config
        self.config: StreamConfig | None = None
        self.splitter = TextSplitter("none")
        self.utterance_index = 0
        self.sentence_index = 0  # units queued for the current utterance
        self.queue: asyncio.Queue[Unit | UtteranceEnd | None] = asyncio.Queue()
        self.speaking = False
        self._send_lock = asyncio.Lock()

    # ------------------------------------------------------------------ sending

    async def send_json(self, payload: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(payload))

    async def send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.ws.send_bytes(data)

    async def error(self, code: str, message: str) -> None:
        await self.send_json({"type": "error", "code": code, "message": message})

    # ------------------------------------------------------------------ the connection

    async def run(self) -> None:
        await self.ws.accept()
        speaker = asyncio.create_task(self._speak_loop(), name="speech-stream-speaker")
        close_code, close_reason = 1000, ""
        try:
            await self._read_loop()
            self.queue.put_nowait(None)  # session.close: finish what was flushed first
            await speaker
        except _Closed as closed:
            close_code, close_reason = closed.code, closed.reason
        except WebSocketDisconnect:
            close_code = 0
        finally:
            speaker.cancel()  # a disconnect cancels the unit being spoken: its job closes
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await speaker
        if close_code and self.ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self.ws.close(close_code, close_reason)

    async def _receive(self) -> dict[str, Any] | None:
        """The next client message as JSON (None for a message that was reported as invalid)."""
        if self.config is None:
            try:
                message = await asyncio.wait_for(self.ws.receive(), self.limits.ws_config_timeout_s)
            except TimeoutError:
                await self.error("config_timeout", f"No session.config within {self.limits.ws_config_timeout_s:g} s")
                raise _Closed(1008, "config_timeout") from None
        else:
            while True:
                try:
                    message = await asyncio.wait_for(self.ws.receive(), self.limits.ws_idle_timeout_s)
                    break
                except TimeoutError:
                    if self.speaking or not self.queue.empty():
                        continue  # the client is listening, not idle
                    await self.error("idle_timeout", f"No message for {self.limits.ws_idle_timeout_s:g} s")
                    raise _Closed(1000, "idle_timeout") from None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        text, data = message.get("text"), message.get("bytes")
        size = len(text.encode("utf-8")) if text is not None else len(data or b"")
        if size > self.limits.ws_max_message_bytes:
            await self.error("message_too_large", f"Messages are limited to {self.limits.ws_max_message_bytes} bytes")
            raise _Closed(1009, "message_too_large")
        if text is None:
            await self.error("invalid_message", "Binary messages are not accepted; send JSON text messages")
            return None
        try:
            event = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            await self.error("invalid_json", "Messages must be JSON objects")
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.error("invalid_message", "Messages must be JSON objects with a `type`")
            return None
        return event

    async def _read_loop(self) -> None:
        while True:
            event = await self._receive()
            if event is None:
                continue
            kind = event["type"]
            if self.config is None and kind != "session.config":
                await self.error("config_required", "The first message must be session.config")
                raise _Closed(1008, "config_required")
            if kind == "session.config":
                await self._configure(event)
            elif kind == "input.text":
                await self._input_text(event)
            elif kind == "input.done":
                self._flush()
            elif kind == "session.close":
                return
            else:
                await self.error("unknown_event", f"Unknown message type {kind!r}")

    # ------------------------------------------------------------------ client events

    async def _configure(self, event: dict[str, Any]) -> None:
        if self.splitter.has_text() or self.sentence_index > 0:
            await self.error("config_mid_utterance", "session.config cannot change mid-utterance; send input.done first")
            return
        try:
            params = parse_speech(
                {k: v for k, v in event.items() if k not in _NOT_CONFIG}, self.service, streaming_allowed=False, require_input=False
            )
            stream_audio = event.get("stream_audio", False)
            if not isinstance(stream_audio, bool):
                raise SpeechError(400, "stream_audio must be a boolean", "stream_audio")
            granularity = event.get("split_granularity", "none") or "none"
            if granularity not in GRANULARITIES:
                raise SpeechError(400, f"split_granularity must be one of {', '.join(GRANULARITIES)}", "split_granularity")
            if stream_audio and params.response_format not in encode.STREAMABLE_FORMATS:
                raise SpeechError(400, "stream_audio requires response_format 'pcm' or 'wav'", "response_format")
            if stream_audio and params.speed != 1.0:
                raise SpeechError(400, "stream_audio requires speed 1.0", "speed")
        except SpeechError as exc:
            await self.error(exc.code or "invalid_config", exc.message)
            return
        rate = params.sample_rate or self.service.model_voices().sample_rate
        self.config = StreamConfig(params, stream_audio, granularity, rate)
        self.splitter = TextSplitter(granularity)

    async def _input_text(self, event: dict[str, Any]) -> None:
        text = event.get("text")
        if not isinstance(text, str):
            await self.error("invalid_text", "input.text needs a string `text`")
            return
        if len(self.splitter.buffered) + len(text) > self.limits.ws_max_utterance_chars:
            await self.error(
                "utterance_too_long", f"An utterance holds at most {self.limits.ws_max_utterance_chars} characters; send input.done"
            )
            return
        for unit in self.splitter.feed(text):
            self._enqueue(unit)

    def _flush(self) -> None:
        for unit in self.splitter.flush():
            self._enqueue(unit)
        self.queue.put_nowait(UtteranceEnd(self.utterance_index, self.sentence_index))
        self.utterance_index += 1
        self.sentence_index = 0

    def _enqueue(self, text: str) -> None:
        assert self.config is not None
        self.queue.put_nowait(Unit(self.utterance_index, self.sentence_index, text, self.config))
        self.sentence_index += 1

    # ------------------------------------------------------------------ speaking

    async def _speak_loop(self) -> None:
        while (item := await self.queue.get()) is not None:
            if isinstance(item, UtteranceEnd):
                await self.send_json(
                    {"type": "session.done", "utterance_index": item.utterance_index, "total_sentences": item.total_sentences}
                )
                continue
            self.speaking = True
            try:
                await self._speak(item)
            finally:
                self.speaking = False

    async def _speak(self, unit: Unit) -> None:
        config = unit.config
        params = config.params
        await self.send_json(
            {
                "type": "audio.start",
                "utterance_index": unit.utterance_index,
                "sentence_index": unit.sentence_index,
                "sentence_text": unit.text,
                "format": params.response_format,
                "sample_rate": config.sample_rate,
            }
        )
        total = 0
        failed = False
        job = new_job(self.service, _with_input(params, unit.text), transport="websocket")
        try:
            async with job:
                if config.stream_audio:
                    encoder: encode.StreamEncoder | None = None
                    prefix = encode.wav_header(config.sample_rate) if params.response_format == "wav" else b""
                    async for out in job.audio():
                        if encoder is None:
                            encoder = encode.StreamEncoder(params.response_format, out.sample_rate, config.sample_rate)
                        data = prefix + encoder.push(out.samples)
                        prefix = b""
                        if data:
                            await self.send_bytes(data)
                            total += len(data)
                    tail = prefix + (encoder.finish() if encoder is not None else b"")
                    if tail:
                        await self.send_bytes(tail)
                        total += len(tail)
                else:
                    chunks: list[np.ndarray] = []
                    source_rate = self.service.model_voices().sample_rate
                    async for out in job.audio():
                        chunks.append(np.asarray(out.samples, dtype=np.float32))
                        source_rate = out.sample_rate
                    clip = await asyncio.to_thread(render_clip, chunks, source_rate, _with_rate(params, config.sample_rate))
                    await self.send_bytes(clip)
                    total = len(clip)
        except (SessionRejected, SpeechFailed) as exc:
            failed = True
            await self.error(exc.code, exc.message)
        except WebSocketDisconnect:
            raise
        except Exception as exc:  # noqa: BLE001 - one unit's failure must not end the connection
            log.exception("speech stream unit failed")
            failed = True
            await self.error("internal_error", f"speech failed: {type(exc).__name__}")
        await self.send_json(
            {
                "type": "audio.done",
                "utterance_index": unit.utterance_index,
                "sentence_index": unit.sentence_index,
                "total_bytes": total,
                "error": failed,
            }
        )


def _with_input(params: SpeechParams, text: str) -> SpeechParams:
    return replace(params, input=text)


def _with_rate(params: SpeechParams, rate: int) -> SpeechParams:
    return replace(params, sample_rate=rate)


def install_stream_route(app: FastAPI, service: SpeechService) -> None:
    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket) -> None:
        runtime = service.runtime
        if not runtime.ready or runtime.shutting_down or "speech" not in runtime.spec.inputs:
            await websocket.close(1013, "server_not_ready")  # 1013: try again later
            return
        started = time.monotonic()
        stream = SpeechStream(websocket, service)
        try:
            await stream.run()
        finally:
            log.debug("speech stream closed after %.1fs, %d utterance(s)", time.monotonic() - started, stream.utterance_index)
