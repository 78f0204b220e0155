"""Cross-session batching for the thinker: one forward for the decode steps of every ready session.

Two pieces, shared by all sessions of one model:

- `ThinkerRunner` owns the model's `SlotKVCache` (slot_cache.py: one KV row per session) and
  runs forwards: `forward_rows` for a prefill chunk of one row (the HF text model),
  `forward_chunks` for chunks of several rows padded into one forward, `answer` for
  one new token on each of many rows (one forward, whatever the rows' lengths; through
  `LeanDecode`, lean_decode.py, the text model's layers without transformers' per-call
  wrappers, same logits; `runner.lean = False` or a hook on the model: the HF text model)
  and the next token of every row that asks for one, chosen on the device for all of them
  at once (thinker_sampling.py): one read of the chosen ids per step, no other host sync.
  With `compute: {graphs: auto}` (`graphs`) a decode step (greedy, sampled or under a grammar
  mask) runs as one captured unit, forward and choice (captured_thinker.py `StepUnit`: a CUDA
  graph on CUDA, a trace on CPU; the same tokens, the logits to float rounding).
  Every forward holds the cache's lock, so direct calls from compute threads (tests, warm-up,
  truncate) and the executor's worker never overlap.
- `ThinkerExecutor` is the shared executor the thinker node submits to (a `graph.executor.Batcher`
  named "thinker"). A session's model call (`ThinkerSession.decode_work()`,
  `.prefill_work(...)`, `.truncate_work(...)`) is a generator that yields forward requests
  (`Feed`: one token, and the choice of the next; `Choose`: a next token from a prefill's
  logits; `Chunk`: a slice of a prefill) and returns the call's result. The batch function
  advances every submitted call to its next request, runs ALL pending `Feed`s as one forward
  (the `Choose`s join its sampler pass), repeats while feeds keep coming (a reply that ends in
  this step feeds its last token), then ONE prefill forward: the first waiting `Chunk` (a new
  turn's prefill, `prefill_chunk_tokens` at most) together with the other sessions' waiting
  text/audio chunks, padded into one batch of at most `PREFILL_BATCH_TOKENS` (`forward_chunks`: turns that arrive
  together are prefilled together), and hands every other unfinished call back with `AGAIN` (its
  caller resubmits it; the generator keeps its place). So a prefill never holds in-flight decodes
  for more than one such forward, and a long prompt is interleaved with decode steps chunk by
  chunk. Calls come most urgent first; only chunks of calls more urgent than every call that fed
  in this batch go through, and a call resubmitted after one of its chunks ran is due no earlier
  than now (`graph.executor.continuation_due`): a long prefill takes one chunk per round and
  never delays another session's first audio by more than the chunk in progress
  (docs/batching.md). A call handed back before any of it ran keeps its place in line (the due
  time of its first submission, or its task's if that became earlier): due "now" at every try,
  an utterance prefilled in its pause went behind every reply that fed, batch after batch, and
  at 64 sessions could still be waiting when its turn ended.

Why not transformers' own machinery: re-packing DynamicCaches per step or one padded
DynamicCache were slower here and stall on joins (docs/notebook/2026-12-01-batching-numbers.md);
continuous batching takes token ids only (no audio/image embeddings) and keeps KV in an
evictable prefix cache.

Priorities come from the `Batcher`: the session's, set by the runtime for its node task
(graph/executor.py), so live sessions go before speech requests.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from graph.executor import continuation_due, submission_due
from nodes.qwen3_omni.captured_thinker import StepUnit
from nodes.qwen3_omni.compute_graphs import check_graphs, graphs_of
from nodes.qwen3_omni.lean_decode import LeanDecode
from nodes.qwen3_omni.slot_cache import SlotKVCache, padded_group
from nodes.qwen3_omni.thinker_requests import Choose, Chunk, Fed, Feed, ThinkerError, Work
from nodes.qwen3_omni.thinker_sampling import ThinkerSampler, device_longs

if TYPE_CHECKING:
    from nodes.qwen3_omni.model import OmniModel

__all__ = ["AGAIN", "Choose", "Chunk", "Fed", "Feed", "ThinkerError", "ThinkerExecutor", "ThinkerRunner", "Work", "run_calls"]

# Returned by the batch function for a call that is not finished yet: submit it again.
AGAIN: Any = type("Again", (), {"__repr__": lambda self: "AGAIN"})()


class ThinkerRunner:
    """Runs the thinker's text model on rows of a shared slot cache (one per model)."""

    _by_model: weakref.WeakKeyDictionary[Any, ThinkerRunner] = weakref.WeakKeyDictionary()

    def __init__(self, omni: OmniModel, slots: int = 4, capacity: int = 256, grow: bool = True,
                 graphs: str | None = None):
        """`slots` x `capacity` tokens are allocated now; with `grow`, rows and columns grow on demand
        after (columns up to the model's `max_seq_len` bound, unless a session's own bound is
        larger); without, that is all (slot_cache.py). `graphs`: `compute: {graphs}` (None: what
        `compute_graphs.set_graphs` set on the model)."""
        self.thinker = omni.thinker
        self.language_model = self.thinker.model.language_model
        self.embed_tokens = self.thinker.get_input_embeddings()
        self.device = omni.device
        weight = self.thinker.lm_head.weight
        self.cache = SlotKVCache.for_text_config(
            self.thinker.config.text_config, dtype=weight.dtype, device=weight.device, slots=slots, capacity=capacity,
            max_capacity=getattr(getattr(omni, "bounds", None), "max_seq_len", None), grow=grow,
        )
        # Decode forwards (`feed`) run the text model's layers directly (lean_decode.py) when it
        # applies; False: always through the HF text model (tests compare the two).
        self.lean = True
        self.lean_decode = LeanDecode(self.thinker)
        # `compute: {graphs}`: "auto" runs the decode steps it can as one captured unit
        # (captured_thinker.py), "off" every step eager.
        self.graphs = check_graphs(graphs) if graphs is not None else graphs_of(getattr(omni, "model", omni))
        self._step_unit: StepUnit | None = None
        self._tokens = getattr(omni, "tokens", None)  # the model's special ids (what the sampler bans)
        self._sampler: ThinkerSampler | None = None
        self.forwards = 0  # model calls (for tests and metrics)
        self.rows_forwarded = 0

    @property
    def sampler(self) -> ThinkerSampler:
        """Chooses the rows' next tokens (built at the first choice: forwards alone need no token ids)."""
        if self._sampler is None:
            tokens = self._tokens
            self._sampler = ThinkerSampler(self.thinker.config.text_config.vocab_size, tokens.suppressed, tokens.eos,
                                           self.device)
        return self._sampler

    @property
    def step_unit(self) -> StepUnit | None:
        """The captured decode step (made at the first use), None with `graphs: off` or when the
        lean layers cannot run this model (`LeanDecode.why_not`)."""
        if self.graphs == "off" or not self.lean:
            return None
        if self._step_unit is None:
            self._step_unit = StepUnit(self)
        return self._step_unit if self._step_unit.why_not is None else None

    @classmethod
    def for_model(cls, omni: OmniModel, **sizes: int) -> ThinkerRunner:
        """The runner (and slot cache) shared by every session of this model; `sizes` (slots,
        capacity) apply when this call creates it."""
        key = omni.thinker
        runner = cls._by_model.get(key)
        if runner is None:
            runner = cls._by_model.setdefault(key, cls(omni, **sizes))
        return runner

    @torch.inference_mode()
    def forward_rows(self, request: Chunk) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.cache.lock:
            _check_owner(request)
            batch = self.cache.batch([request.slot], request.embeds.shape[1])
            out = self._run(batch, request.embeds, request.positions, request.deepstack, request.visual_mask,
                            request.hidden_layer is not None)
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1, :])[0]
        hidden = out.hidden_states[request.hidden_layer][0] if request.hidden_layer is not None else None
        return logits, hidden

    @torch.inference_mode()
    def forward_chunks(self, requests: list[Chunk]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Prefill chunks of several rows in ONE forward (text and audio only: no deepstack), each
        padded at its end to the longest. A chunk's tokens see only the columns before them, so the
        padding changes none of them; each row's length then counts its own tokens only (the
        padding's columns are masked until overwritten). -> (logits, hidden) per request."""
        if len(requests) == 1:
            return [self.forward_rows(requests[0])]
        lengths = [request.embeds.shape[1] for request in requests]
        count, longest = len(requests), max(lengths)
        first = requests[0].embeds
        embeds = first.new_zeros(count, longest, first.shape[-1])
        positions = requests[0].positions.new_zeros(3, count, longest)
        for b, (request, length) in enumerate(zip(requests, lengths)):
            embeds[b, :length] = request.embeds[0]
            positions[:, b, :length] = request.positions[:, 0]
        layers = {request.hidden_layer for request in requests} - {None}
        with self.cache.lock:
            for request in requests:
                _check_owner(request)
            batch = self.cache.batch([request.slot for request in requests], longest)
            out = self._run(batch, embeds, positions, None, None, bool(layers), lengths=lengths)
        last = out.last_hidden_state[torch.arange(count), torch.tensor(lengths) - 1]  # [B, D]
        logits = self.thinker.lm_head(last)
        return [
            (logits[b], out.hidden_states[request.hidden_layer][b, :length] if request.hidden_layer is not None else None)
            for b, (request, length) in enumerate(zip(requests, lengths))
        ]

    @torch.inference_mode()
    def feed(self, requests: list[Feed]) -> list[torch.Tensor]:
        """One forward for one new token on each of the requests' rows -> logits per request
        (their choices are not made: `answer` makes them)."""
        logits, order = self._feed_forward(requests)
        by_request: list[torch.Tensor] = [None] * len(requests)  # type: ignore[list-item]
        for row_logits, index in zip(logits, order):
            by_request[index] = row_logits
        return by_request

    @torch.inference_mode()
    def answer(self, requests: list[Feed | Choose]) -> list[Fed]:
        """A step's `Feed`s through one forward, then the next token of every request with a
        choice (the feeds' and the `Choose`s') in one pass of the sampler, on the device: one
        read of the chosen ids for the whole step (thinker_sampling.py); the feeds as one
        captured unit where `step_unit` can take them. -> a `Fed` per request."""
        unit = self.step_unit
        if unit is not None:
            with self.cache.lock:
                fed = [request for request in requests if isinstance(request, Feed)]
                captured = unit.capturable(fed)
                if captured is not None:
                    return self._captured_answer(unit, requests, fed, captured)
        feeds = [index for index, request in enumerate(requests) if isinstance(request, Feed)]
        rows: list[tuple[int, torch.Tensor]] = []  # (request index, its logits), in the sampler's order
        logits = None
        if feeds:
            logits, order = self._feed_forward([requests[index] for index in feeds])
            rows = [(feeds[place], row_logits) for place, row_logits in zip(order, logits)]
        rows += [(index, request.logits) for index, request in enumerate(requests) if isinstance(request, Choose)]
        chosen = [place for place, (index, _) in enumerate(rows) if requests[index].choice is not None]
        tokens: list[int | None] = [None] * len(rows)
        if chosen:
            if logits is not None and len(chosen) == len(rows) == logits.shape[0]:
                scores = logits  # a plain decode step: the forward's rows as they are
            else:
                scores = torch.stack([rows[place][1] for place in chosen])
            for place, token in zip(chosen, self.sampler.choose(scores, [requests[rows[place][0]].choice
                                                                         for place in chosen])):
                tokens[place] = token
        answers: list[Fed] = [None] * len(requests)  # type: ignore[list-item]
        for (index, row_logits), token in zip(rows, tokens):
            answers[index] = Fed(row_logits, token)
        return answers

    def _captured_answer(self, unit: StepUnit, requests: list[Feed | Choose], feeds: list[Feed],
                         captured: tuple[int, bool]) -> list[Fed]:
        """`answer` with the feeds' step as one captured unit (captured_thinker.py): their logits
        and greedy tokens; the `Choose`s of the step (first tokens from prefills) through the
        sampler; one read of all the chosen ids."""
        for feed in feeds:
            _check_owner(feed)
        feeds = sorted(feeds, key=lambda feed: feed.slot)  # as the eager step's rows (the cache's first rows: views)
        logits, tokens = unit.run(feeds, *captured)
        self.forwards += 1
        self.rows_forwarded += len(feeds)
        chooses = [request for request in requests if isinstance(request, Choose)]
        if chooses:
            scores = torch.stack([request.logits for request in chooses])
            picked, order = self.sampler.pick(scores, [request.choice for request in chooses])
            ids = torch.cat((tokens, picked)).tolist()  # the step's one read
            chosen = [0] * len(chooses)
            for row, token in zip(order, ids[len(feeds):]):
                chosen[row] = token
        else:
            ids, chosen = tokens.tolist(), []  # the step's one read
        by_feed = {id(feed): (row_logits, token) for feed, row_logits, token in zip(feeds, logits, ids)}
        by_choose = iter(zip(chooses, chosen))
        answers = []
        for request in requests:
            if isinstance(request, Feed):
                row_logits, token = by_feed[id(request)]
                answers.append(Fed(row_logits, token if request.choice is not None else None))
            else:
                choose, token = next(by_choose)
                answers.append(Fed(choose.logits, token))
        return answers

    def _feed_forward(self, requests: list[Feed]) -> tuple[torch.Tensor, list[int]]:
        """One forward for one new token on each of the requests' rows -> (logits [B, V] with the
        rows in slot order, the index in `requests` of each row)."""
        order = sorted(range(len(requests)), key=lambda i: requests[i].slot)
        requests = [requests[i] for i in order]  # rows in slot order: a contiguous set is read as a view
        tokens_positions = device_longs([[r.token for r in requests], [r.position for r in requests]], self.device)
        ids, positions = tokens_positions.unbind()
        with self.cache.lock:
            for request in requests:
                _check_owner(request)
            batch = self.cache.batch([r.slot for r in requests], 1)
            if self.lean and self.lean_decode.usable():
                logits = self.lean_decode(ids, positions, batch)  # [B, V]
                self._commit(batch)
                return logits, order
            embeds = self.embed_tokens(ids[:, None])  # [B, 1, D]
            out = self._run(batch, embeds, positions.view(1, -1, 1).expand(3, -1, 1), None, None, False)
        return self.thinker.lm_head(out.last_hidden_state[:, -1, :]), order  # [B, V]

    def _run(self, batch, embeds, positions, deepstack, visual_mask, want_hidden, lengths=None):
        position_ids = torch.cat([batch.text_positions()[None], positions.to(batch.mask.device)], dim=0)
        out = self.language_model(
            inputs_embeds=embeds,
            position_ids=position_ids,
            attention_mask=batch.mask,
            cache=batch,
            use_cache=True,
            output_hidden_states=want_hidden,
            deepstack_visual_embeds=deepstack,
            visual_pos_masks=visual_mask,
        )
        self._commit(batch, lengths)
        return out

    def _commit(self, batch, lengths: list[int] | None = None) -> None:
        """After a forward: the batch's new columns count (`lengths`: of each row, when they were
        padded), and so does the forward."""
        batch.commit(lengths)
        self.forwards += 1
        self.rows_forwarded += len(batch.rows)

    # ------------------------------------------------------------------ driving calls

    def run_alone(self, work: Work) -> Any:
        """Run one session's call to the end, each request as its own forward (no batching)."""
        try:
            request = next(work)
            while True:
                if isinstance(request, (Feed, Choose)):
                    answer: Any = self.answer([request])[0]
                else:
                    answer = self.forward_rows(request)
                request = work.send(answer)
        except StopIteration as stop:
            return stop.value


def _check_owner(request: Feed | Choose | Chunk) -> None:
    """A closed session's row may already belong to another session: never write to it."""
    if request.owner is not None and request.owner._slot != request.slot:
        raise ThinkerError("session_closed", "the session is closed")


def _owns_row(request: Feed | Choose | Chunk) -> bool:
    return request.owner is None or request.owner._slot == request.slot


class _Call:
    """A submitted call: its generator and the request it is waiting on (kept across submissions)."""

    __slots__ = ("work", "request", "started", "ran")

    def __init__(self, work: Work):
        self.work = work
        self.request: Feed | Choose | Chunk | None = None
        self.started = False
        self.ran = False  # a forward has answered one of its requests


def run_calls(runner: ThinkerRunner, calls: list[_Call]) -> list[Any]:
    """The executor's batch function (see the module docstring). One result per call: its return
    value, its exception, or `AGAIN`."""
    results: list[Any] = [AGAIN] * len(calls)
    waiting: dict[int, Feed | Choose | Chunk] = {}

    def advance(index: int, answer: Any = None) -> None:
        call = calls[index]
        try:
            if not call.started:
                call.started = True
                request = next(call.work)
            else:
                request = call.work.send(answer)
        except StopIteration as stop:
            results[index] = stop.value
            waiting.pop(index, None)
            call.request = None
            return
        except Exception as exc:  # noqa: BLE001 - fails that session's call alone
            results[index] = exc
            waiting.pop(index, None)
            call.request = None
            return
        waiting[index] = request
        call.request = request

    def fail(indices: list[int], exc: BaseException) -> None:
        for index in indices:
            calls[index].work.close()
            results[index] = exc
            waiting.pop(index, None)

    def still_open(indices: list[int]) -> list[int]:
        """`indices` whose session still holds its row (with the cache's lock held); the others fail."""
        closed = [index for index in indices if not _owns_row(waiting[index])]
        if closed:
                fail(closed, ThinkerError("session_closed", "the session is closed"))
        return [index for index in indices if _owns_row(waiting[index])]

    for index, call in enumerate(calls):
        if call.request is None:
            advance(index)
        else:
            waiting[index] = call.request
    chunk_run = False
    # Calls come most urgent first. A prefill chunk of a call less urgent than one that fed in
    # this batch waits for the next batch (AGAIN): a long prefill never slows down, step by
    # step, a more urgent reply (another session's first audio) by one chunk per token.
    first_fed = len(calls)

    def forward(indices: list[int], run) -> tuple[list[int], Any]:
        """`run` over the rows of `indices` still open, as one forward: (the rows it ran, its
        outputs); ([], ()) when none is left or it failed (then every row got the error)."""
        with runner.cache.lock:  # closing sessions drop out here; the rest go through together
            indices = still_open(indices)
            if not indices:
                return [], ()
            for index in indices:
                calls[index].ran = True
            try:
                return indices, run([waiting[index] for index in indices])
            except Exception as exc:  # noqa: BLE001 - the forward failed for all its rows
                fail(indices, exc)
                return [], ()

    while True:
        feeds = [index for index, request in waiting.items() if isinstance(request, (Feed, Choose))]
        rows: set[int] = set()
        batch = []
        for index in feeds:  # a row can be fed once per forward (one call per session)
            if waiting[index].slot not in rows:
                rows.add(waiting[index].slot)
                batch.append(index)
        if batch:
            batch, answers = forward(batch, runner.answer)
            if batch:
                first_fed = min(first_fed, *batch)
            for index, answer in zip(batch, answers):
                advance(index, answer)
            continue
        chunks = sorted(index for index, request in waiting.items() if isinstance(request, Chunk) and index < first_fed)
        if not chunks or chunk_run:
            break
        chunk_run = True
        group, answers = forward(_prefill_group([(index, waiting[index]) for index in chunks]), runner.forward_chunks)
        for index, answer in zip(group, answers):
            advance(index, answer)
    return results


# The padded tokens one forward of several sessions' prefill chunks may hold (rows x longest chunk).
PREFILL_BATCH_TOKENS = 1024


def _prefill_group(chunks: list[tuple[int, Chunk]]) -> list[int]:
    """The chunks that go through one forward: the first waiting one, and with it the other text
    and audio chunks (images carry deepstack features: alone) of other rows while the padded
    batch stays within `PREFILL_BATCH_TOKENS` (turns that arrive together: one forward)."""
    first_index, first = chunks[0]
    if first.deepstack is not None:
        return [first_index]
    candidates, rows = [(first_index, first)], {first.slot}
    for index, chunk in chunks[1:]:  # a row's first waiting chunk only: its chunks go in order
        if chunk.deepstack is None and chunk.slot not in rows:
            candidates.append((index, chunk))
            rows.add(chunk.slot)
    lengths = [chunk.embeds.shape[1] for _, chunk in candidates]
    return [candidates[place][0] for place in padded_group(lengths, PREFILL_BATCH_TOKENS)]


class ThinkerExecutor:
    """The shared thinker executor: sessions' model calls, batched across sessions."""

    def __init__(self, compute: Any, omni: OmniModel, max_batch: int = 64, name: str = "thinker",
                 linger_s: float = 0.002, **sizes: int):
        """`linger_s`: how long a batch waits for the sessions of its last batch to come back
        before it runs smaller (graph/executor.py: the compute worker runs other work meanwhile)."""
        self.runner = ThinkerRunner.for_model(omni, **sizes)
        self.batcher = compute.batcher(name, lambda calls: run_calls(self.runner, calls), max_batch=max_batch,
                                       linger_s=linger_s)

    async def call(self, work: Work, priority: int | None = None) -> Any:
        """Run one session's call (a generator from `ThinkerSession.*_work`) to its result."""
        call = _Call(work)
        due = first_due = submission_due()
        while (result := await self.batcher.submit(call, priority, due)) is AGAIN:
            if call.ran:  # a long prefill's next chunk goes after work waiting since before it
                due = continuation_due()
            else:  # handed back before its first forward (more urgent calls fed): it keeps its place
                due = min(first_due, submission_due())
        return result

    async def decode(self, session: Any, priority: int | None = None) -> Any:
        return await self.call(session.decode_work(), priority)

    async def prefill(self, session: Any, turn: dict[str, Any], priority: int | None = None,
                      **options: Any) -> Any:
        return await self.call(session.prefill_work(turn, **options), priority)
