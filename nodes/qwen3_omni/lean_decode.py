"""Decode forwards (one new position on each of B slot-cache rows) without transformers' per-call machinery:
the thinker's (`LeanDecode`), the talker's (`LeanTalkerDecode`) and the code predictor's layers
(`LeanPredictor`).

On the small models this project runs on CPU a decode forward is almost all Python: the HF text
model goes through `merge_with_config_defaults`, `capture_outputs`, `deprecate_kwarg`,
`create_causal_mask`, the mrope rotary module, `Module.__call__` for every submodule and the
`grouped_mm` experts dispatcher, for a few microseconds of arithmetic each. `LeanDecode` does
what `Qwen3OmniMoeThinkerTextModel.forward` + `lm_head` do for that one case, on the modules'
own parameters (referenced, never copied; dtype and device are the model's):

    embeddings -> per layer: RMSNorm, q/k/v, q/k norms, rotary, write k/v into the rows
    (`SlotBatch.update`), SDPA over each row's valid columns (`SlotBatch.mask`), o_proj,
    residual, RMSNorm, MoE (router softmax/top-k, experts) or dense MLP, residual
    -> final norm -> lm_head

What differs from the HF forward, and why the logits stay the same:

- Rotary: for a decode token the three mrope rows (temporal, height, width) hold the same
  position, so the interleaved recomposition picks every frequency from equal rows: it is plain
  rope at the token's (rotary) position. cos/sin are computed once per forward for the B
  positions, exactly as the HF module computes them (`freqs.cos() * attention_scaling`), and
  shared by all layers. `rotate_half(x) * sin` is computed as `x.roll(half)` (the halves
  swapped) times sin with its first half negated: (-a) * b == a * (-b) exactly.
- q_norm and k_norm (same epsilon) and the rotary run once on the query and key heads side by
  side (`cat`): each head's numbers are computed as before, with half the dispatched ops.
- RMSNorm: the same ops in place where possible, epsilon and size as 0-dim tensors (a Python
  scalar costs a wrap and a copy per op); `mean` on CPU is `sum` then `div_`, as here.
- Attention: the SDPA call transformers makes for one query per row (grouped-query heads packed
  as `[B, kv_heads, groups, head_dim]`, the 4-D additive mask of the rows).
- Experts: with few experts (`DENSE_EXPERTS`; the tiny profiles have 4), either every expert
  runs on every token as one matmul each way, the unchosen ones weighted 0 (at most
  experts/top_k times the arithmetic of the chosen pairs; it reads every expert once), or, on
  CPU when that reads fewer bytes (large experts, a token or two), each chosen (token, expert)
  pair runs on its own expert's matrices. Both measured faster than `grouped_mm` on CPU (no
  sort, histogram or offsets; docs/notebook/2026-12-02-lean-talker-step.md). With many experts (the real checkpoint: 128) the module's own experts
  forward runs (whatever `config._experts_implementation` says).

The talker's decode step (`LeanTalkerDecode`, for `TalkerSlots.forward`) runs the same layer
loop on its input embeddings, with cos/sin from the talker's own rotary module once per forward
(its three mrope rows may differ) and its MoE blocks' shared expert added as the HF block adds
it (`sigmoid(gate(x)) * shared(x)`). The code predictor (`LeanPredictor`, for
code_predictor.py) takes the same norms, q/k norms, rotary and dense MLP as three `F.linear`s,
with the attention function transformers picks (its first forward has two positions, causal, no
mask) on keys/values it concatenates as a `DynamicCache` would; it has no experts, so its
frames are the HF predictor's to the bit. (Why: a talker step was per-call Python, not
arithmetic; the numbers: docs/notebook/2026-12-02-lean-talker-step.md.)

Up to the experts, the lean forward gives the HF forward's numbers bit for bit on CPU (checked
with the module's experts forward), in float32 and bfloat16; the every-expert matmuls have
another GEMM shape (weighted and summed in transformers' order): on the tiny checkpoint the
logits still came out equal to the bit but for ~1e-7 in one case, ~1e-6 on the 38 M-parameter
profile.
tests/model/test_lean_decode.py (and test_lean_talker.py for the talker and the code
predictor: bit for bit through the experts module, 1e-5 through the dense experts) holds the
logits and the written keys/values to the HF forward's (1e-5) on the tiny checkpoint, on a larger random profile, through each experts path
and on a config that takes the other branches, for one row and rows of different lengths.

`LeanDecode.usable()` says when this applies: the module classes it mirrors, eval mode, SDPA
attention, a rope without dynamic frequency updates, no hooks (on the model, per call; on its
submodules, when built; global module hooks, per call). Otherwise `ThinkerRunner` uses the HF
forward, as it does for every prefill chunk (`forward_rows`: deepstack, visual masks, hidden
states).

transformers coupling (pinned in pyproject): the bodies of the Qwen3-Omni thinker text model's
decoder layer, attention, RMSNorm, rotary embedding, router and experts, and the sdpa
attention function. Run tests/model/test_lean_decode.py after any transformers upgrade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qwen3_omni

from nodes.qwen3_omni.lean_layers import hooked, runs_as_built

if TYPE_CHECKING:
    from nodes.qwen3_omni.slot_cache import SlotBatch

# Up to this many experts, the MoE block runs every expert on every token, or on CPU, when it
# reads fewer bytes, each chosen (token, expert) pair on its own (see `_moe`).
DENSE_EXPERTS = 8
# What one (token, expert) pair's own ops cost on CPU, as bytes of weights read in that time
# (~10 dispatched ops of ~1.5 us at ~10 GB/s).
PAIR_COST_BYTES = 150_000

_NORMS = (qwen3_omni.Qwen3OmniMoeThinkerTextRMSNorm, qwen3_omni.Qwen3OmniMoeTextRMSNorm, qwen3_omni.Qwen3OmniMoeRMSNorm)
# MLPs whose forward is down(act(gate(x)) * up(x)), run here as three `F.linear`s.
_DENSE_MLPS = (qwen3_omni.Qwen3OmniMoeMLP, qwen3_omni.Qwen3OmniMoeThinkerTextMLP, qwen3_omni.Qwen3OmniMoeTalkerTextMLP)
_MOE_BLOCKS = (qwen3_omni.Qwen3OmniMoeThinkerTextSparseMoeBlock, qwen3_omni.Qwen3OmniMoeTalkerTextSparseMoeBlock)


class _Layer:
    """One decoder layer's parameters (the modules' own tensors), looked up once."""

    __slots__ = ("input_norm", "post_norm", "eps", "q", "k", "v", "o", "q_norm", "k_norm", "head_eps",
                 "heads", "kv_heads", "head_dim", "head_size", "scaling", "index", "mlp", "moe",
                 "router", "top_k", "norm_top_k", "experts", "dense_experts", "expert_bytes", "act", "shared",
                 "dense_mlp", "attention")

    def __init__(self, layer: Any):
        attn = layer.self_attn
        self.attention = attn
        self.index = attn.layer_idx
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight
        device = self.input_norm.device
        self.eps = torch.tensor(layer.input_layernorm.variance_epsilon, dtype=torch.float32, device=device)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.q, self.k, self.v, self.o = ((p.weight, p.bias) for p in projections)
        self.q_norm, self.k_norm = attn.q_norm.weight, attn.k_norm.weight
        self.head_eps = torch.tensor(attn.q_norm.variance_epsilon, dtype=torch.float32, device=device)
        self.head_size = torch.tensor(float(attn.head_dim), dtype=torch.float32, device=device)
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.scaling = attn.scaling
        self.mlp = layer.mlp
        self.dense_mlp = _dense_mlp(layer.mlp)
        self.moe = isinstance(layer.mlp, _MOE_BLOCKS)
        # The talker's MoE block also has a shared expert, gated per token (sigmoid).
        self.shared = None
        if isinstance(layer.mlp, qwen3_omni.Qwen3OmniMoeTalkerTextSparseMoeBlock):
            self.shared = (_dense_mlp(layer.mlp.shared_expert), layer.mlp.shared_expert_gate.weight)
        if self.moe:
            gate, experts = layer.mlp.gate, layer.mlp.experts
            self.router, self.top_k, self.norm_top_k = gate.weight, gate.top_k, gate.norm_topk_prob
            self.experts = experts
            self.dense_experts = experts.num_experts <= DENSE_EXPERTS and _plain_experts(experts)
            size = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
            self.expert_bytes = size * experts.down_proj.element_size()
            self.act = experts.act_fn.forward if isinstance(experts.act_fn, torch.nn.Module) else experts.act_fn


# Per model class mirrored here: its decoder layer, attention and MLP classes.
_MIRRORED = {
    qwen3_omni.Qwen3OmniMoeThinkerTextModel: (
        qwen3_omni.Qwen3OmniMoeThinkerTextDecoderLayer,
        qwen3_omni.Qwen3OmniMoeThinkerTextAttention,
        (qwen3_omni.Qwen3OmniMoeThinkerTextSparseMoeBlock, qwen3_omni.Qwen3OmniMoeThinkerTextMLP),
    ),
    qwen3_omni.Qwen3OmniMoeTalkerModel: (
        qwen3_omni.Qwen3OmniMoeTalkerDecoderLayer,
        qwen3_omni.Qwen3OmniMoeThinkerTextAttention,
        (qwen3_omni.Qwen3OmniMoeTalkerTextSparseMoeBlock, qwen3_omni.Qwen3OmniMoeTalkerTextMLP),
    ),
    qwen3_omni.Qwen3OmniMoeTalkerCodePredictorModel: (
        qwen3_omni.Qwen3OmniMoeTalkerCodePredictorDecoderLayer,
        qwen3_omni.Qwen3OmniMoeTalkerCodePredictorAttention,
        _DENSE_MLPS,
    ),
}


def unsupported(language_model: torch.nn.Module) -> str | None:
    """Why `LeanDecode` / `LeanTalkerDecode` / `LeanPredictor` cannot mirror this model (checked once), or None."""
    config = language_model.config
    mirrored = _MIRRORED.get(type(language_model))
    if mirrored is None:
        return f"text model class {type(language_model).__name__}"
    layer_class, attention_class, mlp_classes = mirrored
    # The thinker's and talker's layers here call SDPA themselves; the predictor's call the
    # attention function transformers picks.
    if config._attn_implementation != "sdpa" and attention_class is qwen3_omni.Qwen3OmniMoeThinkerTextAttention:
        return f"attention implementation {config._attn_implementation!r}"
    rope = language_model.rotary_emb
    if type(language_model) is qwen3_omni.Qwen3OmniMoeThinkerTextModel and (
            type(rope) is not qwen3_omni.Qwen3OmniMoeThinkerTextRotaryEmbedding or "dynamic" in rope.rope_type
            or rope.rope_type == "longrope"):
        return f"rope type {rope.rope_type!r}"
    for layer in language_model.layers:
        attn = layer.self_attn
        if type(layer) is not layer_class \
                or type(attn) is not attention_class or attn.sliding_window is not None:
            return f"decoder layer {type(layer).__name__}"
        if type(layer.mlp) not in mlp_classes:
            return f"mlp {type(layer.mlp).__name__}"
        norms = (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)
        if any(type(norm) not in _NORMS for norm in norms):
            return "norm class"
        epsilons = [norm.variance_epsilon for norm in norms]
        if epsilons[0] != epsilons[1] or epsilons[2] != epsilons[3]:
            return "different epsilons in one layer's norms"
    if type(language_model.norm) not in _NORMS:
        return "final norm class"
    with_hooks = [name for name, module in language_model.named_modules() if name and hooked(module)]
    if with_hooks:
        return f"hooks on {with_hooks[0]}"
    return None


class _LeanStack:
    """A decoder stack mirrored here: its layers' parameters and final norm, looked up once."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.why_not = unsupported(model)
        if self.why_not is not None:
            return
        self.layers = [_Layer(layer) for layer in model.layers[: model.config.num_hidden_layers]]
        self.norm, self.norm_eps, self.hidden_size = _norm_constants(model.norm)

    def usable(self) -> bool:
        """Whether the lean forward gives what the HF forward gives now (checked per call: cheap)."""
        return self.why_not is None and runs_as_built(self.model)


class LeanDecode(_LeanStack):
    """`thinker` text model + lm_head for one new token per row of a `SlotBatch` (see the module docstring)."""

    def __init__(self, thinker: torch.nn.Module):
        self.thinker = thinker
        self.embed = thinker.get_input_embeddings()
        self.lm_head = thinker.lm_head
        super().__init__(thinker.model.language_model)
        if self.why_not is None and (hooked(self.embed) or hooked(self.lm_head)):
            self.why_not = "hooks on the embeddings or lm_head"
        if self.why_not is not None:
            return
        self.rope = self.model.rotary_emb
        self.rope_scaling = self.rope.attention_scaling

    def usable(self) -> bool:
        """Whether `__call__` gives what the HF forward gives now (checked per call: cheap)."""
        return super().usable() and not hooked(self.thinker)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and "signed" sin `[B, 1, head_dim]` for rotary positions `[B]` (see the module docstring)."""
        # The positions are on the model's device (the runner's): no move of `inv_freq` (on CPU
        # a move that names the device reads as a host sync, benchmarks/dispatch_counts.py).
        freqs = positions[:, None].to(torch.float32) * self.rope.inv_freq.to(torch.float32)
        cos = freqs.cos() * self.rope_scaling
        sin = freqs.sin() * self.rope_scaling
        cos = torch.cat((cos, cos), dim=-1).to(dtype)
        sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, None], sin[:, None]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
        """Logits `[B, vocab]` of tokens `ids` `[B]` at rotary `positions` `[B]` on `batch`'s rows
        (one column each; `batch.query_length` == 1). Writes the rows' new keys/values; the
        caller commits the batch."""
        hidden = F.embedding(ids, self.embed.weight, self.embed.padding_idx)  # [B, D]
        cos, sin = self.rotary(positions, hidden.dtype)
        hidden = _decode_layers(self.layers, hidden, cos, sin, batch, self.hidden_size)
        hidden = _rms_norm(hidden, self.norm, self.norm_eps, self.hidden_size)
        return F.linear(hidden, self.lm_head.weight, self.lm_head.bias)


class LeanTalkerDecode(_LeanStack):
    """The talker's text model for one new position per row of a `SlotBatch`: the decode step of
    `TalkerSlots.forward`, through the same layers as `LeanDecode` (see the module docstring).

    cos/sin come from the talker's own rotary module, once per forward (its mrope rows may
    differ); the rest is `LeanDecode`'s layer loop, the talker's MoE blocks with their shared
    expert."""

    def __call__(self, embeds: torch.Tensor, positions: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
        """The talker's normed outputs `[B, D]` for inputs `embeds` `[B, D]` at `positions`
        `[4, B, 1]` (text row, then the 3 rope rows) on `batch`'s rows (one column each). Writes
        the rows' new keys/values; the caller commits the batch."""
        cos, sin = self.model.rotary_emb.forward(embeds, positions[1:])  # [B, 1, head_dim]
        hidden = _decode_layers(self.layers, embeds, cos, signed_sin(sin), batch, self.hidden_size)
        return _rms_norm(hidden, self.norm, self.norm_eps, self.hidden_size)


class LeanPredictor(_LeanStack):
    """The code predictor's decoder layers + final norm for one of a frame's forwards (see
    code_predictor.py): the same ops as `LeanDecode`'s layers (the same bits as the HF modules:
    norms, q/k norms side by side, rotary, dense MLP) with the attention function transformers
    picks, on keys/values kept in lists (a `DynamicCache`'s concatenation)."""

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, attention: Any,
                 keys: list[torch.Tensor], values: list[torch.Tensor], **attention_kwargs: Any) -> torch.Tensor:
        """Normed outputs `[B, q, D]` of inputs `hidden` `[B, q, D]`; `cos` / `signed_sin`
        `[1, q, 1, head_dim]`; each layer's keys/values are concatenated onto `keys[i]` / `values[i]`."""
        rows, length = hidden.shape[:2]
        for i, layer in enumerate(self.layers):
            x = _rms_norm(hidden, layer.input_norm, layer.eps, self.hidden_size)
            query = F.linear(x, *layer.q).view(rows, length, layer.heads, layer.head_dim)
            key = F.linear(x, *layer.k).view(rows, length, layer.kv_heads, layer.head_dim)
            value = F.linear(x, *layer.v).view(rows, length, layer.kv_heads, layer.head_dim).transpose(1, 2)
            heads = torch.cat((query, key), dim=2)  # [B, q, heads + kv_heads, head_dim]
            head_weights = torch.cat((layer.q_norm.expand(layer.heads, -1), layer.k_norm.expand(layer.kv_heads, -1)))
            heads = _rotate(_rms_norm(heads, head_weights, layer.head_eps, layer.head_size), cos, signed_sin)
            query, key = heads[:, :, : layer.heads].transpose(1, 2), heads[:, :, layer.heads :].transpose(1, 2)
            keys[i] = torch.cat([keys[i], key], dim=-2)
            values[i] = torch.cat([values[i], value], dim=-2)
            out, _ = attention(layer.attention, query, keys[i], values[i], None, dropout=0.0, scaling=layer.scaling,
                               sliding_window=None, **attention_kwargs)
            hidden = hidden + F.linear(out.reshape(rows, length, -1), *layer.o)
            x = _rms_norm(hidden, layer.post_norm, layer.eps, self.hidden_size)
            hidden = hidden + _mlp(layer.dense_mlp, x)
        return _rms_norm(hidden, self.norm, self.norm_eps, self.hidden_size)


def _decode_layers(layers: list[_Layer], hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   batch: SlotBatch, hidden_size: torch.Tensor) -> torch.Tensor:
    """The decoder layers for one new position per row: `hidden` `[B, D]`, `cos`/signed `sin`
    `[B, 1, head_dim]`; writes each layer's new keys/values into `batch`'s rows."""
    rows = hidden.shape[0]
    covering = batch.covering()  # rows close together but not one range: attend over their range
    mask = batch.mask if covering is None else covering[2]  # [B or range, 1, 1, kv]
    for layer in layers:
        x = _rms_norm(hidden, layer.input_norm, layer.eps, hidden_size)
        query = F.linear(x, *layer.q).view(rows, layer.heads, layer.head_dim)
        key = F.linear(x, *layer.k).view(rows, layer.kv_heads, layer.head_dim)
        value = F.linear(x, *layer.v).view(rows, layer.kv_heads, 1, layer.head_dim)
        # q_norm and k_norm (same epsilon) and the rotary, on the query and key heads at once.
        heads = torch.cat((query, key), dim=1)  # [B, heads + kv_heads, head_dim]
        head_weights = torch.cat((layer.q_norm.expand(layer.heads, -1), layer.k_norm.expand(layer.kv_heads, -1)))
        heads = _rotate(_rms_norm(heads, head_weights, layer.head_eps, layer.head_size), cos, sin)
        query, key = heads[:, : layer.heads], heads[:, layer.heads :]
        # One query per row: the query heads of a kv head side by side, as transformers packs them.
        query = query.view(rows, layer.kv_heads, layer.heads // layer.kv_heads, layer.head_dim)
        if covering is None:
            keys, values = batch.update(key[:, :, None], value, layer.index)
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=layer.scaling)
        else:
            span, places, _ = covering
            keys, values = batch.update_covering(key[:, :, None], value, layer.index, span)
            queries = query.new_zeros((keys.shape[0], *query.shape[1:])).index_copy_(0, places, query)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=layer.scaling)
            out = out.index_select(0, places)
        hidden = hidden + F.linear(out.reshape(rows, -1), *layer.o)
        x = _rms_norm(hidden, layer.post_norm, layer.eps, hidden_size)
        hidden = hidden + (_moe(layer, x) if layer.moe else _mlp(layer.dense_mlp, x))
    return hidden


def _norm_constants(norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An RMSNorm's weight, and its epsilon and size as the float32 0-dim tensors `_rms_norm` takes."""
    weight = norm.weight
    constant = {"dtype": torch.float32, "device": weight.device}
    return weight, torch.tensor(norm.variance_epsilon, **constant), torch.tensor(float(weight.shape[-1]), **constant)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm over the last dim (of `size` elements) in fewer dispatched ops; `eps`
    and `size` are float32 0-dim tensors (cheaper than Python scalars). On CPU the same bits:
    `mean` is `sum` then `div_` by the size there."""
    if x.dtype != torch.float32:
        wide = x.to(torch.float32)
        variance = (wide * wide).sum(dim=-1, keepdim=True).div_(size).add_(eps).rsqrt_()
        return weight * (wide * variance).to(x.dtype)
    variance = (x * x).sum(dim=-1, keepdim=True).div_(size).add_(eps).rsqrt_()
    return weight * (x * variance)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """A rotary sin with its first half negated: `rotate_half(x) * sin == x.roll(half) * signed_sin`
    exactly, which `_rotate` computes with one op fewer."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin` for `x` `[..., head_dim]` (`signed_sin`: see `signed_sin`)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _moe(layer: _Layer, x: torch.Tensor) -> torch.Tensor:
    """`Qwen3OmniMoeThinkerTextSparseMoeBlock.forward` (or the talker's, with its shared expert) for `x` `[T, D]`."""
    logits = F.linear(x, layer.router)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, layer.top_k, dim=-1)
    if layer.norm_top_k:
        weights /= weights.sum(dim=-1, keepdim=True)
    if weights.dtype != logits.dtype:
        weights = weights.to(logits.dtype)
    out = _experts(layer, x, logits, chosen, weights)
    if layer.shared is not None:  # the talker's block: experts + sigmoid(gate(x)) * shared expert(x)
        shared_mlp, shared_gate = layer.shared
        shared = _mlp(shared_mlp, x)
        out = out + torch.sigmoid(F.linear(x, shared_gate)) * shared
    return out


def _dense_mlp(mlp: Any) -> Any:
    """(gate, up, down weights, activation) of a `_DENSE_MLPS` module without biases, else the
    module (its own forward runs)."""
    projections = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if type(mlp) not in _DENSE_MLPS or any(p is None or p.bias is not None or hooked(p) for p in projections):
        return mlp
    act = mlp.act_fn.forward if isinstance(mlp.act_fn, torch.nn.Module) else mlp.act_fn
    return (*(p.weight for p in projections), act)


def _mlp(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(act(gate(x)) * up(x))`, as `_dense_mlp` left it."""
    if not isinstance(mlp, tuple):
        return mlp.forward(x)
    gate, up, down, act = mlp
    return F.linear(act(F.linear(x, gate)) * F.linear(x, up), down)


def _experts(layer: _Layer, x: torch.Tensor, logits: torch.Tensor, chosen: torch.Tensor,
             weights: torch.Tensor) -> torch.Tensor:
    experts = layer.experts
    if not layer.dense_experts:
        return experts.forward(x, chosen, weights)
    gate_up_proj, down_proj = experts.gate_up_proj, experts.down_proj
    tokens, count = x.shape[0], gate_up_proj.shape[0]
    pairs = chosen.numel()
    if x.device.type == "cpu" and pairs * (layer.expert_bytes + PAIR_COST_BYTES) < count * layer.expert_bytes:
        # Each chosen pair on its own: reads only the chosen experts' weights (large experts, few tokens).
        rows = []
        for token, (picked, picked_weights) in enumerate(zip(chosen.tolist(), weights)):
            row = None
            for expert, weight in zip(picked, picked_weights):
                gate_part, up = F.linear(x[token], gate_up_proj[expert]).chunk(2, dim=-1)
                out = F.linear(layer.act(gate_part) * up, down_proj[expert]) * weight
                row = out if row is None else row + out
            rows.append(row)
        return torch.stack(rows)
    # Every expert on every token (one matmul each way), the unchosen ones weighted 0.
    gate_up = F.linear(x, gate_up_proj.view(-1, x.shape[1])).view(tokens, count, -1)  # [T, E, 2I]
    gate_part, up = gate_up.chunk(2, dim=-1)
    dense_weights = torch.zeros_like(logits).scatter_(1, chosen, weights)  # [T, E]
    hidden = layer.act(gate_part) * up  # [T, E, I]
    out = torch.bmm(hidden.transpose(0, 1), down_proj.transpose(1, 2))  # [E, T, D]
    return (out * dense_weights.t()[:, :, None]).sum(dim=0)  # weighted as transformers does, then summed


def _plain_experts(experts: Any) -> bool:
    """The layout `_moe`'s dense path assumes (transformers' defaults for this model)."""
    return (
        experts.gate_up_proj.is_contiguous() and experts.down_proj.is_contiguous()
        and getattr(experts, "has_gate", False) and not getattr(experts, "has_bias", True)
        and not getattr(experts, "is_transposed", True) and getattr(experts, "is_concatenated", False)
        and not getattr(experts, "has_post_expert_norm", True) and not getattr(experts, "_is_expert_parallel", True)
    )
