"""WebRTC calls end to end: an aiortc peer against the server, on the fake reply graph."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np

from clients.python.webrtc import WebRTCSession
from tests.conftest import running_server, until_true
from tests.webrtc.helpers import API_KEY, MODEL, calls_of, dominant_hz, rms, utterance, webrtc_profile


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

            # server side: the reply left as one 20 ms frame per 20 ms, with no gap while it played
            track = calls_of(server).get(call.call_id).track
            assert track.underruns == 0
            intervals_ms = np.diff(np.array(track.reply_frame_times)) * 1000
            print(f"reply frame intervals: median {np.median(intervals_ms):.2f} ms, p99 {np.percentile(intervals_ms, 99):.2f} ms, "
                  f"min {intervals_ms.min():.2f} ms, max {intervals_ms.max():.2f} ms over {len(intervals_ms)} intervals")

            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
                metrics = (await http.get("/metrics")).text
            assert 'sgl_omni_time_to_first_audio_seconds_count{transport="webrtc"} 1.0' in metrics

            started = call.event_time("output_audio_buffer.started")
            stopped = call.event_time("output_audio_buffer.stopped")
            reply = call.received_audio(started - 0.2, stopped + 0.3)
            loud = [reply[i : i + 960] for i in range(0, len(reply) - 960, 960) if rms(reply[i : i + 960]) > 0.05]
            # three 300 ms tones (440, 460, 480 Hz) from the fake reply node: ~0.9 s of audible audio
            assert 0.7 <= len(loud) * 0.02 <= 1.1, len(loud)
            assert 420 <= dominant_hz(np.concatenate(loud[:10]), 48000) <= 500


async def test_barge_in_cancels_the_reply_and_the_track_falls_silent_within_a_frame():
    # 30 words of 200 ms tone, generated a little faster than real time: still generating when interrupted.
    profile = webrtc_profile(reply={"words": 30, "chunk_ms": 200, "delay_s": 0.15})
    async with running_server(profile, api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            call.microphone.play(utterance(), 24000)
            await call.next_event("output_audio_buffer.started", timeout=40)
            server_call = calls_of(server).get(call.call_id)
            await asyncio.sleep(1.0)  # let the reply play for a while
            call.microphone.play(utterance("Stop, stop. Tell me something else."), 24000)
            events = await call.events_until("output_audio_buffer.cleared", timeout=20)
            cleared_at = call.event_time("output_audio_buffer.cleared")
            frames_at_clear = server_call.track.reply_frames_sent
            kinds = [e["type"] for e in events]
            assert "input_audio_buffer.speech_started" in kinds
            done = await call.next_event("response.done")
            assert done["response"]["status"] == "cancelled"
            truncated = await call.next_event("conversation.item.truncated")
            # the item keeps what was heard: about a second of audio, not the ~6 s generated
            assert 500 <= truncated["audio_end_ms"] <= 3000
            await asyncio.sleep(0.6)
            # the server sent no reply frame after the clear; the client, whose receive path lags the
            # data channel by its jitter buffer (~100 ms on loopback), hears silence after that
            assert server_call.track.reply_frames_sent == frames_at_clear
            assert rms(call.received_audio(cleared_at + 0.25, cleared_at + 0.6)) < 0.01
            assert rms(call.received_audio(cleared_at - 0.6, cleared_at - 0.1)) > 0.05


async def test_output_audio_buffer_clear_stops_a_finished_reply_that_is_still_playing():
    # The whole reply (4 s of audio) is generated at once; it then plays for 4 s.
    profile = webrtc_profile(reply={"words": 20, "chunk_ms": 200})
    async with running_server(profile, api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            call.send({"type": "response.create"})
            done = await call.next_event("response.done")
            assert done["response"]["status"] == "completed"
            await until_true(lambda: call.event_time("output_audio_buffer.started") is not None)
            await asyncio.sleep(0.5)
            call.send({"type": "output_audio_buffer.clear"})
            cleared = await call.next_event("output_audio_buffer.cleared")
            assert cleared["response_id"] == done["response"]["id"]
            truncated = await call.next_event("conversation.item.truncated")
            assert 200 <= truncated["audio_end_ms"] <= 1500
            cleared_at = call.event_time("output_audio_buffer.cleared")
            await asyncio.sleep(0.6)
            assert rms(call.received_audio(cleared_at + 0.25, cleared_at + 0.6)) < 0.01


async def test_session_config_sent_with_the_offer_is_the_session_created():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        session = {"type": "realtime", "model": MODEL, "instructions": "Be brief.", "audio": {"input": {"turn_detection": None}}}
        async with WebRTCSession.connect(server.base_url, API_KEY, session=session, loopback=True) as call:
            created = await call.next_event("session.created")
            assert created["session"]["instructions"] == "Be brief."
            assert created["session"]["audio"]["input"]["turn_detection"] is None


async def test_hangup_ends_the_call_and_frees_its_session():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            assert await call.hangup(server.base_url, API_KEY) == 200
            closed = await call.next_event("session.closed")
            assert closed["reason"] == "hangup"
            await until_true(lambda: len(calls_of(server)) == 0 and not server.runtime.sessions)
            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
                assert (await http.post(f"/v1/realtime/calls/{call.call_id}/hangup")).status_code == 404


async def test_data_channel_events_get_the_same_errors_as_on_the_websocket_and_oversized_ones_are_refused():
    async with running_server(webrtc_profile(max_message_bytes=4096), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            call.send({"type": "no.such.event", "event_id": "evt_1"})
            error = (await call.next_event("error"))["error"]
            assert error["code"] == "unknown_event_type" and error["event_id"] == "evt_1"
            call.channel.send("{not json")
            assert (await call.next_event("error"))["error"]["code"] == "invalid_json"
            call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 5000}]}})
            assert (await call.next_event("error"))["error"]["code"] == "message_too_large"
            call.send({"type": "response.cancel"})
            assert (await call.next_event("error"))["error"]["code"] == "response_cancel_not_active"
            call.send({"type": "session.update", "session": {"instructions": "Still here."}})
            assert (await call.next_event("session.updated"))["session"]["instructions"] == "Still here."


async def test_a_call_whose_peer_never_connects_is_closed_after_the_connect_timeout():
    from aiortc import RTCConfiguration, RTCPeerConnection

    async with running_server(webrtc_profile(connect_timeout_s=1), api_key=API_KEY) as server:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("audio")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        await pc.close()  # gone before it ever connects
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            reply = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"})
        assert reply.status_code == 201
        call = calls_of(server).get(reply.headers["location"].rsplit("/", 1)[-1])
        await asyncio.wait_for(call.closed.wait(), 10)
        assert call.close_reason == "connect_timeout"
        assert call.pc.connectionState == "closed" and not server.runtime.sessions


async def test_concurrent_calls_each_get_their_own_reply():
    async with running_server(webrtc_profile(reply={"words": 2, "chunk_ms": 200}), api_key=API_KEY) as server:

        async def one_call(text: str) -> tuple[str, float]:
            async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True, session={"instructions": text}) as call:
                created = await call.next_event("session.created")
                call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
                call.send({"type": "response.create"})
                done = await call.next_event("response.done")
                assert done["response"]["status"] == "completed"
                await until_true(lambda: call.event_time("output_audio_buffer.stopped") is not None)
                heard = call.received_audio(call.event_time("output_audio_buffer.started") - 0.1, call.event_time("output_audio_buffer.stopped") + 0.3)
                return created["session"]["id"], rms(heard)

        results = await asyncio.gather(*(one_call(f"call {index}") for index in range(4)))
        assert len({session_id for session_id, _ in results}) == 4
        assert all(level > 0.05 for _, level in results)


async def test_a_data_channel_event_naming_an_uploaded_voice_is_looked_up_off_the_loop_and_the_next_events_wait_for_it():
    looked_up: list[tuple[str, int]] = []

    def registry(name: str) -> str | None:
        looked_up.append((name, threading.get_ident()))
        return "chelsie" if name == "narrator" else None

    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        server.state.uploaded_speaker = registry
        server.state.served = None  # read again, with this registry, by the next call
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
            call.send({"type": "session.update", "event_id": "evt_voice", "session": {"audio": {"output": {"voice": "narrator"}}}})
            call.send({"type": "session.update", "event_id": "evt_next", "session": {"instructions": "After the voice."}})
            first, second = [e["session"] for e in await call.events_until("session.updated") +
                             await call.events_until("session.updated") if e["type"] == "session.updated"]
    assert first["audio"]["output"]["voice"] == "narrator" and first["instructions"] != "After the voice."
    assert second["audio"]["output"]["voice"] == "narrator" and second["instructions"] == "After the voice."
    assert [name for name, _ in looked_up] == ["narrator"]
    assert threading.get_ident() not in [thread for _, thread in looked_up]
