"""Audio between Opus tracks and the graph.

In: aiortc decodes the client's Opus track to 48 kHz frames of packed s16 *stereo* (Opus is
always decoded to two channels). `InputAudio` downmixes to mono and resamples with a streaming
soxr resampler (filter state kept across frames, so frame seams are inaudible) to the rate the
session's input takes.

Out: `ReplyAudioTrack` is the track the server sends. The transport pushes reply audio
(float32 mono, 24 kHz) into it; the track resamples to 48 kHz and hands aiortc one 20 ms frame
per 20 ms of wall clock: paced like a real microphone, no bursts. While no reply audio is
waiting it sends silence, so the client's jitter buffer stays primed and a reply starts at once.
`clear()` drops what is queued: the next frame (at most 20 ms later) is silence, so barge-in
stops the audio within one frame. `hold(True)` pauses the reply without dropping anything (silence
frames go out meanwhile, not counted as underruns); `hold(False)` plays on from where it paused.
The queue itself (resampling per response, finished and cleared replies, `played_ms`) is
realtime/reply_audio.py's `ReplyAudioQueue`, shared with the phone line; the track keeps the
wire's part: the pacing, `recv`'s s16 frames, the underrun count, and `on_started` /
`on_stopped`.
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import time
from collections.abc import Callable

import av
import numpy as np
import soxr
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from session_server.realtime.reply_audio import ReplyAudioQueue

TRACK_RATE = 48000
FRAME_MS = 20
FRAME_SAMPLES = TRACK_RATE * FRAME_MS // 1000  # 960
# Past this much lag (a stalled event loop), the clock is reset rather than caught up with a
# burst of frames.
MAX_LAG_S = 0.1


class InputAudio:
    """Decoded track frames -> float32 mono at `rate`."""

    def __init__(self, rate: int):
        self.rate = rate
        self._resampler: soxr.ResampleStream | None = None
        self._source_rate: int | None = None

    def convert(self, frame: av.AudioFrame) -> np.ndarray:
        samples = frame_to_mono(frame)
        if frame.sample_rate == self.rate:
            return samples
        if self._resampler is None or self._source_rate != frame.sample_rate:
            self._source_rate = frame.sample_rate
            self._resampler = soxr.ResampleStream(frame.sample_rate, self.rate, 1, dtype="float32", quality="HQ")
        return self._resampler.resample_chunk(samples)


def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """Any decoded audio frame -> float32 mono in [-1, 1] (packed or planar, s16/s32/flt)."""
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        array = array.reshape(channels, -1).T
    else:
        array = array.reshape(-1, channels)
    if array.dtype == np.int16:
        array = array.astype(np.float32) / 32768.0
    elif array.dtype == np.int32:
        array = array.astype(np.float32) / 2147483648.0
    else:
        array = array.astype(np.float32)
    return array.mean(axis=1) if channels > 1 else array[:, 0]


class ReplyAudioTrack(MediaStreamTrack):
    """The server's outgoing audio track, paced in real time.

    Reply audio of one response at a time: `push(response_id, samples)` appends,
    `finish(response_id)` says no more will come, `clear()` drops everything queued.
    `on_started(response_id)` fires when a response's first frame leaves,
    `on_stopped(response_id)` when its last one has (for `output_audio_buffer.started|stopped`).
    """

    kind = "audio"

    def __init__(
        self,
        on_started: Callable[[str], None] = lambda response_id: None,
        on_stopped: Callable[[str], None] = lambda response_id: None,
        input_rate: int = 24000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = asyncio.sleep,
    ):
        super().__init__()
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._input_rate = input_rate
        self._clock = clock
        self._sleep = sleep
        self._reply = ReplyAudioQueue(TRACK_RATE, FRAME_SAMPLES)  # soxr's resampler
        self._start: float | None = None
        self._timestamp = 0
        self.frames_sent = 0
        self.reply_frames_sent = 0
        # Silence frames sent in the middle of a reply because its audio had not arrived in time
        # (the producer was slower than real time): the only gaps the listener can hear.
        self.underruns = 0
        self.reply_frame_times: collections.deque[float] = collections.deque(maxlen=1000)  # for pacing checks

    # ------------------------------------------------------------------ producer side

    def push(self, response_id: str, samples: np.ndarray, sample_rate: int | None = None) -> None:
        self._reply.push(response_id, samples, sample_rate or self._input_rate)

    def finish(self, response_id: str) -> None:
        """No more audio comes for `response_id`: flush the resampler's tail."""
        self._reply.finish(response_id)

    def clear(self) -> str | None:
        """Drop all queued audio now. Returns the response that was audible, if any."""
        return self._reply.clear()

    def hold(self, held: bool) -> None:
        """Pause the reply audio (True) or play on from where it paused (False)."""
        self._reply.hold(held)

    @property
    def held(self) -> bool:
        return self._reply.held

    @property
    def queued_ms(self) -> float:
        return self._reply.queued_ms

    @property
    def playing(self) -> str | None:
        """The response between its `on_started` and its `on_stopped`."""
        return self._reply.playing

    def played_ms(self, response_id: str) -> float:
        """How much of `response_id`'s audio has left on the track (what the listener heard)."""
        return self._reply.played_ms(response_id)

    # ------------------------------------------------------------------ aiortc side

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        else:
            due = self._start + self._timestamp / TRACK_RATE
            if now - due > MAX_LAG_S:
                self._start = now - self._timestamp / TRACK_RATE
            elif due > now:
                await self._sleep(due - now)
        pcm = self._next_frame_pcm()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm.tobytes())
        frame.sample_rate = TRACK_RATE
        frame.pts = self._timestamp
        frame.time_base = fractions.Fraction(1, TRACK_RATE)
        self._timestamp += FRAME_SAMPLES
        self.frames_sent += 1
        return frame

    def _next_frame_pcm(self) -> np.ndarray:
        """One frame: reply audio when a whole frame (or a finished reply's tail) is queued, else silence."""
        reply = self._reply
        if reply.held:
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        response_id = reply.head
        if response_id is None:
            self._stopped_if_ended()
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if not reply.frame_due:
            if reply.playing == response_id:
                self.underruns += 1  # the producer is slower than real time
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if reply.playing != response_id:
            self._stopped_if_ended()
            reply.playing = response_id
            self._on_started(response_id)
        frame = reply.take_frame()
        self.reply_frames_sent += 1
        self.reply_frame_times.append(self._clock())
        if frame.last:
            self._on_stopped(response_id)
        return _to_s16(frame.samples)

    def _stopped_if_ended(self) -> None:
        ended = self._reply.take_ended()
        if ended is not None:
            self._on_stopped(ended)


def _to_s16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
