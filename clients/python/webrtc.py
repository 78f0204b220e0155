"""A realtime session over WebRTC, as a browser would hold it (aiortc).

    async with WebRTCSession.connect(base_url, api_key=..., session={...}) as call:
        call.microphone.play(samples, 24000)          # speak into the session
        event = await call.next_event("response.done")
        call.reply_audio()                            # what the server's track played

Signalling is the OpenAI GA flow: the offer (with every candidate gathered) goes to
`POST /v1/realtime/calls`, the answer comes back in the 201 body. Events travel as JSON on the
`oai-events` data channel; audio on one Opus track each way.

`loopback=True` makes this peer offer only a 127.0.0.1 host candidate (aioice leaves loopback
out otherwise), for a server on the same machine with `webrtc.candidates: loopback`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from clients.python.audio import TRACK_RATE, PlaybackTrack, frame_to_mono


class CallFailed(RuntimeError):
    def __init__(self, status: int, body: Any):
        super().__init__(f"POST /v1/realtime/calls answered {status}: {body}")
        self.status = status
        self.body = body


class WebRTCSession:
    def __init__(self, pc: RTCPeerConnection, channel, microphone: PlaybackTrack):
        self.pc = pc
        self.channel = channel
        self.microphone = microphone
        self.call_id: str | None = None
        self.location: str | None = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.log: list[tuple[float, dict[str, Any]]] = []  # (monotonic time, event)
        self.frames: list[tuple[float, np.ndarray]] = []  # (arrival time, 48 kHz mono) of the server's track
        self.channel_open = asyncio.Event()
        self.channel_closed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ setup

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        base_url: str,
        api_key: str | None = None,
        session: dict[str, Any] | None = None,
        loopback: bool = False,
        model: str | None = None,
        timeout: float = 20.0,
    ) -> AsyncIterator[WebRTCSession]:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        microphone = PlaybackTrack()
        call = None
        try:
            pc.addTransceiver(microphone, direction="sendrecv")
            channel = pc.createDataChannel("oai-events")
            call = cls(pc, channel, microphone)
            channel.on("open", call.channel_open.set)
            channel.on("close", call.channel_closed.set)
            channel.on("message", call._on_message)
            pc.on("track", call._on_track)
            if loopback:
                loopback_only(pc)
            await pc.setLocalDescription(await pc.createOffer())
            answer = await call._post_offer(base_url, pc.localDescription.sdp, api_key, session, model, timeout)
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            async with asyncio.timeout(timeout):
                await call.channel_open.wait()
            yield call
        finally:
            if call is not None and call._reader is not None:
                call._reader.cancel()
            microphone.stop()
            await pc.close()

    async def _post_offer(self, base_url, sdp, api_key, session, model, timeout) -> str:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        params = {"model": model} if model else {}
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as http:
            if session:
                files = {"sdp": (None, sdp, "application/sdp"), "session": (None, json.dumps(session), "application/json")}
                reply = await http.post("/v1/realtime/calls", files=files, headers=headers, params=params)
            else:
                reply = await http.post("/v1/realtime/calls", content=sdp, headers={**headers, "Content-Type": "application/sdp"}, params=params)
        if reply.status_code != 201:
            try:
                body: Any = reply.json()
            except ValueError:
                body = reply.text
            raise CallFailed(reply.status_code, body)
        self.location = reply.headers.get("location")
        self.call_id = (self.location or "").rstrip("/").rsplit("/", 1)[-1] or None
        return reply.text

    # ------------------------------------------------------------------ events

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        self.log.append((time.monotonic(), event))
        self.events.put_nowait(event)

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def next_event(self, kind: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """The next event (of type `kind`, skipping others)."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                if kind is None or event["type"] == kind:
                    return event

    async def events_until(self, kind: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        seen = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                seen.append(event)
                if event["type"] == kind:
                    return seen

    def event_time(self, kind: str, after: float = 0.0) -> float | None:
        return next((t for t, e in self.log if e["type"] == kind and t >= after), None)

    # ------------------------------------------------------------------ audio

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._reader = asyncio.ensure_future(self._read_track(track))

    async def _read_track(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.frames.append((time.monotonic(), frame_to_mono(frame)))

    def received_audio(self, start: float = 0.0, end: float = float("inf")) -> np.ndarray:
        """The server track's audio (48 kHz mono) that arrived between two monotonic times."""
        chunks = [samples for t, samples in self.frames if start <= t <= end]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    def first_sound_after(self, start: float, threshold: float = 0.01) -> float | None:
        """Arrival time of the first frame after `start` with audible content."""
        for t, samples in self.frames:
            if t >= start and float(np.sqrt(np.mean(samples**2))) > threshold:
                return t
        return None

    async def hangup(self, base_url: str, api_key: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            reply = await http.post(f"/v1/realtime/calls/{self.call_id}/hangup", headers=headers)
        return reply.status_code


def loopback_only(pc: RTCPeerConnection) -> None:
    """Gather only a 127.0.0.1 host candidate on this peer's ICE connections."""
    transports = [t.sender.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    for dtls in transports:
        connection = dtls.transport.iceGatherer._connection  # aiortc's aioice Connection
        gather = connection.get_component_candidates

        async def loopback(component: int, addresses: list[str], timeout: int = 5, _gather=gather):
            return await _gather(component=component, addresses=["127.0.0.1"], timeout=timeout)

        connection.get_component_candidates = loopback


__all__ = ["TRACK_RATE", "CallFailed", "WebRTCSession", "loopback_only"]
