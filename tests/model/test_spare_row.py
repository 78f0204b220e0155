"""A truncation built ahead in a spare row (nodes/qwen3_omni/spare_row.py): built while turns go
on in the session's own row, caught up and adopted, it leaves the session exactly as a fresh one
fed the kept items (greedy, tiny checkpoint), and as the same truncation made in place."""

from __future__ import annotations

import torch

from nodes.qwen3_omni import spare_row
from nodes.qwen3_omni.thinker_engine import ThinkerSession
from tests.model.test_history_rebuild import answer, assert_same_history, fed, speech, system, user


def started(omni) -> tuple[ThinkerSession, list[list[int]]]:
    session = ThinkerSession(omni, max_reply_tokens=6)
    session.set_system_prompt(system(omni, "You are terse."))
    replies = []
    session.prefill(user(omni, "Hello there."), key="u1")
    replies.append(answer(session, omni, "r1"))
    session.prefill(user(omni, audio=speech(1.0, seed=3)), key="u2")
    replies.append(answer(session, omni, "r2"))
    return session, replies


def built(session: ThinkerSession, count: int) -> spare_row.SpareRow:
    spare = spare_row.plan(session, count)
    assert spare is not None
    spare.take_row()
    session._runner.run_alone(spare_row.build_work(spare))
    assert spare.ready
    return spare


def test_a_spare_built_ahead_then_caught_up_equals_a_fresh_session_fed_the_kept_items(omni):
    session, (r1, r2) = started(omni)
    rows = session._runner.cache.rows_in_use
    spare = built(session, 2)  # u1 and r1 will leave
    assert session._runner.cache.rows_in_use == rows + 1
    # A turn goes on in the session's own row meanwhile: the catch-up prefills it into the spare.
    session.prefill(user(omni, "What is two and two?"), key="u3")
    r3 = answer(session, omni, "r3")
    dropped, caught_up = session._runner.run_alone(spare_row.adopt_work(spare))
    assert dropped == 2 and 0 < caught_up < session.context_length - session.instructions_length
    assert session._runner.cache.rows_in_use == rows  # the old row went back
    assert session.history.index_of("u1") is None and session.history.index_of("u2") is not None
    session.prefill(user(omni, "Thanks."), key="u4")
    r4 = answer(session, omni, "r4")
    usage = session.reply_usage()

    fresh = fed(omni, user(omni, audio=speech(1.0, seed=3)), r2, user(omni, "What is two and two?"), r3,
                user(omni, "Thanks."))
    assert answer(fresh, omni, "r4") == r4
    assert_same_history(session, fresh)
    assert usage.input_tokens == fresh.reply_usage().input_tokens
    assert usage.cached_tokens == session.instructions_length  # honest: only the instructions were kept

    # The same truncation made in place gives the same session, talker view included.
    in_place, _ = started(omni)
    in_place.prefill(user(omni, "What is two and two?"), key="u3")
    answer(in_place, omni, "r3")
    in_place._runner.run_alone(in_place.drop_oldest_work(2))
    in_place.prefill(user(omni, "Thanks."), key="u4")
    assert answer(in_place, omni, "r4") == r4
    ours, theirs = session.talker_view(), in_place.talker_view()
    assert ours.tail_ids == theirs.tail_ids and len(ours.user_parts) == len(theirs.user_parts)
    for mine, other in zip(ours.user_parts, theirs.user_parts):
        assert torch.equal(mine.token_ids, other.token_ids)
        torch.testing.assert_close(mine.multimodal_hidden, other.multimodal_hidden)
    in_place.close()
    session.close()


def test_a_plan_the_history_overtook_is_not_adopted_and_its_row_goes_back(omni):
    session, _ = started(omni)
    rows = session._runner.cache.rows_in_use
    spare = built(session, 2)
    session.delete("u2")  # the first item the plan kept
    assert session._runner.run_alone(spare_row.adopt_work(spare)) is None
    spare.give_back()
    assert session._runner.cache.rows_in_use == rows
    assert session.history.index_of("u1") is not None  # nothing left the context
    session.close()


def test_an_item_deleted_after_the_plan_is_left_out_of_the_spare_it_was_built_into(omni):
    session, (_, r2) = started(omni)
    session.prefill(user(omni, "A note."), reply=False, key="u3")  # complete: the plan builds it too
    spare = built(session, 2)
    assert [b.segment for b in spare.built][-1] is session.history.segments[-1]
    session.delete("u3")
    dropped, caught_up = session._runner.run_alone(spare_row.adopt_work(spare))
    assert dropped == 2 and caught_up == 0  # the spare was cut back to what still matches
    assert_same_history(session, fed(omni, user(omni, audio=speech(1.0, seed=3)), r2))
    session.close()
