"""Freed C-heap pages go back to the kernel when a run's start has measured what it needed."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import pytest

from rlhfless.runtime.freed_memory import release_freed_memory

LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
BLOCK = 64 << 10  # below glibc's mmap threshold: served from the heap
BLOCKS = 3200  # 200 MB


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not hasattr(LIBC, "malloc_trim"), reason="not glibc: nothing to trim")
def test_freed_heap_blocks_below_a_live_one_leave_the_process():
    LIBC.malloc.restype = ctypes.c_void_p
    LIBC.free.argtypes = [ctypes.c_void_p]
    blocks = [LIBC.malloc(BLOCK) for _ in range(BLOCKS)]
    pin = LIBC.malloc(BLOCK)  # above them: free() alone cannot shrink the heap past it
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)  # resident
    for block in blocks:
        LIBC.free(block)
    held = resident_bytes()
    assert release_freed_memory()
    assert held - resident_bytes() > BLOCKS * BLOCK // 2
    LIBC.free(pin)
