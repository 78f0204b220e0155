"""What one engine step costs the host: aten operators, host syncs and wall time per step.

    .venv/bin/python -m benchmarks.step_costs [--graphs auto|off|both] [--stages thinker,talker,code2wav]
                                              [--sampling greedy|sampled|seeded]

- `thinker`: one decode step of 16 sessions through the executor's batch function (`run_calls`,
  the function the thinker node's shared executor runs): operators and host syncs per step, with
  `compute: {graphs}` as `--graphs` says (auto: the captured step, nodes/qwen3_omni/
  captured_thinker.py; off: eager; both: each, alternating, with ms per step at batch 1 and 16,
  under `thinker.b1.off`, `thinker.b16.auto`, ...). `--sampling`: how every session chooses
  (`THINKER_SAMPLING`): greedy (the default), sampled (temperature, top-k, top-p, no seed: the
  rows share the default generator), seeded (the same with a seed per session: a draw each).
- `talker`: one frame of one reply (`step_replies`: the talker forward, its code, the code
  predictor's residual codes): operators, host syncs and ms per frame, with the profile's
  `compute: {graphs}` as `--graphs` says (auto: the captured frame, nodes/qwen3_omni/captured.py;
  off: eager; both: each, alternating in one run, under `talker.off` / `talker.auto`).
- `code2wav`: one streaming chunk (`push_many`) of 1 and of 4 streams, of 1 frame (a reply's
  first chunks) and of 6 (the steady chunk), each stream past its sliding window: operators
  and ms per chunk, eager (`off`) and captured (`auto`: captured_code2wav.py), alternating in
  one run. Under the counter the captured chunk runs as written on CPU (as the talker's frame).

These are the figures that bound a GPU engine (every operator a launch, every sync a stall), and
they are properties of the code, so they are measured on CPU too (`benchmarks/dispatch_counts.py`).
`sgl-omni bench components` reports them under `components.thinker` and `components.talker`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks.dispatch_counts import DispatchCounts

THINKER_BATCH = 16
# Steps timed per run of the thinker's ms per step (`--graphs both`).
THINKER_STEPS = 16
# `--sampling`: each thinker session's sampling settings (`thinker_sampling.Sampling` fields).
THINKER_SAMPLING = {
    "greedy": {},
    "sampled": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
    "seeded": {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "seed": 0},
}
# Frames timed per measurement of the talker's ms per frame (after as many to warm up).
TALKER_FRAMES = 24


def thinker_step_costs(omni: Any, sessions: int = THINKER_BATCH, steps: int = 4, graphs: str | None = None,
                       timed: int = 0, runs: int = 3, sampling: str = "greedy") -> dict[str, Any]:
    """Operators and host syncs of one decode step of `sessions` sessions at once (the median
    step of `steps`, after one step that is not counted), with `compute: {graphs}` = `graphs`
    (None: the runner's setting). Under the counter the captured step runs as written on CPU
    (the trace cannot run under a Python dispatch mode): the same aten calls, counted. With
    `timed`: also ms per step, the best of `runs` runs of `timed` steps (what they replay is
    captured before them). `sampling`: a `THINKER_SAMPLING` name (seeded: session i's seed is i)."""
    from nodes.qwen3_omni.batched_thinker import ThinkerRunner, _Call, run_calls
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession
    from nodes.qwen3_omni.thinker_requests import Choice, Feed

    runner = ThinkerRunner.for_model(omni)
    setting = runner.graphs
    if graphs is not None:
        runner.graphs = graphs
    opened = []
    for index in range(sessions):
        text = " ".join(f"word{(index + w) % 97}" for w in range(6 + index % 5))
        turn = build_turn_inputs(omni, system_prompt="You are terse.", text=text, add_generation_prompt=True)
        settings = dict(THINKER_SAMPLING[sampling])
        if "seed" in settings:
            settings["seed"] = index
        session = ThinkerSession(omni, Sampling(ignore_eos=True, **settings), max_reply_tokens=steps + runs * timed + 8,
                                 max_seq_len=4096)
        session.prefill(turn.tensors())
        opened.append(session)
    best = float("inf")
    try:
        _step(runner, run_calls, _Call, opened)  # the first token comes from the prefill's logits
        _step(runner, run_calls, _Call, opened)  # the first feeds (capture what they replay)
        counted = []
        for _ in range(steps):
            with DispatchCounts(omni.device) as counts:
                _step(runner, run_calls, _Call, opened)
            counted.append((counts.ops, counts.host_syncs))
        unit = runner.step_unit
        replays = 0 if unit is None else unit.replays
        for _ in range(runs if timed else 0):
            if unit is not None:
                unit.prepare([Feed(s._slot, 0, 0, s, Choice(s.sampling)) for s in opened], timed + 1)
            started = time.perf_counter()
            for _ in range(timed):
                _step(runner, run_calls, _Call, opened)
            best = min(best, (time.perf_counter() - started) / timed)
        replays = (0 if unit is None else unit.replays) - replays
    finally:
        runner.graphs = setting
        for session in opened:
            session.close()
    ops, syncs = sorted(counted)[len(counted) // 2]
    figures = {"batch": sessions, "graphs": graphs or setting, "sampling": sampling, "ops_per_step": ops,
               "host_syncs_per_step": syncs}
    if timed:
        figures.update(ms_per_step=round(best * 1000, 3), replayed_steps=replays)
    return figures


def thinker_both(omni: Any, sessions: int, timed: int = THINKER_STEPS, rounds: int = 3,
                 sampling: str = "greedy") -> dict[str, Any]:
    """The eager and the captured thinker step of `sessions` sessions in one run, alternating
    (the machine is shared: a slow moment hits both); each the best of `rounds` x 2 runs."""
    results: dict[str, list[dict[str, Any]]] = {"off": [], "auto": []}
    for _ in range(rounds):
        for graphs in results:
            results[graphs].append(thinker_step_costs(omni, sessions, steps=1, graphs=graphs, timed=timed, runs=2,
                                                      sampling=sampling))
    best = {graphs: min(figures, key=lambda f: f["ms_per_step"]) for graphs, figures in results.items()}
    return {**best, "ms_ratio": round(best["auto"]["ms_per_step"] / best["off"]["ms_per_step"], 3)}


def _step(runner: Any, run_calls: Any, call: Any, sessions: list[Any]) -> None:
    for result in run_calls(runner, [call(session.decode_work()) for session in sessions]):
        if isinstance(result, BaseException):
            raise result


def talker_frame_costs(omni: Any, frames: int = TALKER_FRAMES, graphs: str = "auto", runs: int = 3,
                       talker: Any = None) -> dict[str, Any]:
    """One reply's talker frames, one `step_replies` call each, with `compute: {graphs}` =
    `graphs`: ms per frame (the best of `runs` runs of `frames` frames, after as many frames of
    warm-up: the captured path has captured its frame by then), operators and host syncs of one
    frame. Under the counter the captured path runs as written on CPU (the trace it replays
    cannot run under a Python dispatch mode): the same aten calls, counted. `talker`: a
    `TalkerModel` to reuse (its captures with it), else a new one."""
    from benchmarks.talker_batching import _replies
    from nodes.qwen3_omni.talker_engine import TalkerModel, frame_unit, step_replies

    talker = talker or TalkerModel(omni.model, graphs=graphs)
    best = float("inf")
    ops = syncs = 0
    for _ in range(runs):
        (reply,) = _replies(omni, talker, 1, 2 * frames + 4)
        step_replies([reply])  # the prefill
        for _ in range(frames):  # warm-up frames
            step_replies([reply])
        unit = frame_unit(talker)
        if unit is not None:  # what the counted and timed frames replay, captured before them
            unit.prepare([reply], frames + 2)
        with DispatchCounts(omni.device) as counts:
            step_replies([reply])
        ops, syncs = counts.ops, counts.host_syncs
        started = time.perf_counter()
        for _ in range(frames):
            step_replies([reply])
        best = min(best, (time.perf_counter() - started) / frames)
    figures = {"graphs": graphs, "ms_per_frame": round(best * 1000, 3), "ops_per_frame": ops, "host_syncs_per_frame": syncs}
    unit = talker.frame_unit
    if graphs == "auto":
        figures["replayed_frames"] = 0 if unit is None else unit.replays
    return figures


def talker_both(omni: Any, runs: int = 3) -> dict[str, Any]:
    """The eager and the captured talker in one run, their timed runs alternating (the machine is
    shared: a slow moment hits both): {"off": ..., "auto": ..., "ms_ratio", "ops_ratio"}."""
    from nodes.qwen3_omni.talker_engine import TalkerModel

    results: dict[str, list[dict[str, Any]]] = {"off": [], "auto": []}
    talkers = {graphs: TalkerModel(omni.model, graphs=graphs) for graphs in results}  # captures kept across runs
    for _ in range(runs):
        for graphs in results:
            results[graphs].append(talker_frame_costs(omni, graphs=graphs, runs=1, talker=talkers[graphs]))
    best = {graphs: min(figures, key=lambda f: f["ms_per_frame"]) for graphs, figures in results.items()}
    return {**best, "ms_ratio": round(best["auto"]["ms_per_frame"] / best["off"]["ms_per_frame"], 3),
            "ops_ratio": round(best["auto"]["ops_per_frame"] / max(best["off"]["ops_per_frame"], 1), 3)}


# (streams, frames) of the code2wav chunks measured: a reply's first chunks and the steady ones.
CODE2WAV_CHUNKS = ((1, 1), (1, 6), (4, 1), (4, 6))


def code2wav_chunk_costs(code2wav: Any, chunks: tuple[tuple[int, int], ...] = CODE2WAV_CHUNKS, rounds: int = 5,
                         calls: int = 8) -> dict[str, Any]:
    """Streaming chunks of `code2wav` eager and captured, on streams warmed past the sliding
    window, their timed rounds alternating: {"b1_f6": {"off": {ms, ops}, "auto": {...},
    "ms_ratio"}, ...}; ms per chunk the best of `rounds` rounds of `calls` chunks."""
    import torch

    from nodes.qwen3_omni.captured_code2wav import attach
    from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream, push_many

    decoders = {"off": Code2WavDecoder(code2wav), "auto": attach(Code2WavDecoder(code2wav))}
    quantizers = int(code2wav.config.num_quantizers)
    codebook = int(code2wav.config.codebook_size)
    warm = int(code2wav.config.sliding_window) // 6 + 2  # chunks of 6 frames: the KV full

    def push(streams: list[Any], frames: int) -> None:
        push_many([(stream, torch.randint(0, codebook, (frames, quantizers)), False) for stream in streams])

    figures: dict[str, Any] = {}
    for count, frames in chunks:
        streams = {}
        for graphs, decoder in decoders.items():
            streams[graphs] = [Code2WavStream(decoder, 6, 6) for _ in range(count)]
            for _ in range(warm):
                push(streams[graphs], 6)
            for stream in streams[graphs]:  # chunks of `frames` from here on
                stream.first_chunk_frames = stream.chunk_frames = frames
            if decoder.chunk_unit is not None:
                decoder.chunk_unit.prepare(count, frames)
            push(streams[graphs], frames)
        best = {graphs: float("inf") for graphs in decoders}
        ops = {}
        for graphs in decoders:
            with DispatchCounts(torch.device("cpu")) as counts:
                push(streams[graphs], frames)
            ops[graphs] = counts.ops
        for _ in range(rounds):
            for graphs in decoders:
                started = time.perf_counter()
                for _ in range(calls):
                    push(streams[graphs], frames)
                best[graphs] = min(best[graphs], (time.perf_counter() - started) / calls)
        figures[f"b{count}_f{frames}"] = {
            **{graphs: {"ms_per_chunk": round(best[graphs] * 1000, 3), "ops_per_chunk": ops[graphs]} for graphs in decoders},
            "ms_ratio": round(best["auto"] / best["off"], 3),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=1, help="the random checkpoint's scale (see thinker_batching)")
    parser.add_argument("--graphs", choices=("auto", "off", "both"), default="auto",
                        help="compute.graphs: auto (captured steps and frames), off (eager), both (one run; "
                             "the thinker timed at batch 1 and 16)")
    parser.add_argument("--stages", default="thinker,talker,code2wav", help="which of thinker,talker,code2wav to measure")
    parser.add_argument("--sampling", choices=tuple(THINKER_SAMPLING), default="greedy",
                        help="how every thinker session chooses its tokens (greedy; sampled: T 0.8, top-k 50, "
                             "top-p 0.95, no seed; seeded: the same, a seed per session)")
    args = parser.parse_args(argv)
    from benchmarks.thinker_batching import _load

    omni = _load(args.scale)
    stages = args.stages.split(",")
    figures: dict[str, Any] = {}
    if args.graphs == "both":
        if "thinker" in stages:
            figures["thinker"] = {f"b{sessions}": thinker_both(omni, sessions, sampling=args.sampling)
                                  for sessions in (1, THINKER_BATCH)}
        if "talker" in stages:
            figures["talker"] = talker_both(omni)
    else:
        if "thinker" in stages:
            figures["thinker"] = thinker_step_costs(omni, graphs=args.graphs, sampling=args.sampling)
        if "talker" in stages:
            figures["talker"] = talker_frame_costs(omni, graphs=args.graphs)
    if "code2wav" in stages:
        figures["code2wav"] = code2wav_chunk_costs(omni.code2wav)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
