"""A carrier's side of a Twilio media stream, for tests: Twilio's JSON messages over `websockets`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

import numpy as np
import soxr
import websockets

from session_server.realtime.audio_formats import ULAW_DECODE, ULAW_ENCODE, to_int16

RATE = 8000
FRAME = 160  # 20 ms of 8 kHz mu-law


def mulaw(samples: np.ndarray, rate: int) -> bytes:
    eight_k = soxr.resample(samples, rate, RATE, quality="HQ") if rate != RATE else samples
    return ULAW_ENCODE[to_int16(eight_k).astype(np.int32) + 32768].tobytes()


def from_mulaw(data: bytes) -> np.ndarray:
    return ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0


class TwilioStream:
    """One stream: `start`, then `media`/`dtmf`/`mark`/`stop`; every server message is kept, in order."""

    def __init__(self, socket: Any, stream_sid: str):
        self.socket = socket
        self.stream_sid = stream_sid
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.changed = asyncio.Event()
        self.closed = False
        self._reader = asyncio.create_task(self._read())
        self._sequence = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, ws_url: str, api_key: str | None = None, stream_sid: str = "MZtest"):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with websockets.connect(f"{ws_url}/v1/telephony/twilio", additional_headers=headers, max_size=None) as socket:
            stream = cls(socket, stream_sid)
            try:
                yield stream
            finally:
                stream._reader.cancel()
                with contextlib.suppress(BaseException):
                    await stream._reader

    async def _read(self) -> None:
        try:
            async for text in self.socket:
                self.received.append((time.monotonic(), json.loads(text)))
                self.changed.set()
        except websockets.ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.changed.set()

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        if isinstance(message, dict):
            self._sequence += 1
            message = json.dumps({"sequenceNumber": str(self._sequence), "streamSid": self.stream_sid, **message})
        await self.socket.send(message)

    async def start(self, call_sid: str = "CAtest", parameters: dict[str, str] | None = None, media_format: dict | None = None) -> None:
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self.send({"event": "start", "start": {
            "accountSid": "ACtest", "streamSid": self.stream_sid, "callSid": call_sid, "tracks": ["inbound"],
            "mediaFormat": media_format or {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": parameters or {},
        }})

    async def play(self, samples: np.ndarray, rate: int, paced: bool = False) -> None:
        """The caller speaks: `samples` as 20 ms media messages (paced in real time if asked)."""
        data = mulaw(samples, rate)
        for index, offset in enumerate(range(0, len(data), FRAME)):
            await self.send({"event": "media", "media": {"track": "inbound", "chunk": str(index + 1), "timestamp": str(index * 20),
                                                         "payload": base64.b64encode(data[offset:offset + FRAME]).decode()}})
            if paced:
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        await self.send({"event": "stop", "stop": {"accountSid": "ACtest", "callSid": "CAtest"}})

    def messages(self, event: str | None = None) -> list[dict[str, Any]]:
        return [m for _, m in self.received if event is None or m.get("event") == event]

    async def wait_for(self, check, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not check():
                if self.closed:
                    assert check(), "the server closed the stream"
                    return
                self.changed.clear()
                await self.changed.wait()

    async def next_message(self, event: str, after: int = 0, timeout: float = 30.0) -> dict[str, Any]:
        await self.wait_for(lambda: len(self.messages(event)) > after, timeout)
        return self.messages(event)[after]

    def reply_audio(self, before_index: int | None = None) -> np.ndarray:
        """The `media` frames received (before message `before_index`, if given), decoded."""
        frames = [m for m in (m for _, m in self.received[:before_index]) if m.get("event") == "media"]
        return np.concatenate([from_mulaw(base64.b64decode(m["media"]["payload"])) for m in frames]) if frames else np.zeros(0, np.float32)
