"""How a thinker step picks the next token of every reply at once, on the device.

    sampler = ThinkerSampler(vocab_size, suppressed=tokens.suppressed, eos=tokens.eos, device=device)
    token_ids = sampler.choose(logits, choices)    # logits [B, V] on the device -> B ints

The logits of a decode step never leave the device: every stage is a `[rows, V]` op over the
rows that share a setting (as talker_sampling.py does for the talker), and the only read back
to the host is ONE `tolist()` of the chosen ids for the whole batch. A GPU step that reads a
value on the host stalls until the device has caught up, so CPU and GPU work cannot overlap;
one small read per step is the least a step that streams tokens can do.

Stages, in the order transformers' `generate()` applies its processors:

- repetition penalty (`repetition_penalty` != 1) over the ids in the context (the prompt, the
  earlier turns and the reply so far, as vLLM and `generate()` apply it): a seen id's logit is
  divided by the penalty when positive, multiplied when negative;
- the banned ids: the model's special tokens that are never text, and EOS with `ignore_eos`;
- the tool-call grammar's allowed ids (tool_calls.py; built on the host by xgrammar, moved to
  the device without a stall) for the rows that have one;
- greedy (temperature 0): the argmax, the same ids as an argmax over the same masked logits on
  the host; sampling: temperature, top-k, top-p, min-p (transformers' warpers' arithmetic),
  softmax and a draw.

Draws: `torch.multinomial` reads two values on the host to check its input. For one sample it
draws `argmax(probs / q)` with `q ~ Exp(1)` (the exponential race: P(i) = probs[i]); this does
exactly that, with `exponential_`. The step's noise `q` is drawn first, for every sampling row
at once (`ThinkerSampler.noise`), and then read: the captured decode step (captured_thinker.py)
draws it the same way outside its captured region and takes it as an input, so that it picks
the eager sampler's tokens for the same `q`. A row with a seed draws from its own generator (on
the device), one call on its own row per step, so its tokens depend on its own draws alone: the
same tokens alone or batched with any other sessions. Rows without a seed share the device's
default generator in one call per step.

`row_settings` and `choose_rows` are the same stages with each row's setting as a tensor column
instead of a group's Python number (the captured step: one shape for any mix of settings); they
give the grouped stages' numbers to the bit (the same operators on the same float32 operands).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nodes.qwen3_omni.talker_sampling import _top_k, _top_p
from nodes.qwen3_omni.thinker_requests import Choice


@dataclass(frozen=True)
class Sampling:
    """Per-session sampling. temperature 0 = greedy (the default; top-k / top-p / min-p then
    do nothing). `ignore_eos` (benchmarks only, never from a client, as vLLM's): EOS is never
    chosen, so a reply runs to its bound. `repetition_penalty` applies in greedy too."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> Sampling:
        params = params or {}
        return cls(
            temperature=float(params.get("temperature") or 0.0),
            top_p=float(params.get("top_p") or 1.0),
            top_k=int(params.get("top_k") or 0),
            seed=None if params.get("seed") is None else int(params["seed"]),
            min_p=float(params.get("min_p") or 0.0),
            repetition_penalty=float(params.get("repetition_penalty") or 1.0),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def device_longs(values: Iterable[int] | Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """A long tensor of host values on `device`, without a stall: on CUDA through pinned memory
    with a non-blocking copy (a plain copy waits for the device's queue to drain)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=torch.long)
    return torch.tensor(values, dtype=torch.long, pin_memory=True).to(device, non_blocking=True)


def device_floats(values: Sequence[Sequence[float]], device: torch.device) -> torch.Tensor:
    """A float32 tensor of host values on `device`, without a stall (as `device_longs`)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=torch.float32)
    return torch.tensor(values, dtype=torch.float32, pin_memory=True).to(device, non_blocking=True)


def to_device(mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host mask on `device` in one non-blocking copy (a mask already there, as it is)."""
    if mask.device == device:
        return mask
    return mask.to(device, non_blocking=True)


def _key(sampling: Sampling) -> tuple[bool, float, int, float, float, float, bool]:
    """The setting a row shares with the other rows of its group."""
    penalty, ignore_eos = float(sampling.repetition_penalty), bool(sampling.ignore_eos)
    if sampling.greedy:
        return (True, 1.0, 0, 1.0, 0.0, penalty, ignore_eos)
    return (False, float(sampling.temperature), int(sampling.top_k), float(sampling.top_p), float(sampling.min_p),
            penalty, ignore_eos)


def _min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """MinPLogitsWarper(min_p) (min_tokens_to_keep 1: the most likely id always stays, min_p <= 1)."""
    probs = torch.softmax(scores, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p
    return scores.masked_fill(probs < threshold, -float("inf"))


def _draw(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One id per row of `probs` [G, V]: argmax(probs / q), q ~ Exp(1) the rows' noise
    (torch.multinomial's draw for one sample, without its host checks)."""
    return probs.div_(q).argmax(dim=-1)


# `row_settings`' columns: whether the row samples (1.0) or is greedy (0.0), its temperature
# (1.0 when greedy), its top-k as the index of the k-th largest score (V - 1: no cut), its top-p
# as the cumulative probability at or under which ids go (`1 - top_p`; -1.0: no cut), its min-p.
SETTING_COLUMNS = ("sampled", "temperature", "top_k_index", "top_p_cut", "min_p")


def row_settings(choices: Sequence[Choice | None], vocab_size: int, rows: int | None = None) -> list[list[float]]:
    """Each row's sampling setting as `SETTING_COLUMNS` x `rows` floats (host values; a row
    without a choice, and the padding rows past `choices`, are neutral: greedy, no cut)."""
    last = float(vocab_size - 1)
    columns: list[list[float]] = [[] for _ in SETTING_COLUMNS]
    for index in range(len(choices) if rows is None else rows):
        choice = choices[index] if index < len(choices) else None
        sampling = None if choice is None else choice.sampling
        if sampling is None or sampling.greedy:
            values = (0.0, 1.0, last, -1.0, 0.0)
        else:
            top_k, top_p = int(sampling.top_k), float(sampling.top_p)
            values = (1.0, float(sampling.temperature), float(min(max(top_k, 1), vocab_size) - 1) if top_k else last,
                      1 - top_p if top_p < 1.0 else -1.0, float(sampling.min_p))
        for column, value in zip(columns, values):
            column.append(value)
    return columns


def choose_rows(scores: torch.Tensor, settings: torch.Tensor, q: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`ThinkerSampler._pick`'s stages after the banned ids, every row under its own setting:
    `scores` [B, V] float32 (penalized, banned ids masked), `settings` [5, B] float32
    (`row_settings`), `q` [B, V] the step's noise (read on the sampling rows only), `allowed`
    [B, V] bool (the grammar's ids; all true without one). -> [B] long. No host read, no shape
    that depends on a value: what a captured step can hold."""
    sampled, temperature, top_k_index, top_p_cut, min_p = settings.unbind()
    scores = scores.masked_fill(allowed.logical_not(), -float("inf"))
    greedy = torch.argmax(scores, dim=-1)
    scores = scores / temperature[:, None]
    kth = torch.sort(scores, dim=-1, descending=True)[0].gather(1, top_k_index.long()[:, None])  # `_top_k`'s topk value
    scores = scores.masked_fill(scores < kth, -float("inf"))
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)  # `_top_p`, the cut per row
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= top_p_cut[:, None]
    remove[..., -1:] = False
    scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))
    probs = torch.softmax(scores, dim=-1)  # `_min_p`
    scores = scores.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p[:, None], -float("inf"))
    drawn = _draw(torch.softmax(scores, dim=-1), q)
    return torch.where(sampled > 0, drawn, greedy)


class ThinkerSampler:
    """The next token of many replies from their logits, on the device (see the module docstring).
    One per runner: it holds the banned-id masks, built once."""

    def __init__(self, vocab_size: int, suppressed: Iterable[int], eos: Iterable[int], device: torch.device | str):
        self.vocab_size = int(vocab_size)
        self.device = torch.device(device)
        banned = torch.zeros(2, self.vocab_size, dtype=torch.bool)
        banned[:, sorted(suppressed)] = True
        banned[1, sorted(eos)] = True  # row 1: `ignore_eos`
        self.banned = banned.to(self.device)  # [2, V]: row 0 the banned ids, row 1 with EOS (`ignore_eos`)
        self._banned = (self.banned[0], self.banned[1])  # by `ignore_eos`; views taken once, not per step
        self._any = torch.ones(self.vocab_size, dtype=torch.bool)  # a row without a grammar (host)

    def allowed(self, choices: Sequence[Choice | None]) -> torch.Tensor | None:
        """The rows' grammar masks as one `[len(choices), V]` bool on the host (all true for a row
        without a grammar or a choice), or None when no row has one. Still on the host: its one
        copy to the device is the caller's (the eager pick's `to_device`, the captured step's copy
        into its static buffer)."""
        if all(choice is None or choice.allowed is None for choice in choices):
            return None
        return torch.stack([self._any if choice is None or choice.allowed is None else choice.allowed
                            for choice in choices])

    def choose(self, logits: torch.Tensor, choices: Sequence[Choice]) -> list[int]:
        """The chosen id of each row of `logits` [B, V] (on the device; read, not changed) under
        `choices[i]`: one `tolist()` for all rows, no other read of a device value."""
        picked, order = self.pick(logits, choices)
        ids = picked.tolist()  # the step's one read
        tokens = [0] * len(choices)
        for row, token in zip(order, ids):
            tokens[row] = token
        return tokens

    def pick(self, logits: torch.Tensor, choices: Sequence[Choice]) -> tuple[torch.Tensor, list[int]]:
        """`choose` without the read: the chosen ids on the device, and the row of `logits` each
        is for (rows grouped by setting). A caller with more ids to read in the step reads them
        together."""
        total = len(choices)
        groups: dict[tuple, list[int]] = {}
        for row, choice in enumerate(choices):
            groups.setdefault(_key(choice.sampling), []).append(row)
        q = self.noise(choices)  # drawn first, for every sampling row (as the captured step does)
        picked, order = [], []
        for key, rows in groups.items():
            if len(rows) == total:
                scores, noise = logits, q
            else:
                index = device_longs(rows, logits.device)
                scores, noise = logits[index], (None if key[0] else q[index])
            picked.append(self._pick(scores, [choices[row] for row in rows], key, noise))
            order.extend(rows)
        return (picked[0] if len(picked) == 1 else torch.cat(picked)), order

    def noise(self, choices: Sequence[Choice | None]) -> torch.Tensor | None:
        """The step's draw noise `q` [len(choices), V]: Exp(1) on every row that samples, 1.0
        elsewhere; the rows without a seed in one call on the device's default generator, in row
        order, each seeded row from its own generator. None when no row samples (nothing drawn)."""
        sampling = [row for row, choice in enumerate(choices) if choice is not None and not choice.sampling.greedy]
        if not sampling:
            return None
        total = len(choices)
        shared = [row for row in sampling if choices[row].generator is None]
        if len(shared) == total:
            return torch.empty(total, self.vocab_size, device=self.device).exponential_()
        q = torch.ones(total, self.vocab_size, device=self.device)
        if shared:
            drawn = torch.empty(len(shared), self.vocab_size, device=self.device).exponential_()
            q[device_longs(shared, self.device)] = drawn
        for row in sampling:
            generator = choices[row].generator
            if generator is not None:
                q[row].exponential_(generator=generator)
        return q

    def _pick(self, scores: torch.Tensor, choices: list[Choice], key: tuple, q: torch.Tensor | None) -> torch.Tensor:
        greedy, temperature, top_k, top_p, min_p, penalty, ignore_eos = key
        if scores.dtype != torch.float32:
            scores = scores.float()
        if penalty != 1.0:  # RepetitionPenaltyLogitsProcessor, on the seen ids only
            seen = torch.stack([choice.seen for choice in choices])
            penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
            scores = torch.where(seen, penalized, scores)
        scores = scores.masked_fill(self._banned[int(ignore_eos)], -float("inf"))
        allowed = self.allowed(choices)
        if allowed is not None:
            scores = scores.masked_fill(to_device(allowed, scores.device).logical_not_(), -float("inf"))
        if greedy:
            return torch.argmax(scores, dim=-1)
        if temperature != 1.0:
            scores = scores / temperature
        if top_k:
            scores = _top_k(scores, top_k)
        if top_p < 1.0:
            scores = _top_p(scores, top_p)
        if min_p > 0.0:
            scores = _min_p(scores, min_p)
        return _draw(torch.softmax(scores, dim=-1), q)
