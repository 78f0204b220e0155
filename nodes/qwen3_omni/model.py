"""Loading a Qwen3-Omni checkpoint: model, tokenizer, audio feature extractor, image processor.

    omni = OmniModel.load(path=None, device="cpu", dtype="float32", max_seq_len=..., max_reply_tokens=...)

`path=None` builds (once) and loads the tiny checkpoint (`checkpoint.ensure_tiny_checkpoint`).
A directory is loaded as is; anything else is taken for a Hugging Face id that must already be in
the local cache (`local_files_only=True` either way: nothing is ever downloaded).
A missing or broken checkpoint raises `ModelLoadError` with one message that names the path.

The same object is the graph resource `qwen3_omni.model` (registered below): every Qwen3-Omni
node of a server shares it. It holds no per-session state.

Inputs are built without `Qwen3OmniMoeProcessor` (it needs torchvision): audio goes through
`WhisperFeatureExtractor` (128 mel bins, 16 kHz), images through `Qwen2VLImageProcessorPil`
(PIL + numpy), both configured from the checkpoint's `preprocessor_config.json`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graph.registry import register_resource
from nodes.params import OmniModelParams, decode
from nodes.qwen3_omni.bounds import ReplyBounds
from nodes.qwen3_omni.slot_cache import allocated_at_start

log = logging.getLogger(__name__)


class _KnownRopeKeys(logging.Filter):
    """Drops transformers' warning that Qwen3-Omni's `mrope_section` / `interleaved` rope keys are
    unrecognised: they are the model's own (its multimodal RoPE reads them), and the warning came
    several times per engine at every start."""

    QWEN3_OMNI_KEYS = ("mrope_section", "interleaved")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Unrecognized keys in `rope_parameters`"):
            return True
        unused = message.rsplit(":", 1)[-1]
        return any(word.strip(" {}'\"") not in self.QWEN3_OMNI_KEYS for word in unused.split(","))


logging.getLogger("transformers.modeling_rope_utils").addFilter(_KnownRopeKeys())

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Defaults of the image processor when a checkpoint's preprocessor config leaves them out
# (these are Qwen3-Omni's own values).
_IMAGE_DEFAULTS = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 128 * 28 * 28,
    "max_pixels": 16384 * 28 * 28,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message says which path and why."""


@dataclass(frozen=True)
class ChatTokens:
    """Token ids of Qwen3-Omni's chat format, read from the checkpoint's config and tokenizer."""

    im_start: int
    im_end: int
    newline: int
    system: int
    user: int
    assistant: int
    audio_start: int
    audio_end: int
    audio_pad: int
    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    # A reply ends at any of these.
    eos: frozenset[int] = field(default_factory=frozenset)
    # Never part of a reply (placeholders, markers): masked out of sampling.
    suppressed: frozenset[int] = field(default_factory=frozenset)
    # Qwen3's `<tool_call>` / `</tool_call>` (None: the vocabulary has no such tokens; then tool
    # calls are not served).
    tool_call: int | None = None
    tool_call_end: int | None = None

    @property
    def assistant_header(self) -> list[int]:
        """`<|im_start|>assistant\\n` — the three tokens that open a reply."""
        return [self.im_start, self.assistant, self.newline]

    @property
    def closing(self) -> list[int]:
        """`<|im_end|>\\n` — what closes any message in the history."""
        return [self.im_end, self.newline]


class OmniModel:
    """A loaded Qwen3-Omni checkpoint with its tokenizer and input processors."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        feature_extractor: Any,
        image_processor: Any,
        *,
        path: str,
        bounds: ReplyBounds = ReplyBounds(),
        system_prompt: str | None = None,
    ):
        self.model = model
        self.config = model.config
        self.thinker = model.thinker
        self.talker = getattr(model, "talker", None)
        self.code2wav = getattr(model, "code2wav", None)
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.path = path
        self.bounds = bounds
        self.system_prompt = system_prompt
        self.tokens = _chat_tokens(model.config, tokenizer)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # The thinker's and talker's slot caches: allocated at start from the profile's limits
        # (True) or growing on demand (slot_cache.py). The resource's `kv_cache` sets it
        # (auto: at start on CUDA); a model loaded directly grows.
        self.kv_at_start = False

    @property
    def sample_rate_in(self) -> int:
        """Input audio rate the feature extractor expects (16 kHz)."""
        return int(self.feature_extractor.sampling_rate)

    # Reply audio: code2wav makes 24 kHz PCM.
    output_sample_rate = 24000

    @property
    def speakers(self) -> tuple[str, ...]:
        """The checkpoint's built-in speaker names (lower case), in talker-id order."""
        if self.talker is None:
            return ()
        speaker_ids = self.config.talker_config.speaker_id or {}
        return tuple(name.lower() for name, _ in sorted(speaker_ids.items(), key=lambda item: item[1]))

    @property
    def default_speaker(self) -> str:
        """The speaker of a reply that names no voice: `ethan`, as `generate()`, if the checkpoint has it."""
        speakers = self.speakers
        if not speakers:
            return ""
        return "ethan" if "ethan" in speakers else speakers[0]

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        bounds: ReplyBounds = ReplyBounds(),
        system_prompt: str | None = None,
        random_weights: str | None = None,
        random_shrink: int = 1,
    ) -> OmniModel:
        from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        if dtype not in DTYPES:
            raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
        if random_weights is not None:
            return cls._random(random_weights, random_shrink, device, dtype, bounds, system_prompt)
        if path is None:
            from nodes.qwen3_omni.checkpoint import DEFAULT_SYSTEM_PROMPT, ensure_tiny_checkpoint

            path = ensure_tiny_checkpoint()
            system_prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
        source = str(path)
        is_dir = Path(source).is_dir()
        if not is_dir and (Path(source).exists() or source.startswith((".", "/", "~")) or source.count("/") != 1):
            raise ModelLoadError(f"cannot load Qwen3-Omni checkpoint {source!r}: no such directory")
        if is_dir and not (Path(source) / "config.json").is_file():
            raise ModelLoadError(f"cannot load Qwen3-Omni checkpoint {source!r}: config.json is missing")
        # Never download: a Hugging Face id must already be in the local cache.
        common: dict[str, Any] = {"local_files_only": True}
        try:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                source,
                dtype=DTYPES[dtype],
                device_map=device if device != "cpu" else None,
                **common,
            )
            model.eval()
            tokenizer = AutoTokenizer.from_pretrained(source, **common)
            feature_extractor, image_processor = _processors(_preprocessor_config(source, is_dir))
        except ModelLoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - one clear startup error, whatever broke
            raise ModelLoadError(f"cannot load Qwen3-Omni checkpoint {source!r}: {type(exc).__name__}: {exc}") from exc
        if device == "cpu":
            model.to("cpu")
        omni = cls(
            model,
            tokenizer,
            feature_extractor,
            image_processor,
            path=source,
            bounds=bounds,
            system_prompt=system_prompt,
        )
        log.info("loaded Qwen3-Omni from %s on %s (%s)", source, omni.device, dtype)
        return omni

    @classmethod
    def _random(cls, preset: str, shrink: int, device: str, dtype: str, bounds: ReplyBounds,
                system_prompt: str | None) -> OmniModel:
        """A random-weight model of a real size, built on `device` (nodes/qwen3_omni/random_presets.py)."""
        from nodes.qwen3_omni import checkpoint
        from nodes.qwen3_omni.random_presets import build_random_model

        try:
            model = build_random_model(preset, shrink=shrink, device=device, dtype=DTYPES[dtype])
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        feature_extractor, image_processor = _processors(checkpoint._preprocessor_config())
        omni = cls(model, checkpoint._build_tokenizer(), feature_extractor, image_processor, path=f"random:{preset}",
                   bounds=bounds, system_prompt=system_prompt if system_prompt is not None else checkpoint.DEFAULT_SYSTEM_PROMPT)
        parameters = sum(p.numel() for p in model.parameters())
        log.info("built random-weight %s (shrink %d, %.2f B parameters) on %s (%s)", preset, shrink, parameters / 1e9, omni.device, dtype)
        return omni


def _processors(preprocessor: dict[str, Any]) -> tuple[Any, Any]:
    """The Whisper feature extractor and the image processor a checkpoint's preprocessor config names."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    feature_extractor = WhisperFeatureExtractor(
        feature_size=int(preprocessor.get("feature_size", 128)),
        sampling_rate=int(preprocessor.get("sampling_rate", 16000)),
        hop_length=int(preprocessor.get("hop_length", 160)),
        chunk_length=int(preprocessor.get("chunk_length", 30)),
        n_fft=int(preprocessor.get("n_fft", 400)),
        padding_value=float(preprocessor.get("padding_value", 0.0)),
        return_attention_mask=True,
    )
    image_kwargs = {k: preprocessor.get(k, v) for k, v in _IMAGE_DEFAULTS.items()}
    size = preprocessor.get("size") or {}
    if "min_pixels" not in preprocessor and size.get("shortest_edge"):
        image_kwargs["min_pixels"] = int(size["shortest_edge"])
    if "max_pixels" not in preprocessor and size.get("longest_edge"):
        image_kwargs["max_pixels"] = int(size["longest_edge"])
    return feature_extractor, Qwen2VLImageProcessorPil(**image_kwargs)


def _preprocessor_config(source: str, is_dir: bool) -> dict[str, Any]:
    if is_dir:
        file = Path(source) / "preprocessor_config.json"
        return json.loads(file.read_text()) if file.is_file() else {}
    from huggingface_hub import hf_hub_download

    try:
        return json.loads(Path(hf_hub_download(source, "preprocessor_config.json", local_files_only=True)).read_text())
    except Exception:  # noqa: BLE001 - defaults are Qwen3-Omni's own
        return {}


def _chat_tokens(config: Any, tokenizer: Any) -> ChatTokens:
    def token(text: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(text)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ModelLoadError(f"the tokenizer has no {text!r} token")
        return int(token_id)

    def optional(text: str) -> int | None:
        token_id = tokenizer.convert_tokens_to_ids(text)
        return None if token_id is None or token_id == tokenizer.unk_token_id else int(token_id)

    newline = tokenizer.encode("\n", add_special_tokens=False)
    if len(newline) != 1:
        raise ModelLoadError("the tokenizer does not encode a newline as one token")
    thinker = config.thinker_config
    im_end = int(config.im_end_token_id)
    eos = {im_end}
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end_of_text, int) and end_of_text != tokenizer.unk_token_id:
        eos.add(end_of_text)
    special = {int(i) for i, added in tokenizer.added_tokens_decoder.items() if added.special}
    vocab = thinker.text_config.vocab_size
    return ChatTokens(
        im_start=int(config.im_start_token_id),
        im_end=im_end,
        newline=newline[0],
        system=int(config.system_token_id),
        user=int(config.user_token_id),
        assistant=int(config.assistant_token_id),
        audio_start=int(thinker.audio_start_token_id),
        audio_end=token("<|audio_end|>"),
        audio_pad=int(thinker.audio_token_id),
        vision_start=int(thinker.vision_start_token_id),
        vision_end=token("<|vision_end|>"),
        image_pad=int(thinker.image_token_id),
        video_pad=int(thinker.video_token_id),
        tts_bos=int(config.tts_bos_token_id),
        tts_eos=int(config.tts_eos_token_id),
        tts_pad=int(config.tts_pad_token_id),
        eos=frozenset(eos),
        suppressed=frozenset(i for i in special - eos if i < vocab),
        tool_call=optional("<tool_call>"),
        tool_call_end=optional("</tool_call>"),
    )


@register_resource("qwen3_omni.model", params=OmniModelParams)
def load_omni_model(params: dict[str, Any]) -> OmniModel:
    """Resource factory. params: path (None -> the tiny checkpoint), device (cpu|cuda), dtype
    (float32|bfloat16|float16), system_prompt, the `ReplyBounds` fields, and random_weights
    (a preset of nodes/qwen3_omni/random_presets.py, built on the device instead of loading a
    path) with random_shrink, and kv_cache (auto | preallocate | grow: the thinker's and
    talker's slot caches allocated at start from the profile's limits, or growing on demand;
    auto: at start on CUDA; nodes/qwen3_omni/slot_cache.py)."""
    try:
        settings = decode(params, OmniModelParams, "qwen3_omni.model params")
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
    given_bounds = {name: getattr(settings, name) for name in ReplyBounds.__dataclass_fields__}
    bounds = ReplyBounds(**{name: value for name, value in given_bounds.items() if value is not None})
    kv_cache = settings.kv_cache or "auto"
    omni = OmniModel.load(
        settings.path,
        device=settings.device or "cpu",
        dtype=settings.dtype or "float32",
        bounds=bounds,
        system_prompt=settings.system_prompt,
        random_weights=settings.random_weights,
        random_shrink=settings.random_shrink or 1,
    )
    omni.kv_at_start = allocated_at_start(kv_cache, omni.device)
    return omni
