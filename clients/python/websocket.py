"""A realtime session over WebSocket (`GET /v1/realtime`): JSON events, audio as base64 PCM16 24 kHz."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import websockets

RATE = 24000


class WebSocketSession:
    def __init__(self, ws):
        self.ws = ws
        self.log: list[tuple[float, dict[str, Any]]] = []
        self.audio: list[tuple[float, str, np.ndarray]] = []  # (arrival, response id, 24 kHz samples)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, base_url: str, api_key: str | None = None, model: str | None = None) -> AsyncIterator[WebSocketSession]:
        url = base_url.replace("https://", "wss://").replace("http://", "ws://").rstrip("/") + "/v1/realtime"
        if model:
            url += f"?model={model}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with websockets.connect(url, additional_headers=headers, subprotocols=["realtime"], max_size=None) as ws:
            yield cls(ws)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def stream_audio(self, samples: np.ndarray, chunk_s: float = 0.1, realtime: bool = True) -> None:
        """Append `samples` (float32 mono 24 kHz) in chunks, paced like a microphone when `realtime`."""
        step = int(RATE * chunk_s)
        started = time.monotonic()
        for index, start in enumerate(range(0, len(samples), step)):
            pcm = (np.clip(samples[start : start + step], -1, 1) * 32767).astype("<i2").tobytes()
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
            if realtime:
                await asyncio.sleep(max(0.0, started + (index + 1) * chunk_s - time.monotonic()))

    async def next_event(self, timeout: float = 60.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            event = json.loads(await self.ws.recv())
        now = time.monotonic()
        self.log.append((now, event))
        if event["type"] == "response.output_audio.delta":
            pcm = np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")
            self.audio.append((now, event["response_id"], pcm.astype(np.float32) / 32768.0))
        return event

    def reply_audio(self, response_id: str | None = None) -> np.ndarray:
        chunks = [samples for _, rid, samples in self.audio if response_id is None or rid == response_id]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
