"""The profile's `compute: {graphs: auto | off}` as the talker and the thinker's runner read it.

Apart from captured.py so that talker_model.py, which captured.py's frame unit reads, can take
the setting without importing the unit (no import circle)."""

from __future__ import annotations

from typing import Any

GRAPHS = ("auto", "off")


def check_graphs(graphs: str) -> str:
    if graphs not in GRAPHS:
        raise ValueError(f"compute.graphs must be one of {', '.join(GRAPHS)}, not {graphs!r}")
    return graphs


def set_graphs(omni: Any, graphs: str) -> None:
    """Make `graphs` the default of the talkers and thinker runners built on `omni` (an `OmniModel`
    or its HF model) from now on."""
    model = getattr(omni, "model", omni)
    model._sgl_compute_graphs = check_graphs(graphs)


def graphs_of(model: Any) -> str:
    """The default `set_graphs` gave `model` ("auto" when none)."""
    return getattr(model, "_sgl_compute_graphs", "auto")
