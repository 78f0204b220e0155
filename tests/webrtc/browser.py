"""Headless Chromium driven over the Chrome DevTools protocol (no npm, no driver binary).

`Browser.launch(...)` starts Debian's `chromium` with a fake microphone that plays a WAV file,
and `page.evaluate(js)` runs JavaScript in the page. Only for tests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import websockets

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
    "--window-size=1100,800",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws):
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self._ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        data = (await self.call("Page.captureScreenshot", format="png"))["data"]
        path.write_bytes(base64.b64decode(data))
        return path


@contextlib.asynccontextmanager
async def launch(profile_dir: Path, microphone_wav: Path, timeout: float = 30.0) -> AsyncIterator[Page]:
    executable = chromium_path()
    assert executable is not None
    command = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", f"--use-file-for-fake-audio-capture={microphone_wav}", "about:blank"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile_dir / "DevToolsActivePort"
        async with asyncio.timeout(timeout):
            while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
                assert process.poll() is None, f"chromium exited with {process.returncode}"
                await asyncio.sleep(0.05)
            port = int(port_file.read_text().splitlines()[0])
            async with httpx.AsyncClient(timeout=5) as http:
                while True:
                    targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
                    pages = [t for t in targets if t.get("type") == "page"]
                    if pages:
                        break
                    await asyncio.sleep(0.05)
        async with websockets.connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
            yield Page(ws)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
