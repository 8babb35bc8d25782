"""The compiled reader of Kineto event runs (`_kineto_scan`, built from ``_kineto_scan.c`` when
the package is installed), behind one function: `scan`.

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

__all__ = ["DISABLE_ENV", "Scanned", "available", "msgspec_only", "scan"]

DISABLE_ENV = "RESIDENCY_PURE_PYTHON"

try:
    from residency.traces import _kineto_scan as _ext
except ImportError:  # not built (no compiler at install time)
    _ext = None
_scan = None if _ext is None or os.environ.get(DISABLE_ENV, "") not in ("", "0") else _ext.scan


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
    global _scan
    saved, _scan = _scan, None
    try:
        yield
    finally:
        _scan = saved


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
