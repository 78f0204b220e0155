"""OpenAI's Live API over WebRTC: the `openai` SDK's `client.live.create` and
`client.live.sessions.fork` for the signalling, an aiortc peer for the media and the data channel
(session_server/webrtc/live_calls.py), against a live server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
import numpy as np
import websockets
from openai import AsyncOpenAI, BadRequestError

from clients.python.audio import PlaybackTrack
from clients.python.webrtc import WebRTCSession, loopback_only
from tests.conftest import running_server, until_true
from tests.live.fakes import live_profile
from tests.realtime.client import RawClient
from tests.webrtc.helpers import API_KEY, calls_of, rms


def live_webrtc_profile() -> dict:
    profile = live_profile()
    profile["webrtc"] = {"candidates": "loopback"}
    return profile


def said(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "session.output_transcript.delta")


@contextlib.asynccontextmanager
async def live_peer(signal: Callable[[str], Awaitable[Any]]) -> AsyncIterator[tuple[WebRTCSession, Any]]:
    """An aiortc peer as a browser holds a Live session: one Opus track each way and a data
    channel; `signal(offer_sdp)` is the SDK call that answers it."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    microphone = PlaybackTrack()
    try:
        pc.addTransceiver(microphone, direction="sendrecv")
        peer = WebRTCSession(pc, pc.createDataChannel("oai-events"), microphone)
        peer.channel.on("open", peer.channel_open.set)
        peer.channel.on("message", peer._on_message)
        pc.on("track", peer._on_track)
        loopback_only(pc)
        await pc.setLocalDescription(await pc.createOffer())
        created = await signal(pc.localDescription.sdp)
        assert created.transport.type == "webrtc"
        await pc.setRemoteDescription(RTCSessionDescription(created.transport.sdp, "answer"))
        async with asyncio.timeout(20):
            await peer.channel_open.wait()
        yield peer, created
    finally:
        if peer._reader is not None:
            peer._reader.cancel()
        microphone.stop()
        await pc.close()


async def test_a_live_webrtc_session_starts_at_creation_speaks_a_typed_turn_on_its_track_mutes_and_closes():
    async with running_server(live_webrtc_profile(), api_key=API_KEY) as srv:
        client = AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=API_KEY)
        session = {"model": "gpt-live-1", "instructions": "Be brief.", "audio": {"output": {"voice": "ethan"}}}
        async with live_peer(lambda sdp: client.live.create(session=session, transport={"type": "webrtc", "sdp": sdp})) as (peer, created):
            started = await peer.next_event()
            peer.send({"type": "session.start", "event_id": "again", "session": {"model": "gpt-live-1"}})
            again = await peer.next_event("error")
            peer.send({"type": "session.commentary.append", "event_id": "typed_1", "content": "Greet the user.",
                       "delegation_id": None})
            turn = await peer.events_until("session.usage.updated")
            # The reply's three 100 ms tones play on the track after their transcript.
            await until_true(lambda: rms(peer.received_audio(peer.event_time("session.output_transcript.delta"))) > 0.01)
            # Muted, the track's audio reaches the model as silence of the same length.
            server_call = calls_of(srv).get(created.session.id.replace("sess_", "rtc_", 1))
            peer.send({"type": "session.input_audio.mute", "event_id": "mute_1"})
            muted_ack = await peer.next_event("session.input_audio.muted")
            muted = server_call.heard(np.ones(160, np.float32))
            peer.send({"type": "session.input_audio.unmute"})
            await peer.next_event("session.input_audio.unmuted")
            unmuted = server_call.heard(np.ones(160, np.float32))
            peer.send({"type": "session.close", "event_id": "bye"})
            closed = await peer.next_event("session.closed")
            await until_true(lambda: len(calls_of(srv)) == 0 and not srv.runtime.sessions)

    assert created.session.id == started["session"]["id"] and created.session.id.startswith("sess_")
    assert started["type"] == "session.started"
    assert (started["session"]["model"], started["session"]["instructions"]) == ("gpt-live-1", "Be brief.")
    assert started["session"]["audio"] == {"output": {"voice": "ethan"}}  # no format: the track's
    assert again["error"]["code"] == "session_already_started" and again["client_event_id"] == "again"
    assert turn[0]["type"] == "session.commentary.appended" and turn[0]["client_event_id"] == "typed_1"
    assert said(turn) == "word0 word1 word2 "
    # Reply audio is on the track only; GA's bookkeeping never reaches the data channel.
    assert {e["type"] for e in turn} <= {"session.commentary.appended", "session.output_transcript.delta",
                                         "session.usage.updated"}
    assert muted_ack["client_event_id"] == "mute_1"
    assert (muted.shape, float(np.abs(muted).max()), float(unmuted.min())) == ((160,), 0.0, 1.0)
    assert (closed["reason"], closed["client_event_id"]) == ("close_requested", "bye")


def pcm24(event: dict[str, Any], key: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(event[key]), "<i2").astype(np.float32) / 32768.0


async def test_a_sideband_on_a_live_webrtc_session_gets_its_events_and_its_track_audio_both_ways_before_muting():
    async with running_server(live_webrtc_profile(), api_key=API_KEY) as srv:
        client = AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=API_KEY)
        async with live_peer(lambda sdp: client.live.create(session={"model": "gpt-live-1"},
                                                            transport={"type": "webrtc", "sdp": sdp})) as (peer, created):
            await peer.next_event("session.started")
            attach = f"{srv.ws_url}/v1/live/sessions/{created.session.id}/attach"
            async with websockets.connect(attach, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
                sideband = RawClient(ws)
                await sideband.send({"type": "session.input_audio.mute", "event_id": "mute_1"})
                muted_ack = await peer.next_event("session.input_audio.muted")
                # Spoken while muted: the model hears silence, the sideband the speech.
                peer.microphone.play(0.5 * np.sin(2 * np.pi * 440 * np.arange(12000) / 24000).astype(np.float32), 24000)
                reflected = []  # the track's audio as the sideband gets it, until the tone is there
                async with asyncio.timeout(10):
                    while not reflected or rms(pcm24(reflected[-1], "audio")) < 0.1:
                        reflected.append((await sideband.until("session.input_audio.append"))[-1])
                peer.send({"type": "session.input_audio.unmute"})
                peer.send({"type": "session.commentary.append", "content": "Greet the user.", "delegation_id": None})
                await peer.next_event("session.usage.updated")
                peer.send({"type": "session.close"})
                seen = await sideband.until("session.closed")

    assert muted_ack["client_event_id"] == "mute_1"
    assert rms(pcm24(reflected[-1], "audio")) > 0.1  # the tone reached the sideband while the session was muted
    # Muted, the model heard no turn: what the sideband was told is the typed turn's, in order.
    told = [e["type"] for e in seen if e["type"] not in ("session.input_audio.append", "session.output_audio.delta")]
    assert told == ["session.input_audio.unmuted", "session.commentary.appended", *["session.output_transcript.delta"] * 3,
                    "session.usage.updated", "session.closed"]
    # The reply's audio (three 100 ms tones) as PCM16 24 kHz, laid end to end.
    out = [e for e in seen if e["type"] == "session.output_audio.delta"]
    assert sum(len(pcm24(e, "delta")) for e in out) == 3 * 2400
    assert all(e["end_ms"] - e["start_ms"] == 100 for e in out)
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(out, out[1:]))


async def test_a_live_webrtc_session_forked_over_webrtc_goes_on_from_its_conversation_and_bad_configs_are_refused():
    async with running_server(live_webrtc_profile(), api_key=API_KEY) as srv:
        client = AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=API_KEY)
        refusals = [await _refusal(client, session) for session in (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}},
            {"model": "gpt-live-1", "idle_timeout_s": 30}, {"model": "gpt-4o"})]
        async with live_peer(lambda sdp: client.live.create(session={"model": "gpt-live-1"},
                                                            transport={"type": "webrtc", "sdp": sdp})) as (source, created):
            await source.next_event("session.started")
            source.send({"type": "session.commentary.append", "content": "Greet the user.", "delegation_id": None})
            await source.next_event("session.usage.updated")
            source_id = created.session.id
            async with live_peer(lambda sdp: client.live.sessions.fork(source_id, transport={"type": "webrtc", "sdp": sdp})) as (fork, forked):
                fork_started = await fork.next_event("session.started")
                fork.send({"type": "session.commentary.append", "content": "Say goodbye.", "delegation_id": None})
                fork_turn = await fork.events_until("session.usage.updated")
            fork_turns = list(srv.runtime.nodes["reply"].turns[forked.session.id])
            source_turns = list(srv.runtime.nodes["reply"].turns[source_id])

    assert refusals == [("unknown_parameter", "session.audio.format"), ("unsupported", "session.idle_timeout_s"),
                        ("model_not_found", "session.model")]
    assert forked.session.id != source_id and fork_started["session"]["id"] == forked.session.id
    assert fork_started["session"]["sglang"]["forked_from"] == source_id
    assert [(t.role, t.text) for t in fork_turns[:3]] == [("system", "[commentary] Greet the user."),
                                                         ("assistant", "word0 word1 word2 "),
                                                         ("system", "[commentary] Say goodbye.")]
    assert said(fork_turn) == "word0 word1 word2 "
    assert all(t.text != "[commentary] Say goodbye." for t in source_turns)


async def _refusal(client: AsyncOpenAI, session: dict[str, Any]) -> tuple[str, str]:
    """The coded 400 a Live WebRTC creation with this config gets (the offer is checked first)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("oai-events")
        loopback_only(pc)
        await pc.setLocalDescription(await pc.createOffer())
        try:
            await client.live.create(session=session, transport={"type": "webrtc", "sdp": pc.localDescription.sdp})
        except BadRequestError as error:
            return error.body["code"], error.body["param"]
        raise AssertionError(f"{session} was not refused")
    finally:
        await pc.close()
