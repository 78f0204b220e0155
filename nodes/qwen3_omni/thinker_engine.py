"""The thinker of one conversation, with its KV cache kept across turns (no graph, no transport).

    session = ThinkerSession(omni, sampling=Sampling(temperature=0.0))
    pre = session.prefill(encoded_turn)          # only this turn's tokens go through the model
    while (step := session.decode_step()).finish_reason is None:
        ...step.token_id, step.text...
    usage = session.reply_usage()
    session.truncate_reply(heard_tokens)         # forget the unheard rest of the last reply
    mark = session.checkpoint()                  # an out-of-band pass over the context (a user
    ...                                          # transcript, an early prefill) ...
    session.restore(mark)                        # ... leaves no trace, the last reply included

Invariants (what makes a second turn cost only its new tokens):
- `context_ids` are exactly the tokens whose keys/values are in `cache`, in order; their text is
  the canonical chat history, so prefilling it from scratch would give the same cache.
- A reply token is returned as soon as it is chosen and fed at the start of the next step; when
  the reply ends, its last token is fed too, so the cache holds the whole reply. The reply's
  closing `<|im_end|>\\n` waits in `pending` and is fed in front of the next turn's tokens.
- Usage: a reply's `cached_tokens` is the context as it stood when the previous reply ended
  (0 before the first): the user's new input counts as input even when it was prefilled early
  (at commit), so a second turn reports exactly the first turn's input + output as cached.
- The KV lives in one row of the model's shared `SlotKVCache` (slot_cache.py), taken at the
  first prefill and given back by `close()`; a crop (truncate, interrupt, out-of-band rollback)
  only shortens the row. Every model call is a generator of forward requests (`prefill_work`,
  `decode_work`, `truncate_work`): the plain methods (`prefill`, `decode_step`, ...) run one
  alone, each request its own forward; the shared `ThinkerExecutor` (batched_thinker.py) runs
  the calls of many sessions together, all decode steps ready at once in one forward. Both give
  the same tokens (tests/model/test_batched_thinker.py).
- The context is a list of segments (thinker_history.py: the system prompt, then one per turn,
  a reply's tokens with the turn that asked for it). Edits that are not an append at the end
  (`system_prompt_work`: a new system prompt; `delete_work`; `prefill_work(insert_after=...)`)
  keep the KV up to the first changed position and re-prefill the rest from the segments' ids
  and kept encoder outputs; the next reply's `cached_tokens` is then at most that kept prefix.
- Truncation (`truncation_plan`, `drop_oldest_work`; the policy is truncation.py): the oldest
  conversation items leave the context together, the KV is kept up to the instructions and what
  stays is re-prefilled once; their segments (and encoder outputs) go with them, so what a
  session keeps for rebuilds is bounded by its context, not by its length. The same result can
  be built ahead in a spare row and adopted between turns (spare_row.py, `adopt_row`).
- Rotary positions are computed here per turn (`get_rope_index` on the new tokens, shifted to
  follow the context) and passed explicitly, so `thinker.model.rope_deltas` — model-level state
  shared by all sessions — is never read or written: interleaved sessions cannot disturb each other.

What the talker needs (see `TalkerUserPart`): for every user message, its token ids and the
thinker's layer-`accept_hidden_layer` hidden states at its audio/image positions (captured at
prefill; they cannot be recomputed later from the KV). Reply tokens reach the talker by id alone.

Methods run in a compute thread, one at a time per session; `interrupt()` may be called from any
thread and stops a reply before its next step. Errors that a client can act on are
`ThinkerError`s with a `code` (`context_exhausted`, `no_reply`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import torch

from graph.messages import FinishReason, Usage
from nodes.qwen3_omni.batched_thinker import ThinkerRunner
from nodes.qwen3_omni.thinker_requests import Choice, Choose, Chunk, Feed, ThinkerError, Work
from nodes.qwen3_omni.thinker_sampling import Sampling, device_longs
from nodes.qwen3_omni.thinker_history import History, Segment, TalkerView, turn_media
from nodes.qwen3_omni.tool_calls import ToolCallDecoder
from nodes.qwen3_omni.truncation import Item, items_to_drop

if TYPE_CHECKING:
    from graph.messages import Truncation
    from nodes.qwen3_omni.model import OmniModel


class OtherRow(Protocol):
    """A KV row besides the session's own that a rebuild is made in and the session then adopts
    (spare_row.py `SpareRow`; a protocol here so that the engine does not import its builder)."""

    chunk_tokens: int  # its prefill chunks
    role: Any  # the role after its last token
    ids: list[int]  # the token ids it holds
    positions_after: list[int]  # the next rotary position after each of them
    instruction_ids: list[int]  # its first tokens, the session's instructions
    built: list[Any]  # the items in it: `.segment`, `.start` (its first column), `.user_parts`
    last_logits: torch.Tensor | None

    @property
    def next_position(self) -> int: ...
    def row(self) -> int: ...
    def append(self, ids: list[int], positions_after: list[int], logits: torch.Tensor) -> None: ...
    def handed_over(self) -> int: ...


# A reply must leave room for its closing `<|im_end|>\n`.
_CLOSING_RESERVE = 2
# A prefill goes through the model in chunks of at most this many tokens; between two chunks the
# shared executor runs the other sessions' decode steps.
PREFILL_CHUNK_TOKENS = 256


@dataclass
class TalkerUserPart:
    """One user message as the talker sees it: all tokens from its `<|im_start|>` up to the next
    message, and the accept-layer hidden states at its audio/image/video positions (in order)."""

    token_ids: torch.Tensor  # [L] long
    multimodal_mask: torch.Tensor  # [L] bool
    multimodal_hidden: torch.Tensor  # [mask.sum(), thinker hidden]


@dataclass
class Prefill:
    """What one `prefill` did."""

    new_tokens: int  # tokens that went through the model (pending closing + this turn)
    cached_tokens: int  # context this prefill reused from the cache (its length before it)
    context_tokens: int  # context length after
    token_ids: list[int] = field(default_factory=list)  # what went through the model, in order
    # Accept-layer hidden states at every audio/image/video position of `token_ids`, in order
    # ([0, hidden] when there is none, or the checkpoint has no talker).
    multimodal_hidden: torch.Tensor | None = None
    user_parts: list[TalkerUserPart] = field(default_factory=list)
    reply_started: bool = False
    # The turn went in before the end of the history, which was re-prefilled from there:
    # `token_ids`/`user_parts` are empty; the talker restarts from `ThinkerSession.talker_view()`.
    rebuilt: bool = False


@dataclass
class Step:
    """One reply token. `finish_reason` set means the reply is over (`token_id` may then be None):
    stop (EOS) | length (the session's max_reply_tokens) | max_output_tokens (the reply's own
    bound) | context_exhausted | interrupted."""

    token_id: int | None
    text: str
    index: int
    finish_reason: FinishReason | None = None
    call: bool = False  # the token belongs to a function call (tool_calls.py): not spoken


@dataclass
class _Reply:
    start: int  # index in context_ids of the first reply token
    token_ids: list[int] = field(default_factory=list)
    fed: int = 0  # reply tokens already in the cache
    text: str = ""
    # Incremental detokenizing: token_ids[prefix:read] were decoded already; decoding from
    # `prefix` (a few tokens back) keeps the tokenizer's spacing context.
    prefix: int = 0
    read: int = 0
    finish_reason: FinishReason | None = None
    limit: int = 0
    limit_reason: FinishReason = "length"
    usage: Usage = field(default_factory=Usage)  # the input side; reply_usage() adds the output
    # Out-of-band replies roll the session back to this snapshot when they finish.
    rollback: tuple[int, list[int], int, int, int] | None = None
    calls: ToolCallDecoder | None = None  # the reply may call functions


class _Row:
    """The session's view of its KV row (what a `DynamicCache` answered before)."""

    def __init__(self, session: ThinkerSession):
        self._session = weakref.ref(session)  # no cycle: a dropped session frees its row at once

    def get_seq_length(self) -> int:
        session = self._session()
        if session is None or session._slot is None:
            return 0
        return session._runner.cache.length(session._slot)


class ThinkerSession:
    def __init__(self, omni: OmniModel, sampling: Sampling | None = None, max_seq_len: int | None = None,
                 max_reply_tokens: int | None = None, prefill_chunk_tokens: int | None = None):
        self.omni = omni
        self.thinker = omni.thinker
        self.tokens = omni.tokens
        self.sampling = sampling or Sampling()
        self.max_seq_len = int(max_seq_len or omni.bounds.max_seq_len)
        self.max_reply_tokens = int(max_reply_tokens or omni.bounds.max_reply_tokens)
        self.accept_layer = int(omni.config.talker_config.accept_hidden_layer) if omni.talker is not None else None
        self.prefill_chunk_tokens = int(prefill_chunk_tokens or PREFILL_CHUNK_TOKENS)
        self._runner = ThinkerRunner.for_model(omni)
        self._slot: int | None = None  # this session's row in the runner's slot cache
        self._release: weakref.finalize | None = None
        self._closed = False
        self.cache = _Row(self)
        self.context_ids: list[int] = []
        self.history = History()  # the context's segments (thinker_history.py)
        self._unfed_system: list[int] = []  # a system prompt set before the first turn, fed with it
        self._positions_after: list[int] = []  # next rotary position after each context token
        self.pending: list[int] = []
        self.audio_tokens_in_context = 0
        self.image_tokens_in_context = 0
        self.tokens_forwarded = 0  # all tokens ever fed to the thinker (prefill + decode)
        self.turns = 0
        self._role = None  # role token of the message the context ends in
        self._previous_context = 0  # context length when the last reply ended (a reply's cached_tokens)
        self._reply: _Reply | None = None
        self._last_logits: torch.Tensor | None = None
        self._interrupt = threading.Event()
        self._generator = self._new_generator(self.sampling)
        # The ids in the context and the reply's chosen tokens not fed yet, as a [vocab] mask on
        # the device (what the repetition penalty reads); built when a choice first needs it,
        # kept up to date as tokens are chosen, dropped when the context changes otherwise.
        self._seen: torch.Tensor | None = None

    # ------------------------------------------------------------------ state

    @property
    def context_length(self) -> int:
        return len(self.context_ids)

    @property
    def next_position(self) -> int:
        return self._positions_after[-1] if self._positions_after else 0

    @property
    def replying(self) -> bool:
        return self._reply is not None and self._reply.finish_reason is None

    @property
    def reply_token_ids(self) -> list[int]:
        return list(self._reply.token_ids) if self._reply else []

    def set_sampling(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._generator = self._new_generator(sampling)

    def _new_generator(self, sampling: Sampling) -> torch.Generator | None:
        """A seeded session's own generator, on the device its tokens are drawn on."""
        if sampling.seed is None:
            return None
        return torch.Generator(device=self.omni.device).manual_seed(sampling.seed)

    # ------------------------------------------------------------------ turns

    def prefill(self, turn: dict[str, Any], *, reply: bool | None = None, out_of_band: bool = False,
                max_reply_tokens: int | None = None, key: str | None = None,
                insert_after: list[str] | None = None, calls: ToolCallDecoder | None = None,
                reply_key: str | None = None, function_output: bool = False) -> Prefill:
        """`prefill_work` run alone (see there)."""
        return self._runner.run_alone(
            self.prefill_work(turn, reply=reply, out_of_band=out_of_band, max_reply_tokens=max_reply_tokens,
                              key=key, insert_after=insert_after, calls=calls, reply_key=reply_key,
                              function_output=function_output)
        )

    @torch.inference_mode()
    def prefill_work(
        self,
        turn: dict[str, Any],
        *,
        reply: bool | None = None,
        out_of_band: bool = False,
        max_reply_tokens: int | None = None,
        key: str | None = None,
        insert_after: list[str] | None = None,
        calls: ToolCallDecoder | None = None,
        reply_key: str | None = None,
        function_output: bool = False,
    ) -> Work:
        """Feed one turn (the `encode_turns` dict; `input_ids` = this turn's tokens only).

        `reply` (default: the turn ends with the assistant header) starts a reply: `decode_step`
        may follow, for at most `max_reply_tokens` (a client's own bound, finish reason
        `max_output_tokens`) or the session's bound (finish reason `length`).
        `out_of_band`: when the reply finishes, the session forgets this turn and the reply.
        Raises ThinkerError(`context_exhausted`) — and changes nothing — if the turn does not fit
        in `max_seq_len`. A generator of forward requests (module docstring); returns a `Prefill`.
        `calls` (tool_calls.py) lets the reply call functions: its tokens are chosen under it.
        `reply_key` names the reply's own segment when the turn is not only a reply request (an
        utterance that brings its reply: its header and the reply are named apart from it).
        `key` names the turn's history segment (thinker_history.py); `insert_after` (history keys
        of the items before it, nearest first) puts a turn without reply before the end of the
        history, which is then re-prefilled from there (`Prefill.rebuilt`); None: at the end.
        `function_output`: the turn is a function's output, which leaves the context with the
        item before it (its call) when the conversation is truncated (`drop_oldest_work`).
        """
        self._sync_row()
        ids = [int(i) for i in turn["input_ids"].tolist()]
        if reply is None:
            reply = ids[-3:] == self.tokens.assistant_header
        if not ids and not reply:  # nothing to add; a previous reply's closing keeps waiting
            n = len(self.context_ids)
            return Prefill(new_tokens=0, cached_tokens=n, context_tokens=n,
                           multimodal_hidden=torch.zeros(0, self.thinker.config.text_config.hidden_size))
        if self.replying:
            yield from self._finish_work(self._reply, "interrupted")
        if insert_after is not None and not reply:
            index = self.history.insertion_index(insert_after)
            if index < len(self.history):
                return (yield from self._insert_work(index, key, ids, turn))
        if reply:
            self._interrupt.clear()  # an interrupt from here on stops this reply's first step
        system = [] if self.context_ids else self._unfed_system
        new_ids = system + self.pending + ids
        needed = len(self.context_ids) + len(new_ids) + _CLOSING_RESERVE + (1 if reply else 0)
        if needed > self.max_seq_len:
            raise ThinkerError(
                "context_exhausted",
                f"the conversation needs {needed} tokens but this session's context holds {self.max_seq_len}",
            )
        snapshot = (len(self.context_ids), list(self.pending), self.audio_tokens_in_context,
                    self.image_tokens_in_context, self.turns)
        cached = len(self.context_ids)
        embeds, deepstack, visual_mask = self._embed(new_ids, turn)
        positions = self._positions(new_ids, turn)
        user_mask, mm_mask = self._user_and_multimodal_masks(new_ids)
        want_hidden = self.accept_layer is not None and bool(mm_mask.any())
        logits, hidden = yield from self._prefill_chunks(embeds, positions, deepstack, visual_mask, want_hidden)
        self._append(new_ids, positions)
        if system:
            self.history.segments.append(Segment(None, 0, system=True))
            self._unfed_system = []
        turn_segment = Segment(key, cached + len(system) + len(self.pending), turn_media(turn),
                               pairs_with_previous=function_output)
        self.history.segments.append(turn_segment)
        header = len(self.tokens.assistant_header)
        if reply and reply_key is not None and reply_key != key and len(ids) > header:
            # A turn that brings its own reply request (an utterance with its automatic reply):
            # the reply, from its header on, is a segment of its own, named as any reply is.
            self.history.segments.append(Segment(reply_key, len(self.context_ids) - header))
        self.pending = []
        self.audio_tokens_in_context += sum(1 for i in ids if i == self.tokens.audio_pad)
        self.image_tokens_in_context += sum(1 for i in ids if i in (self.tokens.image_pad, self.tokens.video_pad))
        self.turns += 1
        self._last_logits = logits
        result = Prefill(
            new_tokens=len(new_ids), cached_tokens=cached, context_tokens=len(self.context_ids), token_ids=new_ids
        )
        hidden_size = self.thinker.config.text_config.hidden_size
        result.multimodal_hidden = (
            hidden[mm_mask.to(hidden.device)] if hidden is not None else embeds.new_zeros(0, hidden_size)
        )
        if self.omni.talker is not None:
            result.user_parts = self._talker_user_parts(new_ids, user_mask, mm_mask, hidden)
            turn_segment.user_parts = result.user_parts
        if reply:
            self._reply = _Reply(start=len(self.context_ids), rollback=snapshot if out_of_band else None)
            if max_reply_tokens is not None and max_reply_tokens < self.max_reply_tokens:
                self._reply.limit, self._reply.limit_reason = max(1, int(max_reply_tokens)), "max_output_tokens"
            else:
                self._reply.limit, self._reply.limit_reason = self.max_reply_tokens, "length"
            if calls is not None:
                calls.limit = self._reply.limit
                self._reply.calls = calls
            audio, image = self.audio_tokens_in_context, self.image_tokens_in_context
            self._reply.usage = Usage(
                input_tokens=len(self.context_ids),
                cached_tokens=min(self._previous_context, cached),
                input_audio_tokens=audio,
                input_image_tokens=image,
                input_text_tokens=len(self.context_ids) - audio - image,
            )
            result.reply_started = True
        return result

    def decode_step(self) -> Step:
        """`decode_work` run alone (see there)."""
        return self._runner.run_alone(self.decode_work())

    @torch.inference_mode()
    def decode_work(self) -> Work:
        """Feed the previous reply token, then choose the next one and return it.

        A chosen token is returned before the forward that feeds it (that forward opens the next
        step), so the first token follows the prefill at once and the talker can start on it.
        The next token is chosen in the same request as the feed (`Feed.choice`; the first one:
        `Choose` on the prefill's logits), on the device with every other session's of the step
        (thinker_sampling.py). Stops within one step of `interrupt()`. A generator of forward
        requests; returns a `Step`.
        """
        self._sync_row()
        reply = self._reply
        if reply is None or reply.finish_reason is not None:
            raise ThinkerError("no_reply", "no reply is in progress")
        index = len(reply.token_ids)
        if self._interrupt.is_set():
            return (yield from self._finish_step(reply, "interrupted", index))
        # A token is only chosen if it can be fed later with the closing still fitting after it.
        unfed = len(reply.token_ids) - reply.fed
        fits = len(self.context_ids) + unfed + 1 + _CLOSING_RESERVE <= self.max_seq_len
        calls = reply.calls
        choice = self._choice(calls.allowed() if calls is not None else None) if fits else None
        token = None
        if unfed:  # the forward that feeds the last token chooses the next (one pass for the batch)
            token = yield from self._feed_unfed(reply, choice)
        elif choice is not None:  # the first token: from the prefill's logits
            token = (yield Choose(self._row(), self._last_logits, choice, owner=self)).token
        if not fits:
            return (yield from self._finish_step(reply, "context_exhausted", index))
        if token in self.tokens.eos:
            return (yield from self._finish_step(reply, "stop", index))
        reply.token_ids.append(token)
        if self._seen is not None:
            self._seen[token] = True
        in_call = calls is not None and calls.accept(token)
        text = self._new_text(reply)
        if calls is not None and calls.over_limit():
            yield from self._finish_work(reply, reply.limit_reason)
            return Step(token, text + self._flush_text(reply), index, reply.limit_reason, call=True)
        if len(reply.token_ids) >= reply.limit and not (calls is not None and calls.in_call):
            # A call that ran past the limit is whole: the reply ends as if on EOS.
            reason = "stop" if calls is not None and calls.finished and in_call else reply.limit_reason
            yield from self._finish_work(reply, reason)
            return Step(token, text + self._flush_text(reply), index, reason, call=in_call)
        return Step(token, text, index, call=in_call)

    def interrupt(self) -> None:
        """Ask the running reply to stop before its next step (thread-safe, never blocks)."""
        self._interrupt.set()

    def close(self) -> None:
        """Give the session's KV row back to the shared cache (the session cannot run again)."""
        self._closed = True
        self._interrupt.set()
        if self._release is not None:
            self._release()  # under the cache's lock: never while a forward uses the row

    def reply_text(self) -> str:
        return self._reply.text if self._reply else ""

    def reply_usage(self) -> Usage:
        """The running (or last) reply's tokens, as `TurnDone.usage` reports them: a fresh copy."""
        if self._reply is None:
            return Usage()
        output = len(self._reply.token_ids)
        return msgspec.structs.replace(self._reply.usage, output_tokens=output, output_text_tokens=output)

    def truncate_reply(self, heard_tokens: int) -> str:
        """`truncate_work` run alone (see there)."""
        return self._runner.run_alone(self.truncate_work(heard_tokens))

    @torch.inference_mode()
    def truncate_work(self, heard_tokens: int) -> Work:
        """Keep only the first `heard_tokens` tokens of the last reply, in the history and the cache.

        Returns the text that remains. A running reply is ended first (its unfed tokens are fed).
        """
        self._sync_row()
        reply = self._reply
        if reply is None:
            raise ThinkerError("no_reply", "there is no reply to truncate")
        if reply.finish_reason is None:
            yield from self._finish_work(reply, "interrupted")
        if reply.rollback is not None:
            return reply.text  # an out-of-band reply left nothing in the history
        keep = max(0, min(int(heard_tokens), len(reply.token_ids)))
        if keep == len(reply.token_ids):
            return reply.text
        kept_in_cache = min(keep, reply.fed)
        self._crop_to(reply.start + kept_in_cache)
        reply.token_ids = reply.token_ids[:keep]
        reply.fed = kept_in_cache
        reply.text = self._decode(reply.token_ids)
        self.pending = reply.token_ids[kept_in_cache:] + self.tokens.closing
        self._previous_context = len(self.context_ids)
        return reply.text

    # ------------------------------------------------------------------ history edits

    def set_system_prompt(self, system_ids: list[int]) -> bool:
        """`system_prompt_work` run alone (see there)."""
        return self._runner.run_alone(self.system_prompt_work(system_ids))

    def delete(self, key: str) -> bool:
        """`delete_work` run alone (see there)."""
        return self._runner.run_alone(self.delete_work(key))

    def talker_view(self) -> TalkerView:
        """The history as the talker restarts from it after a rebuild (thinker_history.py)."""
        return self.history.talker_view(self.context_ids, self.tokens.im_start)

    def system_prompt_changes(self, system_ids: list[int]) -> bool:
        """Whether `system_prompt_work(system_ids)` would rebuild the history (no forward, no change):
        the context holds a different system message than this one."""
        if not self.context_ids:
            return False
        system_ids = [int(i) for i in system_ids]
        current = self.history.system
        if current is None:
            return bool(system_ids)
        return self.context_ids[: self.history.end(0, len(self.context_ids))] != system_ids

    @torch.inference_mode()
    def system_prompt_work(self, system_ids: list[int]) -> Work:
        """Make the history start with this system message (`<|im_start|>system\\n...<|im_end|>\\n`;
        none when empty).

        Before the first turn it is only noted (the first prefill feeds it). Later, a different one
        replaces the old one: the KV is kept up to the first token where they differ and the rest
        of the history is re-prefilled. Returns whether the history was rebuilt; raises
        ThinkerError(`context_exhausted`), changing nothing, when the result would not fit.
        """
        self._sync_row()
        system_ids = [int(i) for i in system_ids]
        if not self.context_ids:
            self._unfed_system = system_ids
            return False
        if not self.system_prompt_changes(system_ids):
            return False
        current = self.history.system
        old = self.context_ids[: self.history.end(0, len(self.context_ids))] if current is not None else []
        self._check_fits(len(self.context_ids) - len(old) + len(system_ids) + len(self.pending))
        if self.replying:
            yield from self._finish_work(self._reply, "interrupted")
        if not system_ids:  # no system prompt any more
            yield from self._rebuild_work(0, 1, [])
            return True
        common = 0
        while common < min(len(old), len(system_ids)) - 1 and old[common] == system_ids[common]:
            common += 1
        segment = Segment(None, 0, system=True)
        yield from self._rebuild_work(0, 1 if current is not None else 0, [(segment, system_ids)], kept_tokens=common)
        return True

    @torch.inference_mode()
    def delete_work(self, key: str) -> Work:
        """Remove the turn named `key` (and, for a reply's key, the reply) from the history: the KV
        is kept up to it and the rest is re-prefilled. Returns False (changing nothing) when the
        history holds no such turn."""
        self._sync_row()
        index = self.history.index_of(key)
        if index is None:
            return False
        if self.replying:
            yield from self._finish_work(self._reply, "interrupted")
        yield from self._rebuild_work(index, 1, [])
        return True

    # ------------------------------------------------------------------ truncation

    def reply_reserve(self, max_reply_tokens: int | None = None) -> int:
        """The room a reply is given when the conversation is truncated for its turn: its bound,
        at most an eighth of the context (a reply that runs past it may still end with
        `context_exhausted`; a full reserve of `max_reply_tokens` would leave no conversation)."""
        limit = min(int(max_reply_tokens or self.max_reply_tokens), self.max_reply_tokens)
        return min(limit, self.max_seq_len // 8) + 1 + _CLOSING_RESERVE

    @property
    def instructions_length(self) -> int:
        """The tokens of the context before its conversation (the system prompt with its tools)."""
        conversation = self.history.conversation(len(self.context_ids))
        return self.history.segments[conversation[0][0]].start if conversation else len(self.context_ids)

    def truncation_plan(self, mode: Truncation, incoming: int, keep_last: int = 0,
                        future: tuple[int, int] = (0, 0)) -> int:
        """How many of the oldest conversation items must leave the context before `incoming` more
        tokens go in (the turn with the pending closing and its reply's reserve), under `mode`
        (nodes/qwen3_omni/truncation.py). `future` (turns, tokens each): as if that many turns
        came first, none of them dropped (a truncation planned ahead: spare_row.py). No forward,
        no change."""
        if not self.context_ids:
            return 0
        conversation = self.history.conversation(len(self.context_ids))
        instructions = self.instructions_length
        items = [Item(tokens, self.history.segments[i].pairs_with_previous) for i, tokens in conversation]
        turns, tokens = future
        items += [Item(tokens)] * turns
        return items_to_drop(items, mode, instructions=instructions, incoming=incoming + len(self.pending),
                             context=self.max_seq_len, keep_last=keep_last + turns)

    @torch.inference_mode()
    def drop_oldest_work(self, count: int) -> Work:
        """The `count` oldest conversation items leave the context (`truncation_plan`): the KV is
        kept up to the instructions and what stays is re-prefilled once. Returns the tokens
        re-prefilled. Never called while a reply is being made."""
        self._sync_row()
        conversation = self.history.conversation(len(self.context_ids))
        if count <= 0 or not conversation:
            return 0
        assert not self.replying, "a reply in progress is never truncated"
        count = min(count, len(conversation))
        kept = yield from self._rebuild_work(conversation[0][0], count, [])
        return len(self.context_ids) - kept

    def _insert_work(self, index: int, key: str | None, ids: list[int], turn: dict[str, Any]) -> Work:
        self._check_fits(len(self.context_ids) + len(self.pending) + len(ids))
        kept = yield from self._rebuild_work(index, 0, [(Segment(key, 0, turn_media(turn)), ids)])
        self.turns += 1
        length = len(self.context_ids)
        return Prefill(new_tokens=length - kept, cached_tokens=kept, context_tokens=length, rebuilt=True,
                       multimodal_hidden=torch.zeros(0, self.thinker.config.text_config.hidden_size))

    def _check_fits(self, length: int) -> None:
        if length + _CLOSING_RESERVE > self.max_seq_len:
            raise ThinkerError(
                "context_exhausted",
                f"the conversation would need {length + _CLOSING_RESERVE} tokens but this session's context holds {self.max_seq_len}",
            )

    def _rebuild_work(self, index: int, remove: int, insert: list[tuple[Segment, list[int]]],
                      kept_tokens: int = 0) -> Work:
        """Replace `remove` segments at `index` with `insert` ((segment, its token ids) each) and
        re-prefill the context from the first changed position: the KV before it is kept, and
        `kept_tokens` more, the first inserted segment's leading ids that the context holds there
        already (text only). Returns the kept length (what the next reply reuses at most)."""
        segments = self.history.segments
        length = len(self.context_ids)
        keep = (segments[index].start if index < len(segments) else length) + kept_tokens
        tail = [(s, self.context_ids[s.start : self.history.end(i, length)])
                for i, s in enumerate(segments) if i >= index + remove]
        if remove and index + remove == len(segments):
            self.pending = []  # the closing of the removed last turn's reply
        reply_place = self._reply_place()
        self.history.segments = segments[:index]
        self._crop_to(keep)
        for position, (segment, ids) in enumerate(insert + tail):
            skip = kept_tokens if position == 0 else 0
            segment.start = len(self.context_ids) - skip
            self.history.segments.append(segment)
            if skip:  # the rest of a system message: text, no user parts
                yield from self._refeed(ids[skip:], {})
            else:
                segment.user_parts = yield from self._refeed(ids, segment.media)
        self._context_rebuilt(keep, reply_place)
        return keep

    def _refeed(self, ids: list[int], media: dict[str, Any], into: OtherRow | None = None) -> Work:
        """One segment's tokens through the model at the end of the context, or at the end of the
        spare row `into` (spare_row.py: the same tokens at the same positions as a rebuild in place
        would give them, in the spare's own chunks) -> its talker user parts."""
        embeds, deepstack, visual_mask = self._embed(ids, media)
        positions = self._positions(ids, media, after=None if into is None else into.next_position)
        user_mask, mm_mask = self._user_and_multimodal_masks(ids, role=self._role if into is None else into.role)
        want_hidden = self.accept_layer is not None and bool(mm_mask.any())
        logits, hidden = yield from self._prefill_chunks(embeds, positions, deepstack, visual_mask, want_hidden,
                                                         into=into)
        if into is None:
            self._append(ids, positions)
            self._last_logits = logits
        else:
            into.append(ids, _positions_after_each(positions), logits)
        if self.omni.talker is None:
            return []
        return self._talker_user_parts(ids, user_mask, mm_mask, hidden)

    def _reply_place(self) -> tuple[_Reply, Segment, int] | None:
        """The last reply that stays in the history, the segment it starts in and its offset there,
        taken before a rebuild moves that segment (`_context_rebuilt` moves the reply with it)."""
        reply = self._reply if self._reply is not None and self._reply.rollback is None else None
        segment = self.history.containing(reply.start - 1) if reply is not None else None
        if reply is None or segment is None:
            return None
        return reply, segment, reply.start - segment.start

    def _context_rebuilt(self, kept: int, reply_place: tuple[_Reply, Segment, int] | None) -> None:
        """What follows the context once it was rebuilt from its first `kept` tokens on, in place
        (`_rebuild_work`) or in a spare row (`adopt_row`): the media counts, the next reply's
        `cached_tokens` (never more than was kept), and the last reply's start (`reply_place`),
        which moves with its segment; a reply whose segment left has nothing left to truncate."""
        self._count_media()
        self._previous_context = min(self._previous_context, kept)
        if reply_place is not None:
            reply, segment, offset = reply_place
            if any(s is segment for s in self.history.segments):
                reply.start = segment.start + offset
            else:
                self._reply = None

    def adopt_row(self, spare: OtherRow, instructions: list[Segment]) -> None:
        """The spare row, built and caught up (spare_row.py `adopt_work`), becomes this session's
        row and its context: the `instructions` segments, then the items built into it, at their
        places there; the old row goes back to the cache. Then as after a rebuild in place."""
        reply_place = self._reply_place()
        with self._runner.cache.lock:
            if self._release is not None:
                self._release()  # the old row, and `_slot` cleared
            self._own_row(spare.handed_over())
        for built in spare.built:
            built.segment.start = built.start
            built.segment.user_parts = built.user_parts
        self.history.segments = list(instructions) + [built.segment for built in spare.built]
        self.context_ids = spare.ids
        self._positions_after = spare.positions_after
        self._role = self._role_after(self.context_ids, None)
        self._seen = None
        if spare.last_logits is not None:
            self._last_logits = spare.last_logits
        self._context_rebuilt(len(spare.instruction_ids), reply_place)

    # ------------------------------------------------------------------ internals

    def _finish_step(self, reply: _Reply, reason: FinishReason, index: int) -> Work:
        yield from self._finish_work(reply, reason)
        return Step(None, self._flush_text(reply), index, reason)

    def _finish_work(self, reply: _Reply, reason: FinishReason) -> Work:
        reply.finish_reason = reason
        self._interrupt.clear()
        if reply.rollback is not None:
            length, pending, audio, image, turns = reply.rollback
            self._crop_to(length)
            self.pending = pending
            self.audio_tokens_in_context, self.image_tokens_in_context, self.turns = audio, image, turns
            return
        yield from self._feed_unfed(reply)  # the whole reply joins the history (and the cache)
        self.pending = list(self.tokens.closing)
        self._previous_context = len(self.context_ids)

    def _feed_unfed(self, reply: _Reply, choice: Choice | None = None) -> Work:
        """Feed the reply's chosen tokens that are not in the cache yet; the last one's forward
        also chooses the next token under `choice` -> that token (None without a choice)."""
        chosen = None
        while reply.fed < len(reply.token_ids):
            token = reply.token_ids[reply.fed]
            position = self.next_position
            last = reply.fed + 1 == len(reply.token_ids)
            logits, chosen = yield Feed(self._row(), token, position, owner=self, choice=choice if last else None)
            self.tokens_forwarded += 1
            self.context_ids.append(token)  # a reply token: a text position, and no role change
            self._positions_after.append(position + 1)
            reply.fed += 1
            self._last_logits = logits
        return chosen

    def _choice(self, allowed: torch.Tensor | None) -> Choice:
        """How this session's next token is chosen (thinker_sampling.py), `allowed` by a grammar."""
        sampling = self.sampling
        seen = None
        if sampling.repetition_penalty != 1.0:
            if self._seen is None:
                ids = self.context_ids + (self._reply.token_ids[self._reply.fed :] if self._reply else [])
                self._seen = torch.zeros(self.thinker.config.text_config.vocab_size, dtype=torch.bool,
                                         device=self.omni.device)
                if ids:
                    self._seen[device_longs(ids, self._seen.device)] = True
            seen = self._seen
        return Choice(sampling, self._generator, seen, allowed)

    def _decode(self, token_ids: list[int]) -> str:
        # No clean-up of spaces: text decoded so far must stay a prefix of what follows.
        return self.omni.tokenizer.decode(token_ids, clean_up_tokenization_spaces=False)

    def _new_text(self, reply: _Reply) -> str:
        """The text the reply gained with its last token; holds back an incomplete UTF-8 sequence.

        Decodes only the tokens since the last text it gave out, plus the few before them (the
        way vLLM detokenizes), not the whole reply each step."""
        ids = reply.token_ids
        known = self._decode(ids[reply.prefix : reply.read])
        grown = self._decode(ids[reply.prefix :])
        if len(grown) <= len(known) or grown.endswith("\ufffd") or not grown.startswith(known):
            return ""
        piece = grown[len(known) :]
        reply.prefix, reply.read = reply.read, len(ids)
        reply.text += piece
        return piece

    def _flush_text(self, reply: _Reply) -> str:
        full = self._decode(reply.token_ids)
        piece = full[len(reply.text) :] if full.startswith(reply.text) else ""
        reply.text = full
        return piece

    def _embed(self, ids: list[int], turn: dict[str, Any]):
        device = self.omni.device
        ids_t = torch.tensor([ids], device=device)
        embeds = self.thinker.get_input_embeddings()(ids_t)
        tok = self.tokens
        audio_mask = ids_t == tok.audio_pad
        if audio_mask.any():
            audio = turn.get("audio_embeds")
            if audio is None or audio.shape[0] != int(audio_mask.sum()):
                raise ValueError("audio placeholders and audio embeddings do not match")
            embeds = embeds.masked_scatter(audio_mask[..., None], audio.to(device, embeds.dtype))
        image_mask = ids_t == tok.image_pad
        deepstack, visual_mask = None, None
        if image_mask.any():
            image = turn.get("image_embeds")
            if image is None or image.shape[0] != int(image_mask.sum()):
                raise ValueError("image placeholders and image embeddings do not match")
            embeds = embeds.masked_scatter(image_mask[..., None], image.to(device, embeds.dtype))
            deepstack = [level.to(device, embeds.dtype) for level in turn.get("image_deepstack") or []]
            visual_mask = image_mask
        return embeds, deepstack or None, visual_mask

    def _positions(self, ids: list[int], turn: dict[str, Any], after: int | None = None) -> torch.Tensor:
        """[3, 1, L] rotary positions of the new tokens, following the context's last position
        (or `after`: a spare row's, spare_row.py)."""
        device = self.omni.device
        grid = turn.get("image_grid_thw")
        if grid is None:
            positions = torch.arange(len(ids), device=device).view(1, 1, -1).expand(3, 1, -1)
        else:
            lengths = turn.get("audio_feature_lengths")
            positions, _ = self.thinker.model.get_rope_index(
                torch.tensor([ids], device=device),
                image_grid_thw=grid.to(device),
                video_grid_thw=None,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                use_audio_in_video=False,
                audio_seqlens=None if lengths is None else lengths.to(device),
            )
        return positions.long() + (self.next_position if after is None else after)

    def _prefill_chunks(self, embeds, positions, deepstack, visual_mask, want_hidden,
                        into: OtherRow | None = None) -> Work:
        """The new tokens through the model in chunks of `prefill_chunk_tokens` (one forward request
        each) -> logits at the last token, accept-layer hidden states of all of them (or None).
        `into` (spare_row.py): into that row instead, in its own (smaller) chunks."""
        length = embeds.shape[1]
        step = self.prefill_chunk_tokens if into is None else into.chunk_tokens
        hiddens = []
        visual_before = 0  # visual positions in earlier chunks (deepstack rows are per visual position)
        for start in range(0, length, step):
            end = min(length, start + step)
            chunk_mask, chunk_deepstack = None, None
            if visual_mask is not None and deepstack is not None:
                chunk_mask = visual_mask[:, start:end]
                count = int(chunk_mask.sum())
                if count:
                    chunk_deepstack = [level[visual_before : visual_before + count] for level in deepstack]
                else:
                    chunk_mask = None
                visual_before += count
            logits, hidden = yield Chunk(
                self._row() if into is None else into.row(), embeds[:, start:end], positions[..., start:end],
                chunk_deepstack, chunk_mask, self.accept_layer if want_hidden else None,
                owner=self if into is None else into,
            )
            self.tokens_forwarded += end - start
            hiddens.append(hidden)
        return logits, (torch.cat(hiddens) if want_hidden else None)

    def _row(self) -> int:
        """This session's KV row (taken at its first forward)."""
        if self._closed:
            raise ThinkerError("session_closed", "the session is closed")
        if self._slot is None:
            self._own_row(self._runner.cache.acquire())
        return self._slot

    def _own_row(self, slot: int) -> None:
        """`slot` is this session's row from now on: given back by close(), or when the session is
        garbage (whichever comes first, once)."""
        self._slot = slot
        self._release = weakref.finalize(self, _release_row, self._runner.cache, slot, _SlotHolder(self))

    def _sync_row(self) -> None:
        """A call abandoned half-way (a cancelled caller) may have left extra tokens in the row."""
        if self._slot is not None and self._runner.cache.length(self._slot) > len(self.context_ids):
            self._runner.cache.set_length(self._slot, len(self.context_ids))

    def _append(self, ids: list[int], positions: torch.Tensor) -> None:
        self.context_ids.extend(ids)
        self._positions_after.extend(_positions_after_each(positions))
        self._role = self._role_after(ids, self._role)
        self._seen = None

    def _crop_to(self, length: int) -> None:
        self._seen = None
        drop = len(self.context_ids) - length
        if drop > 0:
            self._runner.cache.set_length(self._row(), length)
            del self.context_ids[length:]
            del self._positions_after[length:]
        self.history.forget_from(length)
        self._role = self._role_after(self.context_ids, None)

    def _count_media(self) -> None:
        """The audio and image/video positions in the context, counted again after it changed
        other than by an append."""
        tok = self.tokens
        self.audio_tokens_in_context = sum(1 for i in self.context_ids if i == tok.audio_pad)
        self.image_tokens_in_context = sum(1 for i in self.context_ids if i in (tok.image_pad, tok.video_pad))

    def _role_after(self, ids: list[int], role: int | None) -> int | None:
        for i, token in enumerate(ids):
            if token == self.tokens.im_start and i + 1 < len(ids):
                role = ids[i + 1]
        return role

    def _user_and_multimodal_masks(self, ids: list[int], role: Any = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """Which new tokens belong to a user message, and which are audio/image/video positions
        (`role`: of the message they follow; default: the context's)."""
        tok = self.tokens
        role = self._role if role == -1 else role
        user = []
        for i, token in enumerate(ids):
            if token == tok.im_start:
                role = ids[i + 1] if i + 1 < len(ids) else None
            user.append(role == tok.user)
        ids_t = torch.tensor(ids)
        multimodal = (ids_t == tok.audio_pad) | (ids_t == tok.image_pad) | (ids_t == tok.video_pad)
        return torch.tensor(user, dtype=torch.bool), multimodal

    def _talker_user_parts(self, ids, user_mask, mm_mask, hidden) -> list[TalkerUserPart]:
        spans: list[tuple[int, int]] = []
        start = None
        for i, token in enumerate(ids):
            if not user_mask[i]:
                if start is not None:
                    spans.append((start, i))
                start = None
            elif start is None:
                start = i
            elif token == self.tokens.im_start:  # a user message right after another one
                spans.append((start, i))
                start = i
        if start is not None:
            spans.append((start, len(ids)))
        ids_t = torch.tensor(ids)
        parts = []
        for start, end in spans:
            mask = mm_mask[start:end]
            if hidden is not None and mask.any():
                mm_hidden = hidden[start:end][mask.to(hidden.device)]
            else:
                mm_hidden = torch.zeros(0, self.thinker.config.text_config.hidden_size, device=self.omni.device)
            parts.append(TalkerUserPart(ids_t[start:end], mask, mm_hidden))
        return parts

    # ------------------------------------------------------------------ side passes

    def checkpoint(self, *, before_last_user_message: bool = False) -> Checkpoint:
        """The session as it is, for `restore` after an out-of-band pass over its context (a
        transcript, nodes/qwen3_omni/transcription.py) or an early prefill that was retracted
        (nodes/thinker.py): the history, the last reply (it can still be truncated after), the
        logits a next step starts from, the sampling, a system prompt not fed yet. No forward.
        `before_last_user_message`: `restore` forgets the context's last user message too."""
        length = len(self.context_ids)
        if before_last_user_message:
            ids = self.context_ids
            length = next((i for i in range(len(ids) - 2, -1, -1)
                           if ids[i] == self.tokens.im_start and ids[i + 1] == self.tokens.user), length)
        return Checkpoint(length, list(self.pending), self.turns, self._reply, self._last_logits,
                          self._previous_context, self.sampling, self._generator, list(self._unfed_system))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Undo what happened since `checkpoint` (an out-of-band pass, finished or not): the context
        is cropped back to its length, the rest of the state is the checkpoint's. No forward."""
        if self._closed:
            return
        self._sync_row()
        self._crop_to(min(checkpoint.length, len(self.context_ids)))
        self._count_media()
        self.pending = list(checkpoint.pending)
        self.turns = checkpoint.turns
        self._reply, self._last_logits = checkpoint.reply, checkpoint.last_logits
        self._previous_context = min(checkpoint.previous_context, len(self.context_ids))
        self.sampling, self._generator = checkpoint.sampling, checkpoint.generator
        self._seen = None
        self._unfed_system = list(checkpoint.unfed_system)
        self._interrupt.clear()


@dataclass(frozen=True)
class Checkpoint:
    """A `ThinkerSession`'s state for `restore` (see `ThinkerSession.checkpoint`)."""

    length: int
    pending: list[int]
    turns: int
    reply: _Reply | None
    last_logits: torch.Tensor | None
    previous_context: int
    sampling: Sampling
    generator: torch.Generator | None
    unfed_system: list[int]  # a system prompt noted before the first turn, not fed yet


def _positions_after_each(positions: torch.Tensor) -> list[int]:
    """The next rotary position after each of these tokens ([3, 1, L] positions): one past the
    largest position so far, on any of the three axes."""
    ends = positions.max(dim=0).values[0].cummax(dim=0).values + 1
    return [int(p) for p in ends.tolist()]


class _SlotHolder:
    """Lets the release callback clear the session's slot without keeping the session alive."""

    def __init__(self, session: ThinkerSession):
        self._session = weakref.ref(session)

    def clear(self) -> None:
        session = self._session()
        if session is not None:
            session._slot = None


def _release_row(cache, slot: int, holder: _SlotHolder) -> None:
    with cache.lock:
        holder.clear()
        cache.release(slot)
