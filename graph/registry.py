"""Name -> class registries for nodes and shared resources (the `type:` keys of a config).

Node modules register themselves on import; a config names the modules to import under
`imports:` so the graph never imports `nodes` itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from graph.node import Node

_NODES: dict[str, type[Node]] = {}
# A resource factory is called once at startup with its params and returns the shared object
# (a loaded model, say). It runs in a worker thread, so it may block.
_RESOURCES: dict[str, Callable[[dict[str, Any]], Any]] = {}
# The typed schema of a resource type's `params` (graph/schema.py), where its module gives one.
_RESOURCE_SCHEMAS: dict[str, type] = {}


def register_node(type_name: str) -> Callable[[type[Node]], type[Node]]:
    def register(cls: type[Node]) -> type[Node]:
        existing = _NODES.get(type_name)
        if existing is not None and existing is not cls:
            raise ValueError(f"node type {type_name!r} is registered twice ({existing.__qualname__}, {cls.__qualname__})")
        _NODES[type_name] = cls
        return cls

    return register


def register_resource(type_name: str, params: type | None = None) -> Callable[[Callable[[dict[str, Any]], Any]], Callable[[dict[str, Any]], Any]]:
    def register(factory: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        _RESOURCES[type_name] = factory
        if params is not None:
            _RESOURCE_SCHEMAS[type_name] = params
        return factory

    return register


def node_class(type_name: str) -> type[Node] | None:
    return _NODES.get(type_name)


def resource_factory(type_name: str) -> Callable[[dict[str, Any]], Any] | None:
    return _RESOURCES.get(type_name)


def resource_params_schema(type_name: str) -> type | None:
    return _RESOURCE_SCHEMAS.get(type_name)


def node_types() -> list[str]:
    return sorted(_NODES)


def import_modules(names: Iterable[str]) -> None:
    for name in names:
        importlib.import_module(name)
