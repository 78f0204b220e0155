"""The playground as a user meets it, in headless Chromium with a fake microphone: the agent's
states, both sides' transcripts, latency history, expandable events, settings, microphone
controls, errors that say what to do, and a phone-width layout.

Screenshots of the idle, listening, speaking and error states go to the test's tmp dir; with
SGL_OMNI_UPDATE_SCREENSHOTS=1 they replace docs/img/playground-*.png.
Needs Debian's `chromium` (`.ci/setup-browser.sh` installs it); skipped, saying so, without it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile
from PIL import Image

from tests.conftest import REPO, running_server, until_true
from tests.realtime.speech import silence, speech
from tests.webrtc import browser
from tests.webrtc.helpers import API_KEY, calls_of, webrtc_profile
from tests.webrtc.transcribing_fake import transcribed_webrtc_profile

pytestmark = pytest.mark.skipif(
    browser.chromium_path() is None,
    reason="headless Chromium is not installed (run .ci/setup-browser.sh: apt-get install chromium)",
)

TRANSCRIPT = "what is the weather like today in paris"


def microphone_file(tmp_path: Path) -> Path:
    path = tmp_path / "microphone.wav"
    # Chromium loops the file: speech, then enough silence for server VAD to end the turn.
    soundfile.write(path, np.concatenate([silence(0.5, 48000), speech(rate=48000), silence(5.0, 48000)]), 48000, subtype="PCM_16")
    return path


async def open_page(page: browser.Page, base_url: str, width: int = 1000, height: int = 700, mobile: bool = False) -> None:
    await page.call("Page.enable")
    await page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile)
    await page.call("Page.navigate", url=f"{base_url}/playground")
    await until(page, "document.readyState === 'complete' && !!window.playground")


async def until(page: browser.Page, condition: str, timeout: float = 20.0) -> dict:
    async with asyncio.timeout(timeout):
        while not await page.evaluate(condition):
            await asyncio.sleep(0.1)
    return await page.evaluate("JSON.parse(JSON.stringify(window.playground))")


async def screenshot(page: browser.Page, tmp_path: Path, state: str) -> Path:
    shot = await page.screenshot(tmp_path / f"playground-{state}.png")
    if os.environ.get("SGL_OMNI_UPDATE_SCREENSHOTS") == "1":
        # a 128-colour palette keeps the committed PNGs small (a UI has few colours)
        Image.open(shot).convert("RGB").quantize(colors=128).save(REPO / "docs" / "img" / shot.name, optimize=True)
    return shot


async def text(page: browser.Page, selector: str) -> str:
    return await page.evaluate(f"document.querySelector({json.dumps(selector)}).textContent")


async def test_a_spoken_turn_shows_the_agent_states_both_transcripts_and_the_latency(tmp_path):
    profile = transcribed_webrtc_profile(reply={"words": 6, "chunk_ms": 400, "transcript": TRANSCRIPT})
    async with running_server(profile, api_key=API_KEY) as server:
        async with browser.launch(tmp_path / "chromium", microphone_file(tmp_path)) as page:
            await open_page(page, server.base_url)
            idle = await page.evaluate("JSON.parse(JSON.stringify(window.playground))")
            assert idle["state"] == "idle" and idle["agent"] == "idle"
            assert "Press Connect" in await text(page, ".howto")
            assert await page.evaluate("document.getElementById('hangup').disabled && getComputedStyle(document.getElementById('hangup')).backgroundColor !== 'rgb(194, 59, 59)'")
            await screenshot(page, tmp_path, "idle")

            await page.evaluate(f"document.getElementById('key').value = {json.dumps(API_KEY)}; document.getElementById('connect').click()")
            await until(page, "playground.state === 'failed' || playground.events.includes('input_audio_buffer.speech_started')")
            await until(page, "playground.state === 'failed' || playground.micMaxLevel > 0.01")
            await screenshot(page, tmp_path, "listening")
            state = await until(page, "playground.state === 'failed' || (playground.agent === 'speaking' && playground.maxLevel > 0.05)", timeout=30)
            assert state["error"] is None, state["error"]
            await screenshot(page, tmp_path, "speaking")
            state = await until(page, "playground.state === 'failed' || (playground.events.includes('output_audio_buffer.stopped') "
                                      "&& playground.events.includes('conversation.item.input_audio_transcription.completed') && playground.latenciesMs.length > 0)", timeout=30)
            assert state["error"] is None, state["error"]

            # the agent went listening -> thinking -> speaking -> listening
            states = state["agentStates"]
            first_speaking = states.index("speaking")
            assert states[:2] == ["connecting", "listening"] and "thinking" in states[:first_speaking] and "listening" in states[first_speaking:]
            # both sides are transcribed, the user's once the transcript arrives
            assert f"You: {TRANSCRIPT}" in state["transcript"]
            assert any(line.startswith("Assistant: word0 word1 word2 word3 word4 word5") for line in state["transcript"])
            assert state["transcript"].index(f"You: {TRANSCRIPT}") < next(i for i, line in enumerate(state["transcript"]) if line.startswith("Assistant:"))
            # latency: the last figure, and one bar per turn in the history
            assert (await text(page, "#latency")).endswith(" ms")
            assert await page.evaluate("document.querySelectorAll('#latency-history div').length") == len(state["latenciesMs"])
            assert state["maxLevel"] > 0.05 and state["replyAudioMs"] >= 600

            # an event opens to its JSON
            opened = await page.evaluate("""(() => {
                const entry = [...document.querySelectorAll('#events details')].find((d) => d.textContent.includes('response.done'));
                entry.querySelector('summary').click();
                return new Promise((resolve) => setTimeout(() => resolve(entry.querySelector('pre').textContent), 100));
            })()""")
            assert json.loads(opened)["type"] == "response.done" and json.loads(opened)["response"]["status"] == "completed"

            # settings changed during the call are sent as session.update and applied
            await page.evaluate("const i = document.getElementById('instructions'); i.value = 'Answer in French.'; i.dispatchEvent(new Event('change'))")
            updated = await until(page, "playground.events.includes('session.updated')")
            assert updated["error"] is None
            assert "→ session.update" in await text(page, "#events")

            # the microphone: a picker with the fake device, and mute that silences the track
            assert await page.evaluate("document.getElementById('microphone').options.length") >= 2
            await page.evaluate("document.getElementById('mute').click()")
            assert await page.evaluate("document.getElementById('mute').getAttribute('aria-pressed') === 'true'")
            assert await page.evaluate("document.getElementById('mute').textContent") == "Unmute"
            await page.evaluate("document.getElementById('hangup').click()")
        await until_true(lambda: len(calls_of(server)) == 0, timeout=15)


async def connect_and_fail(page: browser.Page, key: str = "") -> dict:
    await page.evaluate(f"document.getElementById('key').value = {json.dumps(key)}; document.getElementById('connect').click()")
    state = await until(page, "playground.state === 'failed'")
    shown = await page.evaluate("getComputedStyle(document.getElementById('error')).display !== 'none' && document.getElementById('error-text').textContent")
    assert shown == state["error"]
    assert not await page.evaluate("document.getElementById('connect').disabled")
    assert await page.evaluate("document.getElementById('hangup').disabled")
    return state


async def test_errors_say_what_happened_and_what_to_do(tmp_path):
    async with browser.launch(tmp_path / "chromium", microphone_file(tmp_path)) as page:
        async with running_server(webrtc_profile(), api_key=API_KEY) as server:
            await open_page(page, server.base_url)
            missing = await connect_and_fail(page)
            assert missing["error"].startswith("This server needs an API key (401)") and "Settings" in missing["error"]
            wrong = await connect_and_fail(page, key="not-the-key")
            assert wrong["error"].startswith("The server refused the API key (401)")

            await page.evaluate("navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('Permission denied', 'NotAllowedError'))")
            denied = await connect_and_fail(page, key=API_KEY)
            assert denied["errorCode"] == "microphone_denied" and "Allow the microphone" in denied["error"]

        async with running_server(webrtc_profile(), enable_realtime=False) as server:
            await open_page(page, server.base_url)
            off = await connect_and_fail(page)
            assert off["errorCode"] == "realtime_disabled"
            assert "Realtime sessions are off" in off["error"] and "--enable-realtime" in off["error"] and "(403 realtime_disabled)" in off["error"]
            await screenshot(page, tmp_path, "error")

        async with running_server(webrtc_profile()) as server:
            server.runtime.shutting_down = True  # a draining server refuses new sessions with 503
            await open_page(page, server.base_url)
            draining = await connect_and_fail(page)
            assert draining["error"].startswith("The server is not ready (503)") and "try again" in draining["error"]
            server.runtime.shutting_down = False


async def test_the_page_fits_a_phone_screen(tmp_path):
    async with running_server(webrtc_profile()) as server, browser.launch(tmp_path / "chromium", microphone_file(tmp_path)) as page:
        await open_page(page, server.base_url, width=390, height=844, mobile=True)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        for selector in ("#connect", "#hangup", "#transcript", "#microphone", "#instructions", "#events"):
            box = await page.evaluate(f"JSON.parse(JSON.stringify(document.querySelector('{selector}').getBoundingClientRect()))")
            assert 0 <= box["left"] and box["right"] <= 390 and box["width"] > 0, (selector, box)
        # one column: the conversation above the controls
        conversation, controls = [await page.evaluate(f"document.querySelector('{s}').getBoundingClientRect().top") for s in ("#conversation", "aside")]
        assert conversation < controls
