"""Transcripts of the user's committed audio, made by the session's own thinker.

Qwen3-Omni hears the audio it answers, so no second model is needed: once an utterance marked
`Turn.transcribe` is in the session's KV, a pass appends a transcription instruction (a user
message and the assistant header), decodes greedily, text only, and rolls the KV back
(`ThinkerSession.checkpoint` / `restore`): the conversation, the last reply and the next reply's
`cached_tokens` are as if the pass never ran. It reports on the thinker's `text` output:

    TranscriptDelta(item_id, delta)                    each piece of text
    TranscriptCompleted(item_id, transcript, usage)
    TranscriptFailed(item_id, code, message)

A pass never holds up a reply:
- it runs only while the thinker has nothing else to do: an utterance that a reply answers at once
  (`awaited`: server VAD that creates responses) is transcribed after that reply is generated;
- a pass in progress gives way to the next message for the thinker: it stops before its next step,
  its KV is rolled back, and it starts over once the thinker is idle again (without repeating its
  deltas: `completed` carries the whole transcript);
- its compute is due when submitted, like work no listener waits on, not by the session's playback
  clock: a turn waiting for its first audio (due since it was asked for) goes first in the compute
  pool, and a reply waits at most one forward of a pass.
Passes run in commit order. `keep_in_history` False (transcription sessions, which never reply):
the utterance leaves the context with its pass (and never reaches the talker), so a long
transcription session does not fill the context; the next message waits for such a pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from graph.executor import detach_from_playback
from graph.messages import (
    Embeddings,
    Message,
    NodeEvent,
    TalkerPrompt,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
)
from graph.node import Emit
from nodes.qwen3_omni.inputs import build_turn_inputs
from nodes.qwen3_omni.thinker_engine import Sampling, ThinkerError, ThinkerSession

log = logging.getLogger("nodes.transcription")

# Transcript tokens per pass (the session's `max_reply_tokens` bounds it too).
MAX_TRANSCRIPT_TOKENS = 448


@dataclass
class _Job:
    item_id: str
    turn_id: int
    language: str | None
    prompt: str | None
    keep_in_history: bool
    in_history: bool  # the utterance's prefill succeeded
    audio_tokens: int
    deltas_sent: bool = False  # by a pass that then gave way: its restart sends none


def instruction(language: str | None, prompt: str | None, later_spoken: int) -> str:
    """The transcription instruction for the user audio message `later_spoken` messages before
    the last one (0: the last)."""
    if later_spoken == 0:
        target = "the user's last spoken message"
    elif later_spoken == 1:
        target = "the user's spoken message before their last one"
    else:
        target = f"the user's spoken message {later_spoken} before their last one"
    text = f"Transcribe {target} verbatim. Answer with the transcript only."
    if language:
        text += f" The speech is in the language with ISO-639-1 code {language!r}."
    if prompt:
        text += f" Context for the transcript: {prompt}"
    return text


class Transcriber:
    """One session's transcription passes, driven by the thinker's node session:

        await transcriber.give_way()           before the thinker handles a message
        emit = transcriber.emit_for(message, emit)
        ... the thinker handles it ...
        transcriber.handled(message, emit, in_history=...)   after: queue its pass, run if idle
    """

    def __init__(self, engine: ThinkerSession, executor: Any, compute: Any, max_tokens: int = MAX_TRANSCRIPT_TOKENS):
        self.engine = engine
        self.executor = executor
        self.compute = compute
        self.max_tokens = max_tokens
        self.jobs: deque[_Job] = deque()
        self.spoken_items: list[str] = []  # the user audio messages in the history, in order
        self._task: asyncio.Task[None] | None = None
        self._yield = False  # the running passes are asked to stop before their next step
        self._thinker_busy = False
        self._reply_coming = False  # the last message was an utterance a reply answers at once
        self._emit: Emit | None = None

    # ------------------------------------------------------------------ the thinker's hooks

    async def give_way(self) -> None:
        """The thinker is about to use the session's KV: a pass in progress stops (rolled back,
        to start over later) or, where it must, finishes first."""
        self._thinker_busy = True
        task = self._task
        if task is None:
            return
        self._yield = True  # a pass whose utterance is to be forgotten finishes anyway (`_pass`)
        await asyncio.shield(task)

    def emit_for(self, message: Embeddings, emit: Emit) -> Emit:
        """The emitter for handling `message`: an utterance the model forgets after its transcript
        never reaches the talker (it would keep it in its own history)."""
        if not _forgotten(message):
            return emit

        async def without_prompt(stream: str, out: Message) -> None:
            if not (stream == "hidden" and isinstance(out, TalkerPrompt)):
                await emit(stream, out)

        return without_prompt

    def handled(self, message: Embeddings, emit: Emit, in_history: bool) -> None:
        """The thinker has handled `message`: note its transcript, then transcribe if idle."""
        self._thinker_busy = False
        self._emit = emit
        meta = message.meta
        deleted = meta.delete_key
        if deleted is not None:  # the item left the history: so does its transcript, if still to come
            self.jobs = deque(job for job in self.jobs if job.item_id != deleted)
            self.spoken_items = [item for item in self.spoken_items if item != deleted]
        settings = meta.transcribe
        keep = settings is None or bool(settings.get("keep_in_history", True))
        if settings is not None and meta.role == "user":
            self.jobs.append(_Job(
                item_id=message.item_id, turn_id=message.turn_id, language=settings.get("language"),
                prompt=settings.get("prompt"), keep_in_history=keep, in_history=in_history,
                audio_tokens=meta.audio_tokens,
            ))
        if meta.role == "user" and meta.audio_tokens > 0 and in_history and keep:
            self.spoken_items.append(message.item_id)
        self._reply_coming = message.reply is None and meta.awaited
        self._start()

    def reply_cancelled(self) -> None:
        """An Interrupt: the reply an utterance was waiting for may never reach the thinker."""
        if self._reply_coming:
            self._reply_coming = False
            self._start()

    async def close(self) -> None:
        task, self._task = self._task, None
        self.jobs.clear()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ------------------------------------------------------------------ passes

    def _start(self) -> None:
        if self._task is not None or not self.jobs or self._thinker_busy or self._reply_coming:
            return
        self._yield = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transcription")

    async def _run(self) -> None:
        # Due when submitted, never held back: not the reply side's playback clock (module
        # docstring). Its phase stays the session's, as the batchers and the load have read it.
        detach_from_playback(keep_phase=True)
        try:
            while self.jobs and not self._yield:
                if await self._pass(self.jobs[0]):
                    self.jobs.popleft()
        except Exception:
            log.exception("transcription passes stopped")
            self.jobs.clear()
        finally:
            self._task = None

    async def _pass(self, job: _Job) -> bool:
        """One transcript; False: it gave way before finishing (it stays queued)."""
        if not job.in_history:
            await self._report(job, TranscriptFailed, code="transcription_unavailable",
                               message="The utterance could not be added to the model's context, so it was not transcribed.")
            return True
        if job.audio_tokens == 0:
            await self._report(job, TranscriptCompleted, transcript="", usage={})
            return True
        engine = self.engine
        mark = engine.checkpoint(before_last_user_message=not job.keep_in_history)
        sent_before = job.deltas_sent
        cancelled = False
        try:
            later = 0
            if job.keep_in_history and job.item_id in self.spoken_items:
                later = len(self.spoken_items) - self.spoken_items.index(job.item_id) - 1
            text = instruction(job.language, job.prompt, later)
            turn = await self.compute.run(_instruction_turn, engine.omni, text)
            if self._gives_way(job):
                return False
            engine.set_sampling(Sampling())  # greedy: a transcript, not a creative reply
            await self.executor.call(engine.prefill_work(turn, reply=True, out_of_band=True, max_reply_tokens=self.max_tokens))
            while True:
                if self._gives_way(job):
                    return False
                step = await self.executor.decode(engine)
                if step.text and not sent_before:
                    job.deltas_sent = True
                    await self._report(job, TranscriptDelta, delta=step.text)
                if step.finish_reason is not None:
                    break
            transcript, usage = engine.reply_text(), engine.reply_usage()
        except asyncio.CancelledError:
            cancelled = True  # the session is closing: its KV goes with it
            raise
        except ThinkerError as error:
            await self._report(job, TranscriptFailed, code=error.code, message=error.message)
            return True
        except Exception as exc:
            log.exception("transcription of %s failed", job.item_id)
            await self._report(job, TranscriptFailed, code="transcription_failed",
                               message=f"The transcription failed: {type(exc).__name__}: {exc}")
            return True
        finally:
            if not cancelled:
                engine.restore(mark)
        await self._report(job, TranscriptCompleted, transcript=transcript.strip(), usage={
            "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "input_text_tokens": usage.input_text_tokens, "input_audio_tokens": usage.input_audio_tokens,
        })
        return True

    def _gives_way(self, job: _Job) -> bool:
        """Whether the pass stops here for a message (an utterance to be forgotten finishes first)."""
        return self._yield and job.keep_in_history

    async def _report(self, job: _Job, event: type[NodeEvent], **fields: Any) -> None:
        assert self._emit is not None
        await self._emit("text", event(turn_id=job.turn_id, item_id=job.item_id, **fields))


def _instruction_turn(omni: Any, text: str) -> dict[str, Any]:
    return build_turn_inputs(omni, role="user", text=text, add_generation_prompt=True).tensors()


def _forgotten(message: Embeddings) -> bool:
    settings = message.meta.transcribe
    return settings is not None and not settings.get("keep_in_history", True)
