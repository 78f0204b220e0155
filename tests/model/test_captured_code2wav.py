"""Captured code2wav chunks (`compute: {graphs: auto}`) give what the eager path gives, chunk by chunk."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from benchmarks.dispatch_counts import DispatchCounts
from graph.messages import AudioOut, CodecFrames, HiddenChunk, TurnDone
from graph.runtime import GraphRuntime
from nodes.qwen3_omni.captured_code2wav import MAX_FRAMES, attach
from nodes.qwen3_omni.code2wav_stream import Code2WavStream, push_many
from tests.model.test_code2wav_streaming_steps import make_decoder, random_codes
from tests.model.test_talker_code2wav_nodes import collect, profile, prompt_chunk

ATOL = 1e-5  # float32: the captured transformer attends per stream, the eager one over one packed sequence


def _pair(decoder_dim: int = 32, **kwargs):
    """The same weights twice: an eager decoder and one with its chunk unit."""
    return make_decoder(decoder_dim, **kwargs), attach(make_decoder(decoder_dim, **kwargs))


DECODERS = {
    "narrow": dict(decoder_dim=32),  # every conv a matmul
    "wide": dict(decoder_dim=64, hidden_size=64, seed=1, perturbation=0.05),  # conv1d for the first convs
    "grouped": dict(decoder_dim=32, seed=2, heads=4, kv_heads=2),  # grouped-query attention
}


def _assert_same(want: list[torch.Tensor], got: list[torch.Tensor], where: object) -> None:
    for a, b in zip(want, got, strict=True):
        assert a.shape == b.shape, where
        if a.numel():
            assert (a - b).abs().max().item() <= ATOL, where


@pytest.mark.parametrize("layout", DECODERS)
def test_captured_chunks_equal_the_eager_ones_as_streams_join_and_leave(layout):
    eager, captured = _pair(**DECODERS[layout])
    unit = captured.chunk_unit
    assert unit is not None
    # Streams decoding a frame per push (chunks of 1: due together, one group per push) join
    # and leave: A, B, C at push 0 (first chunks, 3 rows in 4), D at 2, E and F at 3 (6 rows in
    # 8), C leaves after push 4 (interrupted: no more pushes), A ends with a final push at 6;
    # G, on the default 1, 1, 2, 4, 6 schedule, joins at 1 with 1-2 frames per push, due now
    # with the others' group and now alone.
    joins = {"A": 0, "B": 0, "C": 0, "D": 2, "E": 3, "F": 3, "G": 1}
    leaves = {"C": 4, "A": 6}
    streams = {name: (Code2WavStream(eager, *schedule), Code2WavStream(captured, *schedule))
               for name, schedule in ((name, (1, 1) if name != "G" else (1, 6)) for name in joins)}
    for push in range(12):
        live = [name for name, start in joins.items() if start <= push <= leaves.get(name, 99)]
        codes = {name: random_codes(1 + (push % 2 if name == "G" else 0), 100 * push + index) for index, name in enumerate(live)}
        final = {name: name == "A" and push == leaves["A"] for name in live}
        want = push_many([(streams[name][0], codes[name], final[name]) for name in live])
        got = push_many([(streams[name][1], codes[name], final[name]) for name in live])
        _assert_same(want, got, (layout, push))
    assert unit.replays > 0 and unit.chunks > 0
    assert {(4, 1, True), (4, 1, False), (8, 1, False)} <= set(unit._graphs)  # padding rows ran: 3 in 4, 5 and 6 in 8
    assert any(key[1] > 1 for key in unit._graphs)


def test_a_stream_moves_between_the_captured_and_the_eager_path():
    eager, captured = _pair()
    unit = captured.chunk_unit
    want_stream, got_stream = Code2WavStream(eager, 2, 2), Code2WavStream(captured, 2, 2)
    # Captured, then a chunk too long for the unit (eager, its state back as lists), then
    # captured again (its lists made flat again): each equal to the eager stream's.
    for push, frames in enumerate((2, 2, MAX_FRAMES + 1, 2, 3, 2)):
        codes = random_codes(frames, push)
        _assert_same(want_stream.push(codes), got_stream.push(codes), push)
        assert (got_stream._state is None) == (frames > MAX_FRAMES), push
    assert unit.chunks == 5


def test_a_stream_whose_first_chunks_ran_eager_is_captured_with_its_cache_short_of_the_window():
    eager, captured = _pair()
    unit = captured.chunk_unit
    want_stream, got_stream = Code2WavStream(eager, 1, 1), Code2WavStream(captured, 1, 1)
    unit._failed.add(1)  # as if size 1 could not be captured: eager, the state as lists
    for push in range(6):
        if push == 2:
            unit._failed.discard(1)  # 2 frames in: its KV padded to the window's 7 columns
        codes = random_codes(1, push)
        _assert_same([want_stream.push(codes)], [got_stream.push(codes)], push)
        assert (got_stream._state is None) == (push < 2), push
    assert unit.chunks == 4


def test_graphs_off_keeps_the_eager_path():
    decoder = attach(make_decoder(32), "off")
    assert decoder.chunk_unit is None
    stream = Code2WavStream(decoder)
    stream.push(random_codes(1, 0))
    assert stream._state is None and stream._cache is not None


def test_a_deferred_capture_runs_the_chunk_as_written_until_it_has_run():
    eager, captured = _pair()
    unit = captured.chunk_unit
    queued = []
    unit.defer = queued.append
    want_stream, got_stream = Code2WavStream(eager, 1, 1), Code2WavStream(captured, 1, 1)
    for push, (queues, replays) in enumerate(((1, 0), (1, 0), (0, 1), (0, 2))):
        # The first chunk and the first later one are deferred (run as written), the rest replayed.
        codes = random_codes(1, push)
        _assert_same([want_stream.push(codes)], [got_stream.push(codes)], push)
        assert (len(queued), unit.replays) == (queues, replays), push
        while queued:
            queued.pop()()  # idle compute runs the capture
    assert set(unit._graphs) == {(1, 1, True), (1, 1, False)}


def test_under_a_dispatch_counter_the_chunk_runs_as_written_and_equal():
    eager, captured = _pair()
    want_stream, got_stream = Code2WavStream(eager), Code2WavStream(captured)
    for push in range(5):
        codes = random_codes(2, push)
        want = want_stream.push(codes)
        with DispatchCounts(torch.device("cpu")) as counts:
            got = got_stream.push(codes)
        _assert_same([want], [got], push)
        # No device value read into the host: the one counted is the rotary module's
        # `inv_freq.to(x.device)`, which on CPU names the host (a no-op on CUDA).
        assert counts.host_syncs <= 1, push
    assert captured.chunk_unit.replays == 0 and captured.chunk_unit.chunks > 0


def test_streamed_captured_chunks_equal_the_one_shot_decode():
    _, captured = _pair()
    stream = Code2WavStream(captured)
    codes = random_codes(23, 5)
    chunks = [stream.push(codes[i : i + 1], final=i == 22) for i in range(23)]
    streamed = torch.cat([chunk for chunk in chunks if chunk.numel()])
    one_shot = captured.decode_all(codes)
    assert streamed.shape == one_shot.shape
    assert (streamed - one_shot).abs().max().item() <= ATOL
    assert captured.chunk_unit.replays > 0


async def test_the_node_captures_in_idle_compute_and_replays_its_chunks_with_graphs_auto(tiny_checkpoint):
    for graphs in ("off", "auto"):
        runtime = GraphRuntime.from_config({**profile(tiny_checkpoint), "compute": {"graphs": graphs}})
        await runtime.start()
        try:
            unit = runtime.nodes["code2wav"].decoder.chunk_unit
            assert (unit is None) == (graphs == "off")
            for turn in (1, 2):  # the first reply's keys are captured in idle time; the second replays them
                session = await runtime.open_session(f"s{turn}", config={"voice": "chelsie"})
                await session.send("hidden", prompt_chunk(runtime))
                for i, token in enumerate([104, 105, 33]):
                    await session.send("hidden", HiddenChunk(turn_id=1, response_id="r", token_ids=(token,), final=i == 2))
                await session.send("hidden", TurnDone(turn_id=1, response_id="r"))
                out = await collect(session)
                await session.close()
                frames = np.concatenate([m.codes for m in out if isinstance(m, CodecFrames) and len(m.codes)])
                audio = np.concatenate([m.samples for m in out if isinstance(m, AudioOut)])
                one_shot = runtime.nodes["code2wav"].decoder.decode_all(torch.from_numpy(frames)).numpy()
                assert np.allclose(audio, one_shot, rtol=0, atol=1e-4), (graphs, turn)
                if unit is not None:
                    async with asyncio.timeout(20):
                        while unit._pending:  # the idle captures
                            await asyncio.sleep(0.01)
            if unit is not None:
                assert unit.replays > 0 and unit._graphs
        finally:
            await runtime.stop(0)
