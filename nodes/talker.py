"""Talker node: the thinker's reply tokens -> codec frames, streamed one frame at a time.

    talker: {type: qwen3_omni.talker, params: {resource: omni, sampling: {do_sample: false},
                                               voices: {alloy: ethan}, max_frames_per_token: 8,
                                               max_reply_frames: 4096, max_batch: 16, batch_linger_ms: 2,
                                               keep_user_kv: true}}

Input `hidden` (from the thinker), in order:
  * a `TalkerPrompt(token_ids=<the prefilled ids>)` for every thinker prefill, with either
      - `user_parts`: the prefill's `TalkerUserPart`s (`ThinkerSession.prefill(...).user_parts`:
        token_ids, multimodal_hidden), or
      - `mm_hidden`: [n_mm, H] layer-`accept_hidden_layer` hidden states at the prefill's
        audio/image positions (the talker then finds the user messages itself),
    plus `image_grid_thw` / `video_grid_thw` / `audio_feature_lengths` when the turn had them.
    The talker keeps the user turns' talker-space embeddings (`TalkerHistory`): every later
    reply's prefill starts with them. The new user turns go through the talker at once, before
    the reply asks for them, in slices of `USER_PREFILL_SLICE` positions, each its own compute
    call: a long turn never holds the compute worker for more than one slice. With `history` the prompt is the thinker's whole
    rebuilt history instead (its user parts and grids; `token_ids` = the context from its last
    `<|im_start|>`): the talker starts over from it (`TalkerHistory.restart`).
  * reply chunks `HiddenChunk(response_id=R, token_ids=(t, ...), final=...)`: the reply's tokens
    as the thinker samples them. The first may carry `reply` (`ReplyParams`: voice;
    `sampling` keys seed, talker_temperature / top_k / top_p / repetition_penalty /
    max_new_tokens; for speech requests `max_output_tokens` = frames) or `voice`; else
    the session config's `voice` is used. The final
    chunk's `finish_reason == "stop"` says the reply ended on EOS (spoken whole);
    otherwise its last token is not spoken, as in `generate()` (it reads tts_eos there).
  * the reply's `TurnDone` (it also ends the reply's text if no final chunk came).
Output `codes`: one `CodecFrames` per frame as soon as it is computed, an empty
`CodecFrames(final=True)` after the last one, then the `TurnDone` (with the frame count added to
its usage as `output_audio_tokens`).

The talker starts after the reply's first token and then needs one token of lookahead; it runs
in its own task so the thinker's chunks never wait for it. Each frame is one call of the shared
`talker` executor: frames wanted at the same time run as one batch (one talker forward and one
code predictor pass for all; speech requests at lower priority than live sessions). An `Interrupt`
makes the next frame not run (the talker stops within one frame).

KV: a reply's decode steps run on a row of the talker's shared slot cache
(nodes/qwen3_omni/talker_slots.py). Where the model's `kv_cache` says so (the default on CUDA)
that cache is allocated here at start: one row per session the profile's limits admit, each as
long as a reply's row can get (every user position of a full thinker context, the assistant
block and `max_reply_frames`), and never grows; admission counts its rows (`kv_rows`). The user
turns' KV kept between replies (`keep_user_kv`, `TalkerHistory`) is still allocated per session
as it grows, outside that budget.

Voices: a voice names one of the checkpoint's speakers (case-insensitive), or an alias from the
`voices` param; an unknown voice falls back to the default speaker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from graph.executor import continuation_due
from graph.messages import CodecFrames, Control, HiddenChunk, Interrupt, Message, ReplyParams, TalkerPrompt, TurnDone
from graph.limits import SessionLimits
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.idle_capture import defer_to_idle_compute
from nodes.params import TalkerParams, as_dict, decode, given
from nodes.qwen3_omni.slot_cache import sessions_at_start
from nodes.qwen3_omni.talker_slots import TalkerSlots
from nodes.qwen3_omni.talker_engine import (
    TalkerHistory,
    TalkerLimits,
    TalkerModel,
    TalkerReply,
    TalkerSampling,
    prefill_user_turns,
    frame_unit,
    step_replies,
)

log = logging.getLogger(__name__)

# Positions of new user turns put through the talker per compute call (as the thinker's
# PREFILL_CHUNK_TOKENS: a slice of a long turn, other sessions' work between slices).
USER_PREFILL_SLICE = 256
# A reply row's positions past its user turns and frames: the assistant block (9) and the frames'
# text lookahead, with room to spare.
ASSISTANT_BLOCK_RESERVE = 64


@register_node("qwen3_omni.talker")
class TalkerNode(Node):
    params_schema = TalkerParams
    inputs = {"hidden": (TalkerPrompt, HiddenChunk, TurnDone)}
    outputs = {"codes": (CodecFrames, TurnDone)}
    follows_playback = True  # reply side: scheduled by the session's playback deadline

    def __init__(self, name: str, params: dict[str, Any], context: Any):
        super().__init__(name, params, context)
        self.settings = settings = decode(self.params, TalkerParams, f"nodes.{name}.params")
        self.sampling = TalkerSampling.from_params(as_dict(settings.sampling))
        self.voices = {str(k).lower(): str(v).lower() for k, v in (settings.voices or {}).items()}
        self.keep_user_kv = settings.keep_user_kv  # nodes/params.py says what it costs
        self.model: TalkerModel | None = None
        self.steps: Any = None
        self.omni: Any = None
        self.limits = TalkerLimits()
        self.sessions: dict[str, TalkerSession] = {}  # live sessions (for inspection and metrics)
        self._kv_rows: int | None = None  # rows of the slot cache when it was allocated at start

    async def start(self) -> None:
        settings = self.settings
        self.omni = self.context.resource(settings.resource)
        if getattr(self.omni, "talker", None) is None:
            raise ValueError("the checkpoint has no talker (audio output disabled)")
        # `compute: {graphs}`: decode frames as one captured unit (auto) or eager (off).
        graphs = getattr(self.context, "graphs", "auto")
        self.model = await self.context.compute.run(TalkerModel, self.omni.model, graphs)
        # One shared executor: the frames that sessions want at the same time run as one batch.
        # batch_linger_ms: with fewer replies queued than its last batch, the batch waits this long for the
        # rest (the compute worker runs other work meanwhile).
        self.steps = self.context.compute.batcher("talker", step_replies, max_batch=settings.max_batch,
                                                  linger_s=settings.batch_linger_ms / 1000.0)
        bounds = getattr(self.omni, "bounds", None)
        self.limits = TalkerLimits(
            max_frames=_optional_int(given(settings.max_reply_frames, getattr(bounds, "max_reply_frames", 4095))),
            max_frames_per_token=_optional_float(
                given(settings.max_frames_per_token, getattr(bounds, "max_frames_per_token", None))
            ),
        )
        if getattr(self.omni, "kv_at_start", False):
            limits = getattr(self.context, "limits", None) or SessionLimits()
            context = limits.max_seq_len or getattr(bounds, "max_seq_len", None) or 32768
            capacity = context + (self.limits.max_frames or 4096) + ASSISTANT_BLOCK_RESERVE
            slots = TalkerSlots.for_model(self.model, slots=sessions_at_start(limits), capacity=capacity, grow=False)
            self._kv_rows = None if slots.cache.grow else slots.cache.slots
        # After the KV allocated at start: the frame unit reads the slot cache, and would make a
        # growing one if none were there yet.
        unit = frame_unit(self.model)
        if unit is not None:  # a batch size's frames are captured in idle compute, not in a reply's frame
            unit.defer = defer_to_idle_compute(self.context.compute, "talker frame")

    def kv_rows(self) -> int | None:
        return self._kv_rows


    def keep_warm(self):
        """The talker's decoder layers over 8 positions (no cache kept)."""
        model = self.model
        assert model is not None
        embeds = model.text_embeds(torch.full((8,), model.tts_pad_id, dtype=torch.long, device=model.device)).unsqueeze(0)
        return torch.inference_mode()(lambda: model.talker.model(inputs_embeds=embeds, use_cache=False))

    def open_session(self, session: SessionInfo) -> NodeSession:
        state = TalkerSession(self, session)
        self.sessions[session.session_id] = state
        return state

    def speaker_for(self, voice: str | None) -> str:
        """The checkpoint speaker a session/reply voice names (default speaker when unknown)."""
        assert self.model is not None
        if voice:
            name = self.voices.get(voice.lower(), voice.lower())
            if name in self.model.speakers:
                return name
            log.info("voice %r is not a speaker of this checkpoint; using %r", voice, self.model.default_speaker)
        return self.model.default_speaker


class TalkerSession(NodeSession):
    node: TalkerNode

    def __init__(self, node: TalkerNode, session: SessionInfo):
        super().__init__(node, session)
        assert node.model is not None, "talker node not started"
        self.history = TalkerHistory(node.model, keep_kv=node.keep_user_kv)
        self._reply: TalkerReply | None = None
        self._reply_key: tuple[int, str] | None = None
        self._speaking: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._rollback: Any = None  # history snapshot to return to after an out-of-band reply
        self._interrupts: list[Interrupt] = []  # for turns whose reply tokens may still be on their way

    # ------------------------------------------------------------------ inputs

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        self._raise_if_failed()
        if isinstance(message, TalkerPrompt):
            await self._add_prompt(message)
        elif isinstance(message, HiddenChunk):
            self._add_reply_tokens(message, emit)
        elif isinstance(message, TurnDone):
            await self._finish_reply(message, emit)

    def on_control(self, control: Control) -> None:
        if not isinstance(control, Interrupt):
            return
        if control.turn_id >= 0 or control.response_id:
            self._interrupts.append(control)  # also stops a reply of that turn whose tokens arrive later
        if self._reply is not None and self._reply_key is not None:
            if control.names(*self._reply_key):
                self._reply.cancel()
                self._wake.set()

    async def close(self) -> None:
        self.node.sessions.pop(self.session.session_id, None)
        if self._reply is not None:
            self._reply.cancel()
        if self._speaking is not None:
            self._speaking.cancel()
            await asyncio.gather(self._speaking, return_exceptions=True)

    async def _add_prompt(self, chunk: TalkerPrompt) -> None:
        if chunk.out_of_band and self._rollback is None:
            self._rollback = self.history.snapshot()  # undone at that reply's TurnDone
        compute = self.node.context.compute
        if chunk.user_parts is not None:
            # Bookkeeping only (the embeddings are projected in the reply's prefill): not a unit of
            # compute of its own, which would put each of several turns that end together through
            # the talker one after the other instead of in one batched prefill.
            self._add_prompt_now(chunk)
        else:
            await compute.run(self._add_prompt_now, chunk)
        # A reply right behind this prompt (an utterance that brought its reply): its own prefill
        # takes the new user turn in with its assistant block, one forward (as the direct path
        # does), unless the turn is long enough to need slices.
        history = self.history
        if chunk.reply_follows and history.user_length - history.kv_length <= USER_PREFILL_SLICE:
            return
        # Otherwise, while the thinker works on its first token, the talker takes the new user
        # turns in, so the reply's own talker prefill is just its 9-position assistant block.
        # A slice short of USER_PREFILL_SLICE was the last: no call more (one would wait, as a
        # continuation, behind the thinker's whole reply and hold this reply's first frame).
        due = None
        while await compute.run(prefill_user_turns, self.history, USER_PREFILL_SLICE, due=due) >= USER_PREFILL_SLICE:
            due = continuation_due()  # the next slice goes after work waiting since before it

    def _add_prompt_now(self, chunk: TalkerPrompt) -> None:
        history = self.history
        grids = (chunk.image_grid_thw, chunk.video_grid_thw, chunk.audio_feature_lengths)
        if chunk.history:  # the thinker rebuilt its history: start over from all of it
            parts = [(_field(p, "token_ids"), _field(p, "multimodal_hidden")) for p in chunk.user_parts or ()]
            history.restart(parts, list(chunk.token_ids), *grids)
        elif chunk.user_parts is not None:  # the thinker picked the user messages out already
            for part in chunk.user_parts:
                history.add_user_part(_field(part, "token_ids"), _field(part, "multimodal_hidden"))
            history.track(list(chunk.token_ids))
            history.add_grids(*grids)
        else:
            ids = torch.as_tensor(chunk.token_ids, dtype=torch.long)
            history.add_prompt(ids, chunk.mm_hidden, *grids)

    def _add_reply_tokens(self, chunk: HiddenChunk, emit: Emit) -> None:
        key = (chunk.turn_id, chunk.response_id)
        if any(interrupt.names(*key) for interrupt in self._interrupts):
            self.history.add_reply(list(chunk.token_ids))
            return  # the reply was interrupted before the talker saw it: nothing to say
        if self._reply is None or self._reply_key != key:
            if self._speaking is not None and not self._speaking.done():
                raise RuntimeError("a new reply's tokens arrived before the previous reply's TurnDone")
            self._start_reply(chunk, key, emit)  # reads the assistant header: before the reply's tokens
        self.history.add_reply(list(chunk.token_ids))
        assert self._reply is not None
        if not self._reply.text_final:
            reason = chunk.finish_reason
            if chunk.final and reason is not None:
                self._reply.add_text(chunk.token_ids, final=True, eos=reason == "stop")
            else:  # a final chunk without a reason: the TurnDone right behind it says how the text ended
                self._reply.add_text(chunk.token_ids)
        self._wake.set()

    def _start_reply(self, chunk: HiddenChunk, key: tuple[int, str], emit: Emit) -> None:
        node = self.node
        assert node.model is not None
        params = chunk.reply
        voice = chunk.voice
        sampling, limits = node.sampling, node.limits
        if params is not None:
            voice = voice or params.voice
            sampling, limits = self._reply_settings(params)
        voice = voice or self.session.config.get("voice")
        header = self.history.assistant_header() or list(node.omni.tokens.assistant_header)
        self._reply = TalkerReply(
            node.model, self.history, header, speaker=node.speaker_for(voice), sampling=sampling, limits=limits
        )
        self._reply_key = key
        self._wake.clear()
        self._speaking = asyncio.get_running_loop().create_task(
            self._speak(self._reply, chunk, emit), name=f"{self.session.session_id}:talker"
        )

    def _reply_settings(self, params: ReplyParams) -> tuple[TalkerSampling, TalkerLimits]:
        """The node's talker settings with a reply's overrides: `seed` and sglang-omni's `talker_*`
        sampling keys; a speech request's `max_output_tokens` is its frame budget."""
        sampling, limits = self.node.sampling, self.node.limits
        overrides = {key[len("talker_") :]: value for key, value in params.sampling.items() if key in _TALKER_KEYS}
        if params.sampling.get("seed") is not None:
            overrides["seed"] = int(params.sampling["seed"])
        frames = overrides.pop("max_new_tokens", None)
        if self.session.kind == "speech" and params.max_output_tokens:
            frames = params.max_output_tokens
        if overrides:
            sampling = dataclasses.replace(sampling, **overrides)
        if frames is not None:
            cap = int(frames) if limits.max_frames is None else min(limits.max_frames, int(frames))
            limits = dataclasses.replace(limits, max_frames=cap)
        return sampling, limits

    async def _finish_reply(self, done: TurnDone, emit: Emit) -> None:
        reply = self._reply
        key = (done.turn_id, done.response_id)
        if reply is not None and self._reply_key == key:
            if done.status in ("cancelled", "failed"):
                reply.cancel()
            if not reply.text_final:  # the reply's text ends here (a completed reply ended on EOS)
                reply.add_text((), final=True, eos=done.status == "completed" and done.reason in (None, "stop"))
            self._wake.set()
            if self._speaking is not None:
                await self._speaking  # re-raises a failed frame: the session ends with an error
            done.usage.output_audio_tokens += reply.frames
            done.usage.output_tokens += reply.frames
            self._reply = None
            self._reply_key = None
            self._speaking = None
        if self._rollback is not None:
            self.history.restore(self._rollback)
            self._rollback = None
        self._interrupts = [i for i in self._interrupts if not i.names(*key)]
        await emit("codes", done)

    # ------------------------------------------------------------------ frames

    async def _speak(self, reply: TalkerReply, first: HiddenChunk, emit: Emit) -> None:
        while not reply.finished:
            if not reply.ready():
                self._wake.clear()
                if not reply.ready():
                    await self._wake.wait()
                continue
            frame = await self.node.steps.submit(reply)
            if frame is None:
                break
            await emit(
                "codes",
                CodecFrames(
                    turn_id=first.turn_id,
                    response_id=first.response_id,
                    media_ms=first.media_ms,
                    codes=frame.numpy().reshape(1, -1),
                ),
            )
        if reply.finish_reason != "cancelled":
            empty = np.zeros((0, reply.talker.num_code_groups), dtype=np.int64)
            await emit(
                "codes",
                CodecFrames(turn_id=first.turn_id, response_id=first.response_id, codes=empty, final=True),
            )

    def _raise_if_failed(self) -> None:
        task = self._speaking
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


_TALKER_KEYS = frozenset(
    {"talker_temperature", "talker_top_k", "talker_top_p", "talker_repetition_penalty", "talker_max_new_tokens"}
)


def _field(part: Any, name: str) -> Any:
    return part[name] if isinstance(part, dict) else getattr(part, name)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
