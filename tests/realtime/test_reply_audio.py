"""ReplyAudioQueue: the reply audio queue every media wire drains (the WebRTC track, a phone
line), frame by frame, a response at a time."""

from __future__ import annotations

import numpy as np
import pytest

from session_server.realtime.reply_audio import MAX_PLAYED_RESPONSES, ReplyAudioQueue

RATE = 8000
FRAME = 160  # 20 ms


def tone(seconds: float, rate: int = 24000) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * 440.0 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def drain(queue: ReplyAudioQueue) -> list:
    frames = []
    while queue.frame_due:
        frames.append(queue.take_frame())
    return frames


def test_a_frame_never_mixes_two_responses_the_first_ones_tail_is_padded():
    queue = ReplyAudioQueue(RATE, FRAME)
    queue.push("resp_1", tone(0.05), 24000)
    queue.finish("resp_1")
    queue.push("resp_2", tone(0.1), 24000)
    frames = drain(queue)
    first = [f for f in frames if f.response_id == "resp_1"]
    assert [f.last for f in first] == [False, False, True]  # 50 ms: two frames and a padded tail
    assert not first[-1].samples[-(3 * FRAME - 400):].any()
    assert frames[len(first)].response_id == "resp_2" and queue.playing == "resp_2"


def test_a_reply_whose_rate_changes_gets_a_resampler_for_the_new_rate():
    queue = ReplyAudioQueue(RATE, FRAME)
    queue.push("resp_1", tone(0.1, 24000), 24000)
    queue.push("resp_1", tone(1.0, 16000), 16000)
    queue.finish("resp_1")
    drain(queue)
    # The 16 kHz second alone is 1000 ms; read as 24 kHz audio it would be 667 ms.
    assert queue.played_ms("resp_1") >= 1000


class Passthrough:
    """A resampler with no delay (so a reply's audio has no tail)."""

    def resample_chunk(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        return samples


def test_a_reply_finished_after_its_last_frame_left_ends_when_the_wire_asks():
    queue = ReplyAudioQueue(RATE, FRAME, resampler=lambda from_rate, to_rate: Passthrough())
    queue.push("resp_1", np.full(5 * FRAME, 0.25, np.float32), RATE)
    frames = drain(queue)
    assert len(frames) == 5 and not any(f.last for f in frames) and queue.playing == "resp_1"
    assert queue.take_ended() is None  # not finished: more may come
    queue.finish("resp_1")
    assert not queue.frame_due  # no tail: nothing is left to mark last
    assert queue.take_ended() == "resp_1" and queue.playing is None
    assert queue.played_ms("resp_1") == 100


def test_played_audio_is_remembered_for_the_most_recent_responses_only():
    queue = ReplyAudioQueue(RATE, FRAME)
    for n in range(MAX_PLAYED_RESPONSES + 1):
        queue.push(f"resp_{n}", tone(0.02), 24000)
        queue.finish(f"resp_{n}")
        drain(queue)
    assert queue.played_ms("resp_0") == 0
    assert queue.played_ms(f"resp_{MAX_PLAYED_RESPONSES}") > 0
