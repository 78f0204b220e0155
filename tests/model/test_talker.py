"""The streaming talker on the tiny checkpoint: starts after one token, stops on interrupt, bounded."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from nodes.qwen3_omni import talker_engine
from nodes.qwen3_omni.talker_engine import (
    TalkerHistory,
    TalkerLimits,
    TalkerModel,
    TalkerReply,
    TalkerSampling,
    prefill_replies,
    prefill_user_turns,
    step_replies,
)
from nodes.qwen3_omni.talker_slots import TalkerSlots

GREEDY = TalkerSampling(do_sample=False)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).eval()


@pytest.fixture(scope="module")
def talker(model) -> TalkerModel:
    return TalkerModel(model)


@pytest.fixture(scope="module")
def prompt_ids(tiny_checkpoint) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"][0]


def new_reply(talker, prompt_ids, **kwargs) -> TalkerReply:
    history = TalkerHistory(talker)
    history.add_prompt(prompt_ids)  # a text-only prompt needs no thinker hidden states
    kwargs.setdefault("sampling", GREEDY)
    return TalkerReply(talker, history, prompt_ids[-3:], **kwargs)


def test_talker_speaks_after_one_thinker_token_and_then_waits_for_lookahead(talker, prompt_ids):
    reply = new_reply(talker, prompt_ids)
    assert not reply.ready()  # no reply token yet

    reply.add_text([104])
    assert reply.ready()
    frame = reply.step()

    assert frame.shape == (talker.num_code_groups,)
    assert not reply.ready()  # step 1 reads token 1 and must know whether it is the last one
    reply.add_text([105])
    assert not reply.ready()
    reply.add_text([106])
    assert reply.ready()


def test_interrupt_stops_the_talker_before_its_next_frame(talker, prompt_ids):
    reply = new_reply(talker, prompt_ids)
    reply.add_text([104, 105, 106, 107, 108])
    assert reply.step() is not None and reply.step() is not None

    reply.cancel()  # e.g. from the event loop while a worker thread runs the previous frame

    assert reply.ready()
    assert reply.step() is None
    assert (reply.finished, reply.finish_reason, reply.frames) == (True, "cancelled", 2)


def test_voice_selects_the_checkpoints_speaker_id(talker, prompt_ids):
    assert talker.speaker_id("Chelsie") == talker.talker_config.speaker_id["chelsie"]
    assert talker.speaker_id(None) == talker.talker_config.speaker_id["ethan"]  # generate()'s default
    with pytest.raises(KeyError):
        talker.speaker_id("alloy")

    inputs = {}
    for speaker in ("chelsie", "aiden"):
        reply = new_reply(talker, prompt_ids, speaker=speaker)
        reply.add_text([104])
        assert reply.speaker_id == talker.talker_config.speaker_id[speaker]
        inputs[speaker], _ = reply.prefill_inputs()

    # The prefills differ exactly at the speaker slot of the 9-position assistant block, whose codec half is
    # (0, 0, 0, nothink, think_bos, think_eos, SPEAKER, codec_pad, codec_bos).
    differs = (inputs["chelsie"] != inputs["aiden"]).any(dim=-1)[0]
    assert differs.nonzero().flatten().tolist() == [inputs["aiden"].shape[1] - 3]


def test_frames_per_token_bound_ends_a_reply_that_never_emits_codec_eos(talker, prompt_ids):
    reply = new_reply(talker, prompt_ids, limits=TalkerLimits(max_frames=None, max_frames_per_token=2.0))
    reply.add_text([104, 105, 106], final=True)

    frames = []
    while (frame := reply.step()) is not None:
        frames.append(frame)

    assert len(frames) == 6 and reply.finish_reason == "frame_limit"


def test_max_frames_bounds_a_reply_whose_text_has_not_ended(talker, prompt_ids):
    reply = new_reply(talker, prompt_ids, limits=TalkerLimits(max_frames=3))
    reply.add_text(list(range(100, 120)))

    frames = []
    while (frame := reply.step()) is not None:
        frames.append(frame)

    assert len(frames) == 3 and reply.finish_reason == "frame_limit"


def test_history_keeps_user_turns_only_even_when_a_header_is_split_across_prefills(talker, prompt_ids):
    whole = TalkerHistory(talker)
    whole.add_prompt(prompt_ids)
    split = TalkerHistory(talker)
    cut = int((prompt_ids == talker.im_start_id).nonzero()[1]) + 1  # right after the user turn's <|im_start|>
    split.add_prompt(prompt_ids[:cut])
    split.add_prompt(prompt_ids[cut:])

    user_ids = torch.cat([segment.token_ids for segment in whole.segments])
    tokenizer_user_turn = prompt_ids[cut - 1 : -3]  # <|im_start|>user\nhello there<|im_end|>\n
    assert torch.equal(user_ids, tokenizer_user_turn)
    assert torch.equal(torch.cat([s.token_ids for s in split.segments]), user_ids)
    assert torch.allclose(torch.cat([s.embeds for s in split.segments]), torch.cat([s.embeds for s in whole.segments]))


def test_a_reply_that_ends_before_its_first_token_has_no_frames(talker, prompt_ids):
    reply = new_reply(talker, prompt_ids)
    reply.add_text([], final=True)
    assert reply.step() is None and reply.finish_reason == "empty"


def test_sampling_with_a_seed_is_reproducible(talker, prompt_ids):
    runs = []
    for _ in range(2):
        reply = new_reply(talker, prompt_ids, sampling=TalkerSampling(do_sample=True, seed=7))
        reply.add_text([104, 105, 106], final=True)
        runs.append(torch.stack([reply.step() for _ in range(3)]))
    assert torch.equal(runs[0], runs[1])


def test_replies_of_two_sessions_interleave_on_one_model_without_disturbing_each_other(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)

    def prompt(text):
        messages = [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"][0]

    sampled = TalkerSampling(do_sample=True, seed=3)  # one session samples, the other is greedy

    def frames_alone(ids, sampling=GREEDY):
        reply = new_reply(talker, ids, sampling=sampling)
        reply.add_text([104, 105, 106, 107], final=True)
        return torch.stack([reply.step() for _ in range(5)])

    predictor_do_sample = talker.talker.code_predictor.generation_config.do_sample
    a_ids, b_ids = prompt("first session"), prompt("a much longer second session prompt")
    alone = frames_alone(a_ids), frames_alone(b_ids, sampled)
    a, b = new_reply(talker, a_ids), new_reply(talker, b_ids, sampling=sampled)
    a.add_text([104, 105, 106, 107], final=True)
    b.add_text([104, 105, 106, 107], final=True)
    together_a, together_b = [], []
    for _ in range(5):
        together_a.append(a.step())
        together_b.append(b.step())

    assert torch.equal(torch.stack(together_a), alone[0]) and torch.equal(torch.stack(together_b), alone[1])
    # The shared model state generate() uses was never touched.
    assert talker.talker.rope_deltas is None
    assert talker.talker.code_predictor.generation_config.do_sample == predictor_do_sample


def test_a_batched_step_of_several_replies_gives_each_the_frames_it_gets_alone(talker, tiny_checkpoint):
    """Decode steps of replies with different cache lengths run as one padded forward; a reply
    that joins later prefills inside the same batched step."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)

    def reply_for(text, tokens, speaker):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][0]
        reply = new_reply(talker, ids, speaker=speaker)
        reply.add_text(tokens, final=True)
        return reply

    specs = [
        ("one", [104, 105, 106], "chelsie"),
        ("two, a longer prompt", [110, 111], "aiden"),
        ("three", [120], None),
        ("four joins late", [121, 122, 123, 124], None),
    ]
    alone, alone_hidden = [], []
    for spec in specs:
        reply = reply_for(*spec)
        frames, hidden = [], []
        for _ in range(6):
            frames.append(reply.step())
            hidden.append(reply.last_hidden)
        alone.append(torch.stack(frames))
        alone_hidden.append(torch.cat(hidden))

    replies = [reply_for(*spec) for spec in specs]
    batched = [[] for _ in specs]
    batched_hidden = [[] for _ in specs]
    for step in range(9):
        active = [i for i in range(len(specs)) if (i < 3 and step < 6) or (i == 3 and 3 <= step < 9)]
        for i, frame in zip(active, step_replies([replies[i] for i in active])):
            batched[i].append(frame)
            batched_hidden[i].append(replies[i].last_hidden)

    for index in range(len(specs)):
        assert torch.equal(torch.stack(batched[index]), alone[index])
        # The talker's outputs agree to float32 rounding (the codes alone barely depend on them).
        assert torch.allclose(torch.cat(batched_hidden[index]), alone_hidden[index], rtol=0, atol=1e-5)


def test_a_failing_reply_in_a_batch_fails_alone(talker, prompt_ids):
    good = new_reply(talker, prompt_ids)
    good.add_text([104, 105], final=True)
    bad = new_reply(talker, prompt_ids)  # no text yet: stepping it is an error

    results = step_replies([good, bad])

    assert results[0].shape == (talker.num_code_groups,)
    assert isinstance(results[1], RuntimeError)


def test_a_later_reply_prefills_only_the_user_turns_that_are_new_since_the_last_reply(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)

    def turn(text, first):
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"][0]
        return ids if first else torch.cat([torch.tensor(tokenizer.encode("<|im_end|>\n")), ids])

    def run(keep_kv):
        history = TalkerHistory(talker, keep_kv=keep_kv)
        replies = []
        for index, text in enumerate(["first question", "second, longer question"]):
            ids = turn(text, index == 0)
            history.add_prompt(ids)
            reply = TalkerReply(talker, history, ids[-3:], sampling=GREEDY)
            reply.add_text([104, 105, 106], final=True)
            frames, hidden = [], []
            for _ in range(4):
                frames.append(reply.step())
                hidden.append(reply.last_hidden)
            history.add_reply([104, 105, 106])
            replies.append((reply, torch.stack(frames), history.user_length, torch.cat(hidden)))
        return replies

    kept, fresh = run(keep_kv=True), run(keep_kv=False)

    (_, _, first_users, _), (second, second_frames, users, second_hidden) = kept
    assert second.prefill_tokens == users - first_users + 9  # the new user turn + the assistant block
    assert fresh[1][0].prefill_tokens == users + 9
    assert torch.equal(second_frames, fresh[1][1]) and torch.equal(kept[0][1], fresh[0][1])
    assert torch.allclose(second_hidden, fresh[1][3], rtol=0, atol=1e-5)


def test_user_turns_put_through_the_talker_before_the_reply_leave_it_only_the_assistant_block(talker, prompt_ids):
    warmed, cold = TalkerHistory(talker), TalkerHistory(talker)
    for history in (warmed, cold):
        history.add_prompt(prompt_ids)
    assert prefill_user_turns(warmed) == warmed.user_length
    assert prefill_user_turns(warmed) == 0  # nothing new since

    outputs = []
    for history in (warmed, cold):
        reply = TalkerReply(talker, history, prompt_ids[-3:], sampling=GREEDY)
        reply.add_text([104, 105, 106], final=True)
        frames = torch.stack([reply.step() for _ in range(3)])
        outputs.append((reply.prefill_tokens, frames, reply.last_hidden))

    assert outputs[0][0] == 9 and outputs[1][0] == cold.user_length + 9
    assert torch.equal(outputs[0][1], outputs[1][1])
    assert torch.allclose(outputs[0][2], outputs[1][2], rtol=0, atol=1e-5)


def test_user_turns_put_through_the_talker_in_slices_give_the_reply_what_one_pass_gives(talker, prompt_ids):
    # Issue 16: a long turn goes through in slices (other sessions' work between them); a reply
    # that starts after some of the slices prefills the rest itself.
    whole, sliced, partly = TalkerHistory(talker), TalkerHistory(talker), TalkerHistory(talker)
    for history in (whole, sliced, partly):
        history.add_prompt(prompt_ids)
    assert sliced.user_length > 4
    prefill_user_turns(whole)
    slices = []
    while computed := prefill_user_turns(sliced, max_positions=3):
        slices.append(computed)
    assert sum(slices) == sliced.user_length and max(slices) == 3
    assert prefill_user_turns(partly, max_positions=3) == 3

    outputs = []
    for history in (whole, sliced, partly):
        reply = TalkerReply(talker, history, prompt_ids[-3:], sampling=GREEDY)
        reply.add_text([104, 105, 106], final=True)
        frames = torch.stack([reply.step() for _ in range(3)])
        outputs.append((reply.prefill_tokens, frames, reply.last_hidden))

    assert [tokens for tokens, _, _ in outputs] == [9, 9, partly.user_length - 3 + 9]
    for tokens, frames, hidden in outputs[1:]:
        assert torch.equal(frames, outputs[0][1])
        assert torch.allclose(hidden, outputs[0][2], rtol=0, atol=1e-5)


# ---------------------------------------------------------------- prefills that start together (issue 12)


def prefill_cases(talker, tokenizer):
    """Replies of four sessions, built afresh per call: an empty history (the 9-position block
    alone), a user turn already put through the talker (kept KV, the block alone), a short and a
    long user turn with nothing kept (different lengths), and a second turn on a kept first one."""

    def turn(text, first=True):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][0]
        return ids if first else torch.cat([torch.tensor(tokenizer.encode("<|im_end|>\n")), ids])

    header = turn("x")[-3:]
    replies = [TalkerReply(talker, TalkerHistory(talker), header, sampling=GREEDY, speaker="chelsie")]
    kept = TalkerHistory(talker)
    kept.add_prompt(turn("a turn the talker took in before its reply"))
    prefill_user_turns(kept)
    replies.append(TalkerReply(talker, kept, header, sampling=GREEDY))
    for text in ("short", "a much longer user turn, " * 6):
        history = TalkerHistory(talker)
        history.add_prompt(turn(text))
        replies.append(TalkerReply(talker, history, header, sampling=GREEDY, speaker="aiden"))
    second = TalkerHistory(talker)
    second.add_prompt(turn("first question"))
    prefill_user_turns(second)
    second.add_reply([104, 105])
    second.add_prompt(turn("and a second, longer question", first=False))
    replies.append(TalkerReply(talker, second, header, sampling=GREEDY))
    for index, reply in enumerate(replies):
        reply.add_text([104 + index, 110, 111, 112], final=True)
    return replies


def _kept_kv(reply):
    history = reply.history
    return history.kv_length, [(layer.keys.clone(), layer.values.clone()) for layer in history.kv.layers]


def test_replies_that_start_together_are_prefilled_in_one_forward_as_each_is_alone(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    slots = TalkerSlots.for_model(talker)
    alone = []
    for index in range(5):
        reply = prefill_cases(talker, tokenizer)[index]
        logits = prefill_replies([reply])[0]
        alone.append((logits, reply.last_hidden, reply.last_position, reply.prefill_tokens, _kept_kv(reply)))
        assert reply.slot is None  # alone: on its own cache, as before batching

    replies = prefill_cases(talker, tokenizer)
    forwards = slots.forwards
    together = prefill_replies(replies)

    assert slots.forwards == forwards + 1  # one forward for all five
    assert len({alone_reply[3] for alone_reply in alone}) > 2  # rows of different lengths side by side
    for reply, logits, (alone_logits, hidden, position, tokens, (kv_length, kv)) in zip(replies, together, alone):
        assert torch.allclose(logits, alone_logits, rtol=0, atol=1e-5)
        assert torch.allclose(reply.last_hidden, hidden, rtol=0, atol=1e-5)
        assert torch.equal(reply.last_position, position) and reply.prefill_tokens == tokens
        together_length, together_kv = _kept_kv(reply)  # what the history keeps for the next reply
        assert together_length == kv_length and len(together_kv) == len(kv)
        for (keys, values), (alone_keys, alone_values) in zip(together_kv, kv):
            assert keys.shape == alone_keys.shape
            assert torch.allclose(keys, alone_keys, rtol=0, atol=1e-5)
            assert torch.allclose(values, alone_values, rtol=0, atol=1e-5)
        assert slots.cache.length(reply.slot) == reply.prefill_cache.get_seq_length()  # its decode row, from the prefill


def test_replies_prefilled_together_speak_the_frames_each_speaks_alone(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    alone = []
    for index in range(5):
        reply = prefill_cases(talker, tokenizer)[index]
        alone.append(torch.stack([reply.step() for _ in range(4)]))

    replies = prefill_cases(talker, tokenizer)
    steps = [step_replies(replies) for _ in range(4)]

    for index, frames in enumerate(alone):
        assert torch.equal(torch.stack([step[index] for step in steps]), frames)


def test_a_reply_whose_prefill_input_fails_fails_alone_and_the_others_prefill_together(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    cases = prefill_cases(talker, tokenizer)
    first_alone = cases[0].step()
    replies = prefill_cases(talker, tokenizer)
    bad = new_reply(talker, tokenizer.apply_chat_template(
        [{"role": "user", "content": "bad"}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"][0])
    bad.add_text([10**9])  # no such token
    slots = TalkerSlots.for_model(talker)
    forwards = slots.forwards

    results = step_replies([replies[0], bad, *replies[1:]])

    assert isinstance(results[1], IndexError) and bad.prefill_cache is None and bad.slot is None
    assert torch.equal(results[0], first_alone)
    assert all(result.shape == (talker.num_code_groups,) for result in results[2:])
    assert slots.forwards == forwards + 1


def test_prefills_past_the_token_budget_go_in_the_next_forward(talker, tiny_checkpoint, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    replies = prefill_cases(talker, tokenizer)
    lengths = [reply.prefill_inputs()[0].shape[1] - reply.history.kv_length for reply in replies]
    budget = 2 * max(lengths)
    monkeypatch.setattr(talker_engine, "PREFILL_BATCH_TOKENS", budget)
    groups = []
    slots = TalkerSlots.for_model(talker)
    group_prefill = slots.prefill

    def recording(batch, prompts):
        groups.append([prompt[0].shape[1] for prompt in prompts])
        return group_prefill(batch, prompts)

    monkeypatch.setattr(slots, "prefill", recording)
    results = prefill_replies(replies)

    assert all(isinstance(result, torch.Tensor) for result in results)
    assert groups[0] == sorted(lengths, reverse=True)[:2]  # longest first, as many as fit
    assert all(len(group) * max(group) <= budget for group in groups)  # each forward within the budget
    alone = sum(reply.slot is None for reply in replies)  # a group of one runs alone, on its own cache
    assert sum(len(group) for group in groups) + alone == len(replies) and len(groups) + alone >= 2
