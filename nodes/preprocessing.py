"""Preprocessing: one `Turn` -> the model inputs of that turn only (`Features`).

    preprocessing: {type: qwen3_omni.preprocessing,
                    params: {resource: omni, max_utterance_frames: 4, max_image_pixels: 200704}}

Input `turns`: `Turn`s from dialog (user utterances with their images, client items, reply
requests) and stateless speech requests. Output `features`: one `Features` per turn with
`tensors` = `nodes.qwen3_omni.inputs.TurnInputs.tensors()` (input_ids, audio features, image
patches) and `meta` = {role, out_of_band, text_tokens, audio_tokens, image_tokens}.

The chat format (see `inputs.py`) is laid out per session:
- the first turn opens with the system prompt: the session's `instructions`, else the model's
  default system prompt;
- when the session's instructions change later, or a reply brings its own, a system message with
  them goes in front of the turn (the history keeps it: the thinker's KV is append-only);
- a turn with `reply` ends with the assistant header, so the thinker answers right after it.

Speech requests (`speak=True`: the reply is exactly `text`) need no thinker: their
`Features.meta["speak"]` is set, `tensors["reply_ids"]` holds the text's tokens and
`tensors["input_ids"]` the talker's prompt (the instructions as a user message, if any, then the
assistant header).

Feature extraction (log-mel, image resizing) is CPU work: it runs in the compute pool.
"""

from __future__ import annotations

import torch

from graph.messages import Features, Message, Turn
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.qwen3_omni.inputs import build_turn_inputs


@register_node("qwen3_omni.preprocessing")
class Preprocessing(Node):
    inputs = {"turns": (Turn,)}
    outputs = {"features": (Features,)}
    follows_playback = True  # on a new turn's first-audio path: due when its listener waits

    async def start(self) -> None:
        self.omni = self.context.resource(self.params.get("resource", "omni"))
        # Images per turn: the newest ones win (dialog already picks the frames of the utterance).
        self.max_utterance_frames = int(self.params.get("max_utterance_frames", 4))
        # Resize bound per image (None: the checkpoint's). A 1080p frame at Qwen3-Omni's own bound
        # costs ~2,000 thinker tokens for the rest of the session; 448x448 costs ~200.
        max_pixels = self.params.get("max_image_pixels")
        self.max_image_pixels = int(max_pixels) if max_pixels else None

    def open_session(self, session: SessionInfo) -> NodeSession:
        return PreprocessingSession(self, session)


class PreprocessingSession(NodeSession):
    node: Preprocessing

    def __init__(self, node: Preprocessing, session: SessionInfo):
        super().__init__(node, session)
        self.system_prompt: str | None = None  # the instructions the history holds
        self.started = False  # the history holds a first turn

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        if not isinstance(message, Turn):
            return
        turn = message
        if turn.speak:
            features = await self.node.context.compute.run(self._speech, turn)
        else:
            features = await self.node.context.compute.run(self._turn, turn)
        await emit("features", features)

    def _turn(self, turn: Turn) -> Features:
        omni = self.node.omni
        reply = turn.reply
        out_of_band = bool(reply and reply.out_of_band)
        session_prompt = turn.instructions if turn.instructions is not None else omni.system_prompt
        system: str | None = None
        if not self.started or (turn.instructions is not None and turn.instructions != self.system_prompt):
            system = session_prompt
        if reply is not None and reply.instructions and reply.instructions != (system or self.system_prompt):
            system = reply.instructions if system is None else f"{system}\n\n{reply.instructions}"
        inputs = build_turn_inputs(
            omni,
            role=turn.role,
            text=turn.text,
            audio=turn.audio,
            images=list(turn.images)[-self.node.max_utterance_frames :] if self.node.max_utterance_frames else [],
            system_prompt=system,
            add_generation_prompt=reply is not None,
            max_image_pixels=self.node.max_image_pixels,
        )
        if not out_of_band:
            self.started = True
            if system is not None and (reply is None or not reply.instructions):
                self.system_prompt = system
        return Features(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            media_ms=turn.media_ms,
            item_id=turn.item_id,
            tensors=inputs.tensors(),
            reply=reply,
            meta={
                "role": turn.role,
                "out_of_band": out_of_band,
                "text_tokens": inputs.text_tokens,
                "audio_tokens": inputs.audio_tokens,
                "image_tokens": inputs.image_tokens,
            },
        )

    def _speech(self, turn: Turn) -> Features:
        omni = self.node.omni
        instructions = turn.instructions or (turn.reply.instructions if turn.reply else None)
        prompt = build_turn_inputs(omni, role="user", text=instructions, add_generation_prompt=True)
        reply_ids = omni.tokenizer(turn.text or "", add_special_tokens=False, split_special_tokens=True).input_ids
        return Features(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            media_ms=turn.media_ms,
            item_id=turn.item_id,
            tensors={
                "input_ids": torch.tensor(prompt.input_ids, dtype=torch.long),
                "reply_ids": torch.tensor(reply_ids, dtype=torch.long),
            },
            reply=turn.reply,
            meta={
                "role": "assistant",
                "speak": True,
                "text": turn.text or "",
                "text_tokens": len(reply_ids) + (prompt.text_tokens - 3 if instructions else 0),
                "audio_tokens": 0,
                "image_tokens": 0,
            },
        )
