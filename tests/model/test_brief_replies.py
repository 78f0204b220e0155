"""The tiny checkpoint answers briefly and ends its turn with `<|im_end|>`, the same for every build."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from graph.messages import AudioOut, ReplyParams, TextDelta, Turn, TurnDone
from nodes.qwen3_omni.brief_replies import REPLY
from nodes.qwen3_omni.checkpoint import build_tiny_checkpoint
from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.model import OmniModel
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerSession
from tests.model.test_thinker_nodes import profile, until_done
from tests.realtime.speech import speech

CAP = 64  # far above any brief reply: a reply that ends here did not end on its own


def spoken(text: str) -> np.ndarray:
    return soxr.resample(speech(text), 24000, 16000).astype(np.float32)


def conversation(omni: OmniModel, turns: list[dict]) -> list[tuple[str | None, list[int]]]:
    """(finish reason, reply token ids) of each turn, in one session; the first turn has the system prompt."""
    session = ThinkerSession(omni, max_reply_tokens=CAP)
    replies = []
    for index, content in enumerate(turns):
        inputs = build_turn_inputs(omni, system_prompt=omni.system_prompt if index == 0 else None,
                                   add_generation_prompt=True, **content)
        session.prefill(encode_turns(omni, [inputs.tensors()])[0])
        tokens = []
        while (step := session.decode_step()).finish_reason is None:
            tokens.append(step.token_id)
        replies.append((step.finish_reason, tokens))
    session.close()
    return replies


def turns() -> list[dict]:
    """A written turn, a spoken one, then speech with text."""
    return [{"text": "Hello! Can you tell me a long story about the sea?"},
            {"audio": spoken("What is the weather like today in Paris?")},
            {"text": "And then?", "audio": spoken("And tomorrow?")}]


def test_text_and_spoken_turns_end_on_eos_with_a_short_reply(omni):
    for reason, tokens in conversation(omni, turns()):
        assert reason == "stop"  # the model chose <|im_end|>; no bound cut it
        assert 3 <= len(tokens) <= 12
        assert omni.tokenizer.decode(tokens) == REPLY


def test_two_builds_with_one_seed_reply_alike_and_another_seed_also_ends(tmp_path, tiny_checkpoint):
    again = OmniModel.load(build_tiny_checkpoint(tmp_path / "again", seed=0), device="cpu", dtype="float32")
    fixture = OmniModel.load(tiny_checkpoint, device="cpu", dtype="float32")
    conversation_turns = turns()
    assert conversation(again, conversation_turns) == conversation(fixture, conversation_turns)
    other = OmniModel.load(build_tiny_checkpoint(tmp_path / "other", seed=1), device="cpu", dtype="float32")
    assert all(reason == "stop" for reason, _ in conversation(other, conversation_turns))


@pytest.fixture
async def audio_runtime(tiny_checkpoint):
    from graph.runtime import GraphRuntime

    config = profile(tiny_checkpoint, audio_out=True)
    config["resources"]["omni"]["params"]["max_reply_tokens"] = CAP
    runtime = GraphRuntime.from_config(config)
    await runtime.start()
    yield runtime
    await runtime.stop(0)


async def test_a_completed_spoken_reply_has_audio_as_long_as_its_text_then_turn_done(audio_runtime):
    session = await audio_runtime.open_session("s")
    await session.send("turns", Turn(turn_id=1, item_id="i1", audio=spoken("Hello there.")))
    await session.send("turns", Turn(turn_id=2, reply=ReplyParams(response_id="r1")))
    out = await until_done(session)
    done = out[-1]
    assert isinstance(done, TurnDone) and (done.status, done.reason) == ("completed", None)
    assert done.transcript == REPLY == "".join(m.text for m in out if isinstance(m, TextDelta))
    assert done.usage.output_text_tokens < CAP
    # The talker stops after the text: 2 codec frames (80 ms each) per reply token in this profile.
    audio = sum(len(m.samples) for m in out if isinstance(m, AudioOut))
    assert 0 < audio <= 2 * done.usage.output_text_tokens * 1920


def test_ignore_eos_runs_a_reply_to_its_bound_for_benchmarks(omni):
    session = ThinkerSession(omni, Sampling(ignore_eos=True), max_reply_tokens=20)
    inputs = build_turn_inputs(omni, system_prompt=omni.system_prompt, text="hi", add_generation_prompt=True)
    session.prefill(encode_turns(omni, [inputs.tensors()])[0])
    steps = 1
    while session.decode_step().finish_reason is None:
        steps += 1
    assert steps == 20 and len(session.reply_token_ids) == 20
