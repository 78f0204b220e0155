"""Carrier media streams: a Twilio-protocol client against `/v1/telephony/twilio`, fake reply graph."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import httpx
import numpy as np
import websockets

from tests.conftest import running_server, until_true
from tests.realtime.fakes import realtime_profile
from tests.telephony.twilio_client import RATE, TwilioStream
from tests.webrtc.helpers import dominant_hz, rms, utterance

API_KEY = "test-key"


def phone_profile(reply: dict | None = None, limits: dict | None = None, **sip) -> dict:
    profile = realtime_profile(reply=reply, limits=limits)
    profile["sip"] = sip
    return profile


def phone_calls(server):
    return server.server.config.app.state.phone_calls


@contextlib.asynccontextmanager
async def sideband(server, call_id: str):
    """`GET /v1/realtime?call_id=`: the call's events, as a list that fills as they come."""
    async with websockets.connect(f"{server.ws_url}/v1/realtime?call_id={call_id}",
                                  additional_headers={"Authorization": f"Bearer {API_KEY}"}) as socket:
        events: list[dict] = []

        async def read() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for text in socket:
                    events.append(json.loads(text))

        reader = asyncio.create_task(read())
        try:
            yield events
        finally:
            reader.cancel()


async def started_call(server, stream: TwilioStream, call_sid: str = "CAtest", **kwargs):
    await stream.start(call_sid, **kwargs)
    await until_true(lambda: phone_calls(server).get(f"twilio_{call_sid}") is not None)
    return phone_calls(server).get(f"twilio_{call_sid}")


async def test_spoken_question_as_mulaw_media_gets_reply_media_at_8_khz_and_a_mark_after_it():
    async with running_server(phone_profile(reply={"words": 3, "chunk_ms": 300}), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            await started_call(server, stream)
            await stream.play(utterance(rate=RATE), RATE)
            mark = await stream.next_message("mark", timeout=40)
            frames = stream.messages("media")
            assert frames and all(m["streamSid"] == "MZtest" for m in frames)
            # every frame is 20 ms of 8 kHz mu-law: 160 bytes
            sizes = [len(base64.b64decode(m["media"]["payload"])) for m in frames]
            assert all(size == 160 for size in sizes), sizes
            audio = stream.reply_audio()
            loud = [audio[i:i + 160] for i in range(0, len(audio) - 160, 160) if rms(audio[i:i + 160]) > 0.05]
            # three 300 ms tones (440, 460, 480 Hz) from the fake reply node: ~0.9 s of audible audio
            assert 0.7 <= len(loud) * 0.02 <= 1.1, len(loud)
            assert 420 <= dominant_hz(np.concatenate(loud[:10]), RATE) <= 500
            assert mark["mark"]["name"].startswith("resp_")
            assert stream.messages()[-1]["event"] == "mark"  # after the reply's last frame


async def test_barge_in_sends_clear_and_the_reply_is_truncated_to_what_was_sent():
    profile = phone_profile(reply={"words": 30, "chunk_ms": 200, "delay_s": 0.15})
    async with running_server(profile, api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            await started_call(server, stream)
            async with sideband(server, "twilio_CAtest") as events:
                await stream.play(utterance(rate=RATE), RATE)
                await stream.wait_for(lambda: len(stream.messages("media")) >= 40, timeout=40)  # 0.8 s of reply sent
                await stream.play(utterance("Stop, stop. Tell me something else.", rate=RATE), RATE)
                clear = await stream.next_message("clear", timeout=20)
                assert clear["streamSid"] == "MZtest"
                at_clear = next(i for i, (_, m) in enumerate(stream.received) if m["event"] == "clear")
                sent_ms = len(stream.reply_audio(at_clear)) * 1000 / RATE
                await until_true(lambda: any(e["type"] == "conversation.item.truncated" for e in events), timeout=10)
                truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
                # the item keeps what was sent to the caller, not the seconds generated ahead
                assert abs(truncated["audio_end_ms"] - sent_ms) <= 40, (truncated["audio_end_ms"], sent_ms)
                done = [e for e in events if e["type"] == "response.done"]
                assert done and done[0]["response"]["status"] == "cancelled"
                assert any(e["type"] == "output_audio_buffer.cleared" for e in events)


async def test_dtmf_digits_become_dtmf_events_on_the_sideband_in_order():
    async with running_server(phone_profile(), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            await started_call(server, stream)
            async with sideband(server, "twilio_CAtest") as events:
                digits = ["1", "2", "#", "9", "*", "0"]
                for digit in digits:
                    await stream.send({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}})
                await until_true(lambda: len([e for e in events if e["type"] == "input_audio_buffer.dtmf_event_received"]) == len(digits))
                received = [e for e in events if e["type"] == "input_audio_buffer.dtmf_event_received"]
                assert [e["event"] for e in received] == digits
                assert all(isinstance(e["received_at"], int) and e["received_at"] > 1_600_000_000 for e in received)


async def test_stop_ends_the_session_and_frees_its_slot():
    async with running_server(phone_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as first:
            await started_call(server, first, "CAfirst")
            assert server.runtime.count("realtime") == 1
            assert [s.record().transport for s in server.state.sessions] == ["twilio"]
            await first.stop()
            await first.wait_for(lambda: first.closed)
        # the graph session, the call and its live-session record are all gone
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0 and len(server.state.sessions) == 0)
        # the slot is free: the next call gets it
        async with TwilioStream.connect(server.ws_url, API_KEY, stream_sid="MZsecond") as second:
            await started_call(server, second, "CAsecond")
            assert server.runtime.count("realtime") == 1


async def test_a_stream_without_a_free_slot_gets_session_limit_reached_and_is_closed():
    async with running_server(phone_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as first:
            await started_call(server, first, "CAfirst")
            async with TwilioStream.connect(server.ws_url, API_KEY, stream_sid="MZsecond") as second:
                await second.start("CAsecond")
                error = await second.next_message("error")
                assert error["error"]["code"] == "session_limit_reached"
                await second.wait_for(lambda: second.closed)
                assert second.socket.close_code == 1013
            assert phone_calls(server).get("twilio_CAfirst") is not None


async def test_custom_parameters_set_the_session_over_the_profiles_accept():
    profile = phone_profile(accept={"instructions": "From the profile.", "audio": {"input": {"turn_detection": None}}})
    async with running_server(profile, api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            call = await started_call(server, stream, parameters={"instructions": "Answer the phone politely."})
            config = call.protocol.config.to_wire(call.protocol.session_id)
            assert config["instructions"] == "Answer the phone politely."
            assert config["audio"]["input"]["turn_detection"] is None  # from `sip.accept`
            assert config["audio"]["input"]["format"] == {"type": "audio/pcmu"}
            assert config["audio"]["output"]["format"] == {"type": "audio/pcmu"}


async def test_bad_messages_get_coded_errors_and_the_stream_and_server_go_on():
    async with running_server(phone_profile(reply={"words": 2, "chunk_ms": 200}), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            bad = [
                ("not json", "invalid_json"),
                (b"\x00\x01", "binary_frames_unsupported"),
                (json.dumps([1, 2]), "invalid_message"),
                (json.dumps({"event": "wave"}), "unknown_event"),
                (json.dumps({"event": "media", "media": {"payload": "AAAA"}}), "stream_not_started"),
            ]
            for message, _ in bad:
                await stream.send(message)
            await stream.start()
            after_start = [
                (json.dumps({"event": "media", "media": {"payload": "%%%not base64"}}), "invalid_audio"),
                (json.dumps({"event": "media", "media": "x"}), "invalid_message"),
                (json.dumps({"event": "dtmf", "dtmf": {"digit": "Z"}}), "invalid_dtmf"),
                (json.dumps({"event": "start", "start": {}}), "stream_already_started"),
                ("x" * 70000, "message_too_large"),
            ]
            for message, _ in after_start:
                await stream.send(message)
            codes = [code for _, code in bad + after_start]
            await stream.wait_for(lambda: len(stream.messages("error")) == len(codes))
            assert [m["error"]["code"] for m in stream.messages("error")] == codes
            # the stream still answers a spoken turn
            await stream.play(utterance(rate=RATE), RATE)
            await stream.next_message("mark", timeout=40)
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            assert (await http.get("/health")).status_code == 200


async def test_an_unsupported_media_format_is_refused_and_the_stream_closed():
    async with running_server(phone_profile(), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            await stream.start(media_format={"encoding": "audio/l16", "sampleRate": 16000, "channels": 1})
            error = await stream.next_message("error")
            assert error["error"]["code"] == "unsupported_media_format"
            await stream.wait_for(lambda: stream.closed)
            assert stream.socket.close_code == 1008
        assert server.runtime.count("realtime") == 0


async def test_a_stream_whose_media_stops_ends_with_media_timeout():
    async with running_server(phone_profile(media_timeout_s=0.5), api_key=API_KEY) as server:
        async with TwilioStream.connect(server.ws_url, API_KEY) as stream:
            await started_call(server, stream)
            async with sideband(server, "twilio_CAtest") as events:
                await stream.wait_for(lambda: stream.closed, timeout=10)
                await until_true(lambda: any(e["type"] == "session.closed" for e in events))
                assert next(e for e in events if e["type"] == "session.closed")["reason"] == "media_timeout"
        await until_true(lambda: server.runtime.count("realtime") == 0)


async def test_twenty_concurrent_streams_each_get_their_own_reply():
    async with running_server(phone_profile(reply={"words": 2, "chunk_ms": 200}, limits={"max_sessions": 20}), api_key=API_KEY) as server:
        async def one_call(index: int) -> int:
            async with TwilioStream.connect(server.ws_url, API_KEY, stream_sid=f"MZ{index}") as stream:
                await started_call(server, stream, f"CA{index}")
                await stream.play(utterance(rate=RATE), RATE)
                await stream.next_message("mark", timeout=90)
                assert all(m["streamSid"] == f"MZ{index}" for m in stream.messages("media"))
                frames = len(stream.messages("media"))
                await stream.stop()
                await stream.wait_for(lambda: stream.closed)
                return frames

        frames = await asyncio.gather(*(one_call(i) for i in range(20)))
        # two 200 ms tones each, plus the resampler's tail: about 20 frames per call
        assert all(18 <= n <= 24 for n in frames), frames
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0)
