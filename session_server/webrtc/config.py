"""The profile's `webrtc:` section: ICE servers, which host candidates to use, call timeouts.

    webrtc:
      ice_servers:                     # STUN/TURN for deployments behind NAT (default: none)
        - urls: stun:stun.example.org:3478
        - urls: [turn:turn.example.org:3478?transport=udp]
          username: user
          credential: secret
      candidates: host                 # host | loopback | host+loopback (see below)
      connect_timeout_s: 20            # a call whose ICE/DTLS has not connected by then is closed
      max_message_bytes: 65536         # data-channel messages larger than this are refused

`candidates` is the host-candidate policy:
- `host` (default): every local interface address, as aioice gathers them (127.0.0.1 excluded).
- `loopback`: only 127.0.0.1, and the offer's non-loopback candidates are dropped, so media never
  leaves the machine. For tests and for a browser on the same host.
- `host+loopback`: both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CANDIDATE_POLICIES = ("host", "loopback", "host+loopback")


class WebRTCConfigError(ValueError):
    pass


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def to_public(self) -> dict[str, Any]:
        """What a browser needs in its RTCPeerConnection configuration."""
        public: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            public["username"] = self.username
        if self.credential is not None:
            public["credential"] = self.credential
        return public


@dataclass(frozen=True)
class WebRTCConfig:
    ice_servers: tuple[IceServer, ...] = ()
    candidates: str = "host"
    connect_timeout_s: float = 20.0
    max_message_bytes: int = 65536
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loopback_only(self) -> bool:
        return self.candidates == "loopback"

    @classmethod
    def from_profile(cls, profile: dict[str, Any] | None) -> WebRTCConfig:
        section = (profile or {}).get("webrtc") or {}
        if not isinstance(section, dict):
            raise WebRTCConfigError("webrtc: must be a mapping")
        known = {"ice_servers", "candidates", "connect_timeout_s", "max_message_bytes"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise WebRTCConfigError(f"webrtc.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        candidates = section.get("candidates", "host")
        if candidates not in CANDIDATE_POLICIES:
            raise WebRTCConfigError(f"webrtc.candidates: must be one of {', '.join(CANDIDATE_POLICIES)}, got {candidates!r}")
        servers = []
        for index, entry in enumerate(section.get("ice_servers") or []):
            if not isinstance(entry, dict) or "urls" not in entry:
                raise WebRTCConfigError(f"webrtc.ice_servers[{index}]: needs `urls`")
            urls = entry["urls"]
            urls = (urls,) if isinstance(urls, str) else tuple(urls)
            for url in urls:
                if not url.startswith(("stun:", "stuns:", "turn:", "turns:")):
                    raise WebRTCConfigError(f"webrtc.ice_servers[{index}].urls: {url!r} is not a stun:/turn: URL")
            servers.append(IceServer(urls, entry.get("username"), entry.get("credential")))
        timeout = float(section.get("connect_timeout_s", 20.0))
        max_message = int(section.get("max_message_bytes", 65536))
        if timeout <= 0 or max_message <= 0:
            raise WebRTCConfigError("webrtc.connect_timeout_s and webrtc.max_message_bytes must be positive")
        return cls(tuple(servers), candidates, timeout, max_message)
