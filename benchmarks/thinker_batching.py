"""Aggregate thinker decode tokens/s at N concurrent sessions, the way the thinker node drives it.

    .venv/bin/python -m benchmarks.thinker_batching [--sessions 1,4,16] [--tokens 32] [--scale 1]
                                                    [--mode per-session|batched|both] [--json OUT]

Each of N sessions gets its own conversation (prefixes of different lengths, ~60..800 tokens,
prefilled before the clock starts), then all N decode `--tokens` reply tokens at once from N
asyncio tasks, as N live sessions' thinker nodes do:

- `per-session`: every decode step is its own `compute.run(session.decode_step)` on a
  `ComputePool` (the node before cross-session batching: one forward per session per step);
- `batched`: every decode step is submitted to the shared thinker executor
  (`ThinkerExecutor.decode`), which runs the steps ready at the same moment as one forward.

Reported: tokens/s over all sessions (N * tokens / wall time), ms per step as one session sees
it, and the machine's load average before and after (the machine is shared: read the numbers
with it). `--scale N` builds the random checkpoint N times wider and deeper
(`build_tiny_checkpoint(scale=N)`; scale 8 = a 16-layer, ~38 M-parameter thinker), so that ratios
reflect compute and not only Python overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any


def _load(scale: int) -> Any:
    from nodes.qwen3_omni.checkpoint import build_tiny_checkpoint
    from nodes.qwen3_omni.model import OmniModel

    path = os.path.join(tempfile.gettempdir(), f"sgl-omni-bench-scale{scale}")
    if not os.path.isfile(os.path.join(path, "sgl_omni_tiny.json")):
        build_tiny_checkpoint(path, seed=0, scale=scale)
    return OmniModel.load(path, device="cpu", dtype="float32")


def _sessions(omni: Any, count: int, tokens: int) -> list[Any]:
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession

    sessions = []
    for index in range(count):
        words = 8 + (index * 37) % 118  # prefixes of different lengths, ~60..800 tokens
        text = " ".join(f"word{(index + w) % 97}" for w in range(words))
        turn = build_turn_inputs(omni, system_prompt="You are terse.", text=text, add_generation_prompt=True)
        # ignore_eos: every session decodes all `tokens` (the tiny model ends its replies after 11).
        session = ThinkerSession(omni, Sampling(ignore_eos=True), max_reply_tokens=tokens + 1, max_seq_len=4096)
        session.prefill(turn.tensors())
        sessions.append(session)
    return sessions


async def _decode_all(omni: Any, sessions: list[Any], tokens: int, mode: str) -> float:
    from graph.executor import ComputePool

    compute = ComputePool(threads=4)
    executor = None
    if mode == "batched":
        from nodes.qwen3_omni.batched_thinker import ThinkerExecutor

        executor = ThinkerExecutor(compute, omni, max_batch=64)

    async def one(session: Any) -> None:
        for _ in range(tokens):
            if executor is None:
                step = await compute.run(session.decode_step)
            else:
                step = await executor.decode(session)
            assert step.finish_reason is None, step

    try:
        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in sessions))
        wall = time.perf_counter() - started
        if executor is not None:
            _last_batches["steps_per_batch"] = round(executor.batcher.items_run / max(1, executor.batcher.batches_run), 2)
        return wall
    finally:
        compute.shutdown()


_last_batches: dict[str, float] = {}


def measure(omni: Any, count: int, tokens: int, mode: str) -> dict[str, Any]:
    sessions = _sessions(omni, count, tokens)
    load_before = os.getloadavg()[0]
    _last_batches.clear()
    wall = asyncio.run(_decode_all(omni, sessions, tokens, mode))
    for session in sessions:
        session.close() if hasattr(session, "close") else None
    return {
        "mode": mode,
        "sessions": count,
        "tokens_per_session": tokens,
        "tok_per_s": round(count * tokens / wall, 1),
        "ms_per_step": round(wall / tokens * 1000, 2),
        "steps_per_batch": _last_batches.get("steps_per_batch"),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--mode", default="per-session", choices=("per-session", "batched", "both"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    omni = _load(args.scale)
    modes = ("per-session", "batched") if args.mode == "both" else (args.mode,)
    measure(omni, 1, 4, modes[0])  # warm-up
    rows = []
    for mode in modes:
        for count in (int(n) for n in args.sessions.split(",")):
            row = measure(omni, count, args.tokens, mode)
            row["scale"] = args.scale
            rows.append(row)
            print(f"scale={args.scale} {mode:11s} N={count:3d}  {row['tok_per_s']:9.1f} tok/s  "
                  f"{row['ms_per_step']:8.2f} ms/step  steps/batch {row['steps_per_batch']}  load {row['load_1min'][0]}->{row['load_1min'][1]} "
                  f"({row['cpus']} cpus)", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
