"""`session.truncation` on the tiny model with a small context: `auto` and `retention_ratio` keep a
long conversation going by dropping its oldest items from the model's context (never from the
client's conversation), `disabled` ends its turns with `context_exhausted`, and `session.updated`
echoes the mode asked for."""

from __future__ import annotations

import httpx
import pytest

from configs import load_profile
from tests.conftest import running_server
from tests.realtime.client import API_KEY, sdk_client, until

CONTEXT = 160


def small_context_profile(context: int = CONTEXT) -> dict:
    profile = load_profile(None)
    profile["resources"]["omni"]["params"]["max_seq_len"] = context
    return profile


async def text_turn(conn, text: str):
    await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()
    return (await until(conn, "response.done", timeout=120))[-1].response


async def scrape(srv) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(srv.base_url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})).text


def node_event(text: str, event: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith("sgl_omni_node_events_total") and f'event="{event}"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


async def truncations(srv) -> float:
    return node_event(await scrape(srv), "truncations")


@pytest.mark.parametrize("mode", ["auto", {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 120}}])
async def test_a_conversation_longer_than_the_context_goes_on_and_the_client_keeps_every_item(mode):
    async with running_server(small_context_profile(), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "truncation": mode,
                                               "instructions": "You are terse."})
            updated = (await until(conn, "session.updated", timeout=30))[-1]
            echoed = updated.session.truncation
            assert (echoed if isinstance(echoed, str) else echoed.model_dump(exclude_none=True)) == mode
            first = await text_turn(conn, "Hello there, how are you today?")
            done = [first] + [await text_turn(conn, f"Question number {n}: what do you think?") for n in range(7)]
            assert [d.status for d in done] == ["completed"] * len(done)
            assert all(d.usage.input_tokens <= CONTEXT for d in done)
            # What a reply answers never leaves for it: every reply sees at least what the first
            # saw (the instructions, its question, its header), however tight the mode.
            assert all(d.usage.input_tokens >= first.usage.input_tokens for d in done)
            # One scrape: a truncation right after a reply may land between two.
            text = await scrape(srv)
            assert node_event(text, "truncations") >= 1
            assert metric(text, "sgl_omni_context_truncations_total") == node_event(text, "truncations")
            assert metric(text, "sgl_omni_truncation_rebuild_seconds_total") > 0
            # The items that left the model's context are still the client's.
            item_id = first.output[0].id
            await conn.conversation.item.retrieve(item_id=item_id)
            retrieved = (await until(conn, "conversation.item.retrieved", timeout=30))[-1]
            assert retrieved.item.id == item_id
    # Each reply after the first reuses the cache it honestly can: never more than its input.
    assert all(0 <= d.usage.input_token_details.cached_tokens < d.usage.input_tokens for d in done)


async def test_disabled_truncation_ends_turns_with_context_exhausted():
    async with running_server(small_context_profile(), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "truncation": "disabled"})
            assert (await until(conn, "session.updated", timeout=30))[-1].session.truncation == "disabled"
            done = [await text_turn(conn, f"Question number {n}: what do you think?") for n in range(8)]
    assert done[0].status == "completed"
    assert "context_exhausted" in [exhausted_code(d) for d in done]


def exhausted_code(response) -> str | None:
    details = response.status_details
    if details is None:
        return None
    return details.reason or (details.error.code if details.error else None)



async def test_auto_drops_only_the_oldest_items_the_next_turn_needs_room_for():
    """A truncation frees room for the turn it is made for, not the conversation: after a long
    turn made room for itself, the short turns that follow (whose replies honestly report only
    the instructions as cached, the rest having been re-prefilled) keep the context nearly full."""
    context = 1024
    async with running_server(small_context_profile(context), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "truncation": "auto",
                                               "instructions": "You are terse."})
            await until(conn, "session.updated", timeout=30)
            done = [await text_turn(conn, "Question number 0: what do you think?")]
            while done[-1].usage.input_tokens < context - 300:  # room for the long turn, not for its next
                done.append(await text_turn(conn, f"Question number {len(done)}: what do you think?"))
            assert await truncations(srv) == 0
            done.append(await text_turn(conn, "Now listen carefully. " + "This is a long story, " * 8))
            after = [await text_turn(conn, f"Question number {n}: what do you think?") for n in range(4)]
            assert await truncations(srv) >= 1
    assert [d.status for d in done + after] == ["completed"] * len(done + after)
    assert all(d.usage.input_token_details.cached_tokens < d.usage.input_tokens for d in after)
    assert min(d.usage.input_tokens for d in after) >= context // 2, [d.usage.input_tokens for d in after]
