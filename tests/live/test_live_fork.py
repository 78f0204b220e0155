"""Forks of Live sessions with the `openai` SDK's own `client.live.forks.connect`, unchanged: a new
session seeded with the source's conversation (session_server/realtime/live_fork.py)."""

from __future__ import annotations

import httpx
import websockets

from tests.conftest import running_server
from tests.live.fakes import live_profile
from tests.live.test_live_sdk import live_client, said, start, until
from tests.realtime.client import API_KEY, RawClient


def turns_by_session(srv) -> dict[str, list]:
    return srv.runtime.nodes["reply"].turns


async def test_a_fork_holds_the_source_conversation_and_goes_on_from_it_while_the_source_is_unaffected():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        client = live_client(srv)
        async with client.live.connect() as source:
            started = await start(source, instructions="Be brief.")
            source_id = started.session.id
            await source.session.commentary.append(content="Greet the user.", delegation_id=None)
            first = await until(source, "session.usage.updated")
            async with client.live.forks.connect(session_id=source_id) as fork:
                await fork.session.start(session={"audio": {"format": {"type": "audio/pcm", "rate": 16000}}},
                                         event_id="fork_1")
                forked = (await until(fork, "session.started"))[-1]
                await fork.session.commentary.append(content="Say goodbye.", delegation_id=None)
                fork_reply = await until(fork, "session.usage.updated")
                await fork.session.close()
                await until(fork, "session.closed")
            await source.session.commentary.append(content="Tell me more.", delegation_id=None)
            source_reply = await until(source, "session.usage.updated")
            turns = turns_by_session(srv)
            source_turns, fork_turns = list(turns[source_id]), list(turns[forked.session.id])

    assert said(first) == "word0 word1 word2 "
    assert forked.client_event_id == "fork_1"
    session = forked.session
    assert session.id != source_id and session.id.startswith("sess_")
    assert (session.model, session.instructions) == ("gpt-live-1", "Be brief.")  # the source's, inherited
    assert (session.audio.format.type, session.audio.format.rate) == ("audio/pcm", 16000)  # the fork's override
    assert session.sglang["forked_from"] == source_id
    # The fork's model history starts with the source's conversation (replayed), then goes on from it.
    assert [(t.role, t.text) for t in fork_turns[:2]] == [("system", "[commentary] Greet the user."),
                                                         ("assistant", "word0 word1 word2 ")]
    assert fork_turns[2].text == "[commentary] Say goodbye." and fork_turns[-1].reply is not None
    assert said(fork_reply) == "word0 word1 word2 "
    # The source never saw the fork's turn, and goes on by itself.
    assert all(t.text != "[commentary] Say goodbye." for t in source_turns)
    assert source_turns[-2].text == "[commentary] Tell me more." and said(source_reply) == "word0 word1 word2 "


async def test_a_fork_may_answer_a_delegation_its_source_left_open():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        client = live_client(srv)
        async with client.live.connect() as source:
            source_id = (await start(source)).session.id
            await source.session.commentary.append(content="The user wants the weather: delegate it.", delegation_id=None)
            delegated = (await until(source, "session.delegation.created"))[-1]
            await until(source, "session.usage.updated")
            async with client.live.forks.connect(session_id=source_id) as fork:
                await fork.session.start(session={})
                forked = (await until(fork, "session.started"))[-1]
                await fork.session.commentary.append(content="It is sunny in Paris.", delegation_id=delegated.delegation.id,
                                                   event_id="answer_1")
                answered = await until(fork, "session.usage.updated")
            fork_turns = list(turns_by_session(srv)[forked.session.id])

    assert answered[0].type == "session.commentary.appended" and answered[0].client_event_id == "answer_1"
    assert all(e.type != "error" for e in answered)
    # The source's call is in the fork's history, and the fork's answer is its output.
    (output,) = [t for t in fork_turns if t.role == "tool"]
    assert output.text == "It is sunny in Paris."


async def test_a_stored_session_can_be_forked_after_it_ended_on_another_replica_and_the_fork_is_stored_too():
    profile = live_profile()
    async with running_server(profile, api_key=API_KEY) as first, running_server(profile, api_key=API_KEY) as srv:
        srv.state.resumer.store = first.state.resumer.store  # one shared store, as Redis is
        async with live_client(first).live.connect() as source:
            started = await start(source, store=True)
            await source.session.commentary.append(content="Greet the user.", delegation_id=None)
            await until(source, "session.usage.updated")
            await source.session.close()
            await until(source, "session.closed")
        async with live_client(srv).live.forks.connect(session_id=started.session.id) as fork:
            await fork.session.start(session={})
            forked = (await until(fork, "session.started"))[-1]
            await fork.session.commentary.append(content="Say goodbye.", delegation_id=None)
            fork_reply = await until(fork, "session.usage.updated")
        fork_turns = list(turns_by_session(srv)[forked.session.id])

    assert started.session.store is True and forked.session.store is True  # inherited
    assert [(t.role, t.text) for t in fork_turns[:3]] == [("system", "[commentary] Greet the user."),
                                                         ("assistant", "word0 word1 word2 "),
                                                         ("system", "[commentary] Say goodbye.")]
    assert said(fork_reply) == "word0 word1 word2 "


async def test_forking_an_unknown_or_hung_up_session_is_session_not_found_and_bad_overrides_are_refused():
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as source:
            source_id = (await start(source)).session.id
            async with websockets.connect(f"{srv.ws_url}/v1/live/sessions/{source_id}/fork", additional_headers=headers) as ws:
                fork = RawClient(ws)
                await fork.send({"type": "session.start", "event_id": "bad", "session": {"model": "gpt-live-1.1"}})
                refused = (await fork.until("error"))[-1]["error"]
                await fork.send({"type": "session.start", "event_id": "good", "session": {}})
                started = (await fork.until("session.started"))[-1]
            await live_client(srv).live.sessions.hangup(source_id)
            hung_up = (await until(source, "session.closed"))[-1]
        async with websockets.connect(f"{srv.ws_url}/v1/live/sessions/{source_id}/fork", additional_headers=headers) as ws:
            ended = await RawClient(ws).recv()
        async with httpx.AsyncClient(base_url=srv.base_url, headers=headers) as http:
            unknown = await http.post("/v1/live/sessions/sess_unknown/fork",
                                      json={"transport": {"type": "webrtc", "sdp": "v=0\r\nm=audio 9 UDP 0\r\n"}})

    assert (refused["code"], refused["param"], refused["client_event_id"]) == ("unknown_parameter", "session.model", "bad")
    assert started["client_event_id"] == "good" and started["session"]["sglang"]["forked_from"] == source_id
    assert hung_up.reason == "close_requested"  # `POST .../hangup` ends it as `session.close` would
    assert (ended["type"], ended["error"]["code"]) == ("error", "session_not_found")
    assert unknown.status_code == 404
    assert (unknown.json()["error"]["code"], unknown.json()["error"]["param"]) == ("session_not_found", "session_id")
