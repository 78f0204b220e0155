"""The bounded inbox between nodes: room, order of waiting producers, purge and close."""

from __future__ import annotations

import asyncio

import pytest

from graph.edges import Inbox, InboxClosed


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_put_nowait_takes_an_item_while_there_is_room_and_refuses_it_when_full():
    inbox: Inbox[int] = Inbox(2)
    assert inbox.put_nowait(1) and inbox.put_nowait(2)
    assert not inbox.put_nowait(3)
    assert [await inbox.get(), await inbox.get()] == [1, 2]
    assert len(inbox) == 0


async def test_put_nowait_wakes_a_waiting_reader():
    inbox: Inbox[str] = Inbox(1)
    reader = asyncio.create_task(inbox.get())
    await settle()
    assert inbox.put_nowait("hello")
    assert await asyncio.wait_for(reader, 5) == "hello"


async def test_waiting_producers_are_served_in_the_order_they_came_and_put_nowait_does_not_jump_them():
    inbox: Inbox[int] = Inbox(1)
    await inbox.put(0)
    producers = []
    for n in (1, 2, 3):
        producers.append(asyncio.create_task(inbox.put(n)))
        await settle()
    assert await inbox.get() == 0
    assert not inbox.put_nowait(99)  # producers are waiting: it would overtake them
    taken = [await asyncio.wait_for(inbox.get(), 5) for _ in range(3)]
    assert taken == [1, 2, 3]
    await asyncio.gather(*producers)


async def test_a_cancelled_producer_passes_its_turn_to_the_next_one():
    inbox: Inbox[int] = Inbox(1)
    await inbox.put(0)
    first = asyncio.create_task(inbox.put(1))
    second = asyncio.create_task(inbox.put(2))
    await settle()
    assert await inbox.get() == 0  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    await settle()
    assert await asyncio.wait_for(inbox.get(), 5) == 2
    await asyncio.wait_for(second, 5)
    assert first.cancelled()


async def test_a_purge_makes_room_for_waiting_producers():
    inbox: Inbox[int] = Inbox(2)
    await inbox.put(1)
    await inbox.put(2)
    producer = asyncio.create_task(inbox.put(3))
    await settle()
    assert inbox.purge(lambda n: n < 3) == [1, 2]
    await asyncio.wait_for(producer, 5)
    assert await inbox.get() == 3


async def test_close_wakes_readers_and_producers_and_queued_items_can_still_be_taken():
    inbox: Inbox[int] = Inbox(1)
    await inbox.put(1)
    producer = asyncio.create_task(inbox.put(2))
    await settle()
    inbox.close()
    with pytest.raises(InboxClosed):
        await asyncio.wait_for(producer, 5)
    assert await inbox.get() == 1
    with pytest.raises(InboxClosed):
        await inbox.get()
    with pytest.raises(InboxClosed):
        inbox.put_nowait(3)
