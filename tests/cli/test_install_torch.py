"""scripts/install-torch.sh (run by `make setup`): the CPU wheel from PyTorch's CPU index when it
answers, pip's own sources otherwise, nothing when the pinned torch is there. pip is a stand-in
that records its arguments; the index is a local HTTP server, or a closed port."""

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port

SCRIPT = REPO / "scripts" / "install-torch.sh"
PINNED = next(line.split("==")[1] for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))


@pytest.fixture
def fake_venv(tmp_path) -> Path:
    """bin/pip records its argv; bin/python is a Python that sees no torch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "pip.log"}\n')
    (bin_dir / "pip").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nPYTHONPATH= PYTHONNOUSERSITE=1 exec {sys.executable} -S -I "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return tmp_path


def install(venv: Path, index: str) -> tuple[str, list[str]]:
    result = subprocess.run(["bash", str(SCRIPT), str(venv / "bin" / "pip")], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TORCH_INDEX": index})
    assert result.returncode == 0, result.stderr
    log = venv / "pip.log"
    return result.stdout, log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def cpu_index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *args: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_the_cpu_index_is_used_when_it_answers(fake_venv, cpu_index, monkeypatch, tmp_path):
    (tmp_path / "torch").mkdir()
    monkeypatch.chdir(tmp_path)  # the stand-in index serves this folder: /torch/ exists
    output, calls = install(fake_venv, cpu_index)
    assert calls == [f"install --progress-bar on -c constraints.txt --index-url {cpu_index} torch=={PINNED}"]
    assert f"torch {PINNED} from {cpu_index}" in output


def test_pip_own_sources_are_used_when_the_cpu_index_is_unreachable_and_it_says_so(fake_venv):
    output, calls = install(fake_venv, f"http://127.0.0.1:{free_port()}/")
    assert calls == [f"install --progress-bar on -c constraints.txt torch=={PINNED}"]
    assert "unreachable" in output and "CUDA build" in output


def test_nothing_is_installed_when_the_pinned_torch_is_there(tmp_path):
    venv_bin = Path(sys.executable).parent  # the project's own venv has the pinned torch
    result = subprocess.run(["bash", str(SCRIPT), str(venv_bin / "pip")], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TORCH_INDEX": f"http://127.0.0.1:{free_port()}/"})
    assert result.returncode == 0
    assert result.stdout.startswith(f"install-torch: torch {PINNED}") and "is installed" in result.stdout
