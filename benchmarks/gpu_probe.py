"""The GPU probe: each stage of the engine's work timed on a random-weight Qwen3-Omni-30B-A3B.

    python -m benchmarks.gpu_probe [--device cuda] [--out DIR] [--graphs auto|off|both]
    python -m benchmarks.gpu_probe --device cpu --shrink 16     # the same path, sizes / 16 (a test)
    python -m benchmarks.gpu_probe --check                       # can the probe and the bench run here?

It needs torch (>= 2.11, the GPU image's) and the project's wheels only (no server, no
download): the model is built on the device at the published configuration in bfloat16
(nodes/qwen3_omni/random_presets.py), then each stage runs through the project's own model code
(benchmarks/probe_stages.py): thinker decode at batch 1/8/16/32/64 over 1k, 8k and 32k tokens
of context, thinker prefill of 1k and 8k tokens, talker + code predictor per frame at batch
1/16/64, a code2wav streaming chunk, the audio encoder on 5 s of audio. Per stage:
`wall_ms`, `gpu_ms`, `launches`, `host_syncs`, `roofline_ms` and memory
(benchmarks/probe_timing.py says how each is measured); a stage that does not fit in memory is
skipped with its reason. The table goes to stdout, the JSON (written after every stage, so a
run cut short keeps what ran) to `DIR/gpu-probe.json` (DIR: --out, else $OUT, else
bench-results/).

With `--shrink N` every width, head, layer and expert count is divided by N and so are the
context and prefill lengths; on CPU the dtype is float32 and the bandwidth a measured copy.

`--graphs`: `off` times the eager steps; `auto` the engine's captured steps where it has them
(`compute: {graphs: auto}`, docs/ARCHITECTURE.md); `both` times every stage eager (`stages`),
then again captured each stage that has a captured form (`captured`: the thinker decode step,
nodes/qwen3_omni/captured_thinker.py; the talker + code predictor frame, captured.py; the code2wav
chunk, captured_code2wav.py). The notes say which stages have none and ran eager only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import probe_stages
from benchmarks.probe_timing import GIB, machine_rates, measure, memory_now, release, roofline

OLDEST_TORCH = (2, 11)  # the GPU image's; tests/bench/test_gpu_probe.py runs the CPU form on it in the dry run
BATCHES = (1, 8, 16, 32, 64)
CONTEXTS = {"1k": 1024, "8k": 8192, "32k": 32768}
PREFILLS = {"1k": 1024, "8k": 8192}
TALKER_BATCHES = (1, 16, 64)
# The modules the realtime bench's server needs beyond torch and the image (scripts/device-kit.sh carries them).
SERVER_MODULES = ("msgspec", "fastapi", "starlette", "pydantic", "uvicorn", "websockets", "soxr", "soundfile",
                  "silero_vad", "python_multipart", "transformers", "yaml", "uvloop", "httpx", "onnxruntime", "prometheus_client")
# The stages whose steps have a captured form (`compute: {graphs: auto}`); the others run eager either way.
CAPTURED_STAGES = ("thinker_decode", "talker_frame", "code2wav_chunk")
OPTIONAL_MODULES = {"aiortc": "WebRTC calls", "av": "WebRTC audio and mp3/opus speech", "xgrammar": "tool-call grammars"}


def use_captured_steps(omni: Any, graphs: str) -> str | None:
    """The one switch between the engine's eager and captured steps (`compute: {graphs: ...}`,
    issue 32): None when the model's engines now run `graphs` ("auto" or "off"), else why not."""
    try:
        from nodes.qwen3_omni.compute_graphs import set_graphs
    except ImportError:
        return None if graphs == "off" else "this engine has no captured steps yet: every stage ran eager"
    set_graphs(omni, graphs)
    return None


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check(device: str) -> int:
    """Say what this machine has for the probe and the bench; non-zero when the probe cannot run."""
    import importlib

    problems = []
    cuda = torch.cuda.is_available()
    print(f"gpu_probe check: python {platform.python_version()}, torch {torch.__version__}"
          f" (CUDA {torch.version.cuda or '-'}, {torch.cuda.get_device_name() if cuda else 'no GPU'})")
    if _version(torch.__version__) < OLDEST_TORCH:
        problems.append(f"torch {torch.__version__} is older than {'.'.join(map(str, OLDEST_TORCH))}")
    if device.startswith("cuda") and not cuda:
        problems.append("CUDA is not available")
    for name in SERVER_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported, the probe itself may still run
            problems.append(f"{name} does not import ({type(exc).__name__}: {exc})")
        else:
            if name == "transformers":
                print(f"gpu_probe check: transformers {module.__version__} from {Path(module.__file__).parent.parent}")
    for name, what in OPTIONAL_MODULES.items():
        if importlib.util.find_spec(name) is None:
            print(f"gpu_probe check: {name} is not installed: no {what}")
    for problem in problems:
        print(f"gpu_probe check: {problem}")
    print("gpu_probe check: " + ("ok" if not problems else "FAILED"))
    return 1 if problems else 0


class Probe:
    """One run: the model, the machine's rates, the results so far and where they are written."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype or ("bfloat16" if self.device.type == "cuda" else "float32"))
        self.out = Path(args.out or os.environ.get("OUT") or "bench-results") / "gpu-probe.json"
        self.started = time.monotonic()
        self.calls = {"decode": 20, "prefill": 3, "talker": 10, "other": 5} if self.device.type == "cuda" else \
            {"decode": 3, "prefill": 2, "talker": 3, "other": 2}
        self.report: dict[str, Any] = {
            "probe": "gpu_probe", "model": "random-weight Qwen3-Omni-30B-A3B", "shrink": args.shrink,
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else _cpu_name(),
            "dtype": str(self.dtype).removeprefix("torch."), "torch": torch.__version__,
            "python": platform.python_version(), "graphs": args.graphs, "notes": [], "stages": {},
        }

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.report, indent=2) + "\n")

    def build(self) -> Any:
        import transformers

        from nodes.qwen3_omni.model import OmniModel

        self.report["transformers"] = transformers.__version__
        started = time.perf_counter()
        omni = OmniModel.load(random_weights="qwen3-omni-30b-a3b", random_shrink=self.args.shrink, device=str(self.device),
                              dtype=str(self.dtype).removeprefix("torch."))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.report["build_s"] = round(time.perf_counter() - started, 2)
        self.report["parameters_b"] = round(sum(p.numel() for p in omni.model.parameters()) / 1e9, 3)
        self.report["weights_gib"] = round(memory_now(self.device), 2)
        self.rates = machine_rates(self.device, self.dtype, self.args.bandwidth_tbs * 1e12 if self.args.bandwidth_tbs else None)
        self.report["rates"] = self.rates.to_json()
        self.write()
        return omni

    def stages(self, omni: Any) -> list[tuple[str, Callable[[], Any], int]]:
        """(name, prepare, timed calls) in the order they run: what the engines do most first."""
        shrink, calls = self.args.shrink, self.calls
        plan: list[tuple[str, Callable[[], Any], int]] = []
        for label, context in CONTEXTS.items():
            for batch in BATCHES:
                plan.append((f"thinker_decode.b{batch}.{label}",
                             lambda b=batch, c=max(16, context // shrink): probe_stages.thinker_decode(omni, b, c, calls["decode"] + 4),
                             calls["decode"]))
        for label, tokens in PREFILLS.items():
            plan.append((f"thinker_prefill.{label}", lambda t=max(16, tokens // shrink): probe_stages.thinker_prefill(omni, t),
                         calls["prefill"]))
        for batch in TALKER_BATCHES:
            plan.append((f"talker_frame.b{batch}", lambda b=batch: probe_stages.talker_frame(omni, b, calls["talker"] + 4),
                         calls["talker"]))
        plan.append(("code2wav_chunk", lambda: probe_stages.code2wav_chunk(omni), calls["other"]))
        plan.append(("audio_encoder.5s", lambda: probe_stages.audio_encoder(omni), calls["other"]))
        if self.args.stages:
            plan = [entry for entry in plan if any(entry[0].startswith(prefix) for prefix in self.args.stages.split(","))]
        return plan

    def run(self, omni: Any, plan: list[tuple[str, Callable[[], Any], int]], into: dict[str, Any]) -> None:
        for name, prepare, calls in plan:
            if self.args.deadline and time.monotonic() - self.started > self.args.deadline:
                into[name] = {"skipped": f"the probe's {self.args.deadline:.0f} s deadline passed"}
                continue
            try:
                prepared = prepare()
                if isinstance(prepared, str):
                    into[name] = {"skipped": prepared}
                else:
                    figures = measure(prepared.step, self.device, calls, warmup=2 if self.device.type == "cuda" else 1)
                    figures.update(roofline(prepared.cost, self.rates))
                    figures["over_roofline"] = round(figures.get("gpu_ms") or figures["wall_ms"], 4) / max(figures["roofline_ms"], 1e-9)
                    figures["over_roofline"] = round(figures["over_roofline"], 2)
                    if prepared.after is not None:
                        figures.update(prepared.after())
                    into[name] = {**prepared.info, **figures}
                del prepared
            except torch.OutOfMemoryError as exc:
                into[name] = {"skipped": f"out of memory: {str(exc).splitlines()[0][:200]}"}
            except Exception as exc:  # noqa: BLE001 - one stage failing must not hide the others
                into[name] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
            release(self.device)
            print(_row(name, into[name]), flush=True)
            self.write()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


COLUMNS = ("stage", "wall_ms", "gpu_ms", "launches", "host_syncs", "roofline_ms", "x_roof", "mem_gib")


def _header() -> str:
    return f"{COLUMNS[0]:<26}" + "".join(f"{c:>12}" for c in COLUMNS[1:])


def _row(name: str, figures: dict[str, Any]) -> str:
    if "skipped" in figures:
        return f"{name:<26}  skipped: {figures['skipped']}"
    cells = [figures["wall_ms"], figures["gpu_ms"], figures["launches"], figures["host_syncs"], figures["roofline_ms"],
             figures["over_roofline"], figures.get("peak_gib", figures["memory_gib"])]
    return f"{name:<26}" + "".join(f"{'-' if v is None else f'{v:.4g}' if isinstance(v, float) else v:>12}" for v in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shrink", type=int, default=1, help="divide the model's sizes and the context lengths (16: a CPU-sized copy)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--out", default=None, help="folder for gpu-probe.json (default: $OUT, else bench-results)")
    parser.add_argument("--graphs", choices=("auto", "off", "both"), default="auto")
    parser.add_argument("--stages", default=None, help="comma-separated name prefixes of the stages to run (default: all)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after start past which stages are skipped")
    parser.add_argument("--bandwidth-tbs", type=float, default=None, help="memory bandwidth for the roofline (default: 4.8 on CUDA, measured on CPU)")
    parser.add_argument("--check", action="store_true", help="only check torch, CUDA and the server's modules")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.check:
        return check(args.device)
    if args.shrink < 1:
        parser.error("--shrink must be >= 1")
    probe = Probe(args)
    omni = probe.build()
    print(f"gpu_probe: {probe.report['model']} (shrink {args.shrink}, {probe.report['parameters_b']} B parameters, "
          f"{probe.report['dtype']}) built on {probe.report['device']} in {probe.report['build_s']} s; "
          f"matmul {probe.rates.flops_per_s / 1e12:.3g} TFLOP/s, bandwidth {probe.rates.bytes_per_s / 1e12:.3g} TB/s "
          f"({probe.rates.bandwidth_from}); torch {torch.__version__}")
    plan = probe.stages(omni)
    modes = {"off": ["off"], "auto": ["auto"], "both": ["off", "auto"]}[args.graphs]
    for mode in modes:
        why_not = use_captured_steps(omni, mode)
        if why_not is not None:
            probe.report["notes"].append(why_not)
            print(f"gpu_probe: {why_not}")
            if mode == "auto" and "off" in modes:
                continue  # `both` without a captured path: the eager run stands alone
        run_plan, into = plan, probe.report["stages"]
        if mode == "auto" and "off" in modes:  # `both`: the stages with a captured form, again
            run_plan = [entry for entry in plan if entry[0].startswith(CAPTURED_STAGES)]
            eager_only = [entry[0] for entry in plan if not entry[0].startswith(CAPTURED_STAGES)]
            if eager_only:
                note = f"no captured steps for {', '.join(eager_only)}: timed eager only"
                probe.report["notes"].append(note)
                print(f"gpu_probe: {note}")
            if not run_plan:
                continue
            into = probe.report.setdefault("captured", {})
        print(f"gpu_probe: {'eager' if mode == 'off' or why_not else 'captured'} steps")
        print(_header())
        probe.run(omni, run_plan, into)
    probe.report["total_s"] = round(time.monotonic() - probe.started, 1)
    probe.write()
    ran = sum(1 for figures in probe.report["stages"].values() if "skipped" not in figures)
    print(f"gpu_probe: {ran} of {len(plan)} stages ran; JSON in {probe.out} ({probe.report['total_s']} s)")
    if ran == 0:
        return 1
    del omni
    release(probe.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
