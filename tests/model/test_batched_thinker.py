"""Cross-session batching of the thinker: one forward for every session's decode step, same results.

These tests are also the guard of the slot cache's coupling to transformers internals (the
attention layers' `cache.update(...)` and a 4-D mask passed through as-is; transformers is
pinned in pyproject): if an upgrade breaks it, batched logits stop matching sequential ones.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from graph.executor import ComputePool, current_due
from nodes.qwen3_omni.batched_thinker import AGAIN, ThinkerExecutor, ThinkerRunner, _Call, run_calls
from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.slot_cache import SlotKVCache
from nodes.qwen3_omni.thinker_engine import ThinkerError, ThinkerSession
from tests.model.test_thinker import png, speech


def text_turn(omni, words: int, first: bool = True, seed: int = 0) -> dict:
    text = " ".join(f"w{(seed * 7 + i) % 31}" for i in range(words))
    inputs = build_turn_inputs(omni, system_prompt="You are terse." if first else None, text=text,
                               add_generation_prompt=True)
    return encode_turns(omni, [inputs.tensors()])[0]


def media_turn(omni, seed: int) -> dict:
    inputs = build_turn_inputs(omni, audio=speech(0.6, seed=seed), images=[png(64, 64, seed=seed)], text="and this?",
                               add_generation_prompt=True)
    return encode_turns(omni, [inputs.tensors()])[0]


def step_together(runner: ThinkerRunner, sessions: list[ThinkerSession]) -> list:
    """One decode step of every session through the executor's batch function."""
    results = run_calls(runner, [_Call(s.decode_work()) for s in sessions])
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_batched_decoding_matches_sequential_decoding_across_turns(omni):
    # Prefixes of different lengths (one with audio + an image on its second turn), replies of
    # different lengths (sessions finish at different steps, their last token fed in the batch).
    prefixes = [3, 40, 11, 90]
    limits = [6, 4, 6, 5]

    def open_sessions():
        sessions = [ThinkerSession(omni, max_reply_tokens=n) for n in limits]
        for session, words in zip(sessions, prefixes):
            session.prefill(text_turn(omni, words, seed=words))
        return sessions

    alone, together = open_sessions(), open_sessions()
    runner = together[0]._runner
    for turn_index in range(2):
        if turn_index:  # second turn: the KV of the first turn and its reply is kept in every row
            for pair in (alone, together):
                for i, session in enumerate(pair):
                    turn = media_turn(omni, i) if i == 1 else text_turn(omni, 5 + i, first=False, seed=i)
                    session.prefill(turn)
        expected = []
        for session in alone:
            steps = []
            while (step := session.decode_step()).finish_reason is None:
                steps.append((step.token_id, session._last_logits.clone()))
            steps.append((step.token_id, None))
            expected.append(steps)

        got: list[list] = [[] for _ in together]
        live = list(range(len(together)))
        while live:
            forwards = runner.forwards
            results = step_together(runner, [together[i] for i in live])
            assert runner.forwards - forwards <= 2  # one forward for all, +1 when replies end
            for i, step in zip(list(live), results):
                logits = together[i]._last_logits.clone() if step.finish_reason is None else None
                got[i].append((step.token_id, logits))
                if step.finish_reason is not None:
                    live.remove(i)

        for mine, reference in zip(got, expected):
            assert [t for t, _ in mine] == [t for t, _ in reference]
            for (_, a), (_, b) in zip(mine, reference):
                if a is not None:
                    assert (a - b).abs().max().item() < 1e-5
        for a, b in zip(together, alone):
            assert a.context_ids == b.context_ids
            assert a.cache.get_seq_length() == a.context_length


def test_sessions_decoding_at_once_through_the_executor_share_forwards(omni):
    async def main(sessions):
        compute = ComputePool(threads=2)
        executor = ThinkerExecutor(compute, omni, max_batch=16, name="thinker-test")

        async def reply(session):
            tokens = []
            while (step := await executor.decode(session)).finish_reason is None:
                tokens.append(step.token_id)
            return tokens + ([step.token_id] if step.token_id is not None else [])

        try:
            return await asyncio.gather(*(reply(s) for s in sessions)), executor.batcher
        finally:
            compute.shutdown()

    def open_sessions():
        sessions = [ThinkerSession(omni, max_reply_tokens=8) for _ in range(6)]
        for i, session in enumerate(sessions):
            session.prefill(text_turn(omni, 4 + 9 * i, seed=i))
        return sessions

    alone = open_sessions()
    expected = []
    for session in alone:
        tokens = []
        while (step := session.decode_step()).finish_reason is None:
            tokens.append(step.token_id)
        expected.append(tokens + ([step.token_id] if step.token_id is not None else []))

    replies, batcher = asyncio.run(main(open_sessions()))
    assert replies == expected
    assert batcher.items_run == 6 * 8
    assert batcher.batches_run < batcher.items_run  # steps of different sessions went through together


def test_a_chunked_prefill_equals_a_one_shot_prefill(omni):
    turn = build_turn_inputs(omni, system_prompt="sys", audio=speech(0.8, seed=3), images=[png(96, 64, seed=3)],
                             text="what is this, in detail?", add_generation_prompt=True)
    encoded = encode_turns(omni, [turn.tensors()])[0]
    whole = ThinkerSession(omni, max_reply_tokens=4)
    chunked = ThinkerSession(omni, max_reply_tokens=4, prefill_chunk_tokens=5)
    a, b = whole.prefill(encoded), chunked.prefill(encoded)
    assert chunked.tokens_forwarded == whole.tokens_forwarded == len(encoded["input_ids"])
    torch.testing.assert_close(b.multimodal_hidden, a.multimodal_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked._last_logits, whole._last_logits, atol=1e-5, rtol=1e-5)
    assert [chunked.decode_step().token_id for _ in range(3)] == [whole.decode_step().token_id for _ in range(3)]


def test_a_new_turns_prefill_runs_one_chunk_between_decode_steps(omni):
    runner = ThinkerRunner.for_model(omni)
    decoding = [ThinkerSession(omni, max_reply_tokens=50) for _ in range(2)]
    for i, session in enumerate(decoding):
        session.prefill(text_turn(omni, 6, seed=i))
    # 16-token chunks: the prefill's 7 chunks fit within the 11 tokens the others reply before EOS.
    newcomer = ThinkerSession(omni, max_reply_tokens=4, prefill_chunk_tokens=16)
    turn = text_turn(omni, 20, seed=5)
    prefill = _Call(newcomer.prefill_work(turn))
    chunks = -(-len(turn["input_ids"]) // 16)
    assert chunks >= 3
    batches = 0
    while True:
        batches += 1
        forwards = runner.forwards
        results = run_calls(runner, [prefill] + [_Call(s.decode_work()) for s in decoding])
        # Every batch: the decode steps (one forward for both) and at most one prefill chunk.
        assert all(step.finish_reason is None for step in results[1:])
        assert runner.forwards - forwards <= 2
        if results[0] is not AGAIN:
            break
    assert batches == chunks
    assert results[0].new_tokens == len(turn["input_ids"])
    reference = ThinkerSession(omni, max_reply_tokens=4)
    reference.prefill(turn)
    torch.testing.assert_close(newcomer._last_logits, reference._last_logits, atol=1e-5, rtol=1e-5)


def audio_turn(omni, seconds: float, seed: int) -> dict:
    inputs = build_turn_inputs(omni, audio=speech(seconds, seed=seed), add_generation_prompt=True)
    return encode_turns(omni, [inputs.tensors()])[0]


def test_turns_that_arrive_together_are_prefilled_in_one_forward_with_the_same_results(omni):
    # Different lengths (padded to the longest), text and audio, sessions with and without history.
    def open_sessions():
        sessions = [ThinkerSession(omni, max_reply_tokens=6) for _ in range(4)]
        sessions[3].prefill(text_turn(omni, 12, seed=9))  # one with history: its row does not start at 0
        while sessions[3].decode_step().finish_reason is None:
            pass
        return sessions

    turns = [text_turn(omni, 3, seed=1), audio_turn(omni, 0.7, seed=2), text_turn(omni, 30, seed=3),
             audio_turn(omni, 0.4, seed=4)]
    alone, together = open_sessions(), open_sessions()
    expected = [session.prefill(turn) for session, turn in zip(alone, turns)]
    runner = together[0]._runner
    forwards = runner.forwards
    results = run_calls(runner, [_Call(session.prefill_work(turn)) for session, turn in zip(together, turns)])
    assert runner.forwards - forwards == 1  # all four prefills: one forward
    for got, want, a, b in zip(results, expected, together, alone):
        assert got.new_tokens == want.new_tokens
        torch.testing.assert_close(got.multimodal_hidden, want.multimodal_hidden, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a._last_logits, b._last_logits, atol=1e-5, rtol=1e-5)
        assert a.cache.get_seq_length() == a.context_length == b.context_length
    # The padding left nothing behind: the replies are the ones each session gets alone.
    for a, b in zip(together, alone):
        mine, theirs = [], []
        while (step := a.decode_step()).finish_reason is None:
            mine.append(step.token_id)
        while (step := b.decode_step()).finish_reason is None:
            theirs.append(step.token_id)
        assert mine == theirs


def test_rollback_is_a_shorter_row_and_a_closed_sessions_row_is_reused(omni):
    session = ThinkerSession(omni, max_reply_tokens=5)
    session.prefill(text_turn(omni, 12))
    while session.decode_step().finish_reason is None:
        pass
    slot, cache = session._slot, session._runner.cache
    assert cache.length(slot) == session.context_length
    before = session.context_length
    session.truncate_reply(2)
    assert cache.length(slot) == session.context_length == before - 3

    session.close()
    with pytest.raises(ThinkerError) as error:
        session.prefill(text_turn(omni, 3, first=False))
    assert error.value.code == "session_closed"
    newcomer = ThinkerSession(omni, max_reply_tokens=2)
    newcomer.prefill(text_turn(omni, 4))
    assert newcomer._slot == slot  # the freed row went to the next session, from column 0
    assert cache.length(slot) == newcomer.context_length


def test_slot_cache_grows_and_keeps_what_rows_hold():
    cache = SlotKVCache(layers=1, kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu", slots=1, capacity=4)
    first = cache.acquire()
    keys = [torch.arange(2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4)]
    cache.load(first, keys, [k + 100 for k in keys])
    second = cache.acquire()  # all slots taken: the cache doubles its rows
    batch = cache.batch([second], 6)  # longer than the capacity: the cache doubles its columns
    assert cache.slots == 2 and cache.capacity == 8
    k, v = cache.row(first, 0)
    assert torch.equal(k, keys[0][0]) and torch.equal(v, keys[0][0] + 100)
    assert batch.mask.shape == (1, 1, 6, 6)
    assert np.isclose(batch.mask[0, 0, 0, 1].item(), torch.finfo(torch.float32).min)  # causal within the row
    cache.lengths[second] = 7
    step = cache.batch([second, first], 1)  # one new token each: row `second` sees 8 columns, `first` 4
    assert step.mask.shape == (2, 1, 1, 8)
    assert (step.mask[0, 0, 0] == 0).all()
    assert (step.mask[1, 0, 0, :4] == 0).all() and (step.mask[1, 0, 0, 4:] == torch.finfo(torch.float32).min).all()
    new_keys = torch.full((2, 2, 1, 4), 7.0)
    rows_keys, _ = step.update(new_keys, new_keys + 1, 0)  # the new columns land at each row's length
    assert torch.equal(cache.keys[0][second, :, 7], new_keys[0, :, 0])
    assert torch.equal(cache.keys[0][first, :, 3], new_keys[1, :, 0])
    assert torch.equal(rows_keys[1, :, :3], keys[0][0])  # what row `first` held is kept, in the given row order


def test_a_prefill_chunk_waits_while_a_more_urgent_reply_decodes_in_the_same_batch(omni):
    # Issue 16: calls come most urgent first. A reply waiting for its first audio (first in the
    # batch) must not pay a long prefill's chunk with each of its tokens; the chunk waits
    # (AGAIN) and goes through in the next batch where no more urgent call feeds.
    runner = ThinkerRunner.for_model(omni)
    urgent = ThinkerSession(omni, max_reply_tokens=50)
    urgent.prefill(text_turn(omni, 6, seed=1))
    urgent.decode_step()  # its first token came with the prefill; from here each one is a forward
    long_turn = ThinkerSession(omni, max_reply_tokens=4, prefill_chunk_tokens=16)
    prefill = _Call(long_turn.prefill_work(text_turn(omni, 20, seed=5)))

    forwards = runner.forwards
    results = run_calls(runner, [_Call(urgent.decode_work()), prefill])
    assert results[1] is AGAIN and runner.forwards - forwards == 1  # the decode step alone

    forwards = runner.forwards
    results = run_calls(runner, [prefill, _Call(urgent.decode_work())])  # the prefill first now
    assert results[0] is AGAIN and results[1] is not AGAIN
    assert runner.forwards - forwards == 2  # the decode step and a chunk


async def test_a_call_handed_back_before_its_first_forward_keeps_its_place_in_line(omni):
    # A prefill handed back (AGAIN) because more urgent calls fed in that batch has not started:
    # it keeps its first submission's due time (an utterance prefilled in its pause: when the pause
    # came), or its task's, if that became earlier (the turn ended). Due "now" at every try, it
    # went behind every reply that was catching up, batch after batch, and could still wait when
    # its turn ended. Once a chunk of it ran, its next chunk is a continuation (due no earlier than now).
    class Batcher:
        def __init__(self, script):
            self.script, self.dues = script, []

        async def submit(self, call, priority, due):
            self.dues.append(due)
            step = self.script.pop(0)
            if step == "confirmed":
                current_due.set(lambda: 1.0)  # the turn ended: its work is due since long ago
            call.ran = call.ran or step == "ran"
            return AGAIN if self.script else "result"

    pool = ComputePool(threads=0)
    executor = ThinkerExecutor(pool, omni)
    try:
        executor.batcher = Batcher(["fed", "fed", "confirmed", "ran", "last"])
        token = current_due.set(time.monotonic)  # an unasked utterance: due when submitted
        try:
            assert await executor.call(iter(())) == "result"
        finally:
            current_due.reset(token)
    finally:
        pool.shutdown()
    first, kept, again, confirmed, continued = executor.batcher.dues
    assert kept == again == first < time.monotonic()
    assert confirmed == 1.0
    assert continued > first  # after a chunk ran: behind work that waited since before now
