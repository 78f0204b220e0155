"""The tiny checkpoint: deterministic, a few MB, and loaded through the real `from_pretrained` path."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from nodes.qwen3_omni import checkpoint
from nodes.qwen3_omni.checkpoint import (
    SPEAKERS,
    build_tiny_checkpoint,
    ensure_tiny_checkpoint,
    make_tiny_checkpoint_main,
)


def weights_digest(directory: Path) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_builds_identical_weights_and_another_seed_does_not(tmp_path, tiny_checkpoint):
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    assert weights_digest(again) == weights_digest(tiny_checkpoint)
    assert weights_digest(other) != weights_digest(tiny_checkpoint)


def test_checkpoint_is_a_few_megabytes(tiny_checkpoint):
    size = sum(f.stat().st_size for f in tiny_checkpoint.iterdir())
    assert 1e5 < size < 10e6


def test_from_pretrained_loads_exactly_the_weights_that_were_built(tiny_checkpoint):
    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_checkpoint, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    built = checkpoint.tiny_model(seed=0).state_dict()
    loaded = model.state_dict()
    assert set(loaded) == set(built)
    for name, tensor in built.items():
        assert torch.equal(loaded[name], tensor), name
    assert model.config.talker_config.speaker_id.keys() == set(SPEAKERS)


def test_ids_of_the_chat_format_agree_between_tokenizer_and_config(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model_config = Qwen3OmniMoeForConditionalGeneration.config_class.from_pretrained(tiny_checkpoint)
    thinker = model_config.thinker_config
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == model_config.im_start_token_id
    assert tokenizer.convert_tokens_to_ids("<|audio_pad|>") == thinker.audio_token_id
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == thinker.image_token_id
    assert tokenizer.convert_tokens_to_ids("<|audio_start|>") == thinker.audio_start_token_id
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == thinker.vision_start_token_id
    assert tokenizer.convert_tokens_to_ids("<tts_text_bos>") == model_config.tts_bos_token_id
    # The assistant header is exactly three tokens, as the talker's prompt layout assumes.
    header = tokenizer("<|im_start|>assistant\n").input_ids
    assert header == [model_config.im_start_token_id, model_config.assistant_token_id, tokenizer.encode("\n")[0]]
    assert tokenizer("<|im_start|>user\n").input_ids[1] == model_config.user_token_id
    text = "Grüße, user — ça va? 🙂"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>hi<|im_end|>\n<|im_start|>assistant\n"


def test_stock_generate_returns_text_and_audio_bounded_by_max_tokens(tiny_checkpoint):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello!"}], tokenize=False, add_generation_prompt=True
    )
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    sequences, wav = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        speaker="chelsie",
        thinker_max_new_tokens=4,
        talker_max_new_tokens=6,
        talker_do_sample=False,
    )
    reply = sequences[0, input_ids.shape[1] :]
    assert len(reply) == 4
    assert tokenizer.decode(reply).isprintable()
    # Random weights never pick codec EOS, so the talker runs to its bound; each codec frame is 1920
    # samples at 24 kHz, less the 555 samples code2wav holds back at the end.
    frames, rest = divmod(wav.shape[-1] + 555, 1920)
    assert rest == 0 and 1 <= frames <= 6
    assert 0.01 < float(wav.abs().max()) < 1.0


def test_ensure_builds_once_into_the_cache_dir_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_OMNI_CACHE", str(tmp_path))
    first = ensure_tiny_checkpoint()
    assert first.parent == tmp_path and (first / "config.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging dir left behind


def test_make_tiny_checkpoint_command_writes_a_loadable_dir(tmp_path, capsys):
    assert make_tiny_checkpoint_main([str(tmp_path / "ckpt"), "--seed", "3"]) == 0
    assert "written to" in capsys.readouterr().out
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    assert (tmp_path / "ckpt" / "generation_config.json").is_file()
