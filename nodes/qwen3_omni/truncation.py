"""Which items leave the model's context when the conversation would not fit it (pure policy).

The thinker's context is the instructions (system prompt with the tool definitions) and then the
conversation, one segment per item (nodes/qwen3_omni/thinker_history.py). Before a turn goes in
(or right after a reply, in the user's pause: `ahead`), the thinker asks `items_to_drop` how many
of the OLDEST conversation items must leave so that the incoming turn and the room its reply
needs fit; the KV is then rebuilt once from the first kept item (one re-prefill of what stays).

Rules, whatever the mode:
- the instructions are never dropped (they are not among `items`);
- a function call and its output leave together: an item marked `pairs_with_previous` (a
  function output) never stays when the item before it leaves;
- the last `keep_last` items never leave (the turn in progress and a reply being made);
- when even dropping every droppable item would not make the turn fit, nothing is dropped (the
  turn then fails with `context_exhausted`, as under `disabled`).

Modes (graph/messages.py `Truncation`, the GA `session.truncation`):
- `auto`: once the conversation + incoming would not fit the context, drop the oldest items until
  it fits twice over (room for the incoming turn and as much again), or, where that cannot be
  reached, until it fits once. A truncation re-prefills everything that stays, so dropping only
  what this turn needs would rebuild the whole context at every turn of a full session; the
  headroom of one more turn and its reply's reserve spaces truncations out (GA leaves how many
  items `auto` drops to the server; `retention_ratio` sets the share explicitly);
- `disabled`: drop nothing;
- `retention_ratio` r with `post_instructions` n (None: the context less the instructions): once
  conversation + incoming passes n (or would not fit the context), drop oldest items until
  conversation + incoming <= r * n; a truncation then frees (1 - r) of the limit at once, so the
  next turns append to a cached prefix instead of each dropping one item and re-prefilling all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graph.messages import Truncation


@dataclass(frozen=True)
class Item:
    """One conversation item as the policy sees it: its tokens in the context, and whether it is a
    function output that must leave with the item before it (the call)."""

    tokens: int
    pairs_with_previous: bool = False


def items_to_drop(items: Sequence[Item], mode: Truncation, *, instructions: int, incoming: int, context: int,
                  keep_last: int = 0) -> int:
    """How many of the oldest `items` leave the context before `incoming` more tokens go in (see
    the module docstring). `instructions`: the tokens before the conversation; `context`: the
    model's context length for this session."""
    conversation = sum(item.tokens for item in items)
    room = context - instructions  # what the conversation and the incoming turn may take
    if mode.type == "disabled":
        return 0
    if mode.type == "retention_ratio":
        limit = min(room, mode.post_instructions) if mode.post_instructions else room
        if conversation + incoming <= limit:
            return 0
        targets = [int(mode.retention_ratio * limit)]
    else:
        if conversation + incoming <= room:
            return 0
        targets = [room - incoming, room]  # twice over where it can be, else once
    droppable = max(0, len(items) - keep_last)
    for target in targets:
        dropped, left = _drop_until(items, conversation, droppable, incoming, target)
        if left + incoming <= target:
            return dropped
    if left + incoming > room:
        return 0  # it cannot fit even so: nothing leaves, the turn fails as `disabled` would
    return dropped


def _drop_until(items: Sequence[Item], conversation: int, droppable: int, incoming: int, target: int) -> tuple[int, int]:
    """The oldest items dropped until the rest + `incoming` <= `target` (or none droppable is
    left), a call never without its output: (items dropped, tokens left of `conversation`)."""
    dropped, left = 0, conversation
    while dropped < droppable and left + incoming > target:
        left -= items[dropped].tokens
        dropped += 1
        while dropped < droppable and items[dropped].pairs_with_previous:  # the call's output goes too
            left -= items[dropped].tokens
            dropped += 1
    while 0 < dropped < len(items) and items[dropped].pairs_with_previous:
        dropped -= 1  # `keep_last` keeps an output: its call stays with it
        left += items[dropped].tokens
    return dropped, left
