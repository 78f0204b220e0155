"""The thinker keeps each session's KV across turns: a new turn costs only its new tokens."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerError, ThinkerSession


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def turn(omni, *, first=False, reply=True, **content):
    inputs = build_turn_inputs(
        omni, system_prompt="You are terse." if first else None, add_generation_prompt=reply, **content
    )
    return encode_turns(omni, [inputs.tensors()])[0]


def run_reply(session: ThinkerSession) -> list[int]:
    tokens = []
    while (step := session.decode_step()).finish_reason is None:
        tokens.append(step.token_id)
    if step.token_id is not None:
        tokens.append(step.token_id)
    return tokens


def whole_history(omni, session: ThinkerSession, turns: list[dict]) -> dict:
    """One prefill input holding the session's entire context (as a fresh session would see it)."""
    merged: dict = {"input_ids": torch.tensor(session.context_ids)}
    for key in ("audio_embeds", "image_embeds", "image_grid_thw", "audio_feature_lengths"):
        parts = [t[key] for t in turns if key in t]
        if parts:
            merged[key] = torch.cat(parts)
    deepstack = [t["image_deepstack"] for t in turns if "image_deepstack" in t]
    if deepstack:
        merged["image_deepstack"] = [torch.cat(levels) for levels in zip(*deepstack)]
    return merged


def test_second_turn_prefills_only_its_new_tokens_and_matches_a_full_reprefill(omni):
    session = ThinkerSession(omni, max_reply_tokens=6)
    first = turn(omni, first=True, audio=speech(1.5), text="What is this?")
    session.prefill(first)
    reply = run_reply(session)
    assert len(reply) == 6
    context_after_reply = session.context_length
    assert context_after_reply == len(first["input_ids"]) + len(reply)  # the whole reply is in the cache

    second = turn(omni, images=[png(96, 64)], audio=speech(0.8, seed=1))
    forwarded_before = session.tokens_forwarded
    prefill = session.prefill(second)

    # Only the reply's closing (<|im_end|>\n) and this turn went through the model.
    closing = [omni.tokens.im_end, omni.tokens.newline]
    assert session.tokens_forwarded - forwarded_before == len(closing) + len(second["input_ids"])
    assert prefill.new_tokens == len(closing) + len(second["input_ids"])
    assert prefill.cached_tokens == context_after_reply
    assert session.reply_usage().cached_tokens == context_after_reply
    assert session.cache.get_seq_length() == session.context_length

    fresh = ThinkerSession(omni, max_reply_tokens=6)
    fresh.prefill(whole_history(omni, session, [first, second]))
    assert fresh.tokens_forwarded == session.context_length
    torch.testing.assert_close(session._last_logits, fresh._last_logits, atol=1e-5, rtol=1e-5)
    assert run_reply(session) == run_reply(fresh)


def test_usage_counts_the_whole_input_by_modality(omni):
    session = ThinkerSession(omni, max_reply_tokens=3)
    first = turn(omni, first=True, audio=speech(1.0), images=[png(64, 64)], text="hi")
    session.prefill(first)
    run_reply(session)
    usage = session.reply_usage()
    ids = first["input_ids"].tolist()
    assert usage.input_tokens == len(ids)
    assert usage.input_audio_tokens == ids.count(omni.tokens.audio_pad) == 13
    assert usage.input_image_tokens == ids.count(omni.tokens.image_pad) == 4
    assert usage.input_text_tokens == len(ids) - 13 - 4
    assert usage.cached_tokens == 0
    assert usage.output_tokens == 3


def test_greedy_steps_reproduce_stock_thinker_generate(omni):
    inputs = build_turn_inputs(omni, system_prompt="sys", audio=speech(1.2), text="hello", add_generation_prompt=True)
    session = ThinkerSession(omni, max_reply_tokens=8)
    prefill = session.prefill(encode_turns(omni, [inputs.tensors()])[0])
    mine = run_reply(session)

    input_ids = torch.tensor([inputs.input_ids])
    features = inputs.audio_features[0][None]
    feature_mask = torch.ones(1, features.shape[-1], dtype=torch.long)
    stock = omni.thinker.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        input_features=features,
        feature_attention_mask=feature_mask,
        max_new_tokens=8,
        do_sample=False,
    )
    assert mine == stock[0, input_ids.shape[1] :].tolist()

    # The talker's view of the user message: the accept-layer hidden states at the audio positions.
    with torch.no_grad():
        out = omni.thinker(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            input_features=features,
            feature_attention_mask=feature_mask,
            output_hidden_states=True,
        )
    layer = omni.config.talker_config.accept_hidden_layer
    (part,) = prefill.user_parts
    start = inputs.input_ids.index(omni.tokens.user) - 1  # the user message's <|im_start|>
    assert part.token_ids.tolist() == inputs.input_ids[start:-3]
    audio_positions = (input_ids[0] == omni.tokens.audio_pad).nonzero().flatten()
    torch.testing.assert_close(part.multimodal_hidden, out.hidden_states[layer][0, audio_positions], atol=1e-5, rtol=1e-5)


def test_truncate_keeps_only_the_heard_tokens_in_history_and_cache(omni):
    session = ThinkerSession(omni, max_reply_tokens=10)
    first = turn(omni, first=True, text="Tell me a story.")
    session.prefill(first)
    reply = run_reply(session)
    start = len(first["input_ids"])

    kept_text = session.truncate_reply(4)
    assert kept_text == omni.tokenizer.decode(reply[:4])
    assert session.context_ids == first["input_ids"].tolist() + reply[:4]
    assert session.cache.get_seq_length() == start + 4

    second = turn(omni, text="Go on.")
    session.prefill(second)
    assert session.context_ids[start + 4 : start + 6] == [omni.tokens.im_end, omni.tokens.newline]
    fresh = ThinkerSession(omni)
    fresh.prefill(whole_history(omni, session, [first, second]))
    torch.testing.assert_close(session._last_logits, fresh._last_logits, atol=1e-5, rtol=1e-5)


def test_a_turn_past_max_seq_len_fails_with_context_exhausted_and_changes_nothing(omni):
    first = turn(omni, first=True, text="hi")
    length = len(first["input_ids"])
    session = ThinkerSession(omni, max_seq_len=length + 6, max_reply_tokens=100)
    session.prefill(first)
    reply = run_reply(session)
    # The reply stops where only its closing still fits.
    assert session._reply.finish_reason == "context_exhausted"
    assert len(reply) == 4
    assert session.context_length + len(session.pending) == length + 6

    before = (list(session.context_ids), session.cache.get_seq_length(), list(session.pending))
    with pytest.raises(ThinkerError) as raised:
        session.prefill(turn(omni, text="one more thing"))
    assert raised.value.code == "context_exhausted"
    assert (session.context_ids, session.cache.get_seq_length(), session.pending) == before


def test_interleaved_sessions_with_images_keep_their_positions_apart(omni):
    def conversation(seed):
        return [
            turn(omni, first=True, images=[png(64, 96, seed)], text="what?"),
            turn(omni, images=[png(96, 64, seed + 1)], audio=speech(0.5, seed)),
        ]

    def alone(turns):
        session = ThinkerSession(omni, max_reply_tokens=4)
        replies = []
        for t in turns:
            session.prefill(t)
            replies.append(run_reply(session))
        return replies

    a_turns, b_turns = conversation(1), conversation(5)
    expected_a, expected_b = alone(a_turns), alone(b_turns)

    # Whatever the shared model-level `rope_deltas` holds, sessions neither read nor write it.
    stale = torch.tensor([[12345]])
    omni.thinker.model.rope_deltas = stale
    a = ThinkerSession(omni, max_reply_tokens=4)
    b = ThinkerSession(omni, max_reply_tokens=4)
    got_a, got_b = [], []
    for ta, tb in zip(a_turns, b_turns):
        a.prefill(ta)
        b.prefill(tb)
        ra, rb = [], []
        while a.replying or b.replying:
            for session, out in ((a, ra), (b, rb)):
                if session.replying:
                    step = session.decode_step()
                    if step.token_id is not None:
                        out.append(step.token_id)
        got_a.append(ra)
        got_b.append(rb)
    assert (got_a, got_b) == (expected_a, expected_b)
    # Image turns give positions that run behind token indices; the session tracks its own.
    assert a.next_position < a.context_length
    assert omni.thinker.model.rope_deltas is stale
    omni.thinker.model.rope_deltas = None


def test_interrupt_stops_the_reply_before_its_next_step(omni):
    session = ThinkerSession(omni, max_reply_tokens=50)
    session.prefill(turn(omni, first=True, text="talk"))
    session.decode_step()
    session.decode_step()
    forwarded = session.tokens_forwarded
    session.interrupt()
    step = session.decode_step()
    assert step.finish_reason == "interrupted" and step.token_id is None
    # No new token was chosen; the last one chosen joined the history (one forward).
    assert session.tokens_forwarded == forwarded + 1
    assert len(session.reply_token_ids) == 2
    assert session.context_ids[-2:] == session.reply_token_ids
    assert session.pending == [omni.tokens.im_end, omni.tokens.newline]


def test_out_of_band_reply_leaves_no_trace_in_the_history(omni):
    session = ThinkerSession(omni, max_reply_tokens=3)
    session.prefill(turn(omni, first=True, text="hi"))
    run_reply(session)
    before = (list(session.context_ids), list(session.pending), session.cache.get_seq_length())
    session.prefill(turn(omni, text="summarize"), out_of_band=True)
    assert len(run_reply(session)) == 3
    assert (session.context_ids, session.pending, session.cache.get_seq_length()) == before


def test_seeded_sampling_is_reproducible_per_session(omni):
    def sample(seed):
        # Hot: at temperature 1 the tiny model is all but sure of its one reply, whatever the seed.
        session = ThinkerSession(omni, Sampling(temperature=3.0, top_p=0.9, top_k=50, seed=seed), max_reply_tokens=12)
        session.prefill(turn(omni, first=True, text="hi"))
        return run_reply(session)

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_each_token_is_returned_before_the_forward_that_feeds_it(omni):
    session = ThinkerSession(omni, max_reply_tokens=3)
    session.prefill(turn(omni, first=True, text="hi"))
    forwarded = session.tokens_forwarded
    first = session.decode_step()  # straight from the prefill's logits: the talker can start now
    assert first.token_id is not None and session.tokens_forwarded == forwarded
    session.decode_step()
    assert session.tokens_forwarded == forwarded + 1
    last = session.decode_step()
    assert last.finish_reason == "length"
    # The reply is over: all three tokens are in the cache, the closing waits for the next turn.
    assert session.tokens_forwarded == forwarded + 3
    assert session.cache.get_seq_length() == session.context_length
    assert session.pending == [omni.tokens.im_end, omni.tokens.newline]


def test_a_character_split_over_two_tokens_is_streamed_once_whole(omni):
    from nodes.qwen3_omni.thinker_engine import _Reply

    session = ThinkerSession(omni)
    reply = _Reply(start=0)
    pieces = []
    for token in omni.tokenizer("hé!", add_special_tokens=False).input_ids:  # é is two byte tokens
        reply.token_ids.append(token)
        pieces.append(session._new_text(reply))
    assert pieces == ["h", "", "é", "!"]


def test_streamed_text_decodes_only_the_newest_tokens_and_adds_up_to_the_whole_reply(omni):
    from nodes.qwen3_omni.thinker_engine import _Reply

    session = ThinkerSession(omni)
    decoded_lengths: list[int] = []
    decode = session._decode

    def counting(ids):
        decoded_lengths.append(len(ids))
        return decode(ids)

    session._decode = counting
    text = "Hello there, how are you? Grüße, señor — ça va? " * 6
    reply = _Reply(start=0)
    streamed = ""
    for token in omni.tokenizer(text, add_special_tokens=False).input_ids:
        reply.token_ids.append(token)
        streamed += session._new_text(reply)
    assert len(reply.token_ids) > 100
    assert streamed == reply.text == decode(reply.token_ids) == text
    assert max(decoded_lengths) <= 4  # a window behind the newest token, not the whole reply
