"""Every code block of README.md and docs/*.md runs against a live `sgl-omni serve` (the embedded
default, as the docs say), so the docs cannot rot unnoticed. How blocks run and how one is marked
not to run: tests/docs/code_blocks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import soundfile

from nodes.qwen3_omni.checkpoint import default_cache_dir
from tests.conftest import REPO, free_port
from tests.docs import code_blocks
from tests.docs.code_blocks import CodeBlock, DocsFormatError, read_blocks
from tests.realtime.speech import speech

VENV_BIN = Path(sys.executable).parent
DOCS = code_blocks.documentation_files(REPO)


@dataclass
class LiveServer:
    address: str  # host:port, what the blocks' 127.0.0.1:8000 becomes
    workdir: Path  # where the blocks run


@pytest.fixture(scope="module")
def live_server(tmp_path_factory) -> Iterator[LiveServer]:
    """`sgl-omni serve --enable-realtime` on a free port, as `make serve` runs it; HOME is a scratch
    directory so that the voice-upload example does not touch the user's voices."""
    root = tmp_path_factory.mktemp("docs")
    workdir, home = root / "work", root / "home"
    workdir.mkdir()
    home.mkdir()
    (workdir / ".venv").symlink_to(VENV_BIN.parent)
    soundfile.write(workdir / "sample.wav", speech("The exact transcript of a voice sample."), 24000, subtype="PCM_16")
    port = free_port()
    env = {**os.environ, "HOME": str(home), "SGL_OMNI_CACHE": str(default_cache_dir())}
    with open(root / "serve.log", "w") as log:
        server = subprocess.Popen([str(VENV_BIN / "sgl-omni"), "serve", "--enable-realtime", "--port", str(port)],
                                  cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _healthy(port):
            assert server.poll() is None, f"the server exited: {(root / 'serve.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the server was not ready within 90 s"
            time.sleep(0.2)
        yield LiveServer(f"127.0.0.1:{port}", workdir)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def run_file(blocks: list[CodeBlock], server: LiveServer) -> list[code_blocks.Failure]:
    failures = []
    for block in blocks:
        if block.not_run is None and block.language in code_blocks.PARSE_LANGUAGES:
            failures.append(code_blocks.check_parses(block))
        elif block.not_run is None and block.language in ("sh", "bash"):
            failures.append(code_blocks.run_shell(block, server.address, server.workdir, VENV_BIN))
    python = [b for b in blocks if b.language == "python" and b.not_run is None]
    failures.append(code_blocks.run_python(python, server.address, server.workdir, VENV_BIN / "python"))
    return [f for f in failures if f is not None]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_code_blocks_of_the_doc_run_against_a_live_server(doc: Path, live_server: LiveServer):
    failures = run_file(read_blocks(doc), live_server)
    assert not failures, "\n".join(map(str, failures))


def test_every_block_of_the_docs_is_runnable_or_marked_with_a_reason():
    blocks = [b for doc in DOCS for b in read_blocks(doc)]  # raises DocsFormatError on an unknown language
    assert any(b.language == "python" and b.not_run is None for b in blocks)
    assert all(b.not_run for b in blocks if b.not_run is not None)


def test_a_marker_needs_a_reason_and_an_unknown_language_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- not-run: -->\n```bash\nls\n```\n")
    with pytest.raises(DocsFormatError, match="page.md:2: `not-run:` needs a reason"):
        read_blocks(page)
    page.write_text("```ruby\nputs 1\n```\n")
    with pytest.raises(DocsFormatError, match="page.md:1: a `ruby` block"):
        read_blocks(page)


def test_a_rotten_example_fails_with_its_line_and_output(tmp_path, live_server: LiveServer):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- not-run: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        "```bash\ncurl -sS http://127.0.0.1:8000/v1/no-such-route\n```\n\n"
        "```python\nx = 1\n```\n\n```python\nprint(x + undefined_name)\n```\n\n"
        "```json\n{\"a\": 1,}\n```\n"
    )
    blocks = read_blocks(page)
    assert [b.not_run for b in blocks] == ["needs a GPU", None, None, None, None]
    failures = {f.block.where: f.output for f in run_file(blocks, live_server)}
    assert set(failures) == {"page.md:8", "page.md:16", "page.md:20"}  # curl's 404, the NameError, the JSON
    assert "404" in failures["page.md:8"] and "not_found" in failures["page.md:8"]
    assert "NameError" in failures["page.md:16"]
    assert "does not parse as json" in failures["page.md:20"]


def test_a_profile_section_in_the_docs_must_pass_the_servers_own_check(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```yaml\nwebrtc:\n  candidates: everywhere\n```\n")
    failure = code_blocks.check_parses(read_blocks(page)[0])
    assert failure is not None and "the `webrtc:` section is refused" in failure.output and "candidates" in failure.output
