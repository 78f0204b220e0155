"""What the server checks in an SDP offer before aiortc sees it, and the peer connection it uses.

aiortc trusts an offer's structure in places: a BUNDLE group naming a `mid` that no m-line has
(e.g. an offer whose `m=application` line was removed, leaving its `a=mid:1` under the audio
section) leaves a transceiver with no transport; `setRemoteDescription` succeeds, the answer
then fails, and the connect task aiortc started meanwhile dies with an AttributeError that
nobody retrieves ("Task exception was never retrieved" in the log). `check_offer` refuses such
offers with `invalid_offer` first; `PeerConnection` keeps any connect failure that still
slips through out of the log as a traceback (the call is refused or ends on its own).
"""

from __future__ import annotations

import logging
from collections import Counter

from aiortc import RTCPeerConnection
from aiortc.sdp import SessionDescription

log = logging.getLogger("session_server.webrtc")


class OfferError(ValueError):
    """The offer cannot be answered (bad SDP). The HTTP route turns it into a 400."""

    def __init__(self, message: str, code: str = "invalid_offer"):
        super().__init__(message)
        self.message = message
        self.code = code


def check_offer(sdp: str) -> None:
    """Refuse an offer whose media sections and BUNDLE groups do not agree."""
    try:
        description = SessionDescription.parse(sdp)
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError/IndexError/... on bad lines
        raise OfferError(f"The SDP offer could not be parsed: {type(exc).__name__}: {exc}") from None
    mids = [media.rtp.muxId for media in description.media if media.rtp.muxId]
    repeated = sorted(mid for mid, count in Counter(mids).items() if count > 1)
    if repeated:
        raise OfferError(f"The SDP offer gives the mid {repeated[0]!r} to more than one m-line.")
    for group in description.group:
        if group.semantic != "BUNDLE":
            continue
        for mid in group.items:
            if mid not in mids:
                raise OfferError(f"The SDP offer's BUNDLE group names the mid {mid!r}, which no m-line has.")


class PeerConnection(RTCPeerConnection):
    """RTCPeerConnection whose background connect task never dies unretrieved.

    aiortc starts `__connect` with `ensure_future` and keeps no handle on it, so its exception
    would only be reported by the garbage collector, as a traceback. Here it is logged as one
    line; the connection then never connects and the call ends by `connect_timeout` (or it was
    refused already).
    """

    async def _RTCPeerConnection__connect(self) -> None:  # overrides aiortc's private, name-mangled method
        try:
            await super()._RTCPeerConnection__connect()
        except Exception as exc:  # noqa: BLE001 - anything here is a broken offer, not a server fault
            log.info("peer connection could not connect: %s: %s", type(exc).__name__, exc)
