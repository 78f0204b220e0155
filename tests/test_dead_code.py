"""vulture finds no dead code in session_server/, graph/, nodes/ and benchmarks/ at the confidence
[tool.vulture] in pyproject.toml names (unused imports, unreachable code, unused arguments); a
false report is listed in tests/dead_code_whitelist.py with its reason."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_vulture_finds_no_dead_code():
    result = subprocess.run([sys.executable, "-m", "vulture"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
