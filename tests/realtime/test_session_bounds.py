"""What a realtime session keeps for the client is bounded by `limits`, not by its length:
past `max_conversation_items` the oldest items leave the conversation (the client is told with
`conversation.item.deleted`), and resume snapshots hold only what the conversation holds."""

from __future__ import annotations

import json

from graph.limits import SessionLimits
from session_server.realtime.protocol import RealtimeProtocol, SendEvent
from session_server.realtime.session_config import ServedModel
from session_server.realtime.snapshot import snapshot_of


def opened(bound: int) -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x", served=ServedModel(model="model-x", max_conversation_items=bound))
    protocol.open()
    return protocol


def add_text(protocol: RealtimeProtocol, text: str) -> list[dict]:
    event = {"type": "conversation.item.create",
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
    return [a.event for a in protocol.receive_text(json.dumps(event)) if isinstance(a, SendEvent)]


def test_the_default_bound_is_1024_items():
    assert SessionLimits().max_conversation_items == 1024
    assert ServedModel(model="m").max_conversation_items == 1024


def test_past_the_bound_the_oldest_item_leaves_the_conversation_and_the_client_is_told():
    protocol = opened(3)
    added = [next(e for e in add_text(protocol, f"item {n}") if e["type"] == "conversation.item.added")["item"]["id"]
             for n in range(3)]
    events = add_text(protocol, "item 3")
    deleted = [e["item_id"] for e in events if e["type"] == "conversation.item.deleted"]
    assert deleted == [added[0]]
    assert list(protocol.items) == [*added[1:], next(e for e in events if e["type"] == "conversation.item.added")["item"]["id"]]
    retrieve = json.dumps({"type": "conversation.item.retrieve", "item_id": added[0]})
    (error,) = [a.event["error"] for a in protocol.receive_text(retrieve) if isinstance(a, SendEvent) and a.event["type"] == "error"]
    assert error["code"] == "item_not_found"


def test_a_long_session_snapshot_holds_at_most_the_bound():
    protocol = opened(8)
    for n in range(50):
        add_text(protocol, f"item {n}")
    snapshot = snapshot_of(protocol, "token")
    assert len(snapshot["items"]) == 8
    assert [item["content"][0]["text"] for item in snapshot["items"]] == [f"item {n}" for n in range(42, 50)]


def test_the_turns_a_session_remembers_are_bounded_too():
    protocol = opened(4)
    for turn in range(20):
        protocol._by_turn[turn] = f"resp_{turn}"
        add_text(protocol, f"item {turn}")
    assert list(protocol._by_turn) == [16, 17, 18, 19]
