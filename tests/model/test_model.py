"""Loading a checkpoint: one clear error when it is missing or broken; dtype and bounds from params."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from graph.registry import resource_factory
from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.model import ModelLoadError, OmniModel
from nodes.qwen3_omni.thinker_engine import ThinkerSession


def test_a_missing_checkpoint_dir_is_one_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        OmniModel.load(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        OmniModel.load(tmp_path)


def test_a_corrupt_checkpoint_is_one_clear_error_naming_the_path(tmp_path, tiny_checkpoint):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError) as raised:
        OmniModel.load(broken)
    assert str(broken) in str(raised.value)
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="cannot load Qwen3-Omni checkpoint"):
        OmniModel.load(broken)


def test_resource_params_set_dtype_bounds_and_reject_unknown_keys(tiny_checkpoint):
    factory = resource_factory("qwen3_omni.model")
    omni = factory({"path": str(tiny_checkpoint), "dtype": "bfloat16", "max_reply_tokens": 5, "max_seq_len": 512})
    assert omni.dtype == torch.bfloat16 and omni.device.type == "cpu"
    assert omni.bounds.max_reply_tokens == 5 and omni.bounds.max_seq_len == 512
    assert omni.speakers == ("chelsie", "ethan", "aiden") and omni.default_speaker == "ethan"
    assert omni.output_sample_rate == 24000 and omni.sample_rate_in == 16000
    with pytest.raises(ModelLoadError, match="qwen3_omni.model params.colour: unknown key"):
        factory({"path": str(tiny_checkpoint), "colour": "red"})

    # A bfloat16 model runs a spoken turn end to end (encoders + thinker).
    audio = (np.random.default_rng(0).standard_normal(16000) * 0.1).astype(np.float32)
    inputs = build_turn_inputs(omni, audio=audio, add_generation_prompt=True)
    session = ThinkerSession(omni)
    session.prefill(encode_turns(omni, [inputs.tensors()])[0])
    steps = [session.decode_step() for _ in range(5)]
    assert [s.finish_reason for s in steps] == [None] * 4 + ["length"]


def test_the_default_path_builds_the_tiny_checkpoint_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_OMNI_CACHE", str(tmp_path))
    omni = OmniModel.load(None)
    assert omni.path.startswith(str(tmp_path))
    assert omni.system_prompt  # the tiny profile's default system prompt


def test_audio_shorter_than_one_hop_is_no_audio(omni):
    inputs = build_turn_inputs(omni, audio=np.zeros(100, np.float32), add_generation_prompt=True)
    assert inputs.input_ids == omni.tokens.assistant_header and not inputs.audio_features


def test_encoders_batch_turns_of_several_sessions_into_the_same_embeddings(omni):
    rng = np.random.default_rng(3)
    clips = [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in (16000, 25000, 7000)]
    turns = [build_turn_inputs(omni, audio=clip, text="x").tensors() for clip in clips]
    together = encode_turns(omni, turns)
    for turn, batched in zip(turns, together):
        (alone,) = encode_turns(omni, [turn])
        torch.testing.assert_close(batched["audio_embeds"], alone["audio_embeds"], atol=1e-5, rtol=1e-5)
        assert batched["audio_embeds"].shape[0] == turn["input_ids"].tolist().count(omni.tokens.audio_pad)


def test_a_hugging_face_id_loads_from_the_local_cache_only(tmp_path, monkeypatch, tiny_checkpoint):
    cache = tmp_path / "hub"
    repo = cache / "models--sgl--tiny-omni"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    shutil.copytree(tiny_checkpoint, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    omni = OmniModel.load("sgl/tiny-omni")
    assert omni.speakers == ("chelsie", "ethan", "aiden")
    assert omni.image_processor.patch_size == 16 and omni.feature_extractor.feature_size == 128
    with pytest.raises(ModelLoadError, match="sgl/not-cached"):
        OmniModel.load("sgl/not-cached")


def test_max_image_pixels_lowers_the_image_token_cost(omni):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (256, 256)).save(buffer, "PNG")
    full = build_turn_inputs(omni, images=[buffer.getvalue()])
    capped = build_turn_inputs(omni, images=[buffer.getvalue()], max_image_pixels=128 * 128)
    assert full.image_tokens == 64 and capped.image_tokens == 16  # one token per 32x32 pixels
