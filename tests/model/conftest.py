"""Model-test fixtures: one tiny Qwen3-Omni checkpoint per test session, built into a tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.qwen3_omni.checkpoint import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-omni"), seed=0)


@pytest.fixture(scope="session")
def omni(tiny_checkpoint: Path):
    """The tiny checkpoint loaded through `OmniModel.load` (the resource every node shares)."""
    from nodes.qwen3_omni.model import OmniModel

    return OmniModel.load(tiny_checkpoint, device="cpu", dtype="float32")
