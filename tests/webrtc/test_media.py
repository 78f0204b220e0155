"""Units: Opus-side audio conversion, the paced reply track, ICE policy, the `webrtc:` profile section."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest

from session_server.webrtc.config import WebRTCConfig, WebRTCConfigError
from session_server.webrtc.ice import filter_remote_candidates, host_addresses, rtc_configuration
from session_server.webrtc.media import FRAME_SAMPLES, TRACK_RATE, InputAudio, ReplyAudioTrack
from tests.webrtc.helpers import dominant_hz


def stereo_frame(left: np.ndarray, right: np.ndarray, pts: int) -> av.AudioFrame:
    """What aiortc's Opus decoder hands over: packed s16 stereo at 48 kHz."""
    packed = np.stack([left, right], axis=1).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray((packed * 32767).astype(np.int16), format="s16", layout="stereo")
    frame.sample_rate = 48000
    frame.pts = pts
    return frame


def test_input_frames_are_downmixed_and_resampled_to_16k_mono():
    t = np.arange(48000) / 48000
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    converter = InputAudio(16000)
    out = [converter.convert(stereo_frame(0.6 * tone[i : i + 960], 0.2 * tone[i : i + 960], i)) for i in range(0, 48000, 960)]
    mono = np.concatenate(out)
    assert abs(len(mono) - 16000) < 400  # the streaming resampler holds back a few ms
    assert out[1].dtype == np.float32
    assert abs(dominant_hz(mono[2000:], 16000) - 1000) < 10
    assert abs(np.abs(mono[2000:]).max() - 0.4) < 0.02  # (0.6 + 0.2) / 2


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def track_with_clock(events: list):
    clock = FakeClock()
    track = ReplyAudioTrack(
        on_started=lambda r: events.append(("started", r)),
        on_stopped=lambda r: events.append(("stopped", r)),
        clock=clock,
        sleep=clock.sleep,
    )
    return track, clock


def frame_pcm(frame: av.AudioFrame) -> np.ndarray:
    return frame.to_ndarray().reshape(-1)


def tone24k(ms: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(24 * ms)) / 24000
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


async def test_reply_track_sends_one_20ms_frame_per_20ms_then_silence():
    events: list = []
    track, clock = track_with_clock(events)
    track.push("resp_1", tone24k(100))
    track.finish("resp_1")
    frames = [await track.recv() for _ in range(10)]
    assert all(f.samples == FRAME_SAMPLES and f.sample_rate == TRACK_RATE for f in frames)
    assert [f.pts for f in frames] == [i * FRAME_SAMPLES for i in range(10)]
    # paced: the first frame at once, then exactly one frame period between frames
    assert clock.sleeps == pytest.approx([0.02] * 9)
    loud = [np.abs(frame_pcm(f)).max() > 1000 for f in frames]
    assert loud == [True] * 5 + [False] * 5
    assert events == [("started", "resp_1"), ("stopped", "resp_1")]
    assert track.played_ms("resp_1") == pytest.approx(100, abs=1)


async def test_reply_track_does_not_burst_after_a_stall():
    track, clock = track_with_clock([])
    track.push("resp_1", tone24k(1000))
    await track.recv()
    clock.now += 1.0  # the event loop stalled for a second
    await track.recv()
    await track.recv()
    # no catch-up burst of 50 frames: the clock restarts and pacing resumes at one frame per 20 ms
    assert clock.sleeps == pytest.approx([0.02])


async def test_clear_silences_the_very_next_frame_and_drops_late_audio_of_that_reply():
    events: list = []
    track, _ = track_with_clock(events)
    track.push("resp_1", tone24k(1000))
    for _ in range(3):
        assert np.abs(frame_pcm(await track.recv())).max() > 1000
    assert track.clear() == "resp_1"
    assert np.abs(frame_pcm(await track.recv())).max() == 0
    track.push("resp_1", tone24k(200))  # late audio of the cleared reply
    assert np.abs(frame_pcm(await track.recv())).max() == 0
    track.push("resp_2", tone24k(200))  # the next reply plays
    assert np.abs(frame_pcm(await track.recv())).max() > 1000
    assert events == [("started", "resp_1"), ("started", "resp_2")]
    assert track.clear() == "resp_2" and track.clear() is None


async def test_a_held_reply_pauses_and_then_plays_on_from_where_it_paused_losing_nothing():
    track, _ = track_with_clock([])
    track.push("resp_1", tone24k(200))
    track.finish("resp_1")
    for _ in range(3):
        assert np.abs(frame_pcm(await track.recv())).max() > 1000
    track.hold(True)  # a sound during the reply: maybe a cough
    held = [np.abs(frame_pcm(await track.recv())).max() for _ in range(5)]
    assert held == [0] * 5 and track.played_ms("resp_1") == pytest.approx(60, abs=1) and track.underruns == 0
    track.hold(False)  # it was
    loud = 0
    while np.abs(frame_pcm(await track.recv())).max() > 1000:
        loud += 1
    assert track.played_ms("resp_1") == pytest.approx(200, abs=21) and loud >= 6


async def test_an_underrun_sends_silence_rather_than_a_partial_frame_and_the_tail_plays_when_finished():
    track, _ = track_with_clock([])
    track.push("resp_1", tone24k(50))
    loud = 0
    while np.abs(frame_pcm(await track.recv())).max() > 1000:
        loud += 1
    # what is left is less than a frame (the resampler also holds a few ms back): it waits
    assert 0 < track.queued_ms < 20 and loud >= 1
    track.finish("resp_1")  # no more audio comes: the tail (and the resampler's) plays, then silence
    assert np.abs(frame_pcm(await track.recv())).max() > 1000
    while track.queued_ms:
        await track.recv()
    assert np.abs(frame_pcm(await track.recv())).max() == 0
    assert track.played_ms("resp_1") == pytest.approx(50, abs=20)


async def test_a_stopped_track_ends_recv():
    from aiortc.mediastreams import MediaStreamError

    track, _ = track_with_clock([])
    track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(track.recv(), 1)


OFFER = "\r\n".join(
    [
        "v=0",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "a=candidate:1 1 udp 2130706431 192.0.2.7 50000 typ host",
        "a=candidate:2 1 udp 2130706431 127.0.0.1 50001 typ host",
        "a=candidate:3 1 udp 2130706431 0a1b2c3d.local 50002 typ host",
        "a=end-of-candidates",
        "",
    ]
)


def test_loopback_policy_keeps_only_loopback_candidates_of_the_offer():
    filtered = filter_remote_candidates(OFFER, "loopback")
    assert "127.0.0.1 50001" in filtered
    assert "192.0.2.7" not in filtered and ".local" not in filtered
    assert "end-of-candidates" not in filtered  # peer-reflexive discovery stays possible
    assert filter_remote_candidates(OFFER, "host") == OFFER


def test_host_address_policies():
    gathered = ["192.0.2.7", "fd00::7"]
    assert host_addresses("host", gathered) == gathered
    assert host_addresses("loopback", gathered) == ["127.0.0.1"]
    assert host_addresses("host+loopback", gathered) == [*gathered, "127.0.0.1"]


def test_profile_section_is_parsed_and_checked():
    config = WebRTCConfig.from_profile(
        {"webrtc": {"ice_servers": [{"urls": "stun:stun.example.org:3478"}, {"urls": ["turn:turn.example.org:3478?transport=udp"], "username": "u", "credential": "p"}]}}
    )
    assert config.candidates == "host"
    assert [s.urls for s in config.ice_servers] == [("stun:stun.example.org:3478",), ("turn:turn.example.org:3478?transport=udp",)]
    assert len(rtc_configuration(config).iceServers) == 2
    # no servers configured: an explicit empty list, never aiortc's public STUN fallback
    assert rtc_configuration(WebRTCConfig.from_profile({})).iceServers == []
    for bad in ({"candidates": "everything"}, {"ice_servers": [{"urls": "http://x"}]}, {"stun": "x"}, {"connect_timeout_s": 0}):
        with pytest.raises(WebRTCConfigError):
            WebRTCConfig.from_profile({"webrtc": bad})
