"""Streaming code2wav: codec frames in, 24 kHz PCM out, chunk by chunk, equal to a one-shot decode.

Qwen3-Omni's code2wav is a causal transformer over codec frames (sliding-window attention)
followed by a causal convolutional upsampler that turns each frame into `total_upsample` (1920)
samples. Streaming it exactly takes two kinds of state, both kept per reply by `Code2WavStream`:

* The transformer runs incrementally with its own KV cache: each frame goes through it once, as in
  one shot. (Re-running it over a window of recent frames is only approximately right: its
  receptive field grows with depth and the sliding window.)
* Every causal convolution keeps its last `kernel-1` input samples (its left context, zeros at the
  start, as the one-shot left padding), and every upsampling transposed convolution (kernel 2r,
  stride r, trimmed r on both sides) keeps its last input frame. So each decode computes only the
  new samples. The transposed convolutions make each output sample depend on its own input frame
  and the NEXT one; that is why a decode of F frames yields F*1920 - 555 samples (stock rates):
  the last 555 samples of frame F-1 are held back, in the layers' state, until frame F arrives. A
  one-shot decode of all frames yields the same total, so the stream ends without a flush.

The chunks a stream emits, concatenated, equal `code2wav(all_frames)` (exactly in float64, to
float32 rounding otherwise; tests/model/test_code2wav_stream.py, test_code2wav_streaming_steps.py).

Neither part goes through the HF modules' forwards; on a small model Python and op overhead, not
arithmetic, dominate a decode (the tiny checkpoint: ~450 tiny ops per decode). The model itself
is not touched: one-shot decode and `generate()` run as before.

* `_Transformer`: the new frames of all streams due in one `push_many` go through the
  transformer as one packed sequence, each frame attending to its own stream's keys within the
  sliding window (a block mask), each stream with its own KV cache. The layers' submodules
  (projections, norms, MLPs, RoPE) keep their code and weights; mask and cache objects are ours.
* `_streaming_steps`: the conv stack as explicit steps over the model's weights: per causal
  conv, concat the carried context and the input, convolve, keep the new tail (no padding, no
  trimming). SnakeBeta's exp(alpha) and 1/(exp(beta)+eps) are computed once, not per call. Convs
  with few input channels (2-32 on the tiny model, where oneDNN pays a large fixed cost) run as
  one 2-D matmul over a strided im2col view of the whole batch, depthwise ones as a multiply-sum
  over the taps, transposed ones as one matmul whose r-sample outputs are laid out in time; wide
  ones (the stock model's first layers) keep conv1d / conv_transpose1d.
  The steps snapshot the weights when the `Code2WavDecoder` is made (inference only; move or
  convert the model before that).

transformers coupling (pinned in pyproject): both mirror the forward bodies of the code2wav
modules (`Qwen3OmniMoeCode2Wav` and its transformer, conv, ConvNeXt, residual and SnakeBeta
modules). The tests compare streamed audio against the model's own one-shot decode: run
tests/model/test_code2wav_stream*.py after any transformers upgrade.

Chunk schedule: the first decode runs as soon as `first_chunk_frames` (default 1 frame = 57 ms of
audio) are in, for a low time-to-first-audio; the second is the same size again, so it can come
before the first has played (57 ms: on a loaded server, two frames often took longer: the
realtime bench at 16 sessions had a dry player after the first chunk in 24-29 of 32 turns, 11-21
with this schedule); then each chunk doubles, up to `chunk_frames` (default 6): 1, 1, 2, 4, 6,
6, ... frames. The total compute does not depend on the chunking, but
every decode pays a fixed per-call cost (one kernel launch per layer on a GPU); the ramp keeps the
audio that is already out ahead of the next chunk while the chunks grow.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
    apply_rotary_pos_emb,
)

SAMPLE_RATE = 24000

# Convolutions with at most this many inputs per output sample (in_channels * kernel, or
# in_channels * kernel / stride for a transposed one) run as matmuls over strided views instead of
# oneDNN's conv1d / conv_transpose1d, which pay a large fixed cost on few channels (2-32 on the tiny
# model: 2-4x faster measured on CPU, more at batch > 1). Wide convolutions (the stock model's)
# keep the torch kernels.
_MATMUL_CONV_MAX_INPUTS = 256


def _bias_column(bias: torch.Tensor | None, channels: int, like: torch.Tensor) -> torch.Tensor:
    return (like.new_zeros(channels) if bias is None else bias).view(-1, 1)


class _Snake:
    """SnakeBeta with exp(alpha) and 1/(exp(beta)+eps) computed once (inference: they are fixed).

    The same ops on the same values as the module, so the same result to the last bit."""

    __slots__ = ("alpha", "inverse_beta")

    def __init__(self, module: Qwen3OmniMoeSnakeBeta):
        self.alpha = torch.exp(module.alpha.detach()).view(-1, 1)
        self.inverse_beta = (1.0 / (torch.exp(module.beta.detach()) + module.no_div_by_zero)).view(-1, 1)

    def __call__(self, x: torch.Tensor, state: list[Any] | None = None) -> torch.Tensor:
        """`state`: unused (a step of the conv stack too: it carries nothing)."""
        sine = torch.mul(x, self.alpha).sin_()
        return sine.mul_(sine).mul_(self.inverse_beta).add_(x)  # x*x is how pow(x, 2) squares: same bits


class _CausalConv:
    """A stride-1 causal convolution that carries its last `kernel-1` inputs in `state[slot]`.

    Narrow ones run on a strided (im2col) view of the input: one matmul for a dense conv, a
    multiply-and-sum over the kernel taps for a depthwise one."""

    __slots__ = ("weight", "bias", "matrix", "taps", "bias_column", "dilation", "groups", "kernel", "context", "slot")

    def __init__(self, module: Qwen3OmniMoeCausalConvNet, slot: int):
        if module.stride != 1:
            raise ValueError("streaming code2wav expects stride-1 causal convolutions")
        conv = module.conv
        self.weight = conv.weight.detach()
        self.bias = None if conv.bias is None else conv.bias.detach()
        self.dilation = module.dilation
        self.groups = conv.groups
        self.kernel = conv.kernel_size[0]
        self.context = module.kernel_size - 1
        self.slot = slot if self.context else -1
        out_channels, in_channels, kernel = self.weight.shape
        self.matrix = self.taps = None
        self.bias_column = _bias_column(self.bias, out_channels, self.weight)
        if self.groups == 1 and in_channels * kernel <= _MATMUL_CONV_MAX_INPUTS:
            self.matrix = self.weight.reshape(out_channels, in_channels * kernel)
        elif self.groups == out_channels and in_channels == 1:  # depthwise
            self.taps = self.weight.view(1, out_channels, 1, kernel)

    def initial_context(self) -> torch.Tensor:
        """The one-shot left padding: zeros."""
        return self.weight.new_zeros((1, self.weight.shape[1] * self.groups, self.context))

    def __call__(self, x: torch.Tensor, state: list[Any]) -> torch.Tensor:
        if self.context:
            x = torch.cat((state[self.slot], x), dim=-1)
            # A copy, not a view: a view would keep this call's whole input buffer alive with the
            # stream (tens of MB per stream on the stock model's wide convs).
            state[self.slot] = x[..., x.shape[-1] - self.context :].clone()
        if self.matrix is None and self.taps is None:
            return F.conv1d(x, self.weight, self.bias, dilation=self.dilation, groups=self.groups)
        batch, channels, length = x.shape
        if self.taps is not None:  # depthwise: [B, C, outputs, kernel] windows times the taps, summed
            if self.kernel == 1:
                return torch.mul(x, self.taps[..., 0]).add_(self.bias_column)
            stride_b, stride_c, stride_t = x.stride()
            windows = x.as_strided(
                (batch, channels, length - self.context, self.kernel),
                (stride_b, stride_c, stride_t, self.dilation * stride_t),
            )
            return torch.mul(windows, self.taps).sum(-1).add_(self.bias_column)
        # One 2-D matmul over the batch: columns [C*kernel, B*outputs] (im2col: input t + j*dilation
        # for output t, tap j), output [out, B*outputs], returned as a [B, out, outputs] view.
        if self.kernel > 1:
            outputs = length - self.context
            stride_b, stride_c, stride_t = x.stride()
            columns = x.as_strided(
                (channels, self.kernel, batch, outputs), (stride_c, self.dilation * stride_t, stride_b, stride_t)
            ).reshape(channels * self.kernel, batch * outputs)
        else:
            outputs = length
            columns = x.transpose(0, 1).reshape(channels, batch * outputs)  # a view when x came from here
        y = torch.mm(self.matrix, columns).add_(self.bias_column)
        return y.view(-1, batch, outputs).transpose(0, 1)


class _TransposedConv:
    """An upsampling transposed convolution (kernel 2r, stride r, trimmed r on both sides) that
    carries its last input frame in `state[slot]`, or (kernel r, untrimmed) nothing.

    Output samples t*r .. t*r+r-1 (after the trim) are W[:, :, r:] applied to input frame t (frame
    0: the carried one) plus W[:, :, :r] applied to frame t+1: for narrow ones, one matmul with both
    halves side by side over a strided view of the two frames, then the r samples laid out in time."""

    __slots__ = ("weight", "bias", "stride", "slot", "matrix", "bias_rows")

    def __init__(self, module: Qwen3OmniMoeCausalTransConvNet, slot: int):
        kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
        self.weight = module.conv.weight.detach()  # [in, out, kernel]
        self.bias = None if module.conv.bias is None else module.conv.bias.detach()
        self.stride = stride
        in_channels, out_channels, _ = self.weight.shape
        if kernel == stride and module.left_pad == module.right_pad == 0:
            self.slot = -1  # each input frame maps to its own output samples: nothing to carry
            halves = self.weight
        elif kernel == 2 * stride and module.left_pad == module.right_pad == stride:
            self.slot = slot
            halves = torch.cat((self.weight[..., stride:], self.weight[..., :stride]))  # [2*in, out, r]
        else:
            raise ValueError(f"streaming code2wav cannot carry a transposed conv ({kernel=}, {stride=})")
        self.matrix = None
        # [out*r, 1]: row o*r + j is output channel o's sample j of a frame
        self.bias_rows = _bias_column(self.bias, out_channels, self.weight).repeat_interleave(stride, dim=0)
        if in_channels * kernel // stride <= _MATMUL_CONV_MAX_INPUTS:  # inputs per output sample
            self.matrix = halves.permute(1, 2, 0).reshape(out_channels * stride, halves.shape[0]).contiguous()

    def __call__(self, x: torch.Tensor, state: list[Any]) -> torch.Tensor:
        if self.slot >= 0:
            previous = state[self.slot]
            if previous is not None:
                x = torch.cat((previous, x), dim=-1)
            if x.shape[-1]:
                state[self.slot] = x[..., -1:].clone()  # not a view of the whole input (see _CausalConv)
        batch, channels, frames = x.shape
        if self.matrix is None:
            y = F.conv_transpose1d(x, self.weight, self.bias, stride=self.stride)
            # With the previous frame in front, trimming r on both sides leaves exactly the new samples.
            return y if self.slot < 0 else y[..., self.stride : y.shape[-1] - self.stride]
        if self.slot >= 0:  # columns [2, in, B, frames-1]: frame t over frame t+1
            frames -= 1
            stride_b, stride_c, stride_t = x.stride()
            columns = x.as_strided((2, channels, batch, frames), (stride_t, stride_c, stride_b, stride_t))
        else:
            columns = x.transpose(0, 1)
        y = torch.addmm(self.bias_rows, self.matrix, columns.reshape(-1, batch * frames))  # [out*r, B*frames]
        # Laid out in time: [out, r, B, frames] -> [B, out, frames, r] -> [B, out, frames*r]
        return y.view(-1, self.stride, batch, frames).permute(2, 0, 3, 1).reshape(batch, -1, frames * self.stride)


class _ConvNeXt:
    """Qwen3OmniMoeConvNeXtBlock with a streaming depthwise conv (the module's ops after it)."""

    __slots__ = ("dwconv", "norm", "pwconv1", "pwconv2", "gamma", "approximate")

    def __init__(self, module: Qwen3OmniMoeConvNeXtBlock, slot: int):
        self.dwconv = _CausalConv(module.dwconv, slot)
        self.norm = module.norm
        self.pwconv1, self.pwconv2 = module.pwconv1, module.pwconv2
        self.gamma = module.gamma.detach()
        self.approximate = module.act.approximate

    def __call__(self, x: torch.Tensor, state: list[Any]) -> torch.Tensor:
        h = self.dwconv(x, state).permute(0, 2, 1)
        h = F.layer_norm(h, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps)
        h = F.gelu(F.linear(h, self.pwconv1.weight, self.pwconv1.bias), approximate=self.approximate)
        h = self.gamma * F.linear(h, self.pwconv2.weight, self.pwconv2.bias)
        return x + h.permute(0, 2, 1)


class _ResidualUnit:
    """Qwen3OmniMoeCode2WavDecoderResidualUnit: snake, dilated causal conv, snake, 1x1 conv, + input."""

    __slots__ = ("act1", "conv1", "act2", "conv2")

    def __init__(self, module: Qwen3OmniMoeCode2WavDecoderResidualUnit, slot: int):
        self.act1, self.act2 = _Snake(module.act1), _Snake(module.act2)
        self.conv1 = _CausalConv(module.conv1, slot)
        self.conv2 = _CausalConv(module.conv2, -1)
        if self.conv2.context:
            raise ValueError("streaming code2wav expects 1x1 convolutions after the dilated ones")

    def __call__(self, x: torch.Tensor, state: list[Any]) -> torch.Tensor:
        return self.conv2(self.act2(self.conv1(self.act1(x), state)), state).add_(x)


def _initial_slot(step: Any) -> torch.Tensor | None:
    if isinstance(step, _CausalConv) and step.context:
        return step.initial_context()
    if isinstance(step, _ConvNeXt):
        return step.dwconv.initial_context()
    if isinstance(step, _ResidualUnit):
        return step.conv1.initial_context()
    return None  # transposed convs: no previous frame before the first decode


def _streaming_steps(code2wav: Qwen3OmniMoeCode2Wav) -> list[Any]:
    """The conv stack (upsample, then decoder) as a flat list of steps over the model's weights;
    each stateful step owns one slot of a stream's state list, in order."""
    modules: list[torch.nn.Module] = [block for blocks in code2wav.upsample for block in blocks]
    for block in code2wav.decoder:
        if isinstance(block, Qwen3OmniMoeCode2WavDecoderBlock):
            modules.extend(block.block)
        else:
            modules.append(block)
    steps: list[Any] = []
    slots = 0
    for module in modules:
        if isinstance(module, Qwen3OmniMoeSnakeBeta):
            steps.append(_Snake(module))
            continue
        if isinstance(module, Qwen3OmniMoeCausalConvNet):
            step: Any = _CausalConv(module, slots)
        elif isinstance(module, Qwen3OmniMoeCausalTransConvNet):
            step = _TransposedConv(module, slots)
        elif isinstance(module, Qwen3OmniMoeConvNeXtBlock):
            step = _ConvNeXt(module, slots)
        elif isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
            step = _ResidualUnit(module, slots)
        else:
            raise ValueError(f"streaming code2wav does not know {type(module).__name__}")
        steps.append(step)
        slots += 1
    return steps


class _Transformer:
    """The pre-transformer over the new frames of several streams in one pass.

    The streams' frames are packed into one sequence; each attends to its own stream's keys only
    (a block mask), within the sliding window, with its own KV cache (`KVCache`: the last
    `window - 1` keys and values per layer, as transformers' DynamicSlidingWindowLayer keeps).
    Projections, norms, MLPs and RoPE run once for all streams. The layers' submodules keep their
    own code and weights; this replaces only the per-call machinery (mask creation, cache objects,
    output capturing), which on a small model costs more than the compute.

    transformers coupling (pinned in pyproject): `Qwen3OmniMoeCode2WavTransformerModel.forward` and
    its layer's and attention's `forward`; tests compare against the model's one-shot decode.
    """

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav):
        model = code2wav.pre_transformer
        config = model.config
        if any(kind != "sliding_attention" for kind in config.layer_types[: config.num_hidden_layers]):
            raise ValueError("streaming code2wav expects sliding-window attention in every layer")
        self.embedding = code2wav.code_embedding
        self.code_offset = code2wav.code_offset.view(1, -1)  # [1, quantizers]
        self.layers = list(model.layers[: config.num_hidden_layers])
        self.norm = model.norm
        self.rotary = model.rotary_emb
        self.window = int(config.sliding_window)
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = attention.scaling
        weight = attention.k_proj.weight
        self._empty = weight.new_zeros((1, self.kv_heads, 0, self.head_dim))

    def new_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self._empty, self._empty) for _ in self.layers]

    def __call__(self, items: list[tuple[torch.Tensor, list[Any], int]]) -> torch.Tensor:
        """items: (codes [frames, quantizers], KV cache (updated), position of the first frame),
        one per stream -> the transformer output [total frames, hidden], the streams' frames in order."""
        device = self.code_offset.device
        codes = torch.cat([item[0] for item in items]).to(device=device, dtype=torch.long)
        hidden = self.embedding(codes + self.code_offset).mean(1).unsqueeze(0)  # [1, N, hidden]
        total = hidden.shape[1]
        query_stream, query_position, key_stream, key_position, spans = [], [], [], [], []
        start = 0
        for stream, (frames, cache, position) in enumerate(items):
            count = int(frames.shape[0])
            cached = int(cache[0][0].shape[2])
            query_stream += [stream] * count
            query_position += range(position, position + count)
            key_stream += [stream] * (cached + count)
            key_position += range(position - cached, position + count)
            spans.append((start, start + count))
            start += count
        positions = torch.tensor(query_position, device=device).unsqueeze(0)
        mask = None
        if len(items) > 1 or total > 1:  # one frame of one stream sees its whole cache
            q_stream = torch.tensor(query_stream, device=device)[:, None]
            q_position = positions[0][:, None]
            k_position = torch.tensor(key_position, device=device)[None, :]
            mask = (q_stream == torch.tensor(key_stream, device=device)[None, :]) & (k_position <= q_position)
            mask &= q_position - k_position < self.window
        cos, sin = self.rotary(hidden, positions)
        keep = self.window - 1
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            residual = hidden
            hidden = layer.input_layernorm(hidden)
            shape = (1, total, -1, self.head_dim)
            query = attention.q_norm(attention.q_proj(hidden).view(shape)).transpose(1, 2)
            key = attention.k_norm(attention.k_proj(hidden).view(shape)).transpose(1, 2)
            value = attention.v_proj(hidden).view(shape).transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            keys, values = [], []
            for (first, last), (_, cache, _) in zip(spans, items):
                cached_keys, cached_values = cache[index]
                stream_keys = torch.cat((cached_keys, key[:, :, first:last]), dim=2)
                stream_values = torch.cat((cached_values, value[:, :, first:last]), dim=2)
                keys.append(stream_keys)
                values.append(stream_values)
                cache[index] = (stream_keys[:, :, -keep:], stream_values[:, :, -keep:]) if keep else (self._empty, self._empty)
            keys_all = keys[0] if len(keys) == 1 else torch.cat(keys, dim=2)
            values_all = values[0] if len(values) == 1 else torch.cat(values, dim=2)
            out = F.scaled_dot_product_attention(
                query, keys_all, values_all, attn_mask=mask, scale=self.scaling, enable_gqa=self.kv_heads != self.heads
            )
            out = attention.o_proj(out.transpose(1, 2).reshape(1, total, -1))
            hidden = residual + layer.self_attn_layer_scale(out)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return self.norm(hidden)[0]


class Code2WavDecoder:
    """Shared, stateless part: the model, its conv stack as streaming steps, and its geometry."""

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav):
        self.code2wav = code2wav
        self.samples_per_frame = int(code2wav.total_upsample)
        self._transformer = _Transformer(code2wav)
        self._steps = _streaming_steps(code2wav)
        self._initial_state = [_initial_slot(step) for step in self._steps if not isinstance(step, _Snake)]
        # Samples a decode of F frames cannot produce yet (they need frame F): 555 for the stock rates.
        self.holdback_samples = self.samples_per_frame * 4 - self.samples_for(4)
        # `compute: {graphs: auto}`: the captured chunk unit that takes the chunks it can
        # (captured_code2wav.py `attach`); None: every chunk runs the eager path here.
        self.chunk_unit: Any = None

    def samples_for(self, frames: int) -> int:
        """Samples a one-shot decode of `frames` frames yields (F*1920 - 555 for the stock model)."""
        length = frames
        for part in (self.code2wav.upsample, self.code2wav.decoder):
            for module in part.modules():
                if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                    kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
                    length = max(0, (length - 1) * stride + kernel - module.left_pad - module.right_pad)
        return length

    # ------------------------------------------------------------------ compute (worker thread)

    @torch.inference_mode()
    def transform(self, items: list[tuple[torch.Tensor, list[Any], int]]) -> torch.Tensor:
        """New frames of one or more streams through the transformer, in one pass.

        items: (codes [frames, quantizers], the stream's KV cache (updated), the stream's frames so
        far), one per stream -> transformer outputs [total frames, hidden], the streams' in order.
        """
        return self._transformer(items)

    def initial_state(self) -> list[Any]:
        """A new stream's conv state: one slot per stateful step (zeros: the one-shot left padding)."""
        return list(self._initial_state)

    @torch.inference_mode()
    def convolve(self, hidden: torch.Tensor, state: list[Any]) -> torch.Tensor:
        """The conv stack on new transformer outputs [B, hidden, frames], carrying `state` (one
        stream's, or several streams' stacked on the batch axis) -> new samples [B, samples]."""
        for step in self._steps:
            hidden = step(hidden, state)
        return hidden.clamp(min=-1, max=1)[:, 0]

    @torch.inference_mode()
    def decode_all(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot reference decode of codes [frames, quantizers] -> waveform [samples]."""
        codes = codes.to(device=self.code2wav.code_offset.device, dtype=torch.long)
        return self.code2wav(codes.transpose(0, 1).unsqueeze(0))[0, 0]


class Code2WavStream:
    """One reply's decode state: feed codec frames, get PCM chunks that join without seams.

    Not thread-safe; one reply's frames go through one stream in order. `push` does the
    compute, so call it from a worker thread.
    """

    def __init__(self, decoder: Code2WavDecoder, first_chunk_frames: int = 1, chunk_frames: int = 6):
        if first_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("chunk sizes must be at least one frame")
        self.decoder = decoder
        self.first_chunk_frames = first_chunk_frames
        self.chunk_frames = chunk_frames
        # The state, in one of two forms: the eager path's lists (KV per layer, conv context per
        # slot), or one flat tensor when the decoder's chunk unit ran its last chunk (`_state`;
        # the lists are None then). The unit moves it between them (captured_code2wav.py).
        self._cache: list[Any] | None = decoder._transformer.new_cache()
        self._conv_state: list[Any] | None = decoder.initial_state()
        self._state: torch.Tensor | None = None
        self._pending: list[torch.Tensor] = []  # frames not decoded yet
        self.frames_in = 0  # frames decoded
        self.samples_out = 0  # samples emitted
        self.decodes = 0

    @property
    def next_chunk_frames(self) -> int:
        """Frames the next decode waits for: first_chunk_frames twice, then doubling up to chunk_frames."""
        if self.decodes == 0:
            return self.first_chunk_frames
        return max(self.first_chunk_frames, min(self.chunk_frames, self.first_chunk_frames << max(0, self.decodes - 1)))

    @property
    def pending_frames(self) -> int:
        return sum(int(chunk.shape[0]) for chunk in self._pending)

    def push(self, codes: torch.Tensor, final: bool = False) -> torch.Tensor:
        """Add frames [n, quantizers]; returns the samples that became ready (maybe none).

        Decodes when the pending frames reach the current chunk size, or at `final`.
        """
        return push_many([(self, codes, final)])[0]

    def _take_due(self, codes: torch.Tensor, final: bool) -> torch.Tensor | None:
        """Queue `codes`; the frames to decode now, if a chunk is due."""
        if codes.numel():
            self._pending.append(codes.reshape(-1, codes.shape[-1]))
        if self.pending_frames == 0 or (self.pending_frames < self.next_chunk_frames and not final):
            return None
        due = torch.cat(self._pending)
        self._pending.clear()
        return due


@torch.inference_mode()
def push_many(pushes: list[tuple[Code2WavStream, torch.Tensor, bool]]) -> list[torch.Tensor]:
    """`Code2WavStream.push` for several streams (of any sessions, one push per stream) at once.

    The due streams' new frames go through the transformer in one packed pass (each with its own
    KV cache); streams decoding the same number of frames at the same stage of their state run
    the conv stack as one batch (their conv state stacked on the batch axis for that call).
    """
    results = [torch.empty(0)] * len(pushes)
    due_by_decoder: dict[int, list[tuple[int, Code2WavStream, torch.Tensor]]] = {}
    for index, (stream, codes, final) in enumerate(pushes):
        due = stream._take_due(codes, final)
        if due is not None:
            due_by_decoder.setdefault(id(stream.decoder), []).append((index, stream, due))
    groups: dict[tuple[int, bool, int], list[tuple[int, Code2WavStream, torch.Tensor]]] = {}
    for members in due_by_decoder.values():
        decoder = members[0][1].decoder
        if decoder.chunk_unit is not None:  # `compute: {graphs: auto}`: the chunks it takes, captured
            members = decoder.chunk_unit.decode(members, results)
            if not members:
                continue
        hidden = decoder.transform([(due, stream._cache, stream.frames_in) for _, stream, due in members])
        start = 0
        for index, stream, due in members:
            frames = int(due.shape[0])
            stream.frames_in += frames
            key = (id(decoder), stream.decodes == 0, frames)
            groups.setdefault(key, []).append((index, stream, hidden[start : start + frames]))
            start += frames
    for members in groups.values():
        decoder = members[0][1].decoder
        states = [stream._conv_state for _, stream, _ in members]
        frames = torch.stack([hidden for _, _, hidden in members]).transpose(1, 2)  # [B, hidden, frames]
        if len(members) == 1:
            samples = decoder.convolve(frames, states[0])
        else:
            stacked = [None if slot[0] is None else torch.cat(slot) for slot in zip(*states)]
            samples = decoder.convolve(frames, stacked)
            for row, state in enumerate(states):
                state[:] = [None if value is None else value[row : row + 1] for value in stacked]
        for row, (index, stream, _) in enumerate(members):
            results[index] = samples[row]
            stream.samples_out += int(samples.shape[1])
            stream.decodes += 1
    return results
