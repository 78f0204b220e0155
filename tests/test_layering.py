"""The import rules of .importlinter hold: `session_server -> graph <- nodes`, graph/ imports no
model library, the server process no torch, and no module imports one that imports it back
(import-linter reads the sources; nothing is imported)."""

from __future__ import annotations

from importlinter.cli import lint_imports

from tests.conftest import REPO


def test_the_import_rules_hold(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))
    exit_code = lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True, no_logo=True)
    assert exit_code == 0, capsys.readouterr().out
