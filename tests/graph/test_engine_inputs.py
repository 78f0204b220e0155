"""An engine's inputs: straight into the session's inbox when it has room, in order when not."""

from __future__ import annotations

import asyncio

from graph.engine_process import _Hosted
from tests.conftest import eventually
from tests.graph.ordered_sink import OrderedSink


class FakeLink:
    def __init__(self) -> None:
        self.credits: list = []

    def credit(self, key, n: int = 1) -> None:
        self.credits.append((key, n))

    def send(self, *record) -> None:
        pass


class FakeSession(OrderedSink):
    """A hosted session's inputs, and what its pump reads when it ends."""

    id = "sess_1"
    end_reason = "closed"
    error = None

    def __init__(self) -> None:
        super().__init__()
        self.ended = asyncio.Event()

    async def outputs(self):
        await self.ended.wait()
        return
        yield


async def test_inputs_go_straight_in_while_there_is_room_and_keep_their_order_once_one_had_to_wait():
    session, link = FakeSession(), FakeLink()
    hosted = _Hosted(session, link, output_window=8)
    try:
        hosted.queue("audio", 1)
        assert session.taken == [1] and session.direct == 1  # no feeder task involved
        session.full = True
        hosted.queue("audio", 2)  # waits in the feeder for room
        for _ in range(3):
            await asyncio.sleep(0)
        session.full = False  # room again, but message 2 is still on its way in
        hosted.queue("audio", 3)
        hosted.queue("audio", 4)
        session.room.set()
        await eventually(lambda: len(session.taken) == 4, "the feeder to pass messages 2 to 4 on")
        assert session.taken == [1, 2, 3, 4]
        assert link.credits == [(("sess_1", "audio"), 1)] * 4
        hosted.queue("audio", 5)  # the queue is empty again: straight in
        assert session.taken[-1] == 5 and session.direct == 2
    finally:
        session.ended.set()
        await asyncio.wait_for(hosted.pump, 5)
