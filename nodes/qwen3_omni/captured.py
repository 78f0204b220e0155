"""Captured steps (`compute: {graphs: auto | off}`): the talker's frame as ONE unit.

A talker frame of B replies is a chain of small steps: the talker's decode forward, its code,
then the code predictor's `num_code_groups - 1` sequential forwards, each with its own pick.
Eager (talker_engine.py's `step_replies`), every operator is a Python call and, on a GPU, a
kernel launch, and the talker's codes are read to the host mid-frame. `FrameUnit.frame` is the
same arithmetic as one function of tensors only: no host read inside it, no Python decision on
device values, every shape fixed by the padded batch size (1, 2, 4, 8, 16, 32, 64) and the KV
span it reads (64, 128, ... columns: the longest row's, rounded up; under the mask). Each
(size, span) is captured once on static input buffers and replayed:

- on CUDA as a CUDA graph (one launch for the frame; the graphs share one memory pool);
- on CPU as a TorchScript trace: the same aten calls, run from C++ without a Python frame per
  operator (the choice among the CPU options measured: docs/notebook/2026-12-07-captured-talker.md).

Its KV is the talker's slot cache (talker_slots.py); a cache that grows (new buffers) is
captured again. Padding rows read the frame's first row and write the cache's last column, which
`run` keeps past every row of the frame (a row that reaches it later writes it before reading).
After the frame, one host read of all its codes. Codes are picked inside the unit: greedy, or
sampled with talker_sampling.py's warpers and one draw on the global generator (the same
operators as the eager path, so the same draws from the same generator state), one pick per
capture. Where a capture cannot apply, the frame runs as written (the same function, eagerly):
a reply with its own seed (its draws come from its own generator, in its order), replies
sampling with different settings, experts whose path depends on the data, a size whose capture
failed (logged once), more replies than the largest size. Without a
`defer` hook a size is captured in the frame that first needs it; the talker node defers it to
idle compute, so no reply waits for a capture and the node starts as fast as before.

The layers are lean_decode.py's (the same operators as the eager decode step: greedy codes equal,
logits to float rounding; tests/model/test_captured_talker.py holds it frame by frame, with
padding rows and replies joining and leaving between frames).

`compute_graphs.set_graphs(omni, graphs)` sets the default of every `TalkerModel` built on that model later
(the GPU probe's and the benchmarks' switch); a profile's `compute: {graphs}` reaches the talker
node through its context.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.qwen3_omni.capture import Captured, PenaltyColumns, padded_batch, python_modes
from nodes.qwen3_omni.lean_decode import PAIR_COST_BYTES, _mlp, _moe, _rotate
from nodes.qwen3_omni.lean_decode import _rms_norm as _lean_rms_norm
from nodes.qwen3_omni.talker_sampling import _RESIDUAL_TOP_K, _RESIDUAL_TOP_P, _top_k, _top_p, residual_codes, talker_codes

if TYPE_CHECKING:
    from nodes.qwen3_omni.talker_model import TalkerModel
    from nodes.qwen3_omni.talker_slots import TalkerSlots

log = logging.getLogger(__name__)

# The smallest KV span a captured frame reads (then 2x, 4x, ... up to the cache's capacity).
KV_SPANS_FROM = 64
# How a captured frame picks every row's codes: greedy (None) or sampled (temperature, top_k, top_p).
Pick = tuple[float, int, float] | None
# Text kinds a decode step reads (talker_engine.py `_text_input`): a reply token, tts_eos, tts_pad.
TEXT_TOKEN, TEXT_EOS, TEXT_PAD = 0, 1, 2


class FrameInputs:
    """One frame's inputs for `B` replies, built on the host side of the unit (see `FrameUnit.frame`)."""

    __slots__ = ("prev_embeds", "text_ids", "text_kind", "positions", "rows", "starts", "seen", "penalty")

    def __init__(self, prev_embeds, text_ids, text_kind, positions, rows, starts, seen, penalty):
        self.prev_embeds = prev_embeds  # [B, D]: the summed code embeddings of each reply's last frame
        self.text_ids = text_ids  # [B] long: the reply token each step reads (0 where it reads tts_eos/pad)
        self.text_kind = text_kind  # [B] long: TEXT_TOKEN, TEXT_EOS or TEXT_PAD
        self.positions = positions  # [4, B] long: each reply's last position (text row, 3 rope rows)
        self.rows = rows  # [B] long: each reply's row in the slot cache
        self.starts = starts  # [B] long: the column its step writes (the row's length)
        self.seen = seen  # [B, V] bool: the codes the reply's talker emitted (repetition penalty)
        self.penalty = penalty  # [B, 1] float32: its repetition penalty (1.0: none)

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.__slots__]


class FrameUnit:
    """One talker's frame unit (shared by every reply on that talker; see the module docstring)."""

    def __init__(self, talker: TalkerModel, slots: TalkerSlots):
        self.talker = talker
        self.slots = slots
        self.device = talker.device
        self.cuda = self.device.type == "cuda"
        predictor = talker.code_predictor
        self.predictor = predictor
        self.frames = 0  # frames this unit ran (tests read it)
        self.replays = 0  # of which replayed a captured graph
        self._graphs: dict[tuple[int, Pick, int], _Graph] = {}  # (padded batch, pick, KV span) -> its graph
        self._failed: set[int] = set()
        self._penalties = PenaltyColumns(self.device)
        # Where a size's capture runs: None, inline in the frame that first needs it; else
        # `defer(capture)` queues it (the talker node: as idle compute) and frames run as
        # written until it has run.
        self.defer: Callable[[Callable[[], None]], None] | None = None
        self._pending: set[tuple[int, Pick, int]] = set()
        self._pool: Any = None  # the CUDA graphs' shared memory pool
        # Whether a frame of `rows` rows attends over the whole cache of `slots` rows in place
        # (reads every row once, copies none) rather than over its rows copied out (reads and
        # writes them again): on CUDA, where the copy is bandwidth, once the frame's rows are at
        # least half of the cache's; on CPU (small rows, per-operator costs) never.
        self.attend_in_place: Callable[[int, int], bool] = lambda rows, slots: self.cuda and 2 * rows >= slots
        rotary = talker.talker.model.rotary_emb
        # Why the unit cannot run this model's frames (None: it can): it runs the lean layers.
        self.why_not = slots.lean_decode.why_not or predictor.lean.why_not
        if self.why_not is None and not hasattr(rotary, "mrope_section"):
            self.why_not = "a talker rotary without mrope sections"
        if self.why_not is not None:
            return
        self.layers = slots.lean_decode.layers
        self.hidden_size = slots.lean_decode.hidden_size
        self.norm, self.norm_eps = slots.lean_decode.norm, slots.lean_decode.norm_eps
        # The mrope row each rotary frequency comes from (the module's `recomposition_frequencies`).
        rows = torch.zeros(rotary.inv_freq.shape[-1], dtype=torch.long)
        for row, offset in ((1, 1), (2, 2)):
            rows[offset : rotary.mrope_section[row] * 3 : 3] = row
        self._rope_rows = rows.to(self.device)
        self._inv_freq = rotary.inv_freq.to(self.device, torch.float32)
        self._rope_scaling = float(rotary.attention_scaling)
        self.codec_head = talker.talker.codec_head
        self.text_projection = talker.talker.text_projection
        self.thinker_embed = talker.thinker_embeddings.weight
        self.codec_embed = talker.talker.get_input_embeddings()
        weight = self.codec_head.weight
        self.dtype = weight.dtype
        self.width = weight.shape[1]
        self.tts = torch.cat((talker.tts_eos, talker.tts_pad), dim=1)[0]  # [2, D]
        self.lean_predictor = predictor.lean
        heads = predictor.predictor.lm_head
        self.heads = [(head.weight, head.bias) for head in heads]
        tables = predictor.predictor.model.codec_embedding
        self.tables = [(table.weight, table.padding_idx) for table in tables]
        self.groups = talker.num_code_groups
        # Per decoder layer (talker and predictor): its q/k norm weights side by side
        # [heads + kv_heads, head_dim] (lean_decode makes them in every forward).
        self._head_weights = head_weights_of([*self.layers, *self.lean_predictor.layers])

    # ------------------------------------------------------------------ when it applies

    def usable(self, replies: list[Any]) -> bool:
        """Whether `run` can take these decode steps now (else the eager path runs them): the
        lean layers apply (no hooks, the mirrored classes, a mask-free predictor)."""
        predictor = self.predictor
        if self.why_not is not None:
            return False
        if not (self.slots.lean_decode.usable() and predictor.stack.usable() and predictor.lean.usable()):
            return False
        return predictor._mask_free.get(predictor.predictor.model.config._attn_implementation) is True

    def capturable(self, replies: list[Any]) -> tuple[int, Pick] | None:
        """The padded batch size these replies' frame replays at and how it picks codes, or
        None: it runs as written (more replies than the largest size, a size whose capture
        failed, experts whose path depends on the data, a reply with its own generator: its
        draws are its own; replies sampling with different settings)."""
        size = padded_batch(len(replies))
        if size is None or size in self._failed or not self._static(size):
            return None
        picks = {_pick_of(reply.sampling) for reply in replies}
        if len(picks) != 1 or any(reply._generator is not None for reply in replies):
            return None
        return size, picks.pop()

    def _static(self, size: int) -> bool:
        """Whether a frame of `size` rows runs the same operators whatever the data."""
        return static_layers(self.layers, size, self.cuda)

    @torch.inference_mode()
    def prepare(self, replies: list[Any], frames: int) -> int:
        """Capture now what the next `frames` frames of `replies` (all decoding, each with its
        row) will replay, so that none of them captures (benchmarks time frames, not captures).
        -> the captures made."""
        captured = self.capturable(replies) if self.usable(replies) else None
        if captured is None:
            return 0
        size, pick = captured
        cache = self.slots.cache
        made = 0
        with cache.lock:
            longest = max(cache.lengths[reply.slot] for reply in replies)
            cache._ensure_capacity(longest + frames + 2)
            for span in sorted({kv_span(longest + 1 + k, cache.capacity) for k in range(frames)}):
                key = (size, pick, span)
                graph = self._graphs.get(key)
                if graph is None or graph.key != _cache_key(cache):
                    made += self._make(key, replies[0].slot) is not None
        return made

    # ------------------------------------------------------------------ one frame of B replies

    @torch.inference_mode()
    def run(self, replies: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decode step and code predictor pass of `replies` (each in phase "decode"): their
        frames [B, G] (long), the summed code embeddings [B, D],
        the talker's outputs [B, D] and the positions [4, B] of the step. Commits each reply's
        KV column; the caller accepts the codes (talker_engine.py)."""
        slots = self.slots
        cache = slots.cache
        for reply in replies:
            if getattr(reply, "slot", None) is None:
                slots.join(reply)
        with cache.lock:
            starts = [cache.lengths[reply.slot] for reply in replies]
            # One column more than the rows need: padding rows write the last one (see `_Graph`).
            cache._ensure_capacity(max(starts) + 2)
            inputs = self._inputs(replies, starts)
            captured = self.capturable(replies)
            if captured is not None:
                outputs = self._captured(inputs, *captured, max(starts) + 1)
            else:
                outputs = self.frame(inputs, max(starts) + 1, replies)
            for reply, start in zip(replies, starts):
                cache.lengths[reply.slot] = start + 1
        self.frames += 1
        self.predictor.lean_calls += 1  # the code predictor's lean layers ran (tests read it)
        codes, next_embeds, hidden, positions = outputs
        return codes, next_embeds, hidden, positions

    def _inputs(self, replies: list[Any], starts: list[int]) -> FrameInputs:
        talker = self.talker
        ids, kinds = [], []
        for reply in replies:
            text = reply._text_input(reply.frames)
            if isinstance(text, int):
                ids.append(text)
                kinds.append(TEXT_TOKEN)
            else:
                ids.append(0)
                kinds.append(TEXT_EOS if text is talker.tts_eos else TEXT_PAD)
        host = torch.tensor([ids, kinds, [reply.slot for reply in replies], starts])  # one host->device copy
        device = host.to(self.device, non_blocking=True) if self.cuda else host
        if len(replies) == 1:
            reply = replies[0]
            prev, positions, seen = reply.next_embeds[0], reply.last_position[:, 0], reply.code_history.mask[None]
        else:
            prev = torch.cat([reply.next_embeds[0] for reply in replies])
            positions = torch.cat([reply.last_position[:, 0] for reply in replies], dim=1)
            seen = torch.stack([reply.code_history.mask for reply in replies])
        return FrameInputs(prev, device[0], device[1], positions, device[2], device[3], seen, self._penalty(replies))

    def _penalty(self, replies: list[Any]) -> torch.Tensor:
        """[B, 1] repetition penalties of `replies` (a handful of combinations: the profile's and
        the replies' own)."""
        return self._penalties(tuple(float(reply.sampling.repetition_penalty) for reply in replies))

    # ------------------------------------------------------------------ the unit itself

    def frame(self, inputs: FrameInputs, kv_length: int, replies: list[Any] | None = None, pick: Pick = None):
        """The whole frame as tensor ops: (codes [B, G] long, summed code embeddings [B, D],
        the talker's outputs [B, D], the step's positions [4, B]). `kv_length`: the KV columns
        read (a `kv_span` when captured, the longest row + 1 as written). `replies`: pick
        the codes through talker_sampling.py's functions (their settings, their generators);
        None: as `pick` says, the same for every row (what a capture records: `_pick_of`)."""
        cache = self.slots.cache
        rows = inputs.rows.shape[0]
        # The decode input: last frame's code embeddings + what the step reads (talker_engine.decode_inputs).
        text = self.text_projection(F.embedding(inputs.text_ids, self.thinker_embed))  # [B, D]
        special = self.tts.index_select(0, (inputs.text_kind - 1).clamp_(min=0))
        embeds = torch.where((inputs.text_kind == TEXT_TOKEN)[:, None], text, special) + inputs.prev_embeds
        positions = inputs.positions + 1  # [4, B]
        cos, sin = self._rotary(positions[1:], embeds.dtype)  # [B, 1, head_dim]
        in_place = self.attend_in_place(rows, cache.slots)
        hidden = span_layers(self.layers, self._head_weights, embeds, cos, sin, cache, inputs.rows, inputs.starts,
                             kv_length, in_place, self.hidden_size)
        hidden = _rms_norm(hidden, self.norm, self.norm_eps, self.hidden_size)  # [B, D]
        codes, next_embeds = self._codes(hidden, inputs, replies, pick)
        return codes, next_embeds, hidden, positions

    def _predictor_layers(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any,
                          keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor) -> torch.Tensor:
        """lean_decode.LeanPredictor's forward (the same numbers), with the q/k norm weights side
        by side made once."""
        rows, length = hidden.shape[:2]
        lean = self.lean_predictor
        size = lean.hidden_size
        for i, layer in enumerate(lean.layers):
            head_weights = self._head_weights[id(layer)]
            x = _rms_norm(hidden, layer.input_norm, layer.eps, size)
            query = F.linear(x, *layer.q).view(rows, length, layer.heads, layer.head_dim)
            key = F.linear(x, *layer.k).view(rows, length, layer.kv_heads, layer.head_dim)
            value = F.linear(x, *layer.v).view(rows, length, layer.kv_heads, layer.head_dim).transpose(1, 2)
            heads = _rms_norm(torch.cat((query, key), dim=2), head_weights, layer.head_eps, layer.head_size)
            heads = _rotate(heads, cos, sin)
            query, key = heads[:, :, : layer.heads].transpose(1, 2), heads[:, :, layer.heads :].transpose(1, 2)
            keys[i] = torch.cat([keys[i], key], dim=-2)
            values[i] = torch.cat([values[i], value], dim=-2)
            out, _ = attention(layer.attention, query, keys[i], values[i], None, dropout=0.0, scaling=layer.scaling,
                               sliding_window=None, position_ids=positions, use_cache=True)
            hidden = hidden + F.linear(out.reshape(rows, length, -1), *layer.o)
            x = _rms_norm(hidden, layer.post_norm, layer.eps, size)
            hidden = hidden + _mlp(layer.dense_mlp, x)
        return _rms_norm(hidden, lean.norm, lean.norm_eps, lean.hidden_size)

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [B, 1, head_dim] of the 3 rope rows `positions` [3, B]: what the
        talker's rotary module computes (each frequency from its mrope row, then the halves
        side by side), with the row of each frequency picked before the multiply."""
        freqs = positions.index_select(0, self._rope_rows).t().float() * self._inv_freq  # [B, head_dim / 2]
        cos, sin = freqs.cos(), freqs.sin()
        if self._rope_scaling != 1.0:
            cos, sin = cos * self._rope_scaling, sin * self._rope_scaling
        cos = torch.cat((cos, cos), dim=-1).to(dtype)
        sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, None], sin[:, None]

    def _codes(self, hidden: torch.Tensor, inputs: FrameInputs, replies: list[Any] | None, pick: Pick = None):
        """The talker's code and the code predictor's residual codes of each row, and the sum of
        the frame's code embeddings (the order `generate()` sums them)."""
        logits = F.linear(hidden, self.codec_head.weight, self.codec_head.bias).float()  # [B, V]
        if replies is not None:
            first = talker_codes(replies, logits, self.talker.suppress_mask)
        else:
            penalized = torch.where(logits < 0, logits * inputs.penalty, logits / inputs.penalty)
            scores = torch.where(inputs.seen, penalized, logits)
            scores = torch.where(self.talker.suppress_mask, -float("inf"), scores)
            first = scores.argmax(dim=-1) if pick is None else _sampled(scores, *pick)
        first_embed = F.embedding(first[:, None], self.codec_embed.weight)  # [B, 1, D]
        step = torch.cat((hidden[:, None], first_embed), dim=1)  # [B, 2, D]
        predictor = self.predictor
        ropes = predictor._ropes(step)
        attention = predictor.stack.attention()
        empty = step.new_empty(0)
        keys: list[torch.Tensor] = [empty] * len(self.lean_predictor.layers)
        values: list[torch.Tensor] = [empty] * len(self.lean_predictor.layers)
        codes, embeds = [first], [first_embed]
        for group in range(1, self.groups):
            positions, cos, sin = ropes[group - 1]
            out = self._predictor_layers(step, cos, sin, attention, keys, values, positions)
            logits = F.linear(out, *self.heads[group - 1])[:, -1].float()  # the eager path's GEMM shape
            if replies is not None:
                code = residual_codes(replies, logits)
            elif pick is None:
                code = logits.argmax(dim=-1)
            else:  # the code predictor's sampling in generate(): top-k 50, top-p 0.8
                code = _sampled(logits, 1.0, _RESIDUAL_TOP_K, _RESIDUAL_TOP_P)
            codes.append(code)
            table, padding = self.tables[group - 1]
            step = F.embedding(code[:, None], table, padding)
            embeds.append(step)
        return torch.stack(codes, dim=1), torch.cat(embeds, dim=1).sum(1)

    # ------------------------------------------------------------------ CUDA graphs

    def _captured(self, inputs: FrameInputs, size: int, pick: Pick, kv_length: int):
        """The frame through the captured graph of its padded size, pick and KV span (made at
        its first use, and again when the cache has grown); a size whose capture failed runs
        this frame as written, and later ones as `capturable` says."""
        rows = inputs.rows.shape[0]
        if not self.cuda and python_modes():
            # The CPU trace cannot run under a Python dispatch mode (benchmarks/dispatch_counts.py
            # counts one): the frame runs as written, the same aten calls the trace makes.
            return self.frame(inputs, kv_length, pick=pick)
        cache = self.slots.cache
        key = (size, pick, kv_span(kv_length, cache.capacity))
        graph = self._graphs.get(key)
        if graph is None or graph.key != _cache_key(cache):
            if self.defer is not None:  # captured in idle time; this frame runs as written
                if key not in self._pending:
                    self._pending.add(key)
                    self.defer(functools.partial(self._capture, key))
                return self.frame(inputs, kv_length, pick=pick)
            graph = self._make(key, int(inputs.rows[0]))
            if graph is None:
                return self.frame(inputs, kv_length, pick=pick)
        self.replays += 1
        return graph.replay(inputs, rows)

    @torch.inference_mode()
    def _capture(self, key: tuple[int, Pick, int]) -> None:
        """Capture `key` (padded batch, pick, KV span) now (what `defer` runs): every row of it
        is padding, on row 0's last column, kept past every row's length."""
        self._pending.discard(key)
        cache = self.slots.cache
        with cache.lock:
            cache._ensure_capacity(max(cache.lengths) + 2)
            graph = self._graphs.get(key)
            if key[0] not in self._failed and key[2] <= cache.capacity and (graph is None or graph.key != _cache_key(cache)):
                self._make(key, 0)

    def _make(self, key: tuple[int, Pick, int], row: int) -> _Graph | None:
        size, pick, span = key
        try:
            graph = self._graphs[key] = _Graph(self, size, pick, span, row)
            return graph
        except Exception:  # noqa: BLE001 - capture is an optimisation: the frame still runs
            log.warning("talker frames of padded batch %s cannot be captured; they run eager", size, exc_info=True)
            self._failed.add(size)
            self._graphs.pop(key, None)
            return None


def _pick_of(sampling: Any) -> Pick:
    """How a reply's codes are picked, as a capture records it: None (greedy), or its
    (temperature, top_k, top_p) (its repetition penalty is an input of the frame)."""
    if not sampling.do_sample:
        return None
    return (float(sampling.temperature), int(sampling.top_k), float(sampling.top_p))


def _sampled(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """talker_sampling.py's warpers and draw for rows that share the global generator: the same
    operators in the same order, so the same draws as the eager path from the same RNG state."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k:
        scores = _top_k(scores, top_k)
    if top_p < 1.0:
        scores = _top_p(scores, top_p)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).view(-1)


def kv_span(kv_length: int, capacity: int) -> int:
    """The KV columns a captured frame reads for rows of at most `kv_length` columns: the next
    power of two from `KV_SPANS_FROM` (a few graphs per batch size, each reading at most twice
    what the rows hold), at most the cache's capacity."""
    span = max(KV_SPANS_FROM, 1 << (kv_length - 1).bit_length())
    return min(span, capacity)


def span_layers(layers: list[Any], head_weights: dict[int, torch.Tensor], hidden: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, cache: Any, rows: torch.Tensor, starts: torch.Tensor, kv_length: int,
                in_place: bool, hidden_size: torch.Tensor, first_rows: bool = False) -> torch.Tensor:
    """lean_decode's decoder layers for one new position on each of the slot-cache rows `rows`
    `[B]` (written at columns `starts` `[B]`) with every shape fixed by B and `kv_length` (the
    columns read, under the mask): what a captured decode step of the talker or the thinker
    runs. `head_weights`: per layer (`id`), its q/k norm weights side by side. A padding row
    reads a real row and writes the cache's last column (its start: `capacity - 1`). `in_place`:
    every row of the cache attends where it lies (see `FrameUnit.attend_in_place`); `first_rows`:
    `rows` are the cache's rows 0 .. B-1 in order (padding rows too: their own rows), read where
    they lie (views); else the batch's rows are copied out over the span."""
    count = hidden.shape[0]
    # Where each row's new key/value goes (flat [slots * kv_heads * capacity, head_dim]), and
    # the columns each row sees (0 .. its start).
    columns = ((rows[:, None] * cache.kv_heads + cache._head_range[None, :]) * cache.capacity
               + starts[:, None]).view(-1)
    if in_place:
        # Every row of the cache attends where it lies: the batch's rows with their queries,
        # the others (and padding: its start is the last column) with zeros over column 0.
        real = (starts < cache.capacity - 1).to(cache.dtype)[:, None, None, None]  # [B, 1, 1, 1]
        seen = torch.zeros(cache.slots, dtype=starts.dtype, device=cache.device).index_add_(
            0, rows, starts * real.view(-1).to(starts.dtype))
    else:
        seen = starts
    hidden_mask = cache._column_range[:kv_length][None, :] > seen[:, None]
    mask = torch.zeros(hidden_mask.shape, dtype=cache.dtype, device=cache.device).masked_fill_(
        hidden_mask, torch.finfo(cache.dtype).min)[:, None, None]  # [B or slots, 1, 1, kv]
    for layer in layers:
        x = _rms_norm(hidden, layer.input_norm, layer.eps, hidden_size)
        query = F.linear(x, *layer.q).view(count, layer.heads, layer.head_dim)
        key = F.linear(x, *layer.k).view(count, layer.kv_heads, layer.head_dim)
        value = F.linear(x, *layer.v).view(count, layer.kv_heads, 1, layer.head_dim)
        heads = _rms_norm(torch.cat((query, key), dim=1), head_weights[id(layer)], layer.head_eps, layer.head_size)
        heads = _rotate(heads, cos, sin)
        query = heads[:, : layer.heads].reshape(count, layer.kv_heads, layer.heads // layer.kv_heads, layer.head_dim)
        key = heads[:, layer.heads :]
        keys, values = cache.keys[layer.index], cache.values[layer.index]
        head_dim = keys.shape[-1]
        keys.view(-1, head_dim).index_copy_(0, columns, key.reshape(-1, head_dim))
        values.view(-1, head_dim).index_copy_(0, columns, value.reshape(-1, head_dim))
        if in_place:  # the cache's rows as they are: no copy
            queries = query.new_zeros((cache.slots, *query.shape[1:])).index_add_(0, rows, query * real)
            out = F.scaled_dot_product_attention(queries, keys[:, :, :kv_length], values[:, :, :kv_length],
                                                 attn_mask=mask, scale=layer.scaling).index_select(0, rows)
        elif first_rows:  # the cache's first rows as they are: no copy
            out = F.scaled_dot_product_attention(query, keys[:count, :, :kv_length], values[:count, :, :kv_length],
                                                 attn_mask=mask, scale=layer.scaling)
        else:  # the batch's rows copied out
            row_keys = keys[:, :, :kv_length].index_select(0, rows)
            row_values = values[:, :, :kv_length].index_select(0, rows)
            out = F.scaled_dot_product_attention(query, row_keys, row_values, attn_mask=mask, scale=layer.scaling)
        hidden = hidden + F.linear(out.reshape(count, -1), *layer.o)
        x = _rms_norm(hidden, layer.post_norm, layer.eps, hidden_size)
        hidden = hidden + (_moe(layer, x) if layer.moe else _mlp(layer.dense_mlp, x))
    return hidden


def head_weights_of(layers: list[Any]) -> dict[int, torch.Tensor]:
    """Per decoder layer (`id`): its q/k norm weights side by side `[heads + kv_heads, head_dim]`
    (lean_decode makes them in every forward; a captured step reads them as constants)."""
    return {id(layer): torch.cat((layer.q_norm.expand(layer.heads, -1), layer.k_norm.expand(layer.kv_heads, -1))).detach()
            for layer in layers}


def _cache_key(cache: Any) -> tuple[int, int, int]:
    """What a captured graph depends on in the cache: its buffers (replaced when it grows)."""
    return (cache.capacity, cache.slots, cache.keys[0].data_ptr())


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """lean_decode's RMSNorm in one operator fewer for float32 (`pow(2).mean` is its
    `(x * x).sum().div_(size)` to the bit on CPU)."""
    if x.dtype != torch.float32:
        return _lean_rms_norm(x, weight, eps, size)
    return weight * (x * x.pow(2).mean(dim=-1, keepdim=True).add_(eps).rsqrt_())


def static_layers(layers: list[Any], tokens: int, cuda: bool) -> bool:
    """Whether lean decoder layers run the same operators whatever the data for `tokens` rows
    (what a capture needs): no experts chosen on the host; the experts module only on CUDA
    (where a capture that syncs fails, and the step then runs eager)."""
    for layer in layers:
        if not layer.moe:
            continue
        if not layer.dense_experts:
            if not cuda:
                return False
        elif not cuda and _pairs_path(layer, tokens):
            return False  # its experts are chosen on the host
    return True


def _pairs_path(layer: Any, tokens: int) -> bool:
    """Whether lean_decode's `_experts` runs each chosen (token, expert) pair on its own for
    `tokens` tokens on CPU (its condition: a host read of the chosen experts)."""
    pairs = tokens * layer.top_k
    count = layer.experts.gate_up_proj.shape[0]
    return pairs * (layer.expert_bytes + PAIR_COST_BYTES) < count * layer.expert_bytes


class _Graph:
    """One padded batch size's captured frame on static input buffers: a CUDA graph on CUDA
    (replay: one launch), a TorchScript trace on CPU (replay: the recorded aten calls, run from
    C++ without a Python frame per operator). Both read `span` KV columns under the mask, so
    every shape is fixed. Padding rows read the frame's first row and
    write the cache's last column (`run` keeps it past the frame's rows; a row that reaches it
    later writes it before reading it)."""

    def __init__(self, unit: FrameUnit, size: int, pick: Pick, span: int, row: int):
        cache = unit.slots.cache
        self.unit, self.size, self.key = unit, size, _cache_key(cache)
        device = unit.device
        self.inputs = FrameInputs(
            torch.zeros((size, unit.width), dtype=unit.dtype, device=device),
            torch.zeros(size, dtype=torch.long, device=device),
            torch.full((size,), TEXT_PAD, dtype=torch.long, device=device),
            torch.zeros((4, size), dtype=torch.long, device=device),
            torch.full((size,), row, dtype=torch.long, device=device),
            torch.full((size,), cache.capacity - 1, dtype=torch.long, device=device),
            torch.zeros((size, unit.talker.vocab_size), dtype=torch.bool, device=device),
            torch.ones((size, 1), dtype=torch.float32, device=device),
        )
        self.cuda = unit.cuda
        if self.cuda and unit._pool is None:
            unit._pool = torch.cuda.graph_pool_handle()  # one memory pool for all its graphs

        def frame(*tensors: torch.Tensor):
            return unit.frame(FrameInputs(*tensors), span, pick=pick)

        self.captured = Captured(frame, tuple(self.inputs.tensors()), (unit.talker.talker, unit.talker.thinker_embeddings),
                                 unit._pool)
        # Every row of the warm-ups, capture and trace was padding: they wrote `row`'s last column only.

    def replay(self, inputs: FrameInputs, rows: int):
        if not self.cuda and rows == self.size:  # the trace takes any tensors of its shapes: no copies
            return self.captured.run(*inputs.tensors())
        static = self.inputs
        for name in FrameInputs.__slots__:
            target, value = getattr(static, name), getattr(inputs, name)
            if name == "positions":
                target[:, :rows].copy_(value, non_blocking=True)
            else:
                target[:rows].copy_(value, non_blocking=True)
        if rows < self.size:  # padding rows: the first row's last column
            static.rows[rows:].copy_(static.rows[:1].expand(self.size - rows))  # (fill_ would read it to the host)
            static.starts[rows:].fill_(self.unit.slots.cache.capacity - 1)
        codes, next_embeds, hidden, positions = self.captured.run(*static.tensors())
        if self.cuda:  # the graph's static outputs: the next replay overwrites them
            return codes[:rows], next_embeds[:rows].clone(), hidden[:rows].clone(), positions[:, :rows].clone()
        if rows == self.size:
            return codes, next_embeds, hidden, positions
        return codes[:rows], next_embeds[:rows], hidden[:rows], positions[:, :rows]
