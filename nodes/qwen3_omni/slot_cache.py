"""A slot-based KV cache shared by all sessions of one thinker: one row per session, batched forwards.

Layout: per layer one preallocated key buffer and one value buffer of shape
`[slots, kv_heads, capacity, head_dim]`. A session owns one row (slot) from its first prefill
until it closes; its tokens sit in that row from column 0, in context order, and the row's
`length` says how many are valid. Everything a session does to its KV is a change of that row:

- prefill / decode write the new keys/values at columns `length .. length+q` and advance it;
- interrupt, truncate, an out-of-band reply's rollback = `set_length(slot, shorter)` (the stale
  columns are masked until overwritten);
- leave = `release(slot)` (the row is free for the next session); join = `load(slot, ...)` copies
  an existing KV (e.g. a `DynamicCache`'s tensors) into a free row.

A forward over rows `r_1..r_B` (each with `q` new tokens) gets a `SlotBatch`: it is passed to
the model as its `cache=` (the attention layers call `update(key, value, layer_idx)`, which
writes the new columns and returns the rows' keys/values up to the longest row) together with
`SlotBatch.mask`, a 4-D additive mask `[B, 1, q, kv_len]` that lets query i of row b see
columns `0 .. length_b + i` only. So rows of different lengths run in one forward without
re-packing anything, and each row's result equals its own unbatched forward (to float rounding:
the padded columns contribute exact zeros after softmax). Rows that form one range (`feed` sorts
them by slot) are read as views; rows close together with gaps can be attended over their
covering range (`covering()`, `update_covering`: the lean decode forward does); other rows are
copied out of the buffers (`index_select`).

Two ways to hold the memory (`grow`, chosen per model by the resource's `kv_cache`,
nodes/qwen3_omni/model.py `kv_layout`):
- growing (`grow=True`, the default on CPU): capacity and slot count grow on demand (doubling,
  copying the buffers; capacity never past `max_capacity` unless a row needs more); nothing
  shrinks. Cheap to start small, but a growth step holds the old and the new buffers at once and
  moves every tensor (a GPU could run out of memory in the middle of serving).
- allocated at start (`grow=False`, the default on CUDA): `slots` rows of `capacity` columns,
  sized from the profile's limits (one row per session the KV budget admits, each row the
  longest context a session may reach), allocated once; nothing ever grows or moves (the buffers'
  `data_ptr` is stable, which captured graphs need too). A row past them raises `KVCacheFull`;
  admission never lets that happen (the runtime admits no more sessions than there are rows:
  `Node.kv_rows`, graph/runtime.py).
Dense rows cost `slots * capacity` tokens of KV, which is exactly the admission budget
(`kv_tokens / max_seq_len` sessions per engine, graph/limits.py).

transformers coupling (pinned to 5.24.0 in pyproject): `SlotBatch` is not a `transformers`
`Cache`; it relies on (a) the attention layers calling `cache.update(key, value, layer_idx,
...)` and attending over what it returns, and (b) `create_causal_mask` returning a 4-D mask
as-is. tests/model/test_batched_thinker.py (batched == sequential logits) and
tests/model/test_thinker.py (incremental == full prefill, == `generate()`) guard both: run them
after any transformers upgrade. The thinker's decode forward (lean_decode.py) calls `update`
and reads `mask` itself.

Thread safety: `lock` (re-entrant) must be held around a forward and around any structural change
(acquire/release/set_length/growth); `ThinkerRunner` does that.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import torch


class KVCacheFull(RuntimeError):
    """A cache allocated at start has no free row, or a row would need more columns than it has."""


class SlotKVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device | str,
                 slots: int = 4, capacity: int = 256, max_capacity: int | None = None, grow: bool = True):
        """`grow` False: `slots` x `capacity` is all this cache ever holds (see the module docstring)."""
        self.max_capacity = max_capacity
        self.grow = grow
        self.num_layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.lock = threading.RLock()
        self.capacity = capacity
        self.keys = [self._zeros(slots, capacity) for _ in range(layers)]
        self.values = [self._zeros(slots, capacity) for _ in range(layers)]
        self.lengths: list[int] = [0] * slots
        self._ranges()
        self._free: list[int] = list(range(slots - 1, -1, -1))  # pop() hands out low rows first

    @classmethod
    def for_text_config(cls, config, *, dtype: torch.dtype, device: torch.device | str, **sizes: int) -> SlotKVCache:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype=dtype, device=device, **sizes)

    def _ranges(self) -> None:
        """`arange`s every forward's indices and mask are built from (made once per capacity)."""
        self._head_range = torch.arange(self.kv_heads, device=self.device)
        self._column_range = torch.arange(self.capacity, device=self.device)

    def _zeros(self, slots: int, capacity: int) -> torch.Tensor:
        return torch.zeros((slots, self.kv_heads, capacity, self.head_dim), dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ rows

    @property
    def slots(self) -> int:
        return len(self.lengths)

    @property
    def rows_in_use(self) -> int:
        return self.slots - len(self._free)

    def acquire(self) -> int:
        """A free row (length 0), growing the slot count if all are taken."""
        with self.lock:
            if not self._free:
                if not self.grow:
                    raise KVCacheFull(f"all {self.slots} rows of a KV cache allocated at start are taken")
                self._grow(slots=self.slots * 2)
            slot = self._free.pop()
            self.lengths[slot] = 0
            return slot

    def release(self, slot: int) -> None:
        with self.lock:
            if slot in self._free:
                return
            self.lengths[slot] = 0
            self._free.append(slot)

    def length(self, slot: int) -> int:
        return self.lengths[slot]

    def set_length(self, slot: int, length: int) -> None:
        """Forget the row's tokens past `length` (interrupt, truncate, rollback)."""
        with self.lock:
            if not 0 <= length <= self.lengths[slot]:
                raise ValueError(f"row {slot} holds {self.lengths[slot]} tokens; cannot set its length to {length}")
            self.lengths[slot] = length

    def load(self, slot: int, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Join: copy one session's KV (per layer `[1 or kv_heads.., length, head_dim]`) into row `slot`."""
        with self.lock:
            length = int(keys[0].shape[-2])
            self._ensure_capacity(length)
            for layer in range(self.num_layers):
                self.keys[layer][slot, :, :length] = keys[layer].reshape(self.kv_heads, length, self.head_dim)
                self.values[layer][slot, :, :length] = values[layer].reshape(self.kv_heads, length, self.head_dim)
            self.lengths[slot] = length

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Row `target` holds the first `length` tokens of row `source` (a spare row starting from
        the instructions a session keeps: spare_row.py)."""
        with self.lock:
            if length > self.lengths[source]:
                raise ValueError(f"row {source} holds {self.lengths[source]} tokens, not {length}")
            for buffers in (self.keys, self.values):
                for layer in buffers:
                    layer[target, :, :length] = layer[source, :, :length]
            self.lengths[target] = length

    def row(self, slot: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid keys/values of one row, `[kv_heads, length, head_dim]` (views)."""
        length = self.lengths[slot]
        return self.keys[layer][slot, :, :length], self.values[layer][slot, :, :length]

    # ------------------------------------------------------------------ forwards

    def batch(self, rows: Sequence[int], query_length: int) -> SlotBatch:
        """A view for one forward of `query_length` new tokens on each of `rows` (distinct)."""
        if len(set(rows)) != len(rows):
            raise ValueError("a row can appear only once in a forward")
        with self.lock:
            starts = [self.lengths[row] for row in rows]
            self._ensure_capacity(max(starts) + query_length)
            return SlotBatch(self, list(rows), starts, query_length)

    def _ensure_capacity(self, needed: int) -> None:
        if needed > self.capacity and not self.grow:
            raise KVCacheFull(f"a row needs {needed} columns; this KV cache was allocated with {self.capacity}")
        if needed > self.capacity:
            capacity = self.capacity
            while capacity < needed:
                capacity *= 2
            if self.max_capacity is not None:
                capacity = max(needed, min(capacity, self.max_capacity))
            self._grow(capacity=capacity)

    def _grow(self, slots: int | None = None, capacity: int | None = None) -> None:
        slots = slots or self.slots
        capacity = capacity or self.capacity
        old_slots, old_capacity = self.slots, self.capacity
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                new = self._zeros(slots, capacity)
                new[:old_slots, :, :old_capacity] = old
                buffers[layer] = new
        self._free = list(range(slots - 1, old_slots - 1, -1)) + self._free
        self.lengths += [0] * (slots - old_slots)
        self.capacity = capacity
        self._ranges()


class SlotBatch:
    """One forward's view of some rows: the model's `cache=` and its 4-D attention mask.

    Not a transformers `Cache` (see the module docstring for what it relies on). Call `commit()`
    after the forward succeeded: only then do the rows' lengths include the new tokens.
    """

    def __init__(self, cache: SlotKVCache, rows: list[int], starts: list[int], query_length: int):
        self.cache = cache
        self.rows = rows
        self.starts = starts
        self.query_length = query_length
        self.kv_length = max(starts) + query_length
        device = cache.device
        rows_starts = torch.tensor([rows, starts], device=device)  # one host->device copy for both
        self._rows_t, self._starts_t = rows_starts[0], rows_starts[1]
        first = rows[0]
        self._contiguous = rows == list(range(first, first + len(rows)))
        # Flat index of (row, head, start) in a buffer viewed as [slots * kv_heads * capacity, head_dim].
        self._columns = ((self._rows_t[:, None] * cache.kv_heads + cache._head_range[None, :]) * cache.capacity
                         + self._starts_t[:, None]).reshape(-1)
        self._slice = slice(first, first + len(rows))

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """`[B, 1, q, kv]` additive mask: query i of row b sees columns 0 .. start_b + i."""
        last_seen = self._starts_t[:, None] if self.query_length == 1 else self.text_positions()  # [B, q]
        return self._additive_mask(last_seen)[:, None]

    def _additive_mask(self, last_seen: torch.Tensor) -> torch.Tensor:
        """`[..., kv]` additive mask (0 or the dtype's min) hiding the columns after `last_seen` `[...]`."""
        cache = self.cache
        hidden = cache._column_range[: self.kv_length] > last_seen[..., None]
        mask = torch.zeros(hidden.shape, dtype=cache.dtype, device=cache.device)
        return mask.masked_fill_(hidden, torch.finfo(cache.dtype).min)

    def text_positions(self) -> torch.Tensor:
        """`[B, q]` cache positions of the new tokens (the text row of Qwen3-Omni's position ids)."""
        return self._starts_t[:, None] + torch.arange(self.query_length, device=self.cache.device)[None, :]

    def covering(self) -> tuple[slice, torch.Tensor, torch.Tensor] | None:
        """For one new token per row on rows that are not one contiguous range but lie close together
        (the range from the lowest to the highest at most twice as many rows): the range, each
        row's place in it `[B]`, and the range's mask `[range, 1, 1, kv]` (a row in between sees
        its column 0 only; its output is thrown away). Attention over the range (`update_covering`)
        reads the rows in between instead of copying the batch's rows out (`update`'s
        index_select: a read and a write of every row). None: use `update`."""
        low, high = min(self.rows), max(self.rows) + 1
        if self.query_length != 1 or self._contiguous or high - low > 2 * len(self.rows):
            return None
        places = self._rows_t - low
        starts = torch.zeros(high - low, dtype=self._starts_t.dtype, device=self.cache.device)
        starts.index_copy_(0, places, self._starts_t)
        return slice(low, high), places, self._additive_mask(starts)[:, None, None]

    def update_covering(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, rows: slice):
        """Write the new keys/values (as `update`); return the keys/values of the `rows` range from
        `covering()`, `[range, kv_heads, kv_len, head_dim]` (views)."""
        keys, values = self._write(key, value, layer_idx)
        return keys[rows, :, : self.kv_length], values[rows, :, : self.kv_length]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new `[B, kv_heads, q, head_dim]` keys/values; return the rows' `[B, kv_heads, kv_len, head_dim]`."""
        keys, values = self._write(key, value, layer_idx)
        if self._contiguous:
            return keys[self._slice, :, : self.kv_length], values[self._slice, :, : self.kv_length]
        return (
            keys[:, :, : self.kv_length].index_select(0, self._rows_t),
            values[:, :, : self.kv_length].index_select(0, self._rows_t),
        )

    def _write(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        q = self.query_length
        if q == 1:  # one column per row: one index_copy_ into the flattened buffer (index_put is ~50x slower)
            head_dim = keys.shape[-1]
            keys.view(-1, head_dim).index_copy_(0, self._columns, key.reshape(-1, head_dim))
            values.view(-1, head_dim).index_copy_(0, self._columns, value.reshape(-1, head_dim))
        else:
            for b, (row, start) in enumerate(zip(self.rows, self.starts)):
                keys[row, :, start : start + q] = key[b]
                values[row, :, start : start + q] = value[b]
        return keys, values

    def commit(self, lengths: list[int] | None = None) -> None:
        """The rows' new tokens count (`lengths`: per row, when fewer than `query_length` were
        real; the rest of the columns stay masked until overwritten)."""
        with self.cache.lock:
            for b, (row, start) in enumerate(zip(self.rows, self.starts)):
                self.cache.lengths[row] = start + (self.query_length if lengths is None else lengths[b])


KV_CACHE_MODES = ("auto", "preallocate", "grow")


def allocated_at_start(mode: str, device: torch.device | str) -> bool:
    """Whether a model's slot caches are allocated at start (`kv_cache: preallocate`) or grow on
    demand (`grow`); `auto`: at start on CUDA (no growth step may run out of memory mid-serving,
    captured graphs need stable buffers), growing elsewhere (a CPU server starts small)."""
    if mode not in KV_CACHE_MODES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_MODES)}, got {mode!r}")
    return mode == "preallocate" or mode == "auto" and torch.device(device).type == "cuda"


def sessions_at_start(limits) -> int:
    """Rows of a cache allocated at start: one per session an engine admits (graph/limits.py:
    the KV budget `kv_tokens // max_seq_len`, else the safety cap `max_sessions`)."""
    return limits.effective_max_sessions


def padded_group(lengths: Sequence[int], budget: int) -> list[int]:
    """The rows that go into one forward padded at their ends to the longest: the first, then each
    later one while rows x longest stays within `budget` tokens (the first alone may exceed it).
    -> their indices in `lengths`."""
    group, longest = [0], lengths[0]
    for index in range(1, len(lengths)):
        length = max(longest, lengths[index])
        if (len(group) + 1) * length <= budget:
            group.append(index)
            longest = length
    return group
