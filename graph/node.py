"""The node API: what a stage of the graph implements.

A `Node` is loaded once per server (it owns model handles and shared executors). For every live
session the runtime asks it for a `NodeSession`, which owns that session's state (VAD state,
utterance buffer, KV cache handle...). Data reaches a node session in order through
`on_message`; controls reach it at once through `on_control`, ahead of queued data.

A node declares its streams as class attributes:

    class Vad(Node):
        inputs = {"audio": (AudioChunk, Command)}
        outputs = {"events": (AudioChunk, SpeechStarted, SpeechStopped, Command)}

A stream accepts the union of the message types it names; an edge `a.out -> b.in` is valid
when every type `a.out` may carry is accepted by `b.in`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from graph.limits import SessionLimits
from graph.messages import Control, Message
from graph.replies import Replies

if TYPE_CHECKING:
    from graph.executor import ComputePool


class Emit(Protocol):
    """Sends a message downstream on one of the node's output streams.

    Awaiting it applies backpressure: it waits while the downstream edge is full.
    """

    async def __call__(self, stream: str, message: Message) -> None: ...


class SessionInfo:
    """What a node session may know about the session it serves."""

    def __init__(self, session_id: str, kind: str = "realtime", config: dict[str, Any] | None = None):
        self.session_id = session_id
        # "realtime" for live sessions; "speech" for stateless speech requests (lower priority).
        self.kind = kind
        self.config: dict[str, Any] = dict(config or {})
        # The replies the session's graph is working on (GraphSession keeps it; nodes read it).
        self.replies = Replies()


class NodeSession:
    """Per-session state and behaviour of one node. Override what the node needs."""

    def __init__(self, node: Node, session: SessionInfo):
        self.node = node
        self.session = session

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        """Handle one data message that arrived on input `stream`."""

    def on_control(self, control: Control) -> None:
        """Called at once when a control arrives, before any queued data is handled.

        Must not block: set a flag or cancel work; the in-flight step checks it.
        """

    def warms_ahead(self) -> bool:
        """Whether this session's turns start their first stages before the turn ends (early
        prefill): that warms the first-audio path the runtime's keep-warm exists for."""
        return False

    async def close(self) -> None:
        """Free everything this session holds (KV rows, buffers). Called exactly once."""


class Node(abc.ABC):
    """A stage of the graph, loaded once, shared by all sessions."""

    inputs: ClassVar[dict[str, tuple[type[Message], ...]]] = {}
    outputs: ClassVar[dict[str, tuple[type[Message], ...]]] = {}
    # Nodes on the way to a reply's audio (preprocessing through code2wav): their compute is due
    # when the session's listener would run out of reply audio, or has been waiting since its
    # turn ended, not when it is submitted (graph/executor.py, graph/session.py PlaybackClock).
    follows_playback: ClassVar[bool] = False
    # The typed schema of the profile's `params` for this node (graph/schema.py), checked with the
    # whole profile before anything loads; None: unchecked (test fakes).
    params_schema: ClassVar[type | None] = None

    def __init__(self, name: str, params: dict[str, Any], context: NodeContext):
        self.name = name
        self.params = dict(params)
        self.context = context

    async def start(self) -> None:
        """Load models and warm up. Heavy work must go through `self.context.compute`."""

    @abc.abstractmethod
    def open_session(self, session: SessionInfo) -> NodeSession:
        """Create this node's state for a new session."""

    async def stop(self) -> None:
        """Release shared resources at server shutdown."""

    def counters(self) -> dict[str, int]:
        """Events this node counts since start, by name (exported as `sgl_omni_node_events_total`
        {node, event}); e.g. the thinker's early prefills by outcome."""
        return {}

    def kv_rows(self) -> int | None:
        """Sessions this node's KV allocated at start holds (a preallocated slot cache: one row per
        session), which caps admission (graph/runtime.py); None: it holds no such KV, or its KV
        grows on demand."""
        return None

    def keep_warm(self) -> Callable[[], None] | None:
        """A small computation through this node's model code on dummy input (None: nothing to
        keep warm). The runtime runs it while its compute is idle and it hosts a live session
        (`compute: {keep_warm_ms}`), so that a turn ending after seconds of the user speaking
        finds this code and its data still in the CPU's caches."""
        return None


class NodeContext:
    """What the runtime gives every node: shared resources, the compute pool and the profile's
    `compute: {graphs}` (whether model steps run as captured graphs where the node has them)."""

    def __init__(self, resources: dict[str, Any], compute: ComputePool, limits: SessionLimits | None = None,
                 graphs: str = "auto"):
        self.resources = resources
        self.compute = compute
        # The profile's limits: what a node sizes its KV allocated at start from (kv_sessions, max_seq_len).
        self.limits = limits if limits is not None else SessionLimits()
        self.graphs = graphs

    def resource(self, name: str) -> Any:
        try:
            return self.resources[name]
        except KeyError:
            raise KeyError(f"resource {name!r} is not declared in the config's `resources`") from None
