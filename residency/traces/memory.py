"""Device-memory timeline per rank: allocated and reserved bytes over time, beside the releases.

Sources, read for each rank of a loaded `TraceSet`:

* Kineto (``torch.profiler`` with ``profile_memory=True``): the instant events named
  ``[memory]`` whose ``args["Device Id"]`` is a device (>= 0), with ``args["Total Allocated"]``
  and ``args["Total Reserved"]`` in bytes; ``ts`` in microseconds (plus ``baseTimeNanoseconds``).
* torch-npu (``profile_memory=True``): ``ASCEND_PROFILER_OUTPUT/memory_record.csv`` beside the
  rank's trace, columns ``Component, Timestamp(us), Total Allocated(MB), Total Reserved(MB),
  Total Active(MB), ...`` (header as torch-npu and msprof-analyze's ``MemoryRecordBean`` /
  ``GeMemoryRecordBean`` read it); MB is 1024**2 bytes (torch-npu's ``Constant.B_TO_MB``).
  The ``PTA`` component is the PyTorch caching allocator; ``GE``, ``PTA+GE`` and ``APP`` are
  kept with their component named (torch-npu's ``MemoryViewParser`` in
  ``torch_npu/profiler/analysis/prof_view/_memory_view_parser.py`` writes them all).
* torch-npu's SQLite export (``ExportType.Db``): the ``MEMORY_RECORD`` table of
  ``ascend_pytorch_profiler_<rank>.db`` (ns, bytes; read by
  `residency.traces.ascend_db.read_db_memory`).

Release markers (`release_markers`) are the host ranges matching ``residency.release[...]``.
`release_drops` says, per release marker, how much reserved memory the allocator handed back
during it. `allocator_memory` keeps the rows of the PyTorch caching allocator (the memory
``empty_cache`` hands back): every Kineto row and torch-npu's ``PTA`` rows; ``GE`` is the
graph engine's, ``PTA+GE`` their sum, ``APP`` the whole process as the driver sees it (its
allocated column holds KB, unconverted, in torch-npu's ``NpuMemoryBean``).
Analysis only: returns DataFrames with unit-suffixed columns; no torch, no plotting.
"""

from __future__ import annotations

import csv
import os
import re
import warnings
from array import array
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from residency.traces.files import (
    MAX_TRACE_BYTES,
    TraceError,
    TraceStream,
    open_regular,
    sealed_reads,
)
from residency.traces.jsonstream import PLACEHOLDER_VALUE, Skeleton, read_whole, split_events
from residency.traces.units import decimal_us_to_ns

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import TraceSet

__all__ = ["ALLOCATOR_COMPONENTS", "MEMORY_RECORD", "MIB", "allocator_memory", "memory_timeline",
           "release_drops", "release_markers"]

MEMORY_RECORD = "memory_record.csv"
MIB = 1024**2
ALLOCATOR_COMPONENTS = ("", "PTA")  # Kineto rows carry no component; torch-npu's allocator: PTA
_COLUMNS = ["rank", "ts_ns", "allocated_bytes", "reserved_bytes", "component", "source"]


class _Event(msgspec.Struct, gc=False):
    name: Any = None
    ph: Any = None
    ts: Any = None
    args: msgspec.Raw = msgspec.Raw()


class _MemArgs(msgspec.Struct, gc=False):
    device: Any = msgspec.field(default=None, name="Device Id")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    baseTimeNanoseconds: Any = None


_EVENTS = msgspec.json.Decoder(list[_Event], float_hook=str)  # numbers as their decimal text
_WHOLE = msgspec.json.Decoder(_Trace | list[_Event], float_hook=str)
_INT64 = 2**63


def _us_to_ns(value: Any) -> int | None:
    """Microseconds (an int or decimal text) to int64 ns exactly as the trace loader converts
    them (`units.decimal_us_to_ns`: half-up, absurd exponents refused before any
    arithmetic); None otherwise."""
    if type(value) is int:
        return value * 1000 if abs(value) * 1000 < _INT64 else None
    if type(value) is not str:
        return None
    return decimal_us_to_ns(value)


class _KinetoMemory:
    """The ``[memory]`` rows of a Kineto trace, collected run by run of events."""

    def __init__(self) -> None:
        self.ts, self.allocated, self.reserved = array("q"), array("q"), array("q")
        self.rejected = 0

    def add(self, text: bytes, index: int) -> int:
        events = _EVENTS.decode(text)
        for e in events:
            self.event(e)
        return len(events)

    def event(self, e: _Event) -> None:
        if e.name != "[memory]" or e.ph not in ("i", "I") or not len(e.args):
            return
        try:
            a = msgspec.json.decode(e.args, type=_MemArgs)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        if (type(a.device) is not int or a.device < 0 or type(a.allocated) is not int
                or type(a.reserved) is not int or not 0 <= a.allocated < _INT64
                or not 0 <= a.reserved < _INT64):
            return  # CPU memory (Device Id -1) and malformed events are not device memory
        ts = _us_to_ns(e.ts)
        if ts is None:
            self.rejected += 1
            return
        self.ts.append(ts)
        self.allocated.append(a.allocated)
        self.reserved.append(a.reserved)


def _kineto_rows(source: Path, *, max_bytes: int = MAX_TRACE_BYTES
                 ) -> list[tuple[int, int, int, str]]:
    """The device-memory rows of one Kineto file, streamed through the trace loader's reader
    (`TraceStream`: regular files only, `max_bytes` on disk and decompressed, gzip members
    and NUL padding as gzip reads them) and event splitter (`split_events`)."""
    cols = _KinetoMemory()
    try:
        with TraceStream(source, max_bytes=max_bytes) as stream:
            got = split_events(stream, cols.add, source)
            doc: Any = None
            if isinstance(got, Skeleton):
                stream.finish()  # under a seal: every byte checked before a row is used
                doc = msgspec.json.decode(got.text)
                if not (got.in_object and isinstance(doc, dict)
                        and doc.get("traceEvents") == PLACEHOLDER_VALUE) and not (
                        not got.in_object and doc == PLACEHOLDER_VALUE):
                    doc = None  # a repeated traceEvents: read it again, whole
                    cols = _KinetoMemory()
                    stream.close()
                    stream = TraceStream(source, max_bytes=max_bytes)
                    got = (b"", 0)
            if doc is None:
                prefix, offset = got  # type: ignore[misc]
                with stream:
                    data, _ = read_whole(stream, prefix, offset, source)
                    stream.finish()
                whole = _WHOLE.decode(data)
                for e in (whole if isinstance(whole, list) else whole.traceEvents or []):
                    cols.event(e)
                doc = {} if isinstance(whole, list) else {
                    "baseTimeNanoseconds": whole.baseTimeNanoseconds}
    except (msgspec.DecodeError, RecursionError) as exc:
        raise TraceError(source, f"cannot read memory events: {exc}") from None
    base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    base = base if type(base) is int and 0 <= base < _INT64 else (
        int(base) if isinstance(base, str) and base.isdigit() and len(base) <= 19 else 0)
    if cols.rejected:
        warnings.warn(f"{source}: {cols.rejected} memory event(s) rejected: `ts` is not a "
                      "number of microseconds within int64 ns", stacklevel=3)
    return [(base + t, a, r, "") for t, a, r in zip(cols.ts, cols.allocated, cols.reserved,
                                                     strict=True)]


def _mb_to_bytes(text: str) -> int | None:
    """MB (1024**2 bytes) decimal text to bytes; None when not a finite number of int64
    bytes (an absurd exponent is refused before any arithmetic)."""
    try:
        mb = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    if not mb.is_finite() or (mb and mb.adjusted() > 13):  # 1e14 MB > 2**63 bytes
        return None
    out = int((mb * MIB).to_integral_value(rounding=ROUND_HALF_UP))
    return out if abs(out) < _INT64 else None


MAX_MEMORY_RECORD_BYTES = 1 << 30  # a memory_record.csv (rows are kept in memory)


def _record_rows(path: Path, *, max_bytes: int = MAX_MEMORY_RECORD_BYTES
                 ) -> list[tuple[int, int, int, str]]:
    fd, _ = open_regular(path, max_bytes=max_bytes)  # a regular file, bounded
    try:
        with os.fdopen(fd, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            need = {"Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)"}
            missing = need - set(reader.fieldnames or ())
            if missing:
                raise TraceError(path, f"no column {sorted(missing)[0]!r} (columns: "
                                 f"{', '.join(reader.fieldnames or ()) or 'none'})")
            rows = []
            for row in reader:
                ts = _us_to_ns((row["Timestamp(us)"] or "").strip())
                alloc = _mb_to_bytes((row["Total Allocated(MB)"] or "").strip())
                res = _mb_to_bytes((row["Total Reserved(MB)"] or "").strip())
                if ts is not None and alloc is not None and res is not None:
                    rows.append((ts, alloc, res, (row.get("Component") or "").strip()))
            return rows
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise TraceError(path, f"not CSV: {exc}") from None


def memory_timeline(traces: TraceSet, *, max_trace_bytes: int = MAX_TRACE_BYTES
                    ) -> pd.DataFrame:
    """Allocated and reserved device memory of every rank over time (module doc).

    Columns: ``rank``, ``ts_ns`` (int64 ns, the traces' clock), ``allocated_bytes``,
    ``reserved_bytes``, ``component`` (torch-npu's ``Component``; ``""`` for Kineto),
    ``source`` (the file read); sorted by rank and time. A rank without memory records has no
    rows (the frame is empty when none has any).

    Kineto files are streamed through the trace loader's reader, within `max_trace_bytes`
    on disk and decompressed; ``ts`` converts to ns as the loader converts it (half-up, an
    event whose ``ts`` is not a number within int64 ns is rejected and counted in a warning).

    Raises:
        TraceError: a memory file that cannot be read, larger than its limit, or a
            ``memory_record.csv`` without the expected columns (the column is named).
    """
    import pandas as pd

    with sealed_reads(getattr(traces, "seal", None)):  # a sealed run: as sealed
        frames = [_rank_frame(pd, rank, t, traces.format, max_trace_bytes)
                  for rank, t in traces.ranks.items()]
    frames = [f for f in frames if f is not None]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c not in ("component", "source")
                                          else "object") for c in _COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    out = out.astype({"ts_ns": "int64", "allocated_bytes": "int64", "reserved_bytes": "int64"})
    return out.sort_values(["rank", "ts_ns"], kind="stable").reset_index(drop=True)[_COLUMNS]


def _rank_frame(pd: Any, rank: int, t: Any, fmt: str, max_trace_bytes: int) -> Any:
    """The memory rows of one rank as a frame; None when it has none."""
    if fmt == "kineto":
        rows, source = _kineto_rows(t.source, max_bytes=max_trace_bytes), t.source
    elif t.source.suffix == ".db":  # the SQLite export: its MEMORY_RECORD table
        from residency.traces.ascend_db import read_db_memory

        rows, source = read_db_memory(t.source), t.source
    else:
        source = t.source.parent / MEMORY_RECORD
        rows = _record_rows(source) if source.is_file() else []
    if not rows:
        return None
    f = pd.DataFrame(rows, columns=["ts_ns", "allocated_bytes", "reserved_bytes", "component"])
    f.insert(0, "rank", rank)
    f["source"] = str(source)
    return f


def release_markers(traces: TraceSet, pattern: str = r"^residency\.release\[") -> pd.DataFrame:
    """The host ranges whose name matches `pattern` on every rank: ``rank``, ``name``,
    ``start_ns``, ``end_ns``, sorted by rank and start (the releases to draw on a memory
    figure)."""
    import pandas as pd

    rx = re.compile(pattern)
    parts = []
    for rank, t in traces.ranks.items():
        names = t.range_names.tolist()
        hit = np.fromiter((rx.search(n) is not None for n in names), bool, len(names))
        parts.append(pd.DataFrame({"rank": rank, "name": np.asarray(names, object)[hit],
                                   "start_ns": t.ranges[hit, 0], "end_ns": t.ranges[hit, 1]}))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["rank", "name", "start_ns", "end_ns"])
    return out.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def allocator_memory(timeline: pd.DataFrame) -> pd.DataFrame:
    """The rows of `timeline` (`memory_timeline`) that describe the PyTorch caching allocator:
    component in `ALLOCATOR_COMPONENTS` (module doc); a new frame, `timeline` is unchanged."""
    keep = timeline["component"].isin(ALLOCATOR_COMPONENTS)
    return timeline[keep].reset_index(drop=True)


def release_drops(timeline: pd.DataFrame, markers: pd.DataFrame) -> pd.DataFrame:
    """Per release marker (`release_markers` rows): the caching allocator's reserved bytes
    before it (the last record of its rank before ``start_ns``) and at its end (the last record
    at or before ``end_ns``), and ``released_bytes``, their difference (positive: memory handed
    back). Records are `allocator_memory`'s rows of `timeline`; a marker with no record before
    it has ``<NA>`` before and released. Columns: ``rank``, ``name``, ``start_ns``, ``end_ns``,
    ``reserved_before_bytes``, ``reserved_after_bytes``, ``released_bytes`` (nullable int64)."""
    import pandas as pd

    mem = allocator_memory(timeline)
    by_rank = {int(r): (g["ts_ns"].to_numpy(np.int64), g["reserved_bytes"].to_numpy(np.int64))
               for r, g in mem.groupby("rank", sort=False)}
    before, after = [], []
    for rank, start, end in zip(markers["rank"], markers["start_ns"], markers["end_ns"],
                                strict=True):
        ts, reserved = by_rank.get(int(rank), (np.empty(0, np.int64), np.empty(0, np.int64)))
        i = int(np.searchsorted(ts, int(start), side="left")) - 1
        j = int(np.searchsorted(ts, int(end), side="right")) - 1
        before.append(int(reserved[i]) if i >= 0 else None)
        after.append(int(reserved[j]) if j >= 0 else None)
    out = markers[["rank", "name", "start_ns", "end_ns"]].reset_index(drop=True).copy()
    out["reserved_before_bytes"] = pd.array(before, dtype="Int64")
    out["reserved_after_bytes"] = pd.array(after, dtype="Int64")
    out["released_bytes"] = out["reserved_before_bytes"] - out["reserved_after_bytes"]
    return out
