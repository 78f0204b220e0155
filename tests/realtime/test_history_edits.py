"""Live history changes: new instructions after a turn, deleted items and items inserted anywhere
reach the model (which rebuilds its KV), with the GA events a client sees."""

from __future__ import annotations

from graph.messages import AddItem, Command, Configure, DeleteItem, TurnDone, Usage
from tests.realtime.test_protocol import (
    commit,
    events,
    graph_messages,
    kinds,
    opened,
    send,
)


def dialog_commands(actions, kind: type[Command]) -> list[Command]:
    return [m for m in graph_messages(actions) if isinstance(m, kind) and m.target == "dialog"]


def text_item(item_id: str, text: str = "hi", role: str = "user") -> dict:
    kind = "input_text" if role == "user" else "output_text"
    return {"type": "message", "id": item_id, "role": role, "content": [{"type": kind, "text": text}]}


def conversation_with_a_reply():
    """A user utterance answered by a reply: items [user, assistant]."""
    protocol = opened()
    commit(protocol, "item_user", 1)
    (response_id,) = protocol.responses
    protocol.graph_output(TurnDone(response_id=response_id, usage=Usage()))
    assert not protocol.responses
    return protocol, response_id


def test_instructions_change_after_a_turn_is_accepted():
    protocol, _ = conversation_with_a_reply()
    actions = send(protocol, type="session.update", session={"type": "realtime", "instructions": "Be long."})
    assert kinds(actions) == ["session.updated"]
    assert events(actions)[0]["session"]["instructions"] == "Be long."
    (configure,) = dialog_commands(actions, Configure)
    assert configure.config["instructions"] == "Be long."


def test_deleting_items_tells_the_model_which_turn_to_forget():
    protocol, response_id = conversation_with_a_reply()
    user, assistant = list(protocol.items)
    actions = send(protocol, type="conversation.item.delete", item_id=assistant)
    assert [(e["type"], e["item_id"]) for e in events(actions)] == [("conversation.item.deleted", assistant)]
    (delete,) = dialog_commands(actions, DeleteItem)
    assert (delete.item_id, delete.response_id) == (assistant, response_id)  # a reply is known by its response id
    (delete,) = dialog_commands(send(protocol, type="conversation.item.delete", item_id=user), DeleteItem)
    assert (delete.item_id, delete.response_id) == (user, None)
    assert protocol.items == {}


def test_an_item_created_after_root_goes_first_and_the_model_inserts_it_at_the_start():
    protocol, _ = conversation_with_a_reply()
    before = list(protocol.items)
    actions = send(protocol, type="conversation.item.create", previous_item_id="root", item=text_item("item_new"))
    added = [e for e in events(actions) if e["type"] == "conversation.item.added"]
    assert [(e["item"]["id"], e["previous_item_id"]) for e in added] == [("item_new", None)]
    assert list(protocol.items) == ["item_new", *before]
    (add,) = dialog_commands(actions, AddItem)
    assert add.insert_after == []  # none of the items before it: the very start


def test_an_item_created_in_the_middle_names_the_items_before_it_nearest_first():
    protocol, response_id = conversation_with_a_reply()
    user, assistant = list(protocol.items)
    send(protocol, type="conversation.item.create", item=text_item("item_c", "later"))
    actions = send(protocol, type="conversation.item.create", previous_item_id=assistant, item=text_item("item_mid"))
    added = next(e for e in events(actions) if e["type"] == "conversation.item.added")
    assert added["previous_item_id"] == assistant
    assert list(protocol.items) == [user, assistant, "item_mid", "item_c"]
    (add,) = dialog_commands(actions, AddItem)
    assert add.insert_after == [response_id, user]
    # The next item without previous_item_id goes at the end again, linked to the last one.
    actions = send(protocol, type="conversation.item.create", item=text_item("item_end"))
    assert next(e for e in events(actions) if e["type"] == "conversation.item.added")["previous_item_id"] == "item_c"


def test_previous_item_id_naming_the_last_item_or_null_appends_without_a_rebuild():
    protocol, _ = conversation_with_a_reply()
    last = list(protocol.items)[-1]
    for previous in (last, None):
        item_id = f"item_{previous is None}"
        actions = send(protocol, type="conversation.item.create", previous_item_id=previous, item=text_item(item_id))
        (add,) = dialog_commands(actions, AddItem)
        assert add.insert_after is None
        assert list(protocol.items)[-1] == item_id


def test_an_unknown_previous_item_id_is_item_not_found_and_the_session_goes_on():
    protocol, _ = conversation_with_a_reply()
    before = list(protocol.items)
    actions = send(protocol, type="conversation.item.create", previous_item_id="item_nope", item=text_item("item_x"))
    (error,) = events(actions)
    assert (error["type"], error["error"]["code"], error["error"]["param"]) == ("error", "item_not_found", "previous_item_id")
    assert list(protocol.items) == before and not dialog_commands(actions, AddItem)
    assert kinds(send(protocol, type="conversation.item.create", item=text_item("item_y")))[0] == "conversation.item.added"


# ---------------------------------------------------------------------------- the served default model


async def test_the_default_model_follows_instruction_changes_deletes_and_root_inserts_with_honest_caching():
    from configs import load_profile
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from tests.conftest import running_server
    from tests.realtime.client import API_KEY, sdk_client, until

    def user(text):
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    async def reply(conn):
        await conn.response.create()
        events = await until(conn, "response.done", timeout=120)
        assert all(e.type != "error" for e in events)
        done = events[-1].response
        assert done.status in ("completed", "incomplete")
        return done.usage.input_token_details.cached_tokens

    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        omni = srv.runtime.resources["omni"]
        brief = build_turn_inputs(omni, system_prompt="Be brief.").input_ids
        long = build_turn_inputs(omni, system_prompt="Be long.").input_ids
        shared = next(i for i, (a, b) in enumerate(zip(brief, long)) if a != b)
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]})
            await until(conn, "session.updated")
            await conn.conversation.item.create(item=user("Hello."))
            first_item = (await until(conn, "conversation.item.added"))[-1].item.id
            assert await reply(conn) == 0

            await conn.session.update(session={"type": "realtime", "instructions": "Be long."})
            updated = await until(conn, "session.updated")
            assert [e.type for e in updated] == ["session.updated"] and updated[-1].session.instructions == "Be long."
            await conn.conversation.item.create(item=user("And then?"))
            # The new system prompt replaced the old one: only their shared opening was reused.
            assert await reply(conn) == shared

            await conn.conversation.item.delete(item_id=first_item)
            assert (await until(conn, "conversation.item.deleted"))[-1].item_id == first_item
            await conn.conversation.item.create(item=user("First of all."), previous_item_id="root")
            added = (await until(conn, "conversation.item.added"))[-1]
            assert added.previous_item_id is None
            # Rebuilt from right after the system prompt (the deleted item, then the insert, sat there).
            assert await reply(conn) == len(long)
