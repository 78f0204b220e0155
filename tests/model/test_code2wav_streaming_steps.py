"""The streaming conv steps in float32, as the server runs them: chunks of the 1, 1, 2, 4, 6, ...
schedule, streams batched at different positions, narrow and wide convolutions, all equal to the
model's own one-shot decode (to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeSnakeBeta

from nodes.qwen3_omni import code2wav_stream
from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream, push_many

QUANTIZERS = 4
CODEBOOK = 64
ATOL = 1e-5  # float32: the streamed convolutions see other lengths than the one-shot ones


def make_decoder(
    decoder_dim: int, hidden_size: int = 32, seed: int = 0, perturbation: float = 0.1, heads: int = 2, kv_heads: int = 2
) -> Code2WavDecoder:
    """A float32 code2wav with the stock upsampling (1920 samples per frame), weights perturbed
    away from the near-identity init so every layer matters."""
    torch.manual_seed(seed)
    config = Qwen3OmniMoeCode2WavConfig(
        codebook_size=CODEBOOK,
        hidden_size=hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=64,
        num_hidden_layers=2,
        num_quantizers=QUANTIZERS,
        decoder_dim=decoder_dim,
        sliding_window=8,  # shorter than the replies: the KV caches drop keys, the mask's window matters
    )
    model = Qwen3OmniMoeCode2Wav(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(perturbation * torch.randn_like(parameter))
    return Code2WavDecoder(model)


@pytest.fixture(scope="module")
def tiny() -> Code2WavDecoder:
    """The embedded checkpoint's geometry: decoder_dim 32 (every conv narrow: matmul path)."""
    return make_decoder(decoder_dim=32)


@pytest.fixture(scope="module")
def wide() -> Code2WavDecoder:
    """decoder_dim 64, hidden 64: the first convs are wide (conv1d path), the last ones narrow."""
    return make_decoder(decoder_dim=64, hidden_size=64, seed=1, perturbation=0.05)


@pytest.fixture(scope="module")
def grouped() -> Code2WavDecoder:
    """Grouped-query attention (4 query heads over 2 key/value heads), as larger checkpoints have."""
    return make_decoder(decoder_dim=32, seed=2, heads=4, kv_heads=2)


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK, (frames, QUANTIZERS), generator=torch.Generator().manual_seed(seed))


def assert_same_audio(streamed: torch.Tensor, one_shot: torch.Tensor) -> None:
    assert streamed.dtype == torch.float32
    assert streamed.shape == one_shot.shape
    assert (streamed - one_shot).abs().max().item() <= ATOL


def test_both_convolution_paths_are_exercised(tiny, wide):
    def matmul_convs(decoder):
        convs = []
        for step in decoder._steps:
            for conv in (step, getattr(step, "dwconv", None), getattr(step, "conv1", None), getattr(step, "conv2", None)):
                if isinstance(conv, code2wav_stream._CausalConv):
                    convs.append(conv.matrix is not None)
        return convs

    assert any(matmul_convs(tiny)) and any(matmul_convs(wide)) and not all(matmul_convs(wide))


def test_snake_step_is_the_modules_activation_to_the_last_bit():
    module = Qwen3OmniMoeSnakeBeta(8)
    with torch.no_grad():
        module.alpha.normal_()
        module.beta.normal_()
    x = torch.randn(3, 8, 100)
    with torch.no_grad():
        assert torch.equal(code2wav_stream._Snake(module)(x), module(x))


@pytest.mark.parametrize("model", ["tiny", "wide"])
def test_a_reply_streamed_in_the_server_schedule_equals_the_one_shot_decode(model, request):
    decoder = request.getfixturevalue(model)
    codes = random_codes(27, seed=7)
    stream = Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=6)

    chunks = [stream.push(codes[i : i + 1], final=i == len(codes) - 1) for i in range(len(codes))]

    sizes = [len(chunk) // 1920 for chunk in chunks if len(chunk)]
    assert sizes[:6] == [0, 1, 2, 4, 6, 6]  # the first chunk is 1920 - 555 samples
    assert_same_audio(torch.cat(chunks), decoder.decode_all(codes))


@pytest.mark.parametrize("model", ["tiny", "wide", "grouped"])
def test_streams_batched_at_different_positions_each_equal_their_one_shot_decode(model, request):
    """Pushes of streams that started at different times go through push_many together: first
    decodes beside later ones, chunks of different sizes, frames arriving one or several at a time."""
    decoder = request.getfixturevalue(model)
    lengths = [23, 17, 30, 9, 20, 25]
    starts = [0, 0, 1, 3, 5, 8]
    arrivals = [1, 1, 2, 1, 3, 1]  # frames per push
    codes = [random_codes(n, seed=20 + i) for i, n in enumerate(lengths)]
    streams = [Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=6) for _ in codes]
    fed = [0] * len(codes)
    outputs: list[list[torch.Tensor]] = [[] for _ in codes]
    for step in range(60):
        pushes = []
        for i, stream in enumerate(streams):
            if step >= starts[i] and fed[i] < lengths[i]:
                frames = codes[i][fed[i] : fed[i] + arrivals[i]]
                fed[i] += len(frames)
                pushes.append((i, (stream, frames, fed[i] == lengths[i])))
        for (i, _), samples in zip(pushes, push_many([push for _, push in pushes])):
            outputs[i].append(samples)

    assert fed == lengths
    for i in range(len(codes)):
        assert_same_audio(torch.cat(outputs[i]), decoder.decode_all(codes[i]))
