"""Streaming code2wav: chunks decoded with left context join into exactly the one-shot decode."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream, push_many

QUANTIZERS = 4
CODEBOOK = 64


@pytest.fixture(scope="module")
def decoder() -> Code2WavDecoder:
    """A small code2wav with the stock upsampling (1920 samples per frame) and non-trivial weights."""
    torch.manual_seed(0)
    config = Qwen3OmniMoeCode2WavConfig(
        codebook_size=CODEBOOK,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        num_quantizers=QUANTIZERS,
        decoder_dim=32,
        sliding_window=8,  # shorter than the test's replies, so the cache's window is exercised
    )
    model = Qwen3OmniMoeCode2Wav(config).eval()
    with torch.no_grad():  # the default init leaves Snake/LayerScale near identity; perturb it
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return Code2WavDecoder(model.double())


def stream_in_pieces(decoder, codes, pieces, first_chunk_frames, chunk_frames):
    stream = Code2WavStream(decoder, first_chunk_frames=first_chunk_frames, chunk_frames=chunk_frames)
    chunks, start = [], 0
    for size in pieces:
        chunks.append(stream.push(codes[start : start + size], final=start + size == len(codes)))
        start += size
    return chunks, stream


def test_a_decode_of_f_frames_holds_back_555_samples(decoder):
    assert decoder.samples_per_frame == 1920
    assert decoder.holdback_samples == 555
    assert decoder.samples_for(1) == 1920 - 555
    assert decoder.decode_all(torch.randint(0, CODEBOOK, (7, QUANTIZERS))).shape[0] == 7 * 1920 - 555


@pytest.mark.parametrize(("first_chunk_frames", "chunk_frames"), [(1, 1), (1, 4), (1, 6), (2, 10)])
def test_streamed_chunks_concatenated_equal_the_one_shot_decode(decoder, first_chunk_frames, chunk_frames):
    codes = torch.randint(0, CODEBOOK, (30, QUANTIZERS), generator=torch.Generator().manual_seed(1))
    one_shot = decoder.decode_all(codes)

    chunks, _ = stream_in_pieces(decoder, codes, [1, 2, 1, 3, 5, 1, 1, 7, 4, 5], first_chunk_frames, chunk_frames)

    streamed = torch.cat(chunks)
    assert streamed.shape == one_shot.shape
    assert torch.allclose(streamed, one_shot, rtol=0, atol=1e-12)


def test_first_chunk_is_one_frame_then_one_more_then_chunks_double_up_to_the_chunk_size(decoder):
    codes = torch.randint(0, CODEBOOK, (21, QUANTIZERS), generator=torch.Generator().manual_seed(2))

    chunks, stream = stream_in_pieces(decoder, codes, [1] * 21, first_chunk_frames=1, chunk_frames=6)

    sizes = [len(chunk) for chunk in chunks]
    decoded_at = [i + 1 for i, size in enumerate(sizes) if size]
    assert sizes[0] == 1920 - 555  # 57 ms of audio after the first frame
    assert decoded_at == [1, 2, 4, 8, 14, 20, 21]  # chunks of 1, 1, 2, 4, 6, 6 frames, then the final 1
    assert sizes[1] == 1920 and sizes[2] == 0 and sizes[3] == 2 * 1920
    assert sum(sizes) == 21 * 1920 - 555 and stream.decodes == 7


def test_two_interleaved_streams_on_one_model_do_not_disturb_each_other(decoder):
    codes_a = torch.randint(0, CODEBOOK, (12, QUANTIZERS), generator=torch.Generator().manual_seed(3))
    codes_b = torch.randint(0, CODEBOOK, (12, QUANTIZERS), generator=torch.Generator().manual_seed(4))
    a = Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=2)
    b = Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=3)

    out_a, out_b = [], []
    for i in range(12):
        out_a.append(a.push(codes_a[i : i + 1], final=i == 11))
        out_b.append(b.push(codes_b[i : i + 1], final=i == 11))

    assert torch.allclose(torch.cat(out_a), decoder.decode_all(codes_a), rtol=0, atol=1e-12)
    assert torch.allclose(torch.cat(out_b), decoder.decode_all(codes_b), rtol=0, atol=1e-12)


def test_streams_pushed_together_decode_as_one_batch_and_each_equals_its_one_shot_decode(decoder):
    """Streams at the same stage decoding as many frames share one conv pass; others decode apart."""
    codes = [
        torch.randint(0, CODEBOOK, (14, QUANTIZERS), generator=torch.Generator().manual_seed(10 + i)) for i in range(4)
    ]
    streams = [Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=4) for _ in codes]
    start = [0, 0, 0, 3]  # the fourth stream starts three frames late
    outputs = [[] for _ in codes]
    for step in range(17):
        pushes = []
        for i, stream in enumerate(streams):
            frame = step - start[i]
            if 0 <= frame < 14:
                pushes.append((i, (stream, codes[i][frame : frame + 1], frame == 13)))
        for (i, _), samples in zip(pushes, push_many([push for _, push in pushes])):
            outputs[i].append(samples)

    for i in range(len(codes)):
        assert torch.allclose(torch.cat(outputs[i]), decoder.decode_all(codes[i]), rtol=0, atol=1e-12)


def test_the_models_own_one_shot_decode_is_unchanged_by_streaming(decoder):
    codes = torch.randint(0, CODEBOOK, (5, QUANTIZERS), generator=torch.Generator().manual_seed(5))
    untouched = copy.deepcopy(decoder.code2wav)
    for module in untouched.modules():  # a copy without the stream hooks
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
    stream = Code2WavStream(decoder)
    stream.push(codes[:2])  # leave a stream half-way

    with torch.no_grad():
        assert torch.equal(decoder.code2wav(codes.T[None]), untouched(codes.T[None]))


def test_stock_geometry_holds_back_555_samples():
    config = Qwen3OmniMoeCode2WavConfig(
        hidden_size=16, num_attention_heads=1, num_key_value_heads=1, intermediate_size=16,
        num_hidden_layers=1, decoder_dim=16, codebook_size=8,
    )
    decoder = Code2WavDecoder(Qwen3OmniMoeCode2Wav(config))
    assert decoder.samples_per_frame == 1920
    assert decoder.holdback_samples == 555
