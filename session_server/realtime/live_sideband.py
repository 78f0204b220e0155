"""`GET /v1/live/sessions/{session_id}/attach`: a Live sideband, a second WebSocket on a session.

A trusted backend attaches to a live session by its id (from `session.started`) and then sees
every Live event the primary client gets, with the audio reflected as Live defines it: the
primary's input as server events `session.input_audio.append` (before muting) and the reply as
`session.output_audio.delta` with `start_ms` / `end_ms`, both always PCM16 at 24 kHz whatever
the session's format. It may send the same client events the primary may (a delegation's answer,
context appends, mute, close); they go through the primary's link, so the session has one
order of events. `session.start` is refused there (`session_already_started`).

Bounds: a sideband that stops reading is dropped (close 1008, `output_buffer_full`) once
`MAX_QUEUED` events wait for it; the session goes on. The session ending closes its sidebands
after `session.closed`. An unknown session id: error `session_not_found`, close 1008.

Reflected output ranges are laid end to end on the session timeline from the moment each reply's
audio is sent (server wall clock), not positions the primary's player reached.

A WebRTC session (webrtc/live_calls.py) reflects the same: its track's input audio, each frame as
the server decoded it (16 kHz, before muting), and its reply audio as it is handed to the track.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from typing import Any

import numpy as np
import soxr
from starlette.websockets import WebSocket, WebSocketDisconnect

from session_server.realtime.audio_formats import AudioFormat, InvalidAudio, decode, parse_format, to_int16

MAX_QUEUED = 2000  # events: about 40 s of 20 ms reply audio
SIDEBAND_RATE = 24000
_STOP = object()


def to_pcm24(audio_b64: str, fmt: AudioFormat) -> str | None:
    """Wire audio in the session's format as base64 PCM16 24 kHz; None if it is not audio."""
    try:
        samples = decode(base64.b64decode(audio_b64, validate=True), fmt)
    except (ValueError, InvalidAudio):
        return None
    if fmt.type == "audio/pcm" and fmt.rate == SIDEBAND_RATE:
        return audio_b64
    return samples_to_pcm24(samples, fmt.rate)


def samples_to_pcm24(samples: Any, rate: int) -> str:
    """float32 mono at `rate` (a WebRTC track's audio) as base64 PCM16 24 kHz."""
    if rate != SIDEBAND_RATE:
        samples = soxr.resample(samples, rate, SIDEBAND_RATE, quality="HQ")
    return base64.b64encode(to_int16(np.asarray(samples)).astype("<i2").tobytes()).decode("ascii")


class Sideband:
    """One attached socket: a bounded queue of what it has yet to be sent."""

    def __init__(self, websocket: WebSocket, fmt: dict[str, Any], clock_ms: Any) -> None:
        self.websocket = websocket
        self.format = parse_format(fmt)
        self.clock_ms = clock_ms
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.output_end_ms = 0  # where the last reflected reply audio ended on the timeline
        self.dropped = False

    def observe(self, event: dict[str, Any]) -> None:
        """A Live event the primary got (LiveDialect.observers)."""
        if event["type"] == "session.output_audio.delta":
            audio = to_pcm24(event["delta"], self.format)
            if audio is None:
                return
            self.reflect_output(event, audio)
            return
        self._put(event)
        if event["type"] == "session.closed":
            self._put(_STOP)

    def reflect_output(self, event: dict[str, Any], audio: str) -> None:
        """Reply audio (base64 PCM16 24 kHz) laid on the timeline after what was reflected before."""
        duration_ms = len(base64.b64decode(audio)) // 2 * 1000 // SIDEBAND_RATE
        start = max(self.output_end_ms, self.clock_ms())
        self.output_end_ms = start + duration_ms
        self._put({**event, "delta": audio, "start_ms": start, "end_ms": self.output_end_ms})

    def reflect_input(self, audio_b64: str) -> None:
        audio = to_pcm24(audio_b64, self.format)
        if audio is not None:
            self.reflect_input_pcm24(audio)

    def reflect_input_pcm24(self, audio: str) -> None:
        self._put({"type": "session.input_audio.append", "audio": audio})

    def _put(self, item: Any) -> None:
        if self.dropped:
            return
        if self.queue.qsize() >= MAX_QUEUED and item is not _STOP:
            self.dropped = True
            self.queue.put_nowait(_STOP)
            return
        self.queue.put_nowait(item)

    async def writer(self) -> None:
        while (item := await self.queue.get()) is not _STOP:
            await self.websocket.send_text(json.dumps(item))


def refusal(code: str, message: str) -> str:
    return json.dumps({"type": "error", "event_id": f"live_event_{secrets.token_hex(4)}", "client_event_id": None,
                       "error": {"type": "invalid_request_error", "code": code, "message": message, "param": None,
                                 "client_event_id": None}})


async def serve_attach(websocket: WebSocket, links: dict[str, Any], session_id: str) -> None:
    """`links`: the Live sessions of this server by id (live_websocket.py)."""
    await websocket.accept()
    link = links.get(session_id)
    if link is None:
        await websocket.send_text(refusal("session_not_found", f"No live session {session_id!r} on this server."))
        await websocket.close(code=1008, reason="session_not_found")
        return
    dialect = link.protocol.dialect
    sideband = Sideband(websocket, dialect.input_format, dialect.ms)
    link.live_sidebands.append(sideband)
    dialect.observers.append(sideband.observe)
    writer = asyncio.create_task(sideband.writer(), name=f"{session_id}:sideband-writer")
    reader = asyncio.create_task(_read(websocket, link), name=f"{session_id}:sideband-reader")
    try:
        await asyncio.wait([writer, reader], return_when=asyncio.FIRST_COMPLETED)
    finally:
        link.live_sidebands.remove(sideband)
        dialect.observers.remove(sideband.observe)
        for task in (writer, reader):
            task.cancel()
        await asyncio.gather(writer, reader, return_exceptions=True)
        with contextlib.suppress(Exception):
            await websocket.close(code=1008 if sideband.dropped else 1000, reason="output_buffer_full" if sideband.dropped else "")


async def _read(websocket: WebSocket, link: Any) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None and not link.closed.is_set():
                await link.receive_text(message["text"])
