"""Talker decode steps on the shared slot cache: a reply holds a row only while it decodes."""

from __future__ import annotations

from nodes.qwen3_omni.talker_engine import TalkerLimits, step_replies
from nodes.qwen3_omni.talker_slots import TalkerSlots
from tests.model.test_talker import model, new_reply, prompt_ids, talker  # noqa: F401 - fixtures


def test_a_reply_decodes_in_a_row_that_it_gives_back_when_it_ends(talker, prompt_ids):  # noqa: F811
    slots = TalkerSlots.for_model(talker)
    ending = new_reply(talker, prompt_ids, limits=TalkerLimits(max_frames=3))
    cancelled = new_reply(talker, prompt_ids)
    for reply in (ending, cancelled):
        reply.add_text([104, 105, 106, 107], final=True)
    in_use = slots.cache.rows_in_use

    step_replies([ending])  # prefills, each alone: no row yet (prefills together: test_talker.py)
    step_replies([cancelled])
    assert ending.slot is None and cancelled.slot is None
    prefill_length = ending.prefill_cache.get_seq_length()
    step_replies([ending, cancelled])  # first decode step: both join, one forward for both
    assert slots.cache.rows_in_use == in_use + 2
    assert slots.cache.length(ending.slot) == prefill_length + 1
    assert ending.prefill_cache.get_seq_length() == prefill_length  # what the history keeps is the prefill's KV

    cancelled.cancel()
    results = step_replies([ending, cancelled])
    assert results[1] is None and cancelled.slot is None
    while step_replies([ending])[0] is not None:
        pass
    assert ending.finish_reason == "frame_limit" and ending.slot is None
    assert slots.cache.rows_in_use == in_use
