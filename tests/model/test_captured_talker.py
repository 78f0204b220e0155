"""Captured talker frames (`compute: {graphs: auto}`) give what the eager path gives, frame by frame."""

from __future__ import annotations

import pytest
import torch

from benchmarks.dispatch_counts import DispatchCounts
from nodes.qwen3_omni.captured import padded_batch
from nodes.qwen3_omni.compute_graphs import set_graphs
from nodes.qwen3_omni.talker_engine import TalkerLimits, TalkerModel, TalkerSampling, frame_unit, step_replies
from tests.model.test_talker import model, new_reply, prompt_ids  # noqa: F401 - fixtures

TEXT = [104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115]


@pytest.fixture(scope="module")
def talkers(model):  # noqa: F811
    """The eager talker and the captured one, on the same model (and slot cache)."""
    return TalkerModel(model, graphs="off"), TalkerModel(model, graphs="auto")


def _logits(talker: TalkerModel, reply) -> torch.Tensor:
    with torch.inference_mode():
        return talker.talker.codec_head(reply.last_hidden)[0, -1]


def _user_turn(prompt_ids: torch.Tensor, words: int) -> torch.Tensor:
    """A user turn of its own length per reply: rows of different lengths side by side."""
    return torch.cat((prompt_ids[:-3], torch.arange(200, 200 + words), prompt_ids[-3:]))


def test_captured_frames_give_the_eager_codes_and_logits_as_replies_join_and_leave(talkers, prompt_ids):  # noqa: F811
    eager, captured = talkers
    # Five replies, each run twice (eager, captured): A from the start, B joins at frame 2, C and
    # D at frame 3, E at frame 4 (5 decoding from frame 5: a padded batch of 8), C is cancelled
    # at frame 7, A ends on its frame limit (7 frames).
    joins = {"A": 0, "B": 2, "C": 3, "D": 3, "E": 4}
    limits = {"A": 7}
    pairs = {}
    for index, name in enumerate(joins):
        made = []
        for talker in (eager, captured):
            reply = new_reply(talker, _user_turn(prompt_ids, 3 * index), limits=TalkerLimits(max_frames=limits.get(name, 40)))
            reply.add_text(TEXT, final=True)
            made.append(reply)
        pairs[name] = made
    sizes = set()
    for frame in range(12):
        if frame == 7:
            for reply in pairs["C"]:
                reply.cancel()
        live = [name for name, start in joins.items() if start <= frame and not pairs[name][0].finished]
        decoding = sum(1 for name in live if pairs[name][1].prefill_cache is not None)
        if decoding:
            sizes.add(padded_batch(decoding))
        outputs = [step_replies([pairs[name][side] for name in live]) for side in (0, 1)]
        for name, want, got in zip(live, *outputs):
            assert not isinstance(got, BaseException) and not isinstance(want, BaseException), (frame, name)
            if want is None:
                assert got is None, (frame, name)
                continue
            assert torch.equal(want, got), (frame, name)
            e, c = pairs[name]
            torch.testing.assert_close(_logits(captured, c), _logits(eager, e), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(c.next_embeds, e.next_embeds, rtol=1e-5, atol=1e-5)
            assert torch.equal(c.last_position, e.last_position)
    unit_frames = captured.frame_unit.frames
    assert unit_frames >= 10 and captured.frame_unit.replays == unit_frames  # every decode frame replayed
    assert {1, 2, 8} <= sizes  # padding rows: 5 replies in a padded batch of 8 among them
    for name, (e, c) in pairs.items():
        assert (c.finished, c.finish_reason, c.frames) == (e.finished, e.finish_reason, e.frames), name
        assert c.code_history.codes == e.code_history.codes, name
    assert pairs["A"][1].finish_reason == "frame_limit" and pairs["C"][1].finish_reason == "cancelled"
    assert eager.frame_unit is None  # graphs off: the eager path alone


def test_a_captured_frame_reads_the_host_once(talkers, prompt_ids):  # noqa: F811
    _, captured = talkers
    reply = new_reply(captured, prompt_ids)
    reply.add_text(TEXT, final=True)
    step_replies([reply])  # the prefill
    step_replies([reply])  # the first decode frame (makes the batch-1 trace if none)
    with DispatchCounts("cpu") as counts:
        (frame,) = step_replies([reply])
    assert frame is not None and counts.host_syncs == 1


def test_sampled_frames_run_the_unit_as_written_with_each_seeds_own_draws(talkers, prompt_ids):  # noqa: F811
    eager, captured = talkers
    sampling = TalkerSampling(do_sample=True, seed=7)
    frames = []
    for talker in (eager, captured):
        replies = [new_reply(talker, _user_turn(prompt_ids, words), sampling=sampling) for words in (0, 5)]
        for reply in replies:
            reply.add_text(TEXT, final=True)
        frames.append([step_replies(replies) for _ in range(5)])
    replays = captured.frame_unit.replays
    for want, got in zip(*frames):
        for w, g in zip(want, got):
            assert torch.equal(w, g)
    assert captured.frame_unit.replays == replays  # a reply with its own generator: not replayed


def test_sampled_frames_without_seeds_replay_with_the_eager_draws(talkers, prompt_ids):  # noqa: F811
    eager, captured = talkers
    sampling = TalkerSampling(do_sample=True)  # the profiles' talker: the global generator

    def replies(talker):
        made = [new_reply(talker, _user_turn(prompt_ids, words), sampling=sampling) for words in (1, 4)]
        for index, reply in enumerate(made):
            reply.add_text(TEXT, final=True)
            torch.manual_seed(index)  # the prefill draws the first frame's talker code
            step_replies([reply])  # the prefill, alone
        return made

    step_replies(replies(captured))  # two other replies' first decode frame makes the capture
    replays = captured.frame_unit.replays
    pairs = replies(eager), replies(captured)
    for frame in range(5):
        outputs = []
        for side in pairs:
            torch.manual_seed(100 + frame)  # the same generator state for each side's draws
            outputs.append(step_replies(side))
        for want, got in zip(*outputs):
            assert torch.equal(want, got), frame
    assert captured.frame_unit.replays == replays + 5


def test_set_graphs_is_the_default_of_the_talkers_built_after_it(model):  # noqa: F811
    set_graphs(model, "off")
    try:
        assert TalkerModel(model).graphs == "off" and TalkerModel(model, graphs="auto").graphs == "auto"
    finally:
        set_graphs(model, "auto")
    with pytest.raises(ValueError, match="compute.graphs"):
        TalkerModel(model, graphs="fast")


def test_with_a_deferred_capture_frames_run_as_written_until_it_has_run(model, prompt_ids):  # noqa: F811
    talker = TalkerModel(model, graphs="auto")
    reply, alone = new_reply(talker, prompt_ids), new_reply(TalkerModel(model, graphs="off"), prompt_ids)
    for r in (reply, alone):
        r.add_text(TEXT, final=True)
        step_replies([r])  # the prefill
    unit = frame_unit(talker)
    queued = []
    unit.defer = queued.append  # the talker node queues it as idle compute
    for frame in range(4):
        if frame == 2:
            assert len(queued) == 1 and unit.replays == 0  # one capture asked for, none run yet
            queued.pop()()
        assert torch.equal(step_replies([reply])[0], step_replies([alone])[0])
    assert unit.frames == 4 and unit.replays == 2 and not queued


def test_frames_attending_over_the_whole_cache_in_place_give_the_eager_codes(model, prompt_ids):  # noqa: F811
    talker, eager = TalkerModel(model, graphs="auto"), TalkerModel(model, graphs="off")
    unit = frame_unit(talker)
    unit.attend_in_place = lambda rows, slots: True  # the CUDA choice, here on CPU
    pairs = []
    for words in (0, 3, 6):  # 3 rows: padded to 4, among the cache's other rows
        made = [new_reply(t, _user_turn(prompt_ids, words)) for t in (eager, talker)]
        for reply in made:
            reply.add_text(TEXT, final=True)
        pairs.append(made)
    replays = unit.replays
    for frame in range(5):
        want = step_replies([e for e, _ in pairs])
        got = step_replies([c for _, c in pairs])
        for (e, c), w, g in zip(pairs, want, got):
            assert torch.equal(w, g), frame
            if frame:
                torch.testing.assert_close(_logits(talker, c), _logits(eager, e), rtol=1e-5, atol=1e-5)
    assert unit.replays == replays + 4  # every decode frame replayed
