"""The thinker's next tokens are chosen on the device, for the whole batch at once
(thinker_sampling.py): each sampling control on its own, seeded draws, and what one decode step
of 16 sessions costs the host."""

from __future__ import annotations

import pytest
import torch

from benchmarks.dispatch_counts import DispatchCounts
from benchmarks.step_costs import thinker_step_costs
from nodes.qwen3_omni.batched_thinker import _Call, run_calls
from nodes.qwen3_omni.thinker_engine import ThinkerSession
from nodes.qwen3_omni.thinker_requests import Choice
from nodes.qwen3_omni.thinker_sampling import Sampling, ThinkerSampler
from tests.model.test_batched_thinker import text_turn

VOCAB = 32
EOS = 3
SUPPRESSED = (30, 31)
# A decode step of 16 sessions through the executor's batch function, on the tiny checkpoint:
# 195 aten operators when this was written (384 with a host choice per session), nearly all of
# them the forward's; a captured step is what takes the rest away.
OPS_PER_STEP_16 = 200


@pytest.fixture
def sampler():
    return ThinkerSampler(VOCAB, suppressed=SUPPRESSED, eos=(EOS,), device="cpu")


def choices(count: int, **settings) -> list[Choice]:
    return [Choice(Sampling(**settings)) for _ in range(count)]


def test_a_decode_step_of_16_sessions_reads_the_host_once(omni):
    costs = thinker_step_costs(omni, sessions=16, steps=2)
    assert costs["host_syncs_per_step"] == 1  # the chosen ids, all rows in one `tolist()`
    assert 0 < costs["ops_per_step"] <= OPS_PER_STEP_16


def test_a_step_of_sessions_that_sample_differently_still_reads_the_host_once(omni):
    settings = [Sampling(), Sampling(temperature=0.8, top_k=20, seed=1),
                Sampling(temperature=1.2, top_p=0.9, min_p=0.05, seed=2), Sampling(repetition_penalty=1.3),
                Sampling(temperature=0.7, repetition_penalty=1.1)]
    sessions = [ThinkerSession(omni, settings[i % len(settings)], max_reply_tokens=8) for i in range(16)]
    for i, session in enumerate(sessions):
        session.prefill(text_turn(omni, 3 + i, seed=i))
    try:
        for step in range(2):  # the first token comes from the prefill's logits, then a feed chooses
            with DispatchCounts() as counts:
                results = run_calls(sessions[0]._runner, [_Call(s.decode_work()) for s in sessions])
            assert not [r for r in results if isinstance(r, BaseException)]
            assert counts.host_syncs == 1, step
    finally:
        for session in sessions:
            session.close()


def test_greedy_picks_the_argmax_of_the_logits_with_the_banned_ids_masked(sampler):
    logits = torch.randn(64, VOCAB)
    logits[:8, SUPPRESSED[0]] = 100.0  # a special token that is never text: never chosen
    expected = logits.masked_fill(torch.isin(torch.arange(VOCAB), torch.tensor(SUPPRESSED)), -float("inf")).argmax(-1)
    assert sampler.choose(logits, choices(64)) == expected.tolist()


def test_top_k_1_is_greedy(sampler):
    torch.manual_seed(0)
    logits = torch.randn(64, VOCAB) * 3
    greedy = sampler.choose(logits, choices(64))
    assert sampler.choose(logits, choices(64, temperature=1.5, top_k=1)) == greedy


def test_min_p_never_picks_an_id_below_its_share_of_the_top_probability(sampler):
    probs = torch.full((VOCAB,), 1e-4)
    probs[4:8] = torch.tensor([0.4, 0.3, 0.2, 0.05])  # min_p 0.2: ids below 0.08 are out
    logits = probs.log().expand(4000, -1)
    picked = set(sampler.choose(logits, choices(4000, temperature=1.0, min_p=0.2)))
    assert picked == {4, 5, 6}  # every id above the bound is drawn, none below it
    assert 7 in set(sampler.choose(logits, choices(4000, temperature=1.0)))  # without min_p: drawn


def test_the_repetition_penalty_lowers_a_seen_ids_logit(sampler):
    logits = torch.full((2, VOCAB), -float("inf"))
    logits[0, :2] = torch.tensor([2.0, 1.9])  # positive: divided by the penalty, 2.0 -> 1.33
    logits[1, :2] = torch.tensor([-1.0, -1.2])  # negative: multiplied, -1.0 -> -1.5
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[0] = True
    plain = [Choice(Sampling(repetition_penalty=1.5)) for _ in range(2)]
    penalized = [Choice(Sampling(repetition_penalty=1.5), seen=seen) for _ in range(2)]
    assert sampler.choose(logits, [Choice(Sampling()), Choice(Sampling())]) == [0, 0]
    assert sampler.choose(logits, [Choice(c.sampling, seen=torch.zeros_like(seen)) for c in plain]) == [0, 0]
    assert sampler.choose(logits, penalized) == [1, 1]


def test_ignore_eos_never_picks_eos(sampler):
    logits = torch.randn(256, VOCAB)
    logits[:, EOS] = 5.0  # EOS is by far the likeliest id
    assert set(sampler.choose(logits, choices(256))) == {EOS}
    assert EOS not in sampler.choose(logits, choices(256, ignore_eos=True))
    assert EOS not in sampler.choose(logits, choices(256, ignore_eos=True, temperature=2.0))


def test_only_ids_the_grammar_allows_are_chosen(sampler):
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[5, 9]] = True
    logits = torch.randn(200, VOCAB)
    rows = [Choice(Sampling(temperature=2.0), allowed=allowed if i % 2 else None) for i in range(200)]
    picked = sampler.choose(logits, rows)
    assert set(picked[1::2]) == {5, 9}
    assert len(set(picked[0::2])) > 2  # the rows without a grammar are not held to it


def test_a_draw_is_the_one_torch_multinomial_makes_from_the_same_generator(sampler):
    logits = torch.randn(1, VOCAB)
    for seed in range(8):
        probs = torch.softmax(logits.masked_fill(sampler._banned[0], -float("inf")), dim=-1)
        expected = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).item()
        assert sampler.choose(logits, [Choice(Sampling(temperature=1.0), torch.Generator().manual_seed(seed))]) == [expected]


def test_a_seeded_row_draws_the_same_ids_alone_and_batched_with_others(sampler):
    logits = torch.randn(6, VOCAB)
    settings = Sampling(temperature=1.3, top_p=0.95, seed=5)

    def draws(rows: list[int], steps: int = 10) -> list[int]:
        generator = torch.Generator().manual_seed(5)
        row_choices = [Choice(settings, generator if row == 2 else None) for row in rows]
        return [sampler.choose(logits[rows], row_choices)[rows.index(2)] for _ in range(steps)]

    assert draws([2]) == draws([0, 1, 2, 3, 4, 5]) == draws([5, 2])


def test_rows_with_different_settings_each_get_their_own(sampler):
    logits = torch.randn(6, VOCAB)
    rows = [Choice(Sampling()), Choice(Sampling(temperature=1.0, top_k=1)), Choice(Sampling(ignore_eos=True))] * 2
    logits[2, EOS] = logits[5, EOS] = 50.0
    picked = sampler.choose(logits, rows)
    greedy = sampler.choose(logits, choices(6))
    assert picked[:2] == greedy[:2] and picked[3:5] == greedy[3:5]
    assert greedy[2] == greedy[5] == EOS and EOS not in (picked[2], picked[5])


def test_a_seeded_session_replies_the_same_alone_and_batched(omni):
    sampling = Sampling(temperature=3.0, top_k=50, min_p=0.01, repetition_penalty=1.2, seed=11, ignore_eos=True)

    def reply(batch: int) -> list[int]:
        sessions = [ThinkerSession(omni, sampling if i == 0 else Sampling(temperature=2.0), max_reply_tokens=10)
                    for i in range(batch)]
        for i, session in enumerate(sessions):
            session.prefill(text_turn(omni, 6 + 5 * i, seed=i))
        live = list(sessions)
        try:
            while sessions[0].replying:
                run_calls(sessions[0]._runner, [_Call(s.decode_work()) for s in live])
                live = [s for s in live if s.replying]
            return sessions[0].reply_token_ids
        finally:
            for session in sessions:
                session.close()

    alone = reply(1)
    assert len(alone) == 10 and reply(4) == alone


def test_min_p_and_the_repetition_penalty_are_read_from_the_sampling_settings():
    sampling = Sampling.from_dict({"temperature": 0.7, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 3})
    assert (sampling.min_p, sampling.repetition_penalty, sampling.seed) == (0.05, 1.1, 3)
    assert (Sampling.from_dict({}).min_p, Sampling.from_dict({}).repetition_penalty) == (0.0, 1.0)


def test_a_repetition_penalty_session_keeps_its_seen_ids_to_its_context(omni):
    session = ThinkerSession(omni, Sampling(repetition_penalty=1.5), max_reply_tokens=6)
    session.prefill(text_turn(omni, 9, seed=1))
    while session.decode_step().finish_reason is None:
        seen = torch.zeros(omni.thinker.config.text_config.vocab_size, dtype=torch.bool)
        seen[session.context_ids + session.reply_token_ids] = True
        assert torch.equal(session._seen, seen)
    session.truncate_reply(2)
    assert session._seen is None  # rebuilt from the context at the next choice
    session.close()
