"""Early prefill in the thinker node (nodes/thinker.py): a user utterance prefilled with its automatic
reply's header during the pause before its turn ends (`Turn.speculative`, the reply under a
provisional response id), then confirmed (`confirms`) or retracted (`retracts`).

Each test feeds two sessions on the tiny checkpoint (greedy) the same conversation, one the
ordinary way (the utterance committed with its reply) and one through an early prefill, and holds
them to the same outputs and the same model state.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from graph.messages import (
    NodeEvent,
    ReplyParams,
    TalkerPrompt,
    TextDelta,
    Truncate,
    Turn,
    TurnDone,
)
from graph.runtime import GraphRuntime
from tests.model.test_thinker_nodes import profile, speech
from tests.realtime.test_transcription import collect

KEEP = {"language": "en", "prompt": None, "keep_in_history": True}


@pytest.fixture
async def runtime(tiny_checkpoint):
    config = profile(tiny_checkpoint, warmup=False)
    runtime = GraphRuntime.from_config(config)
    await runtime.start()
    yield runtime
    await runtime.stop(0)


async def start_runtime(tiny_checkpoint, **thinker_params) -> GraphRuntime:
    runtime = GraphRuntime.from_config(profile(tiny_checkpoint, warmup=False, **thinker_params))
    await runtime.start()
    return runtime


def thinker(runtime, session):
    return runtime.sessions[session.id]._node_sessions["thinker"]


def model_state(runtime, session) -> tuple[list[int], list]:
    engine = thinker(runtime, session).engine
    return list(engine.context_ids), [segment.key for segment in engine.history.segments]


async def held_in_the_kv(node_session, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while node_session.speculation is None or node_session.speculation.checkpoint is None:
            await asyncio.sleep(0.01)


def reply_ended(response_id: str):
    return lambda out: any(isinstance(m, TurnDone) and m.response_id == response_id for m in out)


def transcript_ended(item_id: str):
    return lambda out: any(isinstance(m, NodeEvent) and m.kind.startswith("transcription_") and m.kind != "transcription_delta"
                           and m.item_id == item_id for m in out)


def both(*conditions):
    return lambda out: all(condition(out) for condition in conditions)


def reply(response_id: str, **fields) -> ReplyParams:
    return ReplyParams(response_id=response_id, **fields)


def spoken(turn_id: int, item_id: str, seconds: float = 1.0, seed: int = 0, **fields) -> Turn:
    return Turn(turn_id=turn_id, item_id=item_id, audio=speech(seconds, seed), **fields)


def speculative(turn_id: int, key: str, seconds: float = 1.0, seed: int = 0, **fields) -> Turn:
    """As nodes/dialog.py sends it: with the automatic reply under a provisional response id."""
    fields.setdefault("reply", reply(f"spec_resp_{key}"))
    return spoken(turn_id, key, seconds, seed, speculative=True, **fields)


def confirming(turn_id: int, key: str, item_id: str, response_id: str | None, **fields) -> Turn:
    return Turn(turn_id=turn_id, item_id=item_id, confirms=key, awaited=True,
                reply=reply(response_id) if response_id else None, **fields)


def reply_tokens(out) -> list[int]:
    return [t for m in out if isinstance(m, TextDelta) for t in m.token_ids]


def prompts(out) -> list[TalkerPrompt]:
    return [m for m in out if isinstance(m, TalkerPrompt)]


def talker_prompt(out) -> tuple[list[int], list[tuple[list[int], torch.Tensor]]]:
    """What the talker's history gets from a turn: every prompt token, and the user parts."""
    chunks = prompts(out)
    ids = [t for chunk in chunks for t in chunk.token_ids]
    parts = [(part.token_ids.tolist(), part.multimodal_hidden) for chunk in chunks for part in chunk.user_parts]
    return ids, parts


def assert_same_talker_prompt(out, expected) -> None:
    ids, parts = talker_prompt(out)
    expected_ids, expected_parts = talker_prompt(expected)
    assert ids == expected_ids
    assert [p for p, _ in parts] == [p for p, _ in expected_parts]
    for (_, hidden), (_, expected_hidden) in zip(parts, expected_parts, strict=True):
        torch.testing.assert_close(hidden, expected_hidden, rtol=1e-4, atol=1e-5)


async def test_a_confirmed_early_prefill_replies_as_the_committed_utterance_would(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    for session in (plain, early):  # a turn before: the new one follows a reply's closing
        await session.send("turns", Turn(turn_id=1, item_id="item_1", text="Hello.", reply=reply("r1")))
        await collect(session, reply_ended("r1"))

    await plain.send("turns", spoken(2, "item_2", awaited=True, reply=reply("r2")))
    expected = await collect(plain, reply_ended("r2"))
    await early.send("turns", speculative(2, "spec_a"))
    await held_in_the_kv(thinker(runtime, early))  # prefilled before its confirm is sent
    await early.send("turns", confirming(3, "spec_a", "item_2", "r2"))
    out = await collect(early, reply_ended("r2"))

    assert reply_tokens(out) and reply_tokens(out) == reply_tokens(expected)
    assert [m.text for m in out if isinstance(m, TextDelta)] == [m.text for m in expected if isinstance(m, TextDelta)]
    done, expected_done = out[-1], expected[-1]
    assert (done.status, done.transcript) == (expected_done.status, expected_done.transcript)
    # The utterance counts as the reply's input, not as cached, though it was prefilled before.
    assert done.usage == expected_done.usage and done.usage.input_audio_tokens == 13
    assert model_state(runtime, early) == model_state(runtime, plain)
    assert model_state(runtime, early)[1][-2:] == ["item_2", "r2"]  # the private key is gone
    assert_same_talker_prompt(out, expected)
    # One prompt chunk, user parts and reply header, as the ordinary turn's: the talker takes the
    # user turn in with the reply.
    assert len(prompts(out)) == len(prompts(expected)) == 1 and prompts(out)[0].reply_follows
    # Nothing went out before the confirm: all of it is the confirming turn's.
    assert {m.turn_id for m in out} == {3}
    assert runtime.nodes["thinker"].counters() == {"early_prefill": 1, "early_prefill_confirmed": 1}  # /metrics

    # And the conversation goes on the same.
    for session in (plain, early):
        await session.send("turns", Turn(turn_id=4, item_id="item_4", text="More?", reply=reply("r3")))
    after, expected_after = await collect(early, reply_ended("r3")), await collect(plain, reply_ended("r3"))
    assert reply_tokens(after) == reply_tokens(expected_after) and after[-1].usage == expected_after[-1].usage


async def test_a_retracted_early_prefill_leaves_no_trace(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    # The very first turn is retracted (the system prompt is not fed yet), then one after a reply.
    await early.send("turns", speculative(1, "spec_a", seconds=0.6, seed=1))
    await early.send("turns", Turn(turn_id=2, retracts="spec_a"))
    for session in (plain, early):
        await session.send("turns", spoken(3, "item_3", awaited=True, reply=reply("r1")))
    first, expected_first = await collect(early, reply_ended("r1")), await collect(plain, reply_ended("r1"))
    assert model_state(runtime, early) == model_state(runtime, plain)

    await early.send("turns", speculative(4, "spec_b", seconds=0.6, seed=2))
    await early.send("turns", Turn(turn_id=5, retracts="spec_b"))
    await early.send("turns", Turn(turn_id=6, retracts="spec_unknown"))  # names nothing held: ignored
    for session in (plain, early):
        await session.send("turns", spoken(7, "item_7", seed=3, awaited=True, reply=reply("r2")))
    second, expected_second = await collect(early, reply_ended("r2")), await collect(plain, reply_ended("r2"))

    for out, expected in ((first, expected_first), (second, expected_second)):
        assert reply_tokens(out) == reply_tokens(expected) and out[-1].usage == expected[-1].usage
        assert_same_talker_prompt(out, expected)
    assert model_state(runtime, early) == model_state(runtime, plain)
    assert not [m for m in first + second if m.turn_id in (1, 2, 4, 5, 6)]  # nothing reached `hidden`/`text`
    assert runtime.nodes["thinker"].counters() == {"early_prefill": 2, "early_prefill_dropped": 2}  # /metrics


async def test_a_retract_restores_the_reply_state_the_early_prefill_set(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    for session in (plain, early):
        await session.send("turns", Turn(turn_id=1, item_id="item_1", text="Hello.", reply=reply("r1")))
        await collect(session, reply_ended("r1"))
    engine = thinker(runtime, early).engine

    def reply_state():
        return engine._reply, engine._last_logits, engine.sampling, engine._generator

    before = reply_state()
    # Its reply samples otherwise: the prefill sets the reply, its logits, sampling and generator.
    sampled = reply("spec_resp_a", sampling={"temperature": 0.7, "seed": 5})
    await early.send("turns", speculative(2, "spec_a", reply=sampled))
    await held_in_the_kv(thinker(runtime, early))
    held = reply_state()
    assert held[0] is not before[0] and held[2] != before[2] and held[3] is not None
    await early.send("turns", Turn(turn_id=3, retracts="spec_a"))
    async with asyncio.timeout(30):
        while thinker(runtime, early).speculation is not None:
            await asyncio.sleep(0.01)

    after = reply_state()
    assert after[0] is before[0] and after[1] is before[1] and after[2] == before[2] and after[3] is before[3]
    # The previous reply is still the one a Truncate cuts, and the conversation goes on the same.
    for session in (plain, early):
        session.control(Truncate(turn_id=1, response_id="r1", item_id="item_r1", audio_end_ms=160.0))
        await session.send("turns", spoken(4, "item_4", awaited=True, reply=reply("r2")))
    out, expected = await collect(early, reply_ended("r2")), await collect(plain, reply_ended("r2"))
    assert reply_tokens(out) == reply_tokens(expected) and out[-1].usage == expected[-1].usage
    assert model_state(runtime, early) == model_state(runtime, plain)


async def test_a_held_early_prefill_that_another_turn_overtakes_is_dropped(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    await early.send("turns", speculative(1, "spec_a"))  # its confirm never comes (purged by an interrupt)
    for session in (plain, early):
        await session.send("turns", Turn(turn_id=3, item_id="item_3", text="Hi.", reply=reply("r1")))
    out, expected = await collect(early, reply_ended("r1")), await collect(plain, reply_ended("r1"))
    assert reply_tokens(out) == reply_tokens(expected) and out[-1].usage == expected[-1].usage
    assert model_state(runtime, early) == model_state(runtime, plain)


async def test_a_truncate_during_the_pause_applies_before_the_confirmed_utterance(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    for session in (plain, early):
        await session.send("turns", Turn(turn_id=1, item_id="item_1", text="Hello.", reply=reply("r1")))
        await collect(session, reply_ended("r1"))
    await early.send("turns", speculative(2, "spec_a"))
    await held_in_the_kv(thinker(runtime, early))
    early.control(Truncate(turn_id=1, response_id="r1", item_id="item_r1", audio_end_ms=160.0))
    plain.control(Truncate(turn_id=1, response_id="r1", item_id="item_r1", audio_end_ms=160.0))
    await plain.send("turns", spoken(4, "item_4", awaited=True, reply=reply("r2")))
    await early.send("turns", confirming(4, "spec_a", "item_4", "r2"))
    out, expected = await collect(early, reply_ended("r2")), await collect(plain, reply_ended("r2"))
    assert reply_tokens(out) == reply_tokens(expected) and out[-1].usage == expected[-1].usage
    assert out[-1].usage.cached_tokens == expected[-1].usage.cached_tokens  # the reply was cut to 2 tokens
    assert_same_talker_prompt(out, expected)
    assert model_state(runtime, early) == model_state(runtime, plain)


async def test_an_early_prefill_under_new_instructions_goes_in_at_its_confirm(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    for session in (plain, early):
        await session.send("turns", Turn(turn_id=1, item_id="item_1", text="Hello.", reply=reply("r1")))
        await collect(session, reply_ended("r1"))
    # New instructions: the utterance's prefill would rebuild the history, which no restore undoes.
    await plain.send("turns", spoken(2, "item_2", instructions="Be terse.", awaited=True, reply=reply("r2")))
    await early.send("turns", speculative(2, "spec_a", instructions="Be terse."))
    await early.send("turns", confirming(3, "spec_a", "item_2", "r2", instructions="Be terse."))
    out, expected = await collect(early, reply_ended("r2")), await collect(plain, reply_ended("r2"))
    assert reply_tokens(out) == reply_tokens(expected) and out[-1].usage == expected[-1].usage
    assert model_state(runtime, early) == model_state(runtime, plain)
    assert {m.turn_id for m in out} == {3}


async def test_a_confirm_with_transcribe_reports_the_transcript_under_the_real_item_id(runtime):
    plain, early = await runtime.open_session("plain"), await runtime.open_session("early")
    text_reply = reply("r1", output_modalities=("text",))
    await plain.send("turns", spoken(1, "item_1", awaited=True, transcribe=KEEP, reply=text_reply))
    await early.send("turns", speculative(1, "spec_a", reply=reply("spec_resp_a", output_modalities=("text",))))
    await early.send("turns", Turn(turn_id=2, item_id="item_1", confirms="spec_a", awaited=True, transcribe=KEEP,
                                   reply=text_reply))
    until = both(reply_ended("r1"), transcript_ended("item_1"))
    out, expected = await collect(early, until), await collect(plain, until)

    def transcription(messages):
        return [(m.kind, m.payload()) for m in messages if isinstance(m, NodeEvent) and m.kind.startswith("transcription_")]

    events = transcription(out)
    assert events[-1][0] == "transcription_completed" and events[-1][1]["usage"]["input_audio_tokens"] == 13
    assert events == transcription(expected)  # the same transcript, under item_1
    assert reply_tokens(out) == reply_tokens(expected)
    assert model_state(runtime, early) == model_state(runtime, plain)  # the pass was rolled back in both


async def test_a_confirm_of_a_failed_early_prefill_fails_the_reply_with_its_code(tiny_checkpoint):
    runtime = await start_runtime(tiny_checkpoint, max_seq_len=40)
    try:
        session = await runtime.open_session("s")
        await session.send("turns", speculative(1, "spec_a", seconds=3.0))  # does not fit the context
        await session.send("turns", confirming(2, "spec_a", "item_2", "r1"))
        out = await collect(session, reply_ended("r1"))
        assert [(m.status, m.reason) for m in out] == [("failed", "context_exhausted")]  # no other notice
        assert thinker(runtime, session).engine.context_ids == []

        # Without a reply (the queue of replies was full): the error notice of an utterance.
        await session.send("turns", speculative(3, "spec_b", seconds=3.0))
        await session.send("turns", confirming(4, "spec_b", "item_4", None))
        async with asyncio.timeout(30):
            notice = await anext(session.outputs())
        assert isinstance(notice, NodeEvent) and (notice.kind, notice.code) == ("error", "context_exhausted")
    finally:
        await runtime.stop(0)


async def test_a_confirm_naming_nothing_held_fails_with_internal_and_the_session_goes_on(runtime):
    session = await runtime.open_session("s")
    await session.send("turns", confirming(1, "spec_gone", "item_1", "r1"))
    out = await collect(session, reply_ended("r1"))
    assert [(m.status, m.reason) for m in out] == [("failed", "internal")]
    await session.send("turns", speculative(2, "spec_a"))
    await session.send("turns", confirming(3, "spec_other", "item_3", "r2"))  # not the one held: dropped too
    out = await collect(session, reply_ended("r2"))
    assert [(m.status, m.reason) for m in out] == [("failed", "internal")]
    assert thinker(runtime, session).engine.context_ids == []
    await session.send("turns", Turn(turn_id=4, item_id="item_4", text="Hi.", reply=reply("r3")))
    assert (await collect(session, reply_ended("r3")))[-1].status in ("completed", "incomplete")
    assert not session.failed
