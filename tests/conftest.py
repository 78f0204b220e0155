"""Shared fixtures: a real server (uvicorn on 127.0.0.1, a free port) around any profile."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from graph.engine_client import EngineRuntime
from graph.runtime import GraphRuntime
from session_server.app import create_app
from session_server.metrics import ServerMetrics
from session_server.server import DrainingServer, uvicorn_config
from session_server.state import ServerState, Settings


def wait_until(check, what: str, timeout: float = 90.0, process: subprocess.Popen | None = None) -> None:
    """Poll `check` every 0.1 s until it is true (its exceptions count as false); `process`: fail at once if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode} (its log is in the test's tmp_path)")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def until_true(predicate, timeout: float = 10.0, step: float = 0.02, what: str = "the condition") -> None:
    """The async `wait_until`: poll `predicate` every `step` s on the loop until it is true; fails
    the test after `timeout` s, naming `what` it waited for. Every suite's condition wait."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(step)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}") from None


async def eventually(check, what: str = "the condition", timeout_s: float = 10.0) -> None:
    """`until_true` with what it waits for named first, polling every 10 ms."""
    await until_true(check, timeout_s, step=0.01, what=what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    base_url: str
    ws_url: str
    state: ServerState
    server: DrainingServer

    @property
    def runtime(self) -> GraphRuntime:
        return self.state.runtime


@contextlib.asynccontextmanager
async def running_server(
    profile: dict,
    api_key: str | None = None,
    enable_realtime: bool = True,
    wait_ready: bool = True,
    engines: bool = False,
    admin_key: str | None = None,
) -> AsyncIterator[RunningServer]:
    """In-process graph by default (tests may look into its nodes); `engines=True` runs it in
    the profile's `compute.engines` engine processes, as `sgl-omni serve` does."""
    metrics = ServerMetrics()
    runtime = (EngineRuntime if engines else GraphRuntime).from_config(profile, metrics)
    state = ServerState(runtime, Settings(runtime.model_id, api_key, enable_realtime, profile, admin_key=admin_key), metrics)
    port = free_port()
    server: DrainingServer | None = None

    def fail_startup() -> None:
        assert server is not None
        server.should_exit = True

    app = create_app(state, on_startup_failure=fail_startup)
    server = DrainingServer(uvicorn_config(app, "127.0.0.1", port, "warning"), state)
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(60):
            while not server.started:
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.01)
            while wait_ready and not runtime.ready and not state.startup_error:
                await asyncio.sleep(0.01)
        yield RunningServer(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", state, server)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 30)


@contextlib.asynccontextmanager
async def http_client(server: RunningServer, api_key: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=30) as client:
        yield client


REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def serve_process(config: Path, port: int, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`sgl-omni serve --config CONFIG [ARGS]` as a child process, healthy on 127.0.0.1:PORT; killed
    after the block if it is still running (a test that stops it itself reads its output)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "session_server.cli", "serve", "--config", str(config), "--port", str(port), "--enable-realtime", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("server never became healthy")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
