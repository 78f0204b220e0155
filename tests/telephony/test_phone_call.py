"""PhoneCall's way into the graph: each packet straight in when the graph has room, in order always."""

from __future__ import annotations

import asyncio

import numpy as np

from graph.messages import AudioChunk
from session_server.realtime.protocol import RealtimeProtocol
from session_server.telephony.phone_call import PhoneCall
from tests.conftest import until_true


class Graph:
    """A graph session whose input has `room` places; `send` waits until `admit` is set."""

    def __init__(self, room: int):
        self.room = room
        self.received: list[AudioChunk] = []
        self.admit = asyncio.Event()
        self.admit.set()
        self.ended = asyncio.Event()
        self.end_reason, self.error = None, None

    def send_nowait(self, input_name: str, message) -> bool:
        if self.room <= 0:
            return False
        self.room -= 1
        self.received.append(message)
        return True

    async def send(self, input_name: str, message) -> None:
        await self.admit.wait()
        self.received.append(message)

    async def outputs(self):
        await self.ended.wait()
        return
        yield

    def control(self, control) -> None:
        pass

    async def close(self, reason: str) -> None:
        self.ended.set()


class Wire:
    def send_audio(self, samples) -> None: ...
    def send_silence(self) -> None: ...
    def send_mark(self, name: str) -> None: ...
    def clear(self) -> None: ...
    async def hang_up(self, reason: str) -> None: ...


def started(graph: Graph) -> PhoneCall:
    call = PhoneCall("sip_test", RealtimeProtocol("sess_test", "model-x", audio_deltas=False), Wire(), "sip", media_timeout_s=30)
    call.start(graph)
    return call


def packet() -> np.ndarray:
    return np.zeros(160, np.float32)


def times(graph: Graph) -> list[float]:
    return [m.media_ms for m in graph.received if isinstance(m, AudioChunk)]


async def test_a_packet_reaches_the_graph_within_its_own_arrival_when_there_is_room():
    graph = Graph(room=10)
    call = started(graph)
    for n in range(3):
        call.receive_audio(packet(), 8000)
        assert len(times(graph)) == n + 1  # no await between: no hop through a task
    await call.close("test")


async def test_packets_that_find_no_room_wait_in_order_and_none_overtakes_them():
    graph = Graph(room=2)
    call = started(graph)
    graph.admit.clear()
    for _ in range(4):
        call.receive_audio(packet(), 8000)  # 2 straight in, 2 for the feeder, which waits for room
    graph.room = 10  # room again: still, the next packet queues behind those waiting
    call.receive_audio(packet(), 8000)
    assert times(graph) == [0.0, 20.0]
    graph.admit.set()
    await until_true(lambda: len(times(graph)) == 5, timeout=5, step=0.005)
    assert times(graph) == [0.0, 20.0, 40.0, 60.0, 80.0]
    await call.close("test")
