"""The torch-npu text export (``ASCEND_PROFILER_OUTPUT/trace_view.json``): its schema and the
columns analysis keeps of it. The folder layout, ranks, clocks and the SQLite export are
`residency.traces.ascend`'s.

Every ``X`` event of a process is kept; which are device tasks (`ASCEND_DEVICE_PROCESS`) is
known once every ``process_name`` metadata event is read. For issue 17's busy definitions each
task's ``args["Task Type"]`` and each host range's lane (its process name) are kept as int16
codes into name tables. Times are absolute epoch microseconds, decimal text.

Runs are read by the compiled reader (`residency.traces.kineto_scan.scan_ascend`) where it
handles them, else by msgspec (a typed decode, or the any-type one): the same columns either way.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import numpy as np

from residency.traces import kineto_scan
from residency.traces.columns import (
    EXACT,
    GET_DUR,
    GET_PID,
    GET_TASK,
    GET_TS,
    NO_CODE,
    HostFilter,
    Names,
    NotFoldable,
    Parsed,
    Reader,
    add_run,
    any_names,
    decoded_names,
    drain_parts,
    intervals,
    json_names,
    take_rows,
)
from residency.traces.files import TraceError
from residency.traces.units import LIMIT_NS, exact_floats, floats_to_ns, us_to_ns

__all__ = ["ASCEND_COMM_PROCESSES", "ASCEND_DERIVED_PROCESSES", "ASCEND_DEVICE_PROCESS",
           "READER", "AscendColumns"]

ASCEND_DEVICE_PROCESS = "Ascend Hardware"
ASCEND_DERIVED_PROCESSES = frozenset({"Overlap Analysis"})
ASCEND_COMM_PROCESSES = frozenset({"Communication", "HCCL"})  # "HCCL" before torch-npu 2.1


# -- event types ------------------------------------------------------------------------------

class _TaskArgs(msgspec.Struct, gc=False):
    task_type: str | None = msgspec.field(default=None, name="Task Type")


class _AscendX(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    ts: str | int | None = None  # torch-npu writes decimal text; a float goes the exact path
    dur: float = math.nan
    # no args: no Task Type (``"args": null`` goes the exact path, which reads it so too)
    args: _TaskArgs = msgspec.field(default_factory=_TaskArgs)


class _AscendMeta(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    pid: ClassVar[None] = None  # a metadata event belongs to no process's tasks
    name: str = ""
    process: int | str | None = msgspec.field(default=None, name="pid")
    args: msgspec.Raw = msgspec.Raw()


_AscendEvent = functools.reduce(operator.or_, [
    msgspec.defstruct(f"_AscendPhase{i}", [], tag_field="ph", tag=ph, gc=False,
                      namespace={"pid": None}, module=__name__)
    for i, ph in enumerate("BEiICbnesftPNODVvRc()")], _AscendX | _AscendMeta)


class _AscendTrace(msgspec.Struct, gc=False):
    traceEvents: list[_AscendEvent] | None = None  # type: ignore[valid-type]


_A_FAST = msgspec.json.Decoder(list[_AscendEvent])
_A_EXACT = EXACT


# -- columns ----------------------------------------------------------------------------------

class AscendColumns:
    """Kept columns of a torch-npu ``trace_view.json``: every ``X`` event of a process (which
    are device tasks is known only once every ``process_name`` is read)."""

    def __init__(self, device_names: bool = True) -> None:
        self.want_names = device_names
        self.host_filter: HostFilter | None = None
        self._named: dict[Any, str | None] = {}  # process names read so far (`keep_host`)
        self._counted: dict[int, str] = {}  # pid code -> the name its rows were counted under
        self.pids: dict[Any, int] = {}
        self.pid: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.ok: list[np.ndarray] = []
        self.name: list[np.ndarray] = []
        self.bad: list[np.ndarray] = []
        self.task: list[np.ndarray] = []
        self.names = Names()
        self.tasks: dict[str | None, int] = {None: NO_CODE}
        self.name_error: str | None = None
        self.metas: list[tuple[Any, bytes]] = []

    def compact(self) -> None:
        """Nothing to trim."""

    def keep_host(self, wanted: Callable[[str], bool]) -> None:
        """Keep, of the host ranges outside the Communication and derived lanes, only those
        whose name is `wanted` (asked once per distinct name), and count the others
        (`residency.traces.columns.FoldedHost`): as each run is read where its process is
        named already (torch-npu writes the names first), else at the end."""
        assert not self.pid
        self.host_filter = HostFilter(wanted)

    def _count_early(self, first_meta: int) -> None:
        """With `keep_host`: take the process names of the metadata from `first_meta` on, then
        count (and let go) the unwanted host ranges of the run just kept whose process is
        named a host lane; `finish` checks that no process is named otherwise later."""
        f = self.host_filter
        if f is None:
            return
        named = self._named
        with contextlib.suppress(msgspec.DecodeError, RecursionError):  # (`finish` raises it)
            _read_process_names(self.metas[first_meta:], named)
        lanes = np.array([p in named and _counted_lane(named[p]) for p in self.pids], bool)
        pid, ok, bad = self.pid[-1], self.ok[-1], self.bad[-1]
        drop = lanes[pid] & ok & ~bad
        if not drop.any():
            return
        drop &= ~f.wanted(self.name[-1], self.names)
        if not drop.any():
            return
        f.count(self.ts[-1][drop], self.dur[-1][drop])
        for code in np.unique(pid[drop]).tolist():
            self._counted.setdefault(code, named[list(self.pids)[code]])
        keep = ~drop
        for parts in (self.pid, self.ts, self.dur, self.ok, self.name, self.bad, self.task):
            parts[-1] = parts[-1][keep]

    def extend(self, other: AscendColumns) -> None:
        """Append the columns of the events after ours (another part of the file)."""
        assert self.host_filter is None and other.host_filter is None
        pids = np.array([self.pids.setdefault(p, len(self.pids)) for p in other.pids],
                        np.int32)
        names = self.names.absorb(other.names)
        tasks = np.array([self.tasks.setdefault(t, len(self.tasks) - 1)
                          for t in list(other.tasks)[1:]] + [NO_CODE], np.int16)
        self.pid += [pids[c] for c in other.pid]
        self.name += [names[c] for c in other.name]
        self.task += [tasks[c] for c in other.task]  # code -1 reads the last entry: -1
        self.ts += other.ts
        self.dur += other.dur
        self.ok += other.ok
        self.bad += other.bad
        self.metas += other.metas
        self.name_error = self.name_error or other.name_error

    def add(self, data: bytes, index: int = 0) -> int:
        """Decode one run of events (a JSON array) and keep its columns: read by the compiled
        reader where it handles the run (`residency.traces.kineto_scan.scan_ascend`), else by
        msgspec."""
        scanned = kineto_scan.scan_ascend(data)
        if scanned is not None:
            self.add_scanned(scanned)
            return scanned.events
        return add_run(self, data, _A_FAST, _A_EXACT)

    def add_scanned(self, got: kineto_scan.AscendScanned) -> None:
        """Keep the columns the compiled reader gave for one run (those `add_fast` keeps)."""
        metas = len(self.metas)
        self.metas += [(msgspec.json.decode(pid), args) for pid, args in got.metas]
        pids = self.pids  # each distinct pid once, in order of first appearance
        pid_codes = np.array([pids.setdefault(p, len(pids))
                              for p in msgspec.json.decode(got.pids)], np.int32)
        self.pid.append(pid_codes[got.pid_ids])
        self.ts.append(got.ts)
        self.dur.append(got.dur)
        self.ok.append(got.ok)
        self.name.append(self.names.code(json_names(got.names))[got.name_ids])
        self.bad.append(np.zeros(len(got.ts), bool))
        codes = self.tasks
        task_codes = np.array([codes.setdefault(t, len(codes) - 1)
                               for t in msgspec.json.decode(got.tasks, type=list[str])]
                              + [NO_CODE], np.int16)
        self.task.append(task_codes[got.task_ids])  # -1 reads the last entry: NO_CODE
        self._count_early(metas)

    def add_fast(self, events: list[Any]) -> bool:
        """Keep the columns of fast-path events; False (nothing kept) when a duration is not
        exact as float64."""
        # every other phase, metadata included, has no pid: the X events with one, in C
        has_pid = list(map(operator.is_not, map(GET_PID, events), itertools.repeat(None)))
        xs = list(itertools.compress(events, has_pid))
        dur = np.fromiter(map(GET_DUR, xs), np.float64, len(xs))
        if not exact_floats(dur):
            return False
        metas = len(self.metas)
        self.metas += [(e.process, bytes(e.args))
                       for e in itertools.compress(events, map(operator.not_, has_pid))
                       if type(e) is _AscendMeta and e.name == "process_name"]
        names, bad, error = decoded_names(xs)
        self._keep(xs, names, bad, error, list(map(GET_TASK, xs)), floats_to_ns(dur))
        self._count_early(metas)
        return True

    def add_exact(self, events: list[Any]) -> None:
        """Keep the columns of any-type events."""
        metas = len(self.metas)
        self.metas += [(e.pid, bytes(e.args)) for e in events
                       if e.ph == "M" and e.name == "process_name"]
        xs = [e for e in events if e.ph == "X" and type(e.pid) in (int, str)]
        self._keep(xs, any_names(xs), None, None, [_task_type(e.args) for e in xs],
                   us_to_ns([e.dur for e in xs]))
        self._count_early(metas)

    def _keep(self, xs: list[Any], names: list[str], bad: np.ndarray | None,
              error: str | None, tasks: list[str | None],
              durations: tuple[np.ndarray, np.ndarray]) -> None:
        pids, codes = self.pids, self.tasks
        pid = list(map(GET_PID, xs))
        for p in dict.fromkeys(pid):  # each distinct pid once; the rest in C
            pids.setdefault(p, len(pids))
        self.pid.append(np.fromiter(map(pids.__getitem__, pid), np.int32, len(xs)))
        ts_ns, ts_ok = us_to_ns(list(map(GET_TS, xs)))
        dur_ns, dur_ok = durations
        ok = ts_ok & dur_ok & (np.abs(ts_ns) < LIMIT_NS) & (dur_ns >= 0) & (dur_ns < LIMIT_NS)
        self.ts.append(ts_ns)
        self.dur.append(dur_ns)
        self.ok.append(ok)
        self.name.append(self.names.code(names))
        self.bad.append(np.zeros(len(xs), bool) if bad is None else bad)
        self.name_error = self.name_error or error
        for t in dict.fromkeys(tasks):
            codes.setdefault(t, len(codes) - 1)
        self.task.append(np.fromiter(map(codes.__getitem__, tasks), np.int16, len(tasks)))

    def finish(self, source: Path, doc: Any) -> Parsed:
        """The timeline, once every process's name is known. torch-npu times are absolute: no
        Kineto ``baseTimeNanoseconds`` (or ``distributedInfo``) applies."""
        process: dict[Any, str | None] = {}
        _read_process_names(self.metas, process)  # (invalid UTF-8: TraceError)
        lanes: dict[str, int] = {}
        kind_of = np.zeros(len(self.pids), np.int8)
        lane_of = np.full(len(self.pids), NO_CODE, np.int16)
        for p, code in self.pids.items():
            name = process.get(p)
            # derived slices (3) are kept as rows of their lane; `traces` sets them apart
            kind_of[code] = (1 if name == ASCEND_DEVICE_PROCESS else
                             3 if name in ASCEND_DERIVED_PROCESSES else 2)
            if name is not None:
                lane_of[code] = lanes.setdefault(name, len(lanes))
        pid = drain_parts(self.pid, np.int32)
        kinds, ok = kind_of[pid], drain_parts(self.ok, bool)
        ts, dur = drain_parts(self.ts, np.int64), drain_parts(self.dur, np.int64)
        task = drain_parts(self.task, np.int16)
        rejected = int((((kinds == 1) | (kinds == 2)) & ~ok).sum())  # a bad derived slice:
        # dropped, uncounted
        dev = np.flatnonzero(ok & (kinds == 1))
        device, order, _ = intervals(ts[dev], dur[dev], 0)
        dev = take_rows(dev, order)
        host = np.flatnonzero(ok & (kinds >= 2))
        del ok
        names, bad = drain_parts(self.name, np.int32), drain_parts(self.bad, bool)
        folded = None
        f = self.host_filter
        if f is not None:  # (times absolute: a count cannot leave the range)
            codes = list(self.pids)
            if any(not _counted_lane(process.get(codes[c])) for c in self._counted):
                raise NotFoldable  # (a process named anew after its rows were counted)
            counted = np.array([_counted_lane(process.get(p)) for p in self.pids], bool)
            keep = ~counted[pid[host]] | f.wanted(names[host], self.names) | bad[host]
            f.count(ts[host[~keep]], dur[host[~keep]])
            host = host[keep]
            folded = f.finish(0) if f.ranges else None
        ranges, horder, _ = intervals(ts[host], dur[host], 0)
        host = take_rows(host, horder)
        del ts, dur
        if bad[host].any():
            raise TraceError(source, f"invalid JSON: {self.name_error}")
        table = self.names.table()
        return Parsed(None, device, ranges, table[names[host]],
                      rejected, task[dev], task[host], lane_of[pid[host]],
                      tuple(t for t in self.tasks if t is not None), tuple(lanes),
                      device_names=table[names[dev]] if self.want_names else None,
                      host_folded=folded)


def _read_process_names(metas: list[tuple[Any, bytes]], into: dict[Any, str | None]) -> None:
    """Each ``process_name`` event's name into `into` by pid, in order (the last one counts;
    a name that is not a string: None).

    Raises:
        msgspec.DecodeError: raw args that are not JSON (invalid UTF-8).
    """
    for pid, raw in metas:
        args = msgspec.json.decode(raw) if len(raw) else None
        if isinstance(args, dict) and type(pid) in (int, str):
            name = args.get("name")
            into[pid] = name if type(name) is str else None  # a list or dict: no name


def _counted_lane(process: str | None) -> bool:
    """Whether the host ranges of a process of this name may be counted instead of kept (not
    the device's, a derived or a Communication lane)."""
    return (process != ASCEND_DEVICE_PROCESS and process not in ASCEND_DERIVED_PROCESSES
            and process not in ASCEND_COMM_PROCESSES)


def _task_type(raw: msgspec.Raw) -> str | None:
    try:
        args = msgspec.json.decode(raw) if len(raw) else None
    except (msgspec.DecodeError, RecursionError):
        return None
    task = args.get("Task Type") if isinstance(args, dict) else None
    return task if type(task) is str else None


READER = Reader(AscendColumns,
                _AscendTrace | list[_AscendEvent],  # type: ignore[operator]
                reads_document=False)
