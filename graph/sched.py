"""CPU scheduling policy (Linux): which process's wake-ups may preempt an engine mid-unit.

On a machine with fewer cores than busy processes (the 2-vCPU machine this project is measured
on: two engines, the server, and the benchmark's load generator), a process woken by a socket
write often preempts the task running on that core. The server wakes for every client message
and every engine frame (thousands a second at 64 sessions), and each wake-up can land in the
middle of an engine's first-audio unit. Under SCHED_BATCH a thread keeps its full share of the
CPU (its nice weight is unchanged) but its wake-ups do not preempt: it runs when a core is free
or the running task's slice ends. So the server runs as SCHED_BATCH and its engines as normal
(`sgl-omni serve --server-sched`); docs/batching.md (thirteenth session) has the measurements.

A policy applies to the calling thread; threads and processes it starts later inherit it, so an
engine process puts itself back to normal (`normal_for_compute`).
"""

from __future__ import annotations

import os

POLICIES = ("batch", "normal")


def apply(policy: str) -> str:
    """Switch the calling thread to `policy` ("batch" or "normal"). Returns the policy in effect
    after: "normal" where the platform has no SCHED_BATCH or refuses the change."""
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r} (choose from {', '.join(POLICIES)})")
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        return "normal"
    try:
        os.sched_setscheduler(0, batch if policy == "batch" else os.SCHED_OTHER, os.sched_param(0))
    except OSError:  # a sandbox that forbids it
        return policy_of(0) or "normal"
    return policy


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
