"""The browser page in headless Chromium: a spoken turn with a fake microphone, over WebRTC.

Needs Debian's `chromium` (`.ci/setup-browser.sh` installs it); skipped, saying so, without it.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import soundfile

from tests.conftest import running_server, until_true
from tests.realtime.speech import silence, speech
from tests.webrtc import browser
from tests.webrtc.helpers import API_KEY, calls_of, webrtc_profile

pytestmark = pytest.mark.skipif(
    browser.chromium_path() is None,
    reason="headless Chromium is not installed (run .ci/setup-browser.sh: apt-get install chromium)",
)


async def test_the_page_holds_a_spoken_turn_and_renders_the_reply(tmp_path):
    microphone = tmp_path / "microphone.wav"
    # Chromium loops the file: speech, then enough silence for server VAD to end the turn.
    soundfile.write(microphone, np.concatenate([silence(0.5, 48000), speech(rate=48000), silence(4.0, 48000)]), 48000, subtype="PCM_16")
    profile = webrtc_profile(reply={"words": 4, "chunk_ms": 400})
    async with running_server(profile, api_key=API_KEY) as server:
        async with browser.launch(tmp_path / "chromium", microphone) as page:
            await page.call("Page.enable")
            await page.call("Page.navigate", url=f"{server.base_url}/playground")
            await until_true_async(page, "document.readyState === 'complete' && !!window.playground")
            # The page mints an ephemeral key with the API key, then calls with that key.
            await page.evaluate(f"document.getElementById('key').value = {json.dumps(API_KEY)}; document.getElementById('connect').click()")
            state = await until_true_async(
                page,
                "playground.state === 'failed' || (playground.events.includes('response.done') && playground.maxLevel > 0.05 "
                "&& playground.latenciesMs.length > 0 && playground.events.includes('output_audio_buffer.stopped'))",
                timeout=60,
            )
            assert state["error"] is None, state["error"]
            shot = await page.screenshot(tmp_path / "playground.png")
            print(f"screenshot: {shot}; speech stopped -> first audio heard: {state['latenciesMs']} ms")
            assert "session.created" in state["events"] and "output_audio_buffer.started" in state["events"]
            assert any(line.startswith("Assistant: word0 word1 word2 word3") for line in state["transcript"])
            assert state["maxLevel"] > 0.05 and state["replyAudioMs"] >= 600  # 1.6 s of tone was played
            assert (await page.evaluate("document.getElementById('transcript').textContent")).count("word3") >= 1
            assert state["callLocation"].startswith("/v1/realtime/calls/rtc_")
            await page.evaluate("document.getElementById('hangup').click()")
        await until_true(lambda: len(calls_of(server)) == 0, timeout=15)


async def until_true_async(page, condition: str, timeout: float = 20.0) -> dict:
    async with asyncio.timeout(timeout):
        while not await page.evaluate(condition):
            await asyncio.sleep(0.1)
    return await page.evaluate("JSON.parse(JSON.stringify(window.playground))")
