"""Reply audio for a phone line: 24 kHz float32 in, 20 ms frames of 8 kHz G.711 out.

`PhoneOutput` is the outbound queue of one call. The transport pushes a response's reply audio
(`push`), says when it is complete (`finish`), and takes one 20 ms frame per tick of its
20 ms clock (`next_frame`); the resampler is a streaming one per response, so chunk seams are
inaudible (as on the other transports): for the model's 24 kHz, graph/fir_resampling.py's
`Downsample3`, which looks 1.9 ms ahead, so a reply's first chunk (57 ms) is whole frames at
once (soxr's gave it none); soxr's (HQ) for any other rate. `clear()` drops everything queued,
so barge-in stops the caller's audio at the next tick; `played_ms` says how much of a response has left
(what the caller can have heard), which is what its item is truncated to. `hold(True)` pauses
the reply without dropping it (a sound that may be a barge-in), `hold(False)` plays on.

Bound: reply audio is generated at most `compute.lookahead_ms` ahead of its playback (the
graph paces it), so the queue holds about that much; it is not bounded here.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import soxr

from graph.fir_resampling import CentredFir, streaming
from session_server.realtime.audio_formats import OUTPUT_RATE

PHONE_RATE = 8000
FRAME_MS = 20
FRAME_SAMPLES = PHONE_RATE * FRAME_MS // 1000  # 160


@dataclass(frozen=True)
class Frame:
    response_id: str
    samples: np.ndarray  # FRAME_SAMPLES float32 at PHONE_RATE (a reply's last frame padded with silence)
    last: bool  # the response's audio ends with this frame


class PhoneOutput:
    def __init__(self) -> None:
        self._queue: collections.deque[tuple[str, np.ndarray]] = collections.deque()
        self._queued = 0
        self._resampler: CentredFir | soxr.ResampleStream | None = None
        self._response_id: str | None = None  # the response being resampled
        self._finished: set[str] = set()
        self._dropped: collections.deque[str] = collections.deque(maxlen=64)  # cleared: late audio ignored
        self._played: dict[str, int] = {}  # samples of each recent response that have left
        self._held = False
        self.playing: str | None = None  # the response whose frames are leaving

    def push(self, response_id: str, samples: np.ndarray, sample_rate: int = OUTPUT_RATE) -> None:
        if response_id in self._dropped:
            return
        if response_id != self._response_id:
            self._response_id = response_id
            self._resampler = (streaming(sample_rate, PHONE_RATE)
                               or soxr.ResampleStream(sample_rate, PHONE_RATE, 1, dtype="float32", quality="HQ"))
        assert self._resampler is not None
        resampled = self._resampler.resample_chunk(np.asarray(samples, dtype=np.float32).reshape(-1))
        self._append(response_id, resampled)

    def finish(self, response_id: str) -> bool:
        """No more audio comes for `response_id`: flush the resampler's tail. True when all of
        its audio has already left (its last frame went out before it was known to be last)."""
        if response_id == self._response_id and self._resampler is not None:
            self._append(response_id, self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
            self._resampler = None
            self._response_id = None
        if response_id in self._dropped:
            return False
        if any(rid == response_id for rid, _ in self._queue):
            self._finished.add(response_id)
            return False
        if self.playing == response_id:
            self.playing = None
        return response_id in self._played

    def clear(self) -> str | None:
        """Drop all queued audio now; returns the response that was audible (or queued), if any."""
        audible = self.playing or (self._queue[0][0] if self._queue else None)
        for rid in {rid for rid, _ in self._queue} | {self.playing, self._response_id} - {None}:
            self._dropped.append(rid)
        self._queue.clear()
        self._queued = 0
        self._resampler = None
        self._response_id = None
        self._finished.clear()
        self.playing = None
        self._held = False
        return audible

    def hold(self, held: bool) -> None:
        self._held = held

    def played_ms(self, response_id: str) -> float:
        return self._played.get(response_id, 0) * 1000 / PHONE_RATE

    @property
    def queued_ms(self) -> float:
        return self._queued * 1000 / PHONE_RATE

    def next_frame(self) -> Frame | None:
        """The frame due now: reply audio when a whole frame (or a finished reply's tail) is
        queued; None for silence (nothing queued, held, or the producer is behind)."""
        if self._held or not self._queue:
            return None
        response_id = self._queue[0][0]
        finished = response_id in self._finished
        if self._queued < FRAME_SAMPLES and not finished:
            return None
        frame = np.zeros(FRAME_SAMPLES, np.float32)
        filled = 0
        while filled < FRAME_SAMPLES and self._queue and self._queue[0][0] == response_id:
            chunk = self._queue[0][1]
            take = min(FRAME_SAMPLES - filled, chunk.size)
            frame[filled:filled + take] = chunk[:take]
            filled += take
            self._queued -= take
            if take == chunk.size:
                self._queue.popleft()
            else:
                self._queue[0] = (response_id, chunk[take:])
        self.playing = response_id
        self._played[response_id] = self._played.get(response_id, 0) + filled
        if len(self._played) > 16:
            del self._played[next(iter(self._played))]
        last = finished and not any(rid == response_id for rid, _ in self._queue)
        if last:
            self._finished.discard(response_id)
            self.playing = None
        return Frame(response_id, frame, last)

    def _append(self, response_id: str, samples: np.ndarray) -> None:
        if samples.size:
            self._queue.append((response_id, samples))
            self._queued += samples.size
