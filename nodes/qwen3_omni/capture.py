"""What every captured step shares (`compute: {graphs: auto}`): the padded batch sizes, and one
function of tensors captured on static inputs.

A captured step (the talker's frame: captured.py; code2wav's chunk: captured_code2wav.py) is a
function of tensors only, with every shape fixed by its padded batch size, so that it can be
captured once per size and replayed:

- on CUDA as a CUDA graph (one launch for the step; a step's graphs share one memory pool);
- on CPU as a TorchScript trace: the same aten calls, run from C++ without a Python frame per
  operator (the choice among the CPU options measured: docs/notebook/2026-12-07-captured-talker.md).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

# The padded batch sizes of captured steps (one graph each); a larger batch runs eager.
PADDED_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def padded_batch(rows: int) -> int | None:
    """The padded batch size `rows` rows run at (None: more than the largest)."""
    for size in PADDED_BATCHES:
        if rows <= size:
            return size
    return None


def python_modes() -> bool:
    """Whether a Python dispatch or function mode is active (a counter, a tracer): a CPU trace
    cannot run under one, so the step runs as written (the same aten calls the trace makes)."""
    return torch._C._len_torch_dispatch_stack() > 0 or torch._C._len_torch_function_stack() > 0


class Captured:
    """`step(*inputs)` captured on the static tensors `inputs`: a CUDA graph on CUDA (`pool`:
    the memory pool it shares with its step's other graphs), a TorchScript trace on CPU whose
    weights (the parameters of `modules`) are recorded as constants.

    `run(*tensors)` -> the step's outputs: on CPU the trace of any tensors of the inputs' shapes
    (new tensors); on CUDA the graph's replay on `inputs` (copy the values in first; the outputs
    are the graph's static buffers, overwritten by its next replay)."""

    def __init__(self, step: Callable[..., Any], inputs: tuple[torch.Tensor, ...], modules: Iterable[torch.nn.Module],
                 pool: Any = None):
        self.inputs = inputs
        device = inputs[0].device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up on a side stream (lazy inits, cuBLAS workspaces)
                    step(*inputs)
            torch.cuda.current_stream(device).wait_stream(stream)
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = step(*inputs)
        else:
            with warnings.catch_warnings(), weights_as_constants(modules):
                warnings.simplefilter("ignore")  # the tracer's notes on shapes read as Python numbers
                self.trace = torch.jit.trace(step, inputs, check_trace=False)
            for _ in range(2):  # TorchScript profiles the first run and optimizes at the second: not in a step
                self.trace(*inputs)

    def run(self, *tensors: torch.Tensor) -> Any:
        if self.cuda:
            self.graph.replay()
            return self.outputs
        return self.trace(*tensors)


class PenaltyColumns:
    """[B, 1] float32 columns of per-row repetition penalties on `device`, made once per
    combination of values: a captured step copies them in without building a tensor per step.
    A few combinations recur (the profile's and the sessions' own); past 256 the cache restarts."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self._columns: dict[tuple[float, ...], torch.Tensor] = {}

    def __call__(self, values: tuple[float, ...]) -> torch.Tensor:
        column = self._columns.get(values)
        if column is None:
            if len(self._columns) > 256:
                self._columns.clear()
            column = self._columns[values] = torch.tensor(values, dtype=torch.float32, device=self.device)[:, None]
        return column


@contextlib.contextmanager
def weights_as_constants(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """The tracer records the weights as constants, which it refuses to do with tensors that
    require grad: the parameters of `modules` do not while it traces."""
    parameters = [p for module in modules for p in module.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)
