"""The streaming loop reproduces `model.generate()` exactly (greedy), turn after turn.

The loop is the serving path: `ThinkerSession` (persistent KV, one turn's tokens per prefill),
`TalkerReply` (starts after the first reply token, one frame per step), `Code2WavStream` (chunks
with left context). `generate()` is the reference: it runs the whole thinker, then the whole
talker, then decodes everything at once. Same text tokens, same codec frames, same waveform
(float64, so that "same" can mean ~1e-12 rather than float32 rounding).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import numpy as np
import pytest
import torch

from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream
from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.media_encoders import encode_turns
from nodes.qwen3_omni.model import OmniModel
from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerLimits, TalkerModel, TalkerReply, TalkerSampling
from nodes.qwen3_omni.thinker_engine import ThinkerSession

REPLY_TOKENS = 6
REPLY_FRAMES = 9


@pytest.fixture(scope="module")
def omni(tiny_checkpoint) -> OmniModel:
    omni = OmniModel.load(tiny_checkpoint)
    omni.model.set_experts_implementation("eager")  # the grouped-mm MoE kernel has no float64
    omni.model.to(torch.float64)
    omni.dtype = torch.float64
    return omni


def picture(seed: int) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((64, 64, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def speech(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


class Conversation:
    """The serving loop, driven by hand: thinker -> talker -> code2wav, token by token."""

    def __init__(self, omni: OmniModel, speaker: str | None = None):
        self.omni = omni
        self.thinker = ThinkerSession(omni, max_reply_tokens=REPLY_TOKENS)
        self.talker_model = TalkerModel(omni.model)
        self.history = TalkerHistory(self.talker_model)
        self.decoder = Code2WavDecoder(omni.code2wav)
        self.speaker = speaker
        self.prompt_ids: list[int] = []  # the whole conversation, as generate() will be given it
        self.features: list[torch.Tensor] = []
        self.images: list[tuple[torch.Tensor, torch.Tensor]] = []

    def user_turn(self, text: str | None, audio: np.ndarray | None, system_prompt: str | None = None, images=None):
        turn = build_turn_inputs(
            self.omni, text=text, audio=audio, images=images, system_prompt=system_prompt, add_generation_prompt=True
        )
        encoded = encode_turns(self.omni, [turn.tensors()])[0]
        prefill = self.thinker.prefill(encoded)
        for part in prefill.user_parts:
            self.history.add_user_part(part.token_ids, part.multimodal_hidden)
        lengths = torch.tensor(turn.audio_feature_lengths) if turn.audio_feature_lengths else None
        self.history.add_grids(turn.image_grid_thw, None, lengths)
        self.prompt_ids += self.thinker.context_ids[len(self.prompt_ids) :]
        self.features += turn.audio_features
        if turn.pixel_values is not None:
            self.images.append((turn.pixel_values, turn.image_grid_thw))
        return self._reply()

    def _reply(self):
        reply = TalkerReply(
            self.talker_model,
            self.history,
            self.omni.tokens.assistant_header,
            speaker=self.speaker,
            sampling=TalkerSampling(do_sample=False),
            limits=TalkerLimits(max_frames=REPLY_FRAMES),
        )
        stream = Code2WavStream(self.decoder, first_chunk_frames=1, chunk_frames=4)
        tokens, frames, audio = [], [], []
        frames_before_last_token = None
        with talker_inputs(self.omni.model) as inputs:
            while not reply.finished:
                if reply.ready():
                    frame = reply.step()
                    if frame is not None:
                        frames.append(frame)
                        audio.append(stream.push(frame[None]))
                    continue
                step = self.thinker.decode_step()
                if step.token_id is not None:
                    tokens.append(step.token_id)
                if frames_before_last_token is None and step.finish_reason is not None:
                    frames_before_last_token = len(frames)
                reply.add_text([step.token_id] if step.token_id is not None else [],
                               final=step.finish_reason is not None, eos=step.finish_reason == "stop")
        audio.append(stream.push(torch.empty(0, self.talker_model.num_code_groups, dtype=torch.long), final=True))
        self.history.add_reply(tokens)
        self.prompt_ids += tokens
        return tokens, torch.stack(frames), torch.cat(audio), frames_before_last_token, inputs

    def generate(self, eos_token_ids):
        """model.generate() on the whole conversation so far (+ the pending closing of the last reply)."""
        model = self.omni.model
        audio_inputs = {}
        if self.features:
            lengths = [f.shape[-1] for f in self.features]
            input_features = torch.zeros(len(lengths), self.features[0].shape[0], max(lengths), dtype=torch.float64)
            mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
            for i, features in enumerate(self.features):
                input_features[i, :, : lengths[i]] = features
                mask[i, : lengths[i]] = 1
            audio_inputs = {"input_features": input_features, "feature_attention_mask": mask}
        if self.images:
            audio_inputs["pixel_values"] = torch.cat([pixels for pixels, _ in self.images]).to(torch.float64)
            audio_inputs["image_grid_thw"] = torch.cat([grid for _, grid in self.images])
        captured = []
        decode = model.code2wav.chunked_decode
        model.code2wav.chunked_decode = lambda codes, **kw: captured.append(codes) or decode(codes, **kw)
        with talker_inputs(model) as inputs:
            try:
                sequences, waveform = model.generate(
                    input_ids=torch.tensor([self.generate_prompt]),
                    **audio_inputs,
                    speaker=self.speaker or "Ethan",
                    thinker_max_new_tokens=REPLY_TOKENS,
                    thinker_eos_token_id=sorted(eos_token_ids),
                    thinker_do_sample=False,
                    talker_max_new_tokens=REPLY_FRAMES + 1,  # the last talker token never gets its residual codes
                    talker_do_sample=False,
                )
            finally:
                del model.code2wav.chunked_decode
        reply = sequences[0, len(self.generate_prompt) :].tolist()
        return reply, captured[0][0].T, waveform[0, 0], inputs


@contextlib.contextmanager
def talker_inputs(model):
    """Records what every talker forward is fed: (inputs_embeds [L, D], position_ids [4, L])."""
    calls = []

    def record(module, args, kwargs):
        calls.append((kwargs["inputs_embeds"][0].clone(), kwargs["position_ids"][:, 0].to(torch.float64)))

    handle = model.talker.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def assert_same_reply(streamed, reference, eos_token_ids, decoder):
    tokens, frames, audio, _, inputs = streamed
    ref_tokens, ref_frames, ref_audio, ref_inputs = reference
    assert tokens == [t for t in ref_tokens if t not in eos_token_ids]
    # The talker reads the same inputs, position by position: the text alignment (reply token s at
    # step s, tts_eos, tts_pad) shows here, even where the tiny talker's codes would not change.
    # generate() runs one more forward (its last code gets no residuals); a later turn's stream
    # starts after the user turns whose talker KV it kept.
    embeds, positions = (torch.cat(parts, dim=-2 if i == 0 else -1) for i, parts in enumerate(zip(*inputs)))
    ref_embeds, ref_positions = (torch.cat(parts, dim=-2 if i == 0 else -1) for i, parts in enumerate(zip(*ref_inputs)))
    # (~1e-9 at a later turn's audio positions: generate() prefills the whole prompt and encodes all
    # clips in one padded batch, the thinker engine only the new turn; a misplaced token is ~1e-2.)
    start = ref_embeds.shape[0] - 1 - embeds.shape[0]
    assert (embeds - ref_embeds[start:-1]).abs().max() < 1e-7
    assert torch.equal(positions, ref_positions[:, start:-1])
    assert torch.equal(frames, ref_frames)
    assert audio.shape == ref_audio.shape
    # generate() hands its waveform back as float32; its float64 decode is what the stream must equal.
    assert (audio - decoder.decode_all(ref_frames)).abs().max() < 1e-12
    assert (audio - ref_audio.double()).abs().max() < 1e-6


def test_one_spoken_turn_streams_exactly_what_generate_produces(omni):
    chat = Conversation(omni)
    streamed = chat.user_turn("what is this?", speech(1.2, seed=1), system_prompt="You are a helpful voice assistant.")
    chat.generate_prompt = chat.prompt_ids[: len(chat.prompt_ids) - len(streamed[0])]

    assert_same_reply(streamed, chat.generate(omni.tokens.eos), omni.tokens.eos, chat.decoder)
    assert len(streamed[0]) == REPLY_TOKENS and len(streamed[1]) == REPLY_FRAMES
    # The talker did not wait for the whole reply: it had frames out before the thinker's last token.
    assert streamed[3] >= REPLY_TOKENS - 2


def test_the_second_turn_reuses_the_first_users_talker_embeddings(omni):
    chat = Conversation(omni, speaker="chelsie")
    first = chat.user_turn(None, speech(0.8, seed=2), system_prompt="Be brief.")
    second = chat.user_turn("and then?", speech(0.6, seed=3))
    # generate() sees the whole conversation: turn 1, reply 1 closed with <|im_end|>\n, turn 2.
    chat.generate_prompt = chat.prompt_ids[: len(chat.prompt_ids) - len(second[0])]
    assert chat.generate_prompt.count(omni.tokens.audio_start) == 2 and first[0]

    assert_same_reply(second, chat.generate(omni.tokens.eos), omni.tokens.eos, chat.decoder)


def test_a_turn_with_an_image_streams_exactly_what_generate_produces(omni):
    """Image positions reach the talker with 3-D rotary positions (its own get_rope_index)."""
    chat = Conversation(omni)
    streamed = chat.user_turn("what is in the picture?", None, images=[picture(seed=4)])
    chat.generate_prompt = chat.prompt_ids[: len(chat.prompt_ids) - len(streamed[0])]

    assert_same_reply(streamed, chat.generate(omni.tokens.eos), omni.tokens.eos, chat.decoder)


def test_a_turn_with_an_image_and_speech_is_spoken_though_generate_cannot(omni):
    """transformers' talker.get_rope_index reads an audio window its config lacks, so generate()
    fails on such a turn; the stream computes the same positions with the thinker's audio window."""
    chat = Conversation(omni)
    tokens, frames, audio, _, _ = chat.user_turn("and this?", speech(0.7, seed=5), images=[picture(seed=6)])
    chat.generate_prompt = chat.prompt_ids[: len(chat.prompt_ids) - len(tokens)]
    with pytest.raises(AttributeError, match="audio_config"):
        chat.generate(omni.tokens.eos)

    assert len(frames) == REPLY_FRAMES and len(audio) == REPLY_FRAMES * 1920 - 555
    reply = TalkerReply(chat.talker_model, chat.history, omni.tokens.assistant_header)
    reply.add_text(tokens[:1])
    _, positions = reply.prefill_inputs()
    image_rows = positions[1:, 0, torch.tensor(chat.prompt_ids)[: positions.shape[-1]] == omni.tokens.image_pad]
    assert not torch.equal(image_rows[1], image_rows[2])  # height and width positions differ: 3-D


def test_a_reply_ending_on_eos_is_spoken_whole(omni):
    """generate() replaces the EOS by tts_eos; the stream gets `eos=True` instead of the token."""
    probe = Conversation(omni)
    probe_tokens = probe.user_turn("tell me a story", None)[0]
    # Pretend a greedy token that first appears 4th is an end-of-sequence token.
    eos = next(t for i, t in enumerate(probe_tokens) if i >= 3 and t not in probe_tokens[:i])
    spoken = probe_tokens.index(eos)
    eos_omni = dataclasses.replace(omni.tokens, eos=frozenset({eos}))
    original = omni.tokens
    omni.tokens = eos_omni
    try:
        chat = Conversation(omni)
        streamed = chat.user_turn("tell me a story", None)
        chat.generate_prompt = chat.prompt_ids[: len(chat.prompt_ids) - len(streamed[0])]
        reference = chat.generate({eos})
    finally:
        omni.tokens = original
    assert reference[0][-1] == eos and len(streamed[0]) == spoken
    assert_same_reply(streamed, reference, {eos}, chat.decoder)
