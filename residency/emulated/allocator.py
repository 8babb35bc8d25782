"""The emulated device's caching allocator over real host buffers."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

MIN_BLOCK_BYTES = 512
"""Every block is a multiple of 512 bytes (PyTorch's kMinBlockSize)."""
SMALL_SIZE_BYTES = 1024**2
"""Requests up to 1 MiB are small-pool blocks (PyTorch's kSmallSize)."""
LARGE_ROUND_BYTES = 2 * 1024**2
"""Large requests are rounded up to 2 MiB (PyTorch's kRoundLarge)."""
OVERSIZE_SLACK_BYTES = 20 * 1024**2
"""A cached large block is reused only if less than 20 MiB larger than the request
(PyTorch's kLargeBuffer bound for blocks it does not split)."""

_GiB = 1024**3


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / _GiB:.3f} GiB)"


def check_positive_int(name: str, value: Any) -> int:
    """`value` if it is a positive int; otherwise ValueError naming `name` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"The value for `{name}` must be a positive integer, but {value!r} "
                         "was passed.")
    return value


def round_size(nbytes: int) -> int:
    """Block size for a request: a multiple of 512 B up to 1 MiB, else of 2 MiB."""
    if nbytes <= SMALL_SIZE_BYTES:
        return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)
    return -(-nbytes // LARGE_ROUND_BYTES) * LARGE_ROUND_BYTES


def _trim_host_heap() -> None:
    """Ask glibc to hand free heap pages back to the OS (blocks below its mmap threshold)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


_MALLOC_TRIM = _load_malloc_trim()


class Block:
    """One allocation unit: a real host buffer of `size` bytes."""

    __slots__ = ("id", "size", "requested", "buffer", "allocated")

    def __init__(self, block_id: int, size: int, buffer: torch.Tensor) -> None:
        self.id = block_id
        self.size = size
        self.requested = 0
        self.buffer: torch.Tensor | None = buffer
        self.allocated = False

    @property
    def pool(self) -> str:
        """`small_pool` (blocks up to 1 MiB) or `large_pool`."""
        return "small_pool" if self.size <= SMALL_SIZE_BYTES else "large_pool"

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "cached"
        return f"Block(id={self.id}, size={self.size}, {state})"


class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n


_STAT_NAMES = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes",
               "active_bytes", "requested_bytes")
_POOLS = ("all", "small_pool", "large_pool")


class CachingHostAllocator:
    """A caching allocator of one emulated device over real host buffers.

    Accounting follows PyTorch's CUDA caching allocator: `allocated` counts the (rounded) sizes
    of live blocks, `reserved` those of every block held (live or cached), and free memory is
    `capacity - reserved`. Blocks are never split or merged; a freed block stays cached and is
    reused best-fit: the smallest cached block of the request's pool (small: up to 1 MiB) that
    is at least the rounded request and, for large blocks, less than 20 MiB larger. A request
    that would push `reserved` past the capacity first waits for the device (`before_release`),
    drops every cached block and retries; if it still does not fit it raises
    `torch.OutOfMemoryError` and changes nothing but the `num_ooms` counter. Thread-safe.
    `on_change(delta_bytes, allocated_bytes, reserved_bytes)`, when given, is called (under
    the allocator's lock) after every allocation, free and release of cached blocks.

    With `prefault`, a new block's pages are written once when it is allocated (like a
    device allocator mapping physical memory), so re-acquiring memory after `empty_cache`
    costs real host time even when no device task ever touches it.
    """

    def __init__(self, capacity_bytes: int, *, device_index: int = 0,
                 before_release: Callable[[], None] | None = None,
                 on_change: Callable[[int, int, int], None] | None = None,
                 prefault: bool = False,
                 acquire_s: Callable[[int], float] | None = None) -> None:
        self.capacity_bytes = check_positive_int("capacity_bytes", capacity_bytes)
        self.prefault = prefault
        # with a measured cost curve: released buffers stay in a host pool (no unmapping),
        # a new block takes one (already faulted) and waits out acquire_s(size) instead
        self._acquire_s = acquire_s
        self._pool: dict[int, list[torch.Tensor]] = {}
        self._pool_bytes = 0
        self.device_index = device_index
        self._before_release = before_release
        self._on_change = on_change
        self._lock = threading.Lock()
        self._deferred: deque[Block] = deque()  # frees from finalizers that found the lock taken
        self._cached: dict[str, list[tuple[int, int]]] = {"small_pool": [], "large_pool": []}
        self._blocks: dict[int, Block] = {}
        self._next_id = 0
        self._stats = {(name, pool): _Stat() for name in _STAT_NAMES for pool in _POOLS}
        self._counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0,
                          "num_device_free": 0}

    # -- queries -------------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        """Bytes in live blocks."""
        return self._current("allocated_bytes")

    @property
    def reserved_bytes(self) -> int:
        """Bytes in every block held, live or cached."""
        return self._current("reserved_bytes")

    @property
    def cached_bytes(self) -> int:
        """Reserved but unallocated bytes."""
        with self._locked():
            return (self._stats["reserved_bytes", "all"].current
                    - self._stats["allocated_bytes", "all"].current)

    @property
    def free_bytes(self) -> int:
        """Capacity minus reserved bytes."""
        return self.capacity_bytes - self.reserved_bytes

    @property
    def max_allocated_bytes(self) -> int:
        """Peak of `allocated_bytes` since creation or `reset_peak_stats`."""
        with self._locked():
            return self._stats["allocated_bytes", "all"].peak

    @property
    def max_reserved_bytes(self) -> int:
        """Peak of `reserved_bytes` since creation or `reset_peak_stats`."""
        with self._locked():
            return self._stats["reserved_bytes", "all"].peak

    def stats(self) -> dict[str, int]:
        """torch-npu style counters: `allocated_bytes.all.current`, `num_ooms`, ..."""
        with self._locked():
            out: dict[str, int] = {}
            for (name, pool), stat in self._stats.items():
                for field in ("current", "peak", "allocated", "freed"):
                    out[f"{name}.{pool}.{field}"] = getattr(stat, field)
            out.update(self._counters)
            out["inactive_split.all.current"] = 0
            out["inactive_split_bytes.all.current"] = 0
            return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._locked():
            for stat in self._stats.values():
                stat.peak = stat.current

    # -- operations ----------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block:
        """A live block of at least `nbytes` (> 0) bytes; `torch.OutOfMemoryError` past capacity."""
        check_positive_int("nbytes", nbytes)
        size = round_size(nbytes)
        with self._locked():
            block = self._take_cached(size) or self._new_block(size)
            if block is not None:
                return self._activate(block, nbytes)
        if self._before_release is not None:  # like PyTorch: synchronize before freeing cache
            self._before_release()
        with self._locked():
            block = self._take_cached(size) or self._new_block(size)
            if block is None and self._cached_count():
                self._release_cached_locked()
                self._counters["num_alloc_retries"] += 1
                block = self._new_block(size)
            if block is None:
                self._counters["num_ooms"] += 1
                reserved = self._stats["reserved_bytes", "all"].current
                allocated = self._stats["allocated_bytes", "all"].current
                raise torch.OutOfMemoryError(
                    f"Emulated NPU {self.device_index} out of memory: tried to allocate "
                    f"{_fmt_bytes(nbytes)} (block {size} bytes) with {_fmt_bytes(reserved)} "
                    f"reserved ({allocated} bytes allocated, no cached block left) of a capacity "
                    f"of {_fmt_bytes(self.capacity_bytes)}.")
            return self._activate(block, nbytes)

    def free(self, block: Block, *, from_finalizer: bool = False) -> None:
        """Return a live block to the cache; ValueError if it is not live here.

        With `from_finalizer`, never blocks: if the lock is taken the free is queued and done
        by the next allocator call (finalizers may run inside an allocator call).
        """
        if from_finalizer:
            if not self._lock.acquire(blocking=False):
                self._deferred.append(block)
                return
            try:
                self._drain_deferred()
                self._free_locked(block)
            finally:
                self._lock.release()
            return
        with self._locked():
            self._free_locked(block)

    def release_cached(self) -> int:
        """Drop every cached block so its memory goes back to the OS; returns the bytes dropped."""
        with self._locked():
            released = self._release_cached_locked()
        if released:
            _trim_host_heap()
        return released

    # -- internals -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self._drain_deferred()
            yield

    def _current(self, name: str) -> int:
        with self._locked():
            return self._stats[name, "all"].current

    def _update(self, name: str, pool: str, delta: int) -> None:
        for key in ((name, "all"), (name, pool)):
            if delta >= 0:
                self._stats[key].add(delta)
            else:
                self._stats[key].sub(-delta)

    def _cached_count(self) -> int:
        return sum(len(entries) for entries in self._cached.values())

    def _drain_deferred(self) -> None:
        while self._deferred:
            self._free_locked(self._deferred.popleft())

    def _take_cached(self, size: int) -> Block | None:
        pool = "small_pool" if size <= SMALL_SIZE_BYTES else "large_pool"
        entries = self._cached[pool]
        i = bisect_left(entries, (size, -1))
        if i == len(entries):
            return None
        found_size, block_id = entries[i]
        if pool == "large_pool" and found_size >= size + OVERSIZE_SLACK_BYTES:
            return None
        del entries[i]
        return self._blocks[block_id]

    def _new_block(self, size: int) -> Block | None:
        if self._stats["reserved_bytes", "all"].current + size > self.capacity_bytes:
            return None
        buffer = self._pooled(size)
        if buffer is None:
            buffer = torch.empty(size, dtype=torch.uint8)  # untouched: pages fault on first write
            if self.prefault:
                buffer.zero_()
        block = Block(self._next_id, size, buffer)
        self._next_id += 1
        self._blocks[block.id] = block
        self._update("reserved_bytes", block.pool, size)
        self._update("segment", block.pool, 1)
        self._counters["num_device_alloc"] += 1
        return block

    def _pooled(self, size: int) -> torch.Tensor | None:
        """A pooled buffer of `size` after waiting out its re-acquire cost (cost curve only);
        None without a curve or pooled buffer. Trims the pool so that it and the reserved
        bytes fit the capacity."""
        if self._acquire_s is None:
            return None
        delay = self._acquire_s(size)
        if delay > 0:
            time.sleep(delay)
        buffers = self._pool.get(size)
        if buffers:
            self._pool_bytes -= size
            return buffers.pop()
        limit = self.capacity_bytes - self._stats["reserved_bytes", "all"].current - size
        for pooled_size in sorted(self._pool, reverse=True):
            while self._pool[pooled_size] and self._pool_bytes > limit:
                self._pool[pooled_size].pop()
                self._pool_bytes -= pooled_size
        return None

    def _activate(self, block: Block, nbytes: int) -> Block:
        block.allocated = True
        block.requested = nbytes
        for name, delta in (("allocation", 1), ("active", 1), ("allocated_bytes", block.size),
                            ("active_bytes", block.size), ("requested_bytes", nbytes)):
            self._update(name, block.pool, delta)
        self._changed(block.size)
        return block

    def _changed(self, delta: int) -> None:
        if self._on_change is not None:
            self._on_change(delta, self._stats["allocated_bytes", "all"].current,
                            self._stats["reserved_bytes", "all"].current)

    def _free_locked(self, block: Block) -> None:
        if self._blocks.get(block.id) is not block or not block.allocated:
            raise ValueError(f"{block!r} is not a live block of emulated NPU {self.device_index}")
        block.allocated = False
        for name, delta in (("allocation", 1), ("active", 1), ("allocated_bytes", block.size),
                            ("active_bytes", block.size), ("requested_bytes", block.requested)):
            self._update(name, block.pool, -delta)
        block.requested = 0
        insort(self._cached[block.pool], (block.size, block.id))
        self._changed(-block.size)

    def _release_cached_locked(self) -> int:
        released = 0
        for entries in self._cached.values():
            for size, block_id in entries:
                block = self._blocks.pop(block_id)
                if self._acquire_s is not None and block.buffer is not None:  # cost curve
                    self._pool.setdefault(size, []).append(block.buffer)
                    self._pool_bytes += size
                block.buffer = None  # the last reference: glibc munmaps large buffers here
                self._update("reserved_bytes", block.pool, -size)
                self._update("segment", block.pool, -1)
                self._counters["num_device_free"] += 1
                released += size
            entries.clear()
        if released:
            self._changed(0)
        return released

    def __repr__(self) -> str:
        return (f"CachingHostAllocator(device={self.device_index}, capacity_bytes="
                f"{self.capacity_bytes}, reserved={self.reserved_bytes}, "
                f"allocated={self.allocated_bytes})")
