"""Worker processes for parsing traces: the one pool recipe of every caller.

Forked where that is safe (from a process with no threads of its own: a notebook kernel has
some), else spawned. Each worker keeps its C heap between the runs it decodes (`keep_heap`):
a parse frees and reallocates its 2 MiB runs, their event lists and arrays thousands of
times, and glibc by default hands such memory back to the kernel and maps it again, one page
fault per 4 KiB. Measured here (2 cores, 8 ranks x 110k events, `residency idle --no-cache`,
6 interleaved rounds): 36.7k page faults and 0.61 s (median) with glibc's defaults, 20.4k and
0.48 s with the heap kept.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor

__all__ = ["HEAP_KEEP_BYTES", "heap_kept", "keep_heap", "process_pool", "start_method",
           "usable_cpus"]

HEAP_KEEP_BYTES = 32 << 20  # freed memory a worker keeps at its heap's top
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_kept = False


def start_method() -> str:
    """How to start worker processes from this process: ``"fork"`` (cheapest) where it is safe,
    from a process with no threads of its own, else ``"spawn"``."""
    return "fork" if (threading.active_count() == 1 and "fork" in
                      multiprocessing.get_all_start_methods()) else "spawn"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def process_pool(n: int) -> ProcessPoolExecutor:
    """`n` worker processes (module doc)."""
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(start_method()),
                               initializer=keep_heap)


def keep_heap() -> bool:
    """In this process, keep up to `HEAP_KEEP_BYTES` of freed memory at the heap's top and
    serve buffers below half of it from the heap (glibc only: elsewhere nothing changes);
    whether it is in effect. Memory stays bounded: what is kept is reused by the next run."""
    global _kept
    if _kept:
        return True
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return False
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_KEEP_BYTES // 2)
                 and mallopt(_M_TRIM_THRESHOLD, HEAP_KEEP_BYTES))
    return _kept


def heap_kept() -> bool:
    """Whether `keep_heap` is in effect in this process."""
    return _kept
