"""Fixtures for the speech endpoints: a real server around the fake speaker graph."""

from __future__ import annotations

import pytest

from tests.conftest import running_server
from tests.speech.fake_speaker import speaker_profile


@pytest.fixture
def profile(tmp_path):
    return speaker_profile(tmp_path / "voices")


@pytest.fixture
async def server(profile):
    async with running_server(profile, enable_realtime=False) as running:
        yield running


def speaker_node(server):
    return server.runtime.nodes["speaker"]


def speech_service(server):
    return server.server.config.app.state.speech
