"""InboundOrder: a SIP call's inbound RTP in sequence order, each packet out as soon as it can be."""

from __future__ import annotations

from aiortp.packet import RtpPacket

from session_server.telephony import rtp_order
from session_server.telephony.rtp_order import InboundOrder


def packet(seq: int) -> RtpPacket:
    return RtpPacket(payload_type=0, sequence_number=seq % 65536, timestamp=(seq * 160) % 2**32, payload=bytes([seq % 256]) * 160)


class Heard:
    """What the session hears: (first payload byte, packets concealed before it), in order."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int]] = []
        self.order = InboundOrder(lambda frame: self.frames.append((frame.data[0], frame.lost)))

    def add(self, *seqs: int) -> list[tuple[int, int]]:
        before = len(self.frames)
        for seq in seqs:
            self.order.add(packet(seq))
        return self.frames[before:]


def test_a_packet_in_order_goes_out_at_once_from_the_first():
    heard = Heard()
    for seq in range(100, 110):
        assert heard.add(seq) == [(seq % 256, 0)]  # nothing held behind it: out on its own arrival


def test_a_reordered_packet_is_waited_for_and_the_ones_behind_it_follow_it_in_order():
    heard = Heard()
    heard.add(1, 2)
    assert heard.add(4) == []  # 3 is missing: 4 waits
    assert heard.add(3) == [(3, 0), (4, 0)]
    assert heard.add(5) == [(5, 0)]


def test_a_lost_packet_is_given_up_after_wait_later_packets_and_concealed_before_the_next():
    heard = Heard()
    heard.add(1)
    wait = heard.order.wait
    assert heard.add(*range(3, 3 + wait)) == []  # up to `wait` packets wait for 2
    assert heard.add(3 + wait) == [(seq, 1 if seq == 3 else 0) for seq in range(3, 4 + wait)]
    assert heard.order.lost_packets == 1


def test_a_packet_that_arrives_after_it_was_given_up_is_dropped_and_deepens_the_wait():
    heard = Heard()
    heard.add(1)
    wait = heard.order.wait
    heard.add(*range(3, 4 + wait))  # 2 given up
    assert heard.add(2) == []  # too late: the packets after it have gone out
    assert heard.order.late_packets == 1 and heard.order.wait == wait + 1


def test_the_wait_comes_back_down_after_a_long_run_without_late_packets(monkeypatch):
    monkeypatch.setattr(rtp_order, "DECAY_PACKETS", 10)
    heard = Heard()
    heard.add(1)
    after = 4 + heard.order.wait
    heard.add(*range(3, after), 2)  # 2 late: the wait one deeper
    deeper = heard.order.wait
    heard.add(*range(after, after + 9))
    assert heard.order.wait == deeper  # 9 in a row since the late one: one short of DECAY_PACKETS
    heard.add(after + 9)
    assert heard.order.wait == deeper - 1


def test_telephone_events_take_their_sequence_numbers_without_counting_as_loss():
    heard = Heard()
    heard.add(1)
    heard.order.mark_non_media(2)
    heard.order.mark_non_media(3)
    assert heard.add(4) == [(4, 0)]
    assert heard.order.lost_packets == 0


def test_sequence_numbers_wrap_and_a_restarted_sender_is_followed():
    heard = Heard()
    assert [b for b, _ in heard.add(65534, 65535, 65536, 65537)] == [65534 % 256, 65535 % 256, 0, 1]
    assert heard.add(30000) == [(30000 % 256, 0)]  # a jump past MAX_JUMP: a new start, not a gap


def test_duplicates_are_heard_once():
    heard = Heard()
    assert heard.add(1, 1, 2, 2) == [(1, 0), (2, 0)]
