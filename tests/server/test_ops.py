"""Operations routes: health, models, metrics, API keys, startup failure, SIGTERM."""

import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import eventually, free_port, http_client, running_server, serve_process
from tests.graph.fakes import chunk, relay_sink_profile

REPO = Path(__file__).resolve().parents[2]


def slow_loading_profile(delay_s=0.5, path="/ckpt"):
    profile = relay_sink_profile()
    profile["resources"] = {"model": {"type": "test.slow_resource", "params": {"delay_s": delay_s, "path": path}}}
    return profile


async def test_health_is_503_while_loading_then_200():
    async with running_server(slow_loading_profile(1.0), wait_ready=False) as server:
        async with http_client(server) as client:
            loading = await client.get("/health")
            assert loading.status_code == 503
            assert loading.json()["status"] == "loading"
            await eventually(lambda: server.runtime.ready, "the slow resource to load")
            response = await client.get("/health")
            assert response.status_code == 200
            assert response.json() == {"status": "ok", "model": "test-model"}


async def test_models_lists_the_served_model_in_the_openai_list_shape():
    async with running_server(relay_sink_profile()) as server:
        async with http_client(server) as client:
            body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["test-model"]
    assert body["data"][0]["object"] == "model"


async def test_metrics_exports_sessions_queues_steps_and_first_audio():
    async with running_server(relay_sink_profile()) as server:
        session = await server.runtime.open_session("s1")
        await session.send("audio", chunk(1))
        async for _ in session.outputs():
            break
        await session.close("client_closed")
        server.state.metrics.first_audio("websocket", 0.12)
        async with http_client(server) as client:
            response = await client.get("/metrics")
    text = response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert 'sgl_omni_active_sessions{kind="realtime"} 0.0' in text
    assert 'sgl_omni_sessions_started_total{kind="realtime"} 1.0' in text
    assert 'sgl_omni_sessions_ended_total{kind="realtime",reason="client_closed"} 1.0' in text
    assert 'sgl_omni_node_queue_depth{node="sink"} 0.0' in text
    assert 'sgl_omni_node_step_seconds_count{node="sink"} 1.0' in text
    assert 'sgl_omni_time_to_first_audio_seconds_count{transport="websocket"} 1.0' in text
    assert "sgl_omni_first_audio_estimate_seconds " in text  # what admission by load reads


async def test_api_key_is_required_everywhere_but_health_with_the_openai_error_shape():
    async with running_server(relay_sink_profile(), api_key="sekret") as server:
        async with http_client(server) as anonymous:
            assert (await anonymous.get("/health")).status_code == 200
            for path in ("/v1/models", "/metrics"):
                response = await anonymous.get(path)
                assert response.status_code == 401
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["code"] == "invalid_api_key"
        async with http_client(server, api_key="wrong") as wrong:
            assert (await wrong.get("/v1/models")).status_code == 401
        async with http_client(server, api_key="sekret") as good:
            assert (await good.get("/v1/models")).status_code == 200


async def test_a_checkpoint_that_fails_to_load_is_reported_and_stops_the_server():
    async with running_server(slow_loading_profile(0, path="/nonexistent"), wait_ready=False) as server:
        await eventually(lambda: server.state.startup_error, "the startup error")
        assert "checkpoint directory /nonexistent does not exist" in server.state.startup_error
        await eventually(lambda: server.server.should_exit, "the server to stop")


def test_cli_rejects_an_invalid_profile_before_opening_the_port(tmp_path):
    profile = relay_sink_profile()
    profile["edges"] = ["relay.audio -> nowhere.audio"]
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(profile))
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "session_server.cli", "serve", "--config", str(config), "--port", str(port)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "edges[0]" in result.stderr and "nowhere" in result.stderr


def test_sigterm_drains_and_exits_zero(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(yaml.safe_dump(relay_sink_profile()))
    with serve_process(config, free_port()) as process:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "shutdown requested" in output
    assert "profile" in output and "validated" in output and "ready in" in output
