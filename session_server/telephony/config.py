"""The profile's `sip:` section: how phone calls become sessions (off unless configured).

    sip:
      listen: udp:0.0.0.0:5060        # the SIP endpoint (`serve --sip udp:HOST:PORT` overrides); none: no SIP
      webhook_url: https://...        # `realtime.call.incoming` goes here (OpenAI's SIP control plane)
      webhook_secret: whsec_...       # Standard Webhooks signing secret for it
      accept:                         # a GA session object: every call is answered with it when
        instructions: Be brief.       #   no webhook is set; a carrier media stream starts from it
        voice: Chelsie                #   (its `customParameters` instructions/voice on top)
      answer_timeout_s: 10            # a call nobody accepts by then is rejected (480)
      media_timeout_s: 30             # a call whose media stops this long ends (BYE / stream closed)
      rtp_latching: false             # a caller whose SDP names a private address (behind NAT):
                                      #   its first RTP packet's source becomes the peer

The SIP endpoint (sip.py) reads all of it; the carrier media stream (`/v1/telephony/twilio`,
twilio.py) reads `accept` and `media_timeout_s` (docs/telephony.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from graph.schema import convert_section


class SipSection(msgspec.Struct, forbid_unknown_fields=True):
    """The `sip:` section as written (typed; graph/schema.py turns a mismatch into one line)."""

    listen: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None
    accept: dict[str, Any] = {}
    answer_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    media_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    rtp_latching: bool = False


@dataclass(frozen=True)
class TelephonyConfig:
    listen: tuple[str, int] | None = None  # (host, port) of the SIP endpoint over UDP
    webhook_url: str | None = None
    webhook_secret: str | None = None
    accept: dict[str, Any] = field(default_factory=dict)
    answer_timeout_s: float = 10.0
    media_timeout_s: float = 30.0
    rtp_latching: bool = False  # symmetric RTP for callers behind NAT (sip_media.py)

    @classmethod
    def from_profile(cls, profile: dict[str, Any] | None) -> TelephonyConfig:
        section = convert_section((profile or {}).get("sip"), SipSection, "sip")
        listen = parse_listen(section.listen, "sip.listen") if section.listen is not None else None
        if section.webhook_url is not None and not section.webhook_url.startswith(("http://", "https://")):
            raise ValueError(f"sip.webhook_url: {section.webhook_url!r} is not an http(s) URL")
        if section.webhook_url is not None and not section.webhook_secret:
            raise ValueError("sip.webhook_secret: a webhook_url needs a secret to sign its webhooks with")
        return cls(listen, section.webhook_url, section.webhook_secret, dict(section.accept),
                   section.answer_timeout_s, section.media_timeout_s, section.rtp_latching)


def parse_listen(value: str, key: str = "--sip") -> tuple[str, int]:
    """`udp:HOST:PORT` -> (HOST, PORT); ValueError naming `key` otherwise (SIP over UDP only)."""
    transport, _, rest = value.partition(":")
    host, _, port = rest.rpartition(":")
    if transport != "udp" or not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (logged)
        raise ValueError(f"{key}: {value!r} is not udp:HOST:PORT (SIP is served over UDP)")
    return host.strip("[]"), int(port)
