"""The link between the server process and an engine process: batched records over a socket.

A record is a small tuple, `(op, session_id, payload)`: `op` an `Op` (what the record is; each
member says which way it goes and what its payload holds), the payload a graph message or plain
data. Records written during one turn of the event loop go out as one frame (a 4-byte
length, then a pickle of the list), so a burst of audio appends from many sessions costs one
write and one read, not one per message. A record sent `within_s` (the server's audio appends)
and credit may wait that long for the next frame: each frame is also a wake-up of the process
at the other end.

Flow control is per stream of messages and counted in messages: `credit(key)` tallies a
message the receiver has taken off its hands (key: a session id for its outputs, or (session
id, input) for one of its inputs), and the tallies ride out with the next frame as one
`("credit", "", {key: n})` record. A sender keeps at most a `Window` of messages in flight
per stream, so neither side's buffers grow with a slow reader.

Pickle, not a schema codec: both ends are this program (the engine is our own child process),
and graph messages carry numpy arrays and nested msgspec structs (`CreateResponse.reply` is a
`ReplyParams`) that must arrive as the same types. Protocol 5 pickles arrays without copies.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Hashable
from enum import StrEnum
from typing import Any


class Op(StrEnum):
    """What a record is. Server -> engine: START, OPEN, SEND, CONTROL, CLOSE, DRAIN; engine ->
    server: READY, FAILED, OPENED, REJECTED, OUT, ENDED, STATS, DRAINED; CREDIT both ways."""

    START = "start"  # {"profile", "device"}: build the runtime (the first record)
    READY = "ready"  # {"resources", "kv_rows"}: the runtime is up
    FAILED = "failed"  # "Type: message": the runtime could not start
    OPEN = "open"  # (kind, config, inputs, output_window): open a session
    OPENED = "opened"  # None: it is open
    REJECTED = "rejected"  # (code, message): it was refused
    SEND = "send"  # (input name, message): a message to one of the session's inputs
    CONTROL = "control"  # a Control: it overtakes the session's queued data
    CLOSE = "close"  # reason: close the session
    OUT = "out"  # a message from one of the session's outputs
    ENDED = "ended"  # (end reason, error): the session ended
    STATS = "stats"  # {"queue_depths", "node_steps", "load", ...}: the engine's periodic numbers
    DRAIN = "drain"  # grace_s: end every session within it
    DRAINED = "drained"  # None: every session has ended
    CREDIT = "credit"  # {key: n}: that many messages of a stream were taken (flow control)


Record = tuple[Op, str, Any]

_LENGTH = struct.Struct("!I")
CREDIT = Op.CREDIT
# The longest a credit waits for a frame to ride with, where every window holds at least
# CREDIT_DELAY_MIN_WINDOW messages (the default windows: 64 inputs = 1.3 s of 20 ms audio, 512
# outputs), so the sender never waits on it. Smaller windows get their credit at once.
CREDIT_DELAY_S = 0.02
CREDIT_DELAY_MIN_WINDOW = 16


def credit_delay_s(smallest_window: int) -> float:
    return CREDIT_DELAY_S if smallest_window >= CREDIT_DELAY_MIN_WINDOW else 0.0


class Window:
    """At most `size` messages in flight; `take` waits for room, `give` returns it."""

    def __init__(self, size: int):
        self._free = size
        self._room = asyncio.Event()
        self._room.set()

    async def take(self) -> None:
        while self._free <= 0:
            self._room.clear()
            await self._room.wait()
        self._free -= 1

    def try_take(self) -> bool:
        """`take` if there is room now; False (nothing taken) if not."""
        if self._free <= 0:
            return False
        self._free -= 1
        return True

    def give(self, n: int) -> None:
        self._free += n
        if self._free > 0:
            self._room.set()

    def open_wide(self) -> None:
        """No more limit (the other end is going away and will not return credit; waiters wake)."""
        self.give(1 << 30)


class LinkClosed(Exception):
    """The other end went away (its process ended or closed the socket)."""


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._pending: list[Record] = []
        self._credits: dict[Hashable, int] = {}
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None  # a deferred flush (see `flush_within`)
        self._timer_within = 0.0  # the wait it was armed with
        self.credit_delay_s = 0.0  # see credit(); set by the owner from its windows
        self.closed = False

    @classmethod
    async def over(cls, sock: Any) -> Link:
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**26)
        return cls(reader, writer)

    def send(self, op: Op, session_id: str = "", payload: Any = None, within_s: float = 0.0) -> None:
        """Queue a record; it is written with everything else queued in this loop turn, or, with
        `within_s`, at the latest that much later (it rides with any earlier frame)."""
        if self.closed:
            return
        self._pending.append((op, session_id, payload))
        self.flush_within(within_s)

    def credit(self, key: Hashable, n: int = 1) -> None:
        """Tell the other end that `n` more messages of this stream were taken.

        Credit rides with the next frame, or goes alone after at most `credit_delay_s`: a
        frame per credit (a write, a read and a wake-up of the other process) would cost more
        than the audio chunk it returns."""
        if self.closed:
            return
        self._credits[key] = self._credits.get(key, 0) + n
        self.flush_within(self.credit_delay_s)

    def flush_within(self, within_s: float) -> None:
        """Flush within `within_s` (0: at the end of this loop turn)."""
        if self._flush_scheduled:
            return
        if within_s <= 0:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
            return
        if self._timer is not None and within_s >= self._timer_within:
            return  # armed earlier with no longer a wait: it fires before this deadline (every append)
        loop = asyncio.get_running_loop()
        if self._timer is None or self._timer.when() > loop.time() + within_s:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_later(within_s, self._flush)
            self._timer_within = within_s

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._credits:
            self._pending.append((CREDIT, "", self._credits))
            self._credits = {}
        if not self._pending or self.closed:
            self._pending.clear()
            return
        frame = pickle.dumps(self._pending, protocol=5)
        self._pending = []
        self._writer.write(_LENGTH.pack(len(frame)) + frame)

    async def receive(self) -> list[Record]:
        """The records of the next frame; raises `LinkClosed` at the end of the stream."""
        try:
            header = await self._reader.readexactly(_LENGTH.size)
            frame = await self._reader.readexactly(_LENGTH.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.closed = True
            raise LinkClosed(str(exc)) from None
        return pickle.loads(frame)

    async def drain(self) -> None:
        """Wait until what was written has gone to the socket (after a final flush)."""
        self._flush()
        try:
            await self._writer.drain()
        except ConnectionError:
            self.closed = True

    def close(self) -> None:
        if not self.closed:
            self._flush()
            self.closed = True
        self._writer.close()
