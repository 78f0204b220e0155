"""Talker forwards of many replies at once, on a slot cache (no re-packing per step).

A reply's prefill (a session's user turns + the 9-position assistant block) ends up in its own
`DynamicCache` (that cache is what `TalkerHistory` keeps between replies: the user turns' KV).
A prefill that runs alone runs on that cache; the reply JOINS the shared `SlotKVCache`
(slot_cache.py) at its first decode step: its prefill KV is copied into a free row once.
Prefills that start together (`prefill`) join first, each with the KV it starts from (the
history's kept user turns, or nothing), and run as ONE forward over their rows, padded at their
ends (a position sees only the columns before it; each row's length counts its own positions);
each row's new columns are then appended to the reply's `DynamicCache`, so the history keeps
what it keeps after a prefill alone (to float rounding), and the row is already in place for
the decode steps. Every decode step writes one column into the reply's row, and the decode steps
of all replies that are ready at once run as one forward over their rows (4-D mask, rows of
different lengths side by side). The reply gives its row back when it finishes (or is garbage).
Its `DynamicCache` is never extended by decode steps, so what the history keeps is exactly the
prefill's KV. (Why one forward: turns that end together start their replies together;
docs/batching.md, rule 11, has the numbers' session.)

Before this, each batched step copied every reply's whole KV into a fresh left-padded
`DynamicCache` and the new column back: O(context) copies per reply per frame.

A decode step runs through `lean_decode.LeanTalkerDecode` (the thinker's lean layer loop: the
same numbers as `talker.model(...)` but for the dense experts' float rounding, within 1e-5), a
prefill group through `lean_layers.run_layer` (the same numbers to the bit), either without
transformers' per-call wrappers, unless something hooks the model. Same transformers coupling as
the thinker's slot cache (`cache.update` + a 4-D mask passed through): tests/model/test_talker.py's
batched-vs-alone (decode steps and prefills), test_lean_talker.py and test_generate_equivalence.py
guard it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.nn.utils.rnn import pad_sequence

from nodes.qwen3_omni.lean_decode import LeanTalkerDecode
from nodes.qwen3_omni.lean_layers import LeanStack, run_layer
from nodes.qwen3_omni.slot_cache import SlotBatch, SlotKVCache

if TYPE_CHECKING:
    from transformers.cache_utils import DynamicCache

    from nodes.qwen3_omni.talker_model import TalkerModel


class TalkerReply(Protocol):
    """What the slot cache reads and sets on a reply (talker_engine.py's `TalkerReply`; named
    here so that this module does not import the engine)."""

    talker: TalkerModel
    prefill_cache: DynamicCache | None
    slot: int | None
    slot_release: Any
    last_hidden: torch.Tensor | None
    last_position: torch.Tensor | None


class TalkerSlots:
    """The talker's shared slot cache for decode steps and prefill groups (one per talker model)."""

    _by_model: weakref.WeakKeyDictionary[Any, TalkerSlots] = weakref.WeakKeyDictionary()

    def __init__(self, talker: TalkerModel, slots: int = 4, capacity: int = 256, grow: bool = True):
        """`slots` x `capacity` positions now; with `grow`, more on demand (slot_cache.py)."""
        self.talker = talker
        weight = talker.talker.codec_head.weight
        self.cache = SlotKVCache.for_text_config(
            talker.talker.config.text_config, dtype=weight.dtype, device=weight.device, slots=slots, capacity=capacity,
            grow=grow,
        )
        self.stack = LeanStack(talker.talker.model)
        self.lean_decode = LeanTalkerDecode(talker.talker.model)
        self.forwards = 0

    @classmethod
    def for_model(cls, talker: TalkerModel, **sizes: Any) -> TalkerSlots:
        """The slot cache shared by every reply of this talker; `sizes` (slots, capacity, grow)
        apply when this call creates it (the talker node's start, nodes/talker.py)."""
        key = talker.talker
        slots = cls._by_model.get(key)
        if slots is None:
            slots = cls._by_model.setdefault(key, cls(talker, **sizes))
        return slots

    def join(self, reply: TalkerReply, kv: DynamicCache | None = None) -> int:
        """Copy `kv` (default: the reply's prefill KV; empty: nothing) into a free row; the row is the
        reply's until `leave`."""
        cache = self.cache
        kv = reply.prefill_cache if kv is None else kv
        with cache.lock:
            slot = cache.acquire()
            if kv.get_seq_length():
                layers = kv.layers
                cache.load(slot, [layer.keys for layer in layers], [layer.values for layer in layers])
        reply.slot = slot
        reply.slot_release = weakref.finalize(reply, cache.release, slot)
        return slot

    @staticmethod
    def leave(reply: TalkerReply) -> None:
        release = getattr(reply, "slot_release", None)
        if release is not None:
            release()  # once; the row may go to another reply right after
        reply.slot = None
        reply.slot_release = None

    @torch.inference_mode()
    def forward(
        self,
        replies: list[TalkerReply],
        embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        lengths: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One talker forward of `embeds` [B, q, D] for `replies` (each joins a row first if it has
        none) -> codec logits [B, vocab] (float32) and the talker's outputs [B, 1, D] at each row's
        last position; sets each reply's last hidden state and position. A decode step (the
        default): one position per reply, its next one. A prefill group passes `positions`
        [4, B, q] and each row's real `lengths` (rows padded at their ends)."""
        for reply in replies:
            if getattr(reply, "slot", None) is None:
                self.join(reply)
        decode = positions is None
        if decode:
            positions = torch.cat([reply.last_position for reply in replies], dim=1) + 1  # [4, B, 1]
        with self.cache.lock:
            batch = self.cache.batch([reply.slot for reply in replies], embeds.shape[1])
            if decode and self.lean_decode.usable():
                hidden = self.lean_decode(embeds[:, 0], positions, batch)[:, None]
            elif self.stack.usable():
                hidden = self._lean_forward(embeds, positions, batch)
            else:
                out = self.talker.talker.model(
                    inputs_embeds=embeds, position_ids=positions, attention_mask=batch.mask, cache=batch, use_cache=True
                )
                hidden = out.last_hidden_state  # [B, q, D]
            batch.commit(lengths)
        self.forwards += 1
        if lengths is not None:  # each row's last real position
            last = torch.tensor(lengths, device=hidden.device) - 1
            rows = torch.arange(len(replies), device=hidden.device)
            hidden, positions = hidden[rows, last].unsqueeze(1), positions[:, rows, last].unsqueeze(-1)
        logits = self.talker.talker.codec_head(hidden)[:, -1, :].to(copy=True, dtype=torch.float32)
        for row, reply in enumerate(replies):
            reply.last_hidden = hidden[row : row + 1, -1:]
            reply.last_position = positions[:, row : row + 1, -1:]
        return logits, hidden[:, -1:]

    @torch.inference_mode()
    def prefill(
        self, replies: list[TalkerReply], prompts: list[tuple[torch.Tensor, torch.Tensor, DynamicCache]]
    ) -> torch.Tensor:
        """The prefills of several replies in ONE forward -> codec logits [B, vocab] (float32).

        `prompts`: per reply, what its prefill puts through the talker (embeddings [1, n, D],
        positions [4, 1, n]) and the KV it starts from (its history's kept user turns; empty:
        none). Each reply joins a row holding that KV; the rows are padded at their ends to the
        longest (a position sees only the columns before it, so the padding changes none of the
        real ones, and each row's length counts its own positions). Then each row's new KV is
        appended to the reply's `DynamicCache`: what its history keeps, as after a prefill alone.
        """
        lengths = [embeds.shape[1] for embeds, _, _ in prompts]
        embeds = pad_sequence([embeds[0] for embeds, _, _ in prompts], batch_first=True)  # [B, q, D]
        positions = pad_sequence([positions[:, 0].T for _, positions, _ in prompts], batch_first=True)
        with self.cache.lock:
            try:
                for reply, (_, _, kv) in zip(replies, prompts):
                    self.join(reply, kv)
                logits, _ = self.forward(replies, embeds, positions.permute(2, 0, 1), lengths)
            except BaseException:
                for reply in replies:
                    self.leave(reply)
                raise
            for reply, (_, _, kv), length in zip(replies, prompts, lengths):
                end = self.cache.length(reply.slot)
                for layer in range(self.cache.num_layers):
                    keys, values = self.cache.row(reply.slot, layer)
                    kv.update(keys[None, :, end - length :], values[None, :, end - length :], layer)
        return logits

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
