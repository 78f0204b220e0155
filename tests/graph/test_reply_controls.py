"""The one rule by which every node (thinker, talker, code2wav) matches a control to a reply."""

from graph.messages import CreateResponse, DeleteItem, Interrupt, ReplyParams, TextDelta, Truncate
from graph.session import belongs_to


def test_a_control_that_names_a_response_matches_that_response_only_even_within_its_turn():
    cancel = Interrupt(turn_id=5, response_id="resp_a")
    assert cancel.names(5, "resp_a")
    assert not cancel.names(5, "resp_b")  # another reply of the same turn plays on
    assert not cancel.names(6, "resp_b")


def test_a_control_without_a_response_matches_every_reply_of_its_turn():
    cancel = Interrupt(turn_id=5)
    assert cancel.names(5, "resp_a") and cancel.names(5, "resp_b")
    assert not cancel.names(6, "resp_a")


def test_a_control_naming_neither_matches_every_reply():
    assert Interrupt().names(9, "resp_a") and Truncate(audio_end_ms=100.0).names(0, "")


def test_an_interrupt_never_drops_a_queued_command_even_one_naming_its_reply():
    cancel = Interrupt(turn_id=5, response_id="resp_a")
    # The dialog must still see the request (to refuse it: graph/replies.py), and a deletion
    # must still reach the model.
    assert not belongs_to(CreateResponse(reply=ReplyParams(response_id="resp_a"), turn_id=5), cancel)
    assert not belongs_to(DeleteItem(item_id="item_a", response_id="resp_a"), cancel)
    assert belongs_to(TextDelta(response_id="resp_a", text="hi"), cancel)
