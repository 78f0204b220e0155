"""The replies a session's graph is working on: the one ledger of a reply's lifecycle in the graph.

A reply is open from the `Turn` that asks for it (`Turn.reply`; an early prefill's provisional
reply is not asked for yet) to its `TurnDone` leaving the graph, or to that `Turn` being dropped
by an interrupt before any node saw it; a reply is known by its turn id and response id, which
its `TurnDone` carries (the thinker's contract: exactly one per reply, nodes/thinker.py).
`GraphSession` keeps the ledger (it sees both ends); the dialog reads it to bound queued replies
and for turn-taking, the runtime for idle timeouts and draining. The transport keeps its own state of each response (the wire's events), but tells the
graph nothing about a reply's end: the graph knows it first.

A cancel can overtake the request it names (a control overtakes queued commands): a
`response.cancel` for a reply whose `CreateResponse` has not reached the dialog yet. The ledger
remembers such ids, so the dialog never asks for that reply.
"""

from __future__ import annotations

import asyncio
from collections import deque

from graph.messages import Interrupt

# Cancels of replies not asked for yet, remembered (a client may cancel ids that never come).
CANCELS_KEPT = 64


class Replies:
    def __init__(self) -> None:
        self._open: dict[tuple[int, str], None] = {}  # (turn_id, response_id), in request order
        self._cancelled_ahead: deque[str] = deque(maxlen=CANCELS_KEPT)
        self._all_ended = asyncio.Event()
        self._all_ended.set()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, response_id: str) -> bool:
        return any(key[1] == response_id for key in self._open)

    def asked(self, turn_id: int, response_id: str) -> None:
        self._open[(turn_id, response_id)] = None
        self._all_ended.clear()

    def ended(self, turn_id: int, response_id: str) -> None:
        """Its `TurnDone` left the graph, or its request was dropped before a node took it."""
        self._open.pop((turn_id, response_id), None)
        if not self._open:
            self._all_ended.set()

    def interrupted(self, control: Interrupt) -> None:
        if control.response_id and control.response_id not in self:
            self._cancelled_ahead.append(control.response_id)

    def cancelled_ahead(self, response_id: str) -> bool:
        """Whether the reply was cancelled before it was asked for (then it never is): answers
        once per cancel."""
        if response_id in self._cancelled_ahead:
            self._cancelled_ahead.remove(response_id)
            return True
        return False

    def close(self) -> None:
        """The session ended: nothing is open any more."""
        self._open.clear()
        self._all_ended.set()

    async def wait_all_ended(self) -> None:
        await self._all_ended.wait()
