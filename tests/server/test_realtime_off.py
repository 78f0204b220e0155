"""A server started without --enable-realtime says so, in the OpenAI error shape, on every realtime route."""

import asyncio

import numpy as np
import pytest
import soundfile
import websockets

from clients.python.cli import main as client_main
from tests.conftest import http_client, running_server
from tests.graph.fakes import relay_sink_profile


def assert_realtime_disabled(status: int, body: dict) -> None:
    assert status == 403
    error = body["error"]
    assert error["code"] == "realtime_disabled"
    assert error["type"] == "invalid_request_error"
    assert "--enable-realtime" in error["message"]


async def test_calls_client_secrets_and_realtime_get_name_the_flag():
    async with running_server(relay_sink_profile(), enable_realtime=False) as server:
        async with http_client(server) as client:
            for method, path in [("POST", "/v1/realtime/calls"), ("POST", "/v1/realtime/client_secrets"),
                                 ("POST", "/v1/realtime/calls/rtc_1/hangup"), ("GET", "/v1/realtime")]:
                response = await client.request(method, path, content=b"v=0")
                assert_realtime_disabled(response.status_code, response.json())
            assert (await client.get("/")).status_code == 200  # the page still loads, and shows the error


async def test_the_websocket_handshake_is_refused_with_the_error_body():
    async with running_server(relay_sink_profile(), enable_realtime=False) as server:
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(f"{server.ws_url}/v1/realtime", subprotocols=["realtime"]):
                pass
    import json

    assert_realtime_disabled(refused.value.response.status_code, json.loads(refused.value.response.body))


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
async def test_the_cli_client_prints_the_refusal_as_one_line(tmp_path, capsys, transport):
    question = tmp_path / "question.wav"
    soundfile.write(question, np.zeros(2400, np.float32), 24000)
    async with running_server(relay_sink_profile(), enable_realtime=False) as server:
        argv = ["--url", server.base_url, "--input", str(question), "--output", str(tmp_path / "reply.wav"),
                "--transport", transport, "--timeout", "10"]
        status = await asyncio.to_thread(client_main, argv)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("sgl-omni client:")]  # (the server's log shares stderr here)
    assert status == 1
    assert "Traceback" not in err and len(said) == 1
    assert said[0].startswith("sgl-omni client: the server refused the")
    assert "(403): Realtime sessions are off" in said[0] and "--enable-realtime" in said[0] and said[0].endswith("[realtime_disabled]")


def test_the_cli_client_says_when_no_server_answers(tmp_path, capsys):
    from tests.conftest import free_port

    question = tmp_path / "question.wav"
    soundfile.write(question, np.zeros(2400, np.float32), 24000)
    status = client_main(["--url", f"http://127.0.0.1:{free_port()}", "--input", str(question)])
    err = capsys.readouterr().err.strip()
    assert status == 1
    assert "cannot reach the server" in err and "make serve" in err and len(err.splitlines()) == 1
