"""Does one session's long prefill hold up another session's first audio? (issue 16)

    .venv/bin/python -m benchmarks.prefill_fairness [--chars 32000] [--probes 3] [--engines 1]
                                                    [--config PROFILE] [--json OUT]

Starts a server (the embedded CPU profile unless `--config`, with `limits.max_text_tokens`
raised so that a `--chars` item is admitted, and `compute.engines` set so that both sessions
share one engine's compute), then over two WebSockets:

- baseline: the probe session asks `--probes` times for a reply to a short text item, alone;
- loaded: the long session creates one `--chars`-character text item and asks for a reply; at
  once the probe session asks for its short replies, one after another, until the long reply's
  first audio arrives (at least `--probes` of them).

Printed: the probe's time to first audio (from `response.create` to the first
`response.output_audio.delta`) alone and while the long item is prefilled, and the long reply's
own time to first audio with its input tokens. The machine is shared: the load average is
printed beside the numbers. Nothing is asserted; the results are in
docs/notebook/2026-12-01-prefill-fairness.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fixtures import SENTENCES
from benchmarks.server import ManagedServer

PROBE_TEXT = "Hello, how are you?"


def long_text(chars: int) -> str:
    text = " ".join(SENTENCES)
    return (text + " ") * (chars // (len(text) + 1)) + text[: chars % (len(text) + 1)]


class Conversation:
    """One realtime session driven by text items; records when each reply's audio begins."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.first_audio: dict[str, float] = {}  # response id -> perf_counter of its first delta
        self.done: dict[str, dict[str, Any]] = {}
        self.created: asyncio.Queue[str] = asyncio.Queue()
        self.changed = asyncio.Event()

    async def receive(self) -> None:
        async for text in self.ws:
            event = json.loads(text)
            kind = event["type"]
            if kind == "response.created":
                self.created.put_nowait(event["response"]["id"])
            elif kind == "response.output_audio.delta":
                self.first_audio.setdefault(event["response_id"], time.perf_counter())
            elif kind == "response.done":
                self.done[event["response"]["id"]] = event["response"]
            elif kind == "error":
                print("  server error:", event["error"].get("code"), event["error"].get("message", "")[:120])
            self.changed.set()

    async def until(self, predicate, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def ask(self, text: str) -> str:
        """Add a user text item and ask for a reply: the response id."""
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await self.ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await self.ws.send(json.dumps({"type": "response.create"}))
        return await asyncio.wait_for(self.created.get(), 60)

    async def ttfa(self, text: str, timeout: float = 120) -> float:
        """One short turn, waited for to its end: seconds from `response.create` to first audio."""
        asked = time.perf_counter()
        response_id = await self.ask(text)
        await self.until(lambda: response_id in self.done, timeout)
        return self.first_audio.get(response_id, float("nan")) - asked


async def open_conversation(ws_url: str, model_id: str) -> tuple[Any, Conversation, asyncio.Task[None]]:
    from websockets.asyncio.client import connect

    ws = await connect(f"{ws_url}/v1/realtime?model={model_id}", max_size=None, open_timeout=60)
    conversation = Conversation(ws)
    task = asyncio.create_task(conversation.receive())
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 16}}))
    return ws, conversation, task


async def measure(ws_url: str, model_id: str, chars: int, probes: int) -> dict[str, Any]:
    probe_ws, probe, probe_task = await open_conversation(ws_url, model_id)
    long_ws, long, long_task = await open_conversation(ws_url, model_id)
    try:
        alone = [await probe.ttfa(PROBE_TEXT) for _ in range(probes)]
        asked = time.perf_counter()
        long_id = await long.ask(long_text(chars))
        loaded: list[float] = []
        while len(loaded) < probes or long_id not in long.first_audio:
            loaded.append(await probe.ttfa(PROBE_TEXT))
            if len(loaded) >= 50:
                break
        await long.until(lambda: long_id in long.done, 600)
        usage = long.done[long_id].get("usage") or {}
        return {
            "chars": chars,
            "probe_ttfa_alone_s": [round(x, 3) for x in alone],
            "probe_ttfa_during_long_prefill_s": [round(x, 3) for x in loaded],
            "long_ttfa_s": round(long.first_audio.get(long_id, float("nan")) - asked, 3),
            "long_input_tokens": usage.get("input_tokens"),
            "long_status": long.done[long_id].get("status"),
        }
    finally:
        for ws, task in ((probe_ws, probe_task), (long_ws, long_task)):
            task.cancel()
            await ws.close()


def serve_profile(config: str | None, chars: int, engines: int) -> Path:
    import yaml

    from configs import load_profile

    profile = load_profile(config)
    profile.setdefault("limits", {})["max_text_tokens"] = max(chars + 1024, int(profile["limits"].get("max_text_tokens", 0)))
    profile.setdefault("compute", {})["engines"] = engines
    path = Path(tempfile.mkdtemp(prefix="sgl-omni-fairness-")) / "profile.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefill_fairness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=32000, help="characters in the long text item (default 32000)")
    parser.add_argument("--probes", type=int, default=3, help="short turns alone, and at least this many during the long prefill")
    parser.add_argument("--engines", type=int, default=1, help="engine processes (default 1: both sessions share its compute)")
    parser.add_argument("--config", help="the profile (default: the embedded CPU one)")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)

    profile = serve_profile(args.config, args.chars, args.engines)
    log = profile.with_name("fairness-server.log")
    load_before = os.getloadavg()[0]
    with ManagedServer(str(profile), max_sessions=2, log_path=log) as server:
        result = asyncio.run(measure(server.ws_url, server.model_id, args.chars, args.probes))
    result["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["engines"] = args.engines

    alone, loaded = result["probe_ttfa_alone_s"], result["probe_ttfa_during_long_prefill_s"]
    print(f"long item: {args.chars} chars, {result['long_input_tokens']} input tokens, its own TTFA {result['long_ttfa_s']:.2f} s ({result['long_status']})")
    print(f"probe TTFA alone:                 median {statistics.median(alone):.3f} s, max {max(alone):.3f} s  {alone}")
    print(f"probe TTFA during the long prefill: median {statistics.median(loaded):.3f} s, max {max(loaded):.3f} s  {loaded}")
    print(f"engines {args.engines}, 1-min load average before/after: {result['load_avg_1m']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
