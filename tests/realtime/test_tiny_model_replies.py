"""On the embedded default, replies end on their own: `completed`, because the model chose EOS."""

from __future__ import annotations

import base64

from configs import load_profile
from tests.conftest import running_server
from tests.realtime.client import API_KEY, append_pcm, sdk_client, until, utterance

FRAME_SAMPLES = 1920  # one codec frame: 80 ms at 24 kHz


def reply_audio_samples(events) -> int:
    return sum(len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta") // 2


async def test_spoken_and_text_turns_end_completed_and_a_small_max_output_tokens_still_cuts():
    profile = load_profile(None)
    params = profile["resources"]["omni"]["params"]
    cap, frames_per_token = params["max_reply_tokens"], params["max_frames_per_token"]
    async with running_server(profile, api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await append_pcm(conn, utterance())
            spoken = await until(conn, "response.done", timeout=120)

            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Tell me a long story."}]})
            await conn.response.create()
            written = await until(conn, "response.done", timeout=120)

            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Again?"}]})
            await conn.response.create(response={"max_output_tokens": 2})
            capped = await until(conn, "response.done", timeout=120)

    for events in (spoken, written):
        done = events[-1].response
        assert (done.status, done.status_details) == ("completed", None)
        text_tokens = done.usage.output_token_details.text_tokens
        assert 0 < text_tokens < cap
        assert done.output[0].content[0].transcript
        # The audio ends with the text: at most the profile's frames per reply token.
        assert 0 < reply_audio_samples(events) <= frames_per_token * text_tokens * FRAME_SAMPLES
    assert spoken[-1].response.usage.input_token_details.audio_tokens > 0

    done = capped[-1].response
    assert (done.status, done.status_details.reason) == ("incomplete", "max_output_tokens")
    assert done.usage.output_token_details.text_tokens == 2
