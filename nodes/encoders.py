"""Encoders: the thinker's audio and image encoders, batched across sessions.

    encoders: {type: qwen3_omni.encoders, params: {resource: omni, max_batch: 16, warmup: true}}

Input `features` (`Features` from preprocessing) -> output `embeddings` (`Embeddings` with the
same tensors plus `audio_embeds`, `image_embeds`, `image_deepstack`; see
`nodes.qwen3_omni.media_encoders`). Turns of all sessions that are ready at the same time go
through one audio-tower forward and one vision forward (a shared `Batcher`); turns without
audio or images pass straight through. Speech sessions submit at the lower speech priority.
"""

from __future__ import annotations

from typing import Any

from graph.messages import Embeddings, Features, Message
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.params import EncodersParams, decode
from nodes.qwen3_omni.media_encoders import encode_turns


@register_node("qwen3_omni.encoders")
class Encoders(Node):
    params_schema = EncodersParams
    inputs = {"features": (Features,)}
    follows_playback = True  # on a new turn's first-audio path: due when its listener waits
    outputs = {"embeddings": (Embeddings,)}

    async def start(self) -> None:
        settings = decode(self.params, EncodersParams, f"nodes.{self.name}.params")
        self.omni = omni = self.context.resource(settings.resource)
        self.batcher = self.context.compute.batcher(
            f"{self.name}.encoders",
            lambda turns: encode_turns(omni, turns),
            max_batch=settings.max_batch,
        )
        if settings.warmup:
            await self.context.compute.run(self._warm_up, omni)

    @staticmethod
    def _warm_up(omni) -> None:
        """Half a second of silence and a small image through both encoders (first-call costs)."""
        import io

        import numpy as np
        from PIL import Image

        from nodes.qwen3_omni.inputs import build_turn_inputs

        image = io.BytesIO()
        Image.new("RGB", (64, 64)).save(image, "PNG")
        turn = build_turn_inputs(omni, audio=np.zeros(8000, np.float32), images=[image.getvalue()], text="hi")
        encode_turns(omni, [turn.tensors()])

    def open_session(self, session: SessionInfo) -> NodeSession:
        return EncodersSession(self, session)

    def keep_warm(self):
        """The audio encoder over 0.3 s of silence's features."""
        import numpy as np

        from nodes.qwen3_omni.inputs import build_turn_inputs

        tensors = build_turn_inputs(self.omni, audio=np.zeros(4800, np.float32)).tensors()
        return lambda: encode_turns(self.omni, [dict(tensors)])


class EncodersSession(NodeSession):
    node: Encoders

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        if not isinstance(message, Features):
            return
        tensors: dict[str, Any] = message.tensors
        if tensors.get("audio_features") or tensors.get("pixel_values") is not None:
            tensors = await self.node.batcher.submit(tensors)
        await emit(
            "embeddings",
            Embeddings(
                session_id=message.session_id,
                turn_id=message.turn_id,
                media_ms=message.media_ms,
                item_id=message.item_id,
                tensors=tensors,
                reply=message.reply,
                meta=message.meta,
            ),
        )
