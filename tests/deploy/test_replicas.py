"""Issue 14, end to end on loopback: redis-server, an S3 server (moto), two replicas with
`--state-url` and `--voices-url`, and HAProxy with the repo's deploy/haproxy.cfg.

Through the proxy: a voice uploaded via one replica is used by a session on the other (spoken by
the built-in speaker it was matched to); a dropped socket
resumes on its replica with the KV kept; a bad token gets `session_not_found`; a session whose
replica is killed (SIGKILL) is rebuilt on the other and answers its next turn; a session on a
replica that gets SIGTERM is closed resumable and resumed on the other. Every process started
here is stopped here."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile
import websockets
import yaml

from configs import load_profile
from tests.conftest import REPO, eventually, free_port, wait_until
from tests.realtime.client import RawClient

KEY = "replicas-test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


class Processes:
    """Every process the test starts, each in its own process group, all stopped at the end."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                   start_new_session=True)
        log.close()
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its own group: the replica's engine processes too
        for process in self.started:
            process.wait(timeout=30)


def wav_bytes(seconds: float = 1.5, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


class Cluster:
    def __init__(self, tmp: Path, processes: Processes):
        self.tmp = tmp
        self.processes = processes
        self.redis_port, self.s3_port, self.proxy_port, self.stats_port = free_port(), free_port(), free_port(), free_port()
        self.replica_ports = [free_port(), free_port()]
        self.replicas: dict[int, subprocess.Popen] = {}
        self.aws = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}", "AWS_ACCESS_KEY_ID": "test",
                    "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        profile = load_profile(None)
        profile["compute"]["engines"] = 1  # two replicas on a small machine
        self.profile = tmp / "profile.yaml"
        self.profile.write_text(yaml.safe_dump(profile))

    def start_backing_services(self) -> None:
        self.processes.start("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no"])
        self.processes.start("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)])
        wait_until(lambda: httpx.get(self.aws["AWS_ENDPOINT_URL"]).status_code < 500, "the S3 server")
        import boto3

        boto3.client("s3", endpoint_url=self.aws["AWS_ENDPOINT_URL"], aws_access_key_id="test",
                     aws_secret_access_key="test", region_name="us-east-1").create_bucket(Bucket="voices")

    def start_replica(self, index: int) -> None:
        port = self.replica_ports[index]
        self.replicas[index] = self.processes.start(f"replica{index}", [
            sys.executable, "-m", "session_server.cli", "serve", "--config", str(self.profile), "--port", str(port),
            "--enable-realtime", "--api-key", KEY, "--state-url", f"redis://127.0.0.1:{self.redis_port}/0",
            "--voices-url", "s3://voices/replicas-test", "--shutdown-grace", "5",
        ], env=self.aws)

    def wait_ready(self, index: int) -> None:
        wait_until(lambda: httpx.get(f"{self.replica_url(index)}/ready").status_code == 200, f"replica {index}",
                   timeout=120, process=self.replicas[index])

    def start_proxy(self) -> None:
        env = {"SGL_PROXY_BIND": f"127.0.0.1:{self.proxy_port}",
               "SGL_REPLICA_1": f"127.0.0.1:{self.replica_ports[0]}", "SGL_REPLICA_2": f"127.0.0.1:{self.replica_ports[1]}"}
        # A second config file, the test's own: HAProxy's stats page, to see what its health checks see.
        stats = self.tmp / "haproxy-stats.cfg"
        stats.write_text(f"frontend stats\n    bind 127.0.0.1:{self.stats_port}\n    stats enable\n    stats uri /stats\n")
        proxy = self.processes.start("haproxy", ["haproxy", "-db", "-f", str(REPO / "deploy" / "haproxy.cfg"),
                                                 "-f", str(stats)], env=env)
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{self.proxy_port}/ready").status_code == 200, "the proxy", process=proxy)

    def replica_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.replica_ports[index]}"

    def proxy_routes_to_every_replica(self) -> bool:
        """Whether HAProxy's health checks see every replica UP (its stats page, as CSV)."""
        rows = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv").text.lstrip("# ").splitlines()
        servers = [row for row in csv.DictReader(rows) if row["pxname"] == "replicas" and row["svname"] != "BACKEND"]
        return len(servers) == len(self.replica_ports) and all(row["status"] == "UP" for row in servers)

    def owner_of_live_session(self) -> int:
        """The replica serving the one live realtime session (read from /metrics)."""
        for index in self.replicas:
            with contextlib.suppress(httpx.TransportError):
                text = httpx.get(f"{self.replica_url(index)}/metrics", headers=HEADERS).text
                if 'sgl_omni_active_sessions{kind="realtime"} 1.0' in text:
                    return index
        raise AssertionError("no replica holds the session")

    @contextlib.asynccontextmanager
    async def session(self, query: str = ""):
        url = f"ws://127.0.0.1:{self.proxy_port}/v1/realtime?model=qwen3-omni-tiny{query}"
        async with websockets.connect(url, additional_headers=HEADERS, max_size=None) as ws:
            yield RawClient(ws)

    async def resume(self, session_id: str, token: str, stack: contextlib.AsyncExitStack,
                     timeout: float = 30.0) -> tuple[RawClient, dict, dict]:
        """Resume through the proxy, retrying while the proxy still routes to a replica going away."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                client = await stack.enter_async_context(self.session(f"&session_id={session_id}&resume_token={token}"))
                first = await client.recv(timeout=60)
                if first["type"] == "session.created":
                    return client, first, await client.recv()
                assert first["error"]["code"] in ("server_shutting_down", "server_not_ready"), first
            except (OSError, websockets.InvalidStatus, websockets.ConnectionClosed):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the session could not be resumed through the proxy")
            await asyncio.sleep(0.2)


async def text_turn(client: RawClient, text: str) -> tuple[str, dict]:
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    item_id = (await client.until("conversation.item.added"))[-1]["item"]["id"]
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    return item_id, (await client.until("response.done", timeout=120))[-1]["response"]


def identity(created: dict) -> tuple[str, str]:
    return created["session"]["id"], created["session"]["sglang"]["resume_token"]


async def test_two_replicas_behind_haproxy_share_voices_and_resume_sessions(tmp_path):
    processes = Processes(tmp_path)
    cluster = Cluster(tmp_path, processes)
    try:
        cluster.start_backing_services()
        cluster.start_replica(0)
        cluster.start_replica(1)
        cluster.wait_ready(0)
        cluster.wait_ready(1)
        cluster.start_proxy()
        await _scenario(cluster)
    finally:
        processes.stop_all()


async def _scenario(cluster: Cluster) -> None:
    # A voice uploaded through one replica is used by a session (through the proxy) on the other:
    # it is listed there with the built-in speaker it was matched to, and that speaker speaks it.
    async with cluster.session() as client, httpx.AsyncClient(headers=HEADERS, timeout=120) as http:
        await client.recv()  # session.created
        owner = cluster.owner_of_live_session()
        other = 1 - owner
        uploaded = await http.post(f"{cluster.replica_url(other)}/v1/audio/voices", data={"name": "narrator", "consent": "yes"},
                                   files={"audio_sample": ("v.wav", wav_bytes(), "audio/wav")})
        assert uploaded.status_code == 200, uploaded.text
        speaker = uploaded.json()["voice"]["speaker"]
        assert speaker in ("aiden", "chelsie", "ethan")
        listed = (await http.get(f"{cluster.replica_url(owner)}/v1/audio/voices")).json()
        assert [(v["name"], v["speaker"]) for v in listed["uploaded_voices"]] == [("narrator", speaker)]

        await client.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "narrator"}}}})
        updated = (await client.until("session.updated"))[-1]
        assert updated["session"]["audio"]["output"]["voice"] == "narrator"
        await client.send({"type": "conversation.item.create",
                           "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}})
        await client.send({"type": "response.create"})
        reply = await client.until("response.done", timeout=120)
        assert reply[-1]["response"]["status"] == "completed"
        assert any(event["type"] == "response.output_audio.delta" for event in reply)

        speech = {"model": "qwen3-omni-tiny", "input": "Hi.", "seed": 1, "max_new_tokens": 8}
        as_narrator = await http.post(f"{cluster.replica_url(owner)}/v1/audio/speech", json=speech | {"voice": "narrator"})
        as_speaker = await http.post(f"{cluster.replica_url(owner)}/v1/audio/speech", json=speech | {"voice": speaker})
        assert as_narrator.status_code == 200 and as_narrator.content == as_speaker.content
        await client.send({"type": "session.close"})
        await client.until("session.closed")

    async with contextlib.AsyncExitStack() as stack:
        # A dropped socket, resumed through the proxy on the same replica: the KV is kept.
        client = await stack.enter_async_context(cluster.session())
        session_id, token = identity(await client.recv())
        await text_turn(client, "Hello there.")
        client.ws.transport.abort()
        client, created, resumed = await cluster.resume(session_id, token, stack)
        assert (created["session"]["id"], resumed["kv"]) == (session_id, "kept")
        user_item, reply = await text_turn(client, "And again?")
        assert reply["usage"]["input_token_details"]["cached_tokens"] > 0

        # A wrong token: session_not_found, and a close.
        async with cluster.session(f"&session_id={session_id}&resume_token={'x' * 43}") as stranger:
            assert (await stranger.recv())["error"]["code"] == "session_not_found"
            assert (await stranger.recv())["reason"] == "session_not_found"

        # The owner is killed: the session is rebuilt on the other replica and goes on.
        owner = cluster.owner_of_live_session()
        cluster.replicas[owner].send_signal(signal.SIGKILL)
        cluster.replicas[owner].wait(timeout=30)
        client, created, resumed = await cluster.resume(session_id, token, stack)
        assert (created["session"]["id"], resumed["kv"]) == (session_id, "rebuilt")
        await client.send({"type": "conversation.item.retrieve", "item_id": user_item})
        retrieved = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert retrieved["content"][0]["text"] == "And again?"
        _, reply = await text_turn(client, "Still there?")
        assert reply["status"] == "completed"
        await client.send({"type": "session.close"})
        await client.until("session.closed")

    # SIGTERM on the replica holding a live session: closed resumable, resumed on the other.
    cluster.start_replica(owner)
    cluster.wait_ready(owner)
    await eventually(cluster.proxy_routes_to_every_replica, "the proxy's health check to see the replica ready again")
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(cluster.session())
        session_id, token = identity(await client.recv())
        item_id, _ = await text_turn(client, "Before the restart.")
        draining = cluster.owner_of_live_session()
        cluster.replicas[draining].send_signal(signal.SIGTERM)
        closed = (await client.until("session.closed", timeout=60))[-1]
        assert (closed["reason"], closed["resumable"]) == ("server_shutdown", True)
        client, created, resumed = await cluster.resume(session_id, token, stack)
        assert resumed["kv"] == "rebuilt" and item_id in [item["id"] for item in resumed["items"]]
        assert cluster.owner_of_live_session() != draining
        assert cluster.replicas[draining].wait(timeout=30) == 0
