"""The arithmetic of the reports: percentiles, summaries, and a simulated real-time player.

Everything here is pure (no I/O, no clock) so it can be tested on synthetic timelines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Same definition as numpy's default (`method="linear"`). None for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Iterable[float], scale: float = 1.0, digits: int = 1) -> dict[str, float | int | None]:
    """{n, mean, p50, p95, p99, max} of `values` times `scale` (e.g. 1000 for seconds -> ms)."""
    scaled = [float(v) * scale for v in values]

    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(scaled),
        "mean": rounded(sum(scaled) / len(scaled)) if scaled else None,
        "p50": rounded(percentile(scaled, 50)),
        "p95": rounded(percentile(scaled, 95)),
        "p99": rounded(percentile(scaled, 99)),
        "max": rounded(max(scaled)) if scaled else None,
    }


@dataclass(frozen=True)
class Playback:
    """What a real-time player would have experienced playing one reply as it arrived.

    `underruns`: moments the player's buffer ran dry while more audio was still to come.
    `stall_s`: total silence those underruns inserted. `audio_s`: seconds of audio played.
    """

    underruns: int
    stall_s: float
    audio_s: float


def simulate_playback(chunks: Sequence[tuple[float, float]], done_at: float | None = None, prebuffer_s: float = 0.0) -> Playback:
    """Play `chunks` = [(arrival time s, duration s), ...] in arrival order, in real time.

    The player starts when the first chunk arrives (plus `prebuffer_s` of waiting, a jitter
    buffer; 0 by default: the listener hears the first audio at once). It then plays without
    gaps while it has audio. When a chunk arrives after everything before it has finished
    playing, the player ran dry: one underrun, and playback resumes at the chunk's arrival.
    Running out after the last chunk is the reply's end, not an underrun; so is running out
    once `done_at` (the reply's `response.done`) has passed, since no more audio is coming.
    """
    if not chunks:
        return Playback(0, 0.0, 0.0)
    order = sorted(chunks, key=lambda c: c[0])
    first_arrival = order[0][0]
    play_until = first_arrival + prebuffer_s  # the time the buffered audio runs out
    underruns = 0
    stall = 0.0
    audio = 0.0
    for arrival, duration in order:
        if arrival > play_until:
            if done_at is None or play_until < done_at:
                underruns += 1
                stall += arrival - play_until
            play_until = arrival
        play_until += duration
        audio += duration
    return Playback(underruns, round(stall, 6), round(audio, 6))


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: the time at least one of them was open."""
    total = 0.0
    current_start: float | None = None
    current_end = 0.0
    for start, end in sorted(intervals):
        if current_start is None or start > current_end:
            if current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_start is not None:
        total += current_end - current_start
    return total
