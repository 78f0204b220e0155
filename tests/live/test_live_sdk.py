"""OpenAI's Live API with the `openai` SDK's own client (`client.live.connect`), unchanged, against
a live server on 127.0.0.1: the dialect of session_server/realtime/live_dialect.py end to end."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from openai import AsyncOpenAI

from configs import load_profile
from tests.conftest import running_server
from tests.live.fakes import TASK, live_profile
from tests.realtime.client import API_KEY, b64, until, until_all, utterance
from tests.realtime.speech import pcm16, silence

LIVE_OUT = ("session.output_transcript.delta", "session.output_audio.delta")


def live_client(srv) -> AsyncOpenAI:
    # The SDK builds wss:// from base_url; a plain-HTTP test server needs the ws:// base named.
    return AsyncOpenAI(base_url=srv.base_url + "/v1", websocket_base_url=srv.ws_url + "/v1", api_key=API_KEY)


async def start(conn, **session: Any) -> Any:
    await conn.send({"type": "session.start", "event_id": "start_1", "session": {"model": "gpt-live-1", **session}})
    return (await until(conn, "session.started"))[-1]


async def speak(conn, samples: np.ndarray, chunk_s: float = 0.1, rate: int = 24000) -> None:
    step = int(rate * chunk_s)
    for begin in range(0, len(samples), step):
        await conn.send({"type": "session.input_audio.append", "audio": b64(pcm16(samples[begin:begin + step]))})


def said(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "session.output_transcript.delta")


def audio_bytes(events: list[Any]) -> int:
    return sum(len(base64.b64decode(e.delta)) for e in events if e.type == "session.output_audio.delta")


def turns_of(srv) -> list:
    (turns,) = srv.runtime.nodes["reply"].turns.values()
    return turns


async def test_session_start_is_answered_by_session_started_with_the_resolved_session():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            started = await start(conn, instructions="Be brief.", audio={"format": {"type": "audio/pcm", "rate": 16000}})

    assert started.client_event_id == "start_1"
    session = started.session
    assert (session.model, session.status, session.instructions) == ("gpt-live-1", "active", "Be brief.")
    assert session.id.startswith("sess_")
    assert (session.audio.format.type, session.audio.format.rate) == ("audio/pcm", 16000)
    assert session.delegation.type == "client"
    assert session.sglang == {"served_model": "test-realtime"}  # gpt-live-1 is answered by the served model


async def test_startup_input_is_the_conversation_the_model_starts_from():
    history = [{"role": "developer", "content": [{"type": "input_text", "text": "The user is Ada."}]},
               {"role": "user", "content": [{"type": "input_text", "text": "I live in Paris."}]},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]}]
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            started = await start(conn, input=history)
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None)
            await until(conn, "session.usage.updated")
            turns = turns_of(srv)

    assert [item.role for item in started.session.input] == ["developer", "user", "assistant"]
    assert [(t.role, t.text) for t in turns[:3]] == [("system", "The user is Ada."), ("user", "I live in Paris."),
                                                     ("assistant", "Noted.")]


async def test_a_typed_turn_is_commentary_the_model_speaks_with_its_transcript():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None, event_id="typed_1")
            events = await until(conn, "session.usage.updated")
            turns = turns_of(srv)

    assert events[0].type == "session.commentary.appended" and events[0].client_event_id == "typed_1"
    assert said(events) == "word0 word1 word2 "
    assert audio_bytes(events) == 3 * 2400 * 2  # three 100 ms chunks of 24 kHz PCM16
    assert {e.type for e in events} <= {"session.commentary.appended", *LIVE_OUT, "session.usage.updated"}
    assert turns[0].role == "system" and turns[0].text == "[commentary] Greet the user."
    assert turns[-1].reply is not None


async def test_a_spoken_turn_on_the_default_graph_has_transcripts_both_ways():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await speak(conn, utterance())
            events = await until_all(conn, "session.usage.updated", "session.input_transcript.delta")

    heard = [e for e in events if e.type == "session.input_transcript.delta"]
    assert heard and all(e.start_ms <= e.end_ms for e in heard)
    assert said(events)  # the tiny checkpoint's words mean nothing; that they come does
    assert audio_bytes(events) > 0


async def test_instructions_appended_mid_session_reach_the_model_and_ask_no_reply():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn, instructions="Be brief.")
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None)
            await until(conn, "session.usage.updated")
            await conn.session.instructions.append(content="From now on, answer in French.", delegation_id=None, event_id="ins_1")
            await conn.session.commentary.append(content="Say goodbye.", delegation_id=None)
            events = await until(conn, "session.usage.updated")
            turns = turns_of(srv)

    assert [e.type for e in events[:2]] == ["session.instructions.appended", "session.commentary.appended"]
    assert events[0].client_event_id == "ins_1"
    system = [t.text for t in turns if t.role == "system"]
    assert system == ["[commentary] Greet the user.", "From now on, answer in French.", "[commentary] Say goodbye."]
    assert sum(1 for t in turns if t.reply is not None) == 2  # one reply per commentary, none for the instructions


async def delegation(conn, ask: str) -> Any:
    """Start the session and ask for a delegation; the `session.delegation.created`, once the
    turn that made it is over."""
    await start(conn)
    await conn.session.commentary.append(content=ask, delegation_id=None)
    delegated = (await until(conn, "session.delegation.created"))[-1]
    await until(conn, "session.usage.updated")
    return delegated


async def test_a_client_delegation_round_trip_the_model_goes_on_from_the_answer():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            delegated = await delegation(conn, "The user wants the weather: delegate it.")
            await conn.session.commentary.append(content="It is sunny in Paris.", delegation_id=delegated.delegation.id,
                                                 event_id="answer_1")
            answered = await until(conn, "session.usage.updated")
            turns = turns_of(srv)

    assert (delegated.delegation.target, delegated.delegation.type) == ("client", "delegation")
    assert delegated.sglang["task"] == TASK
    assert delegated.offset_ms >= 0
    assert answered[0].type == "session.commentary.appended" and answered[0].client_event_id == "answer_1"
    assert said(answered) == "It is sunny in Paris."
    (output,) = [t for t in turns if t.role == "tool"]
    assert output.text == "It is sunny in Paris."


async def test_thinking_for_a_delegation_is_its_answer_too():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            delegated = await delegation(conn, "Please delegate this.")
            await conn.session.thinking.append(content="Found: 21 degrees.", delegation_id=delegated.delegation.id)
            answered = await until(conn, "session.usage.updated")

    assert answered[0].type == "session.thinking.appended"
    assert said(answered) == "Found: 21 degrees."


async def test_silent_thinking_adds_context_and_asks_no_reply():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await conn.session.thinking.append(content="The user is in Paris.", delegation_id=None)
            await until(conn, "session.thinking.appended")
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None)
            await until(conn, "session.usage.updated")
            turns = turns_of(srv)

    assert [(t.text, t.reply is not None) for t in turns] == [
        ("[thinking] The user is in Paris.", False), ("[commentary] Greet the user.", False), (None, True)]


async def test_muted_input_is_silence_to_the_model_and_unmuting_brings_turns_back():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await conn.session.input_audio.mute(event_id="mute_1")
            muted = (await until(conn, "session.input_audio.muted"))[-1]
            await speak(conn, utterance())
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None)
            await until(conn, "session.usage.updated")
            heard_while_muted = [t for t in turns_of(srv) if t.audio is not None]
            await conn.session.input_audio.unmute()
            await until(conn, "session.input_audio.unmuted")
            await speak(conn, utterance())
            await until(conn, "session.usage.updated")
            heard = [t for t in turns_of(srv) if t.audio is not None]

    assert muted.client_event_id == "mute_1"
    assert heard_while_muted == []  # the VAD heard silence: no turn, though the typed one came after it
    assert len(heard) == 1


async def test_session_close_ends_with_session_closed_close_requested_and_the_usage():
    async with running_server(live_profile(), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await conn.session.close(event_id="bye")
            closed = (await until(conn, "session.closed"))[-1]

    assert closed.reason == "close_requested"
    assert closed.session.model == "gpt-live-1"
    assert closed.usage.seconds >= 0


async def test_speech_over_a_reply_interrupts_it():
    async with running_server(live_profile(words=40, delay_s=0.05), api_key=API_KEY) as srv:
        async with live_client(srv).live.connect() as conn:
            await start(conn)
            await conn.session.commentary.append(content="Tell a long story.", delegation_id=None)
            await until(conn, "session.output_audio.delta")
            await speak(conn, np.concatenate([utterance(tail_s=0.1), silence(1.0)]))
            events = await until(conn, "session.usage.updated")
            controls = srv.runtime.nodes["reply"].controls

    assert len(said(events).split()) < 40  # the story stopped at the barge-in
    assert any(type(c).__name__ == "Interrupt" for cs in controls.values() for c in cs)
