"""Interval algebra on int64 nanoseconds: half-open ``[start, end)`` rows of an ``(n, 2)`` array.

Every function returns a new array and leaves its arguments untouched. Results of `merge`,
`union`, `complement` and `intersection` are *normalised*: sorted, disjoint, non-adjacent and
without empty intervals. Inputs may be unsorted and overlapping.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

Intervals = npt.NDArray[np.int64]

__all__ = ["Intervals", "as_intervals", "complement", "intersection", "measure", "merge",
           "union"]


def as_intervals(x: npt.ArrayLike) -> Intervals:
    """`x` as an ``(n, 2)`` int64 array; raises ValueError on a wrong shape or end < start."""
    a = np.asarray(x)
    if a.size == 0:
        return np.empty((0, 2), np.int64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"intervals must have shape (n, 2), but {a.shape} was passed.")
    if a.dtype != np.int64:
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"intervals must be integer nanoseconds, but {a.dtype} was passed.")
        a = a.astype(np.int64)
    if np.any(a[:, 1] < a[:, 0]):
        row = int(np.flatnonzero(a[:, 1] < a[:, 0])[0])
        raise ValueError(f"interval {row} ends before it starts: {a[row].tolist()}.")
    return a


def merge(x: npt.ArrayLike) -> Intervals:
    """The normalised union of the rows of `x` (touching intervals join; empty ones vanish)."""
    a = as_intervals(x)
    a = a[a[:, 1] > a[:, 0]]
    if len(a) <= 1:
        return a.copy()
    if np.any(a[1:, 0] < a[:-1, 0]):
        a = a[np.argsort(a[:, 0], kind="stable")]
    ends = np.maximum.accumulate(a[:, 1])
    # a new group starts where an interval begins strictly after everything before it ended
    first = np.flatnonzero(np.r_[True, a[1:, 0] > ends[:-1]])
    last = np.r_[first[1:] - 1, len(a) - 1]
    return np.column_stack((a[first, 0], ends[last]))


def union(*sets: npt.ArrayLike) -> Intervals:
    """The normalised union of several interval sets."""
    parts = [as_intervals(s) for s in sets]
    return merge(np.concatenate(parts) if parts else np.empty((0, 2), np.int64))


def _coverage(sets: Iterable[Intervals], depth: int) -> Intervals:
    """Where at least `depth` of the normalised `sets` overlap."""
    sets = list(sets)
    if not sets:
        return np.empty((0, 2), np.int64)
    ends = np.concatenate([s[:, 1] for s in sets])
    pos = np.concatenate([ends] + [s[:, 0] for s in sets])
    step = np.ones(len(pos), np.int64)
    step[: len(ends)] = -1
    # a stable sort keeps ends (listed first) before starts at equal positions:
    # [a, b) and [b, c) do not overlap; sorted runs make it nearly linear
    order = np.argsort(pos, kind="stable")
    pos, level = pos[order], np.cumsum(step[order])
    keep = np.flatnonzero((level[:-1] >= depth) & (pos[1:] > pos[:-1]))
    return merge(np.column_stack((pos[keep], pos[keep + 1])))


def intersection(*sets: npt.ArrayLike) -> Intervals:
    """The normalised set of instants covered by every one of `sets`."""
    merged = [merge(s) for s in sets]
    return _coverage(merged, len(merged)) if merged else np.empty((0, 2), np.int64)


def complement(x: npt.ArrayLike, window: npt.ArrayLike) -> Intervals:
    """`window` minus `x`; `window` is one ``(start, end)`` pair or an interval set."""
    w = as_intervals(np.reshape(np.asarray(window), (-1, 2)))
    w = merge(w)
    a = merge(x)
    if len(w) == 0:
        return w
    if len(a) == 0:
        return w
    # gaps of `a` over an unbounded line, then clipped to the window
    lo = min(int(w[0, 0]), int(a[0, 0]))
    hi = max(int(w[-1, 1]), int(a[-1, 1]))
    gaps = np.column_stack((np.r_[lo, a[:, 1]], np.r_[a[:, 0], hi]))
    return intersection(gaps, w)


def measure(x: npt.ArrayLike) -> int:
    """Total length in nanoseconds of the union of the rows of `x` (overlaps count once)."""
    m = merge(x)
    return int((m[:, 1] - m[:, 0]).sum())
