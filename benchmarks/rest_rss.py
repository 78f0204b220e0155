"""What the server's and its engines' memory do under REST abuse: `python -m benchmarks.rest_rss`.

Starts `sgl-omni serve` (the embedded profile unless `--config`), then sends `--rounds` rounds of
`--per-round` requests, each round cycling through the shapes a REST fuzz run sends: oversized
bodies (a 5 MiB speech request and a 10 MiB SDP offer: 413 after the drain), 40,000-deep JSON,
malformed JSON, an unknown voice, a speech render (200, a WAV), a two-item speech batch, and
`GET /v1/models`. It prints the resident memory of the server and of each engine process
before the first round and after each one, and the answers' status counts. A steady state is
what it is for: memory that rises in the first round and stays is allocator arenas keeping
freed heap; memory that rises every round is something held.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

from benchmarks.server import ManagedServer

def render(model: str) -> dict:
    """A speech request the server renders (the served model's name: another is a 404)."""
    return {"model": model, "input": "Okay, sure, here it is.", "voice": "ethan", "response_format": "wav"}


def request_shapes(model: str) -> list[tuple[str, str, dict]]:
    """(method, path, httpx keyword arguments) of one cycle."""
    speech = render(model)
    deep = "[" * 40_000 + "]" * 40_000
    return [
        ("POST", "/v1/audio/speech", {"content": b'{"input": "' + b"a" * (5 * 2**20) + b'"}',
                                      "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/realtime/calls", {"content": b"v=0\r\n" + b"a" * (10 * 2**20), "headers": {"content-type": "application/sdp"}}),
        ("POST", "/v1/audio/speech", {"content": deep.encode(), "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/audio/speech", {"content": b'{"input": "half', "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/audio/speech", {"json": {**speech, "voice": "nobody", "input": "x" * 4000}}),
        ("POST", "/v1/audio/speech", {"json": speech}),
        ("POST", "/v1/audio/speech/batch", {"json": {"items": [speech, {**speech, "input": "And one more."}]}}),
        ("GET", "/v1/models", {}),
    ]


def resident_mb(server_pid: int) -> dict[str, float]:
    """RSS per process: the server and each of its children (the engines), MB."""
    server = psutil.Process(server_pid)
    rss = {"server": server.memory_info().rss / 2**20}
    for index, child in enumerate(sorted(server.children(recursive=True), key=lambda process: process.pid)):
        rss[f"engine{index}"] = child.memory_info().rss / 2**20
    return rss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="the server's profile (default: the embedded CPU profile)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=350)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)

    statuses: collections.Counter[int] = collections.Counter()
    table: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch, ManagedServer(args.config, 8, Path(scratch) / "server.log") as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            client.post("/v1/audio/speech", json=render(server.model_id)).raise_for_status()  # warm: the first render's one-time costs
            table.append({"requests": 0, **resident_mb(server.pid)})
            shapes = itertools.cycle(request_shapes(server.model_id))
            for round_index in range(1, args.rounds + 1):
                for method, path, kwargs in itertools.islice(shapes, args.per_round):
                    try:
                        statuses[client.request(method, path, **kwargs).status_code] += 1
                    except httpx.TransportError:
                        statuses[0] += 1  # a reset: the refusal did not reach the client
                table.append({"requests": round_index * args.per_round, **resident_mb(server.pid)})
    names = list(table[0])
    print("| " + " | ".join(f"{name} MB" if name != "requests" else name for name in names) + " |")
    print("|" + "---|" * len(names))
    for row in table:
        print("| " + " | ".join(f"{row[name]:.0f}" if name == "requests" else f"{row.get(name, float('nan')):.1f}" for name in names) + " |")
    print("statuses: " + ", ".join(f"{status or 'reset'}: {count}" for status, count in sorted(statuses.items())))
    if args.json:
        Path(args.json).write_text(json.dumps({"rss_mb": table, "statuses": dict(statuses)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
