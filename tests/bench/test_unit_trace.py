"""The optional unit trace (graph/unit_trace.py) and its reader (benchmarks/unit_trace.py)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from benchmarks import unit_trace
from graph.messages import AudioOut, InputSpeechStopped, ReplyParams, Turn, TurnDone
from graph.node import Node, NodeSession
from graph.registry import register_node
from graph.runtime import GraphRuntime
from graph.spec import GraphConfigError


@register_node("test.traced_turn")
class TracedTurn(Node):
    """A turn as the reply side sees it: speech stops, one unit before its first audio, one after."""

    inputs = {"turns": (Turn,)}
    outputs = {"out": (InputSpeechStopped, AudioOut, TurnDone)}
    follows_playback = True

    def open_session(self, session):
        node = self

        class State(NodeSession):
            async def on_message(self, stream, message, emit):
                await emit("out", InputSpeechStopped(audio_end_ms=0.0, item_id="item_a"))
                await node.context.compute.run(sum, [1, 2])
                await emit("out", AudioOut(turn_id=message.turn_id, samples=np.zeros(2400, np.float32)))
                await node.context.compute.run(max, [1, 2])
                await emit("out", AudioOut(turn_id=message.turn_id, samples=np.zeros(2400, np.float32)))
                await emit("out", TurnDone(turn_id=message.turn_id, response_id=message.reply.response_id))

        return State(self, session)


def profile(trace_dir=None) -> dict:
    return {
        "model_id": "m",
        "imports": ["tests.bench.test_unit_trace"],
        "nodes": {"turn": {"type": "test.traced_turn"}},
        "inputs": {"turns": "turn.turns"},
        "outputs": ["turn.out"],
        "compute": {"unit_trace": None if trace_dir is None else str(trace_dir)},
    }


async def run_turn(runtime: GraphRuntime) -> None:
    session = await runtime.open_session("s")
    await session.send("turns", Turn(turn_id=1, reply=ReplyParams(response_id="r")))
    async with asyncio.timeout(5):
        async for message in session.outputs():
            if isinstance(message, TurnDone):
                break


async def test_a_traced_runtime_writes_its_units_with_the_reply_phase_they_served_and_its_turns(tmp_path):
    runtime = GraphRuntime.from_config(profile(tmp_path))
    await runtime.start()
    try:
        await run_turn(runtime)
    finally:
        await runtime.stop(0)

    (path,) = tmp_path.glob("units-*.json")
    trace = json.loads(path.read_text())
    phases = {name: item_phases for _, _, _, name, item_phases in trace["units"]}
    assert phases["sum"] == ["first"] and phases["max"] == ["playing"]
    assert [kind for _, _, kind in trace["turns"]] == ["speech_stopped", "first_audio"]  # the first audio only
    assert [(node, kind) for _, _, node, kind in trace["hops"]] == [("turn", "Turn")]  # when the node took the turn

    (summary,) = unit_trace.summarize(str(tmp_path))
    (level,) = summary["levels"]
    assert level["turns"] == 1 and level["ttfa_ms"]["p50"] > 0
    assert set(level["slowest"]["engine_ms_by_phase"]) == {"first"}  # between its stop and first audio


async def test_without_a_trace_the_pool_records_nothing():
    runtime = GraphRuntime.from_config(profile())
    await runtime.start()
    try:
        assert runtime.compute.trace is None
        await run_turn(runtime)
    finally:
        await runtime.stop(0)


def test_a_unit_trace_that_is_not_a_directory_path_is_refused_naming_the_key():
    with pytest.raises(GraphConfigError) as refused:
        GraphRuntime.from_config({**profile(), "compute": {"unit_trace": 5}})
    assert refused.value.key == "compute.unit_trace"


def test_turns_split_into_levels_at_pauses_between_turn_ends():
    turns = [(0.0, 0.01), (0.5, 0.52), (10.0, 10.02), (11.0, 11.05)]
    assert unit_trace.levels_of(turns, gap_s=3.0) == [turns[:2], turns[2:]]


def test_the_bench_s_level_windows_pick_each_level_s_turns(tmp_path):
    (tmp_path / "units-1.json").write_text(json.dumps({
        "units": [[0.001, 0.005, 0.004, "talker", ["first"]], [10.001, 10.02, 0.019, "talker", ["playing", "first"]]],
        "turns": [[0.0, "a", "speech_stopped"], [0.01, "a", "first_audio"],
                  [10.0, "b", "speech_stopped"], [10.03, "b", "first_audio"]],
    }))
    (summary,) = unit_trace.summarize(str(tmp_path), windows=[("N=1", -1.0, 5.0), ("N=2", 5.0, 20.0)])
    first, second = summary["levels"]
    assert (first["level"], first["turns"], first["ttfa_ms"]["p50"]) == ("N=1", 1, 10.0)
    assert (second["level"], second["ttfa_ms"]["p50"]) == ("N=2", 30.0)
    # The second turn's window held one unit, shared by its two items' phases.
    assert second["slowest"]["engine_ms_by_phase"] == {"playing": 9.5, "first": 9.5}
