"""The GPU bench: a random-weight Qwen3-Omni-30B-A3B on one GPU, realtime at 1, 8, 16 and 32 sessions.

    python -m benchmarks.random_30b [--out DIR]                       # on one H200: ~5-8 minutes
    python -m benchmarks.random_30b --device cpu --dtype float32 --shrink 16 --sessions 1 --quick
    python -m benchmarks.random_30b --sessions 1,8,16,32,64 --max-sessions 64 --max-seq-len 8192  # the device kit's

It writes a profile from configs/qwen3_omni_random_h200.yaml (device, dtype and shrink
overridden), then runs `sgl-omni bench realtime` against a server it starts on that profile: the
model is built on the device at start (no download), warmed up, and driven over WebSocket. The
table goes to stdout, the JSON and the server log under --out. The second form is the same path
on CPU with every size divided by 16, which the test suite runs, so the script is known to work
before a GPU is lent. The reference to beat: vLLM-Omni's published Qwen3-Omni time to first audio,
325 / 603 / 699 / 1,024 ms at 8 / 16 / 24 / 32 concurrent requests on 3x H100.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from benchmarks import cli
from configs import load_profile

PROFILE = "qwen3_omni_random_h200.yaml"


def profile_for(device: str, dtype: str, shrink: int, max_sessions: int | None = None,
                max_seq_len: int | None = None) -> dict:
    """The profile, with `max_sessions` sessions of at most `max_seq_len` tokens admitted (the KV
    budget follows: their product); the profile's own 16 x 32k where not given."""
    profile = load_profile(PROFILE)
    params = profile["resources"]["omni"]["params"]
    params.update(device=device, dtype=dtype, random_shrink=shrink)
    limits = profile["limits"]
    if device == "cpu" and max_seq_len is None:
        max_seq_len = 4096  # a CPU-sized copy: a short context keeps each session's KV rows small
    if max_sessions is not None or max_seq_len is not None:
        sessions = max_sessions or limits["max_sessions"]
        length = max_seq_len or limits["max_seq_len"]
        params["max_seq_len"] = length
        limits.update(max_sessions=sessions, max_seq_len=length, kv_tokens=sessions * length)
    return profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.random_30b", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shrink", type=int, default=1, help="divide the model's sizes (16: a CPU-sized copy)")
    parser.add_argument("--sessions", default="1,8,16,32")
    parser.add_argument("--max-sessions", type=int, default=None,
                        help="sessions the server admits (default: the profile's 16; 64 fits one H200 at --max-seq-len 8192)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="tokens per session (default: the profile's 32768)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="short levels (the CPU smoke run)")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds after which remaining levels are skipped")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--name", default="random-30b")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / f"{args.name}-input-profile.yaml"
    config.write_text(yaml.safe_dump(profile_for(args.device, args.dtype, args.shrink, args.max_sessions, args.max_seq_len), sort_keys=False))
    bench = ["realtime", "--config", str(config), "--sessions", args.sessions,
             "--turns", str(args.turns), "--deadline", str(args.deadline), "--out", str(out), "--name", args.name,
             "--note", f"random-weight Qwen3-Omni-30B-A3B (shrink {args.shrink}) on {args.device} ({args.dtype})"]
    if args.quick:
        bench.append("--quick")
    return cli.main(bench)


if __name__ == "__main__":
    sys.exit(main())
