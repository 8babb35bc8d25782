"""Interval algebra on int64 nanoseconds: half-open ``[start, end)`` rows of an ``(n, 2)`` array.

Every function returns a new array and leaves its arguments untouched. Results of `merge`,
`union`, `complement` and `intersection` are *normalised*: sorted, disjoint, non-adjacent and
without empty intervals. Inputs may be unsorted and overlapping.
"""

from __future__ import annotations

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
    return _merge_columns(a[:, 0], a[:, 1])


def _merge_columns(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of the intervals ``[starts[i], ends[i])`` (ends >= starts).

    Starts and ends are sorted apart (no pairs are moved: memory is the limit on big traces):
    with S and E sorted, instant t is covered iff #{S <= t} > #{E <= t}, so the union's gaps
    are exactly the (E[k-1], S[k]) with S[k] > E[k-1]; groups left empty (from empty
    intervals) are dropped."""
    if not len(starts):
        return np.empty((0, 2), np.int64)
    starts, ends = np.sort(starts), np.sort(ends)
    first = np.flatnonzero(starts[1:] > ends[:-1]) + 1  # where a new group begins
    out = np.empty((len(first) + 1, 2), np.int64)
    out[0, 0], out[-1, 1] = starts[0], ends[-1]
    out[1:, 0] = starts[first]
    out[:-1, 1] = ends[first - 1]
    nonempty = out[:, 1] > out[:, 0]
    return out if nonempty.all() else out[nonempty]


def union(*sets: npt.ArrayLike) -> Intervals:
    """The normalised union of several interval sets."""
    parts = [as_intervals(s) for s in sets]
    if not parts:
        return np.empty((0, 2), np.int64)
    return _merge_columns(np.concatenate([p[:, 0] for p in parts]),
                          np.concatenate([p[:, 1] for p in parts]))


def _intersect2(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two normalised sets, in memory proportional to the result: each
    row of the shorter set clips the rows of the other that overlap it."""
    if len(a) < len(b):
        a, b = b, a
    lo = np.searchsorted(a[:, 1], b[:, 0], side="right")  # first row of `a` ending after
    hi = np.searchsorted(a[:, 0], b[:, 1], side="left")  # first row of `a` starting at/after
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if not total:
        return np.empty((0, 2), np.int64)
    owner = np.repeat(np.arange(len(b)), counts)
    rows = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + lo[owner]
    out = np.empty((total, 2), np.int64)
    out[:, 0] = np.maximum(a[rows, 0], b[owner, 0])
    out[:, 1] = np.minimum(a[rows, 1], b[owner, 1])
    return out  # disjoint, sorted, non-empty and non-adjacent, as both inputs are


def intersection(*sets: npt.ArrayLike) -> Intervals:
    """The normalised set of instants covered by every one of `sets`."""
    merged = [merge(s) for s in sets]
    if not merged:
        return np.empty((0, 2), np.int64)
    out = merged[0]
    for other in merged[1:]:
        out = _intersect2(out, other)
    return out


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
