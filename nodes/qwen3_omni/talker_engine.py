"""The streaming talker: thinker tokens in, codec frames out, one frame per step.

`model.generate()` runs the whole thinker reply first and only then the talker. Here the talker
starts after the reply's FIRST token and produces one codec frame (all `num_code_groups` codes:
the talker's first code + the code predictor's residual codes) per step, doing exactly the
computations `generate()` does, in a streamable order (tests/model/test_generate_equivalence.py
shows identical frames with greedy settings):

* Prefill = talker-space embeddings of every USER turn of the conversation (not the system
  prompt, not earlier replies) + a fixed 9-position assistant block: the assistant header's
  text, 4 x tts_pad, tts_bos and the reply's first token, summed with codec specials
  (nothink, think_bos, think_eos, speaker id, codec_pad, codec_bos).
  In user turns, audio/image/video positions use the thinker's layer-`accept_hidden_layer`
  hidden states through `hidden_projection`; every text position uses the thinker's token
  embedding through `text_projection`. generate() rebuilds all of this from one full prompt;
  a session cannot (the thinker's KV cache holds no hidden states), so `TalkerHistory`
  (talker_history.py) keeps each user turn's talker-space embeddings, captured at its prefill.
* Step s >= 1 feeds the sum of the previous frame's code embeddings plus reply token s through
  `text_projection`. The reply's LAST token (the EOS, or the token where the thinker stopped)
  is replaced by tts_eos, then tts_pad follows until the talker emits codec EOS. So step s
  needs token s+1 or the end-of-reply marker: one token of lookahead.
* Frame f is complete after the talker has seen reply tokens 0..f.

Shared model state is left alone: positions are passed explicitly (so `talker.rope_deltas` is
never read or written) and the code predictor is driven directly (its
`generation_config.do_sample` is neither read nor written), so replies of many sessions can
interleave on one model. `step_replies` steps the replies of many sessions at once: the prefills
that start together as one forward (`prefill_replies`: padded at their ends, at most
`PREFILL_BATCH_TOKENS` padded positions a forward, the rest in the next; a lone prefill, or one
with image/video positions, runs alone on its reply's own cache), one talker decode forward for
all (each reply's decode KV is a row of a shared slot cache, rows of different lengths side by
side: talker_slots.py), one pick of all their talker codes (talker_sampling.py: transformers'
processors as batched tensor ops) and one batched code predictor (it starts afresh every frame
with the same shapes for every reply: code_predictor.py). The forwards skip transformers'
per-call wrappers (lean_decode.py, lean_layers.py): the same numbers bit for bit, but for a
decode step's dense experts (float rounding).

Random-weight checkpoints never emit codec EOS; `TalkerLimits` bounds a reply (frames per
text token, max frames). A real checkpoint stops on codec EOS and keeps only `max_frames` as a
safety net.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration,
)

from nodes.qwen3_omni.captured import FrameUnit
from nodes.qwen3_omni.slot_cache import padded_group
from nodes.qwen3_omni.talker_history import ASSISTANT_HEADER_TOKENS, TalkerHistory
from nodes.qwen3_omni.talker_model import TalkerModel
from nodes.qwen3_omni.talker_sampling import CodeHistory, check_settings, residual_codes, talker_codes
from nodes.qwen3_omni.talker_slots import TalkerSlots

__all__ = [
    "TalkerHistory",
    "TalkerLimits",
    "TalkerModel",
    "TalkerReply",
    "TalkerSampling",
    "decode_inputs",
    "frame_unit",
    "prefill_replies",
    "prefill_user_turns",
    "step_replies",
    "talker_positions",
]

# Stands for an end-of-sequence token the caller did not pass; it is never embedded (the last
# token of the text is always read as tts_eos).
_EOS_PLACEHOLDER = -1


@dataclass
class TalkerSampling:
    """How the talker picks codes. Defaults are `generate()`'s talker defaults.

    `do_sample=False` is greedy for both the talker and the code predictor (what the
    equivalence test and the tiny profile use). With sampling, the code predictor samples
    with top_k=50, top_p=0.8, as `generate()` does.
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    seed: int | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> TalkerSampling:
        params = dict(params or {})
        unknown = set(params) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown talker sampling parameters: {sorted(unknown)}")
        return cls(**params)


@dataclass
class TalkerLimits:
    """Bounds on one reply's frames (12.5 frames = 1 s of audio).

    `max_frames`: hard cap (`generate()`'s `talker_max_new_tokens` - 1); hit only if the talker
    never emits codec EOS. `max_frames_per_token`: after the text ended, stop once the reply has
    this many frames per reply token; for random weights (which never emit codec EOS) so that a
    reply is as long as its text. None disables either bound.
    """

    max_frames: int | None = 4095
    max_frames_per_token: float | None = None

    def frame_budget(self, reply_tokens: int | None) -> int | None:
        """Frames allowed for a reply of `reply_tokens` tokens (None: text not finished yet)."""
        budget = self.max_frames
        if self.max_frames_per_token is not None and reply_tokens is not None:
            per_token = math.ceil(self.max_frames_per_token * reply_tokens)
            budget = per_token if budget is None else min(budget, per_token)
        return budget


class TalkerReply:
    """One reply's talker state. Feed text with `add_text`, pull frames with `step`.

    Not thread-safe: one worker runs its steps one at a time. `cancel()` may be called from any
    thread; the next `step` then returns None without computing (so an interrupt stops the
    talker within one frame).
    """

    def __init__(
        self,
        talker: TalkerModel,
        history: TalkerHistory,
        header_ids: torch.Tensor | list[int],
        speaker: str | None = None,
        sampling: TalkerSampling | None = None,
        limits: TalkerLimits | None = None,
    ):
        self.talker = talker
        self.history = history
        self.speaker = speaker
        self.speaker_id = talker.speaker_id(speaker)
        self.sampling = sampling or TalkerSampling()
        self.limits = limits or TalkerLimits()
        header = torch.as_tensor(header_ids, dtype=torch.long).reshape(-1).cpu()
        if header.numel() < ASSISTANT_HEADER_TOKENS:
            raise ValueError("the assistant header must hold <|im_start|>assistant and one more token")
        self._header = header[:ASSISTANT_HEADER_TOKENS]
        # Text the talker reads one token per step: header tokens past the third, then the reply.
        self._text: list[int] = header[ASSISTANT_HEADER_TOKENS:].tolist()
        self._header_extra = len(self._text)
        self._eos_appended = False
        self.text_final = False
        self.frames = 0
        self.finished = False
        self.finish_reason: str | None = None
        self._cancelled = False
        self.prefill_cache: DynamicCache | None = None  # the prefill's KV (what the history keeps)
        self.slot: int | None = None  # the decode steps' KV row in the shared TalkerSlots
        self.slot_release: Any = None
        self.last_hidden: torch.Tensor | None = None  # talker output at the last position [1, 1, D] (the code predictor reads it)
        self.next_embeds: torch.Tensor | None = None  # summed code embeddings of the last frame [1, 1, D]
        self.last_position: torch.Tensor | None = None  # [4, 1, 1]
        self.code_history = CodeHistory(talker.vocab_size, talker.device)  # repetition penalty input
        self.prefill_tokens = 0  # positions the prefill put through the talker (new user turns + block)
        self._generator = None
        if self.sampling.do_sample and self.sampling.seed is not None:
            self._generator = torch.Generator(device=talker.device).manual_seed(self.sampling.seed)
        check_settings(self.sampling)  # where the processors used to be built (and refused bad settings)

    # ------------------------------------------------------------------ text in

    @property
    def reply_tokens(self) -> int:
        """Reply tokens received so far (an end-of-sequence token the caller did not pass is not one)."""
        return len(self._text) - self._header_extra - int(self._eos_appended)

    def add_text(self, token_ids: list[int] | tuple[int, ...], final: bool = False, eos: bool = False) -> None:
        """Reply tokens as the thinker samples them; `final` when the reply's text has ended.

        The last token of the text is not spoken: `generate()` replaces it by tts_eos. A reply
        that ended on an end-of-sequence token the caller does not pass (`eos=True`) is spoken
        whole; one cut by a bound (`final` without `eos`) loses its last token, as in `generate()`.
        """
        if self.text_final and (token_ids or final and eos):
            raise ValueError("text added after the reply's final token")
        self._text.extend(int(t) for t in token_ids)
        if final and eos:
            self._text.append(_EOS_PLACEHOLDER)
            self._eos_appended = True
        self.text_final = self.text_final or final

    def cancel(self) -> None:
        self._cancelled = True

    # ------------------------------------------------------------------ frames out

    def ready(self) -> bool:
        """Whether `step` can run now (False: it waits for more text), or has finished."""
        if self.finished or self._cancelled:
            return True
        if self.prefill_cache is None:
            return len(self._text) >= 1 or self.text_final
        # Step s reads text s; it needs text s+1 (or the end marker) to know whether s is the last.
        return self.text_final or len(self._text) > self.frames + 1

    def step(self) -> torch.Tensor | None:
        """Compute the next frame: codes [num_code_groups], or None when the reply has ended.

        Call only when `ready()`. Runs one talker forward and the code predictor.
        """
        result = step_replies([self])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _next_phase(self) -> str | None:
        """What the next step does: "prefill", "decode", or None when the reply has ended."""
        if self._cancelled:
            self._finish("cancelled")
        if self.finished:
            return None
        if not self.ready():
            raise RuntimeError("talker step needs more text (check ready() first)")
        budget = self.limits.frame_budget(self.reply_tokens if self.text_final else None)
        if budget is not None and self.frames >= budget:
            self._finish("frame_limit")
            return None
        if self.prefill_cache is not None:
            return "decode"
        if not self._text or self._text[0] == _EOS_PLACEHOLDER:  # the reply ended before its first token
            self._finish("empty")
            return None
        return "prefill"

    def _accept(self, first_code: int) -> bool:
        """Record the talker's code; False when it is codec EOS (the reply ends, no frame)."""
        self.code_history.add(first_code)
        if first_code == self.talker.codec_eos_id:
            self._finish("eos")
            return False
        return True

    def _finish(self, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self.finish_reason = reason
            self.prefill_cache = None  # free the KV cache now; the reply object may live on
            TalkerSlots.leave(self)

    # ------------------------------------------------------------------ compute

    def _text_input(self, step: int) -> int | torch.Tensor:
        """What step `step` reads: reply token `step` (its id: `decode_inputs` embeds the tokens of
        all replies at once), tts_eos [1, 1, D] for the last token, then tts_pad."""
        last = len(self._text) - 1
        if step < last:
            return self._text[step]
        if step == last:
            return self.talker.tts_eos
        return self.talker.tts_pad

    @torch.inference_mode()
    def prefill_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill: embeddings [1, L, D] (user turns + assistant block) and positions [4, 1, L]."""
        talker = self.talker
        header_text = talker.text_embeds(self._header).unsqueeze(0)  # [1, 3, D]
        first_text = talker.text_embeds(torch.tensor(self._text[:1])).unsqueeze(0)
        assistant_text = torch.cat((header_text, talker.tts_pad.expand(1, 4, -1), talker.tts_bos, first_text), dim=1)
        codec = talker._assistant_codec.clone()
        codec[:, 3] = talker.talker.get_input_embeddings()(torch.tensor([self.speaker_id], device=talker.device))
        zeros = torch.zeros((1, ASSISTANT_HEADER_TOKENS, codec.shape[-1]), device=talker.device, dtype=codec.dtype)
        assistant = assistant_text + torch.cat((zeros, codec), dim=1)

        segments = self.history.segments
        embeds = torch.cat([*(segment.embeds for segment in segments), assistant[0]], dim=0).unsqueeze(0)
        assistant_ids = torch.full((assistant.shape[1],), talker.tts_pad_id, dtype=torch.long)
        talker_ids = torch.cat([*(segment.token_ids for segment in segments), assistant_ids]).unsqueeze(0)
        return embeds, self._prefill_positions(talker_ids)

    def _prefill_prompt(self) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
        """What the prefill puts through the talker, embeddings [1, n, D] and positions [4, 1, n]
        (past the user turns whose KV the history kept), and the KV it starts from: that kept KV,
        taken from the history, or an empty cache."""
        embeds, positions = self.prefill_inputs()
        cache, cached = self.history.take_kv()
        if cache is None:
            cache = DynamicCache(config=self.talker.talker.config.text_config)
        return embeds[:, cached:], positions[..., cached:], cache

    def _prefill(self, prompt: tuple[torch.Tensor, torch.Tensor, DynamicCache] | None = None) -> torch.Tensor:
        """The prefill alone (on the reply's own cache) -> codec logits [1, vocab]."""
        embeds, positions, cache = prompt or self._prefill_prompt()
        self.prefill_cache = cache
        logits = self._forward(embeds, positions)
        self._prefilled(cache, embeds.shape[1])
        return logits

    def _prefilled(self, cache: DynamicCache, positions: int) -> None:
        """The prefill of `positions` new positions is in `cache`: the reply decodes next, and its
        history keeps that KV (its first `user_length` positions) for the next reply."""
        self.prefill_cache = cache
        self.prefill_tokens = positions
        self.history.keep(cache, self.history.user_length)

    def _prefill_positions(self, talker_ids: torch.Tensor) -> torch.Tensor:
        return talker_positions(self.talker, self.history, talker_ids)

    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = self.last_position + 1
        out = self.talker.talker.model(inputs_embeds=embeds, position_ids=positions, cache=self.prefill_cache, use_cache=True)
        hidden = out.last_hidden_state
        self.last_hidden = hidden[:, -1:]
        self.last_position = positions[..., -1:]
        return self.talker.talker.codec_head(hidden)[:, -1, :].to(copy=True, dtype=torch.float32)


def talker_positions(talker: TalkerModel, history: TalkerHistory, talker_ids: torch.Tensor) -> torch.Tensor:
    """[4, 1, L] positions of the talker ids [1, L]: the text row, then the 3 rope rows (3-D only
    around images). Positions run left to right, so a prefix's positions do not depend on what
    follows it."""
    length = talker_ids.shape[1]
    text = torch.arange(length, device=talker.device).unsqueeze(0)
    if history.image_grids or history.video_grids:
        rope, _ = Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index(
            talker.rope_view,
            talker_ids,
            torch.cat(history.image_grids) if history.image_grids else None,
            torch.cat(history.video_grids) if history.video_grids else None,
            torch.ones_like(talker_ids),
            False,
            torch.cat(history.audio_feature_lengths) if history.audio_feature_lengths else None,
            None,
        )
        rope = rope.to(talker.device)
    else:
        rope = text.unsqueeze(0).expand(3, -1, -1)
    return torch.cat([text[None, ...], rope], dim=0)


@torch.inference_mode()
def prefill_user_turns(history: TalkerHistory, max_positions: int | None = None) -> int:
    """Put the user turns that are new since the kept KV through the talker now, before a reply
    asks for them, so the reply's own prefill is only its 9-position assistant block (less time to
    first audio). At most `max_positions` per call (a slice of a long turn: call again while it
    returns a whole slice; a reply's prefill takes whatever is left). Returns the positions
    computed. Needs `history.keep_kv`."""
    if not history.keep_kv or not history.segments:
        return 0
    talker = history.talker
    cache, cached = history.take_kv()
    users = history.user_length
    end = users if max_positions is None else min(users, cached + max_positions)
    if cached < end:
        if cache is None:
            cache = DynamicCache(config=talker.talker.config.text_config)
        embeds = torch.cat([segment.embeds for segment in history.segments])[cached:end].unsqueeze(0)
        ids = torch.cat([segment.token_ids for segment in history.segments]).unsqueeze(0)
        positions = talker_positions(talker, history, ids)[..., cached:end]
        talker.talker.model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True)
    history.keep(cache, end)
    return end - cached


@torch.inference_mode()
def step_replies(replies: list[TalkerReply]) -> list[torch.Tensor | None | BaseException]:
    """One step of many replies (of any sessions) at once: their next frames, in order.

    Prefills that start together run as few batched forwards as fit `PREFILL_BATCH_TOKENS`
    (`prefill_replies`). Decode steps run as one batched talker forward over the replies' rows of
    the shared slot cache (a reply joins it at its first decode step, or at its prefill when that
    ran in a group); the talker codes of all replies are picked at once (talker_sampling.py), and
    the code predictor, which starts afresh every frame with the same shapes for everyone, runs
    batched too (code_predictor.py). With `compute: {graphs: auto}` (the talker's `graphs`) the
    decode frames are instead one captured unit: the talker step, its codes and the code
    predictor's, one host read (captured.py; the prefilled replies' frames stay on this path).
    A reply whose own work fails gets its exception back alone.
    """
    results: list[torch.Tensor | None | BaseException] = [None] * len(replies)
    prefilling: list[int] = []
    decoding: list[int] = []
    for index, reply in enumerate(replies):
        try:
            phase = reply._next_phase()
            if phase == "prefill":
                prefilling.append(index)
            elif phase == "decode":
                decoding.append(index)
        except Exception as exc:  # noqa: BLE001 - fails that reply's session only
            results[index] = exc
    prefilled: dict[int, torch.Tensor] = {}  # index -> logits [1, V]
    for index, logits in zip(prefilling, prefill_replies([replies[index] for index in prefilling])):
        if isinstance(logits, BaseException):
            results[index] = logits
        else:
            prefilled[index] = logits
    if decoding:
        batch = [replies[index] for index in decoding]
        unit = _frame_unit(batch)
        if unit is not None:  # the decode frames as one captured unit (captured.py)
            try:
                _captured_frames(unit, batch, decoding, results)
            except Exception as exc:  # noqa: BLE001 - the unit failed for all its replies
                for index in decoding:
                    results[index] = exc
            decoding = []
    decoded: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits [B, V], hidden [B, 1, D])
    if decoding:
        try:
            batch = [replies[index] for index in decoding]
            decoded = TalkerSlots.for_model(batch[0].talker).forward(batch, decode_inputs(batch))
        except Exception as exc:  # noqa: BLE001 - the forward failed for all its replies
            for index in decoding:
                results[index] = exc
    rows = sorted([*prefilled, *decoding]) if decoded is not None else sorted(prefilled)
    if not rows:
        return results
    if decoded is not None and not prefilled:
        logits, hidden = decoded
    else:
        by_index = dict(prefilled)
        if decoded is not None:
            by_index.update((index, decoded[0][row : row + 1]) for row, index in enumerate(decoding))
        logits, hidden = torch.cat([by_index[index] for index in rows]), None
    codes, picked = _talker_codes([replies[index] for index in rows], logits, results, rows)
    started = [row for row, index in enumerate(rows) if codes[row] is not None and replies[index]._accept(codes[row])]
    if not started:
        return results
    started_replies = [replies[rows[row]] for row in started]
    if picked is not None and len(started) == len(rows):
        first = picked
    else:
        first = torch.tensor([codes[row] for row in started], device=logits.device)
    if hidden is None or len(started) != len(rows):
        hidden = torch.cat([reply.last_hidden for reply in started_replies])
    try:
        frames, next_embeds = started_replies[0].talker.code_predictor.predict(
            hidden, first, lambda _group, scores: residual_codes(started_replies, scores)
        )
    except Exception as exc:  # noqa: BLE001 - the code predictor failed for all its replies
        for row in started:
            results[rows[row]] = exc
        return results
    frames = frames.to("cpu", torch.long)
    for row, reply in enumerate(started_replies):
        reply.next_embeds = next_embeds[row : row + 1]
        reply.frames += 1
        results[rows[started[row]]] = frames[row]
    return results


def frame_unit(talker: TalkerModel) -> FrameUnit | None:
    """The talker's captured frame unit (made at the first call), None with `compute: {graphs: off}`."""
    if talker.graphs == "off":
        return None
    if talker.frame_unit is None:
        talker.frame_unit = FrameUnit(talker, TalkerSlots.for_model(talker))
    return talker.frame_unit


def _frame_unit(replies: list[TalkerReply]) -> FrameUnit | None:
    """The talker's captured frame unit when `compute: {graphs: auto}` and it can take these
    decode steps; None: the eager path."""
    unit = frame_unit(replies[0].talker)
    return unit if unit is not None and unit.usable(replies) else None


def _captured_frames(unit: FrameUnit, replies: list[TalkerReply], indices: list[int], results: list[Any]) -> None:
    """One frame of `replies` (all decoding) through `unit`: their codes accepted as the eager
    path accepts them (a codec EOS ends its reply with no frame), one host read for all."""
    codes, next_embeds, hidden, positions = unit.run(replies)
    codes = codes if codes.device.type == "cpu" else codes.to("cpu")  # the frame's one host read
    listed = codes.tolist()  # (of a host tensor: no second read)
    for row, (reply, index) in enumerate(zip(replies, indices)):
        reply.last_hidden = hidden[row : row + 1, None]
        reply.last_position = positions[:, row : row + 1, None]
        if not reply._accept(listed[row][0]):
            continue
        reply.next_embeds = next_embeds[row : row + 1, None]
        reply.frames += 1
        results[index] = codes[row]


# The padded positions (rows x longest) one talker forward of several replies' prefills may hold;
# the rest go in the next forward. As the thinker's: it bounds one forward's activations and how
# long that forward holds the compute worker.
PREFILL_BATCH_TOKENS = 1024


@torch.inference_mode()
def prefill_replies(replies: list[TalkerReply]) -> list[torch.Tensor | BaseException]:
    """The prefills of `replies` (each in phase "prefill"): each reply's codec logits [1, vocab], or
    the exception that failed it.

    One reply: alone, on its own cache (`TalkerReply._prefill`, as before batching). Several:
    their prompts are built reply by reply (a reply whose input fails, fails alone); then, longest
    first, as many as fit in `PREFILL_BATCH_TOKENS` padded positions go through one forward
    (`TalkerSlots.prefill`: same logits, last hidden state and kept KV as alone, to float
    rounding), the rest in the next forward (a group of one: alone). A failed forward fails its
    group. A reply whose history has image/video grids (3-D rope positions) is prefilled alone.
    """
    results: list[torch.Tensor | BaseException] = [None] * len(replies)  # type: ignore[list-item]
    prompts: dict[int, tuple[torch.Tensor, torch.Tensor, DynamicCache]] = {}
    for index, reply in enumerate(replies):
        try:
            if len(replies) == 1 or reply.history.image_grids or reply.history.video_grids:
                results[index] = reply._prefill()
            else:
                prompts[index] = reply._prefill_prompt()
        except Exception as exc:  # noqa: BLE001 - fails that reply's session only
            results[index] = exc
    waiting = sorted(prompts, key=lambda index: -prompts[index][0].shape[1])
    while waiting:
        places = padded_group([prompts[index][0].shape[1] for index in waiting], PREFILL_BATCH_TOKENS)
        group = [waiting[place] for place in places]
        chosen = set(places)
        waiting = [index for place, index in enumerate(waiting) if place not in chosen]
        try:
            if len(group) == 1:
                logits = replies[group[0]]._prefill(prompts[group[0]])
            else:
                batch = [replies[index] for index in group]
                logits = TalkerSlots.for_model(batch[0].talker).prefill(batch, [prompts[index] for index in group])
                for reply, index in zip(batch, group):
                    embeds, _, cache = prompts[index]
                    reply._prefilled(cache, embeds.shape[1])
        except Exception as exc:  # noqa: BLE001 - the forward failed for all its replies
            for index in group:
                results[index] = exc
            continue
        for row, index in enumerate(group):
            results[index] = logits[row : row + 1]
    return results


def decode_inputs(replies: list[TalkerReply]) -> torch.Tensor:
    """The decode steps' inputs [B, 1, D]: each reply's last frame's code embeddings + what its
    step reads. The reply tokens of all the replies go through the text projection in one call."""
    talker = replies[0].talker
    texts = [reply._text_input(reply.frames) for reply in replies]
    tokens = [text for text in texts if isinstance(text, int)]
    if tokens:
        embedded = talker.text_embeds(torch.tensor(tokens)).unsqueeze(1)  # [n, 1, D]
        if len(tokens) == len(texts):
            text = embedded
        else:
            embedded_rows = iter(embedded)  # [1, D] each, in the order of `tokens`
            text = torch.cat([next(embedded_rows)[None] if isinstance(t, int) else t for t in texts])
    else:
        text = torch.cat(texts)
    return torch.cat([reply.next_embeds for reply in replies]) + text


def _talker_codes(
    replies: list[TalkerReply], logits: torch.Tensor, results: list[Any], indices: list[int]
) -> tuple[list[int | None], torch.Tensor | None]:
    """The talker code of each reply (and as a tensor [B]), all at once; if that fails, reply by
    reply (no tensor), so that only the reply whose pick fails gets the exception (None: see
    `results`)."""
    suppress = replies[0].talker.suppress_mask
    try:
        picked = talker_codes(replies, logits, suppress)
        return picked.tolist(), picked
    except Exception:  # noqa: BLE001
        pass
    codes: list[int | None] = []
    for row, (reply, index) in enumerate(zip(replies, indices)):
        try:
            codes.append(int(talker_codes([reply], logits[row : row + 1], suppress)[0]))
        except Exception as exc:  # noqa: BLE001
            results[index] = exc
            codes.append(None)
    return codes, None
