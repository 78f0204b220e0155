"""The agent frameworks' own Live API clients, unchanged, against `sgl-omni serve` (the embedded
tiny model) through the framework harness (tests/frameworks/harness.py): pipecat's
`OpenAILiveLLMService` and LiveKit's `GPTLiveModel`. Each driver prints what it observed; these tests assert on it.

The delegation round trip runs against a second server whose reply node delegates a turn that
asks it to (tests/live/fakes.py, as test_live_sdk.py does): the embedded model answers every turn
"Okay, sure!", and Live, unlike the GA dialect, has no `tool_choice` that would force a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.frameworks.drivers.steps import NEW_INSTRUCTIONS, weather_report, weather_sentence
from tests.frameworks.harness import MODEL, FrameworkRun, run_framework
from tests.live.fakes import live_profile


def run_delegating(name: str, tmp_path: Path, driver_name: str) -> FrameworkRun:
    """`run_framework` against `sgl-omni serve` on the delegating fake instead of the embedded model."""
    profile = tmp_path / "delegating.yaml"
    profile.write_text(json.dumps({**live_profile(), "compute": {"engines": 0}}))  # JSON is YAML
    return run_framework(name, tmp_path, driver_name=driver_name, profile=profile, options={"delegating": True})


def whole_reply_bytes(run: FrameworkRun) -> int:
    """The audio of a reply nothing cut: the typed turn's."""
    return run.step("typed_turn")["audio_bytes"]


class LiveFrameworkSteps:
    """What every framework's Live client does against the server; each subclass names its framework
    (the venv; its driver is `drive_<framework>_live.py`) and adds what only its framework shows."""

    framework: str

    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory) -> FrameworkRun:
        return run_framework(cls.framework, tmp_path_factory.mktemp(f"{cls.framework}-live"),
                             driver_name=f"{cls.framework}_live")

    @pytest.fixture(scope="class")
    @classmethod
    def delegating(cls, tmp_path_factory) -> FrameworkRun:
        return run_delegating(cls.framework, tmp_path_factory.mktemp(f"{cls.framework}-live-delegation"),
                              f"{cls.framework}_live")

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

    def test_speech_over_a_reply_cuts_it_short_and_is_answered(self, run):
        facts = run.step("barge_in")
        assert 0 < facts["interrupted_audio_bytes"] < whole_reply_bytes(run), facts
        assert facts["following_said"] and facts["following_audio_bytes"] > 0, facts

    def test_instructions_appended_mid_session_are_acknowledged_and_the_session_goes_on(self, run):
        facts = run.step("instructions_append")
        assert facts["acknowledged"]
        assert facts["next_turn"]["heard"] and facts["next_turn"]["said"], facts

    def test_speech_over_a_reply_while_muted_does_not_cut_it_and_unmuting_brings_turns_back(self, run):
        facts = run.step("mute")
        assert facts["reply_audio_bytes"] == whole_reply_bytes(run)  # the speech over it did not cut it
        assert facts["after_unmute"]["heard"] and facts["after_unmute"]["said"], facts

    def test_closing_sends_session_close_and_gets_session_closed_with_close_requested(self, run):
        facts = run.step("close")
        assert facts["reason"] == "close_requested"

    def test_a_delegation_reaches_the_framework_and_its_answer_is_what_the_model_says(self, delegating):
        facts = delegating.step("delegation")
        assert facts["framework_delegations"] == [facts["delegation"]["id"]]
        assert facts["said_after_answer"] == weather_sentence(weather_report("Paris"))  # the fake speaks it

    def test_no_errors_and_the_server_survives(self, run, delegating):
        assert run.errors == [] and delegating.errors == []
        assert run.server_alive and delegating.server_alive


class TestPipecatLive(LiveFrameworkSteps):
    """pipecat's `OpenAILiveLLMService`."""

    framework = "pipecat"

    def test_pipecat_leaves_barge_in_to_the_model_and_broadcasts_no_interruption_frame(self, run):
        assert run.step("barge_in")["interruption_frames"] == 0

    def test_pipecats_user_mute_keeps_the_audio_from_the_server(self, run):
        # pipecat's Live service has no `session.input_audio.mute`: its mute is the user aggregator's.
        assert run.step("mute")["audio_frames_sent_while_muted"] == 0

    def test_the_delegation_backend_runs_the_tool_and_pipecat_appends_its_answer(self, delegating):
        facts = delegating.step("delegation")
        assert facts["tool_function_calls"] == [{"city": "Paris"}]
        answer = weather_sentence(weather_report("Paris"))
        assert {"type": "session.commentary.append", "delegation_id": facts["delegation"]["id"], "content": answer} \
            in [{key: a[key] for key in ("type", "delegation_id", "content")} for a in facts["context_appends"]]


class TestLiveKitLive(LiveFrameworkSteps):
    """LiveKit's `GPTLiveModel`."""

    framework = "livekit"

    def test_the_session_starts_with_client_delegation(self, run):
        assert run.step("connect")["delegation"]["type"] == "client"

    def test_livekit_sees_the_user_speak_over_a_reply(self, run):
        assert run.step("barge_in")["input_speech_started"] > 0  # livekit's own event, from the input transcript

    def test_append_instructions_sends_session_instructions_append(self, run):
        sent = run.step("instructions_append")["sent"]
        assert sent == {"type": "session.instructions.append", "content": NEW_INSTRUCTIONS}

    def test_mute_input_and_unmute_input_are_acknowledged(self, run):
        facts = run.step("mute")
        assert (facts["muted_acknowledged"], facts["unmuted_acknowledged"]) == (True, True)

    def test_the_delegation_is_answered_with_append_commentary(self, delegating):
        facts = delegating.step("delegation")
        assert facts["sent"] == {"type": "session.commentary.append", "delegation_id": facts["delegation"]["id"],
                                 "content": weather_sentence(weather_report("Paris"))}
