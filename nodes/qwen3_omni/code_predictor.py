"""The code predictor's pass for one frame of many replies: `num_code_groups - 1` residual codes each.

The predictor starts afresh every frame: position 0 is the talker's last hidden state, position 1
the embedding of the talker's code, then one position per residual code. Every reply of a step
has the same length, so the batch needs no mask and no padding, and the rotary cos/sin of each
forward are the same every frame (computed once, by the predictor's own rotary module).

`predict_residuals` runs what `generate()` runs (`code_predictor(inputs_embeds=[hidden, code])`
then one `code_predictor(input_ids=code, generation_steps=g)` per group, on a fresh
`DynamicCache`), through `lean_decode.LeanPredictor` where that applies (bit for bit the same
numbers, a fraction of the Python); otherwise (hooks, training, an unmirrored layer, a mask the
attention needs) through the HF module exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from nodes.qwen3_omni.lean_decode import LeanPredictor, signed_sin
from nodes.qwen3_omni.lean_layers import LeanStack

# chooser(group, logits [B, V] float32) -> codes [B] (long): greedy or sampled, per reply.
Chooser = Callable[[int, torch.Tensor], torch.Tensor]


class CodePredictor:
    """One talker's code predictor (shared by every reply on that talker)."""

    def __init__(self, talker: Any, num_code_groups: int):
        self.predictor = talker.code_predictor
        self.codec_embedding = talker.get_input_embeddings()
        self.num_code_groups = num_code_groups
        self.stack = LeanStack(self.predictor.model)
        self.lean = LeanPredictor(self.predictor.model)
        # Per attention implementation: whether the HF predictor passes its layers no mask.
        self._mask_free: dict[str, bool] = {}
        self._rope: dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, ...]]] = {}
        self.lean_calls = 0  # how many frames took the lean path (tests read it)
        weight = self.predictor.lm_head[0].weight
        with torch.inference_mode():  # probe now, before replies run on other threads
            self._use_lean(torch.zeros((1, 2, weight.shape[1]), dtype=weight.dtype, device=weight.device))

    @torch.inference_mode()
    def predict(
        self, last_hidden: torch.Tensor, first_codes: torch.Tensor, choose: Chooser
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual codes of each reply's frame.

        `last_hidden` [B, 1, D]: the talker's output at each reply's last position; `first_codes`
        [B]: the talker's codes. Returns the frames [B, num_code_groups] (on the model's device)
        and the sum of each frame's code embeddings [B, 1, D] (the reply's next talker input,
        summed in the order `generate()` sums them).
        """
        first_embed = self.codec_embedding(first_codes.view(-1, 1))  # [B, 1, D]
        inputs = torch.cat((last_hidden, first_embed), dim=1)
        if self._use_lean(inputs):
            self.lean_calls += 1
            codes, embeds = self._lean_pass(inputs, choose)
        else:
            codes, embeds = self._hf_pass(inputs, choose)
        next_embeds = torch.cat([first_embed, *embeds], dim=1).sum(1, keepdim=True)
        return torch.stack([first_codes.view(-1), *codes], dim=1), next_embeds

    # ------------------------------------------------------------------ the two paths

    def _hf_pass(self, inputs: torch.Tensor, choose: Chooser) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        predictor = self.predictor
        cache = DynamicCache(config=predictor.config)
        out = predictor(inputs_embeds=inputs, cache=cache, use_cache=True)
        codes, embeds = [], []
        for group in range(1, self.num_code_groups):
            code = choose(group, out.logits[:, -1, :].to(copy=True, dtype=torch.float32)).view(-1, 1)
            codes.append(code.view(-1))
            embeds.append(predictor.get_input_embeddings()[group - 1](code))
            if group < self.num_code_groups - 1:
                out = predictor(input_ids=code, cache=cache, use_cache=True, generation_steps=group)
        return codes, embeds

    def _lean_pass(self, inputs: torch.Tensor, choose: Chooser) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        predictor, lean = self.predictor, self.lean
        attention = self.stack.attention()
        ropes = self._ropes(inputs)
        empty = inputs.new_empty(0)
        keys: list[torch.Tensor] = [empty] * len(lean.layers)
        values: list[torch.Tensor] = [empty] * len(lean.layers)
        hidden = inputs
        codes, embeds = [], []
        for group in range(1, self.num_code_groups):
            positions, cos, sin = ropes[group - 1]
            hidden = lean(hidden, cos, sin, attention, keys, values, position_ids=positions, use_cache=True)
            head = predictor.lm_head[group - 1]
            logits = F.linear(hidden, head.weight, head.bias)[:, -1, :]
            code = choose(group, logits.to(copy=True, dtype=torch.float32)).view(-1, 1)
            codes.append(code.view(-1))
            embedding = predictor.model.codec_embedding[group - 1]
            hidden = F.embedding(code, embedding.weight, embedding.padding_idx)
            embeds.append(hidden)
        return codes, embeds

    # ------------------------------------------------------------------ checks and tables

    def _use_lean(self, inputs: torch.Tensor) -> bool:
        if not (self.stack.usable() and self.lean.usable()):
            return False
        implementation = self.predictor.model.config._attn_implementation
        mask_free = self._mask_free.get(implementation)
        if mask_free is None:
            mask_free = self._mask_free[implementation] = self._masks_are_none(inputs)
        return mask_free

    def _masks_are_none(self, inputs: torch.Tensor) -> bool:
        """Whether the HF predictor hands its layers no attention mask (the causal case the
        attention function handles itself: sdpa, flash). The lean pass passes none; with an
        attention that needs one (eager), the HF path is kept."""
        masks: list[Any] = []
        layer = self.stack.layers[0]
        handle = layer.register_forward_pre_hook(
            lambda _m, _a, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
        )
        try:
            self._hf_pass(inputs[:1], lambda _g, logits: logits.argmax(-1))
        finally:
            handle.remove()
        return all(mask is None for mask in masks)

    def _ropes(self, inputs: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(position_ids, cos, signed sin) of each forward of a frame: positions [0, 1], then [2],
        [3], ... made by the predictor's rotary module exactly as its forward makes them."""
        key = (inputs.dtype, inputs.device)
        ropes = self._rope.get(key)
        if ropes is None:
            rotary = self.predictor.model.rotary_emb
            ropes = []
            for group in range(1, self.num_code_groups):
                # The HF forward's own: arange(new positions) + the cache's length.
                if group == 1:
                    positions = torch.arange(2, device=inputs.device).unsqueeze(0)
                else:
                    positions = (torch.arange(1, device=inputs.device) + group).unsqueeze(0)
                probe = inputs[:1, : positions.shape[1]]
                cos, sin = rotary(probe, positions)  # [1, q, head_dim]
                ropes.append((positions, cos[:, :, None], signed_sin(sin)[:, :, None]))  # as the lean layers take them
            self._rope[key] = ropes
        return ropes
