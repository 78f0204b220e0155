"""SIP calls: a caller's phone (sip_phone.py, and SIPp) against the SIP endpoint, fake reply graph."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import subprocess

import numpy as np
import openai
import pytest

from session_server.telephony.sip_media import rtp_port
from tests.conftest import http_client, running_server, until_true
from tests.telephony.sip_phone import RATE, SipPhone, sdp_offer
from tests.telephony.test_twilio_streams import API_KEY, phone_calls, phone_profile, sideband
from tests.webrtc.helpers import dominant_hz, rms, utterance


def sip_profile(reply: dict | None = None, limits: dict | None = None, **sip) -> dict:
    return phone_profile(reply=reply, limits=limits, listen="udp:127.0.0.1:0", **sip)


def sip_address(server) -> tuple[str, int]:
    return server.server.config.app.state.sip.address


def live_sip_calls(server) -> list:
    return [call for call in phone_calls(server) if call.transport == "sip"]


def loud_frames(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i:i + 160] for i in range(0, audio.size - 159, 160) if rms(audio[i:i + 160]) > 0.05]


async def answered_call(server, phone: SipPhone):
    final = await phone.call()
    assert final.status_code == 200, final.status_code
    await until_true(lambda: len(live_sip_calls(server)) == 1)
    return live_sip_calls(server)[0]


async def test_a_call_rings_is_answered_with_pcmu_and_a_spoken_question_gets_a_spoken_reply_as_rtp():
    async with running_server(sip_profile(reply={"words": 3, "chunk_ms": 300}), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            await answered_call(server, phone)
            assert phone.statuses()[:3] == [100, 180, 200]
            # the answer: PCMU (the caller's first choice) and telephone-event under the caller's type
            audio = phone.answer.audio
            assert [(c.payload_type, c.encoding_name, c.clock_rate) for c in audio.codecs] == [(0, "PCMU", 8000), (101, "telephone-event", 8000)]
            await phone.play(utterance(rate=RATE), RATE)
            # three 300 ms tones (440, 460, 480 Hz) from the fake reply node, 8 kHz, 20 ms per packet
            loud = lambda: loud_frames(phone.heard_audio())  # noqa: E731
            await until_true(lambda: len(loud()) >= 40 and rms(phone.heard_audio()[-800:]) < 0.01, timeout=40)
            assert all(len(packet) == 320 for packet in phone.heard)  # 160 16-bit samples: 20 ms at 8 kHz
            assert 0.7 <= len(loud()) * 0.02 <= 1.1, len(loud())
            assert 420 <= dominant_hz(np.concatenate(loud()[:10]), RATE) <= 500
            assert (await phone.bye()).status_code == 200
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0 and len(server.state.sessions) == 0)


async def test_barge_in_stops_the_reply_packets_and_truncates_the_item_to_what_was_sent():
    profile = sip_profile(reply={"words": 30, "chunk_ms": 200, "delay_s": 0.15})
    async with running_server(profile, api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            async with sideband(server, call.id) as events:
                await until_true(lambda: call.sidebands)
                await phone.play(utterance(rate=RATE), RATE)
                await until_true(lambda: len(loud_frames(phone.heard_audio())) >= 40, timeout=40)  # 0.8 s of reply heard
                first = next(e["response"]["id"] for e in events if e["type"] == "response.created")
                sent: dict[str, float] = {}  # ms of the first reply sent when the clear, then the next reply, were seen

                async def watch() -> None:
                    await until_true(lambda: any(e["type"] == "output_audio_buffer.cleared" for e in events), timeout=20, step=0.005)
                    sent["clear"] = call.output.played_ms(first)
                    await until_true(lambda: len([e for e in events if e["type"] == "response.created"]) >= 2, timeout=20, step=0.005)
                    sent["next reply"] = call.output.played_ms(first)
                    sent["heard"] = len(phone.heard)

                watcher = asyncio.create_task(watch())
                await phone.play(utterance("Stop, stop. Tell me something else.", rate=RATE), RATE)
                await watcher
                # no packet of the cancelled reply left after the clear
                assert sent["next reply"] == sent["clear"], sent
                await until_true(lambda: any(e["type"] == "conversation.item.truncated" for e in events), timeout=10)
                truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
                # the item keeps what the caller heard (20 ms a packet), not the seconds generated ahead
                heard_ms = 20 * len(loud_frames(np.frombuffer(b"".join(phone.heard[:int(sent["heard"])]), dtype="<i2").astype(np.float32) / 32768.0))
                assert truncated["audio_end_ms"] == int(sent["clear"])
                assert abs(truncated["audio_end_ms"] - heard_ms) <= 100, (truncated["audio_end_ms"], heard_ms)
                done = [e for e in events if e["type"] == "response.done"]
                assert done and done[0]["response"]["status"] == "cancelled"


async def test_dtmf_as_rfc_4733_events_and_sip_info_become_dtmf_events_on_the_sideband_in_order():
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            async with sideband(server, call.id) as events:
                await until_true(lambda: call.sidebands)
                for digit in ["1", "2", "#"]:
                    await phone.dtmf(digit)
                assert (await phone.info("Signal=9\r\nDuration=160\r\n")).status_code == 200
                assert (await phone.info("*", content_type="application/dtmf")).status_code == 200
                await phone.dtmf("0")
                keys = lambda: [e["event"] for e in events if e["type"] == "input_audio_buffer.dtmf_event_received"]  # noqa: E731
                await until_true(lambda: len(keys()) == 6)
                assert keys() == ["1", "2", "#", "9", "*", "0"]
                assert all(isinstance(e["received_at"], int) and e["received_at"] > 1_600_000_000
                           for e in events if e["type"] == "input_audio_buffer.dtmf_event_received")
                # an INFO that is no key is refused, the call goes on
                assert (await phone.info("hello", content_type="text/plain")).status_code == 415
                assert phone_calls(server).get(call.id) is call


async def test_hangup_from_the_server_sends_bye_and_frees_the_slot_for_the_next_call():
    async with running_server(sip_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            assert [s.record().transport for s in server.state.sessions] == ["sip"]
            async with http_client(server, API_KEY) as http:
                assert (await http.post(f"/v1/realtime/calls/{call.id}/hangup")).status_code == 200
                await phone.wait_for(lambda: any(r.method == "BYE" for r in phone.requests))
                await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0)
                assert (await http.post(f"/v1/realtime/calls/{call.id}/hangup")).status_code == 404
        async with SipPhone.open(sip_address(server)) as second:
            await answered_call(server, second)  # the one slot is free again


async def test_refer_transfers_the_call_and_it_ends_once_the_transfer_succeeds():
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY) as client, \
                SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            with pytest.raises(openai.BadRequestError):
                await client.realtime.calls.refer(call.id, target_uri="not a uri")
            await client.realtime.calls.refer(call.id, target_uri="tel:+14155550123")
            await phone.wait_for(lambda: any(r.method == "REFER" for r in phone.requests))
            refer = next(r for r in phone.requests if r.method == "REFER")
            assert refer.get_header("refer-to") == "<tel:+14155550123>" and refer.call_id == phone.call_id
            assert (await phone.notify_transfer("SIP/2.0 200 OK")).status_code == 200
            await phone.wait_for(lambda: any(r.method == "BYE" for r in phone.requests))
            assert call.close_reason == "transferred"


async def test_the_webhook_verifies_with_the_openai_sdk_and_its_accept_answers_the_call():
    secret = "whsec_" + base64.b64encode(b"a test secret of 32 bytes long!!").decode()
    async with webhook_receiver() as (hook_url, deliveries):
        profile = sip_profile(webhook_url=hook_url, webhook_secret=secret)
        async with running_server(profile, api_key=API_KEY) as server:
            async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY) as client, \
                    SipPhone.open(sip_address(server)) as phone:
                phone.invite(headers={"X-Customer-Id": "c-42", "Authorization": "Digest secret"})
                await until_true(lambda: deliveries)
                assert phone.statuses() == [100, 180]  # ringing until the application answers
                body, headers = deliveries[0]
                event = client.webhooks.unwrap(body, headers, secret=secret)
                assert event.type == "realtime.call.incoming"
                sent = {h.name: h.value for h in event.data.sip_headers}
                assert sent["X-Customer-Id"] == "c-42" and "Authorization" not in sent and sent["Call-ID"] == phone.call_id
                with pytest.raises(openai.InvalidWebhookSignatureError):
                    client.webhooks.unwrap(body.replace(b"c-42", b"c-43"), headers, secret=secret)
                await client.realtime.calls.accept(event.data.call_id, type="realtime", instructions="You answer the phone.",
                                                   audio={"input": {"format": {"type": "audio/pcm", "rate": 24000}}})
                final = await phone.final_response()
                assert final.status_code == 200
                phone.accept_answer(final)
                call = phone_calls(server).get(event.data.call_id)
                config = call.protocol.config.to_wire(call.protocol.session_id)
                assert config["instructions"] == "You answer the phone."
                assert config["audio"]["input"]["format"] == {"type": "audio/pcmu"}  # what the line carries
                with pytest.raises(openai.ConflictError):
                    await client.realtime.calls.accept(event.data.call_id, type="realtime")
                # the sideband, as the SDK joins a call: `GET /v1/realtime?call_id=`
                async with client.realtime.connect(call_id=event.data.call_id) as connection:
                    await until_true(lambda: call.sidebands)
                    await phone.dtmf("7")
                    async with asyncio.timeout(10):
                        received = await connection.recv()
                        while received.type != "input_audio_buffer.dtmf_event_received":
                            received = await connection.recv()
                    assert received.event == "7"
                await client.realtime.calls.hangup(event.data.call_id)
                await phone.wait_for(lambda: any(r.method == "BYE" for r in phone.requests))


async def test_a_refused_accept_leaves_the_call_ringing_and_reject_answers_it_with_its_status_code():
    async with webhook_receiver() as (hook_url, deliveries):
        async with running_server(sip_profile(webhook_url=hook_url, webhook_secret="whsec_c2VjcmV0"), api_key=API_KEY) as server:
            async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY) as client, \
                    SipPhone.open(sip_address(server)) as phone:
                phone.invite()
                await until_true(lambda: deliveries)
                call_id = json.loads(deliveries[0][0])["data"]["call_id"]
                # a session the core refuses: 400 with its code, and the call rings on
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.realtime.calls.accept(call_id, type="realtime", instructions=123)  # type: ignore[arg-type]
                assert refused.value.code is not None
                assert phone.statuses() == [100, 180]
                await client.realtime.calls.reject(call_id, status_code=486)
                assert (await phone.final_response()).status_code == 486
                with pytest.raises(openai.NotFoundError):
                    await client.realtime.calls.accept(call_id, type="realtime")
            assert server.runtime.count("realtime") == 0


async def test_a_ringing_call_opens_its_rtp_the_accept_answers_with_it_and_a_rejected_call_closes_it():
    async with webhook_receiver() as (hook_url, deliveries):
        async with running_server(sip_profile(webhook_url=hook_url, webhook_secret="whsec_c2VjcmV0"), api_key=API_KEY) as server:
            sip = server.server.config.app.state.sip
            async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY) as client, \
                    SipPhone.open(sip_address(server)) as answered, SipPhone.open(sip_address(server)) as rejected:
                opened = {}
                for phone in (answered, rejected):
                    phone.invite()
                    await until_true(lambda: len(deliveries) == len(opened) + 1)
                    call_id = json.loads(deliveries[-1][0])["data"]["call_id"]
                    media = sip.pending[call_id].media
                    await until_true(media.done)  # before anyone accepts: while it rings
                    opened[call_id] = media.result()
                (answered_id, answered_rtp), (rejected_id, rejected_rtp) = opened.items()
                await client.realtime.calls.accept(answered_id, type="realtime")
                answered.accept_answer(await answered.final_response())
                assert answered.answer.rtp_address[1] == rtp_port(answered_rtp)
                with pytest.raises(openai.BadRequestError):  # a refused accept: it rings on, its RTP kept
                    await client.realtime.calls.accept(rejected_id, type="realtime", instructions=123)  # type: ignore[arg-type]
                assert not rejected_rtp._closed
                await client.realtime.calls.reject(rejected_id, status_code=486)
                await until_true(lambda: rejected_rtp._closed)
                assert not answered_rtp._closed


async def test_a_call_nobody_accepts_gets_480_after_the_answer_timeout_and_cancel_gets_487():
    async with webhook_receiver() as (hook_url, deliveries):
        profile = sip_profile(webhook_url=hook_url, webhook_secret="whsec_c2VjcmV0", answer_timeout_s=0.3)
        async with running_server(profile, api_key=API_KEY) as server:
            sip = server.server.config.app.state.sip
            medias = []  # each call's RTP, opened while it rang: closed when it ends unanswered
            async with SipPhone.open(sip_address(server)) as phone:
                phone.invite()
                await phone.response(lambda r: r.status_code == 180)
                medias += [pending.media for pending in sip.pending.values()]
                assert (await phone.final_response()).status_code == 480
            async with SipPhone.open(sip_address(server)) as phone:
                phone.invite()
                await phone.response(lambda r: r.status_code == 180)
                medias += [pending.media for pending in sip.pending.values()]
                phone.cancel()
                assert (await phone.final_response("CANCEL")).status_code == 200
                assert (await phone.final_response()).status_code == 487
            assert len(sip.pending) == 0 and server.runtime.count("realtime") == 0
            assert len(medias) == 2
            await until_true(lambda: all(media.done() and media.result()._closed for media in medias))


async def test_malformed_sip_gets_400_no_common_codec_488_options_200_and_the_endpoint_goes_on(caplog):
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            phone.send_raw(b"INVITE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:%d;branch=z9hG4bKbad\r\nCSeq: nonsense\r\n"
                           b"Content-Length: 99999\r\n\r\n" % phone.port)
            await phone.response(lambda r: r.status_code == 400)
            phone.request("INVITE", "v=0\r\nm=audio notaport RTP/AVP 0\r\n")  # malformed SDP
            await phone.response(lambda r: r.status_code == 400 and r.cseq is not None and r.cseq.method == "INVITE")
            for header, bad in (("CSeq", "nonsense"), ("Via", "garbage"), ("From", "<<<>>>"), ("Max-Forwards", "x")):
                phone.call_id = f"{header}@bad"
                raw = bytes(f"INVITE sip:assistant@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{phone.port};branch=z9hG4bK{header}\r\n"
                            f"From: <sip:caller@127.0.0.1>;tag=1\r\nTo: <sip:assistant@127.0.0.1>\r\nCall-ID: {header}@bad\r\n"
                            f"CSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n", "ascii")
                raw = re.sub(rf"{header}: [^\r]*".encode(), f"{header}: {bad}".encode(), raw, count=1)
                phone.send_raw(raw)
                await phone.response(lambda r, cid=f"{header}@bad": r.status_code == 400 and r.call_id == cid)
        async with SipPhone.open(sip_address(server)) as phone:
            assert (await phone.call(formats="9 18")).status_code == 488  # G.722 and G.729 only
        async with SipPhone.open(sip_address(server)) as phone:
            phone.request("OPTIONS")
            assert (await phone.final_response("OPTIONS")).status_code == 200
        assert server.runtime.count("realtime") == 0
        assert not [r for r in caplog.records if r.name.startswith(("session_server", "aiosipua")) and (r.exc_info or r.levelno >= 40)]
        async with SipPhone.open(sip_address(server)) as phone:
            await answered_call(server, phone)


async def test_an_invite_when_every_slot_is_taken_gets_486_and_the_call_in_progress_goes_on():
    async with running_server(sip_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as first:
            call = await answered_call(server, first)
            for _ in range(5):
                async with SipPhone.open(sip_address(server)) as other:
                    assert (await other.call()).status_code == 486
            assert phone_calls(server).get(call.id) is call and not call.closed.is_set()


async def test_server_shutdown_ends_a_live_call_with_bye():
    async with contextlib.AsyncExitStack() as outlives_the_server:
        async with running_server(sip_profile(), api_key=API_KEY) as server:
            phone = await outlives_the_server.enter_async_context(SipPhone.open(sip_address(server)))
            call = await answered_call(server, phone)
        await phone.wait_for(lambda: any(r.method == "BYE" for r in phone.requests))
        assert call.close_reason == "server_shutdown"


async def test_rtp_from_another_address_is_dropped_and_the_callers_own_is_heard():
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            async with sideband(server, call.id) as events:
                await until_true(lambda: call.sidebands)
                async with SipPhone.open(sip_address(server)) as stranger:  # another port, the call's RTP address
                    stranger.rtp.update_remote(phone.answer.rtp_address)
                    await stranger.play(utterance(rate=RATE), RATE)
                    await until_true(lambda: call.wire.rtp.dropped >= 150)
                assert not any(e["type"] == "input_audio_buffer.speech_started" for e in events)
                await phone.play(utterance(rate=RATE), RATE)
                await until_true(lambda: any(e["type"] == "input_audio_buffer.speech_started" for e in events))


async def test_each_rtp_packet_reaches_the_session_on_its_own_arrival_with_none_held_behind_it():
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            heard: list[int] = []
            receive = call.receive_audio
            call.receive_audio = lambda samples, rate: (heard.append(samples.size), receive(samples, rate))
            for n in range(1, 4):
                phone.rtp.send_audio_auto(b"\xff" * 160)  # 20 ms of mu-law silence
                await until_true(lambda: len(heard) == n, timeout=2)  # heard before the next packet is sent
            assert heard == [160, 160, 160]


async def test_a_call_whose_rtp_stops_ends_with_bye_after_the_media_timeout():
    async with running_server(sip_profile(media_timeout_s=0.5), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            call = await answered_call(server, phone)
            await phone.wait_for(lambda: any(r.method == "BYE" for r in phone.requests), timeout=10)
            assert call.close_reason == "media_timeout"
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0)


@pytest.mark.skipif(shutil.which("sipp") is None, reason="SIPp is not installed (scripts/install-test-deps.sh installs sip-tester)")
async def test_sipp_places_a_call_and_hangs_up_through_the_endpoint():
    async with running_server(sip_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        host, port = sip_address(server)
        # SIPp's built-in `uac` scenario: INVITE, 100/180 optional, 200, ACK, a pause, BYE, 200
        process = await asyncio.create_subprocess_exec(
            "sipp", "-sn", "uac", f"{host}:{port}", "-i", "127.0.0.1", "-p", "0", "-m", "1", "-d", "500", "-timeout", "20", "-nostdin",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/tmp")
        try:
            output, _ = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, output.decode(errors="replace")[-2000:]
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0)


@contextlib.asynccontextmanager
async def webhook_receiver():
    """An HTTP server on 127.0.0.1 that keeps each POST's (body, headers) and answers 200."""
    deliveries: list[tuple[bytes, dict[str, str]]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")[1:]
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        deliveries.append((body, headers))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook", deliveries
    finally:
        listener.close()
        await listener.wait_closed()


async def test_twenty_concurrent_calls_each_get_their_own_reply():
    async with running_server(sip_profile(reply={"words": 2, "chunk_ms": 200}, limits={"max_sessions": 20}), api_key=API_KEY) as server:
        async def one_call() -> int:
            async with SipPhone.open(sip_address(server)) as phone:
                assert (await phone.call(timeout=20)).status_code == 200
                await phone.play(utterance(rate=RATE), RATE, packet_gap_s=0.01)
                await until_true(lambda: len(loud_frames(phone.heard_audio())) >= 15 and rms(phone.heard_audio()[-1600:]) < 0.01,
                                 timeout=90, step=0.1)  # the reply, then 0.2 s of silence
                assert (await phone.bye()).status_code == 200
                return len(loud_frames(phone.heard_audio()))

        loud = await asyncio.gather(*(one_call() for _ in range(20)))
        # two 200 ms tones each: about 20 loud packets per call (one reply, not another call's too)
        assert all(17 <= n <= 23 for n in loud), loud
        await until_true(lambda: server.runtime.count("realtime") == 0 and len(phone_calls(server)) == 0)


async def behind_nat(phone: SipPhone) -> None:
    """INVITE as a phone behind NAT does: its SDP names its LAN address (nothing listens there)."""
    phone.request("INVITE", sdp_offer(phone.rtp_port).replace("IN IP4 127.0.0.1", "IN IP4 192.168.1.20"))
    final = await phone.final_response()
    assert final.status_code == 200, final.status_code
    phone.accept_answer(final)


async def test_with_rtp_latching_a_caller_behind_nat_is_answered_at_the_source_of_its_first_packet():
    async with running_server(sip_profile(reply={"words": 2, "chunk_ms": 200}, rtp_latching=True), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            await behind_nat(phone)
            await until_true(lambda: len(live_sip_calls(server)) == 1)
            call = live_sip_calls(server)[0]
            assert call.wire.rtp.peer == ("192.168.1.20", phone.rtp_port)
            await phone.play(utterance(rate=RATE), RATE)
            assert call.wire.rtp.peer == ("127.0.0.1", phone.rtp_port) and call.wire.rtp.dropped == 0
            # the reply comes back to where the caller's packets came from
            await until_true(lambda: len(loud_frames(phone.heard_audio())) >= 10, timeout=40)


async def test_without_rtp_latching_the_offers_private_address_stays_the_peer():
    async with running_server(sip_profile(), api_key=API_KEY) as server:
        async with SipPhone.open(sip_address(server)) as phone:
            await behind_nat(phone)
            await until_true(lambda: len(live_sip_calls(server)) == 1)
            call = live_sip_calls(server)[0]
            await phone.play(utterance(rate=RATE), RATE)
            await until_true(lambda: call.wire.rtp.dropped >= 10)
            assert call.wire.rtp.peer == ("192.168.1.20", phone.rtp_port)
