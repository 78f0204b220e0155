"""Docstring hygiene: every module of the layers says what it is for, and a docstring in graph/ or
nodes/ states a contract and its reason, never a measurement's before and after ("p95 63 -> 37
ms"): the figures live in docs/notebook/, the rule that came of them in docs/batching.md
(CONTRIBUTING.md). The sources are parsed, not imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

LAYERS = ("session_server", "graph", "nodes")
NO_MEASUREMENTS = ("graph", "nodes")

# A figure, an arrow, a figure ("63-76 -> 37-39 ms", "1.8 ms → 0.9"); "from 63 ms to 37 ms"; and
# "measured 2-6x": what a notebook entry says, not a contract.
_NUMBER = r"\d+(?:[.,]\d+)?(?:\s*-\s*\d+(?:[.,]\d+)?)?"
_UNIT = r"(?:\s*(?:ms|us|µs|s|%|x|MiB|GiB|MB|GB|tok/s|frames/s)\b)?"
MEASURED_DELTA = re.compile(
    rf"{_NUMBER}{_UNIT}\s*(?:->|→|=>)\s*~?{_NUMBER}"
    rf"|\bfrom\s+~?{_NUMBER}{_UNIT}\s+to\s+~?{_NUMBER}{_UNIT}"
    rf"|\bmeasured\s+(?:at\s+)?~?{_NUMBER}",
    re.IGNORECASE,
)


def _modules(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (REPO / package).rglob("*.py"))


def _docstrings(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node)
            if docstring:
                yield getattr(node, "name", "<module>"), docstring


def test_every_module_of_the_layers_has_a_module_docstring():
    missing = [str(path.relative_to(REPO)) for path in _modules(*LAYERS) if ast.get_docstring(ast.parse(path.read_text())) is None]
    assert missing == [], f"modules without a module docstring: {missing}"


def test_no_docstring_in_graph_or_nodes_carries_a_measured_delta():
    found = []
    for path in _modules(*NO_MEASUREMENTS):
        for name, docstring in _docstrings(ast.parse(path.read_text())):
            for match in MEASURED_DELTA.finditer(docstring):
                found.append(f"{path.relative_to(REPO)} {name}: {match.group(0)!r}")
    assert found == [], "measurements belong in docs/notebook/ (the rule in docs/batching.md):\n" + "\n".join(found)


def test_the_measured_delta_pattern_matches_what_it_forbids():
    for figure in ("TTFA p95 63-76 -> 37-39 ms", "1.8 ms → 0.9 ms", "from 63 ms to 37 ms", "measured 2-6x slower"):
        assert MEASURED_DELTA.search(figure), figure
    for contract in ("1 frame = 57 ms of audio", "up to a 4 ms tick", "`a -> b` maps a to b", "at most 1,024 positions"):
        assert not MEASURED_DELTA.search(contract), contract
