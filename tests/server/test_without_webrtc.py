"""A server on a machine without aiortc and PyAV (a GPU image carrying only the wheels that fit)
starts, serves WebSocket sessions' routes, and answers WebRTC calls (Realtime and Live) 501
`webrtc_unavailable`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

# Run in a fresh interpreter: this one has aiortc and av imported already. `None` in sys.modules
# makes every later `import aiortc` / `import av` raise ImportError, as on a machine without them.
CHILD = """
import asyncio, json, sys
sys.modules["aiortc"] = None
sys.modules["av"] = None

from session_server.speech import encode
from tests.conftest import http_client, running_server
from tests.graph.fakes import relay_sink_profile


async def main():
    seen = {"formats": list(encode.RESPONSE_FORMATS)}
    async with running_server(relay_sink_profile()) as server:
        async with http_client(server) as client:
            for name, path in [("call", "/v1/realtime/calls"), ("hangup", "/v1/realtime/calls/rtc_1/hangup"),
                               ("live", "/v1/live/sessions")]:
                response = await client.post(path, content=b"v=0", headers={"content-type": "application/sdp"})
                seen[name] = [response.status_code, response.json()["error"]]
            secret = await client.post("/v1/realtime/client_secrets", json={})
            seen["client_secret"] = secret.status_code
            seen["health"] = (await client.get("/health")).status_code
    seen["imported"] = sorted(name for name in ("aiortc", "av") if sys.modules.get(name) is not None)
    print(json.dumps(seen))


asyncio.run(main())
"""


def _run_without_webrtc() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_server_starts_and_refuses_calls_with_webrtc_unavailable():
    seen = _run_without_webrtc()
    assert seen["health"] == 200 and seen["imported"] == []
    for route in ("call", "hangup", "live"):  # a Live session over WebRTC too (webrtc/live_calls.py)
        status, error = seen[route]
        assert status == 501
        assert error["code"] == "webrtc_unavailable"
        assert "aiortc, av" in error["message"] and "/v1/realtime" in error["message"]
    assert seen["client_secret"] == 200  # ephemeral keys open WebSocket sessions too
    assert seen["formats"] == ["wav", "pcm", "flac"]  # no mp3 / opus without PyAV
