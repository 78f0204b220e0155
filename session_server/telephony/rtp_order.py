"""A SIP call's inbound RTP put back in sequence order, each packet out as soon as it can be.

    packet (any order) --add--> in order? --yes--> out at once (with the packets it unblocks)
                                          \\-no---> held until the missing one arrives, or until
                                                   `wait` later packets are in: then it is lost
                                                   (`lost` on the next frame: the session conceals it)

Why not a jitter buffer that plays out on a clock: what hears this audio is the session's VAD
and its model, not a loudspeaker. They take audio as it comes, so a packet that arrives in
order has nothing to wait for, and any depth held before it is latency the caller pays at the
end of every utterance (VAD hears the silence that ends the turn that much later). aiortp's
buffer, which this replaces, held 4 packets (80 ms) behind every one it let out.

Only a gap waits. `wait` (packets after a gap before it is given up) starts at `MIN_WAIT` and
adapts: a packet that arrives after it was given up makes `wait` one longer (up to `MAX_WAIT`),
since the network reorders that deep; `DECAY_PACKETS` packets in a row without one make it one
shorter again. The cost of a deeper `wait` is paid only at gaps, never on a steady stream.

RFC 4733 telephone-events share the audio's sequence space: `mark_non_media` fills their slot,
so they are never taken for loss. A jump of more than `MAX_JUMP` packets either way (a sender
that restarted its sequence) starts over from the new packet, as does `reset` (a new SSRC).

Not clocked: packets held behind a gap wait for later packets, so a sender that stops right
after a lost packet leaves the packets after it held until it sends again (a phone sends
20 ms of audio or silence every 20 ms, so this is the next packet).

The interface is aiortp's `JitterBuffer` (`add`, `mark_non_media`, `reset`), so `RTPSession`
keeps its stats, DTMF and concealment; frames leave through `deliver`, since one packet can
release several.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from aiortp.jitterbuffer import JitterFrame

MIN_WAIT = 2  # packets after a gap (40 ms of a steady stream) before the missing one is lost
MAX_WAIT = 8
DECAY_PACKETS = 500  # 10 s of packets without a late one: `wait` one shorter
MAX_JUMP = 1000  # sequence numbers: farther either way is a new start, not reordering
_NON_MEDIA = object()  # a slot a telephone-event took: neither audio nor loss


def _ahead(sequence_number: int, of: int) -> int:
    """How far `sequence_number` is past `of`, modulo 2**16, in -32768..32767."""
    return (sequence_number - of + 32768) % 65536 - 32768


class InboundOrder:
    def __init__(self, deliver: Callable[[JitterFrame], None]):
        self._deliver = deliver
        self._next: int | None = None  # the sequence number due next
        self._held: dict[int, Any] = {}  # sequence number -> RtpPacket or _NON_MEDIA, all past `_next`
        self._lost = 0  # given up since the last frame out
        self._given_up: deque[int] = deque(maxlen=4 * MAX_WAIT)  # recent sequence numbers given up (to notice them arriving late)
        self._in_a_row = 0
        self.wait = MIN_WAIT
        self.lost_packets = 0
        self.late_packets = 0  # arrived after they were given up (dropped)

    def add(self, packet: Any) -> tuple[bool, None]:
        self._place(packet.sequence_number, packet)
        return False, None  # frames left through `deliver`

    def mark_non_media(self, sequence_number: int) -> None:
        self._place(sequence_number, _NON_MEDIA)

    def reset(self) -> None:
        self._next = None
        self._held.clear()
        self._given_up.clear()
        self._lost = 0

    def _place(self, sequence_number: int, packet: Any) -> None:
        if self._next is None or abs(_ahead(sequence_number, self._next)) > MAX_JUMP:
            self.reset()
            self._next = sequence_number
        ahead = _ahead(sequence_number, self._next)
        if ahead < 0:  # already out, or given up
            if sequence_number in self._given_up:
                self._given_up.remove(sequence_number)
                self.late_packets += 1
                self.wait = min(MAX_WAIT, self.wait + 1)
                self._in_a_row = 0
            return
        self._held.setdefault(sequence_number, packet)
        self._release()

    def _release(self) -> None:
        while True:
            while self._next in self._held:
                self._out(self._held.pop(self._next))
            if len(self._held) <= self.wait:
                return
            # More than `wait` packets wait behind the gap at `_next`: it is lost.
            self._given_up.append(self._next)
            self._lost += 1
            self.lost_packets += 1
            self._next = (self._next + 1) % 65536

    def _out(self, packet: Any) -> None:
        self._next = (self._next + 1) % 65536  # type: ignore[operator]
        if packet is _NON_MEDIA:
            return
        self._in_a_row += 1
        if self._in_a_row >= DECAY_PACKETS:
            self._in_a_row = 0
            self.wait = max(MIN_WAIT, self.wait - 1)
        frame = JitterFrame(packet.payload, packet.timestamp, lost=self._lost)
        self._lost = 0
        self._deliver(frame)
