"""A loaded process and Python's cyclic garbage collector: collect once, then freeze.

After startup a process holds everything it loaded: a model's modules and parameters, the tokenizer,
the web framework: hundreds of thousands of objects the cyclic collector tracks, and a full
collection walks all of them, a stop of the process's loop long enough (in an engine: every
session on it, in the middle of a reply an underrun for each of its listeners) to show in the
tail. CPython runs a full collection when the objects that survived the younger collections have
grown by a quarter of the old ones, which a loaded server reaches within minutes. `settle()`
collects the startup's garbage once and moves every object left into the permanent generation
(`gc.freeze`), which no collection walks: a full collection then walks only what the sessions
hold. What they allocate is collected as before. The measurements: docs/batching.md ("Caches",
the heap).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("graph.heap")

_settled = False


def settle() -> int:
    """Collect everything now, then exempt what is left from later collections: once per process,
    when it has loaded what it keeps (later calls do nothing: what a process holds then includes
    its sessions). Returns the number of objects frozen."""
    global _settled
    if _settled:
        return gc.get_freeze_count()
    _settled = True
    started = time.perf_counter()
    gc.collect()
    collected_s = time.perf_counter() - started
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap settled: %d objects kept out of garbage collection (a full collection of them took %.0f ms)",
             frozen, collected_s * 1000)
    return frozen
