"""The code blocks of README.md and docs/*.md, read and run against a live server (only for tests).

A fenced block is run by its language:
- `python`: every python block of one file, in order, in one namespace (a page read top to bottom:
  a later block may use the `client` an earlier one made), by the venv's interpreter;
- `sh` / `bash`: each block alone, `bash -euo pipefail`, with the venv's `bin` first on PATH and
  `curl` failing on an HTTP error (`--fail-with-body`);
- `json` / `yaml`: must parse (a YAML profile section must also pass the server's loader);
- a block without a language is output, a synopsis or a diagram: not run.
Any other language is an error, so that a new kind of block is not silently skipped.

`127.0.0.1:8000` and `localhost:8000` in a block become the live server's address. Blocks run in
a scratch directory holding a `.venv` link to the repository's and a `sample.wav` (2 s of speech)
for the voice-upload example.

An HTML comment as the last non-blank line before a block changes how it runs:
    <!-- not-run: REASON -->                 not run here (a GPU, sox, minutes of benchmark); REASON required
    <!-- http-errors-expected: REASON -->    a shell block whose curl calls show an HTTP error on purpose
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from session_server.profile import FEATURE_SECTIONS

RUN_LANGUAGES = {"python", "sh", "bash"}
PARSE_LANGUAGES = {"json", "yaml"}
MARKER = re.compile(r"<!--\s*(not-run|http-errors-expected):\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
DEFAULT_ADDRESSES = ("127.0.0.1:8000", "localhost:8000")
BLOCK_TIMEOUT_S = 40


class DocsFormatError(ValueError):
    """A markdown file the runner cannot read as intended (an unknown language, a marker without a reason)."""


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str  # "" for a block without one
    code: str
    not_run: str | None = None  # the reason, when marked not-run
    http_errors_expected: bool = False

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def read_blocks(path: Path) -> list[CodeBlock]:
    lines = path.read_text().splitlines()
    blocks: list[CodeBlock] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.group(1), opening.group(2).lower()
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise DocsFormatError(f"{path.name}:{index + 1}: a code block that is never closed")
        code = "\n".join(line.removeprefix(indent) for line in lines[index + 1:end])
        marker = _marker_before(lines, index)
        if language and language not in RUN_LANGUAGES | PARSE_LANGUAGES:
            raise DocsFormatError(f"{path.name}:{index + 1}: a `{language}` block: the runner knows "
                                  f"{sorted(RUN_LANGUAGES | PARSE_LANGUAGES)} (or none, for output)")
        not_run = errors_expected = None
        if marker is not None:
            kind, reason = marker
            if not reason:
                raise DocsFormatError(f"{path.name}:{index + 1}: `{kind}:` needs a reason")
            if kind == "not-run":
                not_run = reason
            else:
                errors_expected = reason
        blocks.append(CodeBlock(path, index + 1, language, code + "\n", not_run, errors_expected is not None))
        index = end + 1
    return blocks


def _marker_before(lines: list[str], fence_index: int) -> tuple[str, str] | None:
    previous = fence_index - 1
    while previous >= 0 and not lines[previous].strip():
        previous -= 1
    if previous < 0:
        return None
    found = MARKER.search(lines[previous])
    return (found.group(1), found.group(2)) if found else None


def with_address(code: str, address: str) -> str:
    for default in DEFAULT_ADDRESSES:
        code = code.replace(default, address)
    return code


@dataclass
class Failure:
    block: CodeBlock
    output: str

    def __str__(self) -> str:
        return f"--- {self.block.where} ({self.block.language}) failed:\n{self.output.strip()[-3000:]}"


def check_parses(block: CodeBlock) -> Failure | None:
    """Parses; a YAML profile section (`webrtc:`, `speech:`, `realtime:`) also passes the server's
    own loader for it."""
    try:
        value = (json.loads if block.language == "json" else yaml.safe_load)(block.code)
    except (ValueError, yaml.YAMLError) as error:
        return Failure(block, f"does not parse as {block.language}: {error}")
    if block.language == "yaml" and isinstance(value, dict):
        for section in value.keys() & FEATURE_SECTIONS.keys():
            try:
                FEATURE_SECTIONS[section]({section: value[section]})
            except ValueError as error:
                return Failure(block, f"the `{section}:` section is refused by the server: {error}")
    return None


_PYTHON_DRIVER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1])):
    try:
        exec(compile(block["code"], block["where"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print("FAILED BLOCK " + block["where"], flush=True)
        sys.exit(1)
    print("PASSED BLOCK " + block["where"], flush=True)
"""


def run_python(blocks: list[CodeBlock], address: str, workdir: Path, python: Path) -> Failure | None:
    """The file's python blocks in order, in one namespace; the first failure, if any."""
    if not blocks:
        return None
    listing = workdir / f"{blocks[0].path.stem}.blocks.json"
    listing.write_text(json.dumps([{"where": b.where, "code": with_address(b.code, address)} for b in blocks]))
    output = _run([str(python), "-c", _PYTHON_DRIVER, str(listing)], workdir, BLOCK_TIMEOUT_S * len(blocks))
    if output is None:
        return None
    failed = re.search(r"FAILED BLOCK (\S+)", output)
    # a timeout names no block: the one after the last that passed
    passed = re.findall(r"PASSED BLOCK (\S+)", output)
    culprit = next((b for b in blocks if failed and b.where == failed.group(1)), blocks[min(len(passed), len(blocks) - 1)])
    return Failure(culprit, output)


def run_shell(block: CodeBlock, address: str, workdir: Path, venv_bin: Path) -> Failure | None:
    prelude = "" if block.http_errors_expected else 'curl() { command curl --fail-with-body "$@"; }\n'
    script = prelude + with_address(block.code, address)
    result = _run(["bash", "-euo", "pipefail", "-c", script], workdir, BLOCK_TIMEOUT_S, venv_bin)
    return None if result is None else Failure(block, result)


def _run(command: list[str], workdir: Path, timeout: float, venv_bin: Path | None = None) -> str | None:
    """None when the command succeeds, else what it printed and how it ended."""
    env = dict(os.environ)
    if venv_bin is not None:
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    try:
        done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as expired:
        return f"timed out after {timeout:.0f} s\n{_text(expired.stdout)}{_text(expired.stderr)}"
    if done.returncode == 0:
        return None
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def documentation_files(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


if __name__ == "__main__":  # list the blocks and how each is treated
    for doc in documentation_files(Path(__file__).resolve().parents[2]):
        for block in read_blocks(doc):
            how = f"not run: {block.not_run}" if block.not_run else (
                "run" if block.language in RUN_LANGUAGES else "parsed" if block.language else "output")
            print(f"{block.where:24} {block.language or '-':7} {how}", file=sys.stdout)
