"""The compiled reader of Kineto event runs (`_kineto_scan`, built from ``_kineto_scan.c`` when
the package is installed), behind one function: `scan`; and of torch-npu's text export
(``trace_view.json``), `scan_ascend`.

It reads a run of events in one pass, validating it as strict JSON and picking out the kept
complete events' category kind, ``ts``, ``dur`` and names: what `residency.traces.kineto`
otherwise gets from a typed msgspec decode and Python passes over the decoded events. Where it
does not handle a run (module doc of the C file: anything msgspec might read otherwise, or
reject) it returns None and the caller decodes the run with msgspec, so the columns, the
errors and their positions are the same either way; only the speed differs.

Without a C compiler at install time the extension is not built (it is optional) and every run
goes the msgspec way. ``RESIDENCY_PURE_PYTHON=1`` in the environment turns it off too (read at
import).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["DISABLE_ENV", "AscendScanned", "Scanned", "available", "msgspec_only", "scan",
           "scan_ascend"]

DISABLE_ENV = "RESIDENCY_PURE_PYTHON"

try:
    from residency.traces import _kineto_scan as _ext
except ImportError:  # not built (no compiler at install time)
    _ext = None
_off = _ext is None or os.environ.get(DISABLE_ENV, "") not in ("", "0")
_scan = None if _off else _ext.scan
_scan_ascend = None if _off else getattr(_ext, "scan_ascend", None)  # None: built before it


@dataclass(frozen=True)
class Scanned:
    """The kept events of one run, in order (arrays of equal length)."""

    events: int  # events in the run, kept or not
    kinds: np.ndarray  # int8: 1 device task, 2 host range
    ts: np.ndarray  # int64 ns (0 where not ok)
    dur: np.ndarray  # int64 ns
    ok: np.ndarray  # bool: ts and dur were numbers
    name_ids: np.ndarray  # int32 per named event (module doc of the C file): into `names`
    names: bytes | None  # JSON array of the distinct raw names


def available() -> bool:
    """Whether runs are read by the compiled reader in this process."""
    return _scan is not None


@contextlib.contextmanager
def msgspec_only() -> Iterator[None]:
    """Within: every run is decoded by msgspec, as without the compiled reader (comparisons of
    the two readers in one process)."""
    global _scan, _scan_ascend
    saved, _scan, _scan_ascend = (_scan, _scan_ascend), None, None
    try:
        yield
    finally:
        _scan, _scan_ascend = saved


def scan(data: bytes, kind_of: Callable[[bytes], int], names: int) -> Scanned | None:
    """The kept columns of the run `data` (a JSON array of events); None where the compiled
    reader is not available or does not handle this run. `kind_of` gives the kind (0, 1, 2)
    of a category from its raw JSON text; `names`: 0 none, 1 the host ranges', 2 every kept
    event's (each distinct raw name once, numbered)."""
    if _scan is None:
        return None
    got = _scan(data, kind_of, names)
    if got is None:
        return None
    n, kinds, ts, dur, ok, ids, text = got
    return Scanned(n, np.frombuffer(kinds, np.int8), np.frombuffer(ts, np.int64),
                   np.frombuffer(dur, np.int64), np.frombuffer(ok, np.uint8).astype(bool),
                   np.frombuffer(ids, np.int32), text)


@dataclass(frozen=True)
class AscendScanned:
    """The complete events with a pid of one torch-npu run, in order (arrays of equal length),
    and its ``process_name`` metadata: what `residency.traces.ascend_text` keeps of a run."""

    events: int  # events in the run, kept or not
    pid_ids: np.ndarray  # int32 into `pids`
    pids: bytes  # JSON array of the distinct raw pids (int or str)
    ts: np.ndarray  # int64 ns (`residency.traces.units.us_to_ns`; 0 where not a time)
    dur: np.ndarray  # int64 ns (exact from the decimal text; 0 where missing)
    ok: np.ndarray  # bool: ts and dur times, both within LIMIT_NS, dur >= 0
    name_ids: np.ndarray  # int32 into `names`
    names: bytes  # JSON array of the distinct raw names ("" where missing)
    task_ids: np.ndarray  # int32 into `tasks`, -1: no string args["Task Type"]
    tasks: bytes  # JSON array of the distinct raw Task Type strings
    metas: list[tuple[bytes, bytes]]  # process_name events: (raw pid or b"null", raw args)


def scan_ascend(data: bytes) -> AscendScanned | None:
    """The kept columns of the torch-npu run `data` (a JSON array of events); None where the
    compiled reader is not available or does not handle this run (module doc of the C file)."""
    if _scan_ascend is None:
        return None
    got = _scan_ascend(data)
    if got is None:
        return None
    n, pid_ids, pids, ts, dur, ok, name_ids, names, task_ids, tasks, metas = got
    return AscendScanned(n, np.frombuffer(pid_ids, np.int32), pids, np.frombuffer(ts, np.int64),
                         np.frombuffer(dur, np.int64),
                         np.frombuffer(ok, np.uint8).astype(bool),
                         np.frombuffer(name_ids, np.int32), names,
                         np.frombuffer(task_ids, np.int32), tasks, metas)
