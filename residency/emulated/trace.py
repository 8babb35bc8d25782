"""Trace records of the emulated NPU and their Kineto-shaped JSON form."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HOST_RANGE_CATEGORY = "user_annotation"
DEVICE_PID_BASE = 1 << 22
"""Trace pid of device i is DEVICE_PID_BASE + i: above Linux's PID_MAX_LIMIT, never a process."""


@dataclass(frozen=True)
class TraceRecord:
    """One traced range, monotonic `perf_counter_ns` clock, half-open [start_ns, end_ns).

    `device` is the device index for device tasks and None for host ranges; `tid` is the
    stream id for device tasks and the native thread id for host ranges.
    """

    name: str
    category: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    device: int | None = None
    thread_name: str | None = None


@dataclass(frozen=True)
class MemoryRecord:
    """A device's allocator totals right after a change (`perf_counter_ns` clock)."""

    ts_ns: int
    device: int
    delta_bytes: int
    allocated_bytes: int
    reserved_bytes: int


class Tracer:
    """Collects records that start while a trace is active (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = False
        self.start_ns: int | None = None
        self.stop_ns: int | None = None
        self.records: list[TraceRecord] = []
        self.memory: list[MemoryRecord] = []

    def start(self, start_ns: int) -> None:
        """Forget earlier records and accept those starting at or after `start_ns`."""
        with self.lock:
            self.records = []
            self.memory = []
            self.start_ns = start_ns
            self.stop_ns = None
            self.active = True

    def stop(self, stop_ns: int) -> None:
        """Accept no more records."""
        with self.lock:
            self.active = False
            self.stop_ns = stop_ns

    def add(self, record: TraceRecord) -> None:
        """Keep `record` if a trace is active and it started after the trace did."""
        if not self.active:
            return
        with self.lock:
            if self.active and self.start_ns is not None and record.start_ns >= self.start_ns:
                self.records.append(record)

    def on_host_range(self, name: str, start_ns: int, end_ns: int) -> None:
        """A `residency.markers` sink: records the range on the calling thread."""
        self.add(TraceRecord(name, HOST_RANGE_CATEGORY, start_ns, end_ns, os.getpid(),
                             threading.get_native_id(), None, threading.current_thread().name))

    def on_memory(self, device: int, delta: int, allocated: int, reserved: int) -> None:
        """An allocator's `on_change` hook: records its totals while a trace is active."""
        if not self.active:
            return
        now = time.perf_counter_ns()
        with self.lock:
            if self.active:
                self.memory.append(MemoryRecord(now, device, delta, allocated, reserved))

    def memory_snapshot(self) -> list[MemoryRecord]:
        """The memory records so far, by time."""
        with self.lock:
            return sorted(self.memory, key=lambda r: r.ts_ns)

    def snapshot(self) -> list[TraceRecord]:
        """The records so far, by start time."""
        with self.lock:
            return sorted(self.records, key=lambda r: (r.start_ns, r.end_ns))


def _meta(name: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    key = "name" if name.endswith("_name") else "sort_index"
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


def kineto_trace(records: Sequence[TraceRecord], *, start_ns: int, base_time_ns: int,
                 streams: dict[int, list[int]], device_name: str, capacity_bytes: int,
                 rank: int, world_size: int, trace_name: str = "",
                 host_pid: int | None = None,
                 memory: Sequence[MemoryRecord] = ()) -> dict[str, Any]:
    """A Kineto-shaped trace object of `records` (and of `memory`, as the ``[memory]`` instant
    events ``torch.profiler(profile_memory=True)`` writes: Total Allocated / Total Reserved).

    `start_ns` is the trace start on the records' clock and `base_time_ns` the same instant in
    wall-clock ns (`baseTimeNanoseconds`); `ts`/`dur` are microseconds with 3 decimals, `ts`
    relative to that base. `streams` maps each device index to its stream ids (thread names).
    """
    host_pid = os.getpid() if host_pid is None else host_pid
    events = [_meta("process_name", host_pid, 0, f"python {host_pid} (rank {rank})"),
              _meta("process_sort_index", host_pid, 0, 0)]
    for index, stream_ids in sorted(streams.items()):
        pid = DEVICE_PID_BASE + index
        events += [_meta("process_name", pid, 0, f"Emulated NPU {index}"),
                   _meta("process_sort_index", pid, 0, 1 + index)]
        events += [_meta("thread_name", pid, sid, f"stream {sid}") for sid in stream_ids]
    host_threads = {r.tid: r.thread_name for r in records if r.device is None}
    events += [_meta("thread_name", host_pid, tid, name or f"thread {tid}")
               for tid, name in sorted(host_threads.items())]
    for r in records:
        event: dict[str, Any] = {
            "ph": "X", "cat": r.category, "name": r.name, "pid": r.pid, "tid": r.tid,
            "ts": round((r.start_ns - start_ns) / 1e3, 3),
            "dur": round((r.end_ns - r.start_ns) / 1e3, 3),
        }
        if r.device is not None:
            event["args"] = {"device": r.device, "stream": r.tid}
        events.append(event)
    for m in memory:
        events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]",
                       "pid": host_pid, "tid": 0, "ts": round((m.ts_ns - start_ns) / 1e3, 3),
                       "args": {"Device Type": 20, "Device Id": m.device, "Addr": 0,
                                "Bytes": m.delta_bytes, "Total Allocated": m.allocated_bytes,
                                "Total Reserved": m.reserved_bytes}})
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": index, "name": device_name, "totalGlobalMem": capacity_bytes}
                             for index in sorted(streams)],
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world_size},
        "baseTimeNanoseconds": base_time_ns,
        "displayTimeUnit": "ms",
        "traceName": trace_name,
        "traceEvents": events,
    }
