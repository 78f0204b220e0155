"""The engine link's frames: what rides together, and what waits how long."""

from __future__ import annotations

import asyncio
import socket

from graph.wire import CREDIT, CREDIT_DELAY_MIN_WINDOW, CREDIT_DELAY_S, Link, Op, Window, credit_delay_s


async def link_pair() -> tuple[Link, Link]:
    ours, theirs = socket.socketpair()
    return await Link.over(ours), await Link.over(theirs)


async def test_a_credit_waits_for_the_next_frame_and_rides_with_it():
    sender, receiver = await link_pair()
    sender.credit_delay_s = 30.0
    try:
        sender.credit(("sess_1", "audio"))
        sender.credit(("sess_1", "audio"))
        await asyncio.sleep(0.05)
        sender.send(Op.OUT, "sess_1", "a message")
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert records == [(Op.OUT, "sess_1", "a message"), (CREDIT, "", {("sess_1", "audio"): 2})]


async def test_a_credit_with_nothing_to_ride_with_goes_alone_after_the_delay():
    sender, receiver = await link_pair()
    sender.credit_delay_s = 0.01
    try:
        sender.credit("sess_1", 3)
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert records == [(CREDIT, "", {"sess_1": 3})]


async def test_a_credit_goes_at_once_where_windows_are_small():
    # The rule the engines and the server set their links by: only windows that hold at least
    # CREDIT_DELAY_MIN_WINDOW messages can wait for a frame to ride with.
    assert credit_delay_s(CREDIT_DELAY_MIN_WINDOW) == CREDIT_DELAY_S
    sender, receiver = await link_pair()
    sender.credit_delay_s = credit_delay_s(CREDIT_DELAY_MIN_WINDOW - 1)
    assert sender.credit_delay_s == 0.0
    try:
        sender.credit("sess_1")
        records = await asyncio.wait_for(receiver.receive(), 5)  # alone, at the end of this loop turn
    finally:
        sender.close()
        receiver.close()
    assert records == [(CREDIT, "", {"sess_1": 1})]


async def test_records_that_may_wait_go_in_one_frame_and_an_urgent_record_takes_them_along_in_order():
    sender, receiver = await link_pair()
    try:
        for n in range(3):
            sender.send(Op.SEND, "sess_1", ("audio", n), within_s=30.0)
            await asyncio.sleep(0.01)  # separate loop turns: each would otherwise be its own frame
        sender.send(Op.CONTROL, "sess_1", "interrupt")
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert records == [(Op.SEND, "sess_1", ("audio", 0)), (Op.SEND, "sess_1", ("audio", 1)),
                       (Op.SEND, "sess_1", ("audio", 2)), (Op.CONTROL, "sess_1", "interrupt")]


async def test_records_that_may_wait_go_by_their_deadline_with_nothing_else_sent():
    sender, receiver = await link_pair()
    try:
        sender.send(Op.SEND, "sess_1", ("audio", 0), within_s=0.01)
        await asyncio.sleep(0)
        sender.send(Op.SEND, "sess_2", ("audio", 0), within_s=0.01)
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert records == [(Op.SEND, "sess_1", ("audio", 0)), (Op.SEND, "sess_2", ("audio", 0))]


async def test_a_window_gives_room_without_waiting_only_while_it_has_some():
    window = Window(2)
    assert window.try_take() and window.try_take()
    assert not window.try_take()
    window.give(1)
    assert window.try_take()


async def test_a_record_with_a_shorter_wait_brings_a_pending_frame_forward():
    sender, receiver = await link_pair()
    sender.credit_delay_s = 30.0
    try:
        sender.credit("sess_1")  # may wait 30 s
        await asyncio.sleep(0.01)
        sender.send(Op.SEND, "sess_1", ("audio", 0), within_s=0.01)  # may wait 10 ms: the frame goes then
        sender.send(Op.SEND, "sess_1", ("audio", 1), within_s=20.0)  # a longer wait changes nothing
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert records == [(Op.SEND, "sess_1", ("audio", 0)), (Op.SEND, "sess_1", ("audio", 1)), (CREDIT, "", {"sess_1": 1})]


async def test_a_records_op_arrives_as_the_same_op_member():
    # Both ends dispatch with `op is Op.X`: an op must come back as the member, not an equal str.
    sender, receiver = await link_pair()
    try:
        for op in Op:
            sender.send(op, "sess_1")
        records = await asyncio.wait_for(receiver.receive(), 5)
    finally:
        sender.close()
        receiver.close()
    assert [record[0] for record in records] == list(Op)
    assert all(record[0] is op for record, op in zip(records, Op, strict=True))
