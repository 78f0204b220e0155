"""Engine processes: the graph runs in child processes, the server keeps the transports.

These run the realtime test profile (server VAD, dialog, a fake reply node) in real engine
processes, as `sgl-omni serve` does, and drive them with the OpenAI SDK and raw sockets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import httpx
import numpy as np
import psutil
import pytest
import websockets
import yaml

from graph.messages import (
    AddItem,
    Clear,
    Commit,
    Configure,
    CreateResponse,
    DeleteItem,
    Embeddings,
    Features,
    InputEnd,
    ReplyParams,
    Stage,
    TurnMeta,
)
from graph.sched import policy_of
from graph.wire import Link
from tests.conftest import free_port, http_client, running_server, serve_process, wait_until
from tests.realtime.client import RawClient, append_pcm, sdk_client, until, utterance
from tests.realtime.fakes import realtime_profile



def engine_profile(engines: int = 1, **reply) -> dict:
    profile = realtime_profile(reply={"words": 3, "chunk_ms": 100, **reply})
    profile["compute"] = {"engines": engines}
    return profile


async def text_turn(conn, text: str = "Hello") -> list:
    await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()
    return await until(conn, "response.done")


async def test_every_command_crosses_the_engine_link_as_the_same_typed_message():
    ours, theirs = socket.socketpair()
    sender, receiver = await Link.over(ours), await Link.over(theirs)
    audio = np.linspace(-1, 1, 480, dtype=np.float32)
    sent = [
        Configure(target=Stage.VAD, config={"turn_detection": None, "auto_reply": ReplyParams(voice="ethan")}),
        Commit(), Clear(), InputEnd(),
        AddItem(item_id="item_a", role="user", text="hi", images=(b"png",), insert_after=["item_0"], sample_rate=24000),
        AddItem(item_id="item_b", role="assistant", call={"name": "f", "arguments": "{}"}),
        DeleteItem(item_id="item_a", response_id="resp_a"),
        CreateResponse(reply=ReplyParams(response_id="resp_b", tools=({"type": "function", "name": "f"},))),
    ]
    try:
        for command in sent:
            sender.send("input", "sess_1", command)
        sender.send("input", "sess_1", AddItem(item_id="item_c", role="user", audio=audio))
        records = await receiver.receive()
    finally:
        sender.close()
        receiver.close()
    received = [payload for _, _, payload in records]
    assert received[:-1] == sent and [type(m) for m in received[:-1]] == [type(m) for m in sent]
    with_audio = received[-1]
    assert isinstance(with_audio, AddItem) and with_audio.target == "dialog"
    assert with_audio.audio.dtype == np.float32 and np.array_equal(with_audio.audio, audio)


async def test_turn_meta_crosses_the_engine_link_unchanged():
    ours, theirs = socket.socketpair()
    sender, receiver = await Link.over(ours), await Link.over(theirs)
    meta = TurnMeta(role="user", insert_after=["item_0"], delete_key="item_x", text_tokens=5,
                    audio_tokens=7, image_tokens=2, awaited=True, transcribe={"language": "en"},
                    speculative=True, confirms="early_1", retracts="early_0", speak=True, text="hi")
    sent = [
        Features(session_id="sess_1", turn_id=3, item_id="item_a", reply=ReplyParams(response_id="resp_a"), meta=meta),
        Embeddings(session_id="sess_1", turn_id=3, item_id="item_a", meta=meta),
        Features(),
    ]
    try:
        for message in sent:
            sender.send("output", "sess_1", message)
        records = await receiver.receive()
    finally:
        sender.close()
        receiver.close()
    received = [payload for _, _, payload in records]
    assert received == sent and [type(m) for m in received] == [type(m) for m in sent]
    assert all(type(m.meta) is TurnMeta for m in received)
    assert received[1].meta == meta and received[2].meta == TurnMeta()


async def test_a_session_runs_in_an_engine_process_not_the_server():
    async with running_server(engine_profile(), engines=True) as server:
        pids = server.runtime.engine_pids()
        assert len(pids) == 1 and pids[0] != os.getpid()
        async with sdk_client(server).realtime.connect(model="test-realtime") as conn:
            events = await text_turn(conn)
        done = events[-1]
        assert done.response.status == "completed"
        assert sum(1 for e in events if e.type == "response.output_audio.delta") == 3
        assert [e.delta for e in events if e.type == "response.output_audio_transcript.delta"] == ["word0 ", "word1 ", "word2 "]
        # The engine keeps the session's history across turns (its "KV"), as in one process.
        async with sdk_client(server).realtime.connect(model="test-realtime") as conn:
            first = (await text_turn(conn, "one two three"))[-1]
            second = (await text_turn(conn, "four"))[-1]
        assert second.response.usage.input_token_details.cached_tokens == first.response.usage.input_tokens + 3


async def test_sessions_are_spread_across_engines():
    async with running_server(engine_profile(engines=2), engines=True) as server:
        runtime = server.runtime
        assert len(set(runtime.engine_pids())) == 2
        client = sdk_client(server)
        async with client.realtime.connect(model="test-realtime") as a, client.realtime.connect(model="test-realtime") as b:
            await until(a, "session.created")
            await until(b, "session.created")
            assert sorted(len(engine.sessions) for engine in runtime.engines) == [1, 1]
            done_a, done_b = await asyncio.gather(text_turn(a), text_turn(b))
        assert done_a[-1].response.status == done_b[-1].response.status == "completed"


async def test_metrics_count_the_engines_batched_calls_and_the_steps_they_held():
    from prometheus_client.parser import text_string_to_metric_families

    async with running_server(engine_profile(engines=2), engines=True) as server:
        async with sdk_client(server).realtime.connect(model="test-realtime") as conn:
            await until(conn, "session.created")
            await append_pcm(conn, utterance(tail_s=0.2))
            counts: dict[str, float] = {}
            async with http_client(server) as http:
                for _ in range(40):  # engines report every 0.5 s
                    text = (await http.get("/metrics")).text
                    counts = {f"{sample.name}:{sample.labels['executor']}": sample.value
                              for family in text_string_to_metric_families(text) for sample in family.samples
                              if sample.name in ("sgl_omni_batches_total", "sgl_omni_batch_items_total")}
                    if counts.get("sgl_omni_batches_total:silero_vad"):
                        break
                    await asyncio.sleep(0.1)
    assert counts["sgl_omni_batches_total:silero_vad"] > 0
    assert counts["sgl_omni_batch_items_total:silero_vad"] >= counts["sgl_omni_batches_total:silero_vad"]


async def test_metrics_sum_the_node_events_the_engines_count():
    from prometheus_client.parser import text_string_to_metric_families

    async with running_server(engine_profile(engines=2), engines=True) as server:
        client = sdk_client(server)
        async with client.realtime.connect(model="test-realtime") as a, client.realtime.connect(model="test-realtime") as b:
            await asyncio.gather(text_turn(a), text_turn(b))
            await text_turn(a)
            replies = 0.0
            async with http_client(server) as http:
                for _ in range(40):  # engines report every 0.5 s
                    text = (await http.get("/metrics")).text
                    replies = sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                                  if sample.name == "sgl_omni_node_events_total"
                                  and sample.labels == {"node": "reply", "event": "replies"})
                    if replies >= 3:
                        break
                    await asyncio.sleep(0.1)
    assert replies == 3  # two on one engine, one on the other, summed


async def test_a_killed_engine_ends_its_sessions_with_engine_failed_and_is_replaced():
    async with running_server(engine_profile(delay_s=0.2), engines=True) as server:
        runtime = server.runtime
        [old_pid] = runtime.engine_pids()
        async with websockets.connect(server.ws_url + "/v1/realtime?model=test-realtime") as ws:
            client = RawClient(ws)
            await client.until("session.created")
            await client.send({"type": "response.create"})
            await client.until("response.output_audio.delta")
            os.kill(old_pid, signal.SIGKILL)
            error = await client.until("error")
            assert error[-1]["error"]["code"] == "engine_failed"
            closed = await client.until("session.closed")
            assert closed[-1]["reason"] == "error: engine_failed"
        # The server stayed up and starts a new engine in the old one's place.
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            async with asyncio.timeout(60):
                while not runtime.engine_pids() or runtime.engine_pids() == [old_pid]:
                    await asyncio.sleep(0.05)
                assert (await http.get("/health")).status_code == 200
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
        async with sdk_client(server).realtime.connect(model="test-realtime") as conn:
            events = await text_turn(conn)
        assert events[-1].response.status == "completed"


async def test_a_cancel_stops_a_reply_running_in_an_engine_within_a_few_words():
    # 50 words 20 ms apart: about a second of reply left when the cancel crosses the link.
    async with running_server(engine_profile(words=50, delay_s=0.02), engines=True) as server:
        async with sdk_client(server).realtime.connect(model="test-realtime") as conn:
            await conn.response.create()
            await until(conn, "response.output_audio.delta")
            await conn.response.cancel()
            events = await until(conn, "response.done")
    assert events[-1].response.status == "cancelled"
    audio = sum(1 for event in events if event.type == "response.output_audio.delta")
    assert audio < 25, audio  # one audio delta a word: the engine stopped the reply midway


def test_sigterm_lets_a_live_reply_in_an_engine_finish_then_exits_zero(tmp_path):
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(engine_profile(words=10, delay_s=0.1)))
    port = free_port()
    with serve_process(config, port) as process:
        engine_pids = [child.pid for child in psutil.Process(process.pid).children()]
        assert len(engine_pids) == 1

        async def reply_through_shutdown() -> list[dict]:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=test-realtime") as ws:
                client = RawClient(ws)
                await client.until("session.created")
                await client.send({"type": "response.create"})
                await client.until("response.output_audio.delta")
                process.send_signal(signal.SIGTERM)
                return await client.until("session.closed")

        events = asyncio.run(reply_through_shutdown())
        output, _ = process.communicate(timeout=30)
    done = [e for e in events if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["completed"]
    assert sum(1 for e in events if e["type"] == "response.output_audio.delta") == 9  # the other 9 words' audio
    assert events[-1]["reason"] == "server_shutdown"
    assert process.returncode == 0, output
    assert all(not psutil.pid_exists(pid) for pid in engine_pids)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_with_server_sched_batch_the_server_runs_as_sched_batch_and_its_engines_as_normal(tmp_path):
    # The server's wake-ups must not preempt an engine mid-unit; the engines put themselves back
    # to the normal policy they would otherwise inherit (graph/sched.py).
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(engine_profile(words=2, delay_s=0.01)))
    with serve_process(config, free_port(), "--server-sched", "batch") as process:
        [engine_pid] = [child.pid for child in psutil.Process(process.pid).children()]
        assert policy_of(process.pid) == "batch"
        assert policy_of(engine_pid) == "normal"


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_by_default_the_server_yields_to_its_engines_only_while_the_machine_is_busy(tmp_path):
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(engine_profile(words=2, delay_s=0.01)))

    def settles_on(pid: int, policy: str) -> None:
        wait_until(lambda: policy_of(pid) == policy, f"the server's policy to become {policy}", timeout=20)

    with serve_process(config, free_port()) as process:
        [engine_pid] = [child.pid for child in psutil.Process(process.pid).children()]
        settles_on(process.pid, "normal")  # idle: it forwards at once
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
        try:
            settles_on(process.pid, "batch")  # every core busy: its wake-ups wait for a free core
            assert policy_of(engine_pid) == "normal"
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
        settles_on(process.pid, "normal")
        assert policy_of(engine_pid) == "normal"
