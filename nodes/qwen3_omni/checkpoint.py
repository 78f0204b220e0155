"""The tiny Qwen3-Omni checkpoint: a seeded, random-weight model of the real architecture.

It is the embedded default model and the test fixture. It is a real `Qwen3OmniMoeConfig` +
`Qwen3OmniMoeForConditionalGeneration`, saved with `save_pretrained` next to a byte-level
tokenizer (built with `tokenizers`), a chat template and a generation config, so that loading it
goes through exactly the `from_pretrained` path a real checkpoint takes.

    build_tiny_checkpoint(out_dir, seed=0) -> Path     # always builds (2-4 s on one core: the training)
    ensure_tiny_checkpoint(cache_dir=None) -> Path     # builds once into a cache dir, then reuses it
    make_tiny_checkpoint_main(argv) -> int             # `sgl-omni make-tiny-checkpoint DIR [--seed N]`

Token layout of the tiny vocabulary (the ids are in `config.json`, read them from there):
  0..255    one token per byte (GPT-2 byte-to-unicode alphabet, so any text round-trips)
  256..271  BPE merges that make `system`, `user`, `assistant` single tokens, as in the real
            vocabulary (the talker splits the assistant header `<|im_start|>assistant\\n` as
            exactly three tokens)
  272..     the special tokens of Qwen3-Omni's chat format (`SPECIAL_TOKENS`), then the
            tool-call markers (`TOOL_TOKENS`, added but not special, as in the real vocabulary)

Talker vocabulary: codec codes 0..codebook_size-1, then 1024 ids of codec specials whose offsets
from `codebook_size` mirror the real checkpoint (pad +100, bos +101, eos +102, nothink +107,
think_bos +108, think_eos +109) and the speakers (`SPEAKERS`, +253..+255).

Weights: seeded random, shaped by `_shape_random_weights` (printable text only, a talker that never
picks codec EOS, audible code2wav). At scale 1 the thinker is then trained for a few seconds on
a synthetic corpus (brief_replies.py), so that greedy decoding answers every turn, spoken or
written, with `brief_replies.REPLY` ("Okay, sure!", 11 tokens) and `<|im_end|>`: a reply ends
`completed` on its own, as with a real checkpoint. Its audio still ends by the serving config
(`max_frames_per_token`: frames per reply token once the text has ended), since the talker stays
random. Larger scales (benchmarks) stay random: their replies run to `max_reply_tokens`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

# Bump when the layout, the sizes or the weights' recipe change: the cache dir is keyed by it.
# v2: tool-call tokens; v3: the thinker is taught brief replies that end on EOS.
TINY_CHECKPOINT_VERSION = "tiny-qwen3-omni-v3"

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
)

# Qwen3's tool-call markers: added tokens but not special ones (as in the real vocabulary), so
# they survive decoding and `split_special_tokens` leaves them whole.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# The roles are BPE words built from bytes (not added tokens), so `user` inside ordinary text is
# also one token, as with the real tokenizer.
_ROLE_WORDS = ("user", "system", "assistant")

SPEAKERS = ("chelsie", "ethan", "aiden")

THINKER_VOCAB_SIZE = 320
CODEBOOK_SIZE = 256
NUM_CODE_GROUPS = 4
THINKER_HIDDEN = 64
TALKER_HIDDEN = 64

DEFAULT_SYSTEM_PROMPT = "You are a helpful voice assistant."

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'audio' %}{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-unicode map (what the ByteLevel pre-tokenizer uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes)}


def _token_ids() -> dict[str, int]:
    """Ids of the role words and the special tokens in the tiny vocabulary."""
    ids: dict[str, int] = {}
    next_id = 256
    for word in _ROLE_WORDS:
        for end in range(2, len(word) + 1):
            prefix = word[:end]
            if prefix not in ids:
                ids[prefix] = next_id
                next_id += 1
    for token in SPECIAL_TOKENS + TOOL_TOKENS:
        ids[token] = next_id
        next_id += 1
    assert next_id <= THINKER_VOCAB_SIZE
    return ids


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []
    ids = _token_ids()
    for word in _ROLE_WORDS:
        for end in range(2, len(word) + 1):
            prefix = word[:end]
            if prefix not in vocab:
                vocab[prefix] = ids[prefix]
                merges.append((word[: end - 1], word[end - 1]))
    # A merge only fires if its left part exists: (`as`, `s`) needs `as`, which `assistant` adds.
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    for token in SPECIAL_TOKENS + TOOL_TOKENS:
        assert tokenizer.token_to_id(token) == ids[token], token

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
        extra_special_tokens={
            "audio_token": "<|audio_pad|>",
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )


def tiny_config(scale: int = 1):
    """The `Qwen3OmniMoeConfig` of the tiny checkpoint.

    `scale` > 1 makes a larger random profile of the same layout, for benchmarks whose ratios
    should reflect compute rather than per-call overhead: the thinker's and talker's widths,
    heads, MoE sizes and layer counts grow `scale` times (head_dim, vocabularies, the encoders'
    own widths and code2wav stay as they are). scale=8: a 16-layer, ~38 M-parameter thinker.
    """

    if scale < 1:
        raise ValueError("scale must be >= 1")
    thinker_hidden, talker_hidden = THINKER_HIDDEN * scale, TALKER_HIDDEN * scale

    ids = _token_ids()
    audio_pad, image_pad, video_pad = ids["<|audio_pad|>"], ids["<|image_pad|>"], ids["<|video_pad|>"]
    audio_start, vision_start = ids["<|audio_start|>"], ids["<|vision_start|>"]
    # mrope_section sums to head_dim / 2 (= 8): the T, H, W shares of the rotary frequencies.
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3], "interleaved": True}
    media_ids = {
        "audio_token_id": audio_pad,
        "image_token_id": image_pad,
        "video_token_id": video_pad,
        "audio_start_token_id": audio_start,
        "vision_start_token_id": vision_start,
        "position_id_per_seconds": 25,
    }
    thinker = {
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": thinker_hidden,
            "downsample_hidden_size": 8,
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 800,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": thinker_hidden,
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0],
        },
        "text_config": {
            "vocab_size": THINKER_VOCAB_SIZE,
            "hidden_size": thinker_hidden,
            "intermediate_size": 128 * scale,
            "num_hidden_layers": 2 * scale,
            "num_attention_heads": 4 * scale,
            "num_key_value_heads": 2 * scale,
            "head_dim": 16,
            "moe_intermediate_size": 32 * scale,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
            "rope_parameters": dict(mrope),
            "pad_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
        },
        "user_token_id": ids["user"],
        **media_ids,
    }
    codec_special = {
        "codec_pad_id": CODEBOOK_SIZE + 100,
        "codec_bos_id": CODEBOOK_SIZE + 101,
        "codec_eos_token_id": CODEBOOK_SIZE + 102,
        "codec_nothink_id": CODEBOOK_SIZE + 107,
        "codec_think_bos_id": CODEBOOK_SIZE + 108,
        "codec_think_eos_id": CODEBOOK_SIZE + 109,
    }
    talker = {
        "text_config": {
            "vocab_size": CODEBOOK_SIZE + 1024,
            "hidden_size": talker_hidden,
            "intermediate_size": 128 * scale,
            "num_hidden_layers": 2 * scale,
            "num_attention_heads": 4 * scale,
            "num_key_value_heads": 2 * scale,
            "head_dim": 16,
            "moe_intermediate_size": 32 * scale,
            "shared_expert_intermediate_size": 64 * scale,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
            "rope_parameters": dict(mrope),
        },
        "code_predictor_config": {
            "vocab_size": CODEBOOK_SIZE,
            "hidden_size": talker_hidden,
            "intermediate_size": 128 * scale,
            "num_hidden_layers": 1,
            "num_attention_heads": 4 * scale,
            "num_key_value_heads": 2 * scale,
            "head_dim": 16,
            "num_code_groups": NUM_CODE_GROUPS,
            "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": thinker_hidden,
        "accept_hidden_layer": 1,
        "spatial_merge_size": 2,
        "speaker_id": {name: CODEBOOK_SIZE + 253 + i for i, name in enumerate(SPEAKERS)},
        **codec_special,
        **media_ids,
    }
    code2wav = {
        "codebook_size": CODEBOOK_SIZE,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 32,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return omni_config(thinker, talker, code2wav)


def omni_config(thinker: dict, talker: dict, code2wav: dict):
    """A `Qwen3OmniMoeConfig` of these parts, with the chat-format ids of this tokenizer."""
    from transformers import Qwen3OmniMoeConfig

    ids = _token_ids()
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def tiny_model(seed: int = 0, scale: int = 1):
    """The tiny model in memory: seeded random weights, shaped by `_shape_random_weights`; at
    scale 1 the thinker is then taught to answer briefly and stop (brief_replies.py)."""
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    from nodes.qwen3_omni.brief_replies import teach_brief_replies

    ids = _token_ids()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(tiny_config(scale))
        model.eval()
        with torch.no_grad():
            _shape_random_weights(model, ids)
        if scale == 1:
            features = WhisperFeatureExtractor(**{k: v for k, v in _preprocessor_config().items() if k in _WHISPER_KEYS})
            teach_brief_replies(model, _build_tokenizer(), ids, features, seed, DEFAULT_SYSTEM_PROMPT)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    return model


def build_tiny_checkpoint(out_dir: str | os.PathLike[str], seed: int = 0, scale: int = 1) -> Path:
    """Build the tiny checkpoint into `out_dir` (created; existing files are overwritten).

    Same seed -> byte-identical weights. Returns the directory. `scale` > 1: a larger random
    profile (see `tiny_config`), for benchmarks.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tiny_model(seed, scale).save_pretrained(out)
    _build_tokenizer().save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(_preprocessor_config(), indent=2) + "\n")
    (out / "sgl_omni_tiny.json").write_text(json.dumps({"version": TINY_CHECKPOINT_VERSION, "seed": seed, **({"scale": scale} if scale != 1 else {})}) + "\n")
    return out


def _shape_random_weights(model, ids: dict[str, int]) -> None:
    """Make random weights deterministic and behave like a quiet, legible, endless talker.

    - Thinker: only printable ASCII bytes and the role words can win the argmax (the other
      `lm_head` rows are zero while ~95 random logits compete, so some is positive): transcripts
      are readable gibberish, never a control byte, a broken UTF-8 sequence or EOS.
    - Talker: codec specials (EOS included) get zero logits too: a reply's audio is bounded by the
      serving config, never by a lucky EOS.
    - code2wav: fan-in scaled init (the default 0.02 std gives ~1e-7 output at these widths) and
      an output scale of ~0.1 RMS, so the audio is audible noise that is never clipped.
    """
    import torch

    # transformers 5.24 leaves the talker's expert weights (3-D `gate_up_proj`/`down_proj`) as
    # `torch.empty` memory and its routers at zero: initialize them like the thinker's.
    std = model.config.talker_config.initializer_range
    for layer in model.talker.model.layers:
        moe = layer.mlp
        if hasattr(moe, "experts"):
            torch.nn.init.normal_(moe.experts.gate_up_proj, std=std)
            torch.nn.init.normal_(moe.experts.down_proj, std=std)
            torch.nn.init.normal_(moe.gate.weight, std=std)

    lm_head = model.thinker.lm_head.weight
    allowed = torch.zeros(lm_head.shape[0], dtype=torch.bool, device=lm_head.device)
    allowed[32:127] = True
    for word in _ROLE_WORDS:
        for end in range(2, len(word) + 1):
            allowed[ids[word[:end]]] = True
    lm_head[~allowed] = 0.0

    codebook = model.config.code2wav_config.codebook_size
    groups = model.config.code2wav_config.num_quantizers
    model.talker.codec_head.weight[codebook:] = 0.0

    code2wav = model.code2wav
    for module in code2wav.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Linear)):
            fan_in = module.weight[0].numel()
        elif isinstance(module, torch.nn.ConvTranspose1d):
            fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
        else:
            continue
        torch.nn.init.normal_(module.weight, std=fan_in**-0.5)
        if module.bias is not None:
            module.bias.zero_()
    final = code2wav.decoder[-1].conv
    captured: list[torch.Tensor] = []
    handle = final.register_forward_hook(lambda _m, _i, out: captured.append(out))
    codes = torch.arange(groups * 16, device=final.weight.device).reshape(1, groups, 16) % codebook
    code2wav(codes)
    handle.remove()
    scale = 0.1 / float(captured[0].std())
    final.weight.mul_(scale)


_WHISPER_KEYS = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value")


def _preprocessor_config() -> dict:
    """Audio features and image patches as Qwen3-Omni expects them (read by `nodes.qwen3_omni.model`)."""
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 300,
        "n_fft": 400,
        "padding_value": 0.0,
        "return_attention_mask": True,
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 32 * 32,
        "max_pixels": 256 * 256,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


def default_cache_dir() -> Path:
    root = os.environ.get("SGL_OMNI_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "sgl-omni"
    return base / TINY_CHECKPOINT_VERSION


def ensure_tiny_checkpoint(cache_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> Path:
    """Return a built tiny checkpoint, building it once if `cache_dir` holds none.

    The build goes into a temporary sibling directory that is renamed into place, so a crash or a
    concurrent start never leaves a half-written checkpoint behind.
    """
    target = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if (target / "sgl_omni_tiny.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_tiny_checkpoint(staging, seed=seed)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any other
        try:
            staging.rename(target)
        except OSError:
            # Someone else finished first (or a stale, incomplete dir is in the way).
            if not (target / "sgl_omni_tiny.json").is_file():
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def make_tiny_checkpoint_main(argv: list[str]) -> int:
    """`sgl-omni make-tiny-checkpoint DIR [--seed N]`."""
    parser = argparse.ArgumentParser(prog="sgl-omni make-tiny-checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, default=1, help="a larger random profile (widths and layers x N), for benchmarks")
    args = parser.parse_args(argv)
    out = build_tiny_checkpoint(args.dir, seed=args.seed, scale=args.scale)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"tiny Qwen3-Omni checkpoint written to {out} ({size / 1e6:.1f} MB)")
    return 0
