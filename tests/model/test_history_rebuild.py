"""Editing a thinker session's history (new system prompt, delete, insert) rebuilds its KV, and the
next reply is the one a fresh session fed the same conversation gives (greedy, tiny checkpoint)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.thinker_engine import ThinkerSession
from tests.model.test_thinker import run_reply


def system(omni, text: str) -> list[int]:
    return build_turn_inputs(omni, system_prompt=text).input_ids


def user(omni, text: str | None = None, audio: np.ndarray | None = None) -> dict:
    return encode_turns(omni, [build_turn_inputs(omni, text=text, audio=audio).tensors()])[0]


def reply_request(omni) -> dict:
    return build_turn_inputs(omni, add_generation_prompt=True).tensors()


def assistant_message(omni, reply: list[int]) -> dict:
    tokens = omni.tokens
    return {"input_ids": torch.tensor([*tokens.assistant_header, *reply, *tokens.closing])}


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def answer(session: ThinkerSession, omni, key: str) -> list[int]:
    session.prefill(reply_request(omni), key=key)
    return run_reply(session)


def new_session(omni) -> ThinkerSession:
    return ThinkerSession(omni, max_reply_tokens=6)


def conversation(omni, session: ThinkerSession) -> tuple[list[int], list[int]]:
    """Two turns and their replies (u1, r1, u2, r2) after a terse system prompt -> the replies."""
    session.set_system_prompt(system(omni, "You are terse."))
    session.prefill(user(omni, "Hello there."), key="u1")
    r1 = answer(session, omni, "r1")
    session.prefill(user(omni, "What is two and two?"), key="u2")
    r2 = answer(session, omni, "r2")
    return r1, r2


def fed(omni, *items: dict | list[int], instructions: str | None = "You are terse.") -> ThinkerSession:
    """A fresh session told `instructions` (None: no system prompt) and fed `items` in order, each
    a user turn (`user`) or a reply's token ids (fed as the assistant's message): the session a
    rebuilt one must equal."""
    session = new_session(omni)
    if instructions is not None:
        session.set_system_prompt(system(omni, instructions))
    for item in items:
        if isinstance(item, dict):
            session.prefill(item)
        else:
            session.prefill(assistant_message(omni, item), reply=False)
    return session


def assert_same_history(rebuilt: ThinkerSession, fresh: ThinkerSession) -> None:
    assert rebuilt.context_ids == fresh.context_ids
    assert rebuilt.cache.get_seq_length() == rebuilt.context_length
    assert rebuilt._positions_after == fresh._positions_after


def test_new_instructions_replace_the_system_prompt_and_the_next_reply_equals_a_fresh_sessions(omni):
    rebuilt = new_session(omni)
    rebuilt.set_system_prompt(system(omni, "You are terse."))
    rebuilt.prefill(user(omni, "Hello there."), key="u1")
    first = answer(rebuilt, omni, "r1")
    assert rebuilt.set_system_prompt(system(omni, "You speak like a pirate.")) is True
    assert rebuilt.set_system_prompt(system(omni, "You speak like a pirate.")) is False  # unchanged: no rebuild
    rebuilt.prefill(user(omni, "And then?"), key="u2")
    second = answer(rebuilt, omni, "r2")

    fresh = fed(omni, user(omni, "Hello there."), first, user(omni, "And then?"),
                instructions="You speak like a pirate.")
    assert answer(fresh, omni, "r2") == second
    assert_same_history(rebuilt, fresh)
    # Only the system prompt's opening tokens that both prompts share were reused.
    old, new = system(omni, "You are terse."), system(omni, "You speak like a pirate.")
    shared = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    assert rebuilt.reply_usage().cached_tokens == shared


@pytest.mark.parametrize("deleted", ["u2", "r1"])
def test_deleting_an_item_rebuilds_from_it_and_the_next_reply_equals_a_fresh_sessions(omni, deleted):
    rebuilt = new_session(omni)
    r1, r2 = conversation(omni, rebuilt)
    kept = rebuilt.history.segments[rebuilt.history.index_of(deleted)].start
    assert rebuilt.delete(deleted) is True
    assert rebuilt.delete("nobody") is False
    rebuilt.prefill(user(omni, "Thanks."), key="u3")
    r3 = answer(rebuilt, omni, "r3")
    assert rebuilt.reply_usage().cached_tokens == kept

    items = {"u1": user(omni, "Hello there."), "r1": r1, "u2": user(omni, "What is two and two?"), "r2": r2}
    del items[deleted]
    fresh = fed(omni, *items.values(), user(omni, "Thanks."))
    assert answer(fresh, omni, "r3") == r3
    assert_same_history(rebuilt, fresh)


def user_with_reply(omni, text: str) -> dict:
    return encode_turns(omni, [build_turn_inputs(omni, text=text, add_generation_prompt=True).tensors()])[0]


def test_an_utterance_that_brings_its_reply_is_one_prefill_and_two_history_items(omni):
    merged = new_session(omni)
    prefill = merged.prefill(user_with_reply(omni, "Hello there."), key="u1", reply_key="r1")
    assert prefill.reply_started
    r1 = []
    while (step := merged.decode_step()).finish_reason is None:
        r1.append(step.token_id)
    apart = new_session(omni)
    apart.prefill(user(omni, "Hello there."), key="u1")
    assert answer(apart, omni, "r1") == r1 + ([step.token_id] if step.token_id is not None else [])
    assert [s.key for s in merged.history.segments] == ["u1", "r1"]
    # The reply is its own item: deleting it leaves the utterance, as when they came apart.
    assert merged.delete("r1") and apart.delete("r1")
    merged.prefill(user(omni, "Thanks."), key="u2")
    apart.prefill(user(omni, "Thanks."), key="u2")
    assert answer(merged, omni, "r2") == answer(apart, omni, "r2")
    assert_same_history(merged, apart)


def test_deleting_the_last_reply_drops_its_pending_closing(omni):
    rebuilt = new_session(omni)
    rebuilt.prefill(user(omni, "Hello there."), key="u1")
    answer(rebuilt, omni, "r1")
    assert rebuilt.delete("r1")
    assert rebuilt.pending == []
    rebuilt.prefill(user(omni, "Again."), key="u2")

    fresh = fed(omni, user(omni, "Hello there."), user(omni, "Again."), instructions=None)
    assert answer(rebuilt, omni, "r2") == answer(fresh, omni, "r2")
    assert_same_history(rebuilt, fresh)


@pytest.mark.parametrize("where", ["root", "middle"])
def test_inserting_before_the_end_rebuilds_audio_turns_too_and_the_talker_view_follows(omni, where):
    spoken = speech(1.0)
    rebuilt = new_session(omni)
    rebuilt.set_system_prompt(system(omni, "You are terse."))
    rebuilt.prefill(user(omni, audio=spoken), key="u1")
    r1 = answer(rebuilt, omni, "r1")
    after = [] if where == "root" else ["missing", "u1"]  # nearest first: the first one the model holds wins
    prefill = rebuilt.prefill(user(omni, "Inserted."), key="x", insert_after=after)
    assert prefill.rebuilt and prefill.token_ids == []
    assert prefill.cached_tokens == rebuilt.history.segments[rebuilt.history.index_of("x")].start
    r2 = answer(rebuilt, omni, "r2")

    fresh = new_session(omni)
    fresh.set_system_prompt(system(omni, "You are terse."))
    parts = []
    if where == "root":
        parts += fresh.prefill(user(omni, "Inserted.")).user_parts
    parts += fresh.prefill(user(omni, audio=spoken)).user_parts
    if where == "middle":
        parts += fresh.prefill(user(omni, "Inserted.")).user_parts
    fresh.prefill(assistant_message(omni, r1), reply=False)
    assert answer(fresh, omni, "r2") == r2
    assert_same_history(rebuilt, fresh)
    assert rebuilt.audio_tokens_in_context == fresh.audio_tokens_in_context == 13

    view = rebuilt.talker_view()
    assert len(view.user_parts) == len(parts) == 2
    for got, want in zip(view.user_parts, parts):
        assert torch.equal(got.token_ids, want.token_ids)
        torch.testing.assert_close(got.multimodal_hidden, want.multimodal_hidden, rtol=1e-4, atol=1e-4)
    assert view.audio_feature_lengths.tolist() == user(omni, audio=spoken)["audio_feature_lengths"].tolist()
    assert view.tail_ids == [omni.tokens.im_start, omni.tokens.assistant, omni.tokens.newline, *r2]


def test_an_insert_at_the_end_is_an_append(omni):
    session = new_session(omni)
    session.prefill(user(omni, "Hello there."), key="u1")
    prefill = session.prefill(user(omni, "More."), key="u2", insert_after=["u1"])
    assert not prefill.rebuilt and prefill.cached_tokens == session.history.segments[1].start
    assert [s.key for s in session.history.segments] == ["u1", "u2"]


def test_the_first_system_prompt_is_fed_with_the_first_turn(omni):
    session = new_session(omni)
    assert session.set_system_prompt(system(omni, "You are terse.")) is False
    forwarded = session.tokens_forwarded
    session.prefill(user(omni, "Hello there."), key="u1")
    assert session.context_ids[: len(system(omni, "You are terse."))] == system(omni, "You are terse.")
    assert session.history.system is not None and session.history.segments[1].key == "u1"
    assert session.tokens_forwarded - forwarded == session.context_length


# ---------------------------------------------------------------------------- through the graph


@pytest.fixture
async def graph(tiny_checkpoint):
    from graph.runtime import GraphRuntime
    from tests.model.test_thinker_nodes import profile

    config = profile(tiny_checkpoint, audio_out=True)
    config["nodes"]["talker"]["params"]["sampling"] = {"do_sample": False}  # greedy: replies comparable
    runtime = GraphRuntime.from_config(config)
    await runtime.start()
    yield runtime
    await runtime.stop(0)


async def converse(runtime, name: str, turns: list) -> list:
    """Send the turns; the messages up to each reply's TurnDone, per reply."""
    from graph.messages import TurnDone
    from tests.model.test_thinker_nodes import until_done

    session = await runtime.open_session(name)
    for turn in turns:
        await session.send("turns", turn)
    response_ids = [turn.reply.response_id for turn in turns if turn.reply is not None]
    messages = [m for _ in response_ids for m in await until_done(session)]
    await session.close()
    # Text runs ahead of audio: a reply's TextDeltas may come before the previous reply's TurnDone.
    replies = [[m for m in messages if getattr(m, "response_id", None) == r] for r in response_ids]
    assert all(isinstance(reply[-1], TurnDone) for reply in replies)
    return replies


def said(reply: list) -> tuple[list[int], np.ndarray]:
    from graph.messages import AudioOut, TextDelta

    tokens = [t for m in reply if isinstance(m, TextDelta) for t in m.token_ids]
    audio = [m.samples for m in reply if isinstance(m, AudioOut)]
    return tokens, np.concatenate(audio) if audio else np.zeros(0, np.float32)


def assert_same_reply(rebuilt: list, fresh: list) -> None:
    (tokens, audio), (fresh_tokens, fresh_audio) = said(rebuilt), said(fresh)
    assert tokens == fresh_tokens and len(tokens) > 0
    assert audio.shape == fresh_audio.shape and audio.size > 0  # the talker spoke from the rebuilt history
    np.testing.assert_allclose(audio, fresh_audio, atol=1e-4)


def T(turn_id: int, instructions: str = "Be terse.", **fields):
    from graph.messages import ReplyParams, Turn

    if "reply" in fields:
        fields["reply"] = ReplyParams(response_id=fields["reply"])
    return Turn(turn_id=turn_id, instructions=instructions, **fields)


async def test_graph_new_instructions_rebuild_thinker_and_talker_like_a_fresh_session(graph):
    spoken = speech(1.0, seed=3)
    (rebuilt,) = await converse(graph, "a", [
        T(1, "Be terse.", item_id="u1", audio=spoken),
        T(2, "Speak French.", item_id="u2", text="And then?"),
        T(3, "Speak French.", reply="r"),
    ])
    (fresh,) = await converse(graph, "b", [
        T(1, "Speak French.", item_id="u1", audio=spoken),
        T(2, "Speak French.", item_id="u2", text="And then?"),
        T(3, "Speak French.", reply="r"),
    ])
    assert_same_reply(rebuilt, fresh)


async def test_graph_deleting_a_reply_rebuilds_and_the_next_reply_reuses_only_the_kept_prefix(graph):
    spoken = speech(1.0, seed=4)
    first, rebuilt = await converse(graph, "a", [
        T(1, item_id="u1", audio=spoken), T(2, reply="r1"),
        T(3, item_id="u2", text="What now?"),
        T(4, item_id="r1-item", delete_key="r1"),
        T(5, item_id="u3", text="Go on.", reply="r2"),
    ])
    (fresh,) = await converse(graph, "b", [
        T(1, item_id="u1", audio=spoken), T(3, item_id="u2", text="What now?"), T(5, item_id="u3", text="Go on.", reply="r2"),
    ])
    assert_same_reply(rebuilt, fresh)
    header = 3  # the first reply's `<|im_start|>assistant\n`: its segment starts there
    assert rebuilt[-1].usage.cached_tokens == first[-1].usage.input_tokens - header
    assert rebuilt[-1].usage.input_tokens == fresh[-1].usage.input_tokens


@pytest.mark.parametrize("where", ["root", "middle"])
async def test_graph_inserting_an_item_rebuilds_like_a_fresh_session_in_that_order(graph, where):
    spoken = speech(1.0, seed=5)
    inserted = T(3, item_id="x", text="Inserted.", insert_after=[] if where == "root" else ["u1"])
    (rebuilt,) = await converse(graph, "a", [
        T(1, item_id="u1", audio=spoken), T(2, item_id="u2", text="Later."), inserted, T(4, reply="r"),
    ])
    order = ["x", "u1", "u2"] if where == "root" else ["u1", "x", "u2"]
    items = {"u1": {"audio": spoken}, "u2": {"text": "Later."}, "x": {"text": "Inserted."}}
    (fresh,) = await converse(graph, "b", [T(i + 1, item_id=key, **items[key]) for i, key in enumerate(order)]
                              + [T(4, reply="r")])
    assert_same_reply(rebuilt, fresh)
