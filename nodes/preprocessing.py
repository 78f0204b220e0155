"""Preprocessing: one `Turn` -> the model inputs of that turn only (`Features`).

    preprocessing: {type: qwen3_omni.preprocessing,
                    params: {resource: omni, max_utterance_frames: 4, max_image_pixels: 200704}}

Input `turns`: `Turn`s from dialog (user utterances with their images, client items, reply
requests) and stateless speech requests. Output `features`: one `Features` per turn with
`tensors` = `nodes.qwen3_omni.inputs.TurnInputs.tensors()` (input_ids, audio features, image
patches, system_ids) and `meta`, a `graph.messages.TurnMeta` (role, insert_after,
delete_key, text_tokens, audio_tokens, image_tokens, awaited, transcribe, speculative, confirms,
retracts: those the `Turn` has, as it has them). A turn that confirms or retracts an early prefill
(nodes/dialog.py) is only its meta: empty `tensors`, no compute (the model holds its content already).

The chat format (see `inputs.py`) is laid out per session:
- every turn carries `tensors["system_ids"]`, the system message the history must start with (the
  session's `instructions`, else the model's default system prompt, with the session's tools):
  the thinker feeds it with the first turn, and when it changes later, replaces the old one and
  rebuilds its KV from there (thinker_history.py); so new instructions apply from the next turn;
- a reply that brings its own instructions (or tools) gets a system message with them in front
  (the history keeps it, with the reply);
- a turn with `reply` ends with the assistant header, so the thinker answers right after it;
- `meta.insert_after` / `meta.delete_key` carry the turn's history edit (`Turn`) to the thinker.

Speech requests (`speak=True`: the reply is exactly `text`) need no thinker: their
`Features.meta` has `speak` set and the `text`, `tensors["reply_ids"]` holds the text's tokens and
`tensors["input_ids"]` the talker's prompt (the instructions as a user message, if any, then the
assistant header).

Feature extraction (log-mel, image resizing) is CPU work: it runs in the compute pool.
"""

from __future__ import annotations

import numpy as np
import torch

from graph.messages import Features, Message, Turn, TurnMeta
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.params import PreprocessingParams, decode
from nodes.qwen3_omni.inputs import build_turn_inputs, system_with_tools, tool_call_text, tool_response_text


@register_node("qwen3_omni.preprocessing")
class Preprocessing(Node):
    params_schema = PreprocessingParams
    inputs = {"turns": (Turn,)}
    outputs = {"features": (Features,)}
    follows_playback = True  # on a new turn's first-audio path: due when its listener waits

    async def start(self) -> None:
        settings = decode(self.params, PreprocessingParams, f"nodes.{self.name}.params")
        self.omni = self.context.resource(settings.resource)
        # Images per turn: the newest ones win (dialog already picks the frames of the utterance).
        self.max_utterance_frames = settings.max_utterance_frames
        # Resize bound per image (None: the checkpoint's). A 1080p frame at Qwen3-Omni's own bound
        # costs ~2,000 thinker tokens for the rest of the session; 448x448 costs ~200.
        self.max_image_pixels = settings.max_image_pixels

    def open_session(self, session: SessionInfo) -> NodeSession:
        return PreprocessingSession(self, session)

    def keep_warm(self):
        """The log-mel features of 0.3 s of silence (what a spoken turn starts with)."""
        omni, silence = self.omni, np.zeros(4800, np.float32)
        return lambda: build_turn_inputs(omni, role="user", audio=silence, add_generation_prompt=True)


class PreprocessingSession(NodeSession):
    node: Preprocessing

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        if not isinstance(message, Turn):
            return
        turn = message
        if turn.confirms is not None or turn.retracts is not None:
            features = self._without_content(turn)  # no compute: on the path to the reply's first audio
        elif turn.speak:
            features = await self.node.context.compute.run(self._speech, turn)
        else:
            features = await self.node.context.compute.run(self._turn, turn)
        await emit("features", features)

    def _turn(self, turn: Turn) -> Features:
        omni = self.node.omni
        reply = turn.reply
        base_prompt = turn.instructions if turn.instructions is not None else omni.system_prompt
        session_prompt = system_with_tools(base_prompt, turn.tools)
        # A reply's own instructions: a system message in front of it (kept with the reply).
        system: str | None = None
        if reply is not None and reply.instructions and reply.instructions != session_prompt:
            system = reply.instructions
        own_tools = reply is not None and bool(reply.tools) and tuple(reply.tools) != tuple(turn.tools)
        if own_tools:
            # This reply's own tools (`response.tools`): told to the model with it.
            system = system_with_tools(system or "", reply.tools)
        role, text = turn.role, turn.text
        if role == "tool":
            role, text = "user", tool_response_text(text or "")
        elif turn.call is not None:
            text = (text or "") + tool_call_text(turn.call["name"], turn.call["arguments"])
        inputs = build_turn_inputs(
            omni,
            role=role,
            text=text,
            audio=turn.audio,
            images=list(turn.images)[-self.node.max_utterance_frames :] if self.node.max_utterance_frames else [],
            system_prompt=system,
            add_generation_prompt=reply is not None,
            max_image_pixels=self.node.max_image_pixels,
        )
        tensors = inputs.tensors()
        # The system message the history must start with; the thinker replaces the one it holds
        # when this differs (and rebuilds its KV).
        tensors["system_ids"] = build_turn_inputs(omni, system_prompt=session_prompt).input_ids
        return Features(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            media_ms=turn.media_ms,
            item_id=turn.item_id,
            tensors=tensors,
            reply=reply,
            meta=_meta(turn, text_tokens=inputs.text_tokens, audio_tokens=inputs.audio_tokens,
                       image_tokens=inputs.image_tokens),
        )

    @staticmethod
    def _without_content(turn: Turn) -> Features:
        """A turn that confirms or retracts an early prefill: the model holds its content (and a
        confirmed utterance's reply header) already, so it is only its meta."""
        return Features(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            media_ms=turn.media_ms,
            item_id=turn.item_id,
            tensors={},
            reply=turn.reply,
            meta=_meta(turn),
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
            meta=TurnMeta(
                role="assistant",
                speak=True,
                text=turn.text or "",
                text_tokens=len(reply_ids) + (prompt.text_tokens - 3 if instructions else 0),
            ),
        )


def _meta(turn: Turn, **token_counts: int) -> TurnMeta:
    """What the thinker must know of the turn besides its tensors, as the `Turn` says it."""
    return TurnMeta(role=turn.role, insert_after=turn.insert_after, delete_key=turn.delete_key,
                    awaited=turn.awaited, transcribe=turn.transcribe, speculative=turn.speculative,
                    confirms=turn.confirms, retracts=turn.retracts, **token_counts)
