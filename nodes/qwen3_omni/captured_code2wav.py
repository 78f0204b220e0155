"""Captured code2wav chunks (`compute: {graphs: auto}`): a streaming chunk as ONE unit.

A streaming chunk (code2wav_stream.py's `push_many`) is the transformer over a stream's new
frames, with its sliding-window KV, then the conv stack carrying each conv's left context:
hundreds of small operators, and on the host Python building the packed mask and slicing every
stream's cache and conv state layer by layer. `ChunkUnit.chunk` is the same arithmetic for B
streams of F new frames each as one function of tensors only, every shape fixed by (padded B,
F, whether it is the streams' first chunk):

- each stream's whole state is ONE flat tensor (`Code2WavStream._state`): its KV, `window - 1`
  columns per layer (left-padded with zeros, masked by position), then every conv's carried
  context; B streams' states are one stack, the new states one output;
- the transformer runs the B streams as a batch [B, F] (each row attends to its own KV columns
  and frames, by a mask made from the positions on the device), not as one packed sequence;
- the conv stack is code2wav_stream's own steps, on the stacked state.

Each (padded B, F, first) is captured once (capture.py: a CUDA graph on CUDA, a TorchScript
trace on CPU) and replayed; padding rows are zeros whose outputs are dropped (a stream's state
is its own input, so they touch no stream). The same function runs eagerly where a capture
cannot apply: under a Python dispatch mode on CPU (a counter); and the eager path of before
(`push_many`'s packed pass, the state as lists) runs what the unit does not take: more streams
than the largest size, chunks of more than `MAX_FRAMES` frames, a size whose capture failed
(logged once). A stream moves between the two forms of its state when its chunk changes path.
Without a `defer` hook a key is captured in the chunk that first needs it; the code2wav node
defers it to idle compute (that chunk runs the unit as written).

Tested equal to the eager path chunk by chunk (tests/model/test_captured_code2wav.py): streams
joining and leaving between chunks, padding rows, a stream moving between the paths. Measured
in docs/notebook/2026-12-07-captured-code2wav.md.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from nodes.qwen3_omni.capture import Captured, padded_batch, python_modes
from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream, _Snake, _TransposedConv

log = logging.getLogger(__name__)

# The most new frames a captured chunk takes (the node's chunks: 1, 1, 2, 4, 6 by default); a
# longer one runs eager.
MAX_FRAMES = 16

# (padded streams, frames, first chunk): what a captured chunk's shapes and operators depend on.
Key = tuple[int, int, bool]


def attach(decoder: Code2WavDecoder, graphs: str = "auto") -> Code2WavDecoder:
    """Give `decoder` its chunk unit (`compute: {graphs: auto}`; `off` leaves the eager path)."""
    if graphs == "auto" and decoder.chunk_unit is None:
        unit = ChunkUnit(decoder)
        if unit.why_not is None:
            decoder.chunk_unit = unit
        else:
            log.info("code2wav chunks run eager: %s", unit.why_not)
    return decoder


class ChunkUnit:
    """One decoder's chunk unit (shared by its streams; see the module docstring)."""

    def __init__(self, decoder: Code2WavDecoder):
        self.decoder = decoder
        transformer = decoder._transformer
        self.transformer = transformer
        self.device = transformer.code_offset.device
        self.cuda = self.device.type == "cuda"
        self.chunks = 0  # chunks this unit ran, per stream (tests read them)
        self.replays = 0  # of which replayed a capture
        self._graphs: dict[Key, _Graph] = {}
        self._failed: set[int] = set()
        self._pending: set[Key] = set()
        self._pool: Any = None  # the CUDA graphs' shared memory pool
        # Where a key's capture runs: None, inline in the chunk that first needs it; else
        # `defer(capture)` queues it (the code2wav node: as idle compute) and chunks run as
        # written until it has run.
        self.defer: Callable[[Callable[[], None]], None] | None = None
        self.keep = transformer.window - 1  # KV columns a stream keeps per layer
        dtype = transformer._empty.dtype
        self.dtype = dtype
        self.why_not = None if self.keep >= 1 else "a sliding window of one frame"
        self.kv_shape = (len(transformer.layers), 2, transformer.kv_heads, self.keep, transformer.head_dim)
        self.kv_size = math.prod(self.kv_shape)
        # The conv state slots (code2wav_stream's order): (offset in the flat state, channels,
        # samples, whether a transposed conv's frame: none before the first chunk), None where a
        # step carries nothing.
        self.slots: list[tuple[int, int, int, bool] | None] = []
        offset = self.kv_size
        steps = [step for step in decoder._steps if not isinstance(step, _Snake)]
        for step, initial in zip(steps, decoder._initial_state):
            if isinstance(step, _TransposedConv):
                shape = (step.weight.shape[0], 1) if step.slot >= 0 else None  # its last input frame
            else:  # a causal conv's (a ConvNeXt's, a residual unit's) left context, if it has one
                shape = None if initial is None else tuple(initial.shape[1:])
            if initial is not None and initial.dtype != dtype:
                self.why_not = "conv state and KV of different dtypes"
            if shape is None:
                self.slots.append(None)
                continue
            self.slots.append((offset, shape[0], shape[1], isinstance(step, _TransposedConv)))
            offset += shape[0] * shape[1]
        self.state_size = offset
        self._initial = torch.zeros(self.state_size, dtype=dtype, device=self.device)
        self.modules = (decoder.code2wav,)

    # ------------------------------------------------------------------ the unit

    def chunk(self, codes: torch.Tensor, positions: torch.Tensor, state: torch.Tensor, first: bool):
        """The chunk of P streams: codes [P, F, quantizers] (long), each stream's frames so far
        [P] (long), their states [P, state_size] -> (new samples [P, samples], new states
        [P, state_size]). `first`: the streams' first chunk (no transposed conv frame yet)."""
        rows = codes.shape[0]
        kv = state[:, : self.kv_size].view(rows, *self.kv_shape)
        hidden, new_kv = self._transform(codes, positions, kv)
        conv_state: list[Any] = []
        for slot in self.slots:
            if slot is None or (first and slot[3]):
                conv_state.append(None)
            else:
                offset, channels, samples, _ = slot
                conv_state.append(state[:, offset : offset + channels * samples].view(rows, channels, samples))
        samples = self.decoder.convolve(hidden.transpose(1, 2), conv_state)
        pieces = [new_kv.reshape(rows, -1)]
        pieces += [value.reshape(rows, -1) for slot, value in zip(self.slots, conv_state) if slot is not None]
        return samples, torch.cat(pieces, dim=1)

    def _transform(self, codes: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor):
        """code2wav_stream's `_Transformer` for rows of F frames: [P, F, hidden], new KV."""
        t = self.transformer
        rows, frames = codes.shape[:2]
        keep = self.keep
        hidden = t.embedding(codes + t.code_offset).mean(2)  # [P, F, hidden]
        query_positions = positions[:, None] + torch.arange(frames, device=codes.device)  # [P, F]
        cached = positions[:, None] - keep + torch.arange(keep, device=codes.device)  # the KV columns' positions
        key_positions = torch.cat((cached, query_positions), dim=1)  # [P, keep + F]
        behind = query_positions[:, :, None] - key_positions[:, None, :]  # [P, F, keep + F]
        mask = ((key_positions[:, None, :] >= 0) & (behind >= 0) & (behind < t.window))[:, None]
        cos, sin = t.rotary(hidden, query_positions)
        shape = (rows, frames, -1, t.head_dim)
        new_kv = []
        for index, layer in enumerate(t.layers):
            attention = layer.self_attn
            residual = hidden
            hidden = layer.input_layernorm(hidden)
            query = attention.q_norm(attention.q_proj(hidden).view(shape)).transpose(1, 2)
            key = attention.k_norm(attention.k_proj(hidden).view(shape)).transpose(1, 2)
            value = attention.v_proj(hidden).view(shape).transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            keys = torch.cat((kv[:, index, 0], key), dim=2)
            values = torch.cat((kv[:, index, 1], value), dim=2)
            new_kv.append(torch.stack((keys[:, :, -keep:], values[:, :, -keep:]), dim=1))
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, scale=t.scaling, enable_gqa=t.kv_heads != t.heads
            )
            out = attention.o_proj(out.transpose(1, 2).reshape(rows, frames, -1))
            hidden = residual + layer.self_attn_layer_scale(out)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return t.norm(hidden), torch.stack(new_kv, dim=1)

    # ------------------------------------------------------------------ push_many's hook

    def decode(self, members: list[tuple[int, Code2WavStream, torch.Tensor]], results: list[Any]) -> list[Any]:
        """Run the due chunks of `members` ((push index, stream, frames [F, quantizers])) that the
        unit takes, writing `results[index]`; -> the members left to the eager path (their
        state as lists)."""
        groups: dict[tuple[int, bool], list[tuple[int, Code2WavStream, torch.Tensor]]] = {}
        eager = []
        for member in members:
            frames = int(member[2].shape[0])
            if frames > MAX_FRAMES:
                eager.append(member)
            else:
                groups.setdefault((frames, member[1].decodes == 0), []).append(member)
        for (frames, first), group in groups.items():
            size = padded_batch(len(group))
            if size is None or size in self._failed:
                eager.extend(group)
                continue
            self._run(group, (size, frames, first), results)
        for _, stream, _ in eager:
            self.to_lists(stream)
        return eager

    @torch.inference_mode()
    def _run(self, group: list[tuple[int, Code2WavStream, torch.Tensor]], key: Key, results: list[Any]) -> None:
        rows = len(group)
        streams = [stream for _, stream, _ in group]
        if rows == 1:
            codes, state = group[0][2][None], self.to_flat(streams[0])[None]
        else:
            codes, state = torch.stack([due for _, _, due in group]), torch.stack([self.to_flat(s) for s in streams])
        positions = torch.tensor([stream.frames_in for stream in streams])
        if self.cuda:
            codes, positions = codes.to(self.device, non_blocking=True), positions.to(self.device, non_blocking=True)
        samples, states = self._chunk(key, codes.to(torch.long), positions, state)
        for row, (index, stream, due) in enumerate(group):
            stream._state = states[row]
            results[index] = samples[row]
            stream.frames_in += int(due.shape[0])
            stream.samples_out += int(samples.shape[1])
            stream.decodes += 1
        self.chunks += rows

    def _chunk(self, key: Key, codes: torch.Tensor, positions: torch.Tensor, state: torch.Tensor):
        rows, (size, _, first) = codes.shape[0], key
        if not self.cuda and python_modes():  # a CPU trace cannot run under a Python mode: as written
            return self.chunk(codes, positions, state, first)
        graph = self._graphs.get(key)
        if graph is None:
            if self.defer is not None:  # captured in idle time; this chunk runs as written
                if key not in self._pending:
                    self._pending.add(key)
                    self.defer(functools.partial(self._capture, key))
                return self.chunk(codes, positions, state, first)
            graph = self._capture(key)
            if graph is None:
                return self.chunk(codes, positions, state, first)
        self.replays += 1
        return graph.replay(codes, positions, state, rows)

    @torch.inference_mode()
    def _capture(self, key: Key) -> _Graph | None:
        """Capture `key` now (what `defer` runs); None where it failed (that size runs eager)."""
        self._pending.discard(key)
        if key in self._graphs or key[0] in self._failed:
            return self._graphs.get(key)
        try:
            graph = self._graphs[key] = _Graph(self, key)
            return graph
        except Exception:  # noqa: BLE001 - capture is an optimisation: the chunk still runs
            log.warning("code2wav chunks of padded batch %s cannot be captured; they run eager", key[0], exc_info=True)
            self._failed.add(key[0])
            return None

    @torch.inference_mode()
    def prepare(self, streams: int, frames: int, first: bool = False) -> bool:
        """Capture now what a chunk of `streams` streams of `frames` frames replays (benchmarks
        time chunks, not captures) -> whether it is captured."""
        size = padded_batch(streams)
        return size is not None and self._capture((size, frames, first)) is not None

    # ------------------------------------------------------------------ a stream's state, two forms

    def to_flat(self, stream: Code2WavStream) -> torch.Tensor:
        """The stream's state as the unit reads it (made from its lists the first time)."""
        if stream._state is not None:
            return stream._state
        if stream.decodes == 0:
            stream._state = self._initial
        else:
            pieces = []
            for cached_keys, cached_values in stream._cache:  # [1, kv_heads, cached, head_dim] each
                pad = self.keep - cached_keys.shape[2]
                pair = torch.stack((cached_keys[0], cached_values[0]))
                pieces.append(F.pad(pair, (0, 0, pad, 0)) if pad else pair)
            pieces = [torch.stack(pieces).reshape(-1)]
            pieces += [value.reshape(-1) for slot, value in zip(self.slots, stream._conv_state) if slot is not None]
            stream._state = torch.cat(pieces).to(self.dtype)
        stream._cache = stream._conv_state = None  # the flat state is the stream's now
        return stream._state

    def to_lists(self, stream: Code2WavStream) -> None:
        """The stream's state back as the eager path's lists (its KV cut to what it holds)."""
        state = stream._state
        if state is None:
            return
        cached = min(stream.frames_in, self.keep)
        kv = state[: self.kv_size].view(self.kv_shape)[:, :, :, self.keep - cached :]  # [layers, 2, heads, cached, dim]
        stream._cache = [(layer[0][None], layer[1][None]) for layer in kv]
        conv_state: list[Any] = []
        for slot in self.slots:
            if slot is None or (slot[3] and stream.decodes == 0):
                conv_state.append(None)
            else:
                offset, channels, samples, _ = slot
                conv_state.append(state[offset : offset + channels * samples].view(1, channels, samples))
        stream._conv_state = conv_state
        stream._state = None


class _Graph:
    """One key's captured chunk on static input buffers (padding rows: zeros, dropped after)."""

    def __init__(self, unit: ChunkUnit, key: Key):
        size, frames, first = key
        self.size, self.cuda = size, unit.cuda
        quantizers = unit.transformer.code_offset.shape[1]
        device = unit.device
        self.inputs = (
            torch.zeros((size, frames, quantizers), dtype=torch.long, device=device),
            torch.zeros(size, dtype=torch.long, device=device),
            torch.zeros((size, unit.state_size), dtype=unit.dtype, device=device),
        )
        if self.cuda and unit._pool is None:
            unit._pool = torch.cuda.graph_pool_handle()  # one memory pool for all its graphs

        def chunk(codes: torch.Tensor, positions: torch.Tensor, state: torch.Tensor):
            return unit.chunk(codes, positions, state, first)

        self.captured = Captured(chunk, self.inputs, unit.modules, unit._pool)

    def replay(self, codes: torch.Tensor, positions: torch.Tensor, state: torch.Tensor, rows: int):
        if not self.cuda and rows == self.size:  # the trace takes any tensors of its shapes: no copies
            return self.captured.run(codes, positions, state)
        static = self.inputs
        for target, value in zip(static, (codes, positions, state)):
            target[:rows].copy_(value, non_blocking=True)
        if rows < self.size:  # padding rows: zeros (a fresh stream at position 0)
            for target in static:
                target[rows:].zero_()
        samples, states = self.captured.run(*static)
        if self.cuda:  # the graph's static outputs: the next replay overwrites them
            return samples[:rows].clone(), states[:rows].clone()
        return samples[:rows], states[:rows]
