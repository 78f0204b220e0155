"""How the GPU probe measures one stage: wall and GPU time, launches, host syncs, memory, roofline.

    rates = machine_rates(device, dtype)             # the bf16 (dtype) matmul rate, the bandwidth
    figures = measure(step, device, iterations=10)   # one stage's step, called repeatedly
    figures.update(roofline(cost, rates))

- `wall_ms`: host time per step, the device synchronized before and after the timed steps.
- `gpu_ms`: CUDA events around the same steps (None on CPU: nothing runs asynchronously there).
- `launches`: on CUDA, kernel launches in one step as torch.profiler records them (the runtime's
  launch calls; a captured CUDA graph's replay counts once); on CPU, where there are no kernels,
  the aten operators one step dispatches (each one a launch on CUDA, unless fused or captured).
  `ops` is that operator count on both.
- `host_syncs`: benchmarks/dispatch_counts.py (`torch.cuda.set_sync_debug_mode` warnings on CUDA,
  the host reads counted where they happen on CPU).
- `roofline_ms`: the least time the step could take on this machine: its bytes at the memory
  bandwidth or its FLOPs at the measured matmul rate, whichever is longer (`StageCost`: the
  stage's own estimate of both, stages.py in gpu_probe). The bandwidth is H200's 4.8 TB/s on
  CUDA (the spec, as the figure to beat) and a measured copy on CPU.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.dispatch_counts import DispatchCounts

H200_BANDWIDTH = 4.8e12  # bytes/s, HBM3e (NVIDIA's H200 figure)
GIB = 1 << 30


@dataclass
class StageCost:
    """What one step must move and compute at least: bytes through memory, floating-point operations."""

    bytes: float
    flops: float


@dataclass
class MachineRates:
    flops_per_s: float  # measured dense matmul rate in the probe's dtype
    bytes_per_s: float
    bandwidth_from: str  # "spec" or "measured"

    def to_json(self) -> dict[str, Any]:
        return {"matmul_tflops": round(self.flops_per_s / 1e12, 3), "bandwidth_tbs": round(self.bytes_per_s / 1e12, 3),
                "bandwidth_from": self.bandwidth_from}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_rates(device: torch.device, dtype: torch.dtype, bandwidth: float | None = None) -> MachineRates:
    """The matmul rate measured on a square product (8192 on CUDA, 1024 on CPU), the bandwidth
    given, or the spec on CUDA, or a measured copy on CPU."""
    size = 8192 if device.type == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    repeats = 10 if device.type == "cuda" else 3
    synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    flops = 2 * size**3 * repeats / (time.perf_counter() - started)
    del a, b
    if bandwidth is not None:
        return MachineRates(flops, bandwidth, "given")
    if device.type == "cuda":
        return MachineRates(flops, H200_BANDWIDTH, "spec")
    source = torch.empty(64 << 20, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)
    started = time.perf_counter()
    for _ in range(5):
        target.copy_(source)
    moved = 2 * source.numel() * 5 / (time.perf_counter() - started)  # read + write
    return MachineRates(flops, moved, "measured")


def roofline(cost: StageCost, rates: MachineRates) -> dict[str, Any]:
    memory_s = cost.bytes / rates.bytes_per_s
    compute_s = cost.flops / rates.flops_per_s
    return {"roofline_ms": round(max(memory_s, compute_s) * 1000, 4),
            "bound": "memory" if memory_s >= compute_s else "compute",
            "bytes_gb": round(cost.bytes / 1e9, 4), "gflops": round(cost.flops / 1e9, 3)}


def memory_now(device: torch.device) -> float:
    """GiB held: the device's allocations on CUDA, the process's resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / GIB
    import psutil

    return psutil.Process().memory_info().rss / GIB


def memory_free(device: torch.device) -> float:
    """Bytes a stage may still allocate: the device's free memory, or the machine's available memory."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    import psutil

    return float(psutil.virtual_memory().available)


def measure(step: Callable[[], Any], device: torch.device, iterations: int, warmup: int = 2) -> dict[str, Any]:
    """Time `step` (after `warmup` calls), then count one call's launches and host syncs."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    synchronize(device)
    figures: dict[str, Any] = {}
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        start.record()
        for _ in range(iterations):
            step()
        end.record()
        torch.cuda.synchronize(device)
        figures["wall_ms"] = (time.perf_counter() - started) * 1000 / iterations
        figures["gpu_ms"] = start.elapsed_time(end) / iterations
    else:
        started = time.perf_counter()
        for _ in range(iterations):
            step()
        figures["wall_ms"] = (time.perf_counter() - started) * 1000 / iterations
        figures["gpu_ms"] = None
    with DispatchCounts(device) as counts:
        step()
        synchronize(device)
    figures["ops"] = counts.ops
    figures["host_syncs"] = counts.host_syncs
    figures["launches"] = _kernel_launches(step, device) if device.type == "cuda" else counts.ops
    figures["memory_gib"] = round(memory_now(device), 3)
    if device.type == "cuda":
        figures["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / GIB, 3)
    figures["wall_ms"] = round(figures["wall_ms"], 4)
    if figures["gpu_ms"] is not None:
        figures["gpu_ms"] = round(figures["gpu_ms"], 4)
    return figures


_LAUNCH_CALLS = ("LaunchKernel", "GraphLaunch")  # cudaLaunchKernel(ExC), cuLaunchKernel(Ex), cudaGraphLaunch


def _kernel_launches(step: Callable[[], Any], device: torch.device) -> int:
    """Kernel launches of one call, from torch.profiler: the runtime's launch calls (the device's
    kernel records where the runtime's are missing)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    events = prof.events()
    calls = sum(1 for event in events if any(name in event.name for name in _LAUNCH_CALLS))
    return calls or sum(1 for event in events if event.device_type == DeviceType.CUDA)


def counted_flops(step: Callable[[], Any]) -> float:
    """The FLOPs torch's flop counter sees in one call (matmuls, convolutions, attention): for the
    dense stages, whose arithmetic is all in such operators."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def release(device: torch.device) -> None:
    """Give a finished stage's memory back before the next one is sized."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
