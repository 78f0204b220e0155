"""PhoneOutput: reply audio in, 20 ms frames of 8 kHz out, cleared at once on barge-in."""

from __future__ import annotations

import numpy as np

from session_server.telephony.phone_audio import FRAME_SAMPLES, PhoneOutput


def tone(seconds: float, hz: float = 440.0, rate: int = 24000) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def drain(output: PhoneOutput) -> list:
    frames = []
    while (frame := output.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_a_finished_reply_leaves_as_whole_8_khz_frames_the_last_one_marked():
    output = PhoneOutput()
    output.push("resp_1", tone(0.5))
    output.finish("resp_1")
    frames = drain(output)
    assert all(f.samples.size == FRAME_SAMPLES for f in frames)
    assert [f.last for f in frames] == [False] * (len(frames) - 1) + [True]
    assert len(frames) == 25  # 0.5 s / 20 ms (the resampler's tail flushed at finish)
    assert output.played_ms("resp_1") == 500


def test_a_reply_still_generating_waits_for_a_whole_frame():
    output = PhoneOutput()
    output.push("resp_1", tone(0.01))  # 10 ms: not a frame yet
    assert output.next_frame() is None
    output.push("resp_1", tone(0.1))
    assert output.next_frame() is not None


def test_clear_drops_everything_queued_and_late_audio_of_that_reply():
    output = PhoneOutput()
    output.push("resp_1", tone(1.0))
    first = output.next_frame()
    assert first is not None and output.playing == "resp_1"
    assert output.clear() == "resp_1"
    assert output.next_frame() is None
    output.push("resp_1", tone(0.2))  # generated before the cancel reached the graph
    assert output.next_frame() is None
    assert output.played_ms("resp_1") == 20  # what left before the clear: the truncation point


def test_hold_pauses_the_reply_and_release_plays_on_from_where_it_paused():
    output = PhoneOutput()
    output.push("resp_1", tone(0.2))
    output.next_frame()
    output.hold(True)
    assert output.next_frame() is None
    output.hold(False)
    assert output.next_frame() is not None
    assert output.played_ms("resp_1") == 40


def test_a_reply_that_ends_after_its_frames_left_ends_with_its_tail_marked_last():
    output = PhoneOutput()
    output.push("resp_1", tone(0.2))
    sent = drain(output)
    assert sent and not any(f.last for f in sent)  # not known to be last yet
    assert output.finish("resp_1") is False  # the resampler's tail is still to go
    tail = drain(output)
    assert len(tail) == 1 and tail[0].last
    assert output.playing is None


def test_a_replys_first_57_ms_chunk_is_whole_frames_at_once():
    output = PhoneOutput()
    output.push("resp_1", tone(0.057))  # the model's first chunk: one codec frame
    frames = drain(output)
    assert len(frames) == 2  # 456 samples at 8 kHz, less the 15 of lookahead: two frames, no wait for the next chunk
    assert np.abs(frames[0].samples[20:]).max() > 0.4  # the tone itself, not leading silence
