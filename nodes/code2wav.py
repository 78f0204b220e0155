"""code2wav node: codec frames -> 24 kHz reply audio, streamed in chunks.

    code2wav: {type: qwen3_omni.code2wav, params: {resource: omni, first_chunk_frames: 1, chunk_frames: 6,
                                                   max_batch: 16}}

Input `codes`: `CodecFrames` from the talker (one or more frames each; an empty one with
`final=True` ends the reply's audio) and the reply's `TurnDone`. Output `audio`: `AudioOut`
chunks (float32 mono, 24 kHz), then the `TurnDone`, so the transport's end of reply always
follows the reply's last audio.

The first chunk is decoded as soon as `first_chunk_frames` frames are in (1 frame = 57 ms of
audio: low time-to-first-audio); the second chunk is as small, then chunks double up to
`chunk_frames` frames (1, 1, 2, 4, 6, ...),
since every decode has a fixed per-call cost. Chunks join without seams: together they equal a
one-shot decode (see `nodes/qwen3_omni/code2wav_stream.py`).

Decodes go through one shared `code2wav` executor: chunks that sessions decode at the same time
share one transformer pass and, same-sized, one conv pass (`push_many`); speech requests at lower
priority. With `compute: {graphs: auto}` (the default) same-sized chunks run as one captured unit
instead (nodes/qwen3_omni/captured_code2wav.py), each key captured in idle compute; `off` keeps
the eager passes.

An `Interrupt` drops the reply's stream at once: no audio of that reply is emitted after it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from graph.messages import AudioOut, CodecFrames, Control, Interrupt, Message, TurnDone
from graph.node import Emit, Node, NodeSession, SessionInfo
from graph.registry import register_node
from nodes.idle_capture import defer_to_idle_compute
from nodes.params import Code2WavParams, decode
from nodes.qwen3_omni.captured_code2wav import attach
from nodes.qwen3_omni.code2wav_stream import SAMPLE_RATE, Code2WavDecoder, Code2WavStream, push_many

log = logging.getLogger(__name__)


@register_node("qwen3_omni.code2wav")
class Code2WavNode(Node):
    params_schema = Code2WavParams
    inputs = {"codes": (CodecFrames, TurnDone)}
    outputs = {"audio": (AudioOut, TurnDone)}
    follows_playback = True  # reply side: scheduled by the session's playback deadline

    def __init__(self, name: str, params: dict[str, Any], context: Any):
        super().__init__(name, params, context)
        self.settings = decode(self.params, Code2WavParams, f"nodes.{name}.params")
        self.first_chunk_frames = self.settings.first_chunk_frames
        self.chunk_frames = self.settings.chunk_frames
        if not (1 <= self.first_chunk_frames and 1 <= self.chunk_frames):
            raise ValueError("code2wav chunk sizes must be at least one frame")
        self.decoder: Code2WavDecoder | None = None
        self.pushes: Any = None

    async def start(self) -> None:
        omni = self.context.resource(self.settings.resource)
        if getattr(omni, "code2wav", None) is None:
            raise ValueError("the checkpoint has no code2wav (audio output disabled)")
        self.decoder = await self.context.compute.run(Code2WavDecoder, omni.code2wav)
        # `compute: {graphs}`: chunks as one captured unit (auto) or the eager passes (off).
        attach(self.decoder, getattr(self.context, "graphs", "auto"))
        unit = self.decoder.chunk_unit
        if unit is not None:  # a key's chunk is captured in idle compute, not in a reply's chunk
            unit.defer = defer_to_idle_compute(self.context.compute, "code2wav chunk")
        # One shared executor: chunks that sessions decode at the same time share one conv pass.
        self.pushes = self.context.compute.batcher(
            "code2wav", lambda pushes: push_many(pushes), max_batch=self.settings.max_batch
        )

    def open_session(self, session: SessionInfo) -> NodeSession:
        return Code2WavSession(self, session)


    def keep_warm(self):
        """A reply's first chunk, decoded from one frame of zero codes on a fresh stream."""
        decoder = self.decoder
        codes = torch.zeros((1, int(decoder.code2wav.config.num_quantizers)), dtype=torch.long)
        return lambda: Code2WavStream(decoder, 1, 1).push(codes, final=True)


class Code2WavSession(NodeSession):
    node: Code2WavNode

    def __init__(self, node: Code2WavNode, session: SessionInfo):
        super().__init__(node, session)
        self._stream: Code2WavStream | None = None
        self._stream_key: tuple[int, str] | None = None  # (turn_id, response_id) of the open stream
        self._interrupts: list[Interrupt] = []  # for turns whose frames may still be on their way

    async def on_message(self, stream: str, message: Message, emit: Emit) -> None:
        if isinstance(message, CodecFrames):
            await self._decode(message, emit)
        elif isinstance(message, TurnDone):
            key = (message.turn_id, message.response_id)
            live = message.status not in ("cancelled", "failed") and not any(interrupt.names(*key) for interrupt in self._interrupts)
            if self._stream is not None and self._stream_key == key and live:
                await self._flush(message, emit)
            self._close_stream()
            self._interrupts = [i for i in self._interrupts if not i.names(*key)]
            await emit("audio", message)

    def on_control(self, control: Control) -> None:
        if not isinstance(control, Interrupt):
            return
        if control.turn_id >= 0 or control.response_id:
            self._interrupts.append(control)  # also stops frames of that turn that arrive later
        if self._stream_key is not None:
            if control.names(*self._stream_key):
                self._close_stream()

    async def close(self) -> None:
        self._close_stream()

    # ------------------------------------------------------------------

    async def _decode(self, message: CodecFrames, emit: Emit) -> None:
        key = (message.turn_id, message.response_id)
        if any(interrupt.names(*key) for interrupt in self._interrupts):
            return
        if self._stream_key != key:
            self._close_stream()
            assert self.node.decoder is not None, "code2wav node not started"
            self._stream = Code2WavStream(self.node.decoder, self.node.first_chunk_frames, self.node.chunk_frames)
            self._stream_key = key
        codes = torch.from_numpy(np.asarray(message.codes, dtype=np.int64).reshape(-1, self._quantizers()))
        stream = self._stream
        samples = await self._push(stream, codes, message.final)
        if stream is self._stream:  # not interrupted meanwhile (that closes the stream)
            await self._emit_audio(samples, message, emit)

    async def _flush(self, done: TurnDone, emit: Emit) -> None:
        stream = self._stream
        assert stream is not None
        if stream.pending_frames:
            empty = torch.empty((0, self._quantizers()), dtype=torch.long)
            samples = await self._push(stream, empty, True)
            if stream is self._stream:
                await self._emit_audio(samples, done, emit)

    async def _push(self, stream: Code2WavStream, codes: torch.Tensor, final: bool) -> torch.Tensor:
        if not final and stream.pending_frames + int(codes.shape[0]) < stream.next_chunk_frames:
            return stream.push(codes)  # only queues the frames: no compute, no executor round trip
        return await self.node.pushes.submit((stream, codes, final))

    async def _emit_audio(self, samples: torch.Tensor, source: Message, emit: Emit) -> None:
        if samples.numel() == 0:
            return
        audio = samples.detach().to(device="cpu", dtype=torch.float32).numpy()
        await emit(
            "audio",
            AudioOut(
                turn_id=source.turn_id,
                media_ms=source.media_ms,
                response_id=getattr(source, "response_id", ""),
                samples=audio,
                sample_rate=SAMPLE_RATE,
            ),
        )

    def _quantizers(self) -> int:
        assert self.node.decoder is not None
        return int(self.node.decoder.code2wav.config.num_quantizers)

    def _close_stream(self) -> None:
        self._stream = None
        self._stream_key = None

