"""A truncation drops the oldest items from a thinker session's context and rebuilds its KV once;
the next reply is the one a fresh session fed the remaining items gives (greedy, tiny checkpoint),
with `cached_tokens` counting only the instructions that were kept."""

from __future__ import annotations

import torch

from graph.messages import Truncation
from nodes.qwen3_omni.thinker_engine import ThinkerSession
from tests.model.test_history_rebuild import answer, assert_same_history, conversation, fed, system, user

AUTO = Truncation(type="auto")


def test_the_oldest_items_leave_and_the_next_reply_equals_a_fresh_sessions(omni):
    rebuilt = ThinkerSession(omni, max_reply_tokens=6)
    r1, r2 = conversation(omni, rebuilt)
    instructions = rebuilt.history.segments[1].start
    third = user(omni, "Thanks, and what about three?")
    incoming = len(third["input_ids"]) + rebuilt.reply_reserve()
    # A context that holds the conversation but not the next turn on top of it.
    rebuilt.max_seq_len = rebuilt.context_length + incoming - 1
    assert rebuilt.truncation_plan(Truncation(type="disabled"), incoming) == 0
    # The three newest stay (as a reply's items do), so `auto` cannot fit the turn twice over:
    # it fits it once, and u1 alone frees enough.
    count = rebuilt.truncation_plan(AUTO, incoming, keep_last=3)
    assert count == 1
    kept_segments = rebuilt.context_length - rebuilt.history.segments[2].start
    assert rebuilt._runner.run_alone(rebuilt.drop_oldest_work(count)) == kept_segments
    assert rebuilt.history.index_of("u1") is None and rebuilt.history.index_of("r1") is not None
    rebuilt.prefill(third, key="u3")
    r3 = answer(rebuilt, omni, "r3")
    usage = rebuilt.reply_usage()

    fresh = fed(omni, r1, user(omni, "What is two and two?"), r2, user(omni, "Thanks, and what about three?"))
    assert answer(fresh, omni, "r3") == r3
    assert_same_history(rebuilt, fresh)
    # Honest usage: the same input as the fresh session's; only the instructions came from the cache.
    assert usage.input_tokens == fresh.reply_usage().input_tokens
    assert usage.cached_tokens == instructions
    # The turn after it (with room again) appends to the rebuilt context and reuses all of it, as
    # the fresh one does.
    rebuilt.max_seq_len = fresh.max_seq_len
    rebuilt.prefill(user(omni, "Bye."), key="u4")
    fresh.prefill(user(omni, "Bye."))
    assert answer(rebuilt, omni, "r4") == answer(fresh, omni, "r4")
    assert rebuilt.reply_usage().cached_tokens == fresh.reply_usage().cached_tokens


def test_a_function_output_leaves_the_context_with_its_call(omni):
    session = ThinkerSession(omni, max_reply_tokens=6)
    session.set_system_prompt(system(omni, "You are terse."))
    call = {"input_ids": torch.tensor(build_call_ids(omni))}
    session.prefill(call, reply=False, key="call1")
    session.prefill(user(omni, "It is sunny."), reply=False, key="out1", function_output=True)
    session.prefill(user(omni, "Thanks."), key="u2")
    answer(session, omni, "r2")
    call_tokens = session.history.segments[2].start - session.history.segments[1].start
    # Dropping the call alone would make room, but its output must go with it.
    session.max_seq_len = session.context_length + 40 - call_tokens + 1
    assert session.truncation_plan(AUTO, 40) == 2
    session._runner.run_alone(session.drop_oldest_work(2))
    assert session.history.index_of("call1") is None and session.history.index_of("out1") is None
    assert session.history.index_of("u2") is not None


def build_call_ids(omni) -> list[int]:
    from nodes.qwen3_omni.inputs import tool_call_text

    tokens = omni.tokens
    text = tool_call_text("get_weather", '{"city": "Paris"}')
    return [*tokens.assistant_header, *omni.tokenizer(text, add_special_tokens=False).input_ids, *tokens.closing]


def test_what_a_session_keeps_for_rebuilds_is_bounded_by_its_context(omni):
    """Twelve spoken turns through a context that holds about four: the history's segments, and
    the encoder outputs kept with them, are those of the turns still in the context."""
    from tests.model.test_history_rebuild import speech

    session = ThinkerSession(omni, max_reply_tokens=6, max_seq_len=200)
    session.set_system_prompt(system(omni, "You are terse."))
    segments = []
    for n in range(12):
        spoken = user(omni, audio=speech(1.0, seed=n))
        incoming = len(spoken["input_ids"]) + session.reply_reserve()
        session._runner.run_alone(session.drop_oldest_work(session.truncation_plan(AUTO, incoming)))
        session.prefill(spoken, reply=False, key=f"u{n}")
        answer(session, omni, f"r{n}")
        assert session.context_length <= session.max_seq_len
        kept_audio = sum(s.media["audio_embeds"].shape[0] for s in session.history.segments if "audio_embeds" in s.media)
        assert kept_audio == session.audio_tokens_in_context
        segments.append(len(session.history))
    assert session.history.index_of("u0") is None
    # Once the context is full the history stops growing: it is not one segment per turn spoken
    # (25 by the end). It swings by a turn's two segments as `auto` frees room for two turns.
    assert max(segments[6:]) <= max(segments[:6]) + 2 < 1 + 2 * 12
