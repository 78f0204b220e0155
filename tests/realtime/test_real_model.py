"""The served default graph (tiny random-weight Qwen3-Omni on CPU) behind the realtime protocol.

One small session: replies are gibberish (random weights), but every stage is the real one.
"""

from __future__ import annotations

import base64

from configs import load_profile
from tests.conftest import running_server
from tests.realtime.client import API_KEY, append_pcm, sdk_client, until, utterance


async def test_the_default_graph_answers_two_spoken_turns_and_reuses_its_kv_cache():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 6})
            await until(conn, "session.updated")
            await append_pcm(conn, utterance())
            first = await until(conn, "response.done", timeout=120)
            await append_pcm(conn, utterance("And tomorrow?"))
            second = await until(conn, "response.done", timeout=120)
    for events in (first, second):
        assert [e.type for e in events][:3] == [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
        ]
        done = events[-1].response
        assert done.status in ("completed", "incomplete")
        audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
        assert len(audio) > 0 and len(audio) % 2 == 0
        assert done.usage.input_token_details.audio_tokens > 0
    # The second reply reuses the KV of everything before it, the first turn and reply included:
    # cached_tokens is exactly the previous context (its new utterance counts as input, even
    # though the thinker prefilled it at commit).
    first_usage = first[-1].response.usage
    assert first_usage.input_token_details.cached_tokens == 0
    previous_context = first_usage.input_tokens + first_usage.output_token_details.text_tokens
    assert second[-1].response.usage.input_token_details.cached_tokens == previous_context
