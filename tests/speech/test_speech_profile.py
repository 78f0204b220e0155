"""The shipped speech-only profile parses and validates (no weights are loaded)."""

from __future__ import annotations

from configs import builtin_profiles, load_profile
from graph.runtime import GraphRuntime
from nodes.qwen3_omni.bounds import ReplyBounds
from session_server.speech.service import SpeechConfig

SPEECH = "qwen3_omni_speech_h200.yaml"
SESSION = "qwen3_omni_session_h200.yaml"


def test_the_speech_only_profile_is_shipped_and_validates_as_a_graph():
    assert SPEECH in builtin_profiles()
    profile = load_profile(SPEECH)
    runtime = GraphRuntime.from_config(profile)  # parse + import node modules + types/streams/cycles
    spec = runtime.spec
    assert spec.model_id == "qwen3-omni"
    assert set(spec.inputs) == {"speech"}  # no realtime input: only speech requests enter
    assert [str(port) for port in spec.outputs] == ["code2wav.audio"]
    assert runtime.capacity("speech") == 128
    SpeechConfig.from_profile(profile)  # the `speech:` section's keys are known
    assert profile["warmup"]["input"] in spec.inputs


def test_the_speech_only_profile_is_the_reply_side_of_the_session_profile():
    speech, session = load_profile(SPEECH), load_profile(SESSION)
    assert speech["model_id"] == session["model_id"]
    for name, node in speech["nodes"].items():
        assert node["type"] == session["nodes"][name]["type"], name
    assert set(session["nodes"]) - set(speech["nodes"]) == {"vad", "dialog"}
    assert set(speech["edges"]) <= set(session["edges"])
    assert speech["inputs"]["speech"] == session["inputs"]["speech"]
    model, model_session = speech["resources"]["omni"], session["resources"]["omni"]
    assert model["type"] == model_session["type"]
    for key in ("path", "device", "dtype"):
        assert model["params"][key] == model_session["params"][key]
    # The checkpoint loader rejects unknown params only when it loads: check them here.
    known = {"path", "device", "dtype", "system_prompt", "kv_cache"} | set(ReplyBounds.__dataclass_fields__)
    assert set(model["params"]) <= known
