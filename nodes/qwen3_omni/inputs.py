"""One turn's model inputs, built the way `Qwen3OmniMoeProcessor` would, without it.

    turn = build_turn_inputs(omni, role="user", text="hi", audio=samples_16k, images=[jpeg_bytes],
                             system_prompt="You are...", add_generation_prompt=True)

The token ids cover this turn only, in Qwen3-Omni's chat format:

    [<|im_start|>system\\n{system_prompt}<|im_end|>\\n]            only when system_prompt is given
    <|im_start|>{role}\\n
      (<|vision_start|><|image_pad|> x n_i<|vision_end|>)*         one block per image
      [<|audio_start|><|audio_pad|> x n_a<|audio_end|>]             the utterance's audio
      {text}<|im_end|>\\n
    [<|im_start|>assistant\\n]                                      when a reply is wanted

A turn with no content and `add_generation_prompt` is only the assistant header (response.create).
Placeholder counts are the ones the model checks: n_a = the audio encoder's output length for the
mel frames (`_get_feat_extract_output_lengths`, ~13 tokens per second), n_i = patches / merge².
User text is tokenized with special tokens split, so text can never inject a control token.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from nodes.qwen3_omni.model import OmniModel


@dataclass
class TurnInputs:
    """Everything the encoders and the thinker need for one turn."""

    input_ids: list[int]
    # [num_mel_bins, frames] float32, and the frame count, per audio clip (0 or 1 per turn).
    audio_features: list[torch.Tensor] = field(default_factory=list)
    audio_feature_lengths: list[int] = field(default_factory=list)
    # [patches, channels * temporal_patch * patch²] for all images of the turn, and [n_images, 3].
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0

    def tensors(self) -> dict[str, Any]:
        """The `Features.tensors` form of these inputs."""
        tensors: dict[str, Any] = {"input_ids": torch.tensor(self.input_ids, dtype=torch.long)}
        if self.audio_features:
            tensors["audio_features"] = self.audio_features
            tensors["audio_feature_lengths"] = torch.tensor(self.audio_feature_lengths, dtype=torch.long)
        if self.pixel_values is not None:
            tensors["pixel_values"] = self.pixel_values
            tensors["image_grid_thw"] = self.image_grid_thw
        return tensors


def audio_token_count(mel_frames: int, n_window: int = 50) -> int:
    """Audio placeholder tokens for `mel_frames` (what the audio encoder outputs; 100 frames/s)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    return int(_get_feat_extract_output_lengths(torch.tensor(mel_frames), n_window))


def audio_features(omni: OmniModel, samples: np.ndarray) -> tuple[torch.Tensor, int]:
    """16 kHz float32 mono -> ([mel_bins, frames] log-mel features, frames)."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    out = omni.feature_extractor(
        samples,
        sampling_rate=omni.feature_extractor.sampling_rate,
        return_attention_mask=True,
        padding="longest",
        truncation=False,
        return_tensors="pt",
    )
    frames = int(out["attention_mask"][0].sum())
    return out["input_features"][0, :, :frames].to(torch.float32), frames


def image_patches(
    omni: OmniModel, images: list[bytes | Any], max_pixels: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded images (JPEG/PNG bytes or PIL images) -> (pixel_values, image_grid_thw).

    `max_pixels` lowers the checkpoint's resize bound (each 32x32 pixels cost one thinker token).
    """
    from PIL import Image

    decoded = []
    for image in images:
        if isinstance(image, (bytes, bytearray, memoryview)):
            image = Image.open(io.BytesIO(bytes(image)))
        decoded.append(image.convert("RGB"))
    processor = omni.image_processor
    size = None
    bounds = processor.size  # shortest_edge / longest_edge are pixel counts for this processor
    if max_pixels is not None and max_pixels < bounds.longest_edge:
        size = {"shortest_edge": min(bounds.shortest_edge, max_pixels), "longest_edge": max_pixels}
    out = processor(images=decoded, return_tensors="pt", **({"size": size} if size else {}))
    return out["pixel_values"].to(torch.float32), out["image_grid_thw"].to(torch.long)


def system_with_tools(system: str, tools: Sequence[dict[str, Any]]) -> str:
    """The system message with function tools, as Qwen3's chat template writes it."""
    if not tools:
        return system
    lines = [json.dumps({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}, ensure_ascii=False)
             for tool in tools]
    head = f"{system}\n\n" if system else ""
    return (
        f"{head}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + "\n".join(lines)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    )


def tool_call_text(name: str, arguments: str) -> str:
    """A function call in the assistant's message (Qwen3's format); `arguments` is JSON text."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


def tool_response_text(output: str) -> str:
    """A function's output, as the user message Qwen3's chat template makes of a `tool` message."""
    return f"<tool_response>\n{output}\n</tool_response>"


def build_turn_inputs(
    omni: OmniModel,
    *,
    role: str = "user",
    text: str | None = None,
    audio: np.ndarray | None = None,
    images: list[bytes] | None = None,
    system_prompt: str | None = None,
    add_generation_prompt: bool = False,
    max_image_pixels: int | None = None,
) -> TurnInputs:
    tok = omni.tokens
    ids: list[int] = []

    def encode(piece: str) -> list[int]:
        return omni.tokenizer(piece, add_special_tokens=False, split_special_tokens=True).input_ids

    if system_prompt:
        ids += [tok.im_start, tok.system, tok.newline, *encode(system_prompt), *tok.closing]

    turn = TurnInputs(input_ids=ids)
    has_content = bool(text) or (audio is not None and len(audio) >= omni.feature_extractor.hop_length) or bool(images)
    if has_content:
        role_id = {"user": tok.user, "assistant": tok.assistant, "system": tok.system}.get(role)
        if role_id is None:
            raise ValueError(f"unknown role {role!r}")
        ids += [tok.im_start, role_id, tok.newline]
        if images:
            turn.pixel_values, turn.image_grid_thw = image_patches(omni, images, max_image_pixels)
            merge = int(omni.image_processor.merge_size) ** 2
            for grid in turn.image_grid_thw.tolist():
                count = int(np.prod(grid)) // merge
                ids += [tok.vision_start, *([tok.image_pad] * count), tok.vision_end]
                turn.image_tokens += count
        features, frames = audio_features(omni, audio) if audio is not None and len(audio) else (None, 0)
        if frames > 0:  # less than one 10 ms hop is no audio
            count = audio_token_count(frames, omni.config.thinker_config.audio_config.n_window)
            turn.audio_features.append(features)
            turn.audio_feature_lengths.append(frames)
            ids += [tok.audio_start, *([tok.audio_pad] * count), tok.audio_end]
            turn.audio_tokens += count
        if text:
            ids += encode(text)
        ids += tok.closing
    if add_generation_prompt:
        ids += tok.assistant_header
    turn.text_tokens = len(ids) - turn.audio_tokens - turn.image_tokens
    return turn
