"""Offers the server refuses: each gets a 4xx in the OpenAI error shape and leaks nothing."""

from __future__ import annotations

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from clients.python.webrtc import CallFailed, WebRTCSession
from tests.conftest import running_server, until_true
from tests.webrtc.helpers import API_KEY, calls_of, open_peer_connections, webrtc_profile

VIDEO_ONLY = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:96 VP8/90000\r\n"
# An audio m-line, but no ICE credentials or DTLS fingerprint: not answerable.
BROKEN_AUDIO = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:111 opus/48000/2\r\na=sendrecv\r\n"


async def offer_without_audio() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def assert_error(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        ("hello, I am not SDP", "application/sdp", 400, "invalid_offer"),
        ("", "application/sdp", 400, "missing_required_parameter"),
        (VIDEO_ONLY, "application/sdp", 400, "missing_audio"),
        (BROKEN_AUDIO, "application/sdp", 400, "invalid_offer"),
        ('{"sdp": "v=0"}', "application/json", 415, "unsupported_content_type"),
    ],
    ids=["not-sdp", "empty", "video-only", "unanswerable-audio", "json-body"],
)
async def test_bad_offers_get_a_4xx_with_the_openai_error_shape_and_leak_no_peer_connection(body, content_type, status, code):
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        before = len(open_peer_connections())
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            reply = await http.post("/v1/realtime/calls", content=body, headers={"Content-Type": content_type})
        assert_error(reply, status, code)
        assert len(calls_of(server)) == 0
        assert not server.runtime.sessions
        assert len(open_peer_connections()) == before


async def test_an_offer_with_only_a_data_channel_is_refused_for_lack_of_audio():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            reply = await http.post("/v1/realtime/calls", content=await offer_without_audio(), headers={"Content-Type": "application/sdp"})
        assert_error(reply, 400, "missing_audio")
        assert not server.runtime.sessions


async def test_a_bad_session_config_or_wrong_model_is_refused_before_any_peer_connection():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        before = len(open_peer_connections())
        with pytest.raises(CallFailed) as refused:
            async with WebRTCSession.connect(server.base_url, API_KEY, session={"audio": {"input": {"format": {"type": "audio/flac"}}}}, loopback=True):
                pass
        assert refused.value.status == 400
        assert refused.value.body["error"]["param"].startswith("session.audio.input.format")
        with pytest.raises(CallFailed) as wrong_model:
            async with WebRTCSession.connect(server.base_url, API_KEY, model="gpt-4o-realtime-preview", loopback=True):
                pass
        assert wrong_model.value.status == 400 and wrong_model.value.body["error"]["code"] == "model_not_found"
        assert len(calls_of(server)) == 0 and not server.runtime.sessions
        assert len(open_peer_connections()) == before


async def test_a_call_over_the_session_limit_gets_429_session_limit_reached_and_the_others_go_on():
    async with running_server(webrtc_profile(limits={"max_sessions": 1}), api_key=API_KEY) as server:
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as first:
            await first.next_event("session.created")
            with pytest.raises(CallFailed) as refused:
                async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True):
                    pass
            assert refused.value.status == 429
            assert refused.value.body["error"]["code"] == "session_limit_reached"
            assert len(calls_of(server)) == 1
            first.send({"type": "input_audio_buffer.clear"})
            assert (await first.next_event())["type"] == "input_audio_buffer.cleared"


async def test_calls_need_the_api_key():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        with pytest.raises(CallFailed) as refused:
            async with WebRTCSession.connect(server.base_url, "wrong-key", loopback=True):
                pass
        assert refused.value.status == 401
        assert not server.runtime.sessions


async def test_fifty_calls_leave_no_peer_connection_session_or_socket_behind():
    from tests.webrtc.helpers import udp_sockets

    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        # one call first, so lazily created process-wide sockets are in the baseline
        async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
            await call.next_event("session.created")
        await until_true(lambda: len(calls_of(server)) == 0 and not server.runtime.sessions)
        peers, sockets = len(open_peer_connections()), udp_sockets()
        for index in range(50):
            async with WebRTCSession.connect(server.base_url, API_KEY, loopback=True) as call:
                await call.next_event("session.created")
                if index % 2:
                    await call.hangup(server.base_url, API_KEY)  # half end on the server's side
        await until_true(lambda: len(calls_of(server)) == 0 and not server.runtime.sessions, timeout=30)
        await until_true(lambda: len(open_peer_connections()) <= peers and udp_sockets() <= sockets, timeout=30)


async def test_server_shutdown_ends_every_call():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        session = WebRTCSession.connect(server.base_url, API_KEY, loopback=True)
        call = await session.__aenter__()
        await call.next_event("session.created")
        server_call = calls_of(server).get(call.call_id)
    # the server has stopped: the call was told why, and its peer connection is closed
    try:
        closed = await call.next_event("session.closed", timeout=5)
        assert closed["reason"] == "server_shutdown"
        assert server_call.pc.connectionState == "closed"
        await until_true(lambda: call.channel_closed.is_set(), timeout=10)
    finally:
        await session.__aexit__(None, None, None)


async def test_a_graph_without_a_realtime_input_refuses_calls_with_501():
    profile = webrtc_profile()
    profile["inputs"] = {name: port for name, port in profile["inputs"].items() if name != "audio"}
    async with running_server(profile, api_key=API_KEY) as server:
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            reply = await http.post("/v1/realtime/calls", content=await offer_without_audio(), headers={"Content-Type": "application/sdp"})
        assert_error(reply, 501, "realtime_unavailable")
        assert len(calls_of(server)) == 0 and not server.runtime.sessions
