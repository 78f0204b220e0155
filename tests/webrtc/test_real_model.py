"""The served default graph (tiny random-weight Qwen3-Omni on CPU) over WebRTC: one spoken turn."""

from __future__ import annotations

from configs import load_profile
from clients.python.webrtc import WebRTCSession
from tests.conftest import running_server, until_true
from tests.webrtc.helpers import API_KEY, rms, utterance


async def test_the_default_graph_answers_a_spoken_turn_on_the_audio_track():
    profile = load_profile(None)
    profile["webrtc"] = {"candidates": "loopback"}
    async with running_server(profile, api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, session={"max_output_tokens": 6}, loopback=True) as call:
            await call.next_event("session.created")
            call.microphone.play(utterance(), 24000)
            events = await call.events_until("response.done", timeout=120)
            done = events[-1]["response"]
            assert done["status"] in ("completed", "incomplete")
            assert done["usage"]["input_token_details"]["audio_tokens"] > 0
            await until_true(lambda: call.event_time("output_audio_buffer.stopped") is not None, timeout=30)
            started, stopped = call.event_time("output_audio_buffer.started"), call.event_time("output_audio_buffer.stopped")
            # random weights speak noise, but it is audio, and it came on the track
            assert stopped > started and rms(call.received_audio(started, stopped + 0.3)) > 1e-4
