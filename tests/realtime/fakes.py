"""A test-only reply node and the realtime profile around it, so tests need no model.

`test.fake_reply` stands where thinker/talker/code2wav stand in the real graph. It keeps a
token history per session like a persistent KV cache would: a reply's `cached_tokens` is the
history that was already prefilled before this turn. It answers a `Turn` carrying `reply` with
`words` TextDeltas, each followed (audio replies) by `chunk_ms` of a 24 kHz tone, pausing
`delay_s` between words; an `Interrupt` stops it at the next word with `TurnDone(cancelled)`.
Every turn and control it saw is recorded per session for assertions. An early prefill's turns
(nodes/dialog.py) are folded as the thinker folds them: a speculative turn waits aside (its
provisional reply unanswered), its confirming turn is recorded as the one turn it makes (with the
speculation's audio and images, the confirm's reply), a retracted one is forgotten.
"""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np

from graph.messages import AudioOut, Control, Interrupt, Message, TextDelta, Turn, TurnDone, Usage
from graph.node import Node, NodeSession
from graph.registry import register_node

AUDIO_TOKENS_PER_S = 25
IMAGE_TOKENS = 16


@register_node("test.fake_reply")
class FakeReply(Node):
    inputs = {"turns": (Turn,)}
    outputs = {"out": (TextDelta, AudioOut, TurnDone)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: dict[str, list[Turn]] = {}
        self.controls: dict[str, list[Control]] = {}
        self.live: set[str] = set()

    def open_session(self, session):
        self.live.add(session.session_id)
        return FakeReplySession(self, session)

    def counters(self) -> dict[str, int]:
        """Turns it answered, all sessions (the node-events metric's plumbing is tested with it)."""
        return {"replies": sum(1 for turns in self.turns.values() for turn in turns if turn.reply is not None)}


class FakeReplySession(NodeSession):
    node: FakeReply

    def __init__(self, node, session):
        super().__init__(node, session)
        self.turns = node.turns.setdefault(session.session_id, [])
        self.controls = node.controls.setdefault(session.session_id, [])
        self.history = 0  # tokens in the "KV cache"
        self.prefilled = 0  # tokens of it already computed
        self.interrupted: set[str] = set()
        self.new_tokens = {"text": 0, "audio": 0, "image": 0}  # added since the last reply
        self.speculative: dict[str, Turn] = {}

    async def on_message(self, stream: str, message: Message, emit) -> None:
        assert isinstance(message, Turn)
        if message.speculative:
            self.speculative[message.item_id] = message
            return
        if message.retracts is not None:
            del self.speculative[message.retracts]
            return
        if message.confirms is not None:
            early = self.speculative.pop(message.confirms)
            message = msgspec.structs.replace(message, audio=early.audio, images=early.images, confirms=None)
        self.turns.append(message)
        text_tokens = len((message.text or "").split())
        audio_tokens = 0 if message.audio is None else int(len(message.audio) / 16000 * AUDIO_TOKENS_PER_S)
        image_tokens = IMAGE_TOKENS * len(message.images)
        self.history += text_tokens + audio_tokens + image_tokens
        for kind, count in (("text", text_tokens), ("audio", audio_tokens), ("image", image_tokens)):
            self.new_tokens[kind] += count
        if message.reply is None:
            return
        params = self.node.params
        reply = message.reply
        cached, self.prefilled = self.prefilled, self.history
        new, self.new_tokens = self.new_tokens, {"text": 0, "audio": 0, "image": 0}
        words = int(params.get("words", 3))
        limit = reply.max_output_tokens
        status, reason = "completed", None
        if limit is not None and limit < words:
            words, status, reason = limit, "incomplete", "max_output_tokens"
        spoken = "audio" in reply.output_modalities
        said = []
        for index in range(words):
            if reply.response_id in self.interrupted:
                status, reason = "cancelled", "interrupted"
                break
            word = f"word{index} "
            said.append(word)
            await emit("out", TextDelta(turn_id=message.turn_id, response_id=reply.response_id, text=word, token_ids=(index,)))
            if spoken:
                samples = tone(float(params.get("chunk_ms", 100)), 440.0 + 20 * index)
                await emit("out", AudioOut(turn_id=message.turn_id, response_id=reply.response_id, samples=samples))
            await asyncio.sleep(float(params.get("delay_s", 0.0)))
        if not reply.out_of_band:
            self.history += len(said)
            self.prefilled = self.history
        usage = Usage(
            input_tokens=self.history - len(said) if not reply.out_of_band else self.history,
            output_tokens=len(said) * (2 if spoken else 1),
            input_text_tokens=new["text"],
            input_audio_tokens=new["audio"],
            input_image_tokens=new["image"],
            cached_tokens=cached,
            output_text_tokens=len(said),
            output_audio_tokens=len(said) if spoken else 0,
        )
        await emit("out", TurnDone(turn_id=message.turn_id, response_id=reply.response_id, status=status, reason=reason, usage=usage, transcript="".join(said)))

    def on_control(self, control: Control) -> None:
        self.controls.append(control)
        if isinstance(control, Interrupt) and control.response_id:
            self.interrupted.add(control.response_id)

    async def close(self) -> None:
        self.node.live.discard(self.session.session_id)


def tone(ms: float, hz: float, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def realtime_profile(reply: dict | None = None, dialog: dict | None = None, limits: dict | None = None, realtime: dict | None = None) -> dict:
    return {
        "model_id": "test-realtime",
        "imports": ["nodes.vad", "nodes.dialog", "tests.realtime.fakes"],
        "nodes": {
            "vad": {"type": "silero_vad"},
            "dialog": {"type": "dialog", "params": dialog or {}},
            "reply": {"type": "test.fake_reply", "params": reply or {}},
        },
        "edges": ["vad.events -> dialog.events", "dialog.turns -> reply.turns"],
        "inputs": {"audio": "vad.audio"},
        "outputs": ["dialog.events", "reply.out"],
        "limits": {"max_sessions": 8, **(limits or {})},
        "realtime": realtime or {},
    }
