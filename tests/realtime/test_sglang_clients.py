"""sglang-omni's own session clients, unchanged in protocol: the duplex recording client
(benchmarks/duplex/client.py) and the browser page's session state machine
(playground/realtime/frontend/orb/session.js), reimplemented here event for event, plus the
protocol rules they rely on (grant, 16 kHz, client_event_id, session.close, drain fields)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from PIL import Image

from graph.messages import InputEnded, Interrupt
from session_server.realtime.protocol import (
    CLOSE_NORMAL,
    CloseSession,
    ControlGraph,
    RealtimeProtocol,
    SessionState,
)
from tests.conftest import running_server
from tests.realtime.client import API_KEY, MODEL, b64
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16, silence, speech
from tests.realtime.test_protocol import events, kinds, send

PACKET_MS = 80


def server(**kwargs):
    return running_server(realtime_profile(**kwargs), api_key=API_KEY)


def connect(srv):
    return websockets.connect(f"{srv.ws_url}/v1/realtime?model={MODEL}", additional_headers={"Authorization": f"Bearer {API_KEY}"},
                              max_size=None, compression=None, ping_interval=None)


def spoken_16k() -> tuple[bytes, float, float]:
    """16 kHz PCM16 (silence, speech, silence) and where the speech starts and ends, in ms."""
    voice = speech(rate=16000)
    audio = np.concatenate([silence(0.5, 16000), voice, silence(1.2, 16000)])
    return pcm16(audio), 500.0, 500.0 + len(voice) / 16.0


# ------------------------------------------------------------------ the duplex recording client


async def record_session(srv, pcm: bytes, rate: int = 16000) -> tuple[list[dict], list[dict], int]:
    """Their recording client's exchange: session.update naming only output_modalities, numbered
    80 ms appends of 16 kHz audio (never naming a rate), sglang.input_audio.end, wait for drained,
    session.close, wait for session.closed. Any `error` aborts it, as theirs does."""
    sent: list[dict] = []
    received: list[dict] = []
    packet_bytes = rate * PACKET_MS // 1000 * 2

    async with connect(srv) as ws:

        async def send(kind: str, **payload: Any) -> None:
            event = {"type": kind, "event_id": uuid.uuid4().hex, **payload}
            sent.append(event)
            await ws.send(json.dumps(event))

        async def until(kind: str) -> dict:
            async with asyncio.timeout(30):
                while True:
                    event = json.loads(await ws.recv())
                    received.append(event)
                    assert event["type"] != "error", event
                    if event["type"] == kind:
                        return event

        await until("session.created")
        await send("session.update", session={"output_modalities": ["audio"]})
        await until("session.updated")
        for seq, offset in enumerate(range(0, len(pcm), packet_bytes)):
            await send("input_audio_buffer.append", audio=b64(pcm[offset : offset + packet_bytes]),
                       sglang={"seq": seq, "t_start_ms": offset / 2 / rate * 1000})
        await send("sglang.input_audio.end")
        await until("sglang.input_audio.drained")
        await send("session.close")
        await until("session.closed")
        with pytest.raises(websockets.ConnectionClosedOK):
            async with asyncio.timeout(10):
                await ws.recv()
        return sent, received, ws.close_code


async def test_their_recording_client_is_heard_at_16_khz_and_ends_with_session_closed():
    pcm, speech_start_ms, speech_end_ms = spoken_16k()
    sent_ms = len(pcm) / 2 / 16
    async with server(reply={"words": 2}) as srv:
        sent, received, close_code = await record_session(srv, pcm)

    granted = next(e for e in received if e["type"] == "session.updated")["session"]["sglang"]["granted"]
    assert granted["input_audio_format"] == {"type": "audio/pcm", "rate": 16000}
    appends = [e for e in sent if e["type"] == "input_audio_buffer.append"]
    acks = [e for e in received if e["type"] == "sglang.input_audio.accepted"]
    assert [a["client_event_id"] for a in acks] == [e["event_id"] for e in appends]
    assert abs(acks[-1]["accepted_end_ms"] - sent_ms) < PACKET_MS  # acknowledged = sent, within one packet
    # The VAD heard the speech where it is in the audio, not scaled by a misread rate.
    stopped = next(e for e in received if e["type"] == "input_audio_buffer.speech_stopped")
    assert speech_end_ms < stopped["audio_end_ms"] <= sent_ms
    started = next(e for e in received if e["type"] == "input_audio_buffer.speech_started")
    assert started["audio_start_ms"] < speech_start_ms
    end_id = next(e["event_id"] for e in sent if e["type"] == "sglang.input_audio.end")
    ended = next(e for e in received if e["type"] == "sglang.input_audio.ended")
    drained = next(e for e in received if e["type"] == "sglang.input_audio.drained")
    assert (ended["client_event_id"], ended["tail_policy"], ended["accepted_end_ms"]) == (end_id, "flush", acks[-1]["accepted_end_ms"])
    assert drained["client_event_id"] == end_id
    assert drained["accepted_end_ms"] == acks[-1]["accepted_end_ms"]
    assert drained["padding_ms"] == 0.0
    assert math.isclose(drained["consumed_ms"] + drained["discarded_ms"], drained["accepted_end_ms"], abs_tol=0.01)
    assert drained["discarded_ms"] < 32.0  # at most the VAD's last partial window
    close_id = next(e["event_id"] for e in sent if e["type"] == "session.close")
    closed = received[-1]
    assert (closed["type"], closed["reason"], closed["client_event_id"]) == ("session.closed", "client_closed", close_id)
    assert close_code == 1000


# ------------------------------------------------------------------ the browser page's session state machine


class BrowserSession:
    """Their page's protocol state (session.js), event for event: negotiate, read the grant
    (`session.sglang.granted`), stream 80 ms packets at the granted rate, one camera frame per
    native unit, count acks by `client_event_id`, end input, close on drained."""

    def __init__(self, ws, extension: dict | None = None):
        self.ws = ws
        self.extension = extension
        self.state = "connecting"
        self.granted: dict | None = None
        self.sequence = 0
        self.packets: list[dict] = []  # {seq, event_id, acked}
        self.frames: list[dict] = []  # {unit, event_id, status}
        self.sent_samples = 0
        self.last_frame_unit = -1
        self.close_reason: str | None = None
        self.drained: dict | None = None
        self.errors: list[dict] = []

    async def send(self, kind: str, **payload: Any) -> dict:
        self.sequence += 1
        event = {"type": kind, "event_id": f"web-{self.sequence}", **payload}
        await self.ws.send(json.dumps(event))
        return event

    @property
    def input_rate(self) -> int:
        return self.granted["input_audio_format"]["rate"]

    @property
    def unit_ms(self) -> float:
        return self.granted["native_unit_ms"]

    async def handle(self, event: dict) -> None:
        kind = event["type"]
        if kind == "session.created":
            self.state = "negotiating"
            session: dict[str, Any] = {"output_modalities": ["audio"]}
            if self.extension:
                session["sglang"] = self.extension
            await self.send("session.update", session=session)
        elif kind == "session.updated":
            self.granted = event["session"]["sglang"]["granted"]  # their TypeError when missing
            assert self.input_rate > 0
            self.state = "ready"
        elif kind == "sglang.input_audio.accepted":
            for packet in self.packets:
                if packet["event_id"] == event.get("client_event_id"):
                    packet["acked"] = True
        elif kind == "sglang.input_image.accepted":
            for frame in self.frames:
                if frame["event_id"] in (event.get("client_event_id"), event.get("event_id")) and frame["status"] == "sent":
                    frame["status"] = "accepted"
        elif kind == "sglang.input_audio.drained":
            self.drained = event
            await self.close()
        elif kind == "error":
            self.errors.append(event["error"])
        elif kind == "session.closed":
            self.state = "closed"
            self.close_reason = event.get("reason")

    async def push(self, pcm: bytes, frame: bytes | None) -> None:
        """One 80 ms packet, and a camera frame at the first push at or past each unit boundary."""
        samples = len(pcm) // 2
        seq = len(self.packets)
        event = await self.send("input_audio_buffer.append", audio=b64(pcm),
                                sglang={"seq": seq, "t_start_ms": self.sent_samples * 1000 / self.input_rate})
        self.packets.append({"seq": seq, "event_id": event["event_id"], "acked": False})
        self.sent_samples += samples
        clock_ms = self.sent_samples * 1000 / self.input_rate
        unit = math.floor(clock_ms / self.unit_ms)
        image_granted = "image" in self.granted["input_modalities"]
        if frame is not None and image_granted and unit > self.last_frame_unit:
            self.last_frame_unit = unit
            sent = await self.send("sglang.input_image.append", image=base64.b64encode(frame).decode(), sglang={"t_ms": round(clock_ms)})
            self.frames.append({"unit": unit, "event_id": sent["event_id"], "status": "sent"})

    async def end_input(self) -> None:
        await self.send("sglang.input_audio.end")
        self.state = "ending"

    async def close(self) -> None:
        if self.state not in ("closing", "closed"):
            await self.send("session.close")
            self.state = "closing"


def jpeg(width: int = 64, height: int = 48) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(out, format="JPEG")
    return out.getvalue()


async def run_browser_session(srv, packets: int, extension: dict | None = None) -> BrowserSession:
    async with connect(srv) as ws:
        page = BrowserSession(ws, extension)

        async def receive() -> None:
            async for raw in ws:
                await page.handle(json.loads(raw))

        receiver = asyncio.create_task(receive())
        try:
            async with asyncio.timeout(30):
                while page.state != "ready":
                    await asyncio.sleep(0.01)
                # The microphone's audio, resampled to the granted rate as the page does.
                voice = np.concatenate([silence(0.3, page.input_rate), speech(rate=page.input_rate)])
                voice = np.resize(voice, packets * page.input_rate * PACKET_MS // 1000)
                packet = page.input_rate * PACKET_MS // 1000 * 2
                pcm = pcm16(voice)
                for start in range(0, len(pcm), packet):
                    await page.push(pcm[start : start + packet], jpeg())
                await page.end_input()
                await receiver  # ends when the server closes the socket
        finally:
            receiver.cancel()
        page.close_code = ws.close_code
    return page


async def test_their_browser_page_gets_its_grant_counts_every_ack_and_closes_cleanly():
    async with server(reply={"words": 2}) as srv:
        page = await run_browser_session(srv, packets=46)
    assert page.granted["interaction"] == "turn_based"
    assert page.granted["input_audio_format"]["rate"] == 16000
    assert "image" in page.granted["input_modalities"]
    assert page.granted["rejections"] == []
    assert len(page.packets) == 46 and all(p["acked"] for p in page.packets)
    assert len(page.frames) == 4 and all(f["status"] == "accepted" for f in page.frames)  # units 0..3 of 3.68 s
    assert page.errors == []
    assert page.drained is not None
    assert (page.state, page.close_reason, page.close_code) == ("closed", "client_closed", 1000)


async def test_their_browser_page_with_settings_the_server_does_not_serve_is_told_which_in_rejections():
    extension = {"interaction": "native", "sampling": {"temperature": 0.6, "listen_prob_scale": 1.0},
                 "reference_audio": {"media_type": "audio/wav", "data": "UklGRg=="}, "max_slice_nums": 2}
    async with server(reply={"words": 1}) as srv:
        page = await run_browser_session(srv, packets=4, extension=extension)
    rejected = {r["field"] for r in page.granted["rejections"]}
    assert rejected == {"sglang.interaction", "sglang.sampling.listen_prob_scale", "sglang.reference_audio", "sglang.max_slice_nums"}
    assert page.granted["input_audio_format"]["rate"] == 16000  # a negotiation block: the sglang dialect
    assert all(p["acked"] for p in page.packets)
    assert (page.state, page.close_reason) == ("closed", "client_closed")


# ------------------------------------------------------------------ the rules, on the protocol core


def opened() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x")
    protocol.open()
    return protocol


def append(protocol: RealtimeProtocol, ms: float, rate: int, event_id: str, **sglang: Any) -> list:
    audio = b64(np.zeros(int(rate * ms / 1000), "<i2").tobytes())
    return send(protocol, type="input_audio_buffer.append", event_id=event_id, audio=audio, **({"sglang": sglang} if sglang else {}))


def test_an_openai_client_that_names_no_rate_keeps_24_khz_and_the_grant_says_so_once_audio_arrives():
    protocol = opened()
    update = events(send(protocol, type="session.update", event_id="u1", session={"instructions": "Hi."}))[-1]
    assert update["client_event_id"] == "u1"
    assert update["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert update["session"]["sglang"]["granted"]["input_audio_format"]["rate"] == 16000  # undecided: an sglang client's view
    append(protocol, 100, 24000, "a1")
    assert protocol.config.input_format.rate == 24000
    update = events(send(protocol, type="session.update", session={"instructions": "Hi."}))[-1]
    assert update["session"]["sglang"]["granted"]["input_audio_format"]["rate"] == 24000


def test_a_negotiation_block_without_a_rate_makes_the_input_16_khz_in_both_views():
    protocol = opened()
    session = events(send(protocol, type="session.update", session={"sglang": {"tail_policy": "flush"}}))[-1]["session"]
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert session["sglang"]["granted"]["input_audio_format"] == {"type": "audio/pcm", "rate": 16000}
    assert session["sglang"]["granted"]["rejections"] == []


def test_a_named_rate_wins_over_the_sglang_default():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
    append(protocol, 80, 24000, "a0", seq=0, t_start_ms=0)
    assert protocol.config.input_format.rate == 24000


def test_audio_at_another_rate_than_the_session_reads_is_refused_with_audio_rate_mismatch():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
    first = events(append(protocol, 80, 16000, "a0", seq=0, t_start_ms=0))  # 80 ms at 16 kHz, read as 53.3 ms
    assert first[-1]["type"] == "sglang.input_audio.accepted"
    second = events(append(protocol, 80, 16000, "a1", seq=1, t_start_ms=80))
    assert [e["type"] for e in second] == ["error"]
    error = second[0]["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("audio_rate_mismatch", "sglang.t_start_ms", "a1")
    assert "16000 Hz" in error["message"]
    assert protocol.state is SessionState.OPEN  # the session stays; the append was not accepted


def test_session_close_cancels_the_open_reply_then_closes_with_client_closed():
    protocol = opened()
    send(protocol, type="response.create")
    response_id = next(iter(protocol.responses))
    actions = send(protocol, type="session.close", event_id="bye")
    assert kinds(actions)[-2:] == ["response.done", "session.closed"]
    done, closed = events(actions)[-2:]
    assert (done["response"]["id"], done["response"]["status"]) == (response_id, "cancelled")
    assert done["response"]["status_details"]["reason"] == "client_closed"
    assert (closed["reason"], closed["client_event_id"]) == ("client_closed", "bye")
    assert any(isinstance(a, ControlGraph) and isinstance(a.control, Interrupt) for a in actions)
    assert isinstance(actions[-1], CloseSession) and actions[-1].code == CLOSE_NORMAL
    assert protocol.state is SessionState.CLOSED
    assert send(protocol, type="response.create") == []  # nothing after the close


def test_a_camera_frame_is_acknowledged_with_its_unit_and_client_event_id():
    protocol = opened()
    frame = b64(jpeg())
    accepted = events(send(protocol, type="sglang.input_image.append", event_id="f1", image=frame, sglang={"t_ms": 2500}))[-1]
    assert (accepted["type"], accepted["unit_id"], accepted["client_event_id"], accepted["t_ms"]) == (
        "sglang.input_image.accepted", "unit_2", "f1", 2500)


def test_drain_events_account_for_every_accepted_millisecond():
    protocol = opened()
    append(protocol, 1000, 24000, "a0", seq=0, t_start_ms=0)  # sglang fields, no rate: 16 kHz ...
    assert protocol.config.input_format.rate == 16000  # ... so 24000 samples are 1500 ms
    send(protocol, type="sglang.input_audio.end", event_id="end")
    actions = protocol.graph_output(InputEnded(audio_end_ms=1472.0))
    ended, drained = events(actions)
    assert (ended["accepted_end_ms"], ended["tail_policy"], ended["client_event_id"]) == (1500.0, "flush", "end")
    assert (drained["accepted_end_ms"], drained["consumed_ms"], drained["discarded_ms"], drained["padding_ms"]) == (1500.0, 1472.0, 28.0, 0.0)
    assert drained["client_event_id"] == "end"


# ------------------------------------------------------------------ GET /v1/realtime/capabilities


async def test_capabilities_say_what_their_page_reads_and_match_a_new_sessions_grant():
    """Their browser page (settings.js) reads the capabilities before it connects: a voice control
    for `supports_reference_audio`, sampling fields for `sampling_parameters`, a text-only choice
    for "text" in `output_modalities`, a slice choice from `input_image_format`."""
    async with server() as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            response = await http.get("/v1/realtime/capabilities")
            assert (await http.get("/v1/realtime/capabilities", headers={"Authorization": "Bearer wrong"})).status_code == 401
        async with connect(srv) as ws:
            created = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.update", "session": {"sglang": {"interaction": "turn_based"}}}))
            updated = json.loads(await ws.recv())

    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    caps = response.json()
    assert caps["model"] == created["session"]["model"] == MODEL
    assert caps["supports_reference_audio"] is False and caps["native_full_duplex"] is False
    assert set(caps["sampling_parameters"]) >= {"temperature", "top_p", "top_k"}
    assert sorted(caps["output_modalities"]) == ["audio", "text"]
    assert caps["input_image_format"]["max_slice_nums"] == 1
    assert caps["input_audio_format"] == {"type": "audio/pcm", "rate": 16000}
    assert "rejections" not in caps and caps["limits"]["max_output_bytes"] > 0
    # What a session of their dialect is then granted, field for field (but the session's own modalities).
    granted = updated["session"]["sglang"]["granted"]
    assert {k: v for k, v in granted.items() if k not in ("rejections", "output_modalities")} == {
        k: v for k, v in caps.items() if k not in ("model", "limits", "output_modalities")}


async def test_capabilities_of_a_server_without_realtime_answer_why():
    async with running_server(realtime_profile(), enable_realtime=False) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url) as http:
            response = await http.get("/v1/realtime/capabilities")
    assert response.status_code == 403 and response.json()["error"]["code"] == "realtime_disabled"
