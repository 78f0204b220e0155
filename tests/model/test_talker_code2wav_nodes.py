"""Talker + code2wav nodes in a graph: thinker chunks in, streamed reply audio out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from graph.messages import AudioOut, CodecFrames, HiddenChunk, Interrupt, ReplyParams, TalkerPrompt, TurnDone, Usage
from graph.runtime import GraphRuntime
from graph.unit_trace import UnitTrace
from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder
from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerReply, prefill_user_turns


def profile(checkpoint, **talker_params):
    return {
        "model_id": "test",
        "imports": ["nodes.qwen3_omni.model", "nodes.talker", "nodes.code2wav"],
        "resources": {"omni": {"type": "qwen3_omni.model", "params": {"path": str(checkpoint)}}},
        "nodes": {
            "talker": {
                "type": "qwen3_omni.talker",
                "params": {
                    "resource": "omni",
                    "sampling": {"do_sample": False},
                    "max_frames_per_token": 2,
                    **talker_params,
                },
            },
            "code2wav": {"type": "qwen3_omni.code2wav", "params": {"resource": "omni", "chunk_frames": 4}},
        },
        "edges": ["talker.codes -> code2wav.codes"],
        "inputs": {"hidden": "talker.hidden"},
        "outputs": ["talker.codes", "code2wav.audio"],
    }


@pytest.fixture
async def runtime(tiny_checkpoint):
    runtime = GraphRuntime.from_config(profile(tiny_checkpoint))
    await runtime.start()
    yield runtime
    await runtime.stop(0)


def prompt_chunk(runtime, text="hello"):
    omni = runtime.resources["omni"]
    ids = omni.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"][0]
    return TalkerPrompt(turn_id=1, token_ids=tuple(ids.tolist()))


async def collect(session, until=TurnDone, count=None, timeout=20.0):
    """Outputs up to the `count`-th message of type `until` (default: the TurnDone of both nodes)."""
    count = count or (2 if until is TurnDone else 1)
    out = []
    async with asyncio.timeout(timeout):
        async for message in session.outputs():
            out.append(message)
            if isinstance(message, until):
                count -= 1
                if count == 0:
                    return out
    return out


def record_talker_inputs(runtime):
    """Every talker forward's inputs_embeds, in order (the codes alone barely depend on the text)."""
    calls = []
    model = runtime.resources["omni"].model.talker.model
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["inputs_embeds"][0].clone()), with_kwargs=True
    )
    return calls, handle


async def test_reply_tokens_become_streamed_audio_equal_to_a_one_shot_decode_then_turn_done(runtime):
    session = await runtime.open_session("s", config={"voice": "chelsie"})
    node_inputs, handle = record_talker_inputs(runtime)
    await session.send("hidden", prompt_chunk(runtime))
    for i, token in enumerate([104, 105, 33]):
        await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(token,), final=i == 2))
    await session.send(
        "hidden", TurnDone(turn_id=1, response_id="r1", usage=Usage(output_tokens=3, output_text_tokens=3))
    )

    out = await collect(session)
    handle.remove()

    frames = [m.codes for m in out if isinstance(m, CodecFrames) and len(m.codes)]
    audio = [m.samples for m in out if isinstance(m, AudioOut)]
    done = out[-1]
    assert len(frames) == 6  # 2 frames per token: the tiny bound
    assert isinstance(done, TurnDone) and done.usage.output_audio_tokens == 6 and done.usage.output_tokens == 9
    assert len(audio[0]) == 1920 - 555  # the first chunk is one frame
    decoder = Code2WavDecoder(runtime.resources["omni"].code2wav)
    one_shot = decoder.decode_all(torch.from_numpy(np.concatenate(frames))).numpy()
    # float32: a one-shot decode differs from itself by ~1e-5 at other lengths (float64 streams exactly,
    # see test_code2wav_stream.py), so this checks the joins, not the rounding.
    assert np.allclose(np.concatenate(audio), one_shot, rtol=0, atol=1e-4)
    assert all(m.response_id == "r1" for m in out)
    # The node drives the engine exactly as by hand for the same prompt and tokens.
    talker = runtime.nodes["talker"]
    history = TalkerHistory(talker.model)
    prompt = torch.tensor(prompt_chunk(runtime).token_ids)
    engine_inputs, handle = record_talker_inputs(runtime)
    history.add_prompt(prompt)
    prefill_user_turns(history)  # as the node does when the prompt arrives
    reply = TalkerReply(
        talker.model, history, prompt[-3:], speaker="chelsie", sampling=talker.sampling, limits=talker.limits
    )
    reply.add_text([104, 105, 33], final=True, eos=True)  # TurnDone "completed": the text ended on EOS
    assert np.array_equal(np.concatenate(frames), torch.stack([reply.step() for _ in range(6)]).numpy())
    assert reply.step() is None
    handle.remove()
    assert len(node_inputs) == len(engine_inputs) == 1 + 6  # the user turn ahead of the reply, then 6 frames
    assert node_inputs[1].shape[0] == 9  # the reply's prefill: its assistant block only
    assert all(torch.equal(a, b) for a, b in zip(node_inputs, engine_inputs))
    await session.close()


async def test_a_prompt_whose_reply_follows_is_prefilled_with_the_reply_in_one_forward_and_the_same_frames(runtime):
    async def frames_of(session_id: str, reply_follows: bool):
        session = await runtime.open_session(session_id, config={"voice": "chelsie"})
        inputs, handle = record_talker_inputs(runtime)
        chunk = prompt_chunk(runtime)
        chunk.reply_follows = reply_follows
        await session.send("hidden", chunk)
        for i, token in enumerate([104, 105, 33]):
            await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(token,), final=i == 2))
        await session.send("hidden", TurnDone(turn_id=1, response_id="r1"))
        out = await collect(session)
        handle.remove()
        await session.close()
        return np.concatenate([m.codes for m in out if isinstance(m, CodecFrames) and len(m.codes)]), inputs

    apart, apart_inputs = await frames_of("apart", reply_follows=False)
    together, together_inputs = await frames_of("together", reply_follows=True)
    assert np.array_equal(together, apart)
    # Apart: the user turn, then the reply's 9-position block; together: both in the first forward.
    assert len(apart_inputs) == len(together_inputs) + 1
    assert together_inputs[0].shape[0] == apart_inputs[0].shape[0] + 9


async def test_a_prompt_with_the_thinkers_user_parts_is_projected_in_the_replys_first_step(runtime, tmp_path):
    # Turns that end together must reach the talker's batched prefill together: a prompt unit of
    # its own per turn put each of them through the talker one after the other. The user parts
    # are bookkeeping until the reply's prefill projects them, with the frames of the other path.
    async def frames_of(session_id: str, with_parts: bool):
        session = await runtime.open_session(session_id, config={"voice": "chelsie"})
        chunk = prompt_chunk(runtime)
        chunk.reply_follows = True
        if with_parts:  # the user message, cut out as the thinker cuts it (up to the next <|im_start|>)
            ids = list(chunk.token_ids)
            end = ids.index(runtime.resources["omni"].tokens.im_start, 1)
            chunk.user_parts = [{"token_ids": torch.tensor(ids[:end]), "multimodal_hidden": None}]
        trace = runtime.compute.trace = UnitTrace(str(tmp_path))
        await session.send("hidden", chunk)
        for i, token in enumerate([104, 105, 33]):
            await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(token,), final=i == 2))
        await session.send("hidden", TurnDone(turn_id=1, response_id="r1"))
        out = await collect(session)
        runtime.compute.trace = None
        await session.close()
        return np.concatenate([m.codes for m in out if isinstance(m, CodecFrames) and len(m.codes)]), trace.units

    eager, eager_units = await frames_of("eager", with_parts=False)
    parts, parts_units = await frames_of("parts", with_parts=True)
    assert np.array_equal(parts, eager)
    assert eager_units[0][3] == "TalkerSession._add_prompt_now"  # the path without parts projects in a unit
    assert parts_units[0][3] == "talker"  # with parts, the reply's first step is the first unit


async def test_interrupt_stops_frames_and_audio_and_still_reports_turn_done(runtime):
    session = await runtime.open_session("s")
    await session.send("hidden", prompt_chunk(runtime))
    for token in range(100, 140):  # a long reply whose text never ends
        await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(token,)))
    first = await collect(session, until=AudioOut)

    session.control(Interrupt(turn_id=1, response_id="r1"))
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1", status="cancelled"))
    rest = await collect(session)

    assert isinstance(first[-1], AudioOut)
    # Nothing of the reply after the interrupt: only the TurnDone, forwarded by the talker and by code2wav.
    assert [type(m) for m in rest if not isinstance(m, CodecFrames)] == [TurnDone, TurnDone]
    assert len([m for m in rest if isinstance(m, CodecFrames)]) <= 1  # at most the frame in flight
    talker_frames = sum(isinstance(m, CodecFrames) for m in first)
    assert talker_frames < 39
    await session.close()


async def test_a_second_reply_after_turn_done_gets_its_own_stream(runtime):
    session = await runtime.open_session("s")
    for turn in (1, 2):
        await session.send("hidden", prompt_chunk(runtime, f"turn {turn}"))
        chunk = HiddenChunk(turn_id=turn, response_id=f"r{turn}", token_ids=(104, 105), final=True)
        await session.send("hidden", chunk)
        await session.send("hidden", TurnDone(turn_id=turn, response_id=f"r{turn}"))
        out = await collect(session)
        audio = np.concatenate([m.samples for m in out if isinstance(m, AudioOut)])
        assert len(audio) == 4 * 1920 - 555 and out[-1].response_id == f"r{turn}"
    talker = runtime.nodes["talker"]
    assert talker is not None
    await session.close()


async def test_the_first_frame_and_audio_come_after_the_replys_first_token(runtime):
    session = await runtime.open_session("s")
    await session.send("hidden", prompt_chunk(runtime))
    await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(104,)))

    out = await collect(session, until=AudioOut)  # nothing else was sent: one token was enough

    assert [type(m) for m in out] == [CodecFrames, AudioOut]
    assert len(out[1].samples) == 1920 - 555
    session.control(Interrupt(turn_id=1))
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1", status="cancelled"))
    await collect(session)
    await session.close()


async def test_an_out_of_band_reply_leaves_no_user_turn_in_the_talker_history(runtime):
    session = await runtime.open_session("s")
    talker_session = runtime.nodes["talker"]
    await session.send("hidden", prompt_chunk(runtime, "kept"))
    await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(104,), final=True))
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1"))
    await collect(session)
    out_of_band = prompt_chunk(runtime, "forgotten")
    out_of_band.out_of_band = True
    out_of_band.turn_id = 2
    await session.send("hidden", out_of_band)
    await session.send("hidden", HiddenChunk(turn_id=2, response_id="r2", token_ids=(104,), final=True))
    await session.send("hidden", TurnDone(turn_id=2, response_id="r2"))
    await collect(session)

    history = next(iter(talker_session.sessions.values())).history
    text = runtime.resources["omni"].tokenizer.decode(torch.cat([s.token_ids for s in history.segments]))
    assert "kept" in text and "forgotten" not in text
    await session.close()


async def test_reply_tokens_that_arrive_after_their_interrupt_are_not_spoken(runtime):
    session = await runtime.open_session("s")
    await session.send("hidden", prompt_chunk(runtime))
    session.control(Interrupt(turn_id=1, response_id="r1"))  # barge-in before the talker saw the reply
    await session.send("hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(104, 105)))
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1", status="cancelled"))

    out = await collect(session)

    assert [type(m) for m in out] == [TurnDone, TurnDone]
    # The next turn speaks normally.
    await session.send("hidden", prompt_chunk(runtime, "again"))
    await session.send("hidden", HiddenChunk(turn_id=2, response_id="r2", token_ids=(104, 105), final=True))
    await session.send("hidden", TurnDone(turn_id=2, response_id="r2"))
    out = await collect(session)
    assert sum(len(m.samples) for m in out if isinstance(m, AudioOut)) == 4 * 1920 - 555
    await session.close()


async def test_sessions_speaking_at_once_each_get_the_audio_they_get_alone(runtime):
    async def speak(session_id, voice, text):
        session = await runtime.open_session(session_id, config={"voice": voice})
        await session.send("hidden", prompt_chunk(runtime, text))
        await session.send("hidden", HiddenChunk(turn_id=1, response_id="r", token_ids=(104, 105, 106), final=True))
        await session.send("hidden", TurnDone(turn_id=1, response_id="r"))
        out = await collect(session)
        await session.close()
        return np.concatenate([m.samples for m in out if isinstance(m, AudioOut)])

    alone = [await speak("a", "chelsie", "first"), await speak("b", "aiden", "second one")]
    together = await asyncio.gather(speak("c", "chelsie", "first"), speak("d", "aiden", "second one"))

    # Batched float32 matmuls round differently from one row alone (up to ~3e-5 here). 1e-4 is
    # about three steps of 16-bit audio; audio mixed up between sessions differs by far more.
    for mine, reference in zip(together, alone):
        assert mine.shape == reference.shape
        assert np.allclose(mine, reference, rtol=0, atol=1e-4)


async def test_reply_params_override_the_talkers_sampling_and_frame_budget(runtime):
    session = await runtime.open_session("s")
    reply = ReplyParams(response_id="r1", voice="aiden", sampling={"talker_max_new_tokens": 3, "seed": 5})
    await session.send("hidden", prompt_chunk(runtime))
    await session.send(
        "hidden", HiddenChunk(turn_id=1, response_id="r1", token_ids=(104, 105, 106, 107), reply=reply)
    )
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1"))

    out = await collect(session)

    assert len([m for m in out if isinstance(m, CodecFrames) and len(m.codes)]) == 3  # not 2 x 4 tokens
    await session.close()


async def test_a_text_only_reply_passes_its_turn_done_through_without_audio(runtime):
    session = await runtime.open_session("s")
    await session.send("hidden", prompt_chunk(runtime))
    await session.send("hidden", TurnDone(turn_id=1, response_id="r1", usage=Usage(output_tokens=4)))

    out = await collect(session)

    assert [type(m) for m in out] == [TurnDone, TurnDone]
    assert out[-1].usage.output_tokens == 4 and out[-1].usage.output_audio_tokens == 0
    await session.close()
