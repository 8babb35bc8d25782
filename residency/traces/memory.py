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
  `residency.traces.ascend.read_db_memory`).

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
import gzip
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from residency.traces.load import TraceError

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


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    baseTimeNanoseconds: Any = None


class _MemArgs(msgspec.Struct, gc=False):
    device: Any = msgspec.field(default=None, name="Device Id")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")


def _us_to_ns(value: Any) -> int | None:
    try:
        return int((Decimal(str(value)) * 1000).to_integral_value())
    except (InvalidOperation, ValueError, TypeError):
        return None


def _kineto_rows(source: Path) -> list[tuple[int, int, int, str]]:
    try:
        data = source.read_bytes()
        if source.name.endswith(".gz"):
            data = gzip.decompress(data)
        doc = msgspec.json.Decoder(_Trace | list[_Event], float_hook=str).decode(data)
    except (OSError, EOFError, msgspec.DecodeError) as exc:
        raise TraceError(source, f"cannot read memory events: {exc}") from None
    events = doc if isinstance(doc, list) else (doc.traceEvents or [])
    base = 0 if isinstance(doc, list) else doc.baseTimeNanoseconds
    base = int(base) if isinstance(base, int | str) and str(base).isdigit() else 0
    rows = []
    for e in events:
        if e.name != "[memory]" or e.ph not in ("i", "I") or not len(e.args):
            continue
        try:
            a = msgspec.json.decode(e.args, type=_MemArgs)
        except msgspec.ValidationError:
            continue
        ts = _us_to_ns(e.ts)
        if (ts is None or type(a.device) is not int or a.device < 0
                or type(a.allocated) is not int or type(a.reserved) is not int):
            continue  # CPU memory (Device Id -1) and malformed events are not device memory
        rows.append((base + ts, a.allocated, a.reserved, ""))
    return rows


def _mb_to_bytes(text: str) -> int | None:
    try:
        return int((Decimal(text) * MIB).to_integral_value())
    except (InvalidOperation, ValueError):
        return None


def _record_rows(path: Path) -> list[tuple[int, int, int, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
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


def memory_timeline(traces: TraceSet) -> pd.DataFrame:
    """Allocated and reserved device memory of every rank over time (module doc).

    Columns: ``rank``, ``ts_ns`` (int64 ns, the traces' clock), ``allocated_bytes``,
    ``reserved_bytes``, ``component`` (torch-npu's ``Component``; ``""`` for Kineto),
    ``source`` (the file read); sorted by rank and time. A rank without memory records has no
    rows (the frame is empty when none has any).

    Raises:
        TraceError: a memory file that cannot be read, or a ``memory_record.csv`` without the
            expected columns (the column is named).
    """
    import pandas as pd

    frames = []
    for rank, t in traces.ranks.items():
        if traces.format == "kineto":
            rows, source = _kineto_rows(t.source), t.source
        elif t.source.suffix == ".db":  # the SQLite export: its MEMORY_RECORD table
            from residency.traces.ascend import read_db_memory

            rows, source = read_db_memory(t.source), t.source
        else:
            source = t.source.parent / MEMORY_RECORD
            rows = _record_rows(source) if source.is_file() else []
        if rows:
            f = pd.DataFrame(rows, columns=["ts_ns", "allocated_bytes", "reserved_bytes",
                                            "component"])
            f.insert(0, "rank", rank)
            f["source"] = str(source)
            frames.append(f)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c not in ("component", "source")
                                          else "object") for c in _COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    out = out.astype({"ts_ns": "int64", "allocated_bytes": "int64", "reserved_bytes": "int64"})
    return out.sort_values(["rank", "ts_ns"], kind="stable").reset_index(drop=True)[_COLUMNS]


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
