"""Captured steps, the thinker's side: a decode step of B sessions and its choice as ONE unit.

Eager, a thinker decode step (batched_thinker.py `ThinkerRunner.answer`) is `LeanDecode`'s
layers over a `SlotBatch` (whose views, covering ranges and masks are picked on the host from
the rows' lengths) and then `ThinkerSampler.choose`, one Python call per operator. `StepUnit.step`
is the same arithmetic as one function of tensors only, every shape fixed by the padded batch
size and the KV span it reads (capture.py's `PADDED_BATCHES`, captured.py's `kv_span`): the token
embedding, the rotary of each row's position, the decoder layers (`captured.span_layers`, shared
with the talker's frame), the final norm, lm_head, and the choice: repetition penalty, the
banned ids, then the argmax (a greedy step) or every row under its own setting (a sampled step:
`thinker_sampling.choose_rows`, the grammar's allowed ids, temperature, top-k, top-p, min-p, the
draw; greedy rows take the argmax there too). Each `Key` (padded size, penalized, sampled, KV
span, first rows) is captured once (`captured.Captured`: a CUDA graph on CUDA, a TorchScript
trace on CPU) and replayed; one host read of the chosen ids per step, as eager.

A sampled step's inputs beyond the greedy one's: each row's setting as `[5, B]` float columns
(`row_settings`, padding rows greedy: one copy), the draw's noise `q` `[B, V]` and the grammar's
allowed ids `[B, V]` bool (all true for a row without one; stacked on the host, then one
non-blocking copy into a static buffer shared by the size's sampled graphs). The noise is drawn
before the replay, outside what is captured, by `ThinkerSampler.noise`: the rows without a seed
in one call on the device's default generator, each seeded row from its own generator, exactly
as the eager sampler draws it, so that the captured step picks the eager tokens for the same
noise. Why a flag in the key and not one unit with greedy as temperature 0: the sampled choice
(two sorts of `[B, V]`, three softmaxes) made greedy steps slower
(docs/notebook/2026-12-07-captured-sampling.md).

Where it applies (`StepUnit.capturable`): the step's `Feed`s (a feed that chooses nothing, a
reply's last token, rides along: its token is not read), at most 64 of them, the lean layers
usable, every row at least two columns short of the cache's capacity (padding rows write its
last one). A step's `Choose`s (first tokens from prefills) go through the sampler beside it,
and one read takes all the ids (`ThinkerRunner._captured_answer`). Otherwise the step runs
eager: experts chosen on the host (CPU), a size whose capture failed (logged once; a failed
sampled capture leaves that size's greedy one). Rows that are the cache's rows 0 .. B-1 are
read in place (views over the span); other rows are copied out over the span, their padding
reading the first row's KV. Padding rows write the cache's last column, past every row's length.

The numbers: the logits to float rounding of the eager step's (the same operators but for the
RMSNorm's `pow(2).mean`, equal to the bit on CPU), the same tokens, greedy, sampled and masked
(tests/model/test_captured_thinker.py holds both over many steps, with padding rows and sessions
joining and leaving between steps). Measurements: docs/notebook/2026-12-07-captured-thinker.md,
2026-12-07-captured-sampling.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from nodes.qwen3_omni.capture import Captured, PenaltyColumns, padded_batch, python_modes
from nodes.qwen3_omni.captured import _cache_key, _rms_norm, head_weights_of, kv_span, span_layers, static_layers
from nodes.qwen3_omni.thinker_requests import Feed
from nodes.qwen3_omni.thinker_sampling import choose_rows, device_floats, device_longs, row_settings, to_device

if TYPE_CHECKING:
    from nodes.qwen3_omni.lean_decode import LeanDecode
    from nodes.qwen3_omni.slot_cache import SlotKVCache
    from nodes.qwen3_omni.thinker_sampling import ThinkerSampler


class ThinkerRunner(Protocol):
    """What the unit reads of its runner (batched_thinker.py's `ThinkerRunner`; named here so that
    this module does not import the runner, which imports it)."""

    cache: SlotKVCache
    device: str | torch.device
    lean_decode: LeanDecode
    thinker: Any
    sampler: ThinkerSampler

log = logging.getLogger(__name__)

# A capture's key: (padded batch, whether it applies repetition penalties, whether it makes the
# whole choice (some row samples or has a grammar mask: `thinker_sampling.choose_rows`; else the
# greedy argmax alone), KV span, whether its rows are the cache's first rows: read in place,
# `captured.span_layers`).
Key = tuple[int, bool, bool, int, bool]


class StepInputs:
    """One decode step's inputs for B rows (see `StepUnit.step`): `GREEDY`, what every step reads,
    and the `CHOICE` a sampled step reads too (`Key`); None where the step has none to give (the
    static buffer's stays)."""

    GREEDY = ("ids", "positions", "rows", "starts", "ignore_eos", "seen", "penalty")
    CHOICE = ("settings", "noise", "allowed")
    __slots__ = GREEDY + CHOICE

    def __init__(self, ids, positions, rows, starts, ignore_eos, seen, penalty, settings=None, noise=None,
                 allowed=None):
        self.ids = ids  # [B] long: the token each row is fed
        self.positions = positions  # [B] long: its rotary position
        self.rows = rows  # [B] long: its row in the slot cache
        self.starts = starts  # [B] long: the column it writes (the row's length)
        self.ignore_eos = ignore_eos  # [B] long: 1 where EOS is banned too (`Sampling.ignore_eos`)
        self.seen = seen  # [B, V] bool: the context's ids (repetition penalty; read when penalized)
        self.penalty = penalty  # [B, 1] float32: the repetition penalty (1.0: none)
        self.settings = settings  # [5, padded B] float32: `thinker_sampling.row_settings`, padding rows greedy
        self.noise = noise  # [B, V] float32: the draw's noise q (`ThinkerSampler.noise`, drawn before the step)
        self.allowed = allowed  # [B, V] bool on the host: the grammar's ids (`ThinkerSampler.allowed`)

    def names(self, sampled: bool) -> tuple[str, ...]:
        return self.GREEDY + self.CHOICE if sampled else self.GREEDY

    def tensors(self, sampled: bool = False) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.names(sampled)]


class StepUnit:
    """The thinker's captured decode step, one per runner (see the module docstring)."""

    def __init__(self, runner: ThinkerRunner):
        self.runner = runner
        self.cache = runner.cache
        self.device = torch.device(runner.device)
        self.cuda = self.device.type == "cuda"
        self.lean = runner.lean_decode
        self.steps = 0  # steps this unit ran (tests read it)
        self.replays = 0  # of which replayed a capture
        self.replayed_rows, self.replayed_key = 0, None  # the rows and key of the last replay
        self._graphs: dict[Key, _StepGraph] = {}
        self._failed: set[tuple[int, bool]] = set()  # (padded size, sampled) whose capture failed
        self._penalties = PenaltyColumns(self.device)
        # Where a capture runs: None, inline in the step that first needs it; else `defer(capture)`
        # queues it (the thinker node: as idle compute) and steps run as written until it has run.
        self.defer: Callable[[Callable[[], None]], None] | None = None
        self._pending: set[Key] = set()
        self._pool: Any = None  # the CUDA graphs' shared memory pool (`Captured`)
        # As the talker's frame: attend over the whole cache in place on CUDA once the step's
        # rows are at least half of the cache's (no copy of the rows' KV), never on CPU.
        self.attend_in_place: Callable[[int, int], bool] = lambda rows, slots: self.cuda and 2 * rows >= slots
        self.why_not = self.lean.why_not
        if self.why_not is not None:
            return
        self.layers = self.lean.layers
        self._head_weights = head_weights_of(self.layers)
        self.vocab_size = int(runner.thinker.config.text_config.vocab_size)
        self._unseen = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)  # a row without a penalty
        self._all_allowed = torch.ones((1, self.vocab_size), dtype=torch.bool, device=self.device)
        self._choice_buffers: dict[int, _ChoiceBuffers] = {}  # per padded size, shared by its sampled graphs

    # ------------------------------------------------------------------ when it applies

    def capturable(self, feeds: list[Feed]) -> tuple[int, bool, bool] | None:
        """The padded size, penalty flag and sampled flag (`Key`) the step of these `Feed`s
        replays at, or None: it runs eager. A feed without a choice (a reply's last token) rides
        along: its token is not read."""
        if self.why_not is not None or not feeds:
            return None
        size = padded_batch(len(feeds))
        if size is None or not static_layers(self.layers, size, self.cuda):
            return None
        penalized = sampled = False
        for feed in feeds:
            choice = feed.choice
            if choice is None:
                continue
            sampled = sampled or not choice.sampling.greedy or choice.allowed is not None
            penalized = penalized or float(choice.sampling.repetition_penalty) != 1.0
        if (size, sampled) in self._failed or not self.lean.usable():
            return None
        cache = self.cache
        longest = max(cache.lengths[feed.slot] for feed in feeds)
        if longest + 2 > cache.capacity and not cache.grow:
            return None  # padding rows write the last column: the rows must stay short of it
        return size, penalized, sampled

    @torch.inference_mode()
    def prepare(self, requests: list[Feed], steps: int) -> int:
        """Capture now what the next `steps` steps of these feeds' rows will replay (benchmarks
        time steps, not captures). -> the captures made."""
        captured = self.capturable(requests)
        if captured is None:
            return 0
        size, penalized, sampled = captured
        cache = self.cache
        made = 0
        with cache.lock:
            longest = max(cache.lengths[request.slot] for request in requests)
            cache._ensure_capacity(longest + steps + 2)
            first_rows = self._first_rows(sorted(request.slot for request in requests), size)
            for span in sorted({kv_span(longest + 1 + k, cache.capacity) for k in range(steps)}):
                key = (size, penalized, sampled, span, first_rows)
                graph = self._graphs.get(key)
                if graph is None or graph.key != _cache_key(cache):
                    made += self._make(key, requests[0].slot) is not None
        return made

    # ------------------------------------------------------------------ one step of B rows

    @torch.inference_mode()
    def run(self, feeds: list[Feed], size: int, penalized: bool,
            sampled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of `feeds` (`capturable`, every owner holding its row, in slot order):
        (logits [B, V], chosen tokens [B] long), on the device, nothing read; the caller reads
        the tokens once. Commits each row's new column. A sampled step draws its noise first
        (outside what is captured), as the eager sampler does."""
        cache = self.cache
        with cache.lock:
            if len({feed.slot for feed in feeds}) != len(feeds):
                raise ValueError("a row can appear only once in a forward")
            starts = [cache.lengths[feed.slot] for feed in feeds]
            cache._ensure_capacity(max(starts) + 2)  # one column more: padding rows write the last
            inputs = self._inputs(feeds, starts, penalized, sampled, size)
            first_rows = self._first_rows([feed.slot for feed in feeds], size)
            logits, tokens = self._step(inputs, size, penalized, sampled, max(starts) + 1, first_rows)
            for feed, start in zip(feeds, starts):
                cache.lengths[feed.slot] = start + 1
        self.steps += 1
        return logits, tokens

    def _inputs(self, feeds: list[Feed], starts: list[int], penalized: bool, sampled: bool = False,
                size: int = 0) -> StepInputs:
        choices = [feed.choice for feed in feeds]
        ignore = [int(choice is not None and bool(choice.sampling.ignore_eos)) for choice in choices]
        host = [[f.token for f in feeds], [f.position for f in feeds], [f.slot for f in feeds], starts, ignore]
        ids, positions, rows, starts_t, ignore_eos = device_longs(host, self.device).unbind()  # one copy
        seen = penalty = None
        if penalized:
            blank = self._unseen
            seen = torch.stack([blank if c is None or c.seen is None else c.seen for c in choices])
            penalty = self._penalties(tuple(1.0 if c is None else float(c.sampling.repetition_penalty) for c in choices))
        if not sampled:
            return StepInputs(ids, positions, rows, starts_t, ignore_eos, seen, penalty)
        sampler = self.runner.sampler
        settings = device_floats(row_settings(choices, self.vocab_size, size), self.device)  # one copy
        noise = sampler.noise(choices)  # None: no row samples (the rows' q are not read)
        allowed = sampler.allowed(choices)  # on the host: a replay copies it once, into its buffer
        return StepInputs(ids, positions, rows, starts_t, ignore_eos, seen, penalty, settings, noise, allowed)

    def _first_rows(self, slots: list[int], size: int) -> bool:
        """Whether a step on `slots` reads the cache's first `size` rows in place: they are its
        rows 0 .. B-1 (the padding rows then are the next ones, each writing its last column),
        as the rows of a server's first sessions are (rows are handed out low first). On CUDA
        the in-place form over the whole cache takes the large batches (`attend_in_place`)."""
        return size <= self.cache.slots and slots == list(range(len(slots)))

    def _step(self, inputs: StepInputs, size: int, penalized: bool, sampled: bool, kv_length: int, first_rows: bool):
        rows = inputs.rows.shape[0]
        if not self.cuda and python_modes():
            # The CPU trace cannot run under a Python dispatch mode (benchmarks/dispatch_counts.py
            # counts one): the step runs as written, the same aten calls the trace makes.
            return self.step(inputs, kv_length, penalized, first_rows, sampled)
        cache = self.cache
        key = (size, penalized, sampled, kv_span(kv_length, cache.capacity), first_rows)
        graph = self._graphs.get(key)
        if graph is None or graph.key != _cache_key(cache):
            if self.defer is not None and self._deferred(key):  # captured in idle time; this step runs as written
                return self.step(inputs, kv_length, penalized, first_rows, sampled)
            graph = self._make(key, int(inputs.rows[0]))
            if graph is None:
                return self.step(inputs, kv_length, penalized, first_rows, sampled)
        self.replays += 1
        self.replayed_rows, self.replayed_key = rows, key
        return graph.replay(inputs, rows)

    # ------------------------------------------------------------------ the unit itself

    def step(self, inputs: StepInputs, kv_length: int, penalized: bool, first_rows: bool = False,
             sampled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode step as tensor ops: (logits [B, V] in the model's dtype, chosen tokens [B]
        long). `kv_length`: the KV columns read (a `kv_span` when captured, the longest row + 1
        as written). The choice is `ThinkerSampler._pick`'s arithmetic per row: greedy, or with
        `sampled` every row under its own setting (`thinker_sampling.choose_rows`)."""
        lean = self.lean
        hidden = F.embedding(inputs.ids, lean.embed.weight, lean.embed.padding_idx)  # [B, D]
        cos, sin = lean.rotary(inputs.positions, hidden.dtype)
        in_place = self.attend_in_place(hidden.shape[0], self.cache.slots)
        hidden = span_layers(self.layers, self._head_weights, hidden, cos, sin, self.cache, inputs.rows, inputs.starts,
                             kv_length, in_place, lean.hidden_size, first_rows=first_rows and not in_place)
        hidden = _rms_norm(hidden, lean.norm, lean.norm_eps, lean.hidden_size)
        logits = F.linear(hidden, lean.lm_head.weight, lean.lm_head.bias)  # [B, V]
        scores = logits if logits.dtype == torch.float32 else logits.float()
        if penalized:  # RepetitionPenaltyLogitsProcessor on the seen ids (1.0: the logit as it is)
            scaled = torch.where(scores < 0, scores * inputs.penalty, scores / inputs.penalty)
            scores = torch.where(inputs.seen, scaled, scores)
        banned = self.runner.sampler.banned.index_select(0, inputs.ignore_eos)  # [B, V]
        scores = scores.masked_fill(banned, -float("inf"))
        if not sampled:
            return logits, torch.argmax(scores, dim=-1)
        rows = scores.shape[0]
        noise = inputs.noise if inputs.noise is not None else torch.ones_like(scores)  # (as written only)
        allowed = self._anything(rows) if inputs.allowed is None else to_device(inputs.allowed, self.device)
        return logits, choose_rows(scores, inputs.settings[:, :rows], noise, allowed)

    def _anything(self, rows: int) -> torch.Tensor:
        """[rows, V] all true: no grammar (a step run as written without a mask)."""
        return self._all_allowed.expand(rows, -1)

    # ------------------------------------------------------------------ captures

    def _deferred(self, key: Key) -> bool:
        """Queue `key`'s capture with `defer` (once). False: the hook's loop is gone (the node
        that set it has stopped; the runner outlives it): captures run inline from now on."""
        if key in self._pending:
            return True
        try:
            self.defer(functools.partial(self._capture, key))
        except RuntimeError:  # "Event loop is closed"
            self.defer = None
            return False
        self._pending.add(key)
        return True

    @torch.inference_mode()
    def _capture(self, key: Key) -> None:
        """Capture `key` now (what `defer` runs): every row is padding, on row 0's last column."""
        self._pending.discard(key)
        cache = self.cache
        with cache.lock:
            if max(cache.lengths) + 2 > cache.capacity and not cache.grow:
                return
            cache._ensure_capacity(max(cache.lengths) + 2)
            graph = self._graphs.get(key)
            stale = graph is None or graph.key != _cache_key(cache)
            if (key[0], key[2]) not in self._failed and key[3] <= cache.capacity and stale:
                self._make(key, 0)

    def _make(self, key: Key, row: int) -> _StepGraph | None:
        try:
            graph = self._graphs[key] = _StepGraph(self, key, row)
            return graph
        except Exception:  # noqa: BLE001 - capture is an optimisation: the step still runs
            log.warning("%s thinker decode steps of padded batch %s cannot be captured; they run eager",
                        "sampled" if key[2] else "greedy", key[0], exc_info=True)
            self._failed.add((key[0], key[2]))  # a sampled capture failing leaves the greedy one
            self._graphs.pop(key, None)
            return None


class _ChoiceBuffers:
    """The static inputs only a sampled step reads, one set per padded size, shared by its sampled
    graphs (each `[size, V]`: on the real vocabulary 0.6 MB a row for the noise; a graph per KV
    span would otherwise hold its own)."""

    def __init__(self, size: int, vocab_size: int, device: torch.device):
        self.settings = device_floats(row_settings([], vocab_size, size), device)  # every row greedy
        self.noise = torch.ones((size, vocab_size), dtype=torch.float32, device=device)
        self.allowed = torch.ones((size, vocab_size), dtype=torch.bool, device=device)
        self.masked = False  # whether `allowed` holds a grammar's mask from an earlier step


class _StepGraph:
    """One `Key`'s captured step on static inputs (`Captured`). Padding rows feed token 0 at
    position 0 on the step's first row (with `first_rows`: on the rows after the step's), writing
    the cache's last column (kept past every row's length by `StepUnit.run`); in a sampled step
    they are greedy (`row_settings`) and their noise and mask are not read by any other row."""

    def __init__(self, unit: StepUnit, key: Key, row: int):
        size, penalized, sampled, span, first_rows = key
        cache = unit.cache
        self.unit, self.size, self.key = unit, size, _cache_key(cache)
        self.cuda = unit.cuda
        self.sampled = sampled
        longs = {"dtype": torch.long, "device": unit.device}
        choice = None
        if sampled:
            choice = unit._choice_buffers.get(size)
            if choice is None:
                choice = unit._choice_buffers[size] = _ChoiceBuffers(size, unit.vocab_size, unit.device)
        self.choice = choice
        self.inputs = StepInputs(
            torch.zeros(size, **longs),
            torch.zeros(size, **longs),
            torch.arange(size, **longs) if first_rows else torch.full((size,), row, **longs),
            torch.full((size,), cache.capacity - 1, **longs),
            torch.zeros(size, **longs),
            torch.zeros((size, unit.vocab_size), dtype=torch.bool, device=unit.device),
            torch.ones((size, 1), dtype=torch.float32, device=unit.device),
            *((choice.settings, choice.noise, choice.allowed) if sampled else ()),
        )
        thinker = unit.runner.thinker
        unit.runner.sampler  # built now (its banned masks moved to the device), not inside a CUDA capture
        self.first_rows = first_rows
        self._padding_rows = torch.arange(size, **longs)
        if self.cuda and unit._pool is None:
            unit._pool = torch.cuda.graph_pool_handle()  # one memory pool for all its graphs

        def step(*tensors: torch.Tensor):
            return unit.step(StepInputs(*tensors), span, penalized, first_rows, sampled)

        self.captured = Captured(step, tuple(self.inputs.tensors(sampled)), (thinker,), unit._pool)
        # Every row of the warm-ups, capture and trace was padding: they wrote `row`'s last column only.

    def replay(self, inputs: StepInputs, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        static = self.inputs
        given = [(name, getattr(inputs, name)) for name in static.names(self.sampled)]
        if not self.cuda and rows == self.size:  # the trace takes any tensors of its shapes: no copies
            if self.sampled and inputs.allowed is None:
                self._unmask(0)
            return self.captured.run(*[getattr(static, name) if value is None else value for name, value in given])
        for name, value in given:
            if value is not None:  # settings: [5, size], built with the padding rows
                target = getattr(static, name)
                (target if name == "settings" else target[:rows]).copy_(value, non_blocking=True)
        if self.sampled:
            self._unmask(rows if inputs.allowed is not None else 0)
        if rows < self.size:  # padding rows: the first row's (or their own row's) last column
            if self.first_rows:
                static.rows[rows:].copy_(self._padding_rows[rows:])
            else:
                static.rows[rows:].copy_(static.rows[:1].expand(self.size - rows))  # (fill_ would read it to the host)
            static.starts[rows:].fill_(self.unit.cache.capacity - 1)
        logits, tokens = self.captured.run(*static.tensors(self.sampled))
        if self.cuda:  # the graph's outputs are overwritten by its next replay
            return logits[:rows].clone(), tokens[:rows].clone()
        if rows == self.size:
            return logits, tokens
        return logits[:rows], tokens[:rows]

    def _unmask(self, masked: int) -> None:
        """The shared mask buffer all true past its first `masked` rows (this step's grammar masks,
        just copied in) where an earlier step left masks there, so that a row without a grammar
        is never masked by an earlier one's."""
        choice = self.choice
        if choice.masked and masked < self.size:
            choice.allowed[masked:].fill_(True)
        choice.masked = masked > 0
