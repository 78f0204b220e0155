"""graph/native_heap.py: with the threshold fixed, a freed large buffer does not make the next one
of its size come from the heap (which glibc's dynamic threshold does, keeping it resident)."""

import subprocess
import sys
from pathlib import Path

import pytest

from graph import native_heap

# Allocates 4 MiB, frees it, allocates 4 MiB again, and prints whether the second one is its own
# mapping: glibc's chunk header (the size_t before the pointer) has IS_MMAPPED (0x2) set then.
_PROBE = """
import ctypes, sys
from graph import native_heap
if sys.argv[1] == "fixed":
    assert native_heap.return_large_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
first = libc.malloc(4 << 20)
libc.free(first)
second = libc.malloc(4 << 20)
header = ctypes.c_size_t.from_address(second - ctypes.sizeof(ctypes.c_size_t)).value
print("mapped" if header & 0x2 else "heap")
libc.free(second)
"""

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(native_heap._glibc() is None, reason="glibc's malloc only (a no-op elsewhere)")


def _second_buffer(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True,
                          cwd=REPO, timeout=60).stdout.strip()


def test_by_default_a_freed_large_buffer_sends_the_next_of_its_size_to_the_heap():
    assert _second_buffer("default") == "heap"


def test_with_the_threshold_fixed_every_large_buffer_is_its_own_mapping_returned_when_freed():
    assert _second_buffer("fixed") == "mapped"
