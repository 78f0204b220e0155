"""CPU scheduling policy (Linux): which process's wake-ups may preempt an engine mid-unit.

On a machine with fewer cores than busy processes (the 2-vCPU machine this project is measured
on: two engines, the server, and the benchmark's load generator), a process woken by a socket
write often preempts the task running on that core. The server wakes for every client message
and every engine frame (thousands a second at 64 sessions), and each wake-up can land in the
middle of an engine's first-audio unit. Under SCHED_BATCH a thread keeps its full share of the
CPU (its nice weight is unchanged) but its wake-ups do not preempt: it runs when a core is free
or the running task's slice ends. That costs what the server forwards: woken on a core an engine
holds, it waits for the slice's end (up to a 4 ms tick) instead of running at once, which an
idle machine need not pay. So by default the server follows the machine's load (`adaptive`):
normal while most of the cores are idle, SCHED_BATCH once they are busy
(`sgl-omni serve --server-sched`; docs/batching.md, rule 15, and the sessions it names). The
engines always run as normal.

A policy applies to the calling thread (`apply`; `apply_to_process` switches every thread);
threads and processes started later inherit it, so an engine process puts itself back to normal
(`normal_for_compute`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

THREAD_POLICIES = ("batch", "normal")  # what a thread can be switched to
POLICIES = ("adaptive", *THREAD_POLICIES)  # `adaptive` switches between them with the machine's load
SERVER_DEFAULT = "adaptive"  # `sgl-omni serve --server-sched`

# `adaptive`: SCHED_BATCH once more than BATCH_ABOVE of all cores were busy over the last
# FOLLOW_INTERVAL_S, normal again below NORMAL_BELOW (apart, so that a load near one threshold
# does not flip the policy every interval).
BATCH_ABOVE = 0.40
NORMAL_BELOW = 0.25
FOLLOW_INTERVAL_S = 0.5


def apply(policy: str, thread: int = 0) -> str:
    """Switch one thread (0: the calling one) to `policy`, "batch" or "normal". Returns the
    policy in effect after: "normal" where the platform has no SCHED_BATCH or refuses the change."""
    if policy not in THREAD_POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r} (choose from {', '.join(THREAD_POLICIES)})")
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        return "normal"
    try:
        os.sched_setscheduler(thread, batch if policy == "batch" else os.SCHED_OTHER, os.sched_param(0))
    except OSError:  # a sandbox that forbids it, or a thread that has ended
        return policy_of(thread) or "normal"
    return policy


def apply_to_process(policy: str) -> str:
    """`apply` to every thread of this process, not only the calling one (Linux: its threads are
    listed in /proc/self/task): the server's worker threads (speech rendering, voice uploads)
    follow its event loop's policy whenever they were started."""
    in_effect = apply(policy)
    try:
        others = [int(tid) for tid in os.listdir("/proc/self/task") if int(tid) != threading.get_native_id()]
    except OSError:
        return in_effect
    for tid in others:
        apply(in_effect, tid)
    return in_effect


def normal_for_compute() -> None:
    """An engine process started by a SCHED_BATCH server: its compute must not wait behind
    every wake-up, so back to the normal policy (no privilege needed)."""
    if policy_of(0) == "batch":
        apply("normal")


def policy_of(pid: int | None) -> str | None:
    """The policy of process `pid` (its main thread; 0: the calling thread): "batch", "normal",
    another policy's number, or None where it cannot be read."""
    if pid is None or not hasattr(os, "sched_getscheduler"):
        return None
    try:
        policy = os.sched_getscheduler(pid)
    except OSError:
        return None
    return {getattr(os, "SCHED_BATCH", -1): "batch", os.SCHED_OTHER: "normal"}.get(policy, str(policy))


class MachineLoad:
    """The share of all the machine's cores that were busy since the previous reading, from the
    kernel's CPU counters (`/proc/stat`); None where there are none."""

    def __init__(self, path: str = "/proc/stat"):
        self.path = path
        self._last = self._counters()

    def _counters(self) -> tuple[int, int] | None:
        """(busy, busy + idle) clock ticks of all cores together since boot."""
        try:
            with open(self.path) as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if len(fields) < 8 or fields[0] != "cpu":
            return None
        user, nice, system, idle, iowait, irq, softirq = (int(value) for value in fields[1:8])
        busy = user + nice + system + irq + softirq  # steal: another guest's time, not this machine's
        return busy, busy + idle + iowait

    def busy_share(self) -> float | None:
        now, last = self._counters(), self._last
        self._last = now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1])


class AdaptivePolicy:
    """`adaptive`: the policy this process should have at the machine's load now (`step`, every
    FOLLOW_INTERVAL_S), switched only when it changes."""

    def __init__(self, busy_share: Callable[[], float | None], set_policy: Callable[[str], str] = apply_to_process):
        self._busy_share = busy_share
        self._set_policy = set_policy
        self.policy = set_policy("normal")

    def step(self) -> str:
        share = self._busy_share()
        if share is not None:
            wanted = "batch" if share > BATCH_ABOVE else "normal" if share < NORMAL_BELOW else self.policy
            if wanted != self.policy:
                self.policy = self._set_policy(wanted)
        return self.policy


async def follow_machine_load(interval_s: float = FOLLOW_INTERVAL_S) -> None:
    """Switch this process's threads with the machine's load, until cancelled."""
    policy = AdaptivePolicy(MachineLoad().busy_share)
    while True:
        await asyncio.sleep(interval_s)
        before = policy.policy
        if policy.step() != before:
            log.debug("server scheduling: %s -> %s", before, policy.policy)
