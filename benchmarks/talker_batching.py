"""Aggregate talker frames/s (talker + code predictor) at N concurrent replies, batched or alone.

    .venv/bin/python -m benchmarks.talker_batching [--sessions 1,4,16] [--frames 24] [--scale 1]

N sessions, each with its own user turn (20..~400 talker positions) and a reply whose text is
all there, step their replies for `--frames` frames:

- `alone`: each reply's frame is its own `step_replies([reply])` call (one talker forward and
  one code-predictor pass per session per frame);
- `batched`: one `step_replies(all_replies)` per frame, as the talker node's shared executor
  runs the frames that sessions want at the same moment.

Reported: frames/s over all sessions, and the machine's load average (the machine is shared).
`--scale N`: the larger random profile (`build_tiny_checkpoint(scale=N)`).

`--prefills 1,8,32` (issue 12): N replies whose prefills start together, of `--prefill-positions`
each (9: the assistant block alone, its 61-position user turn already in the talker's kept KV;
70: that user turn and the block, nothing kept), timed as `prefill_replies(all)` (`batched`:
longest first, as many as fit in one forward) against one `prefill_replies([reply])` each
(`alone`); ms for all N prefills and per prefill (median of `--repeats`). `--prefills 0`: none.

`--pause-ms 0,30,100` (docs/notebook/2026-12-02-unit-trace.md): one batched step of `--sessions` replies timed
after the thread paused that long, asleep and spinning (median of 30 steps each): on a shared
VM the caches lose a step's working set within tens of milliseconds even while the thread spins,
which is why a step costs more inside an engine than back to back here (docs/notebook/2026-12-02-unit-trace.md). Use
`--threads 1`: with 2, a step after the whole process slept also wakes torch's OpenMP pool
(6.9-9.5 ms a step here), which an engine, busy with other work every few ms, does not pay.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.thinker_batching import _load


def _replies(omni: Any, talker: Any, count: int, frames: int) -> list[Any]:
    import torch

    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerLimits, TalkerReply, TalkerSampling

    replies = []
    for index in range(count):
        words = 3 + (index * 11) % 60
        text = " ".join(f"word{(index + w) % 97}" for w in range(words))
        prompt = build_turn_inputs(omni, system_prompt="You are terse.", text=text, add_generation_prompt=True)
        history = TalkerHistory(talker)
        history.add_prompt(torch.tensor(prompt.input_ids, dtype=torch.long), None)
        reply_ids = omni.tokenizer(" ".join(["hello there"] * 20), add_special_tokens=False).input_ids
        reply = TalkerReply(talker, history, history.assistant_header() or list(omni.tokens.assistant_header),
                            sampling=TalkerSampling(do_sample=False), limits=TalkerLimits(max_frames=frames + 2))
        history.add_reply(reply_ids)
        reply.add_text(reply_ids, final=True)
        replies.append(reply)
    return replies


def measure(omni: Any, talker: Any, count: int, frames: int, mode: str) -> dict[str, Any]:
    from nodes.qwen3_omni.talker_engine import step_replies

    replies = _replies(omni, talker, count, frames)
    step_replies(replies)  # prefills (not timed)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    for _ in range(frames):
        if mode == "batched":
            results = step_replies(replies)
        else:
            results = [step_replies([reply])[0] for reply in replies]
        for result in results:
            if isinstance(result, BaseException):
                raise result
    wall = time.perf_counter() - started
    return {
        "mode": mode,
        "sessions": count,
        "frames_per_session": frames,
        "frames_per_s": round(count * frames / wall, 1),
        "ms_per_frame_step": round(wall / frames * 1000, 2),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


def measure_after_pause(omni: Any, talker: Any, count: int, pause_s: float, how: str, steps: int = 30) -> dict[str, Any]:
    """Median ms of one `step_replies` of `count` replies after pausing `pause_s` ("sleep" or "spin")."""
    from nodes.qwen3_omni.talker_engine import step_replies

    walls = []
    replies: list[Any] = []
    for index in range(steps):
        if index % 10 == 0:  # fresh replies (prefilled, untimed) before they reach their frame budget
            replies = _replies(omni, talker, count, 24)
            step_replies(replies)
            step_replies(replies)
        if how == "sleep":
            time.sleep(pause_s)
        else:
            until = time.perf_counter() + pause_s
            while time.perf_counter() < until:
                pass
        started = time.perf_counter()
        step_replies(replies)
        walls.append(time.perf_counter() - started)
    return {"sessions": count, "pause_ms": round(pause_s * 1000), "how": how, "ms_per_step": round(sorted(walls)[len(walls) // 2] * 1000, 2)}


def _prefill_replies(omni: Any, talker: Any, count: int, positions: int) -> list[Any]:
    """`count` replies whose prefills put `positions` positions through the talker (9: only the
    assistant block, the user turn kept; more: a user turn of `positions - 9` and the block)."""
    import torch

    from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerReply, TalkerSampling, prefill_user_turns

    block = 9
    user = positions - block if positions > block else 61
    words = omni.tokenizer(" ".join(f"word{i}" for i in range(2 * user)), add_special_tokens=False).input_ids
    replies = []
    for index in range(count):
        history = TalkerHistory(talker)
        filler = words[index % 7 : index % 7 + user - 2]
        history.add_user_part(torch.tensor([talker.im_start_id, talker.user_id, *filler]))
        if positions <= block:
            prefill_user_turns(history)
        reply = TalkerReply(talker, history, list(omni.tokens.assistant_header), sampling=TalkerSampling(do_sample=False))
        reply.add_text([104 + index % 50], final=True)
        replies.append(reply)
    return replies


def measure_prefill(omni: Any, talker: Any, count: int, positions: int, mode: str, repeats: int) -> dict[str, Any]:
    from nodes.qwen3_omni.talker_engine import prefill_replies
    from nodes.qwen3_omni.talker_slots import TalkerSlots

    walls = []
    load_before = os.getloadavg()[0]
    for _ in range(repeats):
        replies = _prefill_replies(omni, talker, count, positions)
        started = time.perf_counter()
        if mode == "batched":
            results = prefill_replies(replies)
        else:
            results = [prefill_replies([reply])[0] for reply in replies]
        walls.append(time.perf_counter() - started)
        for reply, result in zip(replies, results):
            if isinstance(result, BaseException):
                raise result
            TalkerSlots.leave(reply)
    wall = sorted(walls)[len(walls) // 2]
    return {
        "mode": mode,
        "prefills": count,
        "positions": positions,
        "ms_all": round(wall * 1000, 2),
        "ms_per_prefill": round(wall * 1000 / count, 3),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,4,16")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--mode", default="both", choices=("alone", "batched", "both"))
    parser.add_argument("--prefills", default="1,8,32")
    parser.add_argument("--prefill-positions", default="9,70")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pause-ms", default="", help="e.g. 0,30,100: one step timed after each pause (default: none)")
    parser.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="torch threads (default: up to 2)")
    args = parser.parse_args(argv)
    import torch

    from nodes.qwen3_omni.talker_engine import TalkerModel

    torch.set_num_threads(args.threads)
    omni = _load(args.scale)
    talker = TalkerModel(omni.model)
    measure(omni, talker, 2, 4, "batched")  # warm-up
    modes = ("alone", "batched") if args.mode == "both" else (args.mode,)
    for mode in modes:
        for count in (int(n) for n in args.sessions.split(",") if n):
            row = measure(omni, talker, count, args.frames, mode)
            print(f"scale={args.scale} talker {mode:8s} N={count:3d}  {row['frames_per_s']:8.1f} frames/s  "
                  f"{row['ms_per_frame_step']:8.2f} ms/step  load {row['load_1min'][0]}->{row['load_1min'][1]} "
                  f"({row['cpus']} cpus)", flush=True)
    counts = [int(n) for n in args.prefills.split(",") if int(n) > 0]
    for positions in (int(n) for n in args.prefill_positions.split(",")):
        for count in counts:
            for mode in modes:
                row = measure_prefill(omni, talker, count, positions, mode, args.repeats)
                print(f"scale={args.scale} prefill {mode:8s} N={count:3d} x {positions:3d} positions  "
                      f"{row['ms_all']:8.2f} ms  {row['ms_per_prefill']:7.3f} ms/prefill  "
                      f"load {row['load_1min'][0]}->{row['load_1min'][1]} ({row['cpus']} cpus)", flush=True)
    for pause_ms in (float(n) for n in args.pause_ms.split(",") if n):
        for count in (int(n) for n in args.sessions.split(",") if n):
            for how in ("sleep", "spin"):
                row = measure_after_pause(omni, talker, count, pause_ms / 1000.0, how)
                print(f"scale={args.scale} step after a {row['pause_ms']:4d} ms pause ({how:5s}) N={count:3d}  "
                      f"{row['ms_per_step']:6.2f} ms/step", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
