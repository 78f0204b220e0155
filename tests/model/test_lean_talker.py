"""The talker step's lean paths compute exactly what the HF modules and transformers' processors compute.

A talker step is one talker forward, a talker code, and the code predictor's residual codes.
Each lean piece is checked against the way it ran before: the HF module call (forced by a
hook, which always sends a call back through the module) or transformers' logits processors;
the whole step against a reference loop that uses only those.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer
from transformers.cache_utils import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from nodes.qwen3_omni.talker_engine import (
    TalkerHistory,
    TalkerReply,
    TalkerSampling,
    decode_inputs,
    prefill_replies,
    step_replies,
)
from nodes.qwen3_omni.talker_sampling import CodeHistory, residual_codes, talker_codes
from nodes.qwen3_omni.talker_slots import TalkerSlots
from tests.model.test_talker import model, prefill_cases, prompt_ids, talker  # noqa: F401 - fixtures

GREEDY = TalkerSampling(do_sample=False)


@contextlib.contextmanager
def through_hf(module):
    """A forward hook on `module`: the lean paths step aside and call the HF module (the list
    yielded gets one entry per call the hook saw)."""
    calls = []
    handle = module.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def sampled_reply(sampling, codes, vocab, seed=None):
    history = CodeHistory(vocab, torch.device("cpu"))
    for code in codes:
        history.add(code)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SimpleNamespace(sampling=sampling, code_history=history, _generator=generator)


def transformers_talker_code(talker, sampling, codes, logits, generator):
    """The previous pick: transformers' processors for one reply, then argmax or a draw."""
    processors = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(float(sampling.repetition_penalty), prompt_ignore_length=0))
    processors.append(SuppressTokensLogitsProcessor(talker.suppressed_ids))
    if sampling.do_sample:
        if sampling.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(float(sampling.temperature)))
        if sampling.top_k:
            processors.append(TopKLogitsWarper(top_k=int(sampling.top_k)))
        if sampling.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=float(sampling.top_p)))
    scores = processors(torch.tensor([codes], dtype=torch.long), logits.clone())
    if not sampling.do_sample:
        return int(torch.argmax(scores, dim=-1)[0])
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)[0, 0])


def transformers_residual_code(logits, sampling, generator):
    if not sampling.do_sample:
        return int(torch.argmax(logits, dim=-1)[0])
    scores = LogitsProcessorList([TopKLogitsWarper(top_k=50), TopPLogitsWarper(top_p=0.8)])(None, logits.clone())
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)[0, 0])


def tied_logits(rows, vocab, seed):
    """Logits on a 0.25 grid: many exact ties, so tie-breaking (argmax, top-k, sort) shows."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=generator) * 4).round() / 4


SAMPLINGS = [
    GREEDY,
    TalkerSampling(seed=11),  # generate()'s defaults: penalty 1.05, temperature 0.9, top-k 50
    TalkerSampling(temperature=1.0, top_k=0, top_p=0.8, seed=12),
    TalkerSampling(repetition_penalty=1.0, top_k=5, seed=13),
    TalkerSampling(do_sample=False, repetition_penalty=1.3),
]


def test_talker_codes_of_a_batch_are_what_each_replys_transformers_processors_pick(talker):
    vocab = talker.vocab_size
    histories = [[], [3, 3, 7], list(range(0, 40, 2)), [5, vocab - 1, 5], [1, 2]]
    batched = [sampled_reply(s, h, vocab, s.seed) for s, h in zip(SAMPLINGS, histories)]
    alone = [torch.Generator().manual_seed(s.seed) if s.seed is not None else None for s in SAMPLINGS]

    for frame in range(4):  # several frames: each seeded reply's draws continue its own stream
        logits = tied_logits(len(SAMPLINGS), vocab, seed=frame)
        logits[:, talker.codec_eos_id] += 1.0  # codec EOS is never suppressed
        codes = talker_codes(batched, logits.clone(), talker.suppress_mask).tolist()
        expected = [
            transformers_talker_code(talker, sampling, reply.code_history.codes, logits[row : row + 1], alone[row])
            for row, (sampling, reply) in enumerate(zip(SAMPLINGS, batched))
        ]
        assert codes == expected
        for reply, code in zip(batched, codes):
            reply.code_history.add(code)


def test_residual_codes_of_a_batch_are_what_the_predictors_processors_pick(talker):
    vocab = talker.talker.code_predictor.config.vocab_size
    samplings = [TalkerSampling(seed=1), GREEDY, TalkerSampling(seed=2), TalkerSampling(seed=3)]
    batched = [sampled_reply(s, [], vocab, s.seed) for s in samplings]
    alone = [torch.Generator().manual_seed(s.seed) if s.seed is not None else None for s in samplings]
    for group in range(5):
        logits = tied_logits(len(samplings), vocab, seed=100 + group)
        codes = residual_codes(batched, logits.clone()).tolist()
        assert codes == [transformers_residual_code(logits[r : r + 1], s, alone[r]) for r, s in enumerate(samplings)]


def predictor_inputs(talker, batch):
    generator = torch.Generator().manual_seed(batch)
    hidden = torch.randn(batch, 1, talker.talker_config.text_config.hidden_size, generator=generator)
    first = torch.randint(0, talker.talker.code_predictor.config.vocab_size, (batch,), generator=generator)
    return hidden, first


@pytest.mark.parametrize("batch", [1, 5])
def test_the_lean_code_predictor_gives_the_hf_predictors_frames_bit_for_bit(talker, batch):
    predictor = talker.code_predictor
    hidden, first = predictor_inputs(talker, batch)
    samplings = [TalkerSampling(seed=20 + row) if row % 2 else GREEDY for row in range(batch)]

    def run():
        replies = [sampled_reply(s, [], 1, s.seed) for s in samplings]
        logits = []

        def choose(_group, scores):
            logits.append(scores.clone())
            return residual_codes(replies, scores)

        return (*predictor.predict(hidden, first, choose), torch.stack(logits))

    lean_before = predictor.lean_calls
    lean = run()
    assert predictor.lean_calls == lean_before + 1
    with through_hf(talker.talker.code_predictor.model) as calls:
        hf = run()
    assert predictor.lean_calls == lean_before + 1 and len(calls) == talker.num_code_groups - 1

    assert torch.equal(lean[0], hf[0])  # frames [B, num_code_groups]
    assert torch.equal(lean[1], hf[1])  # summed code embeddings: the next talker input
    assert torch.equal(lean[2], hf[2])  # every group's logits
    assert torch.equal(lean[0][:, 0], first)


@pytest.mark.parametrize("experts", ["every expert", "the experts module"])
def test_the_lean_talker_decode_forward_gives_the_hf_forwards_outputs(experts, talker, tiny_checkpoint, monkeypatch):
    """Through the experts' own forward (what the HF block calls), the same to the bit; with
    every expert on every token (lean_decode.py: another GEMM shape), within float rounding."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    replies = []
    for text in ("one", "a second, longer prompt", "three is in between"):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][0]
        history = TalkerHistory(talker)
        history.add_prompt(ids)
        reply = TalkerReply(talker, history, ids[-3:], sampling=GREEDY)
        reply.add_text([104, 105, 106, 107], final=True)
        replies.append(reply)
    step_replies(replies)  # prefills
    step_replies(replies)  # every reply has a row now
    slots = TalkerSlots.for_model(talker)
    assert slots.stack.usable() and slots.lean_decode.usable()
    for layer in slots.lean_decode.layers:
        assert layer.moe and layer.shared is not None and layer.dense_experts
        if experts == "the experts module":
            monkeypatch.setattr(layer, "dense_experts", False)
    lengths = [slots.cache.length(reply.slot) for reply in replies]
    positions = [reply.last_position for reply in replies]

    def forward():
        logits, hidden = slots.forward(replies, decode_inputs(replies))
        keys = [slots.cache.row(reply.slot, layer)[0].clone() for reply in replies for layer in range(2)]
        for reply, length, position in zip(replies, lengths, positions):  # undo the step
            slots.cache.set_length(reply.slot, length)
            reply.last_position = position
        return logits, hidden, keys

    lean = forward()
    with through_hf(talker.talker.model) as calls:
        hf = forward()
    assert len(calls) == 1

    if experts == "the experts module":
        # The same experts module on the same tokens: bit for bit on some machines, but on an
        # AMD EPYC with AVX512 kernels (torch.backends.cpu.get_cpu_capability()) its matmuls
        # round up to ~4e-7 apart for the two callers' input layouts: a few ulp, not equality.
        torch.testing.assert_close(lean[0], hf[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(lean[1], hf[1], atol=1e-6, rtol=0)
        for a, b in zip(lean[2], hf[2]):  # the KV columns written
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert torch.equal(lean[0].argmax(-1), hf[0].argmax(-1))
    else:
        torch.testing.assert_close(lean[0], hf[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(lean[1], hf[1], atol=1e-5, rtol=0)
        for a, b in zip(lean[2], hf[2]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        assert torch.equal(lean[0].argmax(-1), hf[0].argmax(-1))


def test_the_lean_talker_prefill_group_gives_the_hf_forwards_outputs_bit_for_bit(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    lean_replies = prefill_cases(talker, tokenizer)
    lean = prefill_replies(lean_replies)
    hf_replies = prefill_cases(talker, tokenizer)
    with through_hf(talker.talker.model) as calls:
        hf = prefill_replies(hf_replies)
    assert len(calls) == 1  # one forward for the group

    for lean_reply, hf_reply, lean_logits, hf_logits in zip(lean_replies, hf_replies, lean, hf):
        assert torch.equal(lean_logits, hf_logits) and torch.equal(lean_reply.last_hidden, hf_reply.last_hidden)
        for lean_layer, hf_layer in zip(lean_reply.prefill_cache.layers, hf_reply.prefill_cache.layers):
            assert torch.equal(lean_layer.keys, hf_layer.keys) and torch.equal(lean_layer.values, hf_layer.values)


def reference_frames(talker, prompt, text, sampling, frames):
    """The previous implementation for one reply alone, with HF modules only: talker forwards on a
    DynamicCache, transformers' processors, the code predictor on a fresh DynamicCache per frame."""
    history = TalkerHistory(talker)
    history.add_prompt(prompt)
    reply = TalkerReply(talker, history, prompt[-3:], sampling=sampling)
    reply.add_text(text[:1])
    embeds, positions = reply.prefill_inputs()
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    text_model, predictor = talker.talker.model, talker.talker.code_predictor
    cache = DynamicCache(config=talker.talker.config.text_config)
    codes, out = [], []
    for step in range(frames):
        if step:
            positions = positions[..., -1:] + 1
            token = text[step] if step < len(text) - 1 else None
            text_embed = (
                talker.text_embeds(torch.tensor([token])).unsqueeze(0)
                if token is not None
                else (talker.tts_eos if step == len(text) - 1 else talker.tts_pad)
            )
            embeds = next_embeds + text_embed
        hidden = text_model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True).last_hidden_state
        logits = talker.talker.codec_head(hidden)[:, -1, :].to(copy=True, dtype=torch.float32)
        code = transformers_talker_code(talker, sampling, codes, logits, generator)
        codes.append(code)
        first = torch.tensor([[code]])
        frame_embeds = [talker.talker.get_input_embeddings()(first)]
        residuals = [code]
        pcache = DynamicCache(config=predictor.config)
        inputs = torch.cat((hidden[:, -1:], frame_embeds[0]), dim=1)
        pout = predictor(inputs_embeds=inputs, cache=pcache, use_cache=True)
        for group in range(1, talker.num_code_groups):
            residual = transformers_residual_code(pout.logits[:, -1, :].to(torch.float32), sampling, generator)
            residuals.append(residual)
            ids = torch.tensor([[residual]])
            frame_embeds.append(predictor.get_input_embeddings()[group - 1](ids))
            if group < talker.num_code_groups - 1:
                pout = predictor(input_ids=ids, cache=pcache, use_cache=True, generation_steps=group)
        next_embeds = torch.cat(frame_embeds, dim=1).sum(1, keepdim=True)
        out.append(torch.tensor(residuals))
    return torch.stack(out)


@torch.inference_mode()
def test_batched_lean_steps_give_each_reply_the_frames_of_the_hf_modules_and_processors(talker, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)

    def prompt(words):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": words}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][0]

    specs = [  # (prompt, reply text, sampling): different lengths, greedy and seeded sampling
        (prompt("hi"), [104, 105, 106, 107, 108, 109], GREEDY),
        (prompt("a much longer question for the second reply"), [110, 111, 112], TalkerSampling(seed=5)),
        (prompt("third"), [120, 121, 122, 123], TalkerSampling(top_p=0.8, temperature=0.7, seed=6)),
        (prompt("fourth one, greedy again"), [124, 125], TalkerSampling(do_sample=False, repetition_penalty=1.2)),
    ]
    frames = 7
    expected = [reference_frames(talker, *spec, frames) for spec in specs]

    replies = []
    for ids, text, sampling in specs:
        history = TalkerHistory(talker)
        history.add_prompt(ids)
        reply = TalkerReply(talker, history, ids[-3:], sampling=sampling)
        reply.add_text(text, final=True)
        replies.append(reply)
    lean_before = talker.code_predictor.lean_calls
    got = [[] for _ in specs]
    for _ in range(frames):
        for row, frame in enumerate(step_replies(replies)):
            got[row].append(frame)

    assert talker.code_predictor.lean_calls == lean_before + frames
    for row in range(len(specs)):
        assert torch.equal(torch.stack(got[row]), expected[row])


def test_an_attention_that_needs_the_causal_mask_keeps_the_hf_predictor(talker):
    """The lean pass hands the attention no mask (sdpa and flash apply causality themselves);
    eager attention needs the HF mask, so the predictor keeps the HF path under it."""
    predictor, module = talker.code_predictor, talker.talker.code_predictor
    hidden, first = predictor_inputs(talker, 3)
    greedy = lambda _group, scores: scores.argmax(-1)  # noqa: E731
    original = module.config._attn_implementation
    module.set_attn_implementation("eager")
    try:
        before = predictor.lean_calls
        eager = predictor.predict(hidden, first, greedy)
        assert predictor.lean_calls == before
    finally:
        module.set_attn_implementation(original)
    assert module.model.config._attn_implementation == original
    lean = predictor.predict(hidden, first, greedy)
    assert predictor.lean_calls == before + 1
    assert torch.equal(eager[0], lean[0])  # same codes (eager and sdpa differ only in float rounding)


@pytest.mark.parametrize(
    "sampling",
    [
        TalkerSampling(temperature=0.0),
        TalkerSampling(temperature=-0.5),
        TalkerSampling(top_k=-3),
        TalkerSampling(top_p=-0.1),
        TalkerSampling(repetition_penalty=0.0),
        TalkerSampling(do_sample=False, repetition_penalty=-1.0),
    ],
)
def test_a_reply_refuses_the_sampling_settings_transformers_processors_refuse(talker, sampling):
    history = TalkerHistory(talker)
    with pytest.raises(ValueError):
        TalkerReply(talker, history, [1, 2, 3], sampling=sampling)


def test_greedy_replies_do_not_check_the_sampling_only_settings(talker):
    TalkerReply(talker, TalkerHistory(talker), [1, 2, 3], sampling=TalkerSampling(do_sample=False, temperature=0.0))
