"""Streaming code2wav: codec frames in, 24 kHz PCM out, chunk by chunk, equal to a one-shot decode.

Qwen3-Omni's code2wav is a causal transformer over codec frames (sliding-window attention)
followed by a causal convolutional upsampler (transposed convolutions + dilated convolutions)
that turns each frame into `total_upsample` (1920) samples. Two facts shape the streaming:

* The transposed convolutions (kernel 2r, stride r, trimmed r on both sides) make every output
  sample depend on its own input frame and the *next* one, so a decode of F frames yields only
  F*1920 - 555 samples (for the stock rates): the last 555 samples of frame F-1 need frame F.
  A stream therefore emits, after F frames, exactly the samples [emitted, F*1920-555) and holds
  the rest back for the next decode. A one-shot decode of all frames yields the same total.
* Re-running the transformer over a window of recent frames is only approximately right (its
  receptive field grows with depth and the sliding window); so the transformer runs
  incrementally with its own KV cache, each frame through it once, exactly as in one shot.
  The convolutional part is re-run over the new frames plus `conv_context_frames` frames of
  left context: the smallest context that makes every emitted sample identical to one shot
  (computed from the layers' kernels, dilations and strides, 9 frames for the stock model).

So the chunks a `Code2WavStream` emits, concatenated, equal `code2wav(all_frames)` within float
tolerance (tests/model/test_code2wav_stream.py).

Chunk schedule: the first decode runs as soon as `first_chunk_frames` (default 1 frame = 57 ms of
audio) are in, for a low time-to-first-audio; later decodes wait for `chunk_frames` frames
(default 6), since every decode pays for the left context again (1-frame chunks would cost
about twice as much in total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

SAMPLE_RATE = 24000


@dataclass(frozen=True)
class _ConvOp:
    """One length-changing or context-needing layer of the convolutional stack."""

    kernel: int  # effective kernel (dilation included)
    stride: int
    transposed: bool

    def input_range_start(self, out_index: int) -> int:
        """The first input index that output `out_index` depends on."""
        if not self.transposed:
            # Causal conv (stride 1, left-padded by kernel-1): [o - (k-1), o].
            return out_index - (self.kernel - 1)
        # Transposed conv trimmed by (k - s) on both sides: raw index o + (k - s) gets
        # contributions from inputs i with i*s <= raw < i*s + k.
        raw = out_index + self.kernel - self.stride
        return -((self.kernel - 1 - raw) // self.stride)  # ceil((raw - k + 1) / s)

    def output_length(self, in_length: int) -> int:
        if not self.transposed:
            return in_length
        return max(0, (in_length - 1) * self.stride + self.kernel - 2 * (self.kernel - self.stride))


def _conv_ops(code2wav: Qwen3OmniMoeCode2Wav) -> list[_ConvOp]:
    """The conv stack's layers in forward order (module registration order is forward order)."""
    ops: list[_ConvOp] = []
    for part in (code2wav.upsample, code2wav.decoder):
        for module in part.modules():
            if isinstance(module, Qwen3OmniMoeCausalConvNet):
                if module.stride != 1:
                    raise ValueError("streaming code2wav expects stride-1 causal convolutions")
                ops.append(_ConvOp(module.kernel_size, 1, transposed=False))
            elif isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                conv = module.conv
                kernel, stride = conv.kernel_size[0], conv.stride[0]
                if module.left_pad != kernel - stride or module.right_pad != kernel - stride:
                    raise ValueError("streaming code2wav expects transposed convs trimmed by kernel-stride")
                ops.append(_ConvOp(kernel, stride, transposed=True))
    return ops


class Code2WavDecoder:
    """Shared, stateless part: the model and the stream geometry derived from its layers."""

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav):
        self.code2wav = code2wav
        self.samples_per_frame = int(code2wav.total_upsample)
        self._ops = _conv_ops(code2wav)
        # Samples a decode of F frames cannot produce yet (they need frame F): 555 for the stock rates.
        self.holdback_samples = self.samples_per_frame * 4 - self.samples_for(4)
        # Frames of left context that make the first emitted sample of a chunk exact; the chunk
        # starts at a frame boundary minus the holdback, which is the worst case.
        worst_first_sample = self.samples_per_frame * 64 - self.holdback_samples
        self.conv_context_frames = 64 - self.first_frame_needed(worst_first_sample)

    def samples_for(self, frames: int) -> int:
        """Samples a decode of `frames` frames yields (F*1920 - 555 for the stock model)."""
        length = frames
        for op in self._ops:
            length = op.output_length(length)
        return length

    def first_frame_needed(self, sample: int) -> int:
        """The first codec frame that output `sample` depends on through the conv stack."""
        index = sample
        for op in reversed(self._ops):
            index = op.input_range_start(index)
        return index

    # ------------------------------------------------------------------ compute (worker thread)

    @torch.inference_mode()
    def transform(self, codes: torch.Tensor, cache: DynamicCache, position: int) -> torch.Tensor:
        """Run new frames `codes` [frames, quantizers] through the transformer with its KV cache.

        Returns the transformer output [frames, hidden] for those frames.
        """
        code2wav = self.code2wav
        device = code2wav.code_offset.device
        codes = codes.to(device=device, dtype=torch.long).transpose(0, 1).unsqueeze(0)  # [1, Q, n]
        hidden = code2wav.code_embedding(codes + code2wav.code_offset).mean(1)
        positions = torch.arange(position, position + hidden.shape[1], device=device).unsqueeze(0)
        out = code2wav.pre_transformer(inputs_embeds=hidden, position_ids=positions, cache=cache, use_cache=True)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def convolve(self, hidden: torch.Tensor) -> torch.Tensor:
        """The conv stack on transformer outputs [frames, hidden] -> waveform [samples] in [-1, 1]."""
        state = hidden.unsqueeze(0).permute(0, 2, 1)
        for blocks in self.code2wav.upsample:
            for block in blocks:
                state = block(state)
        for block in self.code2wav.decoder:
            state = block(state)
        return state.clamp(min=-1, max=1)[0, 0]

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
        self._pending: list[torch.Tensor] = []  # frames not yet through the transformer
        self._hidden = torch.empty(0)  # transformer outputs of frames [_hidden_start, frames_in)
        self._hidden_start = 0
        self.frames_in = 0  # frames through the transformer
        self.samples_out = 0  # samples emitted so far
        self.decodes = 0

    @property
    def pending_frames(self) -> int:
        return sum(int(chunk.shape[0]) for chunk in self._pending)

    def push(self, codes: torch.Tensor, final: bool = False) -> torch.Tensor:
        """Add frames [n, quantizers]; returns the samples that became ready (maybe none).

        Decodes when the pending frames reach the current chunk size, or at `final`.
        """
        if codes.numel():
            self._pending.append(codes.reshape(-1, codes.shape[-1]))
        due = self.first_chunk_frames if self.decodes == 0 else self.chunk_frames
        if self.pending_frames == 0 or (self.pending_frames < due and not final):
            return torch.empty(0)
        return self._decode()

    def _decode(self) -> torch.Tensor:
        decoder = self.decoder
        codes = torch.cat(self._pending)
        self._pending.clear()
        new_hidden = decoder.transform(codes, self._cache, self.frames_in)
        self._hidden = new_hidden if self._hidden.numel() == 0 else torch.cat([self._hidden, new_hidden])
        self.frames_in += int(codes.shape[0])
        self.decodes += 1

        end = decoder.samples_for(self.frames_in)
        if end <= self.samples_out:
            return torch.empty(0)
        first = max(0, min(decoder.first_frame_needed(self.samples_out), self.frames_in - 1))
        window = self._hidden[first - self._hidden_start :]
        wav = decoder.convolve(window)
        offset = first * decoder.samples_per_frame
        chunk = wav[self.samples_out - offset : end - offset]
        self.samples_out = end
        # Keep only the frames the next chunk's left context can reach.
        keep_from = max(0, min(decoder.first_frame_needed(self.samples_out), self.frames_in - 1))
        if keep_from > self._hidden_start:
            self._hidden = self._hidden[keep_from - self._hidden_start :]
            self._hidden_start = keep_from
        return chunk


def frames_to_ms(frames: int, samples_per_frame: int = 1920) -> float:
    return 1000.0 * frames * samples_per_frame / SAMPLE_RATE


def ms_to_frames(ms: float, samples_per_frame: int = 1920) -> int:
    return math.ceil(ms * SAMPLE_RATE / 1000.0 / samples_per_frame)
