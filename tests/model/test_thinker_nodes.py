"""Preprocessing -> encoders -> thinker (-> talker -> code2wav) as a graph, on the tiny checkpoint."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from graph.messages import AudioOut, HiddenChunk, Interrupt, NodeEvent, ReplyParams, TalkerPrompt, TextDelta, Truncate, Turn, TurnDone
from graph.runtime import GraphRuntime


def profile(checkpoint, *, audio_out=False, **thinker_params):
    nodes = {
        "preprocessing": {"type": "qwen3_omni.preprocessing", "params": {"resource": "omni"}},
        "encoders": {"type": "qwen3_omni.encoders", "params": {"resource": "omni"}},
        "thinker": {"type": "qwen3_omni.thinker", "params": {"resource": "omni", **thinker_params}},
    }
    edges = ["preprocessing.features -> encoders.features", "encoders.embeddings -> thinker.embeddings"]
    outputs = ["thinker.text", "thinker.hidden"]
    imports = ["nodes.qwen3_omni.model", "nodes.preprocessing", "nodes.encoders", "nodes.thinker"]
    if audio_out:
        nodes["talker"] = {"type": "qwen3_omni.talker", "params": {"resource": "omni", "max_frames_per_token": 2}}
        nodes["code2wav"] = {"type": "qwen3_omni.code2wav", "params": {"resource": "omni"}}
        edges += ["thinker.hidden -> talker.hidden", "talker.codes -> code2wav.codes"]
        outputs = ["thinker.text", "code2wav.audio"]
        imports += ["nodes.talker", "nodes.code2wav"]
    return {
        "model_id": "test",
        "imports": imports,
        "resources": {"omni": {"type": "qwen3_omni.model", "params": {"path": str(checkpoint), "max_reply_tokens": 6}}},
        "nodes": nodes,
        "edges": edges,
        "inputs": {"turns": "preprocessing.turns"},
        "outputs": outputs,
    }


@pytest.fixture
async def start_runtime(tiny_checkpoint):
    runtimes = []

    async def start(**kwargs):
        runtime = GraphRuntime.from_config(profile(tiny_checkpoint, **kwargs))
        await runtime.start()
        runtimes.append(runtime)
        return runtime

    yield start
    for runtime in runtimes:
        await runtime.stop(0)


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def omni_tokens(runtime):
    return runtime.resources["omni"].tokens


async def until_done(session, timeout=30.0, on_message=None):
    out = []
    async with asyncio.timeout(timeout):
        async for message in session.outputs():
            out.append(message)
            if on_message is not None:
                on_message(message)
            if isinstance(message, TurnDone):
                return out
    raise AssertionError(f"the session ended without a TurnDone: {session.end_reason}")


async def spoken_turn(session, turn_id, seconds=1.0, response_id="r"):
    await session.send("turns", Turn(turn_id=turn_id, item_id=f"i{turn_id}", audio=speech(seconds, turn_id)))
    await session.send("turns", Turn(turn_id=turn_id + 1, reply=ReplyParams(response_id=response_id)))


async def test_a_spoken_turn_streams_text_then_a_second_turn_reuses_the_cache(start_runtime):
    runtime = await start_runtime()
    session = await runtime.open_session("s1")
    await spoken_turn(session, 1, response_id="r1")
    first = await until_done(session)

    prompts = [m for m in first if isinstance(m, TalkerPrompt)]
    assert len(prompts) == 2  # the utterance, then the reply request
    assert prompts[0].mm_hidden.shape[0] == 13  # one second of audio = 13 audio tokens
    deltas = [m for m in first if isinstance(m, TextDelta)]
    reply_chunks = [m for m in first if isinstance(m, HiddenChunk) and m.response_id == "r1"]
    done = first[-1]
    assert done.status == "incomplete" and done.reason == "max_output_tokens"  # the 11-token reply passes the bound
    assert done.transcript == "".join(d.text for d in deltas)
    assert [c.token_ids[0] for c in reply_chunks] == [t for d in deltas for t in d.token_ids]
    assert reply_chunks[-1].final and reply_chunks[0].voice is None
    # Nothing came before this turn: the utterance (prefilled at commit) is all new input.
    assert done.usage.output_tokens == 6 and done.usage.cached_tokens == 0
    assert done.usage.input_tokens == len(prompts[0].token_ids) + len(prompts[1].token_ids)
    assert done.usage.input_audio_tokens == 13
    first_context = done.usage.input_tokens

    await session.send("turns", Turn(turn_id=3, item_id="i3", text="and then?", reply=ReplyParams(response_id="r2")))
    second = await until_done(session)
    # The whole first turn (input + reply) is reused from the KV cache; only the first reply's
    # closing and the new turn go through the model.
    assert second[-1].usage.cached_tokens == first_context + 6
    (prompt,) = [m for m in second if isinstance(m, TalkerPrompt)]
    assert prompt.token_ids[:2] == (omni_tokens(runtime).im_end, omni_tokens(runtime).newline)
    assert second[-1].usage.input_tokens == first_context + 6 + len(prompt.token_ids)


async def test_interrupt_cancels_the_reply_within_a_step(start_runtime):
    runtime = await start_runtime(max_reply_tokens=400)
    session = await runtime.open_session("s2")
    await spoken_turn(session, 1, response_id="r1")

    def interrupt_on_first_text(message):
        if isinstance(message, TextDelta) and not interrupted:
            interrupted.append(True)
            session.control(Interrupt(turn_id=2, response_id="r1"))

    interrupted: list[bool] = []
    out = await until_done(session, on_message=interrupt_on_first_text)
    done = out[-1]
    assert done.status == "cancelled"
    assert 1 <= done.usage.output_tokens < 400


async def test_truncate_keeps_the_heard_part_of_the_reply(start_runtime):
    runtime = await start_runtime()
    session = await runtime.open_session("s3")
    await spoken_turn(session, 1, response_id="r1")
    first = (await until_done(session))[-1]

    # 160 ms heard = 2 codec frames = at most 2 reply tokens heard.
    session.control(Truncate(turn_id=2, response_id="r1", item_id="a1", audio_end_ms=160))
    await session.send("turns", Turn(turn_id=3, text="what?", reply=ReplyParams(response_id="r2")))
    second = (await until_done(session))[-1]
    assert second.usage.cached_tokens == first.usage.input_tokens + 2


async def test_a_turn_past_the_context_fails_with_context_exhausted(start_runtime):
    runtime = await start_runtime(max_seq_len=40)
    session = await runtime.open_session("s4")
    # An utterance that cannot join the history: an error notice, no reply.
    await session.send("turns", Turn(turn_id=1, audio=speech(3.0)))
    async with asyncio.timeout(30):
        notice = await anext(session.outputs())
    assert isinstance(notice, NodeEvent) and notice.code == "context_exhausted"
    # A turn that asks for a reply: the reply fails with the same code.
    await session.send("turns", Turn(turn_id=2, audio=speech(3.0), reply=ReplyParams(response_id="r1")))
    done = (await until_done(session))[-1]
    assert (done.status, done.reason) == ("failed", "context_exhausted")


async def test_spoken_turn_through_talker_and_code2wav_streams_audio(start_runtime, capsys):
    runtime = await start_runtime(audio_out=True)
    session = await runtime.open_session("s5", config={"voice": "aiden"})
    started = time.perf_counter()
    first_audio: list[float] = []

    def stamp(message):
        if isinstance(message, AudioOut) and not first_audio:
            first_audio.append(time.perf_counter() - started)

    await spoken_turn(session, 1, response_id="r1")
    out = await until_done(session, on_message=stamp)
    audio = np.concatenate([m.samples for m in out if isinstance(m, AudioOut)])
    done = out[-1]
    assert any(isinstance(m, TextDelta) for m in out)
    assert done.response_id == "r1" and done.usage.output_audio_tokens > 0
    assert len(audio) == done.usage.output_audio_tokens * 1920 - 555
    with capsys.disabled():
        print(f"\n[tiny, graph direct] first audio after {first_audio[0] * 1000:.0f} ms of a 1 s spoken turn")


async def test_speech_request_speaks_the_given_text(start_runtime):
    runtime = await start_runtime(audio_out=True)
    session = await runtime.open_session("s6", kind="speech")
    await session.send(
        "turns",
        Turn(turn_id=1, role="assistant", text="Hello there.", speak=True,
             reply=ReplyParams(response_id="sp1", voice="chelsie")),
    )
    out = await until_done(session)
    done = out[-1]
    assert done.status == "completed" and done.transcript == "Hello there."
    assert done.usage.input_text_tokens == len("Hello there.")  # one byte-level token per character here
    assert any(isinstance(m, AudioOut) for m in out)


async def test_preprocessing_gives_every_turn_the_system_prompt_apart_from_its_own_tokens(tiny_checkpoint):
    config = profile(tiny_checkpoint)
    config["nodes"] = {"preprocessing": config["nodes"]["preprocessing"]}
    config["edges"], config["outputs"] = [], ["preprocessing.features"]
    runtime = GraphRuntime.from_config(config)
    await runtime.start()
    try:
        omni = runtime.resources["omni"]
        tok = omni.tokens
        session = await runtime.open_session("p")
        images = [png_bytes(seed) for seed in range(6)]
        turns = [
            Turn(turn_id=1, text="hi", instructions="Be brief."),
            Turn(turn_id=2, text="again", instructions="Be brief.", images=images),
            Turn(turn_id=3, text="and", instructions="Speak French.", reply=ReplyParams(response_id="r")),
        ]
        for turn in turns:
            await session.send("turns", turn)
        outs = []
        async with asyncio.timeout(30):
            async for message in session.outputs():
                outs.append((message.tensors["input_ids"].tolist(), message.tensors["system_ids"]))
                if len(outs) == 3:
                    break
        def system(text):
            return [tok.im_start, tok.system, tok.newline, *omni.tokenizer(text, add_special_tokens=False).input_ids,
                    *tok.closing]

        # The thinker puts the system prompt at the start of the history (replacing an older one).
        assert [system_ids for _, system_ids in outs] == [system("Be brief."), system("Be brief."), system("Speak French.")]
        assert all(ids[:2] == [tok.im_start, tok.user] for ids, _ in outs)
        assert outs[1][0].count(tok.vision_start) == 4  # the newest max_utterance_frames images
        assert outs[2][0][-3:] == tok.assistant_header
    finally:
        await runtime.stop(0)


def png_bytes(seed: int) -> bytes:
    import io

    from PIL import Image

    pixels = (np.random.default_rng(seed).random((32, 32, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


async def test_a_text_only_reply_streams_text_and_no_audio(start_runtime):
    runtime = await start_runtime(audio_out=True)
    session = await runtime.open_session("s7")
    await session.send("turns", Turn(turn_id=1, text="hi", reply=ReplyParams(response_id="t1", output_modalities=("text",))))
    out = await until_done(session)
    assert out[-1].status == "incomplete" and out[-1].usage.output_audio_tokens == 0
    assert any(isinstance(m, TextDelta) for m in out)
    assert not any(isinstance(m, AudioOut) for m in out)


async def test_concurrent_sessions_get_the_replies_they_would_get_alone(start_runtime):
    runtime = await start_runtime()

    async def converse(name, seed):
        # Seeded hot sampling makes each conversation's replies its own (greedy, the tiny model
        # gives every turn the same reply), so a reply that leaked into another session shows.
        session = await runtime.open_session(name, config={"sampling": {"temperature": 3.0, "seed": seed}})
        transcripts = []
        for turn in range(2):
            utterance = Turn(turn_id=2 * turn + 1, audio=speech(0.6 + 0.3 * turn, seed + turn), text=f"#{seed + turn}")
            await session.send("turns", utterance)
            await session.send("turns", Turn(turn_id=2 * turn + 2, reply=ReplyParams(response_id=f"{name}{turn}")))
            transcripts.append((await until_done(session))[-1].transcript)
        await session.close()
        return transcripts

    alone = [await converse("a0", 10), await converse("b0", 20)]
    together = await asyncio.gather(converse("a1", 10), converse("b1", 20))
    assert list(together) == alone
    assert alone[0] != alone[1]
