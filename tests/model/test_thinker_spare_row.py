"""The thinker node builds a truncation ahead in the engine's spare row (nodes/qwen3_omni/spare_row.py)
while its session's turns go on; a turn that needs the room before the build is done waits for the
rest; a session closed mid-build gives the spare row back. The build is held at a gate here, so
that each case happens when the test says, not when the idle compute happens to get to it."""

from __future__ import annotations

import asyncio

import pytest

from graph.executor import PRIORITY_REALTIME
from graph.messages import ReplyParams, Turn
from nodes.qwen3_omni import spare_row
from tests.conftest import eventually
from tests.model.test_thinker_nodes import start_runtime, until_done  # noqa: F401 - the fixture

CONTEXT = 400


@pytest.fixture
def gate(monkeypatch):
    """Builds ahead wait for `gate.set()` before their first chunk."""
    opened = asyncio.Event()
    build = spare_row.build

    async def held(spare, compute):
        await opened.wait()
        await build(spare, compute)

    monkeypatch.setattr(spare_row, "build", held)
    return opened


async def text_turn(session, n: int):
    await session.send("turns", Turn(turn_id=n, item_id=f"i{n}", text=f"Question number {n}: what do you think?",
                                     reply=ReplyParams(response_id=f"r{n}")))
    return (await until_done(session, timeout=60))[-1]


async def test_turns_go_on_during_a_build_ahead_and_one_that_needs_the_room_waits_for_it(start_runtime, gate):
    runtime = await start_runtime(max_seq_len=CONTEXT)
    thinker = runtime.nodes["thinker"]
    session = await runtime.open_session("s1")
    done = [await text_turn(session, 1)]
    while thinker.spare is None:  # until the context is a few turns from full
        done.append(await text_turn(session, len(done) + 1))
        assert len(done) < 40, "no truncation was planned ahead"
    assert thinker.truncations["truncations"] == 0
    spare = thinker.spare
    # A turn that fits goes on in the session's own row, appending to its cache.
    during = await text_turn(session, len(done) + 1)
    done.append(during)
    assert not spare.ready and thinker.spare is spare
    assert during.usage.cached_tokens == done[-2].usage.input_tokens + done[-2].usage.output_tokens
    # Turns until one needs the room: it waits for the build, which is let go only then.
    n, waiting = len(done) + 1, None
    while not thinker.truncations["truncation_waits"]:
        await session.send("turns", Turn(turn_id=n, item_id=f"i{n}", text=f"Question number {n}: what do you think?",
                                         reply=ReplyParams(response_id=f"r{n}")))
        waiting = asyncio.ensure_future(until_done(session, timeout=60))
        while not waiting.done() and not thinker.truncations["truncation_waits"]:
            await asyncio.sleep(0.01)
        if waiting.done():
            done.append(waiting.result()[-1])
            waiting, n = None, n + 1
            assert n < 80, "no turn needed the room"
    assert not spare.ready
    # The rest of the build is live work now: at live priority, in the usual prefill chunks.
    assert spare.priority == PRIORITY_REALTIME and spare.chunk_tokens == spare.session.prefill_chunk_tokens
    gate.set()
    if waiting is not None:
        done.append((await waiting)[-1])
    await eventually(lambda: thinker.truncations["truncations_ahead"] == 1, "the build to be adopted")
    done.append(await text_turn(session, n + 1))
    assert [d.status for d in done] == ["completed" if d.reason is None else "incomplete" for d in done]
    assert thinker.truncations["truncations_ahead"] == 1 and thinker.truncations["truncations"] >= 1
    assert all(d.usage.input_tokens <= CONTEXT for d in done)
    assert thinker.spare is not spare  # adopted (a later plan may hold the spare again)
    await session.close()
    cache = thinker.executor.runner.cache
    await eventually(lambda: cache.rows_in_use == 0, "every row to be given back")


async def test_a_session_closed_mid_build_gives_the_spare_row_back(start_runtime, gate):
    runtime = await start_runtime(max_seq_len=CONTEXT)
    thinker = runtime.nodes["thinker"]
    cache = thinker.executor.runner.cache
    session = await runtime.open_session("s2")
    n = 1
    while thinker.spare is None:
        await text_turn(session, n)
        n += 1
        assert n < 40, "no truncation was planned ahead"
    gate.set()
    await eventually(lambda: cache.rows_in_use == 2, "the build to take the spare row")
    await session.close()
    await eventually(lambda: cache.rows_in_use == 0 and thinker.spare is None, "the spare row to be given back")
