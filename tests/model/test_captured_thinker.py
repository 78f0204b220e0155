"""Captured thinker decode steps (`compute: {graphs: auto}`) give what the eager steps give, step by step."""

from __future__ import annotations

import pytest
import torch

from benchmarks.dispatch_counts import DispatchCounts
from nodes.qwen3_omni.batched_thinker import ThinkerRunner
from nodes.qwen3_omni.captured import padded_batch
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession
from nodes.qwen3_omni.thinker_requests import Choice, Feed
from tests.model.test_batched_thinker import step_together, text_turn


@pytest.fixture
def runner(omni):
    """The model's shared runner, graphs auto again after the test (tests switch it per step)."""
    runner = ThinkerRunner.for_model(omni)
    yield runner
    runner.graphs = "auto"


def _steps(runner: ThinkerRunner, graphs: str, sessions: list[ThinkerSession]) -> list:
    runner.graphs = graphs
    return step_together(runner, sessions)


def _run_side_by_side(omni, runner, joins: dict[str, int], limits: dict[str, int], closes: dict[str, int],
                      sampling: dict[str, Sampling], steps: int):
    """Each named session twice (eager, captured) on the same prompt; step by step, each side's
    live sessions go through one batched step, the eager side with graphs off."""
    pairs = {}
    for index, name in enumerate(joins):
        pairs[name] = [ThinkerSession(omni, sampling.get(name, Sampling()), max_reply_tokens=limits.get(name, 64))
                       for _ in range(2)]
    unit = runner.step_unit
    replays, sizes, compared, done = unit.replays, set(), 0, set()
    try:
        for step in range(steps):
            for name, (eager, captured) in pairs.items():
                if joins[name] == step:  # joins: its prefill, then its first token with the others' step
                    eager.prefill(text_turn(omni, 3 + 9 * list(joins).index(name), seed=len(name)))
                    captured.prefill(text_turn(omni, 3 + 9 * list(joins).index(name), seed=len(name)))
                if closes.get(name) == step:  # leaves between steps
                    eager.close()
                    captured.close()
            live = [name for name in pairs if joins[name] <= step and closes.get(name, steps) > step and name not in done]
            if not live:
                continue
            before = unit.replays
            want = _steps(runner, "off", [pairs[name][0] for name in live])
            got = _steps(runner, "auto", [pairs[name][1] for name in live])
            if unit.replays > before:
                sizes.add(padded_batch(unit.replayed_rows))
            for name, w, g in zip(live, want, got):
                assert (g.token_id, g.finish_reason) == (w.token_id, w.finish_reason), (step, name)
                eager, captured = pairs[name]
                torch.testing.assert_close(captured._last_logits, eager._last_logits, rtol=1e-5, atol=1e-5)
                compared += 1
                if w.finish_reason is not None:
                    done.add(name)
        for name, (eager, captured) in pairs.items():
            if closes.get(name) is None:
                assert captured.context_ids == eager.context_ids, name
    finally:
        for pair in pairs.values():
            for session in pair:
                session.close()
    return unit.replays - replays, sizes, compared


def test_captured_steps_give_the_eager_tokens_and_logits_as_sessions_join_and_leave(omni, runner):
    # A from the start, B joins at step 2, C and D at step 3, E at 5 (5 rows: padded to 8), F at
    # 7 (6 rows), C closes at step 9, B ends on its token limit, D ignores EOS to run long.
    joins = {"A": 0, "B": 2, "C": 3, "D": 3, "E": 5, "F": 7}
    replays, sizes, compared = _run_side_by_side(
        omni, runner, joins, limits={"B": 6}, closes={"C": 9},
        sampling={"D": Sampling(ignore_eos=True), "F": Sampling(ignore_eos=True)}, steps=24)
    assert replays >= 20
    assert {1, 2, 4, 8} <= sizes  # padding rows: 3, 5 and 6 rows among them
    assert compared >= 60


def test_a_repetition_penalty_is_captured_too(omni, runner):
    penalized = Sampling(repetition_penalty=1.3, ignore_eos=True)
    replays, sizes, _ = _run_side_by_side(omni, runner, {"A": 0, "B": 0, "C": 1}, limits={}, closes={},
                                          sampling={"A": penalized, "C": Sampling(repetition_penalty=0.8)}, steps=10)
    assert replays >= 8 and 4 in sizes


def test_seeded_sampled_sessions_draw_the_eager_tokens_as_they_join_and_leave(omni, runner):
    # Every setting of the sampler: temperature alone, top-k, top-p, min-p, all at once, with a
    # repetition penalty, beside greedy rows: one sampled unit per step, padding rows among them.
    sampled = {
        "A": Sampling(temperature=0.9, seed=11, ignore_eos=True),
        "B": Sampling(temperature=0.7, top_k=5, seed=12),
        "C": Sampling(temperature=1.0, top_p=0.8, seed=13, ignore_eos=True),
        "D": Sampling(temperature=1.3, min_p=0.05, seed=14, ignore_eos=True),
        "E": Sampling(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2, seed=15,
                      ignore_eos=True),
        "F": Sampling(ignore_eos=True),  # greedy, in the same unit
    }
    joins = {"A": 0, "B": 0, "C": 2, "D": 3, "E": 5, "F": 6}
    replays, sizes, compared = _run_side_by_side(omni, runner, joins, limits={"B": 9}, closes={"D": 14},
                                                 sampling=sampled, steps=30)
    assert replays >= 25
    assert {2, 4, 8} <= sizes  # 3, 5 and 6 rows padded among them
    assert compared >= 100
    assert any(sampled for _, _, sampled, _, _ in runner.step_unit._graphs)


def _eager_and_captured(omni, slots: int) -> tuple[ThinkerRunner, ThinkerRunner]:
    """Two runners of their own (each its own cache, every row taken), graphs off and auto."""
    eager, captured = (ThinkerRunner(omni, slots=slots, capacity=64, graphs=graphs) for graphs in ("off", "auto"))
    for runner in (eager, captured):
        for _ in range(slots):
            runner.cache.acquire()
    return eager, captured


def _answers(runner: ThinkerRunner, rows: list[int], last: dict[int, int], choices: dict[int, Choice]) -> list:
    return runner.answer([Feed(row, last[row], runner.cache.lengths[row], None, choices[row]) for row in rows])


def test_unseeded_rows_draw_the_eager_tokens_from_the_same_default_generator(omni):
    # Rows without a seed share the device's default generator: one draw of the step's noise,
    # in row order, outside the captured region: the same noise, the same tokens.
    eager, captured = _eager_and_captured(omni, slots=4)
    choices = {0: Choice(Sampling(temperature=1.0)), 1: Choice(Sampling(ignore_eos=True)),
               2: Choice(Sampling(temperature=0.7, top_p=0.9, ignore_eos=True))}
    last = {row: 30 + row for row in range(3)}
    for step in range(12):
        answers = []
        for runner in (eager, captured):
            torch.manual_seed(step)
            answers.append(_answers(runner, [0, 1, 2], last, choices))
        for row, want, got in zip(range(3), *answers):
            assert got.token == want.token, (step, row)
            last[row] = got.token
    assert captured.step_unit.replays == 12 and captured.step_unit.replayed_key[2]


def test_a_grammar_masked_row_picks_only_allowed_ids_and_the_eager_ones(omni):
    # Masked rows (greedy and sampled) beside rows without a grammar, the mask changing every
    # step as a grammar's does, a masked step after an unmasked one and back, padding rows.
    eager, captured = _eager_and_captured(omni, slots=8)
    vocab = captured.step_unit.vocab_size
    masks = torch.Generator().manual_seed(5)
    last = {row: 40 + row for row in range(8)}
    schedule = [[0, 1, 2], [0, 1, 2], [0, 1, 2, 3, 4], [1, 3], [0, 1, 2, 3, 4, 5, 6, 7], [2, 5, 6]]
    masked_picks = 0
    for step, rows in enumerate(schedule * 2):
        allowed = {row: torch.rand(vocab, generator=masks) < 0.1 for row in rows}
        masked = {row for row in rows if (row + step) % 3 != 2} if step != 3 else set()
        choices = {}
        for row in rows:
            sampled = Sampling(temperature=0.8, top_k=20, seed=row, ignore_eos=True)
            sampling = sampled if row % 2 else Sampling(ignore_eos=True)
            choices[row] = Choice(sampling, None, None, allowed[row] if row in masked else None)
        answers = []
        for runner in (eager, captured):
            for row in rows:  # each side its own generator in the same state
                if row % 2:
                    choices[row].generator = torch.Generator().manual_seed(100 * step + row)
            answers.append(_answers(runner, rows, last, choices))
        for row, want, got in zip(rows, *answers):
            assert got.token == want.token, (step, row)
            if row in masked:
                assert allowed[row][got.token], (step, row)
                masked_picks += 1
            last[row] = got.token
    assert masked_picks >= 20
    assert captured.step_unit.replays == captured.step_unit.steps == 2 * len(schedule)


@pytest.mark.parametrize("sampling", [
    [Sampling(ignore_eos=True)] * 3,
    [Sampling(temperature=0.8, top_k=10, top_p=0.9, seed=1, ignore_eos=True), Sampling(ignore_eos=True),
     Sampling(temperature=1.1, min_p=0.1, repetition_penalty=1.1, ignore_eos=True)],
], ids=["greedy", "greedy, seeded and unseeded sampled rows"])
def test_a_captured_step_reads_the_host_once(omni, runner, sampling):
    runner.graphs = "auto"
    sessions = [ThinkerSession(omni, setting, max_reply_tokens=12) for setting in sampling]
    for index, session in enumerate(sessions):
        session.prefill(text_turn(omni, 5 + 4 * index, seed=index))
    try:
        step_together(runner, sessions)  # the first tokens, from the prefills' logits
        step_together(runner, sessions)  # the first feeds (captures the padded batch of 4)
        replays = runner.step_unit.replays
        step_together(runner, sessions)
        assert runner.step_unit.replays == replays + 1
        with DispatchCounts("cpu") as counts:  # (under the counter, the unit runs as written)
            step_together(runner, sessions)
        assert counts.host_syncs == 1
    finally:
        for session in sessions:
            session.close()


def test_graphs_off_runs_every_step_eager(omni, runner):
    runner.graphs = "off"
    assert runner.step_unit is None


def test_captured_steps_equal_eager_ones_on_any_rows_with_padding(omni):
    # Two runners of their own (each its own cache), fed the same rows step by step: rows that
    # are the cache's first ones (read in place), rows with gaps (copied out), padded batches.
    eager, captured = _eager_and_captured(omni, slots=8)
    schedule = [({0}, 3), ({0, 1}, 3), ({0, 1, 2}, 4), ({0, 2}, 4), ({0, 1, 2, 5}, 4), ({1, 3, 4, 5, 6}, 3),
                ({0, 1, 2, 3, 4, 5, 6}, 4), ({6}, 2), ({0, 1, 2, 3, 4, 5, 6, 7}, 3)]
    last = {row: 17 + 5 * row for row in range(8)}  # each row feeds the token it was last given
    keys = set()
    for rows, steps in schedule:
        for _ in range(steps):
            answers = []
            for runner in (eager, captured):
                feeds = [Feed(row, last[row], runner.cache.lengths[row], None, Choice(Sampling())) for row in sorted(rows)]
                answers.append(runner.answer(feeds))
            keys.add(captured.step_unit.replayed_key)
            for row, want, got in zip(sorted(rows), *answers):
                assert got.token == want.token, row
                torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
                last[row] = got.token
    assert eager.cache.lengths == captured.cache.lengths
    for layer in range(eager.cache.num_layers):
        for row, length in enumerate(eager.cache.lengths):
            torch.testing.assert_close(captured.cache.keys[layer][row, :, :length], eager.cache.keys[layer][row, :, :length])
            torch.testing.assert_close(captured.cache.values[layer][row, :, :length],
                                       eager.cache.values[layer][row, :, :length])
    assert captured.step_unit.replays == captured.step_unit.steps == sum(steps for _, steps in schedule)
    assert {(size, first_rows) for size, _, _, _, first_rows in keys} >= {(1, True), (2, True), (4, True), (2, False),
                                                                       (4, False), (8, False), (8, True)}


def test_a_deferred_capture_runs_later_and_steps_run_as_written_until_then(omni):
    runner = ThinkerRunner(omni, slots=4, capacity=64, graphs="auto")
    unit = runner.step_unit
    queued = []
    unit.defer = queued.append
    rows = [runner.cache.acquire() for _ in range(3)]
    feeds = lambda: [Feed(row, 20 + row, runner.cache.lengths[row], None, Choice(Sampling())) for row in rows]  # noqa: E731
    runner.answer(feeds())
    runner.answer(feeds())
    assert unit.replays == 0 and unit.steps == 2 and len(queued) == 1  # queued once, not per step
    queued.pop()()  # the idle compute runs it
    runner.answer(feeds())
    assert unit.replays == 1


def test_a_hook_whose_loop_is_gone_leaves_captures_inline(omni):
    runner = ThinkerRunner(omni, slots=2, capacity=64, graphs="auto")
    unit = runner.step_unit

    def closed(capture):
        raise RuntimeError("Event loop is closed")

    unit.defer = closed
    row = runner.cache.acquire()
    runner.answer([Feed(row, 21, 0, None, Choice(Sampling()))])
    assert unit.defer is None and unit.replays == 1


def test_a_sampled_capture_that_fails_runs_eager_and_leaves_greedy_steps_captured(omni, monkeypatch):
    from nodes.qwen3_omni import captured_thinker

    def broken(*args):
        raise RuntimeError("no capture here")

    monkeypatch.setattr(captured_thinker._ChoiceBuffers, "__init__", broken)
    runner = ThinkerRunner(omni, slots=2, capacity=64, graphs="auto")
    unit = runner.step_unit
    rows = [runner.cache.acquire() for _ in range(2)]
    sampled = {0: Choice(Sampling(temperature=0.9), torch.Generator().manual_seed(1)), 1: Choice(Sampling())}
    answers = runner.answer([Feed(row, 20 + row, 0, None, sampled[row]) for row in rows])
    assert unit.replays == 0 and (2, True) in unit._failed and all(a.token is not None for a in answers)
    runner.answer([Feed(row, 20 + row, runner.cache.lengths[row], None, Choice(Sampling())) for row in rows])
    assert unit.replays == 1 and (2, False) not in unit._failed
