"""Counting what a piece of model code costs the host: aten operators dispatched and host syncs.

    with DispatchCounts(device) as counts:
        run_one_step()
    counts.ops, counts.host_syncs

A GPU engine is slow when it is bound by the host: every aten operator is a Python call and a
kernel launch, and every host sync (a device value read into Python, a device-to-host copy)
stops the host until the GPU has caught up, so CPU and GPU work never overlap. Both counts are
properties of the code, not of the machine, so they can be measured on CPU and hold on CUDA.

- `ops`: every aten operator that reaches the dispatcher (a `TorchDispatchMode`), views and
  in-place writes included. A captured CUDA graph's replay dispatches none.
- `host_syncs`: on CUDA, what `torch.cuda.set_sync_debug_mode` flags (its warnings, counted). On
  CPU, where nothing waits, the same reads counted where they happen: `aten._local_scalar_dense`
  (`.item()`, `int(t)`, `bool(t)`, `float(t)`), operators whose output size depends on the data
  (`nonzero`, `masked_select`, boolean indexing) and, at the Python level, `.tolist()`,
  `.numpy()`, `.cpu()` and `.to("cpu")` (which on CPU never reach the dispatcher). On CPU a
  `.to(device)` that names the CPU counts too: it cannot tell a move to the engine's device
  from a read back, so engine code keeps such moves out of its steps.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that read a device value into the host, or whose output size depends on the data.
_SYNCING_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2",
                          "unique_consecutive", "unique_dim"})
# Tensor methods that copy to the host without reaching the dispatcher when the tensor is on CPU.
_HOST_READS = frozenset({"tolist", "numpy", "cpu"})


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.overloadpacket.__name__
        if name in _SYNCING_OPS:
            self.syncs += 1
        elif name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                     for i in (args[1] if len(args) > 1 else ()) if i is not None):
            self.syncs += 1  # x[mask]: the output's size is read from the device
        return func(*args, **(kwargs or {}))


def _names_host(value: Any) -> bool:
    return value == "cpu" or (isinstance(value, torch.device) and value.type == "cpu")


class _HostReadCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            self.reads += 1
        elif name == "to" and (any(_names_host(a) for a in args[1:]) or _names_host((kwargs or {}).get("device"))):
            self.reads += 1
        return func(*args, **(kwargs or {}))


class DispatchCounts:
    """A context manager: the aten operators and host syncs of the code it wraps (see above)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.ops = 0
        self.host_syncs = 0
        self._dispatch: _OpCounter | None = None
        self._reads: _HostReadCounter | None = None
        self._warnings: Any = None
        self._caught: list[warnings.WarningMessage] | None = None

    def __enter__(self) -> DispatchCounts:
        self._dispatch = _OpCounter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._reads = _HostReadCounter()
            self._reads.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        assert self._dispatch is not None
        self._dispatch.__exit__(*exc_info)
        self.ops = self._dispatch.ops
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            assert self._warnings is not None and self._caught is not None
            self._warnings.__exit__(*exc_info)
            self.host_syncs = sum(1 for w in self._caught if "synchroniz" in str(w.message))
        else:
            assert self._reads is not None
            self._reads.__exit__(*exc_info)
            self.host_syncs = self._dispatch.syncs + self._reads.reads
