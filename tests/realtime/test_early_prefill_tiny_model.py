"""Early prefill on the embedded tiny model, end to end: a pause inside the utterance is prefilled
and undone when the speaker goes on, the pause that ends the turn is prefilled and confirmed, and
the client sees the same events as with early prefill off (nodes/dialog.py, nodes/thinker.py)."""

from __future__ import annotations

import numpy as np

from configs import load_profile
from tests.conftest import running_server
from tests.realtime.client import API_KEY, append_pcm, sdk_client, until
from tests.realtime.speech import speech

RATE = 24000


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(RATE * seconds), np.float32)


def kinds(events) -> list[str]:
    """Event types, less the audio deltas (they come in chunks of their own pace)."""
    return [e.type for e in events if e.type != "response.output_audio.delta"]


def stopped(events):
    return next(e for e in events if e.type == "input_audio_buffer.speech_stopped")


def two_part_utterance() -> np.ndarray:
    """Speech, a pause of ~350 ms as the VAD hears it (100 ms here plus espeak's own silence around
    its words: past the early-prefill point at 200 ms, short of the 500 ms that ends the turn),
    more speech, then silence that ends it."""
    return np.concatenate([quiet(0.3), speech("What is the weather like", RATE), quiet(0.1),
                           speech("today in Paris?", RATE), quiet(1.0)])


def profile(prefill_early_ms: int | None) -> dict:
    profile = load_profile(None)
    vad = profile["nodes"]["vad"]
    vad["params"] = {**(vad.get("params") or {}), "prefill_early_ms": prefill_early_ms}
    return profile


async def spoken_turn(prefill_early_ms: int | None) -> tuple[list, dict[str, int]]:
    async with running_server(profile(prefill_early_ms), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await until(conn, "session.created")
            await append_pcm(conn, two_part_utterance())
            events = await until(conn, "response.done", timeout=120)
            assert no_reply_open(srv)
        return events, srv.runtime.nodes["thinker"].counters()


def no_reply_open(srv) -> bool:
    """The graph's ledger of replies (graph/replies.py) is empty: every reply it was asked for ended
    (a speculation's provisional reply was never asked for)."""
    return all(not session.replies for session in srv.runtime.sessions.values())


async def test_a_pause_inside_the_utterance_is_undone_and_the_turn_ends_as_without_early_prefill():
    early, counts = await spoken_turn(300)
    plain, plain_counts = await spoken_turn(None)

    # The pause inside was prefilled and dropped when the speech went on; the final one confirmed.
    assert counts == {"early_prefill": 2, "early_prefill_dropped": 1, "early_prefill_confirmed": 1}
    assert plain_counts == {}
    # One turn either way, with the same events.
    assert kinds(early) == kinds(plain)
    assert [e.type for e in early].count("input_audio_buffer.speech_stopped") == 1
    assert stopped(early).audio_end_ms == stopped(plain).audio_end_ms
    done, plain_done = early[-1].response, plain[-1].response
    assert done.status == plain_done.status == "completed"
    assert done.output[0].content[0].transcript == plain_done.output[0].content[0].transcript
    # The model heard the whole utterance once (its trailing silence 300 ms shorter).
    assert 0 < done.usage.input_token_details.audio_tokens <= plain_done.usage.input_token_details.audio_tokens
    assert done.output[0].id != stopped(early).item_id  # the reply's item, not the user's


async def test_a_reply_cancelled_as_its_turn_ends_leaves_the_session_answering():
    """`response.cancel` right at `speech_stopped` (its confirming turn may be purged before the
    thinker sees it): the held early prefill is dropped, and the next turn is answered."""
    async with running_server(profile(300), api_key=API_KEY) as srv:
        async with sdk_client(srv).realtime.connect(model=srv.runtime.model_id) as conn:
            await until(conn, "session.created")
            await append_pcm(conn, two_part_utterance())
            await until(conn, "input_audio_buffer.speech_stopped", timeout=60)
            await conn.response.cancel()
            cancelled = await until(conn, "response.done", timeout=60)
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Hello?"}]})
            await conn.response.create()
            answered = await until(conn, "response.done", timeout=120)
            assert no_reply_open(srv)  # the cancelled reply too, whether its turn was purged or ran
        counts = srv.runtime.nodes["thinker"].counters()
    assert cancelled[-1].response.status in ("cancelled", "completed")  # the cancel may come after the last token
    assert not [e for e in cancelled + answered if e.type == "error"]
    done = answered[-1].response
    assert done.status == "completed" and done.output[0].content[0].transcript
    # Both early prefills ended (the inner pause's dropped; the last confirmed, or dropped at the next
    # turn when the cancel purged its confirm): none stays held in the model's history.
    assert counts["early_prefill"] == 2 and counts["early_prefill_dropped"] >= 1
    assert counts.get("early_prefill_confirmed", 0) + counts["early_prefill_dropped"] == 2
