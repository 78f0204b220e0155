"""Client-side helpers: the official SDK for conversations, raw `websockets` for bad input."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import websockets
from openai import AsyncOpenAI

from tests.realtime.speech import pcm16, silence, speech

API_KEY = "test-key"
MODEL = "test-realtime"


def sdk_client(server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)


async def until(conn, kind: str, timeout: float = 30.0) -> list[Any]:
    """SDK events up to and including the first of type `kind`."""
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            event = await conn.recv()
            seen.append(event)
            if event.type == kind:
                return seen


async def until_all(conn, *kinds: str, timeout: float = 120.0) -> list[Any]:
    """SDK events up to and including the last of `kinds` to arrive (each at least once)."""
    seen, wanted = [], set(kinds)
    async with asyncio.timeout(timeout):
        while wanted:
            event = await conn.recv()
            seen.append(event)
            wanted.discard(event.type)
    return seen


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def utterance(text: str = "What is the weather like today in Paris?", rate: int = 24000, tail_s: float = 1.0) -> np.ndarray:
    """Silence, speech, then enough silence for server VAD to end the turn."""
    return np.concatenate([silence(0.3, rate), speech(text, rate), silence(tail_s, rate)])


async def append_pcm(conn, samples: np.ndarray, chunk_s: float = 0.1, rate: int = 24000) -> None:
    step = int(rate * chunk_s)
    for start in range(0, len(samples), step):
        await conn.input_audio_buffer.append(audio=b64(pcm16(samples[start : start + step])))


class RawClient:
    """A bare WebSocket client speaking JSON events, for cases the SDK would never send."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, (str, bytes)) else json.dumps(event))

    async def recv(self, timeout: float = 20.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            return json.loads(await self.ws.recv())

    async def until(self, kind: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        seen = []
        while True:
            event = await self.recv(timeout)
            seen.append(event)
            if event["type"] == kind:
                return seen

    async def error(self) -> dict[str, Any]:
        return (await self.until("error"))[-1]["error"]


@contextlib.asynccontextmanager
async def raw_client(server, model: str = MODEL, api_key: str | None = API_KEY, query: str = "",
                     **options: Any) -> AsyncIterator[RawClient]:
    """`query`: more of the URL's query string (`&session_id=...`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{server.ws_url}/v1/realtime?model={model}{query}"
    async with websockets.connect(url, additional_headers=headers, max_size=None, **options) as ws:
        client = RawClient(ws)
        yield client


def connect(server, query: str = "") -> contextlib.AbstractAsyncContextManager[RawClient]:
    """A raw client of the server's own model, authorised (`query`: as `raw_client`'s)."""
    return raw_client(server, model=server.runtime.model_id, query=query)
