"""A stand-in for a graph session's inputs, to test the ways in that skip a queue."""

from __future__ import annotations

import asyncio


class OrderedSink:
    """Takes messages in order; `full` makes `send_nowait` refuse and `send` wait for `room`.
    `direct` counts the messages `send_nowait` took."""

    def __init__(self) -> None:
        self.taken: list = []
        self.full = False
        self.room = asyncio.Event()
        self.direct = 0

    def send_nowait(self, input_name: str, message) -> bool:
        if self.full:
            return False
        self.direct += 1
        self.taken.append(message)
        return True

    async def send(self, input_name: str, message) -> None:
        await self.room.wait()
        self.taken.append(message)
