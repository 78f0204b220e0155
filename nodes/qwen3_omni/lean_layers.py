"""The talker's and the code predictor's decoder layers, run without transformers' per-call wrappers.

On a small model the compute of one talker step is tiny and Python dominates: every HF
forward goes through `Module.__call__`, `deprecate_kwarg`, `merge_with_config_defaults`,
`capture_outputs`, `create_causal_mask` and cache bookkeeping, layer after layer. `run_layer`
does what `Qwen3OmniMoeTalkerDecoderLayer.forward` / `...CodePredictorDecoderLayer.forward`
(and their attention's `forward`) do, op for op and on the same shapes, so the result is the
same to the last bit; it calls each submodule's own `forward` (norms, projections, the MLP or
MoE block keep their own code and weights: no copies) and the attention function transformers
would pick (`config._attn_implementation`).

It is used only where that holds (`LeanStack.usable`): the layer classes it mirrors, eval mode,
no sliding-window attention, no hooks. A hook on the stack's model (checked at every call; e.g.
a test recording the talker's inputs) or a global module hook sends the call back through the
HF module, so hooks see what they hook; hooks on the layers' submodules are checked once, when
the stack is built (the model's owners register none).

transformers coupling (pinned in pyproject): the two layer classes' `forward` bodies.
tests/model/test_lean_talker.py (lean == HF modules, bit for bit) and
test_generate_equivalence.py guard it: run them after any transformers upgrade.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as torch_module
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qwen3_omni

# (layer class, attention class) pairs whose forward `run_layer` reproduces.
_MIRRORED = {
    qwen3_omni.Qwen3OmniMoeTalkerDecoderLayer: qwen3_omni.Qwen3OmniMoeThinkerTextAttention,
    qwen3_omni.Qwen3OmniMoeTalkerCodePredictorDecoderLayer: qwen3_omni.Qwen3OmniMoeTalkerCodePredictorAttention,
}

KVUpdate = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def hooked(module: torch.nn.Module) -> bool:
    """Forward hooks, accelerate's (device placement / offload wraps `forward`), or a `forward`
    replaced on the instance: a lean path would skip what they do. Not counted: the output
    capturing hooks transformers installs on the layers at a model's first HF forward, which do
    nothing unless that forward collects hidden states (a lean stack built after one, e.g. a
    runner made after a prefill, would refuse the layers otherwise)."""
    forward_hooks = [hook for hook in module._forward_hooks.values() if not _output_capturing(hook)]
    return bool(
        forward_hooks or module._forward_pre_hooks or module._forward_hooks_with_kwargs
        or module._forward_pre_hooks_with_kwargs or module.__dict__.get("_hf_hook") is not None
        or "forward" in module.__dict__
    )


def _output_capturing(hook: Any) -> bool:
    """transformers' `install_output_capuring_hook` hook (utils/output_capturing.py)."""
    return getattr(hook, "__module__", None) == "transformers.utils.output_capturing" \
        and getattr(hook, "__name__", None) == "output_capturing_hook"


def global_hooks() -> bool:
    """Forward hooks registered for every module."""
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


def runs_as_built(model: torch.nn.Module) -> bool:
    """Eval mode, no hook on `model` itself, no global module hook: what a lean path checks per
    call (hooks on the submodules are checked once, when it is built)."""
    return not model.training and not hooked(model) and not global_hooks()


class LeanStack:
    """A model's decoder layers + final norm, with the check that the lean path applies."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers = list(model.layers[: model.config.num_hidden_layers])
        self.norm = model.norm
        self._supported = all(
            _MIRRORED.get(type(layer)) is type(layer.self_attn) and layer.self_attn.sliding_window is None
            for layer in self.layers
        ) and not any(hooked(m) for m in model.modules())

    def usable(self) -> bool:
        """Whether `run_layer` gives what the HF forward gives now (checked per call: cheap)."""
        return self._supported and runs_as_built(self.model)

    def attention(self) -> Callable[..., Any]:
        return ALL_ATTENTION_FUNCTIONS.get_interface(
            self.model.config._attn_implementation, qwen3_omni.eager_attention_forward
        )


def run_layer(
    layer: Any,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    update: KVUpdate,
    attention: Callable[..., Any],
    **attention_kwargs: Any,
) -> torch.Tensor:
    """One decoder layer (pre-norm attention with q/k norms and rotary, then the MLP / MoE block).

    `update(keys, values, layer_idx)` stores the new keys/values and returns all of the layer's
    (the cache's role); `attention_kwargs` are what the HF layer passes on to the attention
    function (position_ids, use_cache).
    """
    residual = hidden
    hidden = layer.input_layernorm.forward(hidden)
    attn = layer.self_attn
    input_shape = hidden.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    query = attn.q_norm.forward(attn.q_proj.forward(hidden).view(hidden_shape)).transpose(1, 2)
    key = attn.k_norm.forward(attn.k_proj.forward(hidden).view(hidden_shape)).transpose(1, 2)
    value = attn.v_proj.forward(hidden).view(hidden_shape).transpose(1, 2)
    query, key = qwen3_omni.apply_rotary_pos_emb(query, key, cos, sin)
    key, value = update(key, value, attn.layer_idx)
    out, _ = attention(
        attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling, sliding_window=attn.sliding_window,
        **attention_kwargs,
    )
    out = attn.o_proj.forward(out.reshape(*input_shape, -1).contiguous())
    hidden = residual + out
    residual = hidden
    hidden = layer.mlp.forward(layer.post_attention_layernorm.forward(hidden))
    return residual + hidden
