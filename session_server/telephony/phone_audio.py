"""Reply audio for a phone line: 24 kHz float32 in, 20 ms frames of 8 kHz G.711 out.

`PhoneOutput` is the outbound queue of one call, a realtime/reply_audio.py `ReplyAudioQueue` at
8 kHz in 20 ms frames (shared with the WebRTC track). The transport pushes a response's reply
audio (`push`), says when it is complete (`finish`), and takes one 20 ms frame per tick of its
20 ms clock (`next_frame`); the resampler is a streaming one per response, so chunk seams are
inaudible (as on the other transports): for the model's 24 kHz, graph/fir_resampling.py's
`Downsample3`, which looks 1.9 ms ahead, so a reply's first chunk (57 ms) is whole frames at
once (soxr's gave it none); soxr's (HQ) for any other rate. `clear()` drops everything queued,
so barge-in stops the caller's audio at the next tick; `played_ms` says how much of a response has left
(what the caller can have heard), which is what its item is truncated to. `hold(True)` pauses
the reply without dropping it (a sound that may be a barge-in), `hold(False)` plays on.
What is the phone's own: its rate and frame, the short-lookahead resampler, and `finish` saying
whether a reply's last frame has already left (the wire then marks its end itself).

Bound: reply audio is generated at most `compute.lookahead_ms` ahead of its playback (the
graph paces it), so the queue holds about that much; it is not bounded here.
"""

from __future__ import annotations

import numpy as np

from session_server.realtime.audio_formats import OUTPUT_RATE
from session_server.realtime.reply_audio import ReplyAudioQueue, ReplyFrame, short_lookahead_resampler

PHONE_RATE = 8000
FRAME_MS = 20
FRAME_SAMPLES = PHONE_RATE * FRAME_MS // 1000  # 160


class PhoneOutput:
    def __init__(self) -> None:
        self._reply = ReplyAudioQueue(PHONE_RATE, FRAME_SAMPLES, short_lookahead_resampler)

    @property
    def playing(self) -> str | None:
        """The response whose frames are leaving."""
        return self._reply.playing

    def push(self, response_id: str, samples: np.ndarray, sample_rate: int = OUTPUT_RATE) -> None:
        self._reply.push(response_id, samples, sample_rate)

    def finish(self, response_id: str) -> bool:
        """No more audio comes for `response_id`: flush the resampler's tail. True when all of
        its audio has already left (its last frame went out before it was known to be last)."""
        self._reply.finish(response_id)
        if self._reply.cleared(response_id) or self._reply.queues(response_id):
            return False
        self._reply.take_ended()
        return self._reply.played_ms(response_id) > 0

    def clear(self) -> str | None:
        """Drop all queued audio now; returns the response that was audible (or queued), if any."""
        return self._reply.clear()

    def hold(self, held: bool) -> None:
        self._reply.hold(held)

    def played_ms(self, response_id: str) -> float:
        return self._reply.played_ms(response_id)

    @property
    def queued_ms(self) -> float:
        return self._reply.queued_ms

    def next_frame(self) -> ReplyFrame | None:
        """The frame due now: reply audio when a whole frame (or a finished reply's tail) is
        queued; None for silence (nothing queued, held, or the producer is behind)."""
        return self._reply.take_frame() if self._reply.frame_due else None
