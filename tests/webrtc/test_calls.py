"""WebRTC calls end to end: an aiortc peer against the server, on the fake reply graph."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from clients.python.webrtc import WebRTCSession
from tests.conftest import running_server
from tests.webrtc.helpers import API_KEY, MODEL, calls_of, dominant_hz, rms, until_true, utterance, webrtc_profile


async def test_offer_gets_an_sdp_answer_with_a_call_location_and_session_created():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            assert call.location is not None and call.location.startswith("/v1/realtime/calls/rtc_")
            assert calls_of(server).get(call.call_id) is not None
            created = await call.next_event()
            assert created["type"] == "session.created"
            assert created["session"]["model"] == MODEL
            # the answer offers loopback only, as the profile's candidate policy says
            assert call.pc.remoteDescription is not None
            candidates = [line for line in call.pc.remoteDescription.sdp.splitlines() if line.startswith("a=candidate")]
            assert candidates and all(" 127.0.0.1 " in line for line in candidates)


async def test_spoken_turn_through_the_opus_track_gets_reply_audio_on_the_track_and_events_on_the_channel():
    async with running_server(webrtc_profile(reply={"words": 3, "chunk_ms": 300}), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            call.microphone.play(utterance(), 24000)
            events = await call.events_until("output_audio_buffer.stopped", timeout=40)
            kinds = [e["type"] for e in events]
            order = [
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "response.created",
                "response.output_audio_transcript.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.done",
                "output_audio_buffer.stopped",
            ]
            positions = [kinds.index(kind) for kind in order]
            assert positions == sorted(positions), kinds
            assert "output_audio_buffer.started" in kinds
            # reply audio travels on the track, not as base64 on the data channel
            assert "response.output_audio.delta" not in kinds
            done = next(e for e in events if e["type"] == "response.done")
            assert done["response"]["status"] == "completed"
            transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
            assert transcript == "word0 word1 word2 "

            started = call.event_time("output_audio_buffer.started")
            stopped = call.event_time("output_audio_buffer.stopped")
            reply = call.received_audio(started - 0.2, stopped + 0.3)
            loud = [reply[i : i + 960] for i in range(0, len(reply) - 960, 960) if rms(reply[i : i + 960]) > 0.05]
            # three 300 ms tones (440, 460, 480 Hz) from the fake reply node: ~0.9 s of audible audio
            assert 0.7 <= len(loud) * 0.02 <= 1.1, len(loud)
            assert 420 <= dominant_hz(np.concatenate(loud[:10]), 48000) <= 500
