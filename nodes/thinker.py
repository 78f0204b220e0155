"""Thinker: a session's conversation with persistent KV; streams the reply's text and tokens.

    thinker: {type: qwen3_omni.thinker, params: {resource: omni, max_seq_len: 32768,
                                                 max_reply_tokens: 2048, sampling: {temperature: 0},
                                                 max_batch: 64, batch_linger_ms: 2, kv_slots: 4, kv_capacity: 256,
                                                 warmup: true, max_transcript_tokens: 448}}

Input `embeddings` (`Embeddings` from the encoders, one per turn). Outputs:
- `text`: `TextDelta` per reply token that adds text (and a `NodeError` when a turn that
  asked for no reply cannot be added to the history; `TranscriptDelta`, `TranscriptCompleted`
  or `TranscriptFailed` for a user utterance marked `transcribe`: nodes/qwen3_omni/transcription.py, an out-of-band
  pass over the KV, rolled back, run only while no reply needs the thinker); `FunctionCall` per
  function call a reply made, whole, before its `TurnDone` (replies with `ReplyParams.tools`:
  decoding of a call is constrained to the tool's JSON schema, nodes/qwen3_omni/tool_calls.py; a
  call's tokens are neither text nor speech, and a reply that is a call from its first token —
  `tool_choice` `required` or a named function — sends the talker nothing);
- `hidden`, to the talker, in order:
  * after every prefill, a `TalkerPrompt` (graph/messages.py: token_ids = every token that went
    through the thinker, `mm_hidden` = the layer-`accept_hidden_layer` hidden state at each
    audio/image position, `user_parts` the same cut per user message (`TalkerUserPart`), the
    grids, `out_of_band`, `reply_follows`);
  * after a history rebuild (below), a `TalkerPrompt(history=True)` (user_parts, grids,
    token_ids = the context from its last `<|im_start|>`): the whole rebuilt history, which the
    talker starts over from;
  * per reply token `HiddenChunk(response_id, token_ids=(t,), final=<last>)`, the first one with
    `voice` and `reply`, the final one with `finish_reason` (the engine's: `stop` = EOS, the
    whole text is spoken) — only when the reply wants audio;
  * exactly one `TurnDone` per reply (status completed | incomplete | cancelled | failed, the
    transcript and token usage; `cached_tokens` = the context as it stood when the previous
    reply ended, all of it reused from the KV cache — this turn's input counts as input even
    when it was prefilled early, at commit).

The per-session `ThinkerSession` (nodes/qwen3_omni/thinker_engine.py) keeps the KV cache across
turns (its row of the model's shared slot cache): a turn prefills only its own tokens. Every model
call goes through the node's shared `ThinkerExecutor` (nodes/qwen3_omni/batched_thinker.py, a
batcher on the compute pool, `max_batch` calls per batch): the decode steps of all sessions that are ready at
the same moment run as ONE forward, and a new turn's prefill runs chunk by chunk between decode
steps (it holds in-flight replies for at most one chunk). When fewer sessions are queued than
the last batch held, the batch waits up to `batch_linger_ms` for the others to resubmit (the
first one back would otherwise start a batch of one). The KV slot cache is
allocated at start where the model's `kv_cache` says so (the default on CUDA): one row per
session the profile's limits admit (`kv_tokens // max_seq_len` per engine), each `max_seq_len`
plus a transcription pass long, and never grows (admission counts its rows: `kv_rows`); else it
starts at `kv_slots` x `kv_capacity` (4 x 256) and grows on demand. The event loop never computes, and an
`Interrupt` stops the reply before its next token. `thinker.model.rope_deltas` is never used
(positions are per session), so sessions interleave freely on one model.

Finish reasons -> TurnDone: EOS -> completed; the reply's `max_output_tokens` or the server's
`max_reply_tokens` -> incomplete (`max_output_tokens`); the context's `max_seq_len` -> incomplete
(`context_exhausted`); interrupt -> cancelled. A turn that does not fit the context fails with
`context_exhausted` and leaves the history as it was.

History edits (nodes/qwen3_omni/thinker_history.py): every turn carries the system message the
history must start with (`tensors["system_ids"]`); a different one than the history holds
replaces it before the turn. A turn with `meta.delete_key` removes that item (a reply's key is
its response id) and is nothing more; one with `meta.insert_after` goes after the first of
those items the history holds. Each keeps the KV up to the first changed position and
re-prefills the rest (the next reply's `cached_tokens` counts only the kept prefix); the talker
then gets the rebuilt history.

Truncation (`ReplyParams.truncation`, the session's `session.truncation`; a turn without a reply
follows the latest reply's mode): before a turn at the end of the history that would not fit
with its reply's reserve, and right after a reply when a turn like it would not (in the user's
pause), the oldest items leave the context (nodes/qwen3_omni/truncation.py), the KV is rebuilt
once and the talker gets the rebuilt history. Built ahead where it can be (nodes/qwen3_omni/
spare_row.py): once turns like the last would need a truncation within `TRUNCATION_LOOKAHEAD_TURNS`,
the kept items are re-prefilled into the engine's spare row at idle priority while turns go on;
built, it is caught up and adopted right after a reply; a turn that needs the room first waits
for the rest. Counted in `counters()` (`truncations`, `truncated_items`,
`truncation_rebuild_tokens`, `truncation_rebuild_ms`, `truncations_ahead`, `truncation_waits`)
and the unit trace.

Early prefill (server VAD, nodes/dialog.py): a turn with `meta.speculative` is a user
utterance sent during the pause before its turn ends, under a private item key, with its automatic
reply under a provisional response id. The thinker prefills it after a
`ThinkerSession.checkpoint()` exactly as an ordinary turn with its reply (utterance and assistant
header in one forward; the engine's reply, logits and sampling set) and tells no one (its talker
prompt chunk is held; no event; no transcript pass runs meanwhile). The next turn confirms it
(`meta.confirms`: a content-free turn with the real item id, the same reply under its real
response id, and transcript settings): both history keys take the real ids, the held chunk goes
out, and the reply decodes at once, with no forward before its first step (the utterance counts as
the reply's input, not cached); or retracts it (`meta.retracts`): `restore`, no forward, as if
it never came. An utterance whose prefill would rebuild the history (a new system prompt), failed,
or that a Truncate of the reply before it overtook, goes into the KV only at its confirm, as an
ordinary turn with the confirm's reply (a failure fails that reply with its code); a confirm
naming nothing held fails with `internal`; any other turn drops a held utterance (its confirm was
purged).

Truncate (`conversation.item.truncate`: the listener heard `audio_end_ms` of the reply): codec
frames last 80 ms (12.5 frames/s) and the talker has read reply tokens 0..f when it makes frame f,
so `ceil(audio_end_ms / 80)` heard frames bound the heard text to that many reply tokens. The reply
is cut to them in the history and the KV cache (an upper bound: the talker reads text 3-4x faster
than it speaks, so some unheard words may stay). It is applied before the session's next model call.

Speech requests (`meta.speak`) skip the thinker: the text's tokens go to the talker as the reply.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from graph.messages import (
    Control,
    Embeddings,
    FinishReason,
    FunctionCall,
    HiddenChunk,
    TalkerPrompt,
    Interrupt,
    Message,
    NodeError,
    NodeEvent,
    ReplyParams,
    ReplyStatus,
    TextDelta,
    Truncate,
    Truncation,
    TurnDone,
    Usage,
)
from graph.background import spawn
from graph.executor import PRIORITY_REALTIME, detach_from_playback
from graph.limits import SessionLimits
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.idle_capture import defer_to_idle_compute
from nodes.params import ThinkerParams, as_dict, decode, given
from nodes.qwen3_omni import spare_row
from nodes.qwen3_omni.batched_thinker import ThinkerExecutor
from nodes.qwen3_omni.slot_cache import sessions_at_start
from nodes.qwen3_omni.thinker_engine import Checkpoint, Prefill, Sampling, Step, ThinkerError, ThinkerSession
from nodes.qwen3_omni.tool_calls import ToolCallDecoder, ToolCallsUnavailable
from nodes.qwen3_omni.transcription import MAX_TRANSCRIPT_TOKENS, Transcriber

log = logging.getLogger(__name__)

# A truncation is built ahead in the spare row (spare_row.py) once turns like the last would need
# one within this many turns: time for the build to run in the pauses, at idle priority.
TRUNCATION_LOOKAHEAD_TURNS = 4
# Rows a slot cache allocated at start keeps beside the sessions' rows: the engine's spare.
SPARE_ROWS = 1

# A transcription pass's instruction (a user message and the assistant header), in tokens: with
# its transcript it goes on top of a full context, then is rolled back.
TRANSCRIPT_PROMPT_RESERVE = 64

# How each way a reply ends is reported (`response.done` status and reason); an interrupted one
# is `cancelled` (its own branch).
_STATUS: dict[FinishReason, tuple[ReplyStatus, str | None]] = {
    "stop": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "max_output_tokens": ("incomplete", "max_output_tokens"),
    "context_exhausted": ("incomplete", "context_exhausted"),
}


@register_node("qwen3_omni.thinker")
class Thinker(Node):
    params_schema = ThinkerParams
    inputs = {"embeddings": (Embeddings,)}
    outputs = {"text": (TextDelta, FunctionCall, NodeEvent), "hidden": (TalkerPrompt, HiddenChunk, TurnDone)}
    follows_playback = True  # reply side: scheduled by the session's playback deadline

    def __init__(self, name: str, params: dict[str, Any], context: Any):
        super().__init__(name, params, context)
        self.settings = decode(self.params, ThinkerParams, f"nodes.{name}.params")
        self.max_transcript_tokens = int(given(self.settings.max_transcript_tokens, MAX_TRANSCRIPT_TOKENS))
        # Early prefills by outcome since start: `early_prefill` (speculative utterances),
        # `early_prefill_confirmed`, `early_prefill_dropped` (retracted: the speaker went on).
        self.early_prefills: collections.Counter[str] = collections.Counter()
        # Context truncations since start (`truncations`, `truncated_items`), what their rebuilds
        # re-prefilled (`truncation_rebuild_tokens`) and how long they took, queueing included
        # (`truncation_rebuild_ms`): /metrics `sgl_omni_node_events`, beside the early prefills.
        self.truncations: collections.Counter[str] = collections.Counter()
        self._kv_rows: int | None = None  # rows of the slot cache when it was allocated at start
        # The one truncation being built ahead in the spare row, by one session at a time.
        self.spare: spare_row.SpareRow | None = None

    async def start(self) -> None:
        settings = self.settings
        self.omni = self.context.resource(settings.resource)
        bounds = self.omni.bounds
        self.max_seq_len = int(settings.max_seq_len or bounds.max_seq_len)
        self.max_reply_tokens = int(settings.max_reply_tokens or bounds.max_reply_tokens)
        self.sampling = Sampling.from_dict(as_dict(settings.sampling))
        code2wav = self.omni.config.code2wav_config
        upsample = math.prod(list(code2wav.upsample_rates) + list(code2wav.upsampling_ratios))
        self.frame_ms = 1000.0 * upsample / 24000.0
        self.executor = ThinkerExecutor(
            self.context.compute, self.omni, max_batch=settings.max_batch,
            linger_s=settings.batch_linger_ms / 1000.0, **self._kv_sizes(),
        )
        runner = self.executor.runner
        self._kv_rows = None if runner.cache.grow else runner.cache.slots - SPARE_ROWS
        # `compute: {graphs}`: greedy decode steps as one captured unit (auto) or eager (off);
        # the captures run as idle compute, never in a reply's step (captured_thinker.py).
        runner.graphs = getattr(self.context, "graphs", "auto")
        unit = runner.step_unit
        if unit is not None:
            unit.defer = defer_to_idle_compute(self.context.compute, "thinker step")
        if settings.warmup:
            await self.context.compute.run(self._warm_up)


    def _kv_sizes(self) -> dict[str, Any]:
        """The slot cache's rows and columns (slot_cache.py). Allocated at start (the model's
        `kv_at_start`): a row per session the profile's limits admit, each the longest context a
        session may reach (`max_seq_len`, and a transcription pass on top of it, which is rolled
        back), and the spare row a truncation is built in ahead (spare_row.py; admission does not
        count it). Growing: `kv_slots` x `kv_capacity` to start with (the spare is taken on
        demand). `kv_slots` / `kv_capacity` given in the params win either way (plus the spare)."""
        at_start = bool(getattr(self.omni, "kv_at_start", False))
        if at_start:
            slots = sessions_at_start(getattr(self.context, "limits", None) or SessionLimits())
            capacity = self.max_seq_len + self.max_transcript_tokens + TRANSCRIPT_PROMPT_RESERVE
        else:
            slots, capacity = 4, 256
        slots = given(self.settings.kv_slots, slots) + (SPARE_ROWS if at_start else 0)
        return {"slots": slots, "capacity": given(self.settings.kv_capacity, capacity),
                "grow": not at_start}

    def kv_rows(self) -> int | None:
        return self._kv_rows

    def _warm_up(self) -> None:
        """One short reply in a throwaway session: the first live turn pays no first-call costs."""
        from nodes.qwen3_omni.inputs import build_turn_inputs

        session = ThinkerSession(self.omni, max_reply_tokens=2)
        session.prefill(build_turn_inputs(self.omni, text="Hello.", add_generation_prompt=True).tensors())
        while session.decode_step().finish_reason is None:
            pass
        session.close()

    def open_session(self, session: SessionInfo) -> NodeSession:
        return ThinkerNodeSession(self, session)

    def counters(self) -> dict[str, int]:
        return {**self.early_prefills, **self.truncations}

    def keep_warm(self):
        """The thinker's decoder layers over 8 padding tokens (no cache kept)."""
        import torch

        text = self.omni.thinker.model
        ids = torch.full((1, 8), self.omni.tokens.newline, dtype=torch.long, device=self.omni.device)
        return torch.inference_mode()(lambda: text(input_ids=ids, use_cache=False))


@dataclass
class _Speculation:
    """A user utterance prefilled early with its automatic reply's header (`meta.speculative`),
    held until its turn is confirmed or retracted. `checkpoint` None: not in the KV (it goes in at
    the confirm, as an ordinary turn: see `_speculate`)."""

    key: str  # its private history key
    utterance: Embeddings  # with the provisional reply (`reply.response_id` its reply's history key)
    checkpoint: Checkpoint | None = None  # the session before it, for a retract
    chunk: TalkerPrompt | None = None  # its talker prompt, held back
    calls: ToolCallDecoder | None = None  # its reply's, as `_on_turn` makes it


class ThinkerNodeSession(NodeSession):
    node: Thinker

    def __init__(self, node: Thinker, session: SessionInfo):
        super().__init__(node, session)
        sampling = node.sampling
        if session.config.get("sampling"):
            sampling = Sampling.from_dict({**vars(node.sampling), **session.config["sampling"]})
        self.engine = ThinkerSession(
            node.omni, sampling, max_seq_len=node.max_seq_len, max_reply_tokens=node.max_reply_tokens
        )
        self.session_sampling = sampling
        self.reply_key: tuple[int, str] | None = None  # (turn_id, response_id) of the reply streaming now
        self.last_reply_key: tuple[int, str] | None = None
        self.pending_truncate: int | None = None  # heard reply tokens, applied before the next model call
        self.interrupted = False
        self.speculation: _Speculation | None = None
        # The session's truncation mode: as it opened, then as its latest reply says.
        self.truncation = msgspec.convert(session.config.get("truncation") or {}, Truncation)
        # The context length where what the next reply answers begins (after the last reply and
        # the truncation that followed it): `_truncate_ahead` sizes the next turn from it.
        self.turn_start: int | None = None
        self.spare: spare_row.SpareRow | None = None  # this session's truncation built ahead
        self.transcriber = Transcriber(self.engine, node.executor, node.context.compute,
                                       node.max_transcript_tokens)

    # ------------------------------------------------------------------ controls

    def on_control(self, control: Control) -> None:
        if isinstance(control, Interrupt) and self.reply_key is not None:
            if control.names(*self.reply_key):
                self.interrupted = True
                self.engine.interrupt()
        elif isinstance(control, Truncate):
            key = self.reply_key or self.last_reply_key
            if key is not None and control.names(*key):
                self.pending_truncate = max(0, math.ceil(control.audio_end_ms / self.node.frame_ms))
                if self.reply_key is not None:
                    self.interrupted = True
                    self.engine.interrupt()
        if isinstance(control, Interrupt) and self.reply_key is None:
            self.transcriber.reply_cancelled()  # the reply a transcript waits for may never come

    # ------------------------------------------------------------------ turns

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        if not isinstance(message, Embeddings) or message.meta.speak:
            await self._on_turn(stream, message, emit)
            return
        # A user transcript's pass in progress gives way first (nodes/qwen3_omni/transcription.py).
        await self.transcriber.give_way()
        meta = message.meta
        if meta.speculative:
            # No transcript pass runs while it is held (the pass would see the utterance): the
            # transcriber hears of the thinker again at the confirm or the retract.
            await self._speculate(message)
            return
        if meta.retracts is not None:
            if self.speculation is not None and self.speculation.key == meta.retracts:
                self._drop_speculation()
            self.transcriber.handled(message, emit, in_history=False)
            return
        if meta.confirms is not None:
            utterance, in_history = await self._confirm(message, self.transcriber.emit_for(message, emit))
            self.transcriber.handled(utterance, emit, in_history=in_history)
            return
        self._drop_speculation()  # held, but its confirm never came (an interrupt purged it)
        turns = self.engine.turns
        await self._on_turn(stream, message, self.transcriber.emit_for(message, emit))
        self.transcriber.handled(message, emit, in_history=self.engine.turns > turns)

    async def _on_turn(self, stream: str, message: Message, emit: Emit) -> None:
        if not isinstance(message, Embeddings):
            return
        if message.meta.speak:
            await self._speak(message, emit)
            return
        await self._apply_truncate()
        reply = message.reply
        calls: ToolCallDecoder | None = None
        if reply is not None:
            try:
                calls = ToolCallDecoder.for_reply(self.node.omni, reply.tools, reply.tool_choice, reply.parallel_tool_calls)
            except ToolCallsUnavailable as error:
                self.reply_key = None  # a confirm may have named it
                await emit("hidden", self._done(message, reply, "failed", "tools_unsupported", Usage()))
                await emit("text", NodeError(session_id=message.session_id, turn_id=message.turn_id,
                                             code="tools_unsupported", message=str(error), response_id=reply.response_id))
                return
            self.engine.set_sampling(self._sampling_for(reply))
            self.truncation = reply.truncation
            # From here on an Interrupt naming this reply reaches it, even during the prefill
            # (a confirm named it before this: one that came since then stands).
            if self.reply_key != (message.turn_id, reply.response_id):
                self.reply_key, self.interrupted = (message.turn_id, reply.response_id), False
        try:
            if await self._edit_history(message, emit):
                return
            await self._make_room(message, emit)
            prefill = await self._prefill(message, calls)
        except ThinkerError as error:
            await self._fail(message, error, emit)
            return
        if reply is not None and self.interrupted:
            self.engine.interrupt()  # it came while the prefill ran; the first step now stops
        if prefill.rebuilt:  # inserted before the end of the history
            await self._restart_talker(message, emit)
        else:
            await emit("hidden", self._prompt_chunk(message, prefill))
        if reply is not None:
            await self._reply(message, reply, emit, calls)

    async def _prefill(self, message: Embeddings, calls: ToolCallDecoder | None) -> Prefill:
        """Put the turn into the KV (and its reply's assistant header, when it has a reply)."""
        reply = message.reply
        return await self.node.executor.call(
            self.engine.prefill_work(
                message.tensors,
                reply=reply is not None,
                out_of_band=bool(reply and reply.out_of_band),
                max_reply_tokens=reply.max_output_tokens if reply is not None else None,
                calls=calls,
                key=message.item_id or (reply.response_id if reply is not None else None),
                reply_key=reply.response_id if reply is not None else None,
                insert_after=message.meta.insert_after,
                function_output=message.meta.role == "tool",
            ),
        )

    async def _fail(self, message: Embeddings, error: ThinkerError, emit: Emit) -> None:
        """The turn could not join the history: its reply fails with the error's code; a turn
        without reply gets an error notice."""
        if message.reply is not None:
            self.reply_key = None
            await emit("hidden", self._done(message, message.reply, "failed", error.code, Usage()))
        else:
            await emit("text", NodeError(session_id=message.session_id, turn_id=message.turn_id,
                                         code=error.code, message=error.message))

    # ------------------------------------------------------------------ early prefill

    async def _speculate(self, message: Embeddings) -> None:
        """Prefill a user utterance ahead of its commit, with its automatic reply's header, and tell
        no one: exactly the prefill of an ordinary turn with its reply (the KV takes the utterance
        under its private key, the header under the provisional response id, the engine's reply
        state is set: `restore` undoes all of it), its talker prompt chunk is held for the confirm.
        One whose prefill would rebuild the history (a new system prompt, an insertion), whose
        reply cannot have its tools or whose prefill fails is only held: it goes in at the confirm
        as any turn (a restore cannot undo a rebuild; a failure then fails the reply as usual)."""
        self._drop_speculation()  # one at a time (the dialog never sends a second)
        await self._apply_truncate()  # as before any prefill
        speculation = self.speculation = _Speculation(message.item_id, message)
        self.node.early_prefills["early_prefill"] += 1
        reply = message.reply
        system_ids = message.tensors.get("system_ids")
        if reply is None or message.meta.insert_after is not None or (
            system_ids is not None and self.engine.system_prompt_changes(system_ids)
        ) or self._room_needed(message, reply.truncation):
            return
        try:
            calls = ToolCallDecoder.for_reply(self.node.omni, reply.tools, reply.tool_choice, reply.parallel_tool_calls)
        except ToolCallsUnavailable:
            return
        mark = self.engine.checkpoint()
        self.engine.set_sampling(self._sampling_for(reply))
        try:
            if system_ids is not None:  # the history is empty or starts with it: only noted
                await self.node.executor.call(self.engine.system_prompt_work(system_ids))
            prefill = await self._prefill(message, calls)
        except ThinkerError:
            self.engine.restore(mark)
            return
        speculation.checkpoint, speculation.chunk, speculation.calls = mark, self._prompt_chunk(message, prefill), calls

    def _drop_speculation(self) -> None:
        """Forget the held early prefill: the session is as before it (no forward)."""
        speculation, self.speculation = self.speculation, None
        if speculation is not None:
            self.node.early_prefills["early_prefill_dropped"] += 1
            if speculation.checkpoint is not None:
                self.engine.restore(speculation.checkpoint)

    async def _confirm(self, message: Embeddings, emit: Emit) -> tuple[Embeddings, bool]:
        """The held early prefill `meta.confirms` names becomes this turn's committed utterance
        and its reply this turn's reply (`message.reply`: the same params, the real response id):
        the history keys take the turn's item and response ids, the held talker prompt chunk goes
        out and the reply decodes at once (no forward before its first step). One not in the KV
        goes in now as an ordinary turn. Returns the utterance as the transcriber sees it (this
        turn with the held utterance's audio) and whether it joined the history."""
        reply = message.reply
        if reply is not None:  # an Interrupt naming the reply reaches it from here on
            self.reply_key, self.interrupted = (message.turn_id, reply.response_id), False
        await self._apply_truncate()  # may take the held utterance out of the KV again (see there)
        key = message.meta.confirms
        speculation = self.speculation
        if speculation is None or speculation.key != key:
            self._drop_speculation()
            await self._fail(message, ThinkerError("internal", f"no early prefill {key!r} is held to confirm"), emit)
            return message, False
        self.speculation = None
        self.node.early_prefills["early_prefill_confirmed"] += 1
        utterance = msgspec.structs.replace(
            message, meta=msgspec.structs.replace(message.meta, audio_tokens=speculation.utterance.meta.audio_tokens)
        )
        if reply is None and speculation.checkpoint is not None:
            # The KV holds a reply header this turn must not have (the dialog sends no such confirm).
            self.engine.restore(speculation.checkpoint)
            speculation.checkpoint = None
        if speculation.checkpoint is None:
            turns = self.engine.turns
            await self._on_turn("embeddings", msgspec.structs.replace(
                speculation.utterance, item_id=message.item_id, turn_id=message.turn_id, media_ms=message.media_ms,
                reply=reply), emit)
            return utterance, self.engine.turns > turns
        held, chunk = speculation.utterance.reply, speculation.chunk
        assert reply is not None and held is not None and chunk is not None  # as `_speculate` left it
        self.engine.history.rename(key, message.item_id)
        self.engine.history.rename(held.response_id, reply.response_id)
        await emit("hidden", msgspec.structs.replace(chunk, turn_id=message.turn_id, media_ms=message.media_ms))
        if self.interrupted:
            self.engine.interrupt()  # it came meanwhile; the first step now stops
        await self._reply(message, reply, emit, speculation.calls)
        return utterance, True

    # ------------------------------------------------------------------ history edits

    async def _edit_history(self, message: Embeddings, emit: Emit) -> bool:
        """Before the turn: a new system prompt, a deletion (thinker_history.py); when they rebuilt
        the history, the talker restarts from it. True: the turn was a deletion and nothing more."""
        executor = self.node.executor
        rebuilt = False
        if message.tensors.get("system_ids") is not None:
            rebuilt = await executor.call(self.engine.system_prompt_work(message.tensors["system_ids"]))
        delete_key = message.meta.delete_key
        if delete_key is not None:
            rebuilt = await executor.call(self.engine.delete_work(delete_key)) or rebuilt
            if self.last_reply_key is not None and self.last_reply_key[1] == delete_key:
                self.last_reply_key = None  # a Truncate cannot name it any more
        if rebuilt:
            await self._restart_talker(message, emit)
        return delete_key is not None

    # ------------------------------------------------------------------ truncation

    def _incoming(self, message: Embeddings) -> int:
        """The tokens the turn needs in the context: its own, and its reply's reserve."""
        reply = message.reply
        ids = len(message.tensors["input_ids"])
        return ids + (self.engine.reply_reserve(reply.max_output_tokens) if reply is not None else 2)

    def _room_needed(self, message: Embeddings, mode: Truncation) -> bool:
        """Whether the turn would truncate the conversation first (no change)."""
        return self.engine.truncation_plan(mode, self._incoming(message)) > 0

    async def _make_room(self, message: Embeddings, emit: Emit) -> None:
        """Before a turn at the end of the history: the oldest items leave the context when the
        turn and its reply would not fit (nodes/qwen3_omni/truncation.py), the KV is rebuilt once
        and the talker restarts from it. Usually done already, right after the last reply
        (`_truncate_ahead`); this is the bound that always holds. What a reply answers (the items
        since the last reply) never leaves for it."""
        if message.meta.insert_after is not None:
            return  # an insertion re-prefills from its place anyway; it fits or fails as it did
        keep = self._since_last_reply() if message.reply is not None else 0
        count = self.engine.truncation_plan(self.truncation, self._incoming(message), keep_last=keep)
        if count > 0 and self.spare is not None:  # the turn waits for the rest of the build
            await self._adopt(message, emit)
            count = self.engine.truncation_plan(self.truncation, self._incoming(message), keep_last=keep)
        await self._truncate(message, count, emit)

    def _since_last_reply(self) -> int:
        """How many conversation items follow the last reply's in the history (all of them when
        the history holds no reply of this session's)."""
        conversation = self.engine.history.conversation(self.engine.context_length)
        key = self.last_reply_key[1] if self.last_reply_key is not None else None
        index = self.engine.history.index_of(key) if key is not None else None
        if index is None:
            return len(conversation)
        return sum(1 for i, _ in conversation if i > index)

    async def _truncate_ahead(self, message: Embeddings, usage: Usage, emit: Emit) -> None:
        """Right after a reply, in the user's pause: when a turn like this one's and its reply
        would not fit, the oldest items leave now (the KV rebuilt before the next turn comes,
        not on its way to first audio). The reply and the turn that asked for it stay."""
        # The turn is what the context gained since the last reply, not input less cached: after
        # a rebuild `cached_tokens` honestly counts the kept items as new, and a turn that large
        # would drop almost the whole conversation.
        if self.turn_start is not None:
            turn_tokens = max(0, usage.input_tokens - self.turn_start)
        else:  # the session's first reply (or its first since a resume): no rebuild came before it
            turn_tokens = max(0, usage.input_tokens - max(usage.cached_tokens, self.engine.instructions_length))
        incoming = turn_tokens + self.engine.reply_reserve(message.reply.max_output_tokens if message.reply else None)
        count = self.engine.truncation_plan(self.truncation, incoming, keep_last=2)
        spare = self.spare
        if spare is not None and (spare.closed or count > 0):
            await self._adopt(message, emit)  # the next turn would need it: now, in the pause
            count = self.engine.truncation_plan(self.truncation, incoming, keep_last=2)
        elif spare is not None:
            spare.grown.set()  # the build follows the turns until it is needed
        if count > 0:
            await self._truncate(message, count, emit)
        elif self.spare is None:
            self._build_ahead(incoming, turn_tokens + usage.output_tokens)

    # ------------------------------------------------------------------ truncation built ahead

    def _build_ahead(self, incoming: int, turn_tokens: int) -> None:
        """When turns like the last (`turn_tokens` each, reply included) would need a truncation
        within `TRUNCATION_LOOKAHEAD_TURNS`, plan the one the first such turn would make and build
        it in the engine's spare row at idle priority (spare_row.py), if no other session's build
        holds it. Built, it follows the turns (their items prefilled into it as they come, idle
        too); `_adopt` makes it the context when a truncation is needed: right after a reply, or
        before a turn that needs the room (which waits for the rest of the build)."""
        if self.node.spare is not None:
            return
        spare = spare_row.plan_ahead(self.engine, self.truncation, incoming, turn_tokens,
                                     turns=TRUNCATION_LOOKAHEAD_TURNS, keep_last=2)
        if spare is None:
            return
        self.spare = self.node.spare = spare
        spawn(self._build(spare), name="thinker-spare-row")

    async def _build(self, spare: spare_row.SpareRow) -> None:
        detach_from_playback()  # idle work: no reply's clocks
        try:
            await spare_row.build(spare, self.node.context.compute)
        except Exception:  # noqa: BLE001 - the truncation is then made in place, as without a spare
            log.debug("a truncation's build ahead failed", exc_info=True)
        if not spare.ready and self.node.spare is spare:
            self.node.spare = None  # free for another session's build; `_adopt` gives this one back

    async def _adopt(self, message: Embeddings, emit: Emit) -> None:
        """The session's truncation built ahead becomes its context (spare_row.py `adopt_work`:
        the catch-up of what came since the plan, then the rows swap); a turn that needs the
        room before the build is done waits for the rest, run at live priority from then on.
        A plan the history overtook is given back (the caller truncates in place if need be)."""
        spare = self.spare
        if spare is None:
            return
        spare.adopting = True
        if not spare.settled.is_set() and not spare.closed:
            # Live work from now on: at live priority, and in the usual prefill chunks (the build's
            # small ones bound what a live turn waits behind, but re-read the row's KV more often,
            # which costs more per token at long prefixes: docs/notebook/2026-12-08-long-builds.md).
            spare.priority = PRIORITY_REALTIME
            spare.chunk_tokens = self.engine.prefill_chunk_tokens
            if not spare.ready:
                self.node.truncations["truncation_waits"] += 1
            await spare.settled.wait()
        started, before = time.perf_counter(), self.engine.context_length
        result = None
        if spare.ready and not spare.closed:
            try:
                result = await self.node.executor.call(spare_row.adopt_work(spare))
            except ThinkerError:
                result = None
        self._give_back_spare()
        if result is None:
            return
        dropped, _ = result
        self.node.truncations["truncations_ahead"] += 1
        await self._counted(message, dropped, spare.tokens, spare.planned_at, spare.busy_s + time.perf_counter() - started,
                            before, emit)

    def _give_back_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.give_back()  # nothing to give once adopted
            if self.node.spare is spare:
                self.node.spare = None

    async def _truncate(self, message: Embeddings, count: int, emit: Emit) -> None:
        if count <= 0:
            return
        started, before = time.perf_counter(), self.engine.context_length
        tokens = await self.node.executor.call(self.engine.drop_oldest_work(count))
        await self._counted(message, count, tokens, started, time.perf_counter() - started, before, emit)

    async def _counted(self, message: Embeddings, count: int, tokens: int, started: float, cost_s: float,
                       before: int, emit: Emit) -> None:
        """After a truncation (`count` items left, `tokens` re-prefilled, `cost_s` of rebuild: the
        wall time in place, the build's compute and the catch-up's wall time ahead): counted,
        traced (from `started`: the plan, ahead), and the talker restarts from the rebuilt history."""
        ended = time.perf_counter()
        if self.turn_start is not None:  # what left was before the turn being made
            self.turn_start = max(0, self.turn_start - (before - self.engine.context_length))
        counts = self.node.truncations
        counts["truncations"] += 1
        counts["truncated_items"] += count
        counts["truncation_rebuild_tokens"] += tokens
        counts["truncation_rebuild_ms"] += round(1000 * cost_s)
        trace = getattr(self.node.context.compute, "trace", None)
        if trace is not None:
            trace.rebuild(message.session_id, started, ended, count, tokens)
        if self.last_reply_key is not None and self.engine.history.index_of(self.last_reply_key[1]) is None:
            self.last_reply_key = None  # it left the context: a Truncate cannot name it any more
        await self._restart_talker(message, emit)

    async def _restart_talker(self, message: Embeddings, emit: Emit) -> None:
        view = self.engine.talker_view()
        await emit(
            "hidden",
            TalkerPrompt(
                session_id=message.session_id,
                turn_id=message.turn_id,
                media_ms=message.media_ms,
                token_ids=tuple(view.tail_ids),
                history=True,
                user_parts=view.user_parts,
                image_grid_thw=view.image_grid_thw,
                audio_feature_lengths=view.audio_feature_lengths,
            ),
        )

    @staticmethod
    def _prompt_chunk(message: Embeddings, prefill) -> TalkerPrompt:
        reply = message.reply
        return TalkerPrompt(
            session_id=message.session_id,
            turn_id=message.turn_id,
            media_ms=message.media_ms,
            token_ids=tuple(prefill.token_ids),
            mm_hidden=prefill.multimodal_hidden,
            user_parts=prefill.user_parts,
            image_grid_thw=message.tensors.get("image_grid_thw"),
            audio_feature_lengths=message.tensors.get("audio_feature_lengths"),
            out_of_band=bool(reply and reply.out_of_band),
            reply_follows=reply is not None,  # its tokens come next
        )

    async def _reply(self, message: Embeddings, reply: ReplyParams, emit: Emit, calls: ToolCallDecoder | None) -> None:
        executor = self.node.executor
        base = {"session_id": message.session_id, "turn_id": message.turn_id, "media_ms": message.media_ms}
        # A reply that is a function call from its first token has nothing to say.
        wants_audio = "audio" in reply.output_modalities and not (calls is not None and calls.forced)
        first = True
        unsent: tuple[int, ...] = ()  # tokens whose text is held back (an incomplete UTF-8 sequence)
        spoken: list[str] = []  # the reply's text without its function calls
        try:
            while True:
                step = await executor.decode(self.engine)
                if step.call:  # a function call's token: neither text nor speech (sent whole below)
                    if step.finish_reason is None:
                        continue
                    step = Step(None, "", step.index, step.finish_reason)
                ids = () if step.token_id is None else (step.token_id,)
                unsent += ids
                if step.text:
                    spoken.append(step.text)
                    await emit("text", TextDelta(**base, response_id=reply.response_id, text=step.text, token_ids=unsent))
                    unsent = ()
                if wants_audio and (ids or step.finish_reason is not None):
                    opening = {"reply": reply, "voice": reply.voice or self.session.config.get("voice")} if first else {}
                    first = False
                    await emit(
                        "hidden",
                        HiddenChunk(**base, response_id=reply.response_id, token_ids=ids, **opening,
                                    finish_reason=step.finish_reason, final=step.finish_reason is not None),
                    )
                if step.finish_reason is not None:
                    break
        finally:
            self.last_reply_key = self.reply_key
            self.reply_key = None
        if step.finish_reason == "interrupted":
            status, reason = "cancelled", "interrupted"
        else:
            status, reason = _STATUS[step.finish_reason]
        usage = self.engine.reply_usage()
        transcript = self.engine.reply_text()
        if calls is not None:
            transcript = "".join(spoken)
            for index, (name, arguments) in enumerate(calls.finished):
                await emit("text", FunctionCall(**base, response_id=reply.response_id, index=index, name=name, arguments=arguments))
        await self._apply_truncate()
        await emit(
            "hidden",
            self._done(
                message,
                reply,
                status,
                reason,
                usage,
                transcript=transcript,
            ),
        )
        if status != "cancelled" and not reply.out_of_band:
            try:
                await self._truncate_ahead(message, usage, emit)
            except ThinkerError:
                pass  # the next turn's own `_make_room` decides again
        if not reply.out_of_band:
            self.turn_start = self.engine.context_length

    async def _apply_truncate(self) -> None:
        heard, self.pending_truncate = self.pending_truncate, None
        if heard is None:
            return
        speculation = self.speculation
        if speculation is not None and speculation.checkpoint is not None:
            # The reply to cut lies before the held utterance: out with it, to go in at its confirm.
            self.engine.restore(speculation.checkpoint)
            speculation.checkpoint = speculation.chunk = None
        await self.node.executor.call(self.engine.truncate_work(heard))

    async def _speak(self, message: Embeddings, emit: Emit) -> None:
        """A stateless speech request: the given text is the reply, spoken by the talker."""
        reply = message.reply or ReplyParams()
        base = {"session_id": message.session_id, "turn_id": message.turn_id, "media_ms": message.media_ms}
        prompt_ids = tuple(int(i) for i in message.tensors["input_ids"].tolist())
        reply_ids = tuple(int(i) for i in message.tensors["reply_ids"].tolist())
        await emit("hidden", TalkerPrompt(**base, token_ids=prompt_ids))
        voice = reply.voice or self.session.config.get("voice")
        await emit(
            "hidden",
            HiddenChunk(**base, response_id=reply.response_id, token_ids=reply_ids,
                        voice=voice, reply=reply, finish_reason="stop", final=True),
        )
        text_tokens = message.meta.text_tokens
        usage = Usage(input_tokens=text_tokens, input_text_tokens=text_tokens)
        await emit("hidden", self._done(message, reply, "completed", None, usage, transcript=message.meta.text))

    def _sampling_for(self, reply: ReplyParams) -> Sampling:
        if not reply.sampling:
            return self.session_sampling
        return Sampling.from_dict({**vars(self.session_sampling), **reply.sampling})

    @staticmethod
    def _done(message: Embeddings, reply: ReplyParams, status: str, reason: str | None, usage: Usage,
              transcript: str = "") -> TurnDone:
        return TurnDone(
            session_id=message.session_id,
            turn_id=message.turn_id,
            media_ms=message.media_ms,
            response_id=reply.response_id,
            status=status,
            reason=reason,
            usage=usage,
            transcript=transcript,
        )

    async def close(self) -> None:
        self.speculation = None  # nothing to tell: its KV goes with the session's
        self._give_back_spare()  # a build in progress stops at its next chunk
        await self.transcriber.close()
        self.engine.interrupt()
        # Gives the session's KV row back; waits for a forward that uses it, so not on the loop.
        try:
            await self.node.context.compute.run(self.engine.close)
        except RuntimeError:  # the compute pool is already shut down: no forward can be running
            self.engine.close()
