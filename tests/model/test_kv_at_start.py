"""KV allocated at start (`kv_cache: preallocate`, the default on CUDA): the thinker's and the
talker's slot caches are allocated once from the profile's limits, never grow or move, and give
the same tokens and codes as the growing caches of the CPU default."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from graph.limits import SessionLimits
from nodes.qwen3_omni.batched_thinker import ThinkerRunner
from nodes.qwen3_omni.model import OmniModel, load_omni_model
from nodes.qwen3_omni.slot_cache import KVCacheFull, SlotKVCache, allocated_at_start, sessions_at_start
from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerModel, TalkerReply, TalkerSampling, step_replies
from nodes.qwen3_omni.talker_slots import TalkerSlots
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession
from tests.model.test_thinker import run_reply, turn


def buffers(cache: SlotKVCache) -> list[int]:
    return [t.data_ptr() for t in cache.keys + cache.values]


def test_auto_allocates_at_start_on_cuda_and_grows_on_cpu():
    assert allocated_at_start("auto", "cuda:0") and not allocated_at_start("auto", "cpu")
    assert allocated_at_start("preallocate", "cpu") and not allocated_at_start("grow", "cuda")
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        allocated_at_start("sometimes", "cpu")


def test_a_profile_may_ask_a_cpu_model_for_its_kv_at_start(tiny_checkpoint):
    assert load_omni_model({"path": str(tiny_checkpoint), "kv_cache": "preallocate"}).kv_at_start
    assert not load_omni_model({"path": str(tiny_checkpoint)}).kv_at_start  # auto on CPU: growing


def test_rows_at_start_are_the_sessions_the_kv_budget_admits():
    assert sessions_at_start(SessionLimits(kv_tokens=16 * 4096, max_seq_len=4096)) == 16
    assert sessions_at_start(SessionLimits(max_sessions=12)) == 12


def test_a_cache_allocated_at_start_refuses_a_row_or_column_past_it_instead_of_growing():
    cache = SlotKVCache(1, 1, 4, dtype=torch.float32, device="cpu", slots=2, capacity=8, grow=False)
    before = buffers(cache)
    cache.acquire()
    cache.acquire()
    with pytest.raises(KVCacheFull, match="all 2 rows"):
        cache.acquire()
    with pytest.raises(KVCacheFull, match="needs 9 columns"):
        cache.batch([0], 9)
    assert buffers(cache) == before and (cache.slots, cache.capacity) == (2, 8)


@pytest.fixture(scope="module")
def omni_at_start(tiny_checkpoint):
    """A second load of the tiny checkpoint whose thinker's slot cache is allocated at start."""
    omni = OmniModel.load(tiny_checkpoint, device="cpu", dtype="float32")
    ThinkerRunner.for_model(omni, slots=2, capacity=1024, grow=False)
    return omni


def test_the_thinkers_kv_at_start_never_moves_over_a_sessions_turns_and_gives_the_growing_tokens(omni, omni_at_start):
    cache = ThinkerRunner.for_model(omni_at_start).cache
    before = buffers(cache)
    long_text = "tell me about the weather " * 12  # the context passes 256 columns: the growing default's start
    replies = {}
    for name, model in (("growing", omni), ("at_start", omni_at_start)):
        session = ThinkerSession(model, sampling=Sampling(temperature=0.0))
        tokens = []
        for index, text in enumerate([long_text, "and tomorrow?", "thanks"]):
            session.prefill(turn(model, first=index == 0, text=text))
            tokens.append(run_reply(session))
            if name == "at_start":
                assert buffers(cache) == before, f"the cache moved at turn {index}"
        assert len(session.context_ids) > 256
        replies[name] = tokens
        session.close()
    assert replies["at_start"] == replies["growing"]
    assert (cache.slots, cache.capacity) == (2, 1024) and not cache.grow


def test_the_talkers_kv_at_start_never_moves_over_replies_and_gives_the_growing_codes(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    growing = TalkerModel(Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).eval())
    at_start = TalkerModel(Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).eval())
    slots = TalkerSlots.for_model(at_start, slots=2, capacity=512, grow=False)
    before = buffers(slots.cache)

    def frames(talker: TalkerModel) -> list[torch.Tensor]:
        history = TalkerHistory(talker)
        out = []
        for index, (text, tokens) in enumerate((("hello there", [104, 105, 106]), ("and again, a longer question", [110, 111, 112]))):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt")["input_ids"][0]
            if index:
                ids = torch.cat([torch.tensor(tokenizer.encode("<|im_end|>\n")), ids])
            history.add_prompt(ids)
            reply = TalkerReply(talker, history, ids[-3:], sampling=TalkerSampling(do_sample=False))
            reply.add_text(tokens, final=True)
            for _ in range(6):
                out.append(step_replies([reply])[0])
            if talker is at_start:
                assert buffers(slots.cache) == before, f"the cache moved at reply {index}"
            TalkerSlots.leave(reply)  # as the engine does when a reply ends
            history.add_reply(tokens)
        return out

    expected, got = frames(growing), frames(at_start)
    assert len(got) == len(expected) > 0
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert (slots.cache.slots, slots.cache.capacity) == (2, 512) and slots.cache.rows_in_use == 0


async def test_a_runtime_whose_model_allocates_kv_at_start_admits_no_more_sessions_than_both_caches_hold(tiny_checkpoint):
    from graph.runtime import GraphRuntime

    profile = {
        "model_id": "test",
        "imports": ["nodes.qwen3_omni.model", "nodes.thinker", "nodes.talker"],
        "resources": {"omni": {"type": "qwen3_omni.model", "params": {"path": str(tiny_checkpoint), "kv_cache": "preallocate",
                                                                     "max_seq_len": 512}}},
        "nodes": {"thinker": {"type": "qwen3_omni.thinker", "params": {"resource": "omni", "warmup": False}},
                  "talker": {"type": "qwen3_omni.talker", "params": {"resource": "omni", "max_reply_frames": 64}}},
        "edges": ["thinker.hidden -> talker.hidden"],
        "inputs": {"embeddings": "thinker.embeddings"},
        "outputs": ["thinker.text", "talker.codes"],
        "limits": {"max_sessions": 100, "kv_tokens": 3 * 512, "max_seq_len": 512},
    }
    runtime = GraphRuntime.from_config(profile)
    await runtime.start()
    try:
        thinker, talker = runtime.nodes["thinker"], runtime.nodes["talker"]
        cache = thinker.executor.runner.cache
        # A row per session admitted, and the spare a truncation is built in ahead (spare_row.py).
        assert not cache.grow and cache.slots == 3 + 1 and cache.capacity >= 512
        talker_cache = TalkerSlots.for_model(talker.model).cache
        assert not talker_cache.grow and talker_cache.slots == 3 and talker_cache.capacity >= 512 + 64
        assert thinker.kv_rows() == talker.kv_rows() == runtime.kv_rows() == runtime.capacity("realtime") == 3
    finally:
        await runtime.stop(0)
