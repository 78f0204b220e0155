"""Run one agent framework's driver against a real server and collect what it observed.

Each framework lives in its own venv (`.venv-frameworks/<name>`, made by
scripts/install-framework-clients.sh: their pins conflict with the server's). The test starts
`sgl-omni serve` on the embedded default (tiny random-weight Qwen3-Omni, 127.0.0.1), speaks the
test utterances with espeak-ng into PCM files, and runs `drivers/drive_<name>.py` with that venv's
python; the driver prints one JSON line per step (drivers/steps.py), which the test asserts on.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, free_port, serve_process
from tests.realtime.speech import pcm16, silence, speech

VENVS = REPO / ".venv-frameworks"
DRIVERS = Path(__file__).parent / "drivers"
INSTALL_SCRIPT = REPO / "scripts" / "install-framework-clients.sh"
EMBEDDED = REPO / "configs" / "embedded_cpu.yaml"
MODEL = "qwen3-omni-tiny"
VOICE = "ethan"  # a speaker of the tiny checkpoint, so the echoed voice is the one requested
TRANSCRIPTION_MODEL = "gpt-4o-mini-transcribe"
DRIVER_TIMEOUT_S = 420
UTTERANCES = {
    "first": "What is the weather like today in Paris?",
    "second": "And tomorrow?",
    "barge_in": "Wait, what about Berlin?",
}


@dataclass
class FrameworkRun:
    steps: dict[str, dict[str, Any]]
    errors: list[tuple[str, str]]  # every error the framework surfaced, with its step
    server_alive: bool
    log: str = field(repr=False)  # the driver's stderr tail, for a failing test's message

    def step(self, name: str) -> dict[str, Any]:
        """One step's facts; a step that timed out or raised fails here, with the driver's log."""
        facts = self.steps.get(name)
        assert facts is not None, f"the driver never reported step {name!r}:\n{self.log}"
        assert not facts.get("timed_out"), f"step {name!r} timed out: {facts}\n{self.log}"
        assert "exception" not in facts, f"step {name!r} raised: {facts['exception']}\n{self.log}"
        return facts


def framework_python(name: str) -> Path:
    """The framework venv's python, installed on first use; skip only if it cannot be installed."""
    python = VENVS / name / "bin" / "python"
    if not (VENVS / name / ".installed").exists():
        subprocess.run(["bash", str(INSTALL_SCRIPT)], cwd=REPO, check=True)
    failed = VENVS / f"{name}.failed"
    if failed.exists():
        pytest.skip(f"{name} cannot be installed here: {failed.read_text()[-400:]}")
    return python


def write_utterances(directory: Path) -> dict[str, str]:
    """Each utterance as PCM16 24 kHz mono: leading silence, speech, a pause that ends the turn."""
    paths = {}
    for name, text in UTTERANCES.items():
        lead = 0.1 if name == "barge_in" else 0.3
        samples = np.concatenate([silence(lead), speech(text), silence(1.0)])
        path = directory / f"{name}.pcm"
        path.write_bytes(pcm16(samples))
        paths[name] = str(path)
    return paths


def run_framework(name: str, tmp_path: Path, driver_name: str | None = None, profile: Path = EMBEDDED,
                  options: dict[str, Any] | None = None) -> FrameworkRun:
    """`driver_name`: a driver other than `drive_<name>.py` in that venv (the Live API's);
    `profile`: the server's profile (a fake model where the tiny one cannot show a step);
    `options`: more of the driver's config (`delegating`: the Live drivers walk that step alone)."""
    python = framework_python(name)
    port = free_port()
    config = {
        "url": f"ws://127.0.0.1:{port}/v1/realtime?model={MODEL}",
        "ws_base_url": f"ws://127.0.0.1:{port}/v1/realtime",
        "live_url": f"ws://127.0.0.1:{port}/v1/live/sessions",
        "http_base_url": f"http://127.0.0.1:{port}/v1",
        "api_key": "sk-test",
        "model": MODEL,
        "voice": VOICE,
        "transcription_model": TRANSCRIPTION_MODEL,
        "audio": write_utterances(tmp_path),
        **(options or {}),
    }
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    # No network in CI: the frameworks must not try to export traces to their vendors.
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_API_KEY": "sk-test", "PYTHONUNBUFFERED": "1"}
    driver = DRIVERS / f"drive_{(driver_name or name).replace('-', '_')}.py"
    with serve_process(profile, port) as server:
        finished = subprocess.run(
            [str(python), str(driver), str(config_path)], cwd=DRIVERS, env=env,
            capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, check=False,
        )
        server_alive = server.poll() is None
    lines = [json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")]
    steps = {line["step"]: line for line in lines}
    end = steps.pop("end", {"errors": [("end", f"the driver did not finish (exit {finished.returncode})")]})
    return FrameworkRun(steps, [tuple(error) for error in end["errors"]], server_alive, finished.stderr[-4000:])
