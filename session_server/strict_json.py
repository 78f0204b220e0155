"""JSON as RFC 8259 defines it, for request bodies: Python's `json` also takes `NaN`, `Infinity`
and `-Infinity`, which no JSON client sends on purpose and which would reach the samplers as
numbers no range check is written for."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """`json.loads`, refusing the non-JSON constants with `ValueError` (as any other bad JSON)."""
    return json.loads(text, parse_constant=_refuse)


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
