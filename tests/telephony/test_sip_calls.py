"""SIP calls: a caller's phone (sip_phone.py, and SIPp) against the SIP endpoint, fake reply graph."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import running_server
from tests.telephony.sip_phone import RATE, SipPhone
from tests.telephony.test_twilio_streams import API_KEY, phone_calls, phone_profile, sideband
from tests.webrtc.helpers import dominant_hz, rms, until_true, utterance


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
