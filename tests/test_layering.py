"""The import rules of .importlinter hold: `session_server -> graph <- nodes`, graph/ imports no
model library, the server process no torch, and no module imports one that imports it back
(import-linter reads the sources; nothing is imported).

It runs as its own process: import-linter configures logging as a command line tool does, which
would silence the loggers that later tests read with caplog."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_import_rules_hold():
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='.importlinter', no_cache=True, no_logo=True))"],
        cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
