"""How loaded an engine's compute is, and whether it can serve one more speaking session in time.

Admission by load (`limits.first_audio_goal_ms`): a new realtime session is refused with
`session_limit_reached` when the engines could not give its turns their first audio within the
goal once it speaks too, instead of admitting it and slowing every session down. The estimate is
made from what the engine measures of its own compute, never from a fixed session count:

- `ComputeLoad` sees every unit of compute the engine runs (one batched step of a stage, or one
  call: `record(stage, started, ended, first_audio)`) and keeps exponentially weighted moving
  averages: of each stage's step duration on a turn's first-audio path (units that served a
  turn waiting for its first audio: the playback clock's phase `first`), of the duration of any
  unit (how long a new turn's unit waits, at most, for the one running), and of the busy share
  of its time (busy seconds over wall seconds, both decayed with a time constant of `busy_tau_s`),
  in all and of the reply side's units alone (the stages that follow playback: what speaking
  sessions cost, where the VAD of every listening session is the rest).
- `LoadSnapshot` is what an engine reports of it (plain numbers, sent to the server with its
  stats), with the number of its sessions speaking (a reply in flight).
- `first_audio_estimate_s` reads a snapshot: with `S` sessions speaking, whose replies keep the
  engine busy a share `r` of its time (of `u` in all), one more speaker costs what one of them
  costs now (`r / S`), so the share becomes `u' = u + r / S`. A new turn's first audio then
  takes its own path (the sum of the first-audio stages' step averages) plus, before each of
  those steps, the queue a busy single server makes a unit wait: `u' / (1 - u')` mean units (the
  M/M/1 waiting time). Past `MAX_BUSY` the engine could not keep its speakers in real time at
  all: the estimate is infinite. With nobody speaking the estimate is the bare path: there is no
  reply to slow down, and no measure of what a speaker costs.

It is an estimate for an admission decision, not a prediction of a percentile: it errs towards
refusing when the engine is near saturation (the waiting term grows without bound there), and
towards admitting an idle engine (no first-audio step measured yet: the path counts as zero).
Sessions admitted since the engine's last report count as newcomers (each adds `r / S`), so a
burst of openings between two reports is not all admitted on the same stale snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

# EWMA weight of a new step duration: about the last ten steps of a stage count.
STEP_ALPHA = 0.2
# Time constant of the busy share: the last few seconds count (a turn's reply lasts seconds).
BUSY_TAU_S = 2.0
# Past this busy share (with the newcomer speaking) the engine cannot keep up in real time.
MAX_BUSY = 0.95


class Ewma:
    """An exponentially weighted moving average; None until the first value."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float = STEP_ALPHA):
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value


class LoadSnapshot(msgspec.Struct, frozen=True):
    """One engine's load as it reports it: seconds, a share in [0, 1], a count."""

    first_audio_path_s: float = 0.0  # the first-audio stages' step averages, summed
    first_audio_steps: int = 0  # how many stages that path has
    step_s: float = 0.0  # the average duration of any unit of compute
    busy: float = 0.0  # the share of recent wall time the compute was busy
    reply_busy: float = 0.0  # of it, serving replies (what speaking sessions cost)
    speaking: int = 0  # sessions with a reply in flight


class ComputeLoad:
    """EWMAs of one compute pool's units (see the module docstring). Not thread-safe: one writer
    (the thread that runs the units), readers take a `snapshot`."""

    def __init__(self, alpha: float = STEP_ALPHA, busy_tau_s: float = BUSY_TAU_S, since: float | None = None):
        """`since`: when it starts watching (idle time from then counts); None: its first unit."""
        self.alpha = alpha
        self.busy_tau_s = busy_tau_s
        self.first_audio: dict[str, Ewma] = {}
        self.step = Ewma(alpha)
        self._busy_s = 0.0  # decayed busy seconds
        self._reply_busy_s = 0.0  # of those, serving replies
        self._wall_s = 0.0  # decayed wall seconds
        self._last: float | None = since  # when the last unit ended (or the watch began)

    def record(self, stage: str, started: float, ended: float, first_audio: bool = False, reply: bool | None = None) -> None:
        """One unit of `stage` ran from `started` to `ended` (seconds on one clock); `reply`: it
        served a reply (default: when it served a first audio)."""
        seconds = max(ended - started, 0.0)
        if self._last is None:
            self._last = started  # the wall time watched starts with the first unit, not after it
        self.step.add(seconds)
        if first_audio:
            self.first_audio.setdefault(stage, Ewma(self.alpha)).add(seconds)
        self._advance(ended)
        self._busy_s += seconds
        if first_audio if reply is None else reply:
            self._reply_busy_s += seconds

    def _advance(self, now: float) -> None:
        if self._last is None:
            self._last = now
            return
        elapsed = max(now - self._last, 0.0)
        decay = math.exp(-elapsed / self.busy_tau_s)
        self._busy_s *= decay
        self._reply_busy_s *= decay
        self._wall_s = self._wall_s * decay + elapsed
        self._last = now

    def busy(self, now: float, reply: bool = False) -> float:
        """The decayed busy share as of `now` (idle time since the last unit counts as idle); of
        the units serving replies only with `reply`."""
        if self._last is None:
            return 0.0
        elapsed = max(now - self._last, 0.0)
        decay = math.exp(-elapsed / self.busy_tau_s)
        wall = self._wall_s * decay + elapsed
        busy = self._reply_busy_s if reply else self._busy_s
        return min(1.0, busy * decay / wall) if wall > 0 else 0.0

    def snapshot(self, now: float, speaking: int) -> LoadSnapshot:
        path = [ewma.value for ewma in self.first_audio.values() if ewma.value is not None]
        return LoadSnapshot(first_audio_path_s=sum(path), first_audio_steps=len(path), step_s=self.step.value or 0.0,
                            busy=self.busy(now), reply_busy=self.busy(now, reply=True), speaking=speaking)


def first_audio_estimate_s(load: LoadSnapshot, newcomers: int = 1) -> float:
    """The first audio a turn of a new session would get once it (and `newcomers - 1` others
    admitted since the snapshot) speaks too: seconds, or inf past `MAX_BUSY`."""
    speakers = load.speaking
    if speakers == 0:
        # Nobody speaks: admitting slows no reply down, and nothing measured says what a speaker
        # costs here (the busy share is the listeners' VAD, or a one-off unit such as a model's
        # first call). Its turn gets the bare path.
        return load.first_audio_path_s
    busy = load.busy + load.reply_busy * newcomers / speakers
    if busy >= MAX_BUSY:
        return math.inf
    waits = max(load.first_audio_steps, 1) * busy / (1.0 - busy) * load.step_s
    return load.first_audio_path_s + waits


def admits(load: LoadSnapshot, goal_s: float | None, newcomers: int = 1) -> bool:
    """Whether an engine at `load` can serve one more session within the first-audio goal
    (None: no goal, always)."""
    return goal_s is None or first_audio_estimate_s(load, newcomers) <= goal_s


@dataclass
class EngineLoads:
    """The server's view of each engine's load: its last snapshot and the sessions admitted to it
    since (they count as speakers until the next snapshot shows them)."""

    snapshot: LoadSnapshot | None = None
    admitted_since: int = 0

    def report(self, snapshot: LoadSnapshot) -> None:
        self.snapshot = snapshot
        self.admitted_since = 0

    def admits(self, goal_s: float | None) -> bool:
        if self.snapshot is None:
            return True  # no report yet: nothing measured, nothing to refuse on
        return admits(self.snapshot, goal_s, newcomers=1 + self.admitted_since)

    def estimate_s(self) -> float:
        return 0.0 if self.snapshot is None else first_audio_estimate_s(self.snapshot, 1 + self.admitted_since)
