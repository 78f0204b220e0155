"""A truncation's KV rebuild made ahead of need, in a spare row, off the turns' path.

A truncation keeps the KV up to the instructions and re-prefills every item that stays
(thinker_engine.py `drop_oldest_work`): on a full 32k context that is tens of thousands of tokens,
seconds to tens of seconds on CPU, on the path of the turn that needed the room. Instead, once a
session's context is a few turns from needing a truncation, the thinker (nodes/thinker.py) plans
it (`plan_ahead`: which oldest items will leave, by the same policy, truncation.py) and builds the
context as it will be in a second KV row of the shared slot cache, the spare: the instructions'
KV copied from the session's row, then the kept items re-prefilled in small chunks (by the
rebuild's own `ThinkerSession._refeed`, into the spare), each chunk its own unit at idle priority
(`build`), so that any live work goes first. Turns go on meanwhile in the session's own row, and
once the planned items are in, the build follows them: after each reply the items completed
since (`since_built`) go into the spare too, at the same priority.

When the truncation is needed (where it would be made in place: right after a reply, or before
a turn that needs the room, which then waits for the rest of the build, at live priority and
in the usual prefill chunks: nodes/thinker.py `_adopt`), `adopt_work` makes the
spare the session's row, between turns (never during a reply): the items the spare holds are
compared with the session's history, segment by segment (the same segment, the same token ids),
and what differs or came since the plan (the last reply, its closing, the turns since) is
prefilled into the spare at the caller's priority, the short catch-up; then the rows swap and
the old one is given back (`ThinkerSession.adopt_row`, which ends as a rebuild in place does).
The result is by construction what `drop_oldest_work` makes (the instructions, then every item
from the first kept one on, each re-prefilled as a fresh session would:
tests/model/test_spare_row.py), so usage and `cached_tokens` are what they are after any
truncation. A plan the history has overtaken (its first kept item deleted, the instructions
changed) is not adopted; the spare is given back and the truncation is made in place as before.

One spare row per engine (the thinker node's), used by one session's build at a time; with
`kv_cache: preallocate` it is a row allocated at start beside the sessions' rows (admission
never counts it: `Thinker.kv_rows`), with a growing cache it is taken on demand.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from graph.executor import PRIORITY_IDLE
from nodes.qwen3_omni.thinker_history import Segment
from nodes.qwen3_omni.thinker_requests import Chunk, ThinkerError, Work

if TYPE_CHECKING:
    from graph.messages import Truncation
    from nodes.qwen3_omni.thinker_engine import ThinkerSession

# A build's prefill goes through the model in chunks this small: a live turn that arrives while
# one runs waits for at most one (the worker never preempts a unit).
SPARE_CHUNK_TOKENS = 64


@dataclass(eq=False)
class _Built:
    segment: Segment
    ids: list[int]
    start: int  # its first token's column in the spare row
    user_parts: list[Any] = field(default_factory=list)


class SpareRow:
    """One session's planned truncation and the spare KV row it is built in (see the module
    docstring). `_slot` is the row while the spare holds it (the batch function's owner check
    reads it); `ready` once every planned item is in it."""

    def __init__(self, session: ThinkerSession, first_kept: Segment,
                 planned: list[tuple[Segment, list[int]]], chunk_tokens: int = SPARE_CHUNK_TOKENS):
        self.session = session
        self.first_kept = first_kept  # the oldest item that stays
        self.planned = planned  # (segment, its ids) of the complete items that stay, at the plan
        self.chunk_tokens = chunk_tokens
        instructions = session.instructions_length
        self.instruction_ids = list(session.context_ids[:instructions])
        self.ids = list(self.instruction_ids)  # what the row holds
        self.positions_after = list(session._positions_after[:instructions])
        self.built: list[_Built] = []
        self.role: Any = session._role_after(self.ids, None)
        self.last_logits: torch.Tensor | None = None
        self.tokens = 0  # tokens prefilled into it, the catch-up's included
        self.busy_s = 0.0  # compute time of its units
        self.planned_at = time.perf_counter()
        self.priority = PRIORITY_IDLE  # raised when a turn waits for the rest
        self.ready = False
        self.closed = False
        # Set by the session before it waits for `settled` to adopt: no extension starts after it
        # (checked and `settled` cleared with no await between, so the two never overlap).
        self.adopting = False
        self.settled = asyncio.Event()  # no unit of it is queued or running (adoption waits for it)
        self.grown = asyncio.Event()  # the session's history grew: the build follows it
        self._slot: int | None = None
        self._release: weakref.finalize | None = None

    @property
    def next_position(self) -> int:
        return self.positions_after[-1] if self.positions_after else 0

    def row(self) -> int:
        if self._slot is None:
            raise ThinkerError("session_closed", "the spare row was given back")
        return self._slot

    @torch.inference_mode()  # the cache's buffers may be inference tensors: so is the copy
    def take_row(self) -> None:
        """The spare row, with the session's instructions copied into it (compute side)."""
        cache = self.session._runner.cache
        with cache.lock:
            if self.closed:
                raise ThinkerError("session_closed", "the spare row was given back")
            self._slot = cache.acquire()
            self._release = weakref.finalize(self, _give_back, cache, self._slot)
            cache.copy_prefix(self.session._row(), self._slot, len(self.instruction_ids))

    def append(self, ids: list[int], positions_after: list[int], logits: torch.Tensor) -> None:
        """`ids` were prefilled at the end of the row (`ThinkerSession._refeed(..., into=self)`),
        `positions_after` the next rotary position after each."""
        self.ids.extend(ids)
        self.positions_after.extend(positions_after)
        self.role = self.session._role_after(ids, self.role)
        self.last_logits = logits
        self.tokens += len(ids)

    def give_back(self) -> None:
        """The row goes back to the cache (a plan not adopted, a session closed); idempotent."""
        self.closed = True
        with self.session._runner.cache.lock:  # a forward on the row never sees it half given back
            self._slot = None
            if self._release is not None:
                self._release()
        self.grown.set()  # the build's loop ends

    def handed_over(self) -> int:
        """The row is the session's now: this spare no longer gives it back."""
        slot = self.row()
        if self._release is not None:
            self._release.detach()
        self._slot = self._release = None
        self.closed = True
        self.grown.set()  # the build's loop ends
        return slot


def _give_back(cache, slot: int) -> None:
    with cache.lock:
        cache.release(slot)


def plan_ahead(session: ThinkerSession, mode: Truncation, incoming: int, turn_tokens: int, *, turns: int,
               keep_last: int) -> SpareRow | None:
    """A spare for the truncation that the first of the next `turns` turns like the last
    (`turn_tokens` each, reply included) would make, `incoming` then needed and the last
    `keep_last` items kept (`ThinkerSession.truncation_plan(future=...)`); None when none of them
    would need one, or it would keep nothing."""
    if mode.type == "disabled":
        return None
    for ahead in range(1, turns + 1):
        count = session.truncation_plan(mode, incoming, keep_last=keep_last, future=(ahead, turn_tokens))
        if count > 0:
            return plan(session, count)
    return None


def plan(session: ThinkerSession, count: int, chunk_tokens: int = SPARE_CHUNK_TOKENS) -> SpareRow | None:
    """A spare for dropping the `count` oldest conversation items (`truncation_plan`); None when
    there is nothing to keep. The last item is planned only when complete (no reply running, no
    closing waiting): the adoption's catch-up prefills it."""
    conversation = session.history.conversation(session.context_length)
    if count <= 0 or count >= len(conversation):
        return None
    segments = session.history.segments
    first = conversation[count][0]
    last = len(segments) - (1 if session.pending or session.replying else 0)
    planned = [(segments[i], list(session.context_ids[segments[i].start : session.history.end(i, session.context_length)]))
               for i in range(first, last)]
    return SpareRow(session, segments[first], planned, chunk_tokens)


@torch.inference_mode()
def build_work(spare: SpareRow, items: list[tuple[Segment, list[int]]] | None = None) -> Work:
    """The planned items (or `items`) into the spare row, in its chunks (a generator of forward
    requests)."""
    for segment, ids in spare.planned if items is None else items:
        yield from _feed(spare, segment, ids)
    spare.ready = True


def since_built(spare: SpareRow) -> list[tuple[Segment, list[int]]]:
    """The session's complete items after the last one built, while what was built still matches
    its history (else none: the adoption's catch-up sorts it out)."""
    session = spare.session
    segments = session.history.segments
    index = next((i for i, s in enumerate(segments) if s is spare.first_kept), None)
    if index is None:
        return []
    length = session.context_length
    live = [(s, session.context_ids[s.start : session.history.end(i, length)]) for i, s in enumerate(segments) if i >= index]
    if len(live) <= len(spare.built) or any(b.segment is not s or b.ids != ids for b, (s, ids) in zip(spare.built, live)):
        return []
    complete = len(live) - (1 if session.pending or session.replying else 0)
    return [(s, list(ids)) for s, ids in live[len(spare.built) : complete]]


def _feed(spare: SpareRow, segment: Segment, ids: list[int]) -> Work:
    """One item into the spare row, as a rebuild in place re-prefills it (`ThinkerSession._refeed`)."""
    start = len(spare.ids)
    # An empty segment (a reply not begun): nothing to prefill.
    user_parts = (yield from spare.session._refeed(ids, segment.media, into=spare)) if ids else []
    spare.built.append(_Built(segment, list(ids), start, user_parts))


async def build(spare: SpareRow, compute: Any) -> None:
    """Run `build_work` one forward request per compute unit, at the spare's priority (idle until
    a turn waits for it); sets `done` when it ends, built or not."""
    runner = spare.session._runner
    work = build_work(spare)

    @torch.inference_mode()
    def unit(first: bool, answer: Any) -> Any:
        started = time.perf_counter()
        try:
            if first:
                spare.take_row()
                request = next(work)
            else:
                request = work.send(answer)
            assert isinstance(request, Chunk)  # a build only prefills
            return runner.forward_rows(request)
        except StopIteration:
            return _DONE
        finally:
            spare.busy_s += time.perf_counter() - started

    async def run(first: bool) -> None:
        answer: Any = None
        while not spare.closed:
            answer = await compute.run(unit, first, answer, priority=spare.priority)
            first = False
            if answer is _DONE:
                return

    try:
        await run(True)
        # Built: it follows the session's turns (at the same priority) until it is adopted.
        while not spare.closed:
            spare.settled.set()
            await spare.grown.wait()
            spare.grown.clear()
            items = since_built(spare)
            if items and not spare.closed and not spare.adopting:
                spare.settled.clear()
                work = build_work(spare, items)
                await run(False)
    except (ThinkerError, RuntimeError):  # given back meanwhile, or the pool stopped
        spare.give_back()
    except BaseException:
        spare.give_back()
        raise
    finally:
        work.close()
        spare.settled.set()


_DONE: Any = object()  # the build generator's end


@torch.inference_mode()
def adopt_work(spare: SpareRow) -> Work:
    """Make the built spare the session's row (see the module docstring) -> (items dropped,
    tokens the catch-up prefilled), or None when the history has overtaken the plan (the spare
    is then left to be given back). Never while a reply is being made."""
    session = spare.session
    assert not session.replying, "a reply in progress never changes rows"
    session._sync_row()
    segments = session.history.segments
    index = next((i for i, s in enumerate(segments) if s is spare.first_kept), None)
    conversation = session.history.conversation(session.context_length)
    if (not spare.ready or spare.closed or index is None or not conversation
            or session.context_ids[: session.instructions_length] != spare.instruction_ids):
        return None
    dropped = sum(1 for i, _ in conversation if i < index)
    spare.chunk_tokens = session.prefill_chunk_tokens  # the catch-up is live work: the usual chunks
    length = session.context_length
    live = [(s, session.context_ids[s.start : session.history.end(i, length)]) for i, s in enumerate(segments) if i >= index]
    same = 0
    while same < min(len(live), len(spare.built)) and spare.built[same].segment is live[same][0] \
            and spare.built[same].ids == live[same][1]:
        same += 1
    if same < len(spare.built):  # the row keeps what still matches
        keep = spare.built[same].start
        session._runner.cache.set_length(spare.row(), keep)
        del spare.ids[keep:], spare.positions_after[keep:], spare.built[same:]
        spare.role = session._role_after(spare.ids, None)
    before = spare.tokens
    for segment, ids in live[same:]:
        yield from _feed(spare, segment, ids)
    caught_up = spare.tokens - before
    session.adopt_row(spare, segments[: conversation[0][0]])
    return dropped, caught_up

