"""Every link's way into the graph (graph/session.py `GraphInputs`): straight in while there is room, in order after."""

from __future__ import annotations

import asyncio

from graph.session import GraphInputs
from session_server.realtime.protocol import RealtimeProtocol, SendToGraph
from session_server.realtime.websocket_link import RealtimeSettings, WebSocketLink
from tests.conftest import eventually
from tests.graph.ordered_sink import OrderedSink


async def test_appends_go_straight_to_the_graph_while_it_has_room_and_keep_their_order_once_one_waits():
    link = WebSocketLink(None, RealtimeProtocol("sess_1", "m"), RealtimeSettings())
    graph = link.graph = OrderedSink()
    feeder = asyncio.create_task(link.feeder())
    try:
        link.apply([SendToGraph(1)])
        assert graph.taken == [1] and graph.direct == 1
        graph.full = True
        link.apply([SendToGraph(2)])  # waits in the feeder for room
        for _ in range(3):
            await asyncio.sleep(0)
        graph.full = False  # room again, but 2 is still on its way in
        link.apply([SendToGraph(3), SendToGraph(4)])
        graph.room.set()
        await eventually(lambda: len(graph.taken) == 4, "the feeder to pass messages 2 to 4 on")
        assert graph.taken == [1, 2, 3, 4]
        link.apply([SendToGraph(5)])  # nothing queued any more: straight in
        assert graph.taken[-1] == 5 and graph.direct == 2
    finally:
        feeder.cancel()


def test_a_call_s_bounded_queue_refuses_an_input_past_its_limit_and_queues_nothing():
    inputs = GraphInputs(limit=2)  # a call's (call_link.py `MAX_PENDING_INPUTS`): past it the call ends
    graph = OrderedSink()
    graph.full = True
    assert inputs.put(graph, "audio", 1) and inputs.put(graph, "audio", 2)
    assert not inputs.put(graph, "audio", 3)
    assert len(inputs) == 2 and graph.taken == []
