"""Issue 37, operators: the admin API lists, reads and ends this server's live sessions (connected
and parked, WebSocket and WebRTC), behind its own key."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys

import httpx
import websockets
import yaml

from clients.python.webrtc import WebRTCSession
from tests.conftest import REPO, free_port, http_client, running_server, serve_process, until_true
from tests.graph.fakes import relay_sink_profile
from tests.realtime.client import API_KEY, RawClient, connect
from tests.realtime.fakes import realtime_profile
from tests.webrtc.helpers import webrtc_profile

ADMIN_KEY = "admin-key"


async def opened(client: RawClient) -> tuple[str, str]:
    """(session id, resume token) from the session's `session.created`."""
    created = await client.recv()
    return created["session"]["id"], created["session"]["sglang"]["resume_token"]


async def text_turn(client: RawClient, text: str) -> dict:
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    return (await client.until("response.done"))[-1]["response"]


async def sessions_until(admin, check, timeout: float = 10.0) -> list[dict]:
    """GET /v1/admin/sessions until `check(data)` holds."""
    async with asyncio.timeout(timeout):
        while True:
            data = (await admin.get("/v1/admin/sessions")).json()["data"]
            if check(data):
                return data
            await asyncio.sleep(0.02)


async def test_the_list_shows_a_connected_and_a_parked_session_with_their_usage():
    async with running_server(realtime_profile(reply={"words": 3}), api_key=API_KEY, admin_key=ADMIN_KEY) as srv:
        async with http_client(srv, ADMIN_KEY) as admin:
            async with connect(srv) as dropped:
                dropped_id, _ = await opened(dropped)
                reply = await text_turn(dropped, "one two three four")
                dropped.ws.transport.abort()  # no close frame: parked for a resume
            async with connect(srv) as live:
                live_id, _ = await opened(live)
                data = await sessions_until(admin, lambda d: {s["id"]: s["state"] for s in d} == {
                    dropped_id: "parked", live_id: "connected"})
                by_id = {s["id"]: s for s in data}
                assert [s["id"] for s in data] == [dropped_id, live_id]  # oldest first
                parked, connected = by_id[dropped_id], by_id[live_id]
                for record in (parked, connected):
                    assert (record["object"], record["kind"], record["transport"]) == ("admin.session", "realtime", "websocket")
                    assert record["engine"] is None  # the test server runs its graph in-process
                    assert record["created_at"] <= record["last_activity_at"]
                assert parked["parked_at"] >= parked["last_activity_at"] and connected["parked_at"] is None
                assert parked["turns"] == 1 and connected["turns"] == 0
                usage = reply["usage"]
                assert parked["kv_tokens"] == usage["input_tokens"] + usage["output_tokens"]
                assert parked["usage"]["input_tokens"] == usage["input_tokens"] == 4
                assert parked["usage"]["output_tokens"] == usage["output_tokens"] == 3
                assert parked["usage"]["replies"] == 1
                one = await admin.get(f"/v1/admin/sessions/{dropped_id}")
                assert one.status_code == 200 and one.json() == parked
                unknown = await admin.get("/v1/admin/sessions/sess_unknown")
                assert unknown.status_code == 404
                assert unknown.json()["error"]["code"] == "session_not_found"


async def test_deleting_a_connected_session_sends_session_closed_admin_closed_and_a_close_frame():
    async with running_server(realtime_profile(), api_key=API_KEY, admin_key=ADMIN_KEY) as srv:
        async with http_client(srv, ADMIN_KEY) as admin, connect(srv) as client:
            session_id, token = await opened(client)
            answer = await admin.delete(f"/v1/admin/sessions/{session_id}")
            assert answer.status_code == 200
            body = answer.json()
            assert (body["id"], body["object"], body["deleted"]) == (session_id, "admin.session.deleted", True)
            assert body["session"]["state"] == "closed"
            closed = await client.until("session.closed")
            assert closed[-1]["reason"] == "admin_closed"
            with contextlib.suppress(websockets.ConnectionClosed):
                await client.ws.recv()
            assert (client.ws.close_code, client.ws.close_reason) == (1000, "admin_closed")
            assert (await admin.get("/v1/admin/sessions")).json()["data"] == []
            assert (await admin.delete(f"/v1/admin/sessions/{session_id}")).status_code == 404
        assert not srv.runtime.sessions
        # Ended for good: its resume token opens nothing.
        async with connect(srv, f"&session_id={session_id}&resume_token={token}") as client:
            assert (await client.error())["code"] == "session_not_found"


async def test_deleting_a_parked_session_drops_it_and_its_snapshot():
    async with running_server(realtime_profile(), api_key=API_KEY, admin_key=ADMIN_KEY) as srv:
        async with http_client(srv, ADMIN_KEY) as admin:
            async with connect(srv) as client:
                session_id, token = await opened(client)
                client.ws.transport.abort()
            await sessions_until(admin, lambda d: [s["state"] for s in d] == ["parked"])
            answer = await admin.delete(f"/v1/admin/sessions/{session_id}")
            assert answer.status_code == 200 and answer.json()["deleted"] is True
            assert (await admin.get("/v1/admin/sessions")).json()["data"] == []
            assert not srv.state.resumer.parked and not srv.runtime.sessions
            assert await srv.state.resumer.store.load(session_id) is None
        async with connect(srv, f"&session_id={session_id}&resume_token={token}") as client:
            assert (await client.error())["code"] == "session_not_found"


async def test_a_webrtc_call_is_listed_and_deleting_it_ends_the_call():
    async with running_server(webrtc_profile(), api_key=API_KEY, admin_key=ADMIN_KEY) as srv:
        async with http_client(srv, ADMIN_KEY) as admin:
            async with WebRTCSession.connect(srv.base_url, API_KEY, loopback=True) as call:
                created = await call.next_event("session.created")
                (record,) = (await admin.get("/v1/admin/sessions")).json()["data"]
                assert (record["id"], record["transport"], record["call_id"], record["state"]) == (
                    created["session"]["id"], "webrtc", call.call_id, "connected")
                assert (await admin.delete(f"/v1/admin/sessions/{record['id']}")).json()["deleted"] is True
                assert (await call.next_event("session.closed"))["reason"] == "admin_closed"
                await until_true(lambda: call.pc.connectionState == "closed")
            assert not srv.runtime.sessions


async def test_without_an_admin_key_the_admin_routes_are_absent():
    async with running_server(realtime_profile(), api_key=API_KEY) as srv:
        async with http_client(srv, API_KEY) as client:
            answer = await client.get("/v1/admin/sessions")
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
            assert (await client.delete("/v1/admin/sessions/sess_x")).status_code == 404


async def test_the_client_key_and_no_key_get_401_on_the_admin_routes_and_the_admin_key_opens_no_session():
    async with running_server(realtime_profile(), api_key=API_KEY, admin_key=ADMIN_KEY) as srv:
        for key in (API_KEY, None, "wrong"):
            async with http_client(srv, key) as client:
                for answer in (await client.get("/v1/admin/sessions"), await client.delete("/v1/admin/sessions/sess_x")):
                    assert answer.status_code == 401
                    assert answer.json()["error"]["code"] == "invalid_admin_key"
        async with http_client(srv, ADMIN_KEY) as admin:
            assert (await admin.get("/v1/admin/sessions")).status_code == 200
            assert (await admin.get("/v1/models")).status_code == 401  # the admin key is no client key


async def test_an_admin_key_guards_the_admin_routes_on_a_server_without_a_client_key():
    async with running_server(realtime_profile(), admin_key=ADMIN_KEY) as srv:
        async with http_client(srv) as anyone:
            assert (await anyone.get("/v1/models")).status_code == 200
            assert (await anyone.get("/v1/admin/sessions")).status_code == 401


async def test_a_session_in_an_engine_process_names_its_engine():
    profile = realtime_profile()
    profile["compute"] = {"engines": 1}
    async with running_server(profile, api_key=API_KEY, admin_key=ADMIN_KEY, engines=True) as srv:
        async with http_client(srv, ADMIN_KEY) as admin, connect(srv) as client:
            await opened(client)
            (record,) = (await admin.get("/v1/admin/sessions")).json()["data"]
            assert record["engine"]["index"] == 0
            assert record["engine"]["pid"] == srv.runtime.engine_pids()[0]


def test_serve_takes_the_admin_key_from_its_env_and_the_otlp_endpoint_from_its_flag(tmp_path, monkeypatch):
    config = tmp_path / "ok.yaml"
    config.write_text(yaml.safe_dump(relay_sink_profile()))
    port = free_port()
    monkeypatch.setenv("SGL_OMNI_ADMIN_KEY", ADMIN_KEY)
    with serve_process(config, port, "--otlp-endpoint", "http://127.0.0.1:4318") as process:
        url = f"http://127.0.0.1:{port}/v1/admin/sessions"
        assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json() == {"object": "list", "data": []}
        assert httpx.get(url).status_code == 401
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert "traces of realtime turns go to http://127.0.0.1:4318/v1/traces" in output


def test_serve_refuses_an_admin_key_that_is_the_client_key(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(yaml.safe_dump(relay_sink_profile()))
    command = [sys.executable, "-m", "session_server.cli", "serve", "--config", str(config), "--port", str(free_port()),
               "--api-key", "same", "--admin-key", "same"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "the admin key must differ from the client API key" in result.stderr


async def test_a_speech_request_is_listed_while_it_runs_and_deleting_it_ends_it_with_admin_closed(tmp_path):
    from tests.speech.fake_speaker import speaker_profile
    from tests.speech.helpers import parse_sse

    profile = speaker_profile(tmp_path / "voices", step_delay_s=0.05)
    async with running_server(profile, enable_realtime=False, admin_key=ADMIN_KEY) as srv:
        async with http_client(srv, ADMIN_KEY) as admin, http_client(srv) as client:
            body = {"input": " ".join(["word"] * 200), "stream_format": "sse", "response_format": "pcm"}
            async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                lines = response.aiter_lines()
                assert (await anext(lines)).startswith("event: speech.audio.delta")
                (record,) = (await admin.get("/v1/admin/sessions")).json()["data"]
                assert (record["kind"], record["transport"], record["state"]) == ("speech", "http", "connected")
                assert record["usage"]["audio_out_seconds"] > 0
                deleted = await admin.delete(f"/v1/admin/sessions/{record['id']}")
                assert deleted.status_code == 200 and deleted.json()["deleted"] is True
                rest = [line async for line in lines if line]
            # aiter_lines drops the blank lines between events: put them back
            events = parse_sse("\n\n".join("\n".join(pair) for pair in zip(rest[1::2], rest[2::2])))
            assert events[-1][0] == "speech.audio.error" and events[-1][1]["error"]["code"] == "admin_closed"
            assert (await admin.get("/v1/admin/sessions")).json()["data"] == []
