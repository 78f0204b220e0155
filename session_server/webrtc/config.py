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
from typing import Annotated, Any, Literal

import msgspec

from graph.schema import convert_section

CANDIDATE_POLICIES = ("host", "loopback", "host+loopback")


class WebRTCConfigError(ValueError):
    pass


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None


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
        try:
            section = convert_section((profile or {}).get("webrtc"), WebRTCSection, "webrtc")
        except ValueError as exc:
            raise WebRTCConfigError(str(exc)) from None
        servers = []
        for index, entry in enumerate(section.ice_servers):
            urls = (entry.urls,) if isinstance(entry.urls, str) else tuple(entry.urls)
            for url in urls:
                if not url.startswith(("stun:", "stuns:", "turn:", "turns:")):
                    raise WebRTCConfigError(f"webrtc.ice_servers[{index}].urls: {url!r} is not a stun:/turn: URL")
            servers.append(IceServer(urls, entry.username, entry.credential))
        return cls(tuple(servers), section.candidates, section.connect_timeout_s, section.max_message_bytes)


class IceServerEntry(msgspec.Struct, forbid_unknown_fields=True):
    urls: str | list[str]
    username: str | None = None
    credential: str | None = None


class WebRTCSection(msgspec.Struct, forbid_unknown_fields=True):
    """The `webrtc:` section as written (typed; graph/schema.py turns a mismatch into one line)."""

    ice_servers: list[IceServerEntry] = []
    candidates: Literal[CANDIDATE_POLICIES] = "host"
    connect_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    max_message_bytes: Annotated[int, msgspec.Meta(gt=0)] = 65536
