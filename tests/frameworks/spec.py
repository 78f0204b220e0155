"""The nine steps every agent framework must pass against the server (issue 13), as one test
class that each framework's module subclasses with its name; a driver (drivers/) does the steps
through the framework's public API, these tests assert what it observed (harness.py).
"""

from __future__ import annotations

import json

import pytest

from tests.frameworks.drivers.steps import INSTRUCTIONS, NEW_INSTRUCTIONS
from tests.frameworks.harness import (
    MODEL,
    TRANSCRIPTION_MODEL,
    VOICE,
    FrameworkRun,
    run_framework,
)

VAD_TURN = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]


def spoken_reply(reply: dict) -> bool:
    return reply["status"] == "completed" and reply["audio_bytes"] > 0


class AgentFrameworkSteps:
    framework: str  # the venv and driver name: "openai-agents", "pipecat", "livekit"

    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory) -> FrameworkRun:
        """One server and one walk through the steps for the whole class."""
        return run_framework(cls.framework, tmp_path_factory.mktemp(cls.framework))

    def test_1_connects_and_the_server_creates_the_session(self, run):
        assert run.step("connect")["model"] == MODEL

    def test_2_instructions_voice_server_vad_transcription_and_a_tool_are_in_force(self, run):
        echoed = run.step("session_update")
        assert echoed["instructions"] == INSTRUCTIONS
        assert echoed["voice"] == VOICE
        assert echoed["turn_detection"] == "server_vad"
        assert echoed["tools"] == ["get_weather"]
        assert echoed["transcription"]["model"] == TRANSCRIPTION_MODEL

    def test_3_a_text_turn_gets_a_spoken_reply(self, run):
        turn = run.step("text_turn")
        assert spoken_reply(turn), turn

    @pytest.mark.parametrize("step", ["spoken_turn", "second_spoken_turn"])
    def test_4_5_speech_through_the_frameworks_audio_input_gets_a_spoken_reply(self, run, step):
        turn = run.step(step)
        assert [kind for kind in turn["events"] if kind in VAD_TURN][:3] == VAD_TURN
        assert spoken_reply(turn), turn

    def test_6_speech_during_a_reply_cancels_it_and_the_framework_truncates_it(self, run):
        barge_in = run.step("barge_in")
        assert barge_in["interrupted"]["status"] == "cancelled", barge_in["events"]
        assert barge_in["framework_saw_interruption"]
        assert barge_in["truncated"], barge_in["events"]
        # The words spoken over the reply are the next turn, answered with audio.
        assert spoken_reply(barge_in["following"]), barge_in["following"]

    def test_7_new_instructions_after_a_turn_are_echoed_and_the_next_reply_comes(self, run):
        step = run.step("new_instructions")
        assert step["echoed_instructions"] == NEW_INSTRUCTIONS
        assert spoken_reply(step["reply"]), step["reply"]
        assert step["errors"] == []

    def test_8_a_forced_tool_call_reaches_the_tool_function_and_a_spoken_follow_up_arrives(self, run):
        step = run.step("forced_tool_call")
        assert step["call"]["output_types"] == ["function_call"], step
        assert step["call"]["status"] == "completed"
        [arguments] = step["arguments"]
        assert isinstance(json.loads(arguments)["city"], str)
        assert step["tool_function_calls"] == [json.loads(arguments)]
        [output] = step["function_call_outputs"]  # the tool's result, as the framework serialised it
        assert "sunny" in output
        assert "message" in step["follow_up"]["output_types"]
        assert spoken_reply(step["follow_up"]), step["follow_up"]

    def test_9_user_transcripts_appear_in_the_frameworks_history(self, run):
        step = run.step("user_transcripts")
        assert len(step["server_transcripts"]) >= 4  # two spoken turns, the barged-in turn, the barge-in
        assert len(step["history_transcripts"]) >= 2 and all(step["history_transcripts"]), step

    def test_no_error_reached_the_framework_and_the_server_is_still_up(self, run):
        assert run.errors == [], run.errors
        assert run.server_alive
