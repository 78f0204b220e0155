"""Typed schemas for the parameters a profile gives: checked before anything loads.

A node declares `params_schema` (a msgspec Struct with `forbid_unknown_fields=True`), a resource
factory registers one (`register_resource(name, params=...)`), a feature section loader passes
its own. `schema_errors` converts the raw YAML mapping to the schema and turns msgspec's message
into one line that names the profile key and, where the schema knows them, the allowed values:

    nodes.vad.params.max_batch: expected int, got str
    nodes.thinker.params.sampling.topk: unknown key (known: seed, temperature, top_k, top_p)
    resources.omni.params.device: 'gpu' is not allowed (allowed: cpu, cuda, ...)

The defaults live in the schema's fields: a node decodes its params into its struct and reads
attributes (nodes/params.py `decode`), so a typo is an error, never a default silently used.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, Literal

import msgspec

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.(\w+)|\[(\d+)\]")


def schema_errors(raw: Any, schema: type, key: str) -> list[str]:
    """[] when `raw` fits `schema`, else one line naming `key`'s offending field."""
    try:
        msgspec.convert({} if raw is None else raw, schema)
    except msgspec.ValidationError as exc:
        return [_explain(str(exc), schema, key)]
    return []


def convert_section(raw: Any, schema: type, key: str) -> Any:
    """`raw` as `schema`, or ValueError with the one line `schema_errors` gives."""
    try:
        return msgspec.convert({} if raw is None else raw, schema)
    except msgspec.ValidationError as exc:
        raise ValueError(_explain(str(exc), schema, key)) from None


def _explain(message: str, schema: type, key: str) -> str:
    match = _AT.match(message)
    problem, path = (match.group("problem"), match.group("path") or "") if match else (message, "")
    names = [name or f"[{index}]" for name, index in _SEGMENT.findall(path)]
    full_key = key + "".join(n if n.startswith("[") else f".{n}" for n in names)
    unknown = re.match(r"Object contains unknown field `(\w+)`", problem)
    if unknown:
        known = _field_names(_type_at(schema, names))
        listed = f" (known: {', '.join(known)})" if known else ""
        return f"{full_key}.{unknown.group(1)}: unknown key{listed}"
    missing = re.match(r"Object missing required field `(\w+)`", problem)
    if missing:
        return f"{full_key}.{missing.group(1)}: is required"
    allowed = _literal_values(_type_at(schema, names))
    if allowed and problem.startswith("Invalid enum value"):
        value = problem.removeprefix("Invalid enum value").strip()
        return f"{full_key}: {value} is not allowed (allowed: {', '.join(map(str, allowed))})"
    if not names and problem.startswith("Expected `object`"):
        return f"{full_key}: must be a mapping"
    return f"{full_key}: {problem[0].lower()}{problem[1:]}".replace("`", "")


def _type_at(schema: Any, names: list[str]) -> Any:
    """The declared type at a field path, through Optional/Union and containers; None if unknown."""
    current = schema
    for name in names:
        current = _struct_in(current) if not name.startswith("[") else _item_of(current)
        if current is None:
            return None
        if not name.startswith("["):
            hints = typing.get_type_hints(current, include_extras=True)
            if name not in hints:
                return None
            current = hints[name]
    return current


def _struct_in(annotation: Any) -> Any:
    for candidate in _alternatives(annotation):
        if isinstance(candidate, type) and (issubclass(candidate, msgspec.Struct) or dataclasses.is_dataclass(candidate)):
            return candidate
    return None


def _item_of(annotation: Any) -> Any:
    for candidate in _alternatives(annotation):
        args = typing.get_args(candidate)
        if typing.get_origin(candidate) in (list, tuple) and args:
            return args[0]
    return None


def _alternatives(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


def _field_names(annotation: Any) -> list[str]:
    struct = _struct_in(annotation)
    if struct is None:
        return []
    return sorted(struct.__struct_fields__ if issubclass(struct, msgspec.Struct) else (f.name for f in dataclasses.fields(struct)))


def _literal_values(annotation: Any) -> list[Any]:
    return [v for a in _alternatives(annotation) if typing.get_origin(a) is Literal for v in typing.get_args(a)]
