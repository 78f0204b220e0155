"""The outbound queue of a call's reply audio, shared by every wire whose reply audio is media.

A WebRTC track (webrtc/media.py's `ReplyAudioTrack`, 48 kHz) and a phone line
(telephony/phone_audio.py's `PhoneOutput`, 8 kHz) both drain a `ReplyAudioQueue` one frame per
tick of their clock; each keeps only its wire's part (pacing, sample format, frames, events).

The transport pushes a response's reply audio (`push`) and says when it is complete
(`finish`). The resampler is a streaming one per response (a new one when the response or its
rate changes), so chunk seams are inaudible. `take_frame()` gives one frame of the response at
the head of the queue: a whole frame, or a finished reply's tail padded with silence.
`clear()` drops everything queued (barge-in) and remembers the cleared responses, so their late
audio is ignored; `played_ms` says how much of a response has left (what the listener can have
heard), which is what its item is truncated to. `hold(True)` pauses the reply without dropping
it (a sound that may be a barge-in), `hold(False)` plays on.

Bound: reply audio is generated at most `compute.lookahead_ms` ahead of its playback (the
graph paces it), so the queue holds about that much; it is not bounded here. The per-response
bookkeeping is: the 16 most recent responses' played samples, the 64 most recent cleared and
finished ids.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import soxr

from graph.fir_resampling import streaming

# Responses whose played samples are remembered (for `played_ms`; older ones read 0).
MAX_PLAYED_RESPONSES = 16


class Resampler(Protocol):
    def resample_chunk(self, samples: np.ndarray, last: bool = False) -> np.ndarray: ...


def soxr_resampler(from_rate: int, to_rate: int) -> Resampler:
    """soxr's streaming resampler (HQ)."""
    return soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")


def short_lookahead_resampler(from_rate: int, to_rate: int) -> Resampler:
    """graph/fir_resampling.py's short-lookahead resampler where it has one for the rate pair
    (for 24 kHz to 8 kHz: a reply's first chunk is whole frames at once), else soxr's."""
    return streaming(from_rate, to_rate) or soxr_resampler(from_rate, to_rate)


class RecentIds:
    """A set that remembers only its `size` most recent ids (per-response bookkeeping stays
    bounded however long a call lasts)."""

    def __init__(self, size: int = 64):
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._size = size

    def add(self, key: str) -> None:
        self._ids[key] = None
        self._ids.move_to_end(key)
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)

    def update(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def discard(self, key: str) -> None:
        self._ids.pop(key, None)

    def clear(self) -> None:
        self._ids.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)


@dataclass(frozen=True)
class ReplyFrame:
    response_id: str
    samples: np.ndarray  # frame_samples float32 at the queue's rate (a reply's last frame padded with silence)
    last: bool  # the response's audio ends with this frame


class ReplyAudioQueue:
    """Reply audio of one response at a time, in frames of `frame_samples` at `rate`;
    `resampler(from_rate, rate)` makes each response's streaming resampler."""

    def __init__(self, rate: int, frame_samples: int,
                 resampler: Callable[[int, int], Resampler] = soxr_resampler):
        self.rate = rate
        self.frame_samples = frame_samples
        self._new_resampler = resampler
        self._queue: collections.deque[tuple[str, np.ndarray]] = collections.deque()
        self._queued = 0
        self._resampler: Resampler | None = None
        self._response_id: str | None = None  # the response being resampled
        self._source_rate: int | None = None  # the rate it is resampled from
        self._played: dict[str, int] = {}  # samples of each recent response that have left
        self._finished = RecentIds()
        self._dropped = RecentIds()  # cleared responses: their late audio is ignored
        self._held = False  # paused for a sound that may be a barge-in
        # The response whose frames are leaving: set by `take_frame` (a wire that announces a
        # start before the frame leaves may set it first), None again once its last frame has left.
        self.playing: str | None = None

    # ------------------------------------------------------------------ producer side

    def push(self, response_id: str, samples: np.ndarray, sample_rate: int) -> None:
        """Queue reply audio of `response_id` (float32 mono at `sample_rate`); late audio of a
        cleared response is ignored."""
        if response_id in self._dropped:
            return
        if self._resampler is None or response_id != self._response_id or sample_rate != self._source_rate:
            self._response_id = response_id
            self._source_rate = sample_rate
            self._resampler = self._new_resampler(sample_rate, self.rate)
        self._append(response_id, self._resampler.resample_chunk(np.asarray(samples, dtype=np.float32).reshape(-1)))

    def finish(self, response_id: str) -> None:
        """No more audio comes for `response_id`: flush the resampler's tail; its last frame
        goes out padded with silence."""
        if response_id == self._response_id and self._resampler is not None:
            self._append(response_id, self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
            self._resampler = None
            self._response_id = None
        self._finished.add(response_id)

    def clear(self) -> str | None:
        """Drop all queued audio now; returns the response that was audible (or queued), if any."""
        audible = self.playing or (self._queue[0][0] if self._queue else None)
        self._dropped.update(rid for rid, _ in self._queue)
        self._dropped.update(rid for rid in (self.playing, self._response_id) if rid is not None)
        self._queue.clear()
        self._queued = 0
        self._resampler = None
        self._response_id = None
        self._finished.clear()
        self.playing = None
        self._held = False
        return audible

    def hold(self, held: bool) -> None:
        """Pause the reply audio (True) or play on from where it paused (False)."""
        self._held = held

    # ------------------------------------------------------------------ state

    @property
    def held(self) -> bool:
        return self._held

    @property
    def queued_ms(self) -> float:
        return self._queued * 1000 / self.rate

    def played_ms(self, response_id: str) -> float:
        """How much of `response_id`'s audio has left (what the listener can have heard)."""
        return self._played.get(response_id, 0) * 1000 / self.rate

    def cleared(self, response_id: str) -> bool:
        """`response_id` was cleared (its late audio is ignored)."""
        return response_id in self._dropped

    def queues(self, response_id: str) -> bool:
        """Some of `response_id`'s audio is still queued."""
        return any(rid == response_id for rid, _ in self._queue)

    @property
    def head(self) -> str | None:
        """The response whose audio is next in the queue, if any."""
        return self._queue[0][0] if self._queue else None

    @property
    def frame_due(self) -> bool:
        """Not held, and a whole frame (or a finished reply's tail) is queued."""
        if self._held or not self._queue:
            return False
        return self._queued >= self.frame_samples or self._queue[0][0] in self._finished

    # ------------------------------------------------------------------ consumer side

    def take_frame(self) -> ReplyFrame:
        """The head response's next frame (call when `frame_due`): `playing` names it from now
        on; after its last frame, `playing` is None again."""
        response_id = self._queue[0][0]
        frame = np.zeros(self.frame_samples, np.float32)
        filled = 0
        while filled < self.frame_samples and self._queue and self._queue[0][0] == response_id:
            chunk = self._queue[0][1]
            take = min(self.frame_samples - filled, chunk.size)
            frame[filled:filled + take] = chunk[:take]
            filled += take
            self._queued -= take
            if take == chunk.size:
                self._queue.popleft()
            else:
                self._queue[0] = (response_id, chunk[take:])
        self.playing = response_id
        self._played[response_id] = self._played.get(response_id, 0) + filled
        if len(self._played) > MAX_PLAYED_RESPONSES:
            del self._played[next(iter(self._played))]
        return ReplyFrame(response_id, frame, self.take_ended() == response_id)

    def take_ended(self) -> str | None:
        """The playing response, once it has ended (finished, and none of its audio queued):
        it is forgotten (`playing` is None again) and returned; else None."""
        playing = self.playing
        if playing is None or playing not in self._finished or self.queues(playing):
            return None
        self.playing = None
        self._finished.discard(playing)
        return playing

    def _append(self, response_id: str, samples: np.ndarray) -> None:
        if samples.size:
            self._queue.append((response_id, samples))
            self._queued += samples.size
