"""A thinker session's history as segments of its context, so that it can be edited and rebuilt.

A `ThinkerSession`'s context (the tokens in its KV row) is the concatenation of its segments:
- the system prompt (`Segment.system`), first, when the session was given one (`system_ids`);
- one segment per turn, named by its history key (the item id; for a reply turn, the reply's
  response id), from the turn's first token up to the next segment's: a reply's tokens and its
  closing belong to the turn that asked for the reply. The closing of the last reply, while it
  waits in `ThinkerSession.pending`, belongs to the last segment.

Each segment keeps what a re-prefill needs besides its token ids (which the context holds): the
turn's encoder outputs (`MEDIA_KEYS`: audio/image embeddings, deepstack features, grids), and
what the talker needs of it (its `TalkerUserPart`s, whose hidden states come from its last
prefill). They cost the turn's multimodal positions x the thinker's hidden size (plus deepstack
levels for images) per session, next to the KV of the same positions, which is many times more.

An edit (a new system prompt, an item deleted, an item inserted before the end) keeps the KV up
to the first changed position and re-prefills everything after it (`ThinkerSession`'s
`system_prompt_work`, `delete_work`, `prefill_work(insert_after=...)`). Rotary positions are
per segment (`get_rope_index` on its own tokens, shifted to follow the previous one), which is
what a fresh session fed the same conversation computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# The encoder outputs of a turn that its re-prefill needs (besides its token ids).
MEDIA_KEYS = ("audio_embeds", "image_embeds", "image_deepstack", "image_grid_thw", "audio_feature_lengths")


@dataclass(eq=False)
class Segment:
    key: str | None  # the history key (None: a turn nobody will name)
    start: int  # index of its first token in the context
    media: dict[str, Any] = field(default_factory=dict)
    user_parts: list[Any] = field(default_factory=list)  # TalkerUserPart, from its last prefill
    system: bool = False
    # A function output: it leaves the context with the item before it, its call (truncation.py).
    pairs_with_previous: bool = False


@dataclass
class TalkerView:
    """The whole history as the talker needs it after a rebuild (the talker restarts from it)."""

    user_parts: list[Any]
    image_grid_thw: torch.Tensor | None
    audio_feature_lengths: torch.Tensor | None
    # The context from its last `<|im_start|>` on (the talker reads an open assistant header there).
    tail_ids: list[int]


def turn_media(turn: dict[str, Any]) -> dict[str, Any]:
    return {key: turn[key] for key in MEDIA_KEYS if turn.get(key) is not None}


class History:
    """The segments of one session's context, in order (see the module docstring)."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def system(self) -> Segment | None:
        return self.segments[0] if self.segments and self.segments[0].system else None

    def end(self, index: int, context_length: int) -> int:
        following = index + 1
        return self.segments[following].start if following < len(self.segments) else context_length

    def index_of(self, key: str) -> int | None:
        return next((i for i, s in enumerate(self.segments) if s.key == key and not s.system), None)

    def rename(self, key: str, new_key: str) -> bool:
        """The turn named `key` is named `new_key` from now on (an early prefill's private key
        becomes the committed item's id); False when the history holds no such turn."""
        index = self.index_of(key)
        if index is None:
            return False
        self.segments[index].key = new_key
        return True

    def insertion_index(self, after: list[str]) -> int:
        """Where an item goes that follows the items `after` (history keys, nearest first): after
        the first of them the history holds; at the start, after the system prompt, if none."""
        for key in after:
            index = self.index_of(key)
            if index is not None:
                return index + 1
        return 1 if self.system is not None else 0

    def conversation(self, context_length: int) -> list[tuple[int, int]]:
        """(segment index, its tokens) of every segment after the system prompt, oldest first."""
        first = 1 if self.system is not None else 0
        return [(i, self.end(i, context_length) - self.segments[i].start) for i in range(first, len(self.segments))]

    def containing(self, position: int) -> Segment | None:
        """The segment that holds context position `position`."""
        return next((s for s in reversed(self.segments) if s.start <= position), None)

    def forget_from(self, length: int) -> None:
        """The context was cropped to `length` tokens: segments that started at or after it are gone."""
        while self.segments and self.segments[-1].start >= length:
            self.segments.pop()

    def talker_view(self, context_ids: list[int], im_start: int) -> TalkerView:
        parts = [part for segment in self.segments for part in segment.user_parts]
        grids = [s.media["image_grid_thw"] for s in self.segments if "image_grid_thw" in s.media]
        lengths = [s.media["audio_feature_lengths"] for s in self.segments if "audio_feature_lengths" in s.media]
        last = next((i for i in range(len(context_ids) - 1, -1, -1) if context_ids[i] == im_start), len(context_ids))
        return TalkerView(
            user_parts=parts,
            image_grid_thw=torch.cat([g.cpu() for g in grids]) if grids else None,
            audio_feature_lengths=torch.cat([a.cpu() for a in lengths]) if lengths else None,
            tail_ids=list(context_ids[last:]),
        )
