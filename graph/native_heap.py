"""A CPU engine and glibc's malloc: freed large buffers go back to the system.

glibc serves an allocation above its mmap threshold with its own mapping, returned to the system
when freed. The threshold is dynamic: each time such a mapping is freed, the threshold rises to its
size (up to 32 MiB), so later buffers of that size come from the heap instead, whose freed middle
is never returned. A CPU forward's temporaries (attention scores, MLP activations) scale with the
context, so as a long session's context grows each larger set of temporaries raises the threshold
and then stays resident: on the tiny model, about 200 MB of a process's RSS by a 32k context,
half of all it grew (docs/notebook/2026-12-07-long-session-memory.md). A fixed threshold turns the
dynamic one off. 1 MiB keeps the many small per-step buffers (a talker frame's, a code2wav
chunk's) in the heap, where mapping them per step would cost page faults every step.

On CUDA the KV and the temporaries live in device memory; this is about host RSS only, and a no-op
where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("graph.native_heap")

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
LARGE_BUFFER_BYTES = 1 << 20


def return_large_buffers(threshold_bytes: int = LARGE_BUFFER_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold_bytes` for this process, so that every freed
    buffer at least that large is returned to the system. False where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return False
    done = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    log.debug("malloc mmap threshold fixed at %d bytes: %s", threshold_bytes, done)
    return done


def _glibc() -> ctypes.CDLL | None:
    # The C library the process already has (`find_library` would run `ldconfig -p` per start).
    libc = ctypes.CDLL(None)
    try:
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (not musl)
    except AttributeError:
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
