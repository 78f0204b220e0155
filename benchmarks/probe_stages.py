"""The GPU probe's stages: each one sets up one piece of the engine's work on the real-size model
and returns the step to time with its least cost (bytes and FLOPs), or why it cannot run here.

Every step goes through the project's own model code, as the engines call it:

- `thinker_decode`: `ThinkerRunner.answer` (the lean decode forward + lm_head, and the greedy
  choice of every row's next token with its one host read) on `batch` rows of a slot cache whose
  rows already hold `context` tokens (the KV's contents do not change the cost, so no prefill is
  needed to get there; the cache is sized up front, as on a GPU deployment); with
  `compute: {graphs: auto}` one captured decode step (nodes/qwen3_omni/captured_thinker.py: a
  CUDA graph per padded batch and KV span on CUDA), reported with how many steps it replayed;
- `thinker_prefill`: `ThinkerRunner.forward_rows` of one `tokens`-long chunk into an empty row;
- `talker_frame`: one `step_replies` call for `batch` replies: the batched talker forward, the
  talker codes and the code predictor's 15 residual codes (benchmarks/talker_batching.py's replies),
  greedy; with `compute: {graphs: auto}` (`compute_graphs.set_graphs`) one captured frame unit
  (nodes/qwen3_omni/captured.py: a CUDA graph per padded batch on CUDA), reported with how many
  of its frames were replayed;
- `code2wav_chunk`: a `Code2WavStream.push` of one streaming chunk (6 frames, 480 ms of audio);
  with `compute: {graphs: auto}` one captured chunk unit (nodes/qwen3_omni/captured_code2wav.py),
  reported with how many of its chunks were replayed;
- `audio_encoder`: `encode_turns` of 5 s of 16 kHz audio's log-mel features.

Costs (`StageCost`) are lower bounds from the configuration: the weights a step must read once
(for a mixture of experts layer, the experts that `tokens` tokens are expected to touch with top-k
routing spread evenly: E * (1 - (1 - k/E)^tokens)), the KV it reads, and 2 FLOPs per
multiply-accumulate of the parameters each token uses (k experts of E) plus attention. The dense
stages (code2wav, the audio encoder) count their FLOPs with torch's flop counter instead, and
their bytes are their weights alone (their activations are not counted: a lower bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from benchmarks.probe_timing import GIB, StageCost, counted_flops, memory_free

# What a stage leaves free beyond its own KV (activations, the allocator's slack).
HEADROOM = {"cuda": 4 * GIB, "cpu": 1 * GIB}
CODE2WAV_CHUNK_FRAMES = 6
AUDIO_SECONDS = 5.0


@dataclass
class Prepared:
    step: Callable[[], Any]
    cost: StageCost
    info: dict[str, Any] = field(default_factory=dict)
    # What the stage says after it was timed (the talker: whether its frames were replayed captured).
    after: Callable[[], dict[str, Any]] | None = None


def weights_cost(module: torch.nn.Module, tokens: int, *, embedding_names: tuple[str, ...] = ()) -> tuple[float, float]:
    """(bytes read, multiply-accumulates per token) of one forward of `tokens` tokens through
    `module`: stacked expert weights (`.experts.` names, `[experts, ...]`) by routing, embedding
    tables by the rows read, everything else once."""
    config = getattr(module, "config", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    read = macs = 0.0
    for name, parameter in module.named_parameters():
        size = parameter.numel() * parameter.element_size()
        if any(part in name for part in embedding_names):
            read += tokens * parameter.shape[-1] * parameter.element_size()
        elif ".experts." in name and top_k:
            experts = parameter.shape[0]
            read += size * (1 - (1 - top_k / experts) ** tokens)
            macs += parameter.numel() * top_k / experts
        else:
            read += size
            macs += parameter.numel()
    return read, macs


def _kv_token_bytes(text_config: Any, dtype: torch.dtype) -> int:
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return 2 * text_config.num_hidden_layers * text_config.num_key_value_heads * head_dim * dtype.itemsize


def _attention_flops(text_config: Any, queries: int, keys: float) -> float:
    """QK^T and PV for `queries` queries over `keys` keys each, every layer and head."""
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return 4.0 * queries * keys * text_config.num_attention_heads * head_dim * text_config.num_hidden_layers


def _fits(omni: Any, needed: float, what: str) -> str | None:
    free = memory_free(omni.device) - HEADROOM[omni.device.type]
    if needed > free:
        return f"needs {needed / GIB:.1f} GiB for {what}; {max(free, 0) / GIB:.1f} GiB free beyond the headroom"
    return None


def thinker_decode(omni: Any, batch: int, context: int, calls: int) -> Prepared | str:
    from nodes.qwen3_omni.batched_thinker import Feed, ThinkerRunner
    from nodes.qwen3_omni.thinker_requests import Choice
    from nodes.qwen3_omni.thinker_sampling import Sampling

    text = omni.config.thinker_config.text_config
    capacity = context + calls + 8  # every timed, warm-up and counted call appends a column
    kv_bytes = _kv_token_bytes(text, omni.dtype) * batch * capacity
    if (reason := _fits(omni, kv_bytes, f"the KV of {batch} x {capacity} tokens")) is not None:
        return reason
    runner = ThinkerRunner(omni, slots=batch, capacity=capacity)
    rows = [runner.cache.acquire() for _ in range(batch)]
    for row in rows:
        runner.cache.lengths[row] = context
    tokens = torch.randint(0, text.vocab_size, (batch,)).tolist()
    choice = Choice(Sampling(ignore_eos=True))
    feeds = [Feed(slot=row, token=token, position=context, choice=choice) for row, token in zip(rows, tokens)]
    unit = runner.step_unit
    if unit is not None:  # captured: what the timed steps replay (every KV span they reach) first
        unit.prepare(feeds, calls + 6)
    read, macs = weights_cost(runner.language_model, batch, embedding_names=("embed_tokens",))
    head = runner.thinker.lm_head.weight
    read += head.numel() * head.element_size() + _kv_token_bytes(text, omni.dtype) * batch * context
    flops = 2.0 * batch * (macs + head.numel()) + _attention_flops(text, batch, context)

    def after() -> dict[str, Any]:
        return {"graphs": runner.graphs, "replayed_steps": 0 if unit is None else unit.replays}

    return Prepared(lambda: runner.answer(feeds), StageCost(read, flops), {"batch": batch, "context_tokens": context},
                    after)


def thinker_prefill(omni: Any, tokens: int) -> Prepared | str:
    from nodes.qwen3_omni.batched_thinker import Chunk, ThinkerRunner

    text = omni.config.thinker_config.text_config
    kv_bytes = _kv_token_bytes(text, omni.dtype) * (tokens + 8)
    # The forward's activations: the additive mask and attention scores of one layer, the experts' inputs.
    activations = tokens * tokens * omni.dtype.itemsize * 2 + tokens * text.hidden_size * 4 * 16
    if (reason := _fits(omni, kv_bytes + activations, f"a {tokens}-token prefill")) is not None:
        return reason
    runner = ThinkerRunner(omni, slots=1, capacity=tokens + 8)
    row = runner.cache.acquire()
    with torch.inference_mode():
        ids = torch.randint(0, text.vocab_size, (1, tokens), device=omni.device)
        embeds = runner.embed_tokens(ids)
    positions = torch.arange(tokens, device=omni.device).view(1, 1, tokens).expand(3, 1, tokens)
    chunk = Chunk(slot=row, embeds=embeds, positions=positions)

    def step() -> Any:
        runner.cache.set_length(row, 0)  # each call prefills the same empty row
        return runner.forward_rows(chunk)

    read, macs = weights_cost(runner.language_model, tokens, embedding_names=("embed_tokens",))
    head = runner.thinker.lm_head.weight
    read += head.numel() * head.element_size() + _kv_token_bytes(text, omni.dtype) * tokens
    flops = 2.0 * (tokens * macs + head.numel()) + _attention_flops(text, tokens, tokens / 2)
    return Prepared(step, StageCost(read, flops), {"tokens": tokens})


def talker_frame(omni: Any, batch: int, calls: int) -> Prepared | str:
    from benchmarks.talker_batching import _replies
    from nodes.qwen3_omni.talker_engine import TalkerModel, frame_unit, step_replies

    talker = TalkerModel(omni.model)
    replies = _replies(omni, talker, batch, calls + 8)
    step_replies(replies)  # the prefills: every later call is one frame of every reply
    step_replies(replies)  # the first decode frame: every reply has its slot-cache row
    unit = frame_unit(talker)
    if unit is not None:  # captured: what the timed frames replay is captured before them
        unit.prepare(replies, calls + 6)
    model = omni.talker
    read, macs = weights_cost(model.model, batch, embedding_names=("codec_embedding",))
    for head in (model.codec_head, model.text_projection):
        for parameter in head.parameters():
            read += parameter.numel() * parameter.element_size()
            macs += parameter.numel()
    predictor = model.code_predictor
    residual_steps = omni.config.talker_config.num_code_groups - 1
    layer_read, layer_macs = weights_cost(predictor.model, batch, embedding_names=("codec_embedding",))
    heads = sum(p.numel() for p in predictor.lm_head.parameters())
    read += residual_steps * layer_read + heads * omni.dtype.itemsize  # the predictor's layers once per residual code
    flops = 2.0 * batch * (macs + (residual_steps + 1) * layer_macs + heads)

    def after() -> dict[str, Any]:
        unit = talker.frame_unit
        return {"graphs": talker.graphs, "replayed_frames": 0 if unit is None else unit.replays}

    return Prepared(lambda: step_replies(replies), StageCost(read, flops), {"batch": batch}, after)


def code2wav_chunk(omni: Any) -> Prepared | str:
    from nodes.qwen3_omni.captured_code2wav import attach
    from nodes.qwen3_omni.compute_graphs import graphs_of
    from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream

    graphs = graphs_of(omni.model)
    decoder = attach(Code2WavDecoder(omni.code2wav), graphs)
    unit = decoder.chunk_unit
    if unit is not None:  # captured: what the timed chunks replay (the first, then the later ones) first
        unit.prepare(1, CODE2WAV_CHUNK_FRAMES, first=True)
        unit.prepare(1, CODE2WAV_CHUNK_FRAMES)
    config = omni.config.code2wav_config
    stream = Code2WavStream(decoder, first_chunk_frames=CODE2WAV_CHUNK_FRAMES, chunk_frames=CODE2WAV_CHUNK_FRAMES)
    codes = torch.randint(0, config.codebook_size, (CODE2WAV_CHUNK_FRAMES, config.num_quantizers))
    step = lambda: stream.push(codes)  # noqa: E731 - each push decodes one chunk
    flops = counted_flops(step)
    read = sum(p.numel() * p.element_size() for p in omni.code2wav.parameters())
    return Prepared(step, StageCost(read, flops), {"frames": CODE2WAV_CHUNK_FRAMES,
                                                  "audio_ms": CODE2WAV_CHUNK_FRAMES * decoder.samples_per_frame / 24},
                    lambda: {"graphs": graphs, "replayed_chunks": 0 if unit is None else unit.replays})


def audio_encoder(omni: Any) -> Prepared | str:
    from nodes.qwen3_omni.inputs import audio_features
    from nodes.qwen3_omni.media_encoders import encode_turns

    rate = omni.sample_rate_in
    samples = (np.random.default_rng(0).standard_normal(int(AUDIO_SECONDS * rate)) * 0.1).astype(np.float32)
    features, frames = audio_features(omni, samples)
    turn = {"audio_features": [features]}
    step = lambda: encode_turns(omni, [turn])  # noqa: E731
    flops = counted_flops(step)
    tower = omni.thinker.model.audio_tower
    read = sum(p.numel() * p.element_size() for p in tower.parameters())
    return Prepared(step, StageCost(read, flops), {"audio_s": AUDIO_SECONDS, "mel_frames": frames})
