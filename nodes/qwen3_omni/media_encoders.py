"""Audio and image encoders of the thinker, batched across sessions (pure compute, no graph).

    encoded = encode_turns(omni, [turn_tensors, ...])   # one forward per modality for the batch

Input per turn: the `TurnInputs.tensors()` dict (input_ids, audio_features, audio_feature_lengths,
pixel_values, image_grid_thw). Output per turn: the same dict plus
    audio_embeds     [audio tokens, thinker hidden]    (in placeholder order)
    image_embeds     [image tokens, thinker hidden]
    image_deepstack  list of [image tokens, thinker hidden], one per deepstack layer
which is what `ThinkerSession.prefill` consumes (`Embeddings.tensors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nodes.qwen3_omni.inputs import audio_token_count

if TYPE_CHECKING:
    from nodes.qwen3_omni.model import OmniModel


@torch.inference_mode()
def encode_turns(omni: OmniModel, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(t) for t in turns]
    _encode_audio(omni, out)
    _encode_images(omni, out)
    return out


def _encode_audio(omni: OmniModel, turns: list[dict[str, Any]]) -> None:
    clips: list[torch.Tensor] = []
    owners: list[int] = []
    for index, turn in enumerate(turns):
        for features in turn.get("audio_features") or ():
            clips.append(features)
            owners.append(index)
    if not clips:
        return
    tower = omni.thinker.model.audio_tower
    n_window = omni.config.thinker_config.audio_config.n_window
    lengths = torch.tensor([c.shape[-1] for c in clips], dtype=torch.long)
    # The tower takes every clip's frames side by side on the time axis, with their lengths.
    features = torch.cat(clips, dim=-1).to(omni.device, tower.dtype)
    embeds = tower(features, feature_lens=lengths.to(omni.device)).last_hidden_state
    counts = [audio_token_count(int(n), n_window) for n in lengths]
    per_clip = torch.split(embeds, counts)
    collected: dict[int, list[torch.Tensor]] = {}
    for owner, clip in zip(owners, per_clip):
        collected.setdefault(owner, []).append(clip)
    for owner, parts in collected.items():
        turns[owner]["audio_embeds"] = torch.cat(parts)


def _encode_images(omni: OmniModel, turns: list[dict[str, Any]]) -> None:
    owners = [i for i, t in enumerate(turns) if t.get("pixel_values") is not None]
    if not owners:
        return
    visual = omni.thinker.model.visual
    pixels = torch.cat([turns[i]["pixel_values"] for i in owners]).to(omni.device, visual.dtype)
    grids = torch.cat([turns[i]["image_grid_thw"] for i in owners]).to(omni.device)
    result = visual(pixels, grid_thw=grids)
    merge = visual.spatial_merge_size**2
    per_turn = [int(turns[i]["image_grid_thw"].prod(-1).sum()) // merge for i in owners]
    embeds = torch.split(result.pooler_output, per_turn)
    deepstack = [torch.split(level, per_turn) for level in result.deepstack_features]
    for k, owner in enumerate(owners):
        turns[owner]["image_embeds"] = embeds[k]
        turns[owner]["image_deepstack"] = [level[k] for level in deepstack]
