"""The graph spec: a YAML profile parsed and validated before the server opens its port.

Layout of a profile:

    model_id: qwen3-omni-tiny
    imports: [nodes.vad, nodes.dialog, ...]          # modules that register node/resource types
    resources:                                       # shared objects built once (loaded models)
      omni: {type: qwen3_omni.model, params: {...}}
    nodes:
      vad: {type: silero_vad, params: {...}}
    edges:
      - vad.events -> dialog.events
    inputs: {audio: vad.audio}                       # where transports send messages in
    outputs: [dialog.events, thinker.text]           # what transports receive
    limits: {first_audio_goal_ms: 150, kv_tokens: 524288, max_seq_len: 32768}   # graph/limits.py
    compute: {threads: 1, lookahead_ms: 500,         # compute pool workers; how far ahead of its listener a live reply is made
              engines: 1, devices: [cuda:0],         # engine processes (0: in the server's process); a device per engine
              keep_warm_ms: 150,                     # idle compute keeps the first-audio path warm (null: off)
              unit_trace: null,                      # a directory for each runtime's record of its compute units (graph/unit_trace.py)
              graphs: auto}                          # model steps as captured graphs where a node has them (off: eager)

Every error names the offending key (`edges[2]`, `nodes.vad.type`...) so a bad profile fails
with one clear line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from graph import registry
from graph.limits import SessionLimits
from graph.messages import Message
from graph.schema import schema_errors


class GraphConfigError(ValueError):
    """A profile that cannot run. The message starts with the key at fault."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key = key


class GraphConfigErrors(GraphConfigError):
    """Several independent problems (node and resource params): one line each, in `lines`."""

    def __init__(self, lines: list[str]):
        ValueError.__init__(self, "\n".join(lines))
        self.key = lines[0].split(":", 1)[0]
        self.lines = lines


DEFAULT_COMPUTE_THREADS = 1
DEFAULT_LOOKAHEAD_MS = 500
DEFAULT_ENGINES = 1
# `compute: {graphs}`: what the nodes' model steps run as (nodes/qwen3_omni/captured.py,
# captured_code2wav.py).
GRAPHS = ("auto", "off")


@dataclass(frozen=True)
class Port:
    node: str
    stream: str

    def __str__(self) -> str:
        return f"{self.node}.{self.stream}"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    type: str
    params: dict[str, Any]


@dataclass(frozen=True)
class ResourceSpec:
    name: str
    type: str
    params: dict[str, Any]


@dataclass(frozen=True)
class EdgeSpec:
    source: Port
    target: Port


@dataclass
class GraphSpec:
    model_id: str
    imports: list[str]
    resources: dict[str, ResourceSpec]
    nodes: dict[str, NodeSpec]
    edges: list[EdgeSpec]
    inputs: dict[str, Port]
    outputs: list[Port]
    limits: SessionLimits
    extra: dict[str, Any] = field(default_factory=dict)
    # `compute: {threads: N}`: the compute pool's worker threads (graph/executor.py says why 1).
    compute_threads: int = DEFAULT_COMPUTE_THREADS
    # `compute: {lookahead_ms: N}`: how far ahead of its listener a live reply is made (graph/
    # session.py PlaybackClock); null: as fast as the worker can (work-conserving).
    compute_lookahead_s: float | None = DEFAULT_LOOKAHEAD_MS / 1000.0
    # `compute: {engines: N}`: engine processes that run the graph, sessions spread across them
    # (graph/engine_client.py); 0 runs it in the server's own process. `sgl-omni serve` reads this.
    compute_engines: int = DEFAULT_ENGINES
    # `compute: {devices: [...]}`: one device per engine (e.g. cuda:0, cuda:1), replacing the
    # `device` param of every resource that has one in that engine; empty: as the profile says.
    compute_devices: tuple[str, ...] = ()
    # `compute: {keep_warm_ms: N}`: while its compute is idle and it hosts a live session whose
    # turns are not prefilled in their pause, a runtime runs its nodes' `keep_warm` units every N
    # ms (graph/runtime.py); null: never.
    compute_keep_warm_s: float | None = None
    # `compute: {unit_trace: DIR}`: each runtime records its units of compute and its turns'
    # stops and first audio, written to DIR at stop (graph/unit_trace.py); null: off.
    compute_unit_trace: str | None = None
    # `compute: {graphs: auto | off}`: "auto" runs the model steps a node has captured forms of
    # as captured graphs (CUDA graphs on CUDA; the talker's frame: nodes/qwen3_omni/captured.py,
    # code2wav's chunk: captured_code2wav.py);
    # "off" runs every step eagerly. Nodes read it from their context (`NodeContext.graphs`).
    compute_graphs: str = "auto"


_TOP_LEVEL = {"model_id", "imports", "resources", "nodes", "edges", "inputs", "outputs", "limits", "compute"}
# Every top-level key the graph reads (`warmup:` is read by graph/runtime.py from `extra`); a
# server adds the sections its feature packages read and rejects any other key.
GRAPH_SECTIONS = frozenset(_TOP_LEVEL | {"warmup"})


def parse_spec(profile: dict[str, Any]) -> GraphSpec:
    """Structural parse: shapes and names. Types are checked by `validate_spec`."""
    if not isinstance(profile, dict):
        raise GraphConfigError("<profile>", "must be a mapping")
    model_id = profile.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise GraphConfigError("model_id", "must be a non-empty string")

    imports = profile.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise GraphConfigError("imports", "must be a list of module names")

    resources = {}
    for name, entry in _mapping(profile.get("resources", {}), "resources").items():
        resources[name] = ResourceSpec(name, _type_of(entry, f"resources.{name}"), _params_of(entry, f"resources.{name}"))

    nodes = {}
    for name, entry in _mapping(profile.get("nodes"), "nodes").items():
        if "." in name:
            raise GraphConfigError(f"nodes.{name}", "node names cannot contain '.'")
        nodes[name] = NodeSpec(name, _type_of(entry, f"nodes.{name}"), _params_of(entry, f"nodes.{name}"))
    if not nodes:
        raise GraphConfigError("nodes", "a graph needs at least one node")

    edges = []
    raw_edges = profile.get("edges", [])
    if not isinstance(raw_edges, list):
        raise GraphConfigError("edges", "must be a list of 'node.stream -> node.stream'")
    for i, raw in enumerate(raw_edges):
        key = f"edges[{i}]"
        if not isinstance(raw, str) or raw.count("->") != 1:
            raise GraphConfigError(key, f"{raw!r} is not of the form 'node.stream -> node.stream'")
        left, right = (part.strip() for part in raw.split("->"))
        edges.append(EdgeSpec(_port(left, key), _port(right, key)))

    inputs = {name: _port(value, f"inputs.{name}") for name, value in _mapping(profile.get("inputs", {}), "inputs").items()}
    raw_outputs = profile.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise GraphConfigError("outputs", "must be a list of 'node.stream'")
    outputs = [_port(value, f"outputs[{i}]") for i, value in enumerate(raw_outputs)]

    limits_raw = _mapping(profile.get("limits", {}), "limits")
    try:
        limits = SessionLimits.from_dict(limits_raw)
    except (TypeError, ValueError) as exc:
        raise GraphConfigError("limits", str(exc)) from None

    compute = _mapping(profile.get("compute", {}), "compute")
    unknown = sorted(set(compute) - {"threads", "lookahead_ms", "engines", "devices", "keep_warm_ms", "unit_trace", "graphs"})
    if unknown:
        raise GraphConfigError(f"compute.{unknown[0]}", "unknown key (known: threads, lookahead_ms, engines, devices, keep_warm_ms, unit_trace, graphs)")
    threads = compute.get("threads", DEFAULT_COMPUTE_THREADS)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise GraphConfigError("compute.threads", "must be a positive integer")
    lookahead_ms = compute.get("lookahead_ms", DEFAULT_LOOKAHEAD_MS)
    if lookahead_ms is not None and (not isinstance(lookahead_ms, (int, float)) or isinstance(lookahead_ms, bool) or lookahead_ms < 0):
        raise GraphConfigError("compute.lookahead_ms", "must be a number of milliseconds >= 0, or null")
    keep_warm_ms = compute.get("keep_warm_ms")
    if keep_warm_ms is not None and (not isinstance(keep_warm_ms, (int, float)) or isinstance(keep_warm_ms, bool) or keep_warm_ms <= 0):
        raise GraphConfigError("compute.keep_warm_ms", "must be a number of milliseconds > 0, or null")

    unit_trace = compute.get("unit_trace")
    if unit_trace is not None and (not isinstance(unit_trace, str) or not unit_trace):
        raise GraphConfigError("compute.unit_trace", "must be a directory path, or null")

    engines = compute.get("engines", DEFAULT_ENGINES)
    if not isinstance(engines, int) or isinstance(engines, bool) or engines < 0:
        raise GraphConfigError("compute.engines", "must be an integer >= 0 (0: run the graph in the server's process)")
    devices = compute.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) and d for d in devices):
        raise GraphConfigError("compute.devices", "must be a list of device names (cpu, cuda:0, ...)")
    if devices and len(devices) != max(engines, 1):
        raise GraphConfigError("compute.devices", f"names {len(devices)} devices for {engines} engines: give one per engine")

    graphs = compute.get("graphs", "auto")
    if graphs not in GRAPHS:
        raise GraphConfigError("compute.graphs", f"must be one of {', '.join(GRAPHS)} (off: every model step eager)")

    extra = {k: v for k, v in profile.items() if k not in _TOP_LEVEL}
    return GraphSpec(model_id, imports, resources, nodes, edges, inputs, outputs, limits, extra, threads,
                     None if lookahead_ms is None else lookahead_ms / 1000.0, engines, tuple(devices),
                     None if keep_warm_ms is None else keep_warm_ms / 1000.0, unit_trace, graphs)


def validate_spec(spec: GraphSpec) -> None:
    """Check node types, streams, stream types and cycles. Call after `registry.import_modules`."""
    classes = {}
    for name, node in spec.nodes.items():
        cls = registry.node_class(node.type)
        if cls is None:
            known = ", ".join(registry.node_types()) or "none"
            raise GraphConfigError(f"nodes.{name}.type", f"unknown node type {node.type!r} (known: {known})")
        classes[name] = cls
    for name, resource in spec.resources.items():
        if registry.resource_factory(resource.type) is None:
            raise GraphConfigError(f"resources.{name}.type", f"unknown resource type {resource.type!r}")

    def stream_types(port: Port, key: str, direction: str) -> tuple[type[Message], ...]:
        if port.node not in classes:
            raise GraphConfigError(key, f"{port} names a missing node {port.node!r}")
        streams = getattr(classes[port.node], direction)
        if port.stream not in streams:
            known = ", ".join(sorted(streams)) or "none"
            raise GraphConfigError(key, f"node {port.node!r} has no {direction[:-1]} stream {port.stream!r} (its {direction}: {known})")
        return streams[port.stream]

    for i, edge in enumerate(spec.edges):
        key = f"edges[{i}]"
        produced = stream_types(edge.source, key, "outputs")
        accepted = stream_types(edge.target, key, "inputs")
        for message_type in produced:
            if not issubclass(message_type, accepted):
                raise GraphConfigError(
                    key,
                    f"{edge.source} may carry {message_type.__name__}, which {edge.target} does not accept "
                    f"(it accepts {', '.join(t.__name__ for t in accepted)})",
                )
    for name, port in spec.inputs.items():
        stream_types(port, f"inputs.{name}", "inputs")
    for i, port in enumerate(spec.outputs):
        stream_types(port, f"outputs[{i}]", "outputs")

    _reject_cycles(spec)
    problems = params_errors(spec)
    if "warmup" in spec.extra:
        warmup_problems = schema_errors(spec.extra["warmup"], Warmup, "warmup")
        problems += warmup_problems
        warmup_input = None if warmup_problems else (spec.extra["warmup"] or {}).get("input", "speech")
        if warmup_input is not None and warmup_input not in spec.inputs:
            problems.append(f"warmup.input: {warmup_input!r} is not a graph input (inputs: {', '.join(sorted(spec.inputs)) or 'none'})")
    if problems:
        raise GraphConfigErrors(problems)


class Warmup(msgspec.Struct, forbid_unknown_fields=True):
    """`warmup:` one reply run through the graph before /health is 200 (graph/runtime.py)."""

    input: str = "speech"
    text: str = "Hello."
    timeout_s: float = 300.0


def params_errors(spec: GraphSpec) -> list[str]:
    """One line per node or resource whose `params` do not fit its type's schema (graph/schema.py)."""
    problems = []
    for name, node in spec.nodes.items():
        schema = registry.node_class(node.type).params_schema
        if schema is not None:
            problems += schema_errors(node.params, schema, f"nodes.{name}.params")
    for name, resource in spec.resources.items():
        schema = registry.resource_params_schema(resource.type)
        if schema is not None:
            problems += schema_errors(resource.params, schema, f"resources.{name}.params")
    return problems


def _reject_cycles(spec: GraphSpec) -> None:
    successors: dict[str, list[tuple[str, int]]] = {name: [] for name in spec.nodes}
    for i, edge in enumerate(spec.edges):
        successors[edge.source.node].append((edge.target.node, i))
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(spec.nodes, WHITE)

    def visit(node: str, path: list[str]) -> None:
        colour[node] = GREY
        for successor, edge_index in successors[node]:
            if colour[successor] == GREY:
                loop = " -> ".join([*path[path.index(successor):], successor]) if successor in path else f"{node} -> {successor}"
                raise GraphConfigError(f"edges[{edge_index}]", f"data edges form a cycle ({loop})")
            if colour[successor] == WHITE:
                visit(successor, [*path, successor])
        colour[node] = BLACK

    for name in spec.nodes:
        if colour[name] == WHITE:
            visit(name, [name])


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        raise GraphConfigError(key, "is required")
    if not isinstance(value, dict):
        raise GraphConfigError(key, "must be a mapping")
    return value


def _type_of(entry: Any, key: str) -> str:
    if not isinstance(entry, dict):
        raise GraphConfigError(key, "must be a mapping with a `type`")
    node_type = entry.get("type")
    if not isinstance(node_type, str) or not node_type:
        raise GraphConfigError(f"{key}.type", "is required")
    unknown = set(entry) - {"type", "params"}
    if unknown:
        raise GraphConfigError(f"{key}.{sorted(unknown)[0]}", "unknown key (expected `type` and `params`)")
    return node_type


def _params_of(entry: dict[str, Any], key: str) -> dict[str, Any]:
    params = entry.get("params") or {}
    if not isinstance(params, dict):
        raise GraphConfigError(f"{key}.params", "must be a mapping")
    return params


def _port(text: Any, key: str) -> Port:
    if not isinstance(text, str) or text.count(".") != 1 or not all(text.split(".")):
        raise GraphConfigError(key, f"{text!r} is not of the form 'node.stream'")
    node, stream = text.split(".")
    return Port(node.strip(), stream.strip())
