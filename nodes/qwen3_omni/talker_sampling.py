"""How a talker step picks codes for many replies at once: one `[B, V]` op per stage, not one
processor list per reply.

The talker's code goes through what `generate()` applies (transformers' processors, in this
order): repetition penalty over the reply's earlier codes, suppression of the codec specials
(all but codec EOS), then, when sampling, temperature, top-k and top-p, softmax and a draw.
The code predictor's residual codes: greedy, or top-k 50 + top-p 0.8 and a draw. Each stage
here is the processor's own arithmetic (same elementwise ops with the same Python-float
operands, the same `topk` / `sort` / `softmax` / `cumsum`), applied to all rows that share
the setting, so each row gets the numbers its own processor would give it.

Draws: a reply with a seed has its own generator and gets exactly the draws it would get
alone (`torch.multinomial` on its own row, in the same order: the talker code, then the
residuals group by group). Replies without a seed share the global generator and draw in one
call: the same distribution, not the same random stream as one call per reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

_RESIDUAL_TOP_K = 50  # the code predictor's sampling in generate()
_RESIDUAL_TOP_P = 0.8


class CodeHistory:
    """The codes a reply's talker has emitted so far, as a mask over the talker's vocabulary
    (what the repetition penalty reads: one index write per frame, not a tensor rebuilt from a
    list each step); `codes` keeps them in order (only tests read it: transformers' processors
    take the list)."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.codes: list[int] = []

    def add(self, code: int) -> None:
        self.codes.append(code)
        self.mask[code] = True


def check_settings(sampling: Any) -> None:
    """Raise ValueError for settings transformers' processors refuse (temperature <= 0, a negative
    top-k, top-p outside [0, 1], a penalty <= 0), for the stages this reply applies: the stages
    here use their arithmetic, not their constructors' checks, so a reply runs those once."""
    if sampling.repetition_penalty != 1.0:
        RepetitionPenaltyLogitsProcessor(float(sampling.repetition_penalty))
    if sampling.do_sample:
        if sampling.temperature != 1.0:
            TemperatureLogitsWarper(float(sampling.temperature))
        if sampling.top_k:
            TopKLogitsWarper(top_k=int(sampling.top_k))
        if sampling.top_p < 1.0:
            TopPLogitsWarper(top_p=float(sampling.top_p))


def _groups(replies: Sequence[Any], key) -> list[tuple[Any, list[int]]]:
    """Row indices grouped by `key(reply)`, in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for row, reply in enumerate(replies):
        groups.setdefault(key(reply), []).append(row)
    return list(groups.items())


def _rows(scores: torch.Tensor, rows: list[int], total: int) -> torch.Tensor:
    if len(rows) == total:
        return scores
    return scores[torch.tensor(rows, device=scores.device)]


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """TopKLogitsWarper(top_k) (min_tokens_to_keep 1)."""
    top_k = min(max(top_k, 1), scores.size(-1))
    return scores.masked_fill(scores < torch.topk(scores, top_k)[0][..., -1, None], -float("inf"))


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """TopPLogitsWarper(top_p) (min_tokens_to_keep 1)."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
    sorted_indices_to_remove[..., -1:] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("inf"))


def _draw(scores: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One code per row from softmax(scores): each seeded row from its own generator, the rest
    in one call on the global generator."""
    probs = torch.softmax(scores, dim=-1)
    shared = [row for row, generator in enumerate(generators) if generator is None]
    if len(shared) == len(generators):
        return torch.multinomial(probs, num_samples=1).view(-1)
    codes = torch.empty(len(generators), dtype=torch.long, device=scores.device)
    if shared:
        index = torch.tensor(shared, device=scores.device)
        codes[index] = torch.multinomial(probs[index], num_samples=1).view(-1)
    for row, generator in enumerate(generators):
        if generator is not None:
            codes[row] = torch.multinomial(probs[row : row + 1], num_samples=1, generator=generator)[0, 0]
    return codes


def _scatter(codes: torch.Tensor | None, rows: list[int], total: int, picked: torch.Tensor) -> torch.Tensor:
    if len(rows) == total:
        return picked
    if codes is None:
        codes = torch.empty(total, dtype=torch.long, device=picked.device)
    codes[torch.tensor(rows, device=picked.device)] = picked
    return codes


def talker_codes(replies: Sequence[Any], logits: torch.Tensor, suppress: torch.Tensor) -> torch.Tensor:
    """The talker's code for each row of `logits` [B, V] (float32, consumed).

    `replies[i].sampling` (a TalkerSampling), `.code_history` (CodeHistory) and `._generator` are
    read; `suppress` is the [V] mask of codes that may never be picked.
    """
    total = len(replies)
    codes = None
    for settings, rows in _groups(replies, lambda r: _talker_key(r.sampling)):
        do_sample, penalty, temperature, top_k, top_p = settings
        scores = _rows(logits, rows, total)
        if penalty != 1.0:  # RepetitionPenaltyLogitsProcessor: the earlier codes' scores only
            seen = torch.stack([replies[row].code_history.mask for row in rows])
            penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
            scores = torch.where(seen, penalized, scores)
        scores = torch.where(suppress, -float("inf"), scores)  # SuppressTokensLogitsProcessor
        if not do_sample:
            picked = torch.argmax(scores, dim=-1)
        else:
            if temperature != 1.0:
                scores = scores / temperature
            if top_k:
                scores = _top_k(scores, top_k)
            if top_p < 1.0:
                scores = _top_p(scores, top_p)
            picked = _draw(scores, [replies[row]._generator for row in rows])
        codes = _scatter(codes, rows, total, picked)
    return codes


def residual_codes(replies: Sequence[Any], logits: torch.Tensor) -> torch.Tensor:
    """One residual code per row of `logits` [B, V] (float32): greedy rows by argmax, sampled rows
    through top-k 50 and top-p 0.8 (the code predictor's settings in `generate()`)."""
    sampled = [row for row, reply in enumerate(replies) if reply.sampling.do_sample]
    if not sampled:
        return torch.argmax(logits, dim=-1)
    total = len(replies)
    scores = _top_p(_top_k(_rows(logits, sampled, total), _RESIDUAL_TOP_K), _RESIDUAL_TOP_P)
    picked = _draw(scores, [replies[row]._generator for row in sampled])
    if len(sampled) == total:
        return picked
    codes = torch.argmax(logits, dim=-1)
    codes[torch.tensor(sampled, device=logits.device)] = picked
    return codes


def _talker_key(sampling: Any) -> tuple[bool, float, float, int, float]:
    if not sampling.do_sample:  # greedy ignores temperature / top-k / top-p
        return (False, float(sampling.repetition_penalty), 1.0, 0, 1.0)
    return (
        True,
        float(sampling.repetition_penalty),
        float(sampling.temperature),
        int(sampling.top_k),
        float(sampling.top_p),
    )
