"""A test-only speech graph: one node that answers a speak Turn with deterministic audio.

`test.speaker` turns `Turn(role="assistant", text, speak=True)` into `AudioOut` chunks and a
`TurnDone` with usage, computing each chunk through a shared `Batcher` (as a model node would),
at the session's priority. Audio depends only on (voice, seed, text): a tone per voice plus
seeded noise. `params`: chunks_per_word (2), chunk_ms (100), step_delay_s (0: how long one
executor step blocks its thread), max_batch (8), close_delay_s (0: how long closing a session takes,
as freeing a model's state can). Text containing "FAIL" fails the session after one chunk.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections import Counter

import numpy as np

from graph.errors import NodeFailure
from graph.executor import current_priority
from graph.messages import AudioOut, Turn, TurnDone, Usage
from graph.node import Node, NodeSession
from graph.registry import register_node, register_resource

RATE = 24000
VOICE_HZ = {"chelsie": 220.0, "ethan": 330.0, "aiden": 440.0}


class FakeVoices:
    speakers = ("chelsie", "ethan", "aiden")
    default_speaker = "ethan"
    output_sample_rate = RATE


@register_resource("test.voices")
def make_voices(params):
    return FakeVoices()


def render_chunk(voice: str, seed: int, index: int, samples: int) -> np.ndarray:
    rng = np.random.default_rng([seed, index])
    t = (np.arange(samples) + index * samples) / RATE
    tone = 0.3 * np.sin(2 * np.pi * VOICE_HZ.get(voice, 300.0) * t)
    return (tone + 0.02 * rng.standard_normal(samples)).astype(np.float32)


@register_node("test.speaker")
class FakeSpeaker(Node):
    inputs = {"turns": (Turn,)}
    outputs = {"audio": (AudioOut, TurnDone)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps: Counter[str] = Counter()  # executor steps run, per session
        self.closed: list[str] = []
        self.turns: list[Turn] = []
        self.priorities: list[int] = []
        self.order: list[str] = []  # the session of every executor step, in the order they ran
        self.batch_sizes: list[int] = []  # items of every executor call

    async def start(self) -> None:
        max_batch = int(self.params.get("max_batch", 8))
        self.batcher = self.context.compute.batcher(f"{self.name}-executor", self._run_steps, max_batch=max_batch)

    def _run_steps(self, items):
        delay = float(self.params.get("step_delay_s", 0))
        if delay:
            threading.Event().wait(delay)  # a blocking "forward", off the event loop
        self.batch_sizes.append(len(items))
        results = []
        for session_id, voice, seed, index, samples in items:
            self.steps[session_id] += 1
            self.order.append(session_id)
            results.append(render_chunk(voice, seed, index, samples))
        return results

    def open_session(self, session):
        node = self

        class State(NodeSession):
            async def on_message(self, stream, turn, emit):
                assert turn.role == "assistant" and turn.speak and turn.reply is not None
                node.turns.append(turn)
                reply = turn.reply
                seed = int(reply.sampling.get("seed", zlib.crc32(turn.text.encode())))
                words = max(1, len(turn.text.split()))
                planned = words * int(node.params.get("chunks_per_word", 2))
                limit = reply.max_output_tokens or planned
                chunks = min(planned, limit)
                samples = int(RATE * float(node.params.get("chunk_ms", 100)) / 1000)
                node.priorities.append(current_priority.get())  # set by the runtime from the session kind
                for index in range(chunks):
                    audio = await node.batcher.submit((self.session.session_id, reply.voice, seed, index, samples))
                    await emit("audio", AudioOut(turn_id=turn.turn_id, response_id=reply.response_id, samples=audio))
                    if "FAIL" in turn.text:
                        raise NodeFailure("synthesis_failed", "the fake speaker was asked to fail")
                text_tokens = len(turn.text.split()) + len((turn.instructions or "").split())
                usage = Usage(input_tokens=text_tokens, input_text_tokens=text_tokens, output_tokens=chunks, output_audio_tokens=chunks)
                status = "incomplete" if chunks < planned else "completed"
                await emit("audio", TurnDone(turn_id=turn.turn_id, response_id=reply.response_id, status=status, usage=usage))

            async def close(self):
                if delay := float(node.params.get("close_delay_s", 0)):
                    await asyncio.sleep(delay)
                node.closed.append(self.session.session_id)

        return State(self, session)


def speaker_profile(voices_dir, **speaker_params) -> dict:
    speech = {"voices_dir": str(voices_dir)}
    speech.update(speaker_params.pop("speech", {}))
    return {
        "model_id": "test-tts",
        "imports": ["tests.speech.fake_speaker"],
        "resources": {"voices": {"type": "test.voices"}},
        "nodes": {"speaker": {"type": "test.speaker", "params": speaker_params}},
        "inputs": {"speech": "speaker.turns"},
        "outputs": ["speaker.audio"],
        "speech": speech,
    }


def with_speaker(profile: dict, voices_dir, **speaker_params) -> dict:
    """`profile` (a realtime one) that also answers speech requests with the fake speaker."""
    speech = speaker_profile(voices_dir, **speaker_params)
    profile["imports"] += speech["imports"]
    profile["resources"] = speech["resources"]
    profile["nodes"].update(speech["nodes"])
    profile["inputs"].update(speech["inputs"])
    profile["outputs"] += speech["outputs"]
    profile["speech"] = speech["speech"]
    return profile
