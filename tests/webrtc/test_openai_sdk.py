"""The official `openai` SDK's WebRTC helpers work against the server unchanged."""

from __future__ import annotations

import asyncio
import json

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack
from openai import AsyncOpenAI

from clients.python.webrtc import loopback_only
from tests.conftest import running_server, until_true
from tests.webrtc.helpers import API_KEY, MODEL, calls_of, webrtc_profile


async def test_sdk_mints_a_client_secret_creates_a_call_with_it_and_hangs_up():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        admin = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
        secret = await admin.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 120},
            session={"type": "realtime", "model": MODEL, "instructions": "You are terse."},
        )
        assert secret.value.startswith("ek_") and secret.session.instructions == "You are terse."

        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTrack(AudioStreamTrack())
            channel = pc.createDataChannel("oai-events")
            events: asyncio.Queue = asyncio.Queue()
            channel.on("message", lambda message: events.put_nowait(json.loads(message)))
            loopback_only(pc)
            await pc.setLocalDescription(await pc.createOffer())
            browser = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=secret.value)
            answer = await browser.realtime.calls.with_raw_response.create(sdp=pc.localDescription.sdp, session={"type": "realtime", "model": MODEL})
            assert answer.status_code == 201
            call_id = answer.headers["location"].rsplit("/", 1)[-1]
            await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
            created = await asyncio.wait_for(events.get(), 20)
            assert created["type"] == "session.created" and created["session"]["instructions"] == "You are terse."
            await admin.realtime.calls.hangup(call_id)
            await until_true(lambda: len(calls_of(server)) == 0 and not server.runtime.sessions)
        finally:
            await pc.close()
