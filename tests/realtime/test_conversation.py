"""Spoken conversations driven by the official `openai` SDK realtime client, unchanged."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from graph.messages import Interrupt, Truncate
from tests.conftest import running_server
from tests.realtime.client import API_KEY, MODEL, append_pcm, b64, sdk_client, until, utterance
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16

GA_TURN_ORDER = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta")


def server(**kwargs):
    return running_server(realtime_profile(**kwargs), api_key=API_KEY)


async def test_a_spoken_turn_with_server_vad_gets_a_spoken_reply_in_ga_order():
    async with server(reply={"words": 3, "chunk_ms": 100}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            assert created.session.audio.input.turn_detection.type == "server_vad"
            await append_pcm(conn, utterance())
            events = await until(conn, "response.done")

    assert [e.type for e in events if e.type not in DELTAS] == GA_TURN_ORDER
    assert all(e.event_id for e in events)
    started, stopped, committed = events[0], events[1], events[2]
    assert started.item_id == stopped.item_id == committed.item_id
    assert 0 <= started.audio_start_ms < stopped.audio_end_ms
    assert committed.previous_item_id is None
    done = events[-1].response
    assert done.status == "completed"
    assert done.output[0].content[0].transcript == "word0 word1 word2 "
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) == 3 * 2400 * 2  # three 100 ms chunks of 24 kHz PCM16
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert transcript == "word0 word1 word2 "
    usage = done.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_token_details.audio_tokens > 0
    # The model heard the utterance as 16 kHz audio: speech plus prefix padding and the silence tail.
    turn = srv.runtime.nodes["reply"].turns
    heard = next(t for turns in turn.values() for t in turns if t.audio is not None)
    assert 2.0 < len(heard.audio) / 16000 < 4.0


async def test_two_turns_in_one_session_and_the_second_reuses_the_cached_prefix():
    async with server() as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await append_pcm(conn, utterance())
            first = (await until(conn, "response.done"))[-1].response
            await append_pcm(conn, utterance("And tomorrow?"))
            events = await until(conn, "response.done")
    second = events[-1].response
    assert first.usage.input_token_details.cached_tokens == 0
    assert second.usage.input_token_details.cached_tokens > 0
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    # previous_item_id links the second utterance after the first reply.
    assert committed.previous_item_id == first.output[0].id


async def test_manual_commit_mode_answers_only_when_asked():
    async with server() as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            updated = (await until(conn, "session.updated"))[-1]
            assert updated.session.audio.input.turn_detection is None
            await append_pcm(conn, utterance())
            await conn.input_audio_buffer.commit()
            events = await until(conn, "conversation.item.done")
            assert [e.type for e in events] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
            await conn.response.create()
            reply = await until(conn, "response.done")
    assert reply[0].type == "response.created"
    assert reply[-1].response.status == "completed"


async def test_speech_during_a_reply_cancels_it():
    async with server(reply={"words": 200, "chunk_ms": 40, "delay_s": 0.02}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await append_pcm(conn, utterance())
            await until(conn, "response.output_audio.delta")
            await append_pcm(conn, utterance("Stop, please."))
            events = await until(conn, "response.done")
            done = events[-1].response
            assert done.status == "cancelled"
            assert done.status_details.reason == "turn_detected"
            assert done.output[0].status == "incomplete"
            # The barge-in utterance becomes the next turn, with its own reply.
            after = await until(conn, "response.done")
    speech_started = [i for i, e in enumerate(events) if e.type == "input_audio_buffer.speech_started"]
    assert speech_started and speech_started[0] < len(events) - 1
    # Nothing of the cancelled reply arrives after its response.done.
    assert all(getattr(e, "response_id", None) != done.id for e in after)
    assert after[-1].response.status == "completed"
    controls = next(iter(srv.runtime.nodes["reply"].controls.values()))
    assert any(isinstance(c, Interrupt) and c.response_id == done.id for c in controls)


async def test_truncate_trims_the_assistant_item_to_what_was_heard():
    async with server(reply={"words": 3, "chunk_ms": 100}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await append_pcm(conn, utterance())
            done = (await until(conn, "response.done"))[-1].response
            item_id = done.output[0].id
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=150)
            truncated = (await until(conn, "conversation.item.truncated"))[-1]
            assert (truncated.item_id, truncated.audio_end_ms) == (item_id, 150)
            await conn.conversation.item.retrieve(item_id=item_id)
            item = (await until(conn, "conversation.item.retrieved"))[-1].item
            assert item.content[0].transcript == ""
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=5000)
            error = (await until(conn, "error"))[-1].error
            assert (error.code, error.param) == ("invalid_value", "audio_end_ms")
    controls = next(iter(srv.runtime.nodes["reply"].controls.values()))
    truncates = [c for c in controls if isinstance(c, Truncate)]
    assert [(c.response_id, c.item_id, c.audio_end_ms) for c in truncates] == [(done.id, item_id, 150.0)]


async def test_text_only_output_uses_output_text_events():
    async with server(reply={"words": 2}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await until(conn, "session.updated")
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}
            )
            await conn.response.create()
            events = await until(conn, "response.done")
    kinds = [e.type for e in events]
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert not any(k.startswith("response.output_audio") for k in kinds)
    text_done = next(e for e in events if e.type == "response.output_text.done")
    assert text_done.text == "word0 word1 "
    assert events[-1].response.output[0].content[0].type == "output_text"


async def test_an_image_and_audio_turn_carries_the_frame_that_fell_in_the_utterance():
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, format="PNG")
    async with server() as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.send_raw('{"type": "sglang.input_image.append", "image": "%s", "sglang": {"t_ms": 1000}}' % b64(png.getvalue()))
            accepted = (await until(conn, "sglang.input_image.accepted"))[-1]
            assert accepted.t_ms == 1000
            await append_pcm(conn, utterance())
            events = await until(conn, "response.done")
    committed_item = next(e for e in events if e.type == "conversation.item.added").item
    assert [c.type for c in committed_item.content] == ["input_audio", "input_image"]
    turns = next(iter(srv.runtime.nodes["reply"].turns.values()))
    heard = next(t for t in turns if t.audio is not None)
    assert heard.images == [png.getvalue()]
    assert events[-1].response.usage.input_token_details.image_tokens > 0


async def test_out_of_band_response_leaves_the_conversation_alone():
    async with server(reply={"words": 2}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.response.create(response={"conversation": "none", "output_modalities": ["text"], "metadata": {"topic": "x"}})
            events = await until(conn, "response.done")
    assert "conversation.item.added" not in [e.type for e in events]
    done = events[-1].response
    assert done.conversation_id is None and done.metadata == {"topic": "x"}
    turns = next(iter(srv.runtime.nodes["reply"].turns.values()))
    assert turns[-1].reply.out_of_band


async def test_instructions_reach_the_model_and_may_change_after_a_turn():
    async with server() as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            assert (await until(conn, "session.updated"))[-1].session.instructions == "Be brief."
            await conn.response.create(response={"max_output_tokens": 1})
            done = (await until(conn, "response.done"))[-1].response
            assert (done.status, done.status_details.reason) == ("incomplete", "max_output_tokens")
            await conn.session.update(session={"type": "realtime", "instructions": "Be long."})
            updated = await until(conn, "session.updated")
            assert all(e.type != "error" for e in updated)
            assert updated[-1].session.instructions == "Be long."
            await conn.response.create()
            await until(conn, "response.done")
    turns = next(iter(srv.runtime.nodes["reply"].turns.values()))
    assert [t.instructions for t in turns] == ["Be brief.", "Be long."]


async def test_g711_input_and_output_formats():
    async with server(reply={"words": 1, "chunk_ms": 100}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcma"}}}}
            )
            session = (await until(conn, "session.updated"))[-1].session
            assert session.audio.input.format.type == "audio/pcmu"
            from session_server.realtime.audio_formats import ULAW_ENCODE

            samples = utterance(rate=8000)
            mulaw = ULAW_ENCODE[(np.frombuffer(pcm16(samples), "<i2").astype(np.int32) + 32768)].tobytes()
            for start in range(0, len(mulaw), 800):
                await conn.input_audio_buffer.append(audio=b64(mulaw[start : start + 800]))
            events = await until(conn, "response.done")
    assert events[0].type == "input_audio_buffer.speech_started"
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert abs(len(audio) - 800) <= 80  # 100 ms of 8 kHz A-law, one byte a sample (resampler delay aside)


async def test_a_client_created_audio_item_reaches_the_model_at_16khz():
    async with server(reply={"words": 1}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            audio = b64(pcm16(utterance()))
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
            )
            added = (await until(conn, "conversation.item.done"))[-1].item
            assert added.content[0].type == "input_audio"
            await conn.response.create()
            assert (await until(conn, "response.done"))[-1].response.status == "completed"
    turns = next(iter(srv.runtime.nodes["reply"].turns.values()))
    item_turn = next(t for t in turns if t.item_id == added.id)
    assert abs(len(item_turn.audio) - len(utterance()) * 16000 / 24000) < 400


async def test_time_to_first_audio_is_exported_for_realtime_replies():
    async with server(reply={"words": 2}) as srv:
        async with sdk_client(srv).realtime.connect(model=MODEL) as conn:
            await append_pcm(conn, utterance())
            await until(conn, "response.done")
        metrics = srv.state.metrics.render().decode()
    assert 'sgl_omni_time_to_first_audio_seconds_count{transport="realtime"} 1.0' in metrics
