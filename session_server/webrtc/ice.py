"""ICE for the server's peer connections: the configuration, and the host-candidate policy.

aiortc gathers candidates when the answer is set as local description (no trickle: the SDP
answer carries every candidate). aioice's host gathering leaves 127.0.0.1 out, so the
`loopback` policy substitutes the address list per connection (never a process-wide patch):
the hook `get_component_candidates(component, addresses)` of each connection is wrapped to
receive the addresses the policy picks. Remote candidates are filtered from the offer's SDP.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

from session_server.webrtc.config import WebRTCConfig

LOOPBACK_ADDRESS = "127.0.0.1"
_CANDIDATE_LINE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ typ \S+", re.IGNORECASE)


def rtc_configuration(config: WebRTCConfig) -> RTCConfiguration:
    # An explicit (possibly empty) list: aiortc falls back to a public STUN server when given None.
    return RTCConfiguration(iceServers=[RTCIceServer(list(s.urls), s.username, s.credential) for s in config.ice_servers])


def host_addresses(policy: str, gathered: Iterable[str]) -> list[str]:
    """The host addresses to bind for `policy`, from the ones aioice gathered."""
    gathered = list(gathered)
    if policy == "loopback":
        return [LOOPBACK_ADDRESS]
    if policy == "host+loopback":
        return [*gathered, LOOPBACK_ADDRESS] if LOOPBACK_ADDRESS not in gathered else gathered
    return gathered


def apply_candidate_policy(pc: RTCPeerConnection, policy: str) -> None:
    """Make every ICE connection of `pc` gather host candidates on the policy's addresses.

    Call after setRemoteDescription (which creates the transports) and before
    setLocalDescription (which gathers).
    """
    if policy == "host":
        return
    for gatherer in _ice_gatherers(pc):
        connection = gatherer._connection  # aiortc keeps the aioice Connection here
        if getattr(connection, "_sgl_candidate_policy", None) == policy:
            continue
        gather_component = connection.get_component_candidates

        async def with_policy(component: int, addresses: list[str], timeout: int = 5, _gather=gather_component):
            return await _gather(component=component, addresses=host_addresses(policy, addresses), timeout=timeout)

        connection.get_component_candidates = with_policy
        connection._sgl_candidate_policy = policy


def _ice_gatherers(pc: RTCPeerConnection) -> list:
    gatherers = []
    transports = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    for dtls in transports:
        if dtls is not None and dtls.transport.iceGatherer not in gatherers:
            gatherers.append(dtls.transport.iceGatherer)
    return gatherers


def filter_remote_candidates(sdp: str, policy: str) -> str:
    """Drop the offer's non-loopback candidates under the `loopback` policy (else unchanged)."""
    if policy != "loopback":
        return sdp
    lines = sdp.splitlines()
    kept = [line for line in lines if not ((m := _CANDIDATE_LINE.match(line)) and not _is_loopback(m.group(1)))]
    if len(kept) != len(lines):
        # Without the dropped candidates the offer may hold none: keep ICE open for
        # peer-reflexive discovery instead of failing at once on "end of candidates".
        kept = [line for line in kept if line.strip() != "a=end-of-candidates"]
    return "\r\n".join(kept) + "\r\n"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # mDNS names (*.local) and anything unresolvable
