"""Sessions first: speech requests never push a live session's model steps back.

A speech request's graph session is of kind `speech`, so its nodes submit at `PRIORITY_SPEECH`;
a live session's at `PRIORITY_REALTIME`. With speech requests keeping the executor busy, a live
reply's steps still run as soon as they are submitted: at most the one speech step already
running sits between two of them (a FIFO executor would put every queued speech step there).
"""

import asyncio

import httpx

from graph.messages import ReplyParams, Turn, TurnDone
from tests.conftest import eventually, running_server
from tests.speech.conftest import speaker_node
from tests.speech.fake_speaker import speaker_profile


async def stream_speech(client: httpx.AsyncClient, words: int) -> None:
    body = {"input": "word " * words, "response_format": "pcm", "stream_format": "audio"}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        async for _ in response.aiter_bytes():
            pass


async def live_reply(server):
    """A live (realtime) session speaks one five-word reply; returns the session once it is done."""
    live = await server.runtime.open_session("live-1", kind="realtime")
    await live.send("speech", Turn(turn_id=0, role="assistant", text="a b c d e", speak=True, reply=ReplyParams(response_id="r1")))
    async for message in live.outputs():
        if isinstance(message, TurnDone):
            break
    return live


async def test_a_live_reply_overtakes_queued_speech_work(tmp_path):
    profile = speaker_profile(tmp_path, step_delay_s=0.02, max_batch=1)
    async with running_server(profile, enable_realtime=False) as server:
        node = speaker_node(server)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            speech = [asyncio.create_task(stream_speech(client, words=40)) for _ in range(4)]
            await eventually(lambda: len(node.steps) == 4 and min(node.steps.values()) >= 2, what="4 speech requests running")

            live = await live_reply(server)
            speech_progress = {sid: n for sid, n in node.steps.items() if sid != "live-1"}
            await live.close()
            for task in speech:
                task.cancel()
            await asyncio.gather(*speech, return_exceptions=True)

        live_steps = [i for i, session_id in enumerate(node.order) if session_id == "live-1"]
        assert len(live_steps) == 10
        between = [b - a - 1 for a, b in zip(live_steps, live_steps[1:])]
        assert max(between) <= 1, f"speech steps ran between live steps: {between}"
        # The executor was contended the whole time: speech kept running beside the live reply and
        # none of the speech requests (80 steps each) had finished when it ended.
        assert sum(between) > 0
        assert len(speech_progress) == 4 and max(speech_progress.values()) < 80


async def test_concurrent_speech_requests_share_executor_batches_with_live_sessions(tmp_path):
    profile = speaker_profile(tmp_path, step_delay_s=0.02, max_batch=8)
    async with running_server(profile, enable_realtime=False) as server:
        node = speaker_node(server)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            speech = [asyncio.create_task(stream_speech(client, words=10)) for _ in range(4)]
            await eventually(lambda: len(node.steps) == 4, what="4 speech requests running")
            live = await live_reply(server)
            await live.close()
            await asyncio.gather(*speech)
        # One executor (the node's shared batcher) served every request and the live session:
        # steps of different callers ran in the same calls.
        assert sum(node.batch_sizes) == sum(node.steps.values()) == 4 * 20 + 10
        assert max(node.batch_sizes) >= 2 and len(node.batch_sizes) < sum(node.batch_sizes)
        assert server.runtime.count("speech") == 0
