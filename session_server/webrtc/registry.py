"""The live calls, so hangup can find one and shutdown can end them all."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # call.py needs aiortc, which is optional (availability.py)
    from session_server.webrtc.call import Call


class CallRegistry:
    def __init__(self) -> None:
        self._calls: dict[str, Call] = {}

    def add(self, call: Call) -> None:
        self._calls[call.id] = call

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def forget(self, call: Call) -> None:
        if self._calls.get(call.id) is call:
            del self._calls[call.id]

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self):
        return iter(list(self._calls.values()))

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(call.close(reason) for call in list(self._calls.values())), return_exceptions=True)
