"""Interval algebra on int64 nanoseconds: half-open ``[start, end)`` rows of an ``(n, 2)`` array.

No function modifies its arguments. Results of `merge`, `union`, `complement` and
`intersection` are *normalised*: sorted, disjoint, non-adjacent and without empty intervals;
`merge` (or `union`) of one set that is normalised already returns that set itself as a
read-only view. Inputs may be unsorted and overlapping; every operation is linear in the rows
(searches among sorted rows aside) when its inputs are sorted by start, as device tasks are
recorded and as every result here is: sets are merged as sorted columns, never sorted again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Intervals = npt.NDArray[np.int64]

__all__ = ["Intervals", "as_intervals", "complement", "intersection", "is_normalised", "measure",
           "merge", "union"]


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
    """The normalised union of the rows of `x` (touching intervals join; empty ones vanish).

    Linear when the rows are sorted by start (as device tasks are recorded), and free when
    they are already normalised: then `x` itself comes back, read-only."""
    return union(x)


def is_normalised(x: Intervals) -> bool:
    """Whether the ``(n, 2)`` int64 array `x` is sorted, disjoint, non-adjacent, non-empty."""
    return bool(len(x) == 0 or (np.all(x[:, 1] > x[:, 0]) and np.all(x[1:, 0] > x[:-1, 1])))


def _frozen(a: Intervals) -> Intervals:
    v = a.view()
    v.flags.writeable = False
    return v


def _sorted_columns(a: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of `a` as two sorted columns with the same union (the union depends only
    on the two multisets: instant t is covered iff #{S <= t} > #{E <= t}). Rows sorted by
    start need no sort: each end becomes the running maximum of the ends so far, which covers
    nothing more (the row ending there started no later). Unsorted rows: both columns sorted."""
    starts, ends = a[:, 0], a[:, 1]
    if len(a) < 2 or bool(np.all(starts[1:] >= starts[:-1])):
        return np.ascontiguousarray(starts), np.maximum.accumulate(ends)
    return np.sort(starts), np.sort(ends)


def _merge_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted 1-D merge of the sorted arrays `a` and `b` (no sort: each element of the
    shorter one is placed by a search among the other's, then both are written once)."""
    if len(a) < len(b):
        a, b = b, a
    if not len(b):
        return a
    out = np.empty(len(a) + len(b), np.int64)
    at = np.searchsorted(a, b, side="right") + np.arange(len(b))
    mask = np.ones(len(out), bool)
    mask[at] = False
    out[at] = b
    out[mask] = a
    return out


def _merge_many(cols: list[np.ndarray]) -> np.ndarray:
    """The sorted merge of k sorted 1-D arrays, pairwise in a balanced tree (each element is
    written about log2(k) times)."""
    while len(cols) > 1:
        cols = [_merge_sorted(cols[i], cols[i + 1]) if i + 1 < len(cols) else cols[i]
                for i in range(0, len(cols), 2)]
    return cols[0]


def _groups(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of intervals given as sorted starts and sorted ends (same length): its gaps
    are exactly the (E[k-1], S[k]) with S[k] > E[k-1]; groups left empty are dropped."""
    if not len(starts):
        return np.empty((0, 2), np.int64)
    first = np.flatnonzero(starts[1:] > ends[:-1]) + 1  # where a new group begins
    out = np.empty((len(first) + 1, 2), np.int64)
    out[0, 0], out[-1, 1] = starts[0], ends[-1]
    out[1:, 0] = starts[first]
    out[:-1, 1] = ends[first - 1]
    nonempty = out[:, 1] > out[:, 0]
    return out if nonempty.all() else out[nonempty]


def union(*sets: npt.ArrayLike) -> Intervals:
    """The normalised union of several interval sets.

    One pass per set and a k-way merge of sorted columns: linear in the rows for sets sorted
    by start (normalised ones included), with a sort only for a set that is not. A single
    set that is already normalised comes back as it is (read-only)."""
    parts = [p for p in (as_intervals(s) for s in sets) if len(p)]
    if not parts:
        return np.empty((0, 2), np.int64)
    if len(parts) == 1 and is_normalised(parts[0]):
        return _frozen(parts[0])
    cols = [_sorted_columns(p) for p in parts]
    return _groups(_merge_many([c[0] for c in cols]), _merge_many([c[1] for c in cols]))


def _intersect2(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two normalised sets, in memory proportional to the result: each
    row of the shorter set takes the run of the other's rows that overlap it (contiguous, as
    both are sorted), of which only the first and the last can need clipping."""
    if len(a) < len(b):
        a, b = b, a
    lo = np.searchsorted(a[:, 1], b[:, 0], side="right")  # first row of `a` ending after
    hi = np.searchsorted(a[:, 0], b[:, 1], side="left")  # first row of `a` starting at/after
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if not total:
        return np.empty((0, 2), np.int64)
    hit = np.flatnonzero(counts)
    if len(hit) <= _SLICED_RUNS:  # few runs (a window, markers): copy them as slices
        out = np.concatenate([a[lo[i]:hi[i]] for i in hit.tolist()])
    else:
        owner = np.repeat(hit, counts[hit])
        rows = (np.arange(total) - np.repeat(np.cumsum(counts[hit]) - counts[hit], counts[hit])
                + lo[owner])
        out = a[rows]
    first = np.cumsum(counts[hit]) - counts[hit]  # where each run starts in `out`
    last = first + counts[hit] - 1
    out[first, 0] = np.maximum(out[first, 0], b[hit, 0])
    out[last, 1] = np.minimum(out[last, 1], b[hit, 1])
    return out  # disjoint, sorted, non-empty and non-adjacent, as both inputs are


_SLICED_RUNS = 4096


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
    w = merge(as_intervals(np.reshape(np.asarray(window), (-1, 2))))
    a = merge(x)
    if len(w) == 0 or len(a) == 0:
        return w
    # the gaps of `a` over an unbounded line (normalised: non-empty ones only), then clipped
    lo = min(int(w[0, 0]), int(a[0, 0]))
    hi = max(int(w[-1, 1]), int(a[-1, 1]))
    gaps = np.empty((len(a) + 1, 2), np.int64)
    gaps[0, 0], gaps[-1, 1] = lo, hi
    gaps[1:, 0] = a[:, 1]
    gaps[:-1, 1] = a[:, 0]
    keep = gaps[:, 1] > gaps[:, 0]
    return _intersect2(gaps if keep.all() else gaps[keep], w)


def measure(x: npt.ArrayLike) -> int:
    """Total length in nanoseconds of the union of the rows of `x` (overlaps count once)."""
    m = merge(x)
    return int((m[:, 1] - m[:, 0]).sum())
