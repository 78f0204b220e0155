"""Random-weight Qwen3-Omni models at real sizes, built in memory on the target device.

For measuring the server at the real model's cost where its weights cannot be had (no download
here): `qwen3_omni_30b_a3b_config()` is Qwen3-Omni-30B-A3B-Instruct's published configuration
(thinker: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts with 8 per token,
MoE width 768, vocabulary 152,064; audio encoder 32 x 1280; vision encoder 27 x 1152; talker:
20 layers, hidden 1024, 128 experts with 6 per token and a shared expert of 768; code predictor
5 x 1024 over 16 code groups; code2wav 8 x 1024, decoder 1536, codebook 2048), about 35 B
parameters: ~70 GB in bfloat16.

The tokenizer, the chat-format ids and the preprocessor are the tiny checkpoint's (checkpoint.py):
token ids only index the embedding tables, so the cost of every forward is the real model's,
and replies are the same legible gibberish (`_shape_random_weights`).

`shrink` > 1 divides every width, head count, layer count and expert count by that factor (at
least 1 each; head_dim and the vocabularies stay), so the same path runs on CPU in a test.

A profile asks for one with `random_weights: qwen3-omni-30b-a3b` (and `random_shrink: N`) in the
`qwen3_omni.model` resource instead of a `path`; see configs/qwen3_omni_random_h200.yaml.
"""

from __future__ import annotations

from typing import Any

from nodes.qwen3_omni.checkpoint import SPEAKERS, _token_ids, omni_config

PRESETS = ("qwen3-omni-30b-a3b",)


def qwen3_omni_30b_a3b_config(shrink: int = 1):
    if shrink < 1:
        raise ValueError("shrink must be >= 1")

    def div(n: int) -> int:
        return max(1, n // shrink)

    ids = _token_ids()
    thinker_hidden, talker_hidden = div(2048), div(1024)
    thinker_layers = div(48)
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20], "interleaved": True}
    media_ids = {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "position_id_per_seconds": 13,
    }
    vision_depth = max(2, 27 // shrink)
    deepstack = sorted({min(i // shrink, vision_depth - 1) for i in (8, 16, 24)})
    audio_heads = div(20)
    thinker = {
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": div(32),
            "encoder_attention_heads": audio_heads,
            "encoder_ffn_dim": div(5120),
            "d_model": div(1280) // audio_heads * audio_heads,
            "output_dim": thinker_hidden,
            "downsample_hidden_size": div(480),
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
        },
        "vision_config": {
            "depth": vision_depth,
            "hidden_size": div(1152) // div(16) * div(16),
            "intermediate_size": div(4304),
            "num_heads": div(16),
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": thinker_hidden,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": deepstack,
        },
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": thinker_hidden,
            "intermediate_size": div(768),
            "num_hidden_layers": thinker_layers,
            "num_attention_heads": div(32),
            "num_key_value_heads": div(4),
            "head_dim": 128,
            "moe_intermediate_size": div(768),
            "num_experts": max(8, 128 // shrink),
            "num_experts_per_tok": 8,
            "max_position_embeddings": 65536,
            "rope_parameters": dict(mrope),
            "pad_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
        },
        "user_token_id": ids["user"],
        **media_ids,
    }
    codebook = 2048
    talker = {
        "text_config": {
            "vocab_size": 3072,
            "hidden_size": talker_hidden,
            "intermediate_size": div(2048),
            "num_hidden_layers": div(20),
            "num_attention_heads": div(16),
            "num_key_value_heads": div(2),
            "head_dim": 128,
            "moe_intermediate_size": div(384),
            "shared_expert_intermediate_size": div(768),
            "num_experts": max(6, 128 // shrink),
            "num_experts_per_tok": 6,
            "max_position_embeddings": 65536,
            "rope_parameters": dict(mrope),
        },
        "code_predictor_config": {
            "vocab_size": codebook,
            "hidden_size": talker_hidden,
            "intermediate_size": div(3072),
            "num_hidden_layers": div(5),
            "num_attention_heads": div(16),
            "num_key_value_heads": div(8),
            "head_dim": 128,
            "num_code_groups": 16,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        "num_code_groups": 16,
        "thinker_hidden_size": thinker_hidden,
        "accept_hidden_layer": min(24 // shrink, thinker_layers),
        "spatial_merge_size": 2,
        # The real checkpoint's codec specials and speaker ids (talker vocabulary 3072).
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {name: 2301 + i for i, name in enumerate(SPEAKERS)},
        **media_ids,
    }
    code2wav = {
        "codebook_size": codebook,
        "hidden_size": div(1024),
        "num_attention_heads": div(16),
        "num_key_value_heads": div(16),
        "num_hidden_layers": div(8),
        "intermediate_size": div(3072),
        "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": div(1536),
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return omni_config(thinker, talker, code2wav)


def build_random_model(preset: str, *, shrink: int = 1, device: str = "cpu", dtype: Any = None, seed: int = 0):
    """The preset's model with seeded random weights, built directly on `device` in `dtype`."""
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    from nodes.qwen3_omni.checkpoint import _shape_random_weights

    if preset not in PRESETS:
        raise ValueError(f"unknown random_weights preset {preset!r} (known: {', '.join(PRESETS)})")
    config = qwen3_omni_30b_a3b_config(shrink)
    ids = _token_ids()
    dtype = dtype or torch.float32
    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = Qwen3OmniMoeForConditionalGeneration(config)
        finally:
            torch.set_default_dtype(previous)
        model.eval()
        with torch.no_grad():
            _shape_random_weights(model, ids)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"], do_sample=False)
    return model
