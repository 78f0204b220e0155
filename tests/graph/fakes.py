"""Small fake nodes that exercise the runtime without any model."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from graph.executor import ComputePool
from graph.messages import AudioChunk, Control, Interrupt, Message, TextDelta, Turn, TurnDone
from graph.node import Node, NodeSession
from graph.registry import register_node, register_resource


async def occupy(pool: ComputePool, gate: threading.Event) -> asyncio.Future:
    """Makes a call that holds a worker thread until `gate` is set; returns once it is running."""
    running = threading.Event()

    def hold():
        running.set()
        return gate.wait(10)

    blocker = asyncio.ensure_future(pool.run(hold))
    while not running.is_set():
        await asyncio.sleep(0.001)
    return blocker


async def wait_queued(queue_depth, n: int) -> None:
    """Waits (5 s at most) until `queue_depth()` reports `n` queued items."""
    async with asyncio.timeout(5):
        while queue_depth() < n:
            await asyncio.sleep(0.001)


@register_node("test.relay")
class Relay(Node):
    """Forwards audio chunks; records every session it opened and closed."""

    inputs = {"audio": (AudioChunk,)}
    outputs = {"audio": (AudioChunk,)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.opened: list[str] = []
        self.closed: list[str] = []

    def open_session(self, session):
        self.opened.append(session.session_id)
        node = self

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                await emit("audio", message)

            async def close(self):
                node.closed.append(self.session.session_id)

        return State(self, session)


@register_node("test.sink")
class Sink(Node):
    """Takes audio; `params.delay_s` makes it a slow consumer; `params.fail_on` makes it raise."""

    inputs = {"audio": (AudioChunk,)}
    outputs = {"text": (TextDelta, TurnDone)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[str, list[float]] = {}
        self.controls: dict[str, list[Control]] = {}
        self.gate = asyncio.Event()
        self.gate.set()

    def open_session(self, session):
        node = self
        seen = self.seen.setdefault(session.session_id, [])
        controls = self.controls.setdefault(session.session_id, [])

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                await node.gate.wait()
                if node.params.get("delay_s"):
                    await asyncio.sleep(node.params["delay_s"])
                if node.params.get("fail_on") == message.media_ms:
                    raise RuntimeError("boom")
                seen.append(message.media_ms)
                await emit("text", TextDelta(turn_id=message.turn_id, text=f"{message.media_ms:g}"))

            def on_control(self, control):
                controls.append(control)

        return State(self, session)


@register_node("test.compute")
class ComputeNode(Node):
    """Runs a blocking 'model step' through the compute pool and reports which thread ran it;
    `params.held`: each step waits for `release` to be set before it goes on."""

    inputs = {"turns": (Turn,)}
    outputs = {"done": (TurnDone,)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stepping = threading.Event()  # set once a step has started
        self.release = threading.Event()
        if not self.params.get("held"):
            self.release.set()

    def open_session(self, session):
        node = self

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                def step():
                    node.stepping.set()
                    node.release.wait(10)
                    # Blocks its thread for a while, like a forward pass would.
                    threading.Event().wait(0.2)
                    return threading.current_thread().name

                thread_name = await node.context.compute.run(step)
                await emit("done", TurnDone(turn_id=message.turn_id, response_id=_reply_id(message), reason=thread_name))

        return State(self, session)


@register_node("test.text_source")
class TextSource(Node):
    """Emits text but accepts only turns: used to prove stream type checks."""

    inputs = {"turns": (Turn,)}
    outputs = {"text": (TextDelta,)}

    def open_session(self, session):
        return NodeSession(self, session)


@register_node("test.warm_relay")
class WarmRelay(Relay):
    """A relay with a keep-warm unit that counts its runs (and the thread they ran on)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.warmed: list[str] = []

    def keep_warm(self):
        return lambda: self.warmed.append(threading.current_thread().name)

    def open_session(self, session):
        state = super().open_session(session)
        state.warms_ahead = lambda: bool(session.config.get("warms_ahead"))  # as a VAD with early prefill says
        return state


def _reply_id(turn: Turn) -> str:
    """The response id a reply-side node's `TurnDone` carries: its reply's (graph/replies.py)."""
    return turn.reply.response_id if turn.reply is not None else ""


def chunk(ms: float, turn_id: int = -1) -> Message:
    return AudioChunk(samples=np.zeros(160, dtype=np.float32), sample_rate=16000, media_ms=ms, turn_id=turn_id)


def relay_sink_profile(**sink_params) -> dict:
    return {
        "model_id": "test-model",
        "imports": ["tests.graph.fakes"],
        "nodes": {
            "relay": {"type": "test.relay"},
            "sink": {"type": "test.sink", "params": sink_params},
        },
        "edges": ["relay.audio -> sink.audio"],
        "inputs": {"audio": "relay.audio"},
        "outputs": ["sink.text"],
        "limits": {"max_sessions": 4, "edge_capacity": 4, "output_capacity": 4},
    }


__all__ = ["Interrupt", "chunk", "relay_sink_profile"]


@register_resource("test.slow_resource")
def slow_resource(params):
    """Stands in for a checkpoint that takes a while to load (or fails to)."""
    threading.Event().wait(params.get("delay_s", 0))
    if params.get("path") == "/nonexistent":
        raise FileNotFoundError("checkpoint directory /nonexistent does not exist")
    return {"path": params.get("path")}
