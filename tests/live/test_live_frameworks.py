"""The agent frameworks' own Live API clients, unchanged, against `sgl-omni serve` (the embedded
tiny model) through the framework harness (tests/frameworks/harness.py): pipecat's
`OpenAILiveLLMService` and LiveKit's `GPTLiveModel`. Each driver prints what it observed; these tests assert on it."""

from __future__ import annotations

import pytest

from tests.frameworks.harness import MODEL, FrameworkRun, run_framework


class TestPipecatLive:
    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory) -> FrameworkRun:
        return run_framework("pipecat", tmp_path_factory.mktemp("pipecat-live"), driver_name="pipecat_live")

    def test_the_session_starts_with_gpt_live_1_answered_by_the_served_model(self, run):
        facts = run.step("connect")
        assert (facts["model"], facts["served_model"]) == ("gpt-live-1", MODEL)

    def test_the_opening_instruction_is_commentary_the_model_speaks(self, run):
        facts = run.step("typed_turn")
        assert facts["commentary_appended"]
        assert facts["said"] and facts["audio_bytes"] > 0

    def test_a_spoken_turn_is_heard_and_answered_with_transcripts_both_ways(self, run):
        facts = run.step("spoken_turn")
        assert facts["heard"] and facts["said"] and facts["audio_bytes"] > 0

    def test_no_errors_and_the_server_survives(self, run):
        assert run.errors == []
        assert run.server_alive


class TestLiveKitLive:
    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory) -> FrameworkRun:
        return run_framework("livekit", tmp_path_factory.mktemp("livekit-live"), driver_name="livekit_live")

    def test_the_session_starts_with_client_delegation_and_gpt_live_1(self, run):
        facts = run.step("connect")
        assert (facts["model"], facts["served_model"]) == ("gpt-live-1", MODEL)
        assert facts["delegation"]["type"] == "client"

    def test_commentary_is_spoken(self, run):
        facts = run.step("typed_turn")
        assert facts["commentary_appended"]
        assert facts["said"] and facts["audio_bytes"] > 0

    def test_a_spoken_turn_is_heard_and_answered_with_transcripts_both_ways(self, run):
        facts = run.step("spoken_turn")
        assert facts["heard"] and facts["said"] and facts["audio_bytes"] > 0

    def test_no_errors_and_the_server_survives(self, run):
        assert run.errors == []
        assert run.server_alive
