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
float32 rounding otherwise; tests/model/test_code2wav_stream.py).

The state lives in hooks on the model's conv modules that act only while a stream's decode runs
on the current thread; the model stays usable as is (one-shot decode, `generate()`) elsewhere.

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

import threading
from typing import Any

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

SAMPLE_RATE = 24000

# The conv state of the stream whose decode runs on this thread (None: hooks do nothing).
_active = threading.local()


def _conv_pre_hook(module: Qwen3OmniMoeCausalConvNet, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    state: dict[int, Any] | None = getattr(_active, "state", None)
    if state is None:
        return None
    (x,) = args
    context_length = module.kernel_size - 1
    context = state.get(id(module))
    if context is None:
        context = x.new_zeros((*x.shape[:-1], context_length))  # the one-shot left padding
    full = torch.cat((context, x), dim=-1)
    state[id(module)] = full[..., full.shape[-1] - context_length :]
    state[("trim", id(module))] = context.shape[-1]
    return (full,)


def _conv_hook(module: Qwen3OmniMoeCausalConvNet, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
    state: dict[Any, Any] | None = getattr(_active, "state", None)
    if state is None:
        return None
    return output[..., state.pop(("trim", id(module))) :]  # outputs for the context were emitted before


def _transposed_pre_hook(module: Qwen3OmniMoeCausalTransConvNet, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    state: dict[int, Any] | None = getattr(_active, "state", None)
    if state is None:
        return None
    (x,) = args
    previous = state.get(id(module))
    full = x if previous is None else torch.cat((previous, x), dim=-1)
    if full.shape[-1]:
        state[id(module)] = full[..., -1:]
    # With the previous frame in front, the module's own trimming leaves exactly the new samples.
    return (full,)


def _install_stream_hooks(code2wav: Qwen3OmniMoeCode2Wav) -> None:
    """Make the conv stack stream-capable (once per model; inert outside a stream's decode)."""
    if getattr(code2wav, "_sgl_stream_hooks", False):
        return
    for part in (code2wav.upsample, code2wav.decoder):
        for module in part.modules():
            if isinstance(module, Qwen3OmniMoeCausalConvNet):
                if module.stride != 1:
                    raise ValueError("streaming code2wav expects stride-1 causal convolutions")
                if module.kernel_size > 1:
                    module.register_forward_pre_hook(_conv_pre_hook)
                    module.register_forward_hook(_conv_hook)
            elif isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
                if kernel == stride and module.left_pad == module.right_pad == 0:
                    continue  # each input frame maps to its own output samples: nothing to carry
                if kernel != 2 * stride or module.left_pad != stride or module.right_pad != stride:
                    raise ValueError(f"streaming code2wav cannot carry a transposed conv ({kernel=}, {stride=})")
                module.register_forward_pre_hook(_transposed_pre_hook)
    code2wav._sgl_stream_hooks = True


class Code2WavDecoder:
    """Shared, stateless part: the model (made stream-capable) and its geometry."""

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav):
        self.code2wav = code2wav
        self.samples_per_frame = int(code2wav.total_upsample)
        _install_stream_hooks(code2wav)
        # Samples a decode of F frames cannot produce yet (they need frame F): 555 for the stock rates.
        self.holdback_samples = self.samples_per_frame * 4 - self.samples_for(4)

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
    def transform(self, codes: torch.Tensor, cache: DynamicCache, position: int) -> torch.Tensor:
        """Run new frames `codes` [frames, quantizers] through the transformer with its KV cache.

        Returns the transformer output [1, hidden, frames] for those frames.
        """
        code2wav = self.code2wav
        device = code2wav.code_offset.device
        codes = codes.to(device=device, dtype=torch.long).transpose(0, 1).unsqueeze(0)  # [1, Q, n]
        hidden = code2wav.code_embedding(codes + code2wav.code_offset).mean(1)
        positions = torch.arange(position, position + hidden.shape[1], device=device).unsqueeze(0)
        out = code2wav.pre_transformer(inputs_embeds=hidden, position_ids=positions, cache=cache, use_cache=True)
        return out.last_hidden_state.permute(0, 2, 1)

    @torch.inference_mode()
    def convolve(self, hidden: torch.Tensor, state: dict[Any, Any]) -> torch.Tensor:
        """The conv stack on new transformer outputs [B, hidden, frames], carrying `state` (one
        stream's, or several streams' stacked on the batch axis) -> new samples [B, samples]."""
        _active.state = state
        try:
            for blocks in self.code2wav.upsample:
                for block in blocks:
                    hidden = block(hidden)
            for block in self.code2wav.decoder:
                hidden = block(hidden)
        finally:
            _active.state = None
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
        self._cache = DynamicCache(config=decoder.code2wav.config)
        self._conv_state: dict[Any, Any] = {}
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

    Each due stream runs the transformer with its own KV cache; streams decoding the same number
    of frames at the same stage of their state run the conv stack as one batch (their conv state
    stacked on the batch axis for that call).
    """
    results = [torch.empty(0)] * len(pushes)
    groups: dict[tuple[int, bool, int], list[tuple[int, Code2WavStream, torch.Tensor]]] = {}
    for index, (stream, codes, final) in enumerate(pushes):
        due = stream._take_due(codes, final)
        if due is None:
            continue
        hidden = stream.decoder.transform(due, stream._cache, stream.frames_in)
        stream.frames_in += int(due.shape[0])
        key = (id(stream.decoder), stream.decodes == 0, int(due.shape[0]))
        groups.setdefault(key, []).append((index, stream, hidden))
    for members in groups.values():
        decoder = members[0][1].decoder
        states = [stream._conv_state for _, stream, _ in members]
        if len(members) == 1:
            samples = decoder.convolve(members[0][2], states[0])
        else:
            stacked = {key: torch.cat([state[key] for state in states]) for key in states[0]}
            samples = decoder.convolve(torch.cat([hidden for _, _, hidden in members]), stacked)
            for row, state in enumerate(states):
                for key, value in stacked.items():
                    state[key] = value[row : row + 1]
        for row, (index, stream, _) in enumerate(members):
            results[index] = samples[row]
            stream.samples_out += int(samples.shape[1])
            stream.decodes += 1
    return results
