"""User transcripts: `audio.input.transcription`, the `conversation.item.input_audio_transcription.*`
events, transcription sessions, and the thinker's out-of-band pass that makes the transcripts.

The tiny test checkpoint's transcripts mean nothing: these tests hold the events, their order, the
item's transcript, and the pass leaving the model's context as it found it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import numpy as np
import pytest

from configs import load_profile
from graph.messages import (
    Configure,
    HiddenChunk,
    InputCommitted,
    NodeEvent,
    ReplyParams,
    TalkerPrompt,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
    Truncate,
    Turn,
    TurnDone,
)
from graph.runtime import GraphRuntime
from session_server.realtime.protocol import RealtimeProtocol, SendToGraph
from tests.conftest import running_server
from tests.realtime.client import (
    API_KEY,
    append_pcm,
    b64,
    raw_client,
    sdk_client,
    until,
    until_all,
    utterance,
)
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16
from tests.realtime.test_protocol import events, kinds

# --------------------------------------------------------------------------- the protocol alone


def configures(actions, target: str = "dialog") -> list[dict]:
    return [a.message.config for a in actions if isinstance(a, SendToGraph) and isinstance(a.message, Configure)
            and a.message.target == target]


def send(protocol: RealtimeProtocol, **event) -> list:
    return protocol.receive_text(json.dumps(event))


def opened() -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "qwen3-omni-tiny")
    protocol.open()
    return protocol


def committed(protocol: RealtimeProtocol, item_id: str, turn_id: int = 1, auto_reply: bool = True) -> list:
    return protocol.graph_output(InputCommitted(turn_id=turn_id, item_id=item_id, auto_reply=auto_reply))


def transcript_event(protocol: RealtimeProtocol, event: type[NodeEvent], **fields) -> list:
    return protocol.graph_output(event(turn_id=1, **fields))


TRANSCRIPTION = {"model": "whisper-1", "language": "en", "prompt": "Weather in French cities."}


def test_transcription_is_off_by_default_and_echoed_with_the_model_that_serves_it():
    protocol = RealtimeProtocol("sess_1", "qwen3-omni-tiny")
    (created,) = events(protocol.open())
    assert created["session"]["audio"]["input"]["transcription"] is None

    actions = send(protocol, type="session.update", session={"audio": {"input": {"transcription": TRANSCRIPTION}}})
    (updated,) = events(actions)
    # Exactly the GA object (strict clients parse it field by field); who serves it is an extension.
    assert updated["session"]["audio"]["input"]["transcription"] == TRANSCRIPTION
    assert updated["session"]["sglang"]["transcription"] == {"served_by": "qwen3-omni-tiny"}
    (dialog_config,) = configures(actions)
    assert dialog_config["transcription"] == {"language": "en", "prompt": "Weather in French cities.", "keep_in_history": True}

    actions = send(protocol, type="session.update", session={"audio": {"input": {"transcription": None}}})
    assert events(actions)[0]["session"]["audio"]["input"]["transcription"] is None
    assert configures(actions)[0]["transcription"] is None


def test_the_beta_field_input_audio_transcription_turns_transcripts_on_too():
    protocol = opened()
    (updated,) = events(send(protocol, type="session.update", session={"input_audio_transcription": {"model": "whisper-1"}}))
    assert updated["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"


@pytest.mark.parametrize(
    ("transcription", "code", "param"),
    [
        ({"language": "English, please"}, "invalid_value", "session.audio.input.transcription.language"),
        ({"prompt": "x" * 5000}, "invalid_value", "session.audio.input.transcription.prompt"),
        ({"model": 7}, "invalid_type", "session.audio.input.transcription.model"),
        ("whisper-1", "invalid_type", "session.audio.input.transcription"),
    ],
)
def test_bad_transcription_settings_are_refused_and_change_nothing(transcription, code, param):
    protocol = opened()
    (error,) = events(send(protocol, type="session.update", event_id="evt_9",
                           session={"audio": {"input": {"transcription": transcription}}}))
    assert error["type"] == "error"
    assert (error["error"]["code"], error["error"]["param"], error["error"]["event_id"]) == (code, param, "evt_9")
    assert protocol.config.transcription is None


def test_a_transcript_reaches_the_client_and_stays_on_its_item():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"input": {"transcription": TRANSCRIPTION}}})
    added = next(e for e in events(committed(protocol, "item_u1")) if e["type"] == "conversation.item.added")
    assert added["item"]["content"][0] == {"type": "input_audio", "transcript": None}  # null until the transcript

    out = transcript_event(protocol, TranscriptDelta, item_id="item_u1", delta="What is ")
    out += transcript_event(protocol, TranscriptDelta, item_id="item_u1", delta="the weather?")
    out += transcript_event(protocol, TranscriptCompleted, item_id="item_u1", transcript="What is the weather?",
                            usage={"input_tokens": 60, "output_tokens": 5, "input_text_tokens": 20, "input_audio_tokens": 40})
    deltas, completed = events(out)[:2], events(out)[2]
    assert [(d["type"], d["item_id"], d["content_index"], d["delta"]) for d in deltas] == [
        ("conversation.item.input_audio_transcription.delta", "item_u1", 0, "What is "),
        ("conversation.item.input_audio_transcription.delta", "item_u1", 0, "the weather?"),
    ]
    assert completed["type"] == "conversation.item.input_audio_transcription.completed"
    assert (completed["item_id"], completed["content_index"], completed["transcript"]) == ("item_u1", 0, "What is the weather?")
    assert completed["usage"] == {"type": "tokens", "input_tokens": 60, "output_tokens": 5, "total_tokens": 65,
                                  "input_token_details": {"text_tokens": 20, "audio_tokens": 40}}
    (retrieved,) = events(send(protocol, type="conversation.item.retrieve", item_id="item_u1"))
    assert retrieved["item"]["content"][0] == {"type": "input_audio", "transcript": "What is the weather?"}
    assert added["item"]["content"][0]["transcript"] is None  # an event already sent is not rewritten


def test_a_failed_transcript_is_reported_on_its_item_and_the_session_goes_on():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"input": {"transcription": {}}}})
    committed(protocol, "item_u1", auto_reply=False)
    (failed,) = events(transcript_event(protocol, TranscriptFailed, item_id="item_u1",
                                        code="context_exhausted", message="the conversation needs 9000 tokens"))
    assert failed["type"] == "conversation.item.input_audio_transcription.failed"
    assert (failed["item_id"], failed["content_index"]) == ("item_u1", 0)
    assert failed["error"] == {"type": "server_error", "code": "context_exhausted",
                               "message": "the conversation needs 9000 tokens", "param": None}
    (retrieved,) = events(send(protocol, type="conversation.item.retrieve", item_id="item_u1"))
    assert retrieved["item"]["content"][0]["transcript"] is None
    assert kinds(send(protocol, type="response.create"))[0] == "response.created"


TRANSCRIPTION_SESSION = {"type": "transcription", "audio": {"input": {
    "transcription": {"model": "gpt-4o-transcribe", "language": "fr"},
    "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
}}}


def test_a_transcription_session_has_the_ga_shape_and_never_replies():
    protocol = opened()
    actions = send(protocol, type="session.update", session=TRANSCRIPTION_SESSION)
    session = events(actions)[0]["session"]
    assert (session["type"], session["object"], session["id"]) == ("transcription", "realtime.transcription_session", "sess_1")
    assert "output_modalities" not in session and "instructions" not in session
    audio_in = session["audio"]["input"]
    assert audio_in["transcription"] == {"model": "gpt-4o-transcribe", "language": "fr", "prompt": None}
    assert session["sglang"]["transcription"] == {"served_by": "qwen3-omni-tiny"}
    assert audio_in["turn_detection"]["silence_duration_ms"] == 400
    assert "create_response" not in audio_in["turn_detection"]
    (dialog_config,) = configures(actions)
    assert dialog_config["transcription"]["keep_in_history"] is False  # each utterance leaves the model with its transcript
    assert dialog_config["turn_detection"]["create_response"] is False  # no turn waits for a reply

    assert kinds(committed(protocol, "item_u1", auto_reply=True)) == [
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
    ]
    (error,) = events(send(protocol, type="response.create", event_id="evt_r"))
    assert (error["error"]["code"], error["error"]["event_id"]) == ("unsupported", "evt_r")
    assert not protocol.responses


def test_a_transcription_session_transcribes_even_without_a_transcription_object():
    protocol = opened()
    (updated,) = events(send(protocol, type="session.update", session={"type": "transcription"}))
    assert updated["session"]["audio"]["input"]["transcription"] is not None
    assert updated["session"]["sglang"]["transcription"] == {"served_by": "qwen3-omni-tiny"}


def test_the_session_type_is_fixed_once_a_turn_was_processed():
    protocol = opened()
    committed(protocol, "item_u1", auto_reply=False)
    (error,) = events(send(protocol, type="session.update", session={"type": "transcription"}))
    assert (error["error"]["code"], error["error"]["param"]) == ("session_type_locked", "session.type")
    (error,) = events(send(protocol, type="session.update", session={"type": "translation"}))
    assert (error["error"]["code"], error["error"]["param"]) == ("unsupported", "session.type")
    assert protocol.config.type == "realtime"


# --------------------------------------------------------------------------- the dialog, over WebSocket (fake model)


async def test_committed_speech_is_marked_for_a_transcript_and_a_transcription_session_asks_no_reply():
    async with running_server(realtime_profile(), api_key=API_KEY) as srv:
        fake = srv.runtime.nodes["reply"]
        async with raw_client(srv) as client:
            await client.until("session.created")
            await client.send({"type": "session.update", "session": {"audio": {"input": {"transcription": TRANSCRIPTION}}}})
            await client.until("session.updated")
            await append_raw(client, utterance())
            await client.until("response.done")
            session_id = next(iter(fake.turns))
            (spoken,) = fake.turns[session_id]  # the utterance brings its automatic reply: one turn
            assert spoken.transcribe == {"language": "en", "prompt": "Weather in French cities.", "keep_in_history": True}
            assert spoken.audio is not None and spoken.reply is not None

        async with raw_client(srv) as client:
            await client.until("session.created")
            await client.send({"type": "session.update", "session": TRANSCRIPTION_SESSION})
            assert (await client.until("session.updated"))[-1]["session"]["type"] == "transcription"
            await append_raw(client, utterance())
            seen = await client.until("conversation.item.done")
            assert [e["type"] for e in seen if e["type"].startswith("input_audio_buffer.")] == [
                "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
            ]
            await client.send({"type": "response.create"})
            assert (await client.error())["code"] == "unsupported"
            session_id = next(s for s in fake.turns if s != session_id)
            (spoken,) = fake.turns[session_id]  # the utterance, and no reply request
            assert spoken.transcribe["keep_in_history"] is False and not spoken.awaited


async def append_raw(client, samples: np.ndarray, chunk_s: float = 0.1, rate: int = 24000) -> None:
    step = int(rate * chunk_s)
    for start in range(0, len(samples), step):
        await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(samples[start : start + step]))})


# --------------------------------------------------------------------------- the thinker's pass (tiny model)


def thinker_profile(max_reply_tokens: int = 6, **thinker_params) -> dict:
    """Preprocessing -> encoders -> thinker on the embedded default's tiny checkpoint."""
    omni = load_profile(None)["resources"]["omni"]
    return {
        "model_id": "test",
        "imports": ["nodes.qwen3_omni.model", "nodes.preprocessing", "nodes.encoders", "nodes.thinker"],
        "resources": {"omni": {**omni, "params": {**omni["params"], "max_reply_tokens": max_reply_tokens}}},
        "nodes": {
            "preprocessing": {"type": "qwen3_omni.preprocessing", "params": {"resource": "omni"}},
            "encoders": {"type": "qwen3_omni.encoders", "params": {"resource": "omni"}},
            "thinker": {"type": "qwen3_omni.thinker", "params": {"resource": "omni", "warmup": False, **thinker_params}},
        },
        "edges": ["preprocessing.features -> encoders.features", "encoders.embeddings -> thinker.embeddings"],
        "inputs": {"turns": "preprocessing.turns"},
        "outputs": ["thinker.text", "thinker.hidden"],
    }


@pytest.fixture
async def start_runtime():
    runtimes = []

    async def start(**kwargs):
        runtime = GraphRuntime.from_config(thinker_profile(**kwargs))
        await runtime.start()
        runtimes.append(runtime)
        return runtime

    yield start
    for runtime in runtimes:
        await runtime.stop(0)


def spoken(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


KEEP = {"language": "en", "prompt": None, "keep_in_history": True}


def utterance_turn(turn_id: int, transcribe: dict | None = KEEP, awaited: bool = True, seed: int = 0) -> Turn:
    return Turn(turn_id=turn_id, item_id=f"item_{turn_id}", audio=spoken(1.0, seed), awaited=awaited, transcribe=transcribe)


def reply_turn(turn_id: int, response_id: str) -> Turn:
    return Turn(turn_id=turn_id, reply=ReplyParams(response_id=response_id, output_modalities=("text",)))


async def collect(session, done: Callable[[list], bool], timeout: float = 60.0) -> list:
    """Outputs until `done(everything so far)`."""
    out: list = []
    async with asyncio.timeout(timeout):
        async for message in session.outputs():
            out.append(message)
            if done(out):
                return out
    raise AssertionError(f"the session ended early: {session.end_reason}")


def transcript_ended(item_id: str):
    def done(out):
        return any(isinstance(m, NodeEvent) and m.kind in ("transcription_completed", "transcription_failed")
                   and m.item_id == item_id for m in out)
    return done


def reply_ended(response_id: str):
    return lambda out: any(isinstance(m, TurnDone) and m.response_id == response_id for m in out)


def both(*conditions):
    return lambda out: all(condition(out) for condition in conditions)


def transcription_events(out, item_id: str) -> list[NodeEvent]:
    return [m for m in out if isinstance(m, NodeEvent) and m.kind.startswith("transcription_") and m.item_id == item_id]


def thinker_engine(runtime, session):
    return runtime.sessions[session.id]._node_sessions["thinker"].engine


async def test_the_pass_follows_the_reply_and_leaves_the_context_as_it_found_it(start_runtime):
    """Two sessions fed the same turns, one with a transcript: the next reply is the same, and the
    reply before the pass can still be truncated."""
    runtime = await start_runtime()
    results = {}
    for name, transcribe in (("plain", None), ("transcribed", KEEP)):
        session = await runtime.open_session(name)
        await session.send("turns", utterance_turn(1, transcribe))
        await session.send("turns", reply_turn(2, "r1"))
        first = await collect(session, reply_ended("r1") if transcribe is None else both(reply_ended("r1"), transcript_ended("item_1")))
        # The listener heard one codec frame of the reply: the reply is cut in the history, pass or not.
        session.control(Truncate(response_id="r1", item_id="item_r1", audio_end_ms=80.0))
        await session.send("turns", Turn(turn_id=3, item_id="item_3", text="And tomorrow?", reply=ReplyParams(response_id="r2", output_modalities=("text",))))
        second = await collect(session, reply_ended("r2"))
        results[name] = (first, second, list(thinker_engine(runtime, session).context_ids))

    first, second, context = results["transcribed"]
    passes = transcription_events(first, "item_1")
    *deltas, completed = passes
    assert completed.kind == "transcription_completed" and deltas and all(d.kind == "transcription_delta" for d in deltas)
    assert completed.transcript == "".join(d.delta for d in deltas).strip()
    usage = completed.usage
    assert usage["input_audio_tokens"] == 13 and usage["output_tokens"] > 0  # one second of audio
    # The utterance is answered first: the pass starts once the reply is generated.
    reply_done = next(i for i, m in enumerate(first) if isinstance(m, TurnDone))
    assert reply_done < first.index(passes[0])

    plain_first, plain_second, plain_context = results["plain"]
    done, plain_done = second[-1], plain_second[-1]
    assert (done.transcript, done.usage) == (plain_done.transcript, plain_done.usage)
    assert first[reply_done].usage == plain_first[-1].usage
    assert context == plain_context  # the KV holds exactly what it would have without the pass
    assert done.usage.cached_tokens == first[reply_done].usage.input_tokens + 1  # the truncate applied: 1 reply token kept


async def test_a_pass_in_progress_gives_way_to_a_reply_and_starts_over_after_it(start_runtime, monkeypatch):
    from nodes.qwen3_omni.transcription import Transcriber

    # Hold the pass after its first delta until the reply reaches the thinker, so that the reply
    # finds it in progress however fast the model would finish it.
    reply_arrived = asyncio.Event()
    report, give_way = Transcriber._report, Transcriber.give_way

    async def held_report(self, job, kind, **fields):
        await report(self, job, kind, **fields)
        if kind == "transcription_delta":
            await reply_arrived.wait()

    async def noticed_give_way(self):
        reply_arrived.set()
        await give_way(self)

    monkeypatch.setattr(Transcriber, "_report", held_report)
    monkeypatch.setattr(Transcriber, "give_way", noticed_give_way)
    runtime = await start_runtime()
    session = await runtime.open_session("s1")
    await session.send("turns", utterance_turn(1, awaited=False))  # manual commit: transcribed at once
    before = await collect(session, lambda out: any(isinstance(m, NodeEvent) and m.kind == "transcription_delta" for m in out))
    await session.send("turns", Turn(turn_id=2, reply=ReplyParams(response_id="r1", output_modalities=("text",), max_output_tokens=4)))
    after = await collect(session, both(reply_ended("r1"), transcript_ended("item_1")))

    reply_done = next(i for i, m in enumerate(after) if isinstance(m, TurnDone))
    (completed,) = [m for m in after if isinstance(m, NodeEvent) and m.kind == "transcription_completed"]
    assert reply_done < after.index(completed)  # the reply went first; the pass was done after it
    # Started over after the reply, it sends no deltas again (`completed` has the whole transcript).
    assert not [m for m in after[reply_done:] if isinstance(m, NodeEvent) and m.kind == "transcription_delta"]
    assert len(before) >= 2 and completed.transcript
    # The reply saw the conversation without the interrupted pass: its context is the utterance
    # (prefilled at commit) and the reply request.
    prompts = [m for m in before + after if isinstance(m, TalkerPrompt)]
    assert after[reply_done].usage.input_tokens == sum(len(p.token_ids) for p in prompts)


async def test_a_pass_that_fails_reports_failed_and_the_session_goes_on(start_runtime, monkeypatch):
    from nodes.qwen3_omni import transcription

    def broken(omni, text):
        raise RuntimeError("no instruction today")

    monkeypatch.setattr(transcription, "_instruction_turn", broken)
    runtime = await start_runtime()
    session = await runtime.open_session("s1")
    await session.send("turns", utterance_turn(1))
    await session.send("turns", reply_turn(2, "r1"))
    out = await collect(session, both(reply_ended("r1"), transcript_ended("item_1")))
    (failed,) = transcription_events(out, "item_1")
    assert failed.kind == "transcription_failed" and failed.code == "transcription_failed"
    assert "no instruction today" in failed.message
    await session.send("turns", Turn(turn_id=3, item_id="item_3", text="Still there?", reply=ReplyParams(response_id="r2", output_modalities=("text",))))
    second = await collect(session, reply_ended("r2"))
    assert second[-1].status in ("completed", "incomplete") and not session.failed


async def test_a_transcription_session_forgets_each_utterance_with_its_transcript(start_runtime):
    runtime = await start_runtime()
    session = await runtime.open_session("s1")
    forget = {"language": None, "prompt": None, "keep_in_history": False}
    out = []
    for turn_id in (1, 2):
        await session.send("turns", utterance_turn(turn_id, forget, awaited=False, seed=turn_id))
        out += await collect(session, transcript_ended(f"item_{turn_id}"))
    for item_id in ("item_1", "item_2"):
        assert transcription_events(out, item_id)[-1].kind == "transcription_completed"
    engine = thinker_engine(runtime, session)
    assert engine.audio_tokens_in_context == 0  # neither utterance stayed in the model's context
    assert not [m for m in out if isinstance(m, (TalkerPrompt, HiddenChunk))]  # nor reached the talker's history


# --------------------------------------------------------------------------- end to end (tiny model)


async def test_spoken_turns_on_the_default_graph_get_transcripts_that_change_nothing_else():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 6,
                                               "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
            updated = (await until(conn, "session.updated"))[-1]
            assert updated.session.audio.input.transcription.model == "whisper-1"
            await append_pcm(conn, utterance())
            first = await until_all(conn, "response.done", "conversation.item.input_audio_transcription.completed")
            item_id = next(e.item_id for e in first if e.type == "input_audio_buffer.committed")
            await conn.conversation.item.retrieve(item_id=item_id)
            retrieved = (await until(conn, "conversation.item.retrieved"))[-1]
            await append_pcm(conn, utterance("And tomorrow?"))
            second = await until_all(conn, "response.done", "conversation.item.input_audio_transcription.completed")

    types = [e.type for e in first]
    completed = next(e for e in first if e.type == "conversation.item.input_audio_transcription.completed")
    deltas = [e for e in first if e.type == "conversation.item.input_audio_transcription.delta"]
    assert completed.item_id == item_id and completed.content_index == 0 and completed.usage.type == "tokens"
    assert completed.transcript == "".join(d.delta for d in deltas).strip()
    assert all(d.item_id == item_id for d in deltas)
    # The reply is made first: its text is all out before the transcript starts.
    first_transcript = types.index(deltas[0].type if deltas else completed.type)
    assert types.index("response.created") < first_transcript
    assert max((i for i, t in enumerate(types) if t == "response.output_audio_transcript.delta"), default=-1) < first_transcript
    assert retrieved.item.content[0].transcript == completed.transcript
    # The pass was rolled back: the second reply reuses exactly the first turn and reply.
    usage = next(e for e in first if e.type == "response.done").response.usage
    second_usage = next(e for e in second if e.type == "response.done").response.usage
    assert second_usage.input_token_details.cached_tokens == usage.input_tokens + usage.output_token_details.text_tokens


async def test_a_transcription_session_on_the_default_graph_sends_transcripts_and_no_replies():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with raw_client(srv, model=srv.runtime.model_id) as client:
            await client.until("session.created")
            await client.send({"type": "session.update", "session": TRANSCRIPTION_SESSION})
            await client.until("session.updated")
            for text in ("What is the weather like today in Paris?", "And tomorrow?"):
                await append_raw(client, utterance(text))
                seen = await client.until("conversation.item.input_audio_transcription.completed", timeout=120)
                committed_item = next(e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed")
                assert seen[-1]["item_id"] == committed_item and isinstance(seen[-1]["transcript"], str)
                assert not [e for e in seen if e["type"].startswith("response.")]
