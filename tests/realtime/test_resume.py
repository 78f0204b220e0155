"""Issue 14: a session survives a dropped connection: resumed on its replica (KV kept) or rebuilt
from its snapshot on another (KV rebuilt); a wrong token is `session_not_found`."""

from __future__ import annotations

import json
import signal
from typing import Any

from configs import load_profile
from tests.conftest import http_client, running_server
from tests.realtime.client import API_KEY, RawClient, connect
from tests.realtime.fakes import realtime_profile


def resume_query(session_id: str, token: str) -> str:
    return f"&session_id={session_id}&resume_token={token}"


async def text_turn(client: RawClient, text: str) -> tuple[str, dict[str, Any]]:
    """A typed user turn and its reply: (the user item's id, the reply's `response`)."""
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    added = (await client.until("conversation.item.added"))[-1]["item"]
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    done = (await client.until("response.done", timeout=120))[-1]["response"]
    return added["id"], done


def drop(client: RawClient) -> None:
    """Lose the connection without a close frame, as a dropped network does."""
    client.ws.transport.abort()


async def test_a_dropped_socket_resumes_on_its_replica_with_the_kv_kept():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with connect(srv) as client:
            created = await client.recv()
            session_id = created["session"]["id"]
            token = created["session"]["sglang"]["resume_token"]
            assert len(token) >= 22  # at least 128 bits, URL-safe base64
            user_item, first = await text_turn(client, "Hello there.")
            assert first["status"] == "completed"
            drop(client)
        async with connect(srv, resume_query(session_id, token)) as client:
            created = await client.recv()
            assert created["type"] == "session.created" and created["session"]["id"] == session_id
            resumed = await client.recv()
            assert resumed["type"] == "sglang.session.resumed"
            assert (resumed["session_id"], resumed["kv"]) == (session_id, "kept")
            assert user_item in [item["id"] for item in resumed["items"]]
            _, second = await text_turn(client, "And again?")
            assert second["status"] == "completed"
            assert second["usage"]["input_token_details"]["cached_tokens"] > 0
            await client.send({"type": "conversation.item.retrieve", "item_id": user_item})
            retrieved = (await client.until("conversation.item.retrieved"))[-1]["item"]
            assert retrieved["content"][0]["text"] == "Hello there."


async def test_a_session_resumed_on_another_replica_is_rebuilt_from_its_snapshot():
    profile = load_profile(None)
    async with running_server(profile, api_key=API_KEY) as first, running_server(profile, api_key=API_KEY) as second:
        second.state.resumer.store = first.state.resumer.store  # one shared store, as Redis is
        async with connect(first) as client:
            created = await client.recv()
            session_id, token = created["session"]["id"], created["session"]["sglang"]["resume_token"]
            await client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
            await client.until("session.updated")
            user_item, _ = await text_turn(client, "Hello there.")
            drop(client)
        async with connect(second, resume_query(session_id, token)) as client:
            created = await client.recv()
            assert created["session"]["id"] == session_id
            assert created["session"]["instructions"] == "Be brief."
            resumed = await client.recv()
            assert resumed["kv"] == "rebuilt"
            await client.send({"type": "conversation.item.retrieve", "item_id": user_item})
            retrieved = (await client.until("conversation.item.retrieved"))[-1]["item"]
            assert retrieved["content"][0]["text"] == "Hello there."
            _, reply = await text_turn(client, "And again?")
            assert reply["status"] == "completed"
            assert reply["usage"]["input_tokens"] > reply["usage"]["input_token_details"]["cached_tokens"]


async def test_a_wrong_token_an_unknown_id_and_a_finished_session_all_get_session_not_found():
    async with running_server(realtime_profile(), api_key=API_KEY) as srv:
        async with connect(srv) as client:
            created = await client.recv()
            session_id, token = created["session"]["id"], created["session"]["sglang"]["resume_token"]
            drop(client)
        async with connect(srv) as finished:
            done = await finished.recv()
            # A normal close frame ends a session for good.
        answers = []
        for query in (resume_query(session_id, "x" * 43), resume_query("sess_unknown", token),
                      resume_query(done["session"]["id"], done["session"]["sglang"]["resume_token"])):
            async with connect(srv, query) as client:
                events = [await client.recv(), await client.recv()]
                answers.append([(e["type"], e.get("error", {}).get("code"), e.get("reason")) for e in events])
        assert answers == [[("error", "session_not_found", None), ("session.closed", None, "session_not_found")]] * 3
        # The right token still resumes the dropped session afterwards.
        async with connect(srv, resume_query(session_id, token)) as client:
            assert (await client.recv())["session"]["id"] == session_id
            assert (await client.recv())["kv"] == "kept"


async def test_ready_answers_503_without_a_free_slot_and_metrics_count_free_slots():
    async with running_server(realtime_profile(limits={"max_sessions": 1}), api_key=API_KEY) as srv:
        async with http_client(srv, API_KEY) as http:
            assert (await http.get("/ready")).status_code == 200
            assert "sgl_omni_free_session_slots 1.0" in (await http.get("/metrics")).text
            async with connect(srv) as client:
                await client.recv()
                assert (await http.get("/ready")).status_code == 503
                assert "sgl_omni_free_session_slots 0.0" in (await http.get("/metrics")).text
                assert (await http.get("/health")).status_code == 200
                drop(client)
            # A parked session gives its slot up to a new one: the replica is ready again.
            for _ in range(100):
                if srv.state.resumer.parked:
                    break
                await __import__("asyncio").sleep(0.02)
            assert (await http.get("/ready")).status_code == 200
            async with connect(srv) as client:
                assert (await client.recv())["type"] == "session.created"


async def test_sigterm_turns_the_replica_not_ready_finishes_the_reply_and_closes_sessions_as_resumable():
    async with running_server(realtime_profile(reply={"words": 4, "delay_s": 0.3}), api_key=API_KEY) as srv:
        async with connect(srv) as client, http_client(srv, API_KEY) as http:
            await client.recv()
            await client.send({"type": "response.create"})
            await client.until("response.created")
            srv.server.handle_exit(signal.SIGTERM, None)
            assert (await http.get("/ready")).status_code == 503
            events = await client.until("session.closed")
            assert [e["response"]["status"] for e in events if e["type"] == "response.done"] == ["completed"]
            assert (events[-1]["reason"], events[-1]["resumable"]) == ("server_shutdown", True)


def test_a_snapshot_is_json():
    from graph.messages import AddItem
    from session_server.realtime.protocol import RealtimeProtocol
    from session_server.realtime.snapshot import restore, snapshot_of

    protocol = RealtimeProtocol("sess_1", "m")
    protocol.receive_text(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
    saved = json.loads(json.dumps(snapshot_of(protocol, "digest")))
    again = RealtimeProtocol("sess_1", "m")
    replay = restore(again, saved)
    assert list(again.items) == list(protocol.items) and again.config == protocol.config
    assert [(type(r.message), r.message.text) for r in replay] == [(AddItem, "hi")]


def test_a_rebuilt_session_speaks_the_dialect_its_client_chose():
    from session_server.realtime.dialect import BETA, GA
    from session_server.realtime.protocol import RealtimeProtocol
    from session_server.realtime.snapshot import restore, snapshot_of

    beta = RealtimeProtocol("sess_1", "m")
    beta.receive_text(json.dumps({"type": "session.update", "session": {"modalities": ["text"]}}))
    undecided = RealtimeProtocol("sess_2", "m")
    rebuilt = {}
    for protocol in (beta, undecided):
        again = RealtimeProtocol(protocol.session_id, "m", compat="sglang-omni-v0")
        restore(again, json.loads(json.dumps(snapshot_of(protocol, "digest"))))
        rebuilt[protocol.session_id] = again.dialect.name
    assert beta.dialect.name == BETA != GA
    assert rebuilt == {"sess_1": BETA, "sess_2": "sglang-omni-v0"}  # an undecided client gets what this server gives


def test_a_resume_token_in_a_websocket_log_line_is_redacted():
    import logging

    from session_server.log_redaction import ACCESS_LOG_FILTER

    record = logging.LogRecord("uvicorn.error", logging.INFO, "", 0, '%s - "WebSocket %s" [accepted]',
                               ("127.0.0.1:5000", "/v1/realtime?model=m&session_id=sess_1&resume_token=SECRET"), None)
    ACCESS_LOG_FILTER.filter(record)
    assert "SECRET" not in record.getMessage() and "session_id=sess_1" in record.getMessage()


def test_a_state_url_that_is_not_redis_is_refused_before_anything_loads():
    from session_server.profile import profile_errors

    lines = profile_errors({**realtime_profile(), "state": {"url": "http://127.0.0.1:6379"}})
    assert any(line.startswith("state.url:") and "redis://" in line for line in lines)
    assert not profile_errors({**realtime_profile(), "state": {"url": "redis://127.0.0.1:6379/0"}})
