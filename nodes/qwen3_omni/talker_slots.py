"""Talker decode steps of many replies in one forward, on a slot cache (no re-packing per step).

The talker's prefill (a session's user turns + the 9-position assistant block) runs per reply on
its own `DynamicCache` (that cache is what `TalkerHistory` keeps between replies: the user
turns' KV). At its first decode step a reply JOINS the shared `SlotKVCache` (slot_cache.py): its
prefill KV is copied into a free row once. Every decode step after that writes one column into
that row, and the decode steps of all replies that are ready at once run as one forward over
their rows (4-D mask, rows of different lengths side by side). The reply gives its row back when
it finishes (or is garbage). Its `DynamicCache` is never extended by decode steps, so what the
history keeps is exactly the prefill's KV.

Before this, each batched step copied every reply's whole KV into a fresh left-padded
`DynamicCache` and the new column back: O(context) copies per reply per frame.

The forward runs the talker's decoder layers through `lean_layers.run_layer` (the same numbers
as `talker.model(...)`, without transformers' per-call wrappers) unless something hooks the
model. Same transformers coupling as the thinker's slot cache (`cache.update` + a 4-D mask passed
through): tests/model/test_talker.py's batched-vs-alone, test_lean_talker.py and
test_generate_equivalence.py guard it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from nodes.qwen3_omni.lean_layers import LeanStack, run_layer
from nodes.qwen3_omni.slot_cache import SlotBatch, SlotKVCache

if TYPE_CHECKING:
    from nodes.qwen3_omni.talker_engine import TalkerModel, TalkerReply


class TalkerSlots:
    """The talker's shared decode cache (one per talker model)."""

    _by_model: weakref.WeakKeyDictionary[Any, TalkerSlots] = weakref.WeakKeyDictionary()

    def __init__(self, talker: TalkerModel, slots: int = 4, capacity: int = 256):
        self.talker = talker
        weight = talker.talker.codec_head.weight
        self.cache = SlotKVCache.for_text_config(
            talker.talker.config.text_config, dtype=weight.dtype, device=weight.device, slots=slots, capacity=capacity
        )
        self.stack = LeanStack(talker.talker.model)
        self.forwards = 0

    @classmethod
    def for_model(cls, talker: TalkerModel) -> TalkerSlots:
        key = talker.talker
        slots = cls._by_model.get(key)
        if slots is None:
            slots = cls._by_model.setdefault(key, cls(talker))
        return slots

    def join(self, reply: TalkerReply) -> int:
        """Copy the reply's prefill KV into a free row; the row is the reply's until `leave`."""
        cache = self.cache
        with cache.lock:
            slot = cache.acquire()
            layers = reply._cache.layers
            cache.load(slot, [layer.keys for layer in layers], [layer.values for layer in layers])
        reply._slot = slot
        reply._slot_release = weakref.finalize(reply, cache.release, slot)
        return slot

    @staticmethod
    def leave(reply: TalkerReply) -> None:
        release = getattr(reply, "_slot_release", None)
        if release is not None:
            release()  # once; the row may go to another reply right after
        reply._slot = None
        reply._slot_release = None

    @torch.inference_mode()
    def forward(self, replies: list[TalkerReply], embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One talker decode forward of `embeds` [B, 1, D] for `replies` (each joins a row first if
        it has none) -> codec logits [B, vocab] (float32) and the talker's outputs [B, 1, D]; sets
        each reply's last hidden state and position."""
        for reply in replies:
            if getattr(reply, "_slot", None) is None:
                self.join(reply)
        positions = torch.cat([reply._last_position for reply in replies], dim=1) + 1  # [4, B, 1]
        with self.cache.lock:
            batch = self.cache.batch([reply._slot for reply in replies], 1)
            if self.stack.usable():
                hidden = self._lean_forward(embeds, positions, batch)
            else:
                out = self.talker.talker.model(
                    inputs_embeds=embeds, position_ids=positions, attention_mask=batch.mask, cache=batch, use_cache=True
                )
                hidden = out.last_hidden_state  # [B, 1, D]
            batch.commit()
        self.forwards += 1
        logits = self.talker.talker.codec_head(hidden)[:, -1, :].to(copy=True, dtype=torch.float32)
        for row, reply in enumerate(replies):
            reply._last_hidden = hidden[row : row + 1, -1:]
            reply._last_position = positions[:, row : row + 1, -1:]
        return logits, hidden

    def _lean_forward(self, embeds: torch.Tensor, positions: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
        """What `talker.model(inputs_embeds, position_ids [4, B, 1], attention_mask=batch.mask,
        cache=batch)` computes (the text row of the positions goes to attention, the 3 rope rows
        to the rotary; the 4-D mask is used as is), through `lean_layers.run_layer`."""
        stack = self.stack
        cos, sin = stack.model.rotary_emb.forward(embeds, positions[1:])
        attention = stack.attention()
        hidden = embeds
        for layer in stack.layers:
            hidden = run_layer(
                layer, hidden, cos, sin, batch.mask, batch.update, attention, position_ids=positions[0], use_cache=False
            )
        return stack.norm.forward(hidden)
