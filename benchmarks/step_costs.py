"""What one engine step costs the host: aten operators, host syncs and wall time per step.

    .venv/bin/python -m benchmarks.step_costs [--graphs auto|off|both]

- `thinker`: one decode step of 16 sessions through the executor's batch function (`run_calls`,
  the function the thinker node's shared executor runs): operators and host syncs per step.
- `talker`: one frame of one reply (`step_replies`: the talker forward, its code, the code
  predictor's residual codes): operators, host syncs and ms per frame.

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
# Frames timed per measurement of the talker's ms per frame (after as many to warm up).
TALKER_FRAMES = 24


def thinker_step_costs(omni: Any, sessions: int = THINKER_BATCH, steps: int = 4) -> dict[str, Any]:
    """Operators and host syncs of one decode step of `sessions` sessions at once (the median
    step of `steps`, after one step that is not counted)."""
    from nodes.qwen3_omni.batched_thinker import ThinkerRunner, _Call, run_calls
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession

    runner = ThinkerRunner.for_model(omni)
    opened = []
    for index in range(sessions):
        text = " ".join(f"word{(index + w) % 97}" for w in range(6 + index % 5))
        turn = build_turn_inputs(omni, system_prompt="You are terse.", text=text, add_generation_prompt=True)
        session = ThinkerSession(omni, Sampling(ignore_eos=True), max_reply_tokens=steps + 4, max_seq_len=4096)
        session.prefill(turn.tensors())
        opened.append(session)
    try:
        _step(runner, run_calls, _Call, opened)  # the first token comes from the prefill's logits
        counted = []
        for _ in range(steps):
            with DispatchCounts(omni.device) as counts:
                _step(runner, run_calls, _Call, opened)
            counted.append((counts.ops, counts.host_syncs))
    finally:
        for session in opened:
            session.close()
    ops, syncs = sorted(counted)[len(counted) // 2]
    return {"batch": sessions, "ops_per_step": ops, "host_syncs_per_step": syncs}


def _step(runner: Any, run_calls: Any, call: Any, sessions: list[Any]) -> None:
    for result in run_calls(runner, [call(session.decode_work()) for session in sessions]):
        if isinstance(result, BaseException):
            raise result


def talker_frame_costs(omni: Any, frames: int = TALKER_FRAMES) -> dict[str, Any]:
    """One reply's talker frames, one `step_replies` call each: ms per frame (the best of three
    runs of `frames` frames), operators and host syncs of one frame."""
    from benchmarks.talker_batching import _replies
    from nodes.qwen3_omni.talker_engine import TalkerModel, step_replies

    talker = TalkerModel(omni.model)
    best = float("inf")
    ops = syncs = 0
    for _ in range(3):
        (reply,) = _replies(omni, talker, 1, 2 * frames + 4)
        step_replies([reply])  # the prefill
        for _ in range(frames):  # warm-up frames
            step_replies([reply])
        with DispatchCounts(omni.device) as counts:
            step_replies([reply])
        ops, syncs = counts.ops, counts.host_syncs
        started = time.perf_counter()
        for _ in range(frames):
            step_replies([reply])
        best = min(best, (time.perf_counter() - started) / frames)
    return {"ms_per_frame": round(best * 1000, 3), "ops_per_frame": ops, "host_syncs_per_frame": syncs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=1, help="the random checkpoint's scale (see thinker_batching)")
    args = parser.parse_args(argv)
    from benchmarks.thinker_batching import _load

    omni = _load(args.scale)
    print(json.dumps({"thinker": thinker_step_costs(omni), "talker": talker_frame_costs(omni)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
