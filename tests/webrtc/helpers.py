"""Shared pieces of the WebRTC tests: the profile, server-side probes, audio checks."""

from __future__ import annotations

import gc

import numpy as np
import psutil
from aiortc import RTCPeerConnection

from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import silence, speech

API_KEY = "test-key"
MODEL = "test-realtime"


def webrtc_profile(reply: dict | None = None, limits: dict | None = None, **webrtc) -> dict:
    profile = realtime_profile(reply=reply, limits=limits)
    profile["webrtc"] = {"candidates": "loopback", **webrtc}
    return profile


def calls_of(server):
    """The server's live-call registry."""
    return server.server.config.app.state.webrtc_calls


def utterance(text: str = "What is the weather like today in Paris?", rate: int = 24000, tail_s: float = 1.2) -> np.ndarray:
    return np.concatenate([silence(0.3, rate), speech(text, rate), silence(tail_s, rate)])


def open_peer_connections() -> list[RTCPeerConnection]:
    gc.collect()
    # issubclass(type(o)), not isinstance: isinstance reads a dead weakref proxy's __class__ and raises
    # (some libraries loaded by earlier tests leave such proxies for the collector)
    return [o for o in gc.get_objects() if issubclass(type(o), RTCPeerConnection) and o.connectionState != "closed"]


def udp_sockets() -> int:
    return len(psutil.Process().net_connections(kind="udp"))


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0
