"""The lean decode forward (lean_decode.py) gives the HF text model's logits and keys/values.

Each test feeds the same tokens on the same slot-cache state twice, once through the HF text
model (`runner.lean = False`) and once through `LeanDecode`, and compares what comes out: the
logits of every row and the key/value columns written into every row, on the tiny checkpoint,
on a larger random profile (`scale=4`: 8 layers, 16 heads), through each of the experts' paths
for few experts, for each kind of row set (one range, rows close together with gaps, rows far
apart, out of slot order), and on a variant config that takes the other branches (a dense MLP layer, more
experts than the lean paths run, no top-k renormalisation). These tests are the guard of
lean_decode.py's coupling to transformers: run them after any transformers upgrade.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nodes.qwen3_omni import lean_decode
from nodes.qwen3_omni.batched_thinker import Feed, ThinkerRunner
from nodes.qwen3_omni.checkpoint import build_tiny_checkpoint, tiny_config
from nodes.qwen3_omni.slot_cache import SlotKVCache
from nodes.qwen3_omni.thinker_engine import ThinkerSession
from tests.model.test_batched_thinker import media_turn, text_turn

ATOL = 1e-5


@pytest.fixture(scope="module")
def scaled_omni(tmp_path_factory: pytest.TempPathFactory):
    from nodes.qwen3_omni.model import OmniModel

    path = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-omni-x4"), seed=1, scale=4)
    return OmniModel.load(path, device="cpu", dtype="float32")


def feed_both_ways(runner: ThinkerRunner, requests: list[Feed]) -> dict[bool, tuple[torch.Tensor, list]]:
    """{lean: (logits [B, V], per layer (keys, values) of the new column of each row)}, each
    from the same cache state (the rows are rolled back after each feed)."""
    lengths = {r.slot: runner.cache.length(r.slot) for r in requests}
    slots = torch.tensor([r.slot for r in requests])
    columns = torch.tensor([lengths[r.slot] for r in requests])
    out = {}
    try:
        for lean in (False, True):
            runner.lean = lean
            logits = torch.stack(runner.feed(requests))
            written = [(keys[slots, :, columns].clone(), values[slots, :, columns].clone())
                       for keys, values in zip(runner.cache.keys, runner.cache.values)]
            assert all(runner.cache.length(slot) == length + 1 for slot, length in lengths.items())
            for slot, length in lengths.items():
                runner.cache.set_length(slot, length)
            out[lean] = (logits, written)
    finally:
        runner.lean = True
    return out


def assert_same(out: dict[bool, tuple[torch.Tensor, list]], atol: float = ATOL, rtol: float = 0.0) -> None:
    (hf_logits, hf_kv), (lean_logits, lean_kv) = out[False], out[True]
    assert hf_logits.abs().max() > 0.1  # a real signal, not near-zero logits
    torch.testing.assert_close(lean_logits, hf_logits, atol=atol, rtol=rtol)
    for (hf_k, hf_v), (lean_k, lean_v) in zip(hf_kv, lean_kv):
        torch.testing.assert_close(lean_k, hf_k, atol=atol, rtol=rtol)
        torch.testing.assert_close(lean_v, hf_v, atol=atol, rtol=rtol)


def prefilled_sessions(omni, words: list[int], reply_tokens: int = 4) -> list[ThinkerSession]:
    """Sessions whose rows hold real conversations of different lengths; the second one's turn
    has audio and an image, so its rotary positions run behind its cache columns."""
    sessions = []
    for i, count in enumerate(words):
        session = ThinkerSession(omni, max_reply_tokens=reply_tokens)
        session.prefill(media_turn(omni, i) if i == 1 else text_turn(omni, count, seed=i))
        sessions.append(session)
    return sessions


def requests_for(sessions: list[ThinkerSession], token: int = 97) -> list[Feed]:
    return [Feed(s._slot, token + i, s.next_position, owner=s) for i, s in enumerate(sessions)]


# The experts' paths for few experts (lean_decode._moe): as chosen by size, or forced either way.
EXPERT_PATHS = {"by size": None, "each chosen pair": -(10**15), "every expert": 10**15}


@pytest.mark.parametrize("experts", list(EXPERT_PATHS))
@pytest.mark.parametrize("profile", ["tiny", "scale4"])
def test_lean_decode_equals_the_hf_forward_for_one_row_and_for_rows_of_different_lengths(profile, experts, omni,
                                                                                          request, monkeypatch):
    model = omni if profile == "tiny" else request.getfixturevalue("scaled_omni")
    if EXPERT_PATHS[experts] is not None:
        monkeypatch.setattr(lean_decode, "PAIR_COST_BYTES", EXPERT_PATHS[experts])
    sessions = prefilled_sessions(model, [3, 0, 40, 11, 90])
    assert sessions[1].next_position < sessions[1].context_length  # mrope: positions != columns
    runner = sessions[0]._runner
    assert runner.lean_decode.why_not is None and runner.lean_decode.usable()
    try:
        for rows in (sessions[:1], sessions[1:2], sessions[2:4], sessions):
            assert_same(feed_both_ways(runner, requests_for(rows)))
    finally:
        for session in sessions:
            session.close()


def test_a_reply_decoded_through_the_lean_forward_is_the_hf_forwards_reply(omni):
    runner = ThinkerRunner.for_model(omni)
    replies = {}
    for lean in (False, True):
        runner.lean = lean
        try:
            sessions = prefilled_sessions(omni, [7, 0, 25], reply_tokens=12)
            steps = [[] for _ in sessions]
            for i, session in enumerate(sessions):
                while (step := session.decode_step()).finish_reason is None:
                    steps[i].append((step.token_id, session._last_logits.clone()))
            replies[lean] = steps
            for session in sessions:
                session.close()
        finally:
            runner.lean = True
    for hf, lean in zip(replies[False], replies[True]):
        assert [t for t, _ in lean] == [t for t, _ in hf] and len(hf) == 11
        for (_, a), (_, b) in zip(lean, hf):
            assert b.abs().max() > 0.1
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_the_feed_runs_the_lean_forward_and_falls_back_to_the_hf_model_when_it_is_hooked(omni, monkeypatch):
    sessions = prefilled_sessions(omni, [5, 0])
    runner = sessions[0]._runner
    lean_calls = []
    original = lean_decode.LeanDecode.__call__
    monkeypatch.setattr(lean_decode.LeanDecode, "__call__",
                        lambda self, *args: lean_calls.append(len(args[0])) or original(self, *args))
    hf_calls = []
    try:
        runner.feed(requests_for(sessions))
        assert lean_calls == [2] and hf_calls == []
        handle = runner.language_model.register_forward_hook(lambda module, args, output: hf_calls.append(1))
        try:
            assert not runner.lean_decode.usable()
            runner.feed(requests_for(sessions))  # a hook on the model sees the call: the HF forward ran
            assert lean_calls == [2] and hf_calls == [1]
        finally:
            handle.remove()
        assert runner.lean_decode.usable()
    finally:
        for session in sessions:
            session.close()


def variant_thinker(seed: int = 0):
    """The tiny thinker with a dense first layer, 16 experts (top 4, no renormalisation): the
    MoE block's own experts forward runs instead of the dense-experts path."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

    config = tiny_config().thinker_config
    text = config.text_config
    text.mlp_only_layers, text.num_experts, text.num_experts_per_tok, text.norm_topk_prob = [0], 16, 4, False
    assert text.num_experts > lean_decode.DENSE_EXPERTS
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration(config).eval()
        with torch.no_grad():
            for name, parameter in thinker.model.language_model.named_parameters():
                if "norm" not in name:
                    parameter.normal_(0.0, 0.15)
            thinker.lm_head.weight.normal_(0.0, 0.15)
    return thinker


def random_rows(runner: ThinkerRunner, lengths: list[int], seed: int = 0) -> list[int]:
    """Rows of the given lengths holding random keys/values; their slots, in order."""
    generator = torch.Generator().manual_seed(seed)
    slots = [runner.cache.acquire() for _ in lengths]
    for slot, length in zip(slots, lengths):
        for keys, values in zip(runner.cache.keys, runner.cache.values):
            keys[slot, :, :length] = torch.randn(keys[slot, :, :length].shape, generator=generator)
            values[slot, :, :length] = torch.randn(values[slot, :, :length].shape, generator=generator)
        runner.cache.lengths[slot] = length
    return slots


# Row sets of one forward: contiguous, out of slot order, close together with gaps (attention over
# their covering range), far apart (rows copied out), all.
ROW_SETS = ([1], [1, 2, 3], [5, 2, 3], [0, 2, 3, 6], [0, 7], [7, 6, 5, 4, 3, 2, 1, 0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lean_decode_equals_the_hf_forward_for_every_kind_of_row_set(dtype, omni, tiny_checkpoint):
    from nodes.qwen3_omni.model import OmniModel

    model = omni if dtype == "float32" else OmniModel.load(tiny_checkpoint, device="cpu", dtype=dtype)
    runner = ThinkerRunner(model, slots=8, capacity=64)  # its own rows, not the shared runner's
    assert runner.cache.dtype == getattr(torch, dtype)
    slots = random_rows(runner, [1, 9, 30, 17, 5, 44, 12, 3])
    cache = runner.cache
    kinds = {"contiguous": 0, "covering": 0, "copied": 0}
    for rows in ROW_SETS:
        batch = cache.batch(sorted(slots[i] for i in rows), 1)
        kinds["contiguous" if batch._contiguous else "covering" if batch.covering() else "copied"] += 1
        requests = [Feed(slots[i], 40 + i, cache.length(slots[i]) + 2 * i) for i in rows]
        # bfloat16: about one unit in the last place (the same bits measured here).
        assert_same(feed_both_ways(runner, requests), *((ATOL, 0.0) if dtype == "float32" else (1e-2, 1.6e-2)))
    assert all(kinds.values()), kinds


def test_a_batch_of_rows_close_together_attends_over_their_covering_range():
    cache = SlotKVCache(layers=1, kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu", slots=8, capacity=16)
    for slot, length in zip([cache.acquire() for _ in range(8)], (3, 5, 2, 6, 1, 1, 1, 4)):
        cache.lengths[slot] = length
    assert cache.batch([1, 2, 3], 1).covering() is None  # one range: read as a view
    assert cache.batch([0, 7], 1).covering() is None  # far apart: copied out
    span, places, mask = cache.batch([3, 0, 2], 1).covering()
    assert span == slice(0, 4) and places.tolist() == [3, 0, 2]
    assert mask.shape == (4, 1, 1, 7)  # up to the longest row's new column
    seen = (mask[:, 0, 0] == 0).sum(dim=-1).tolist()
    assert seen == [4, 1, 3, 7]  # each row its columns and the new one; row 1 (not in the batch) column 0


def test_lean_decode_equals_the_hf_forward_with_a_dense_layer_and_many_experts():
    thinker = variant_thinker()
    layers = thinker.model.language_model.layers
    assert type(layers[0].mlp).__name__ == "Qwen3OmniMoeThinkerTextMLP" and layers[1].mlp.gate.top_k == 4
    runner = ThinkerRunner(SimpleNamespace(thinker=thinker, device=torch.device("cpu")), slots=4, capacity=64)
    assert runner.lean_decode.why_not is None
    slots = random_rows(runner, [1, 9, 30, 17])
    for rows in (slots[:1], slots, slots[::2]):
        requests = [Feed(slot, 40 + slot, runner.cache.length(slot) + 3 * slot) for slot in rows]
        assert_same(feed_both_ways(runner, requests))
