"""Issue 16 (13): fire-and-forget tasks are held until done and their failures are logged."""

from __future__ import annotations

import asyncio
import gc
import logging

from graph.background import running, spawn
from graph.edges import Inbox
from tests.conftest import eventually


async def test_a_spawned_task_nobody_holds_survives_garbage_collection_and_finishes():
    finished = asyncio.Event()
    gate = asyncio.Event()

    async def close_later():
        await gate.wait()
        finished.set()

    spawn(close_later(), name="close")  # the only reference is the one spawn keeps
    await asyncio.sleep(0)
    gc.collect()
    gate.set()
    await asyncio.wait_for(finished.wait(), 5)
    await eventually(lambda: running() == 0, "spawn to let go of the finished task")


async def test_a_spawned_task_that_fails_is_logged_not_lost(caplog):
    async def broken():
        raise RuntimeError("close failed")

    with caplog.at_level(logging.ERROR, logger="graph"):
        spawn(broken(), name="sess_x:close")
        await eventually(lambda: running() == 0, "the broken task to finish")
    assert any("sess_x:close" in r.getMessage() and r.exc_info and "close failed" in str(r.exc_info[1]) for r in caplog.records)
    assert running() == 0


async def test_closing_an_inbox_wakes_its_reader_through_a_held_task():
    inbox: Inbox[int] = Inbox(4)
    reader = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.close()
    gc.collect()
    done, _ = await asyncio.wait({reader}, timeout=5)
    assert reader in done and isinstance(reader.exception(), Exception)
