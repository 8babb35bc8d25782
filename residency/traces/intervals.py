"""Interval algebra on int64 nanoseconds: half-open ``[start, end)`` rows of an ``(n, 2)`` array.

No function modifies its arguments. Results of `merge`, `union`, `complement` and
`intersection` are *normalised*: sorted, disjoint, non-adjacent and without empty intervals;
`merge` (or `union`) of one set that is normalised already returns that set itself as a
read-only view. Inputs may be unsorted and overlapping; every operation is linear in the rows
(searches among sorted rows aside) when its inputs are sorted by start, as device tasks are
recorded and as every result here is: sets are merged as sorted columns, never sorted again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

try:
    from residency.traces import _intervals as _ext
except ImportError:  # not built (no compiler at install time): numpy merges the columns
    _ext = None

Intervals = npt.NDArray[np.int64]

BLOCK_ROWS = 1 << 18  # rows per block where work goes block by block (memory: one block's)
SWEEP_ROWS = 1 << 16  # rows of the largest set per block of `measure_union` (each set's rows
# in a block are copied, merged and sorted there: ~6 MB for two device-dense ranks)

__all__ = ["Folded", "Intervals", "Packed", "as_intervals", "bounds", "complement", "compiled",
           "intersection", "is_normalised", "measure", "measure_union", "merge",
           "merge_in_place", "numpy_only", "pack", "starts_sorted", "union", "unpack",
           "unpacked"]


def as_intervals(x: npt.ArrayLike) -> Intervals:
    """`x` as an ``(n, 2)`` int64 array; raises ValueError on a wrong shape or end < start."""
    a = _as_array(x)
    if np.any(a[:, 1] < a[:, 0]):
        row = int(np.flatnonzero(a[:, 1] < a[:, 0])[0])
        raise ValueError(f"interval {row} ends before it starts: {a[row].tolist()}.")
    return a


def _as_array(x: npt.ArrayLike | Packed) -> Intervals:
    """`x` as an ``(n, 2)`` int64 array (its rows not checked; a `Packed` set unpacked)."""
    if isinstance(x, Packed):
        return x.unpack()
    a = np.asarray(x)
    if a.size == 0:
        return np.empty((0, 2), np.int64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"intervals must have shape (n, 2), but {a.shape} was passed.")
    if a.dtype != np.int64:
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"intervals must be integer nanoseconds, but {a.dtype} was passed.")
        a = a.astype(np.int64)
    return a


def merge(x: npt.ArrayLike) -> Intervals:
    """The normalised union of the rows of `x` (touching intervals join; empty ones vanish).

    Linear when the rows are sorted by start (as device tasks are recorded), and free when
    they are already normalised: then `x` itself comes back, read-only."""
    return union(x)


def is_normalised(x: Intervals) -> bool:
    """Whether the ``(n, 2)`` int64 array `x` is sorted, disjoint, non-adjacent, non-empty."""
    if len(x) == 0:
        return True
    if x.flags.c_contiguous:  # start0 < end0 < start1 < end1 < ...: one pass
        flat = x.reshape(-1)
        return bool(np.all(flat[1:] > flat[:-1]))
    return bool(np.all(x[:, 1] > x[:, 0]) and np.all(x[1:, 0] > x[:-1, 1]))


def _frozen(a: Intervals) -> Intervals:
    v = a.view()
    v.flags.writeable = False
    return v


def _starts_sorted(a: Intervals) -> bool:
    return starts_sorted(a[:, 0])


def starts_sorted(starts: np.ndarray) -> bool:
    """Whether the 1-D `starts` never decrease (rows sorted by start need no sort)."""
    return len(starts) < 2 or bool(np.all(starts[1:] >= starts[:-1]))


def _merge_by_start(a: Intervals, out: Intervals | None = None) -> Intervals:
    """The normalised union of rows sorted by start, linear and in little memory beyond the
    result (a trace's device tasks: their union is a rank's reduction): a row opens a new
    group where it starts after every earlier row ended (the running maximum of the ends);
    a group ends at that maximum just before the next group opens. Two passes in blocks: one
    marks the openings (a bit per row), one writes the groups, into `out` when given (`a`
    itself: group k is written once rows up to k are read). Groups of empty rows only are
    dropped."""
    n, block_rows = len(a), max(1, BLOCK_ROWS)
    opens = np.empty(n, bool)
    reach = np.iinfo(np.int64).min  # the running maximum of the ends before the block
    for lo in range(0, n, block_rows):
        blk = a[lo:lo + block_rows]
        before = np.maximum.accumulate(np.r_[reach, blk[:-1, 1]])  # max end before each row
        np.greater(blk[:, 0], before, out=opens[lo:lo + len(blk)])
        reach = max(int(before[-1]), int(blk[-1, 1]))
    opens[0] = True
    groups = int(np.count_nonzero(opens))
    out = np.empty((groups, 2), np.int64) if out is None else out[:groups]
    k, reach = 0, np.iinfo(np.int64).min
    for lo in range(0, n, block_rows):
        blk = a[lo:lo + block_rows].copy()  # (`out` may be `a`: rows before k are written)
        o = opens[lo:lo + len(blk)]
        ends = np.maximum.accumulate(np.r_[reach, blk[:, 1]])[1:]  # max end up to each row
        reach = int(ends[-1])
        at = np.flatnonzero(o)
        if k and len(at) and at[0]:  # the group open before this block ends before its first
            out[k - 1, 1] = int(ends[at[0] - 1])
        if len(at):
            out[k:k + len(at), 0] = blk[at, 0]
            out[k:k + len(at) - 1, 1] = ends[at[1:] - 1]
            k += len(at)
        out[k - 1, 1] = reach  # (the open group reaches this far, so far)
    nonempty = out[:, 1] > out[:, 0]
    return out if nonempty.all() else out[nonempty]


def merge_in_place(a: Intervals) -> Intervals:
    """`merge(a)` written over the first rows of `a` (an ``(n, 2)`` int64 array the caller
    owns and gives up: its rows are overwritten), returned as a view of them; no memory
    beyond a block when `a` is sorted by start (else `merge(a)`, a new array)."""
    a = as_intervals(a)
    if not len(a) or not a.flags.writeable or not a.flags.c_contiguous or not _starts_sorted(a):
        return merge(a)
    return _merge_by_start(a, out=a)


def _sorted_columns(a: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of `a` as two sorted columns with the same union (the union depends only
    on the two multisets: instant t is covered iff #{S <= t} > #{E <= t}). Rows sorted by
    start need no sort: each end becomes the running maximum of the ends so far, which covers
    nothing more (the row ending there started no later). Unsorted rows: both columns sorted."""
    starts, ends = a[:, 0], a[:, 1]
    if len(a) < 2 or bool(np.all(starts[1:] >= starts[:-1])):
        return np.ascontiguousarray(starts), np.maximum.accumulate(ends)
    return np.sort(starts, kind="quicksort"), np.sort(ends, kind="quicksort")


def _merge_runs(cols: list[np.ndarray]) -> np.ndarray:
    """The sorted merge of k sorted 1-D arrays. Their concatenation is k ascending runs, and
    NumPy's stable sort of 64-bit integers is a timsort, which finds those runs and merges
    them (galloping): O(n log k), about 10x faster here than placing one array's elements by
    binary search among the other's. Never a sort from scratch: callers pass sorted runs."""
    if len(cols) == 1:
        return cols[0]
    return np.sort(np.concatenate(cols), kind="stable")


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
    arrays = [_as_array(s) for s in sets]
    if len(arrays) == 1 and len(arrays[0]) and is_normalised(arrays[0]):
        return _frozen(arrays[0])  # (valid rows: no second check)
    parts = [p for p in (as_intervals(a) for a in arrays) if len(p)]
    if not parts:
        return np.empty((0, 2), np.int64)
    if len(parts) == 1 and _starts_sorted(parts[0]):
        return _merge_by_start(parts[0])
    cols = [_sorted_columns(p) for p in parts]
    return _groups(_merge_runs([c[0] for c in cols]), _merge_runs([c[1] for c in cols]))


def _intersect2(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two normalised sets, in memory proportional to the result: each
    row of the shorter set takes the run of the other's rows that overlap it (contiguous, as
    both are sorted), of which only the first and the last can need clipping."""
    if len(a) < len(b):
        a, b = b, a
    lo = _ends_at_or_before(a, b[:, 0])  # first row of `a` ending after
    hi = _starts_before(a, b[:, 1])  # first row of `a` starting at/after
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


def measure(x: npt.ArrayLike | Packed) -> int:
    """Total length in nanoseconds of the union of the rows of `x` (overlaps count once; a
    `Packed` set measured as it is packed)."""
    if isinstance(x, Packed):
        return x.measure()
    m = merge(x)
    return sum(int((b[:, 1] - b[:, 0]).sum())  # (block by block: no column of lengths)
               for b in (m[lo:lo + BLOCK_ROWS] for lo in range(0, len(m), BLOCK_ROWS)))


def measure_union(*sets: npt.ArrayLike | Packed, within: npt.ArrayLike | None = None,
                  block_rows: int | None = None) -> int:
    """``measure(intersection(union(*sets), within))`` (`within` None: no clipping), without
    building the union: the time axis is swept in blocks of about `block_rows` rows of the
    largest set, each block's rows of every set clipped to it and merged there, so the memory
    beyond the inputs is one block's, whatever their size; where the compiled merge is built
    (``_intervals.c``) and `within` is one interval, the sets' rows are merged in one pass
    instead, with no copy; a `within` of several intervals overlapping few rows reads those
    rows alone. A `Packed` set is read as it is packed where the compiled merge is built (else
    unpacked)."""
    w = None if within is None else merge(as_intervals(np.reshape(np.asarray(within),
                                                                  (-1, 2))))
    if w is not None and not len(w):
        return 0
    kept = [s if isinstance(s, Packed) and _union_c is not None else merge(s) for s in sets]
    kept = [p for p in kept if len(p)]
    if not kept:
        return 0
    ends = [p.bounds() if isinstance(p, Packed) else (int(p[0, 0]), int(p[-1, 1]))
            for p in kept]
    lo, hi = min(b[0] for b in ends), max(b[1] for b in ends)
    if len(kept) == 1 and (w is None or (len(w) == 1 and w[0, 0] <= lo and hi <= w[0, 1])):
        one = kept[0]  # (one set, inside one window interval: nothing to clip)
        return one.measure() if isinstance(one, Packed) else _union_length([one])
    if w is not None and len(w) > 1 and not any(isinstance(p, Packed) for p in kept):
        found = _within_rows(kept, w, block_rows)
        if found is not None:  # (few rows inside `within`: those alone, not the time between)
            return found
    if _union_c is not None:  # (compiled: every set's rows merged as they are, clipped)
        sets_c = [p.compiled() if isinstance(p, Packed) else _flat(p) for p in kept]
        return int(_union_c(sets_c, np.array([lo, hi], np.int64) if w is None else _flat(w)))
    parts = kept
    if w is not None:
        lo, hi = max(lo, int(w[0, 0])), min(hi, int(w[-1, 1]))
        if lo >= hi:
            return 0
    biggest = max(parts, key=len)
    block_rows = SWEEP_ROWS if block_rows is None else block_rows
    cuts = np.unique(np.r_[lo, np.clip(biggest[max(1, block_rows)::max(1, block_rows), 0],
                                       lo, hi), hi])
    # each set's rows per block, found in one search per column (a column of an (n, 2) array
    # is strided: every search copies it, so never one search per block)
    rows = [_rows_in(p, cuts) for p in parts]
    wrows = None if w is None else _rows_in(w, cuts)
    total = 0
    for k, (c0, c1) in enumerate(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)):
        block = [_clipped(p, int(i[k]), int(j[k]), c0, c1)
                 for p, (i, j) in zip(parts, rows, strict=True)]
        if w is not None and wrows is not None:
            wb = _clipped(w, int(wrows[0][k]), int(wrows[1][k]), c0, c1)
            block = [_intersect2(b, wb) if len(b) and len(wb) else b[:0] for b in block]
        total += _union_length([b for b in block if len(b)])
    return total


def _compiled() -> Any:
    """`_intervals.union_length` where it is built and not turned off (``RESIDENCY_PURE_PYTHON``,
    as for the compiled trace readers), else None."""
    from residency.traces.kineto_scan import DISABLE_ENV

    return None if _ext is None or os.environ.get(DISABLE_ENV, "") not in ("", "0") else (
        _ext.union_length)


_union_c = _compiled()


def compiled() -> bool:
    """Whether unions are measured by the compiled merge in this process (``_intervals.c``)."""
    return _union_c is not None


@contextlib.contextmanager
def numpy_only() -> Iterator[None]:
    """Within: every union is measured by numpy, as without the compiled merge (comparisons of
    the two)."""
    global _union_c
    saved, _union_c = _union_c, None
    try:
        yield
    finally:
        _union_c = saved


def _within_rows(parts: list[Intervals], w: Intervals,
                 block_rows: int | None = None) -> int | None:
    """``measure(intersection(union(*parts), w))`` for normalised `parts` and `w` from the
    rows of `parts` that overlap an interval of `w` alone, found by search and clipped to it,
    a group of `w`'s intervals at a time (about `block_rows` rows of each set: the memory);
    None where one interval of `w` overlaps more rows than that (`measure_union` then
    sweeps)."""
    block_rows = SWEEP_ROWS if block_rows is None else block_rows
    first = [_ends_at_or_before(p, w[:, 0]) for p in parts]  # per set, per interval of w
    count = [np.maximum(_starts_before(p, w[:, 1]) - i, 0) for p, i in zip(parts, first,
                                                                           strict=True)]
    widest = np.max(count, axis=0)  # per interval, the most rows of one set
    if int(widest.max()) > block_rows:
        return None
    reach = np.cumsum(widest)
    total, at = 0, 0
    while at < len(w):  # intervals at..stop: at most about block_rows rows of each set
        stop = max(at + 1, int(np.searchsorted(reach, (reach[at - 1] if at else 0)
                                                + block_rows, "right")))
        lo_w, hi_w = w[at:stop, 0], w[at:stop, 1]
        clipped = []
        for p, i, k in zip(parts, first, count, strict=True):
            k = k[at:stop]
            n = int(k.sum())
            if not n:
                continue
            ends = np.cumsum(k)
            row = np.repeat(i[at:stop] - (ends - k), k) + np.arange(n)  # (each interval's rows)
            c = p[row]
            np.maximum(c[:, 0], np.repeat(lo_w, k), out=c[:, 0])
            np.minimum(c[:, 1], np.repeat(hi_w, k), out=c[:, 1])
            clipped.append(c)  # (sorted, disjoint, none empty: `w` is normalised)
        total += _union_length(clipped)
        at = stop
    return total


def _union_length(parts: list[Intervals]) -> int:
    """The measure of the union of normalised sets, from their merged columns (no union
    built): the groups' ends summed minus their starts."""
    if not parts:
        return 0
    if len(parts) == 1:
        return int((parts[0][:, 1] - parts[0][:, 0]).sum())
    if _union_c is not None:
        return int(_union_c([_flat(p) for p in parts], np.array(
            [min(int(p[0, 0]) for p in parts), max(int(p[-1, 1]) for p in parts)], np.int64)))
    starts = _merge_runs([np.ascontiguousarray(p[:, 0]) for p in parts])
    ends = _merge_runs([np.ascontiguousarray(p[:, 1]) for p in parts])
    new = starts[1:] > ends[:-1]  # where a group begins (and the previous one ends)
    return (int(ends[-1]) - int(starts[0]) + int(ends[:-1][new].sum())
            - int(starts[1:][new].sum()))


def _rows_in(a: Intervals, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each block ``[cuts[k], cuts[k + 1])``, the first row of the normalised `a` ending
    after its start and the first starting at or after its end."""
    return _ends_at_or_before(a, cuts[:-1]), _starts_before(a, cuts[1:])


def _ends_at_or_before(a: Intervals, t: np.ndarray) -> np.ndarray:
    """``np.searchsorted(a[:, 1], t, side="right")`` for the normalised `a`, searched in its
    rows as one ascending sequence (start0 < end0 < start1 < ...): a column of an ``(n, 2)``
    array is strided, and a search copies it (16 bytes a row of a device-dense union)."""
    return np.searchsorted(_flat(a), t, side="right") // 2


def _starts_before(a: Intervals, t: np.ndarray) -> np.ndarray:
    """``np.searchsorted(a[:, 0], t, side="left")`` for the normalised `a` (as above)."""
    return (np.searchsorted(_flat(a), t, side="left") + 1) // 2


def _flat(a: Intervals) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def _clipped(a: Intervals, i: int, j: int, lo: int, hi: int) -> Intervals:
    """Rows ``i:j`` of the normalised `a` (those overlapping ``[lo, hi)``), the outer two
    clipped to it."""
    if j <= i:
        return np.empty((0, 2), np.int64)
    out = a[i:j].copy()
    out[0, 0] = max(int(out[0, 0]), lo)
    out[-1, 1] = min(int(out[-1, 1]), hi)
    return out


# -- a compact form of a normalised set: for cache entries and transfers between processes -----

_NARROW = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32))


def _narrowest(largest: int) -> np.dtype:
    """The narrowest of uint8/16/32 that holds every value in ``[0, largest]``, else int64."""
    for d in _NARROW:
        if largest <= np.iinfo(d).max:
            return d
    return np.dtype(np.int64)


def pack(x: Intervals) -> tuple[Intervals, np.ndarray, np.ndarray]:
    """The normalised set `x` (not checked) as its first row, ``(1, 2)`` int64 (``(0, 2)`` when
    empty), and two columns of exact positive differences, each in the narrowest unsigned
    dtype that holds it (int64 when none does): the lengths of rows 1.. and the gaps before
    them. A device-dense rank's union takes 6 bytes a row instead of 16; `unpack` inverts.
    Memory beyond the result: one block."""
    n = len(x)
    head = np.array(x[:1], np.int64).reshape(-1, 2)
    if n < 2:
        return head, np.empty(0, np.uint8), np.empty(0, np.uint8)
    lengths = np.empty(0, np.uint8)
    gaps = np.empty(0, np.uint8)
    widest = [0, 0]
    for lo in range(1, n, BLOCK_ROWS):  # pass 1: the widest value of each column
        blk = x[lo:lo + BLOCK_ROWS]
        widest[0] = max(widest[0], int((blk[:, 1] - blk[:, 0]).max()))
        widest[1] = max(widest[1], int((blk[:, 0] - x[lo - 1:lo - 1 + len(blk), 1]).max()))
    lengths = np.empty(n - 1, _narrowest(widest[0]))
    gaps = np.empty(n - 1, _narrowest(widest[1]))
    for lo in range(1, n, BLOCK_ROWS):  # pass 2: the columns
        blk = x[lo:lo + BLOCK_ROWS]
        lengths[lo - 1:lo - 1 + len(blk)] = blk[:, 1] - blk[:, 0]
        gaps[lo - 1:lo - 1 + len(blk)] = blk[:, 0] - x[lo - 1:lo - 1 + len(blk), 1]
    return head, lengths, gaps


_LIMIT = 1 << 62  # |t| below this for every time a trace gives (residency.traces.units)


def unpack(head: np.ndarray, lengths: np.ndarray, gaps: np.ndarray) -> Intervals:
    """The normalised set `pack` gave these three arrays for, a new ``(n, 2)`` int64 array;
    raises ValueError where they cannot come from `pack` (a wrong shape or dtype, a length or
    gap that is not positive, a time beyond 2**62), so a damaged entry is refused, never read
    as something else. Memory beyond the result: one block."""
    head = _checked(head, lengths, gaps)
    if len(head) == 0:
        return np.empty((0, 2), np.int64)
    s0, e0 = int(head[0, 0]), int(head[0, 1])
    n = len(lengths) + 1
    out = np.empty((n, 2), np.int64)
    flat = out.reshape(-1)
    flat[0], flat[1] = s0, e0
    flat[2::2] = gaps
    flat[3::2] = lengths
    carry = e0
    step = 2 * BLOCK_ROWS
    for lo in range(2, 2 * n, step):  # a running sum block by block (no whole-column copy)
        blk = flat[lo:lo + step]
        np.cumsum(blk, out=blk)
        blk += carry
        carry = int(blk[-1])
    return out


def _checked(head: np.ndarray, lengths: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """`head` as an array, once the three arrays are ones `pack` can give (`unpack`'s
    ValueError where not)."""
    head = np.asarray(head)
    if head.dtype != np.int64 or head.ndim != 2 or head.shape[1] != 2 or len(head) > 1:
        raise ValueError("the first row must be a (0 or 1, 2) int64 array")
    if lengths.ndim != 1 or gaps.ndim != 1 or len(lengths) != len(gaps):
        raise ValueError("lengths and gaps must be 1-D columns of one length")
    if len(head) == 0:
        if len(lengths):
            raise ValueError("rows without a first row")
        return np.empty((0, 2), np.int64)
    for c in (lengths, gaps):
        if c.dtype not in (*_NARROW, np.dtype(np.int64)):
            raise ValueError(f"a column of dtype {c.dtype}")
        if len(c) and int(c.min()) <= 0:
            raise ValueError("a length or gap that is not positive")
    s0, e0 = int(head[0, 0]), int(head[0, 1])
    # float64 sums are within a relative 1e-15 or so of the exact ones: far from 2**62 here
    reach = (float(e0) + float(lengths.sum(dtype=np.float64))
             + float(gaps.sum(dtype=np.float64)))
    if not (-_LIMIT < s0 < e0 < _LIMIT and reach < _LIMIT * 0.99):
        raise ValueError("times out of range")
    return head


class Packed:
    """A normalised set as `pack` gives it, for a trip to another process (a worker's
    reduction to the client): pickled as those three arrays (a device-dense rank's union in 6
    bytes a row instead of 16) and unpickled as they are; `unpacked` gives the set (raising
    ValueError on arrays `pack` cannot give)."""

    __slots__ = ("parts",)

    def __init__(self, x: Intervals) -> None:
        self.parts = pack(x)

    @classmethod
    def of_parts(cls, head: np.ndarray, lengths: np.ndarray, gaps: np.ndarray) -> Packed:
        """The `Packed` of arrays `pack` gave (checked when unpacked)."""
        self = cls.__new__(cls)
        self.parts = (head, lengths, gaps)
        return self

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return Packed.of_parts, self.parts

    def unpack(self) -> Intervals:
        """The set, a new ``(n, 2)`` int64 array (`unpack`)."""
        return unpack(*self.parts)

    def checked(self) -> Packed:
        """This set, once its arrays are ones `pack` can give (ValueError: as `unpack`
        raises), so that it may be measured without being unpacked."""
        _checked(*self.parts)
        return self

    def __len__(self) -> int:
        return len(self.parts[0]) and len(self.parts[1]) + 1

    def measure(self) -> int:
        """The set's measure in ns (its rows' lengths summed as packed)."""
        head, lengths, _ = self.parts
        if not len(head):
            return 0
        return int(head[0, 1] - head[0, 0]) + int(lengths.sum(dtype=np.int64))

    def bounds(self) -> tuple[int, int]:
        """The first start and the last end (of a set that is not empty)."""
        head, lengths, gaps = self.parts
        return int(head[0, 0]), (int(head[0, 1]) + int(lengths.sum(dtype=np.int64))
                                 + int(gaps.sum(dtype=np.int64)))

    def compiled(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The set as `_intervals.union_length` reads a packed set (not empty)."""
        head, lengths, gaps = self.parts
        return (int(head[0, 0]), int(head[0, 1]), np.ascontiguousarray(lengths),
                np.ascontiguousarray(gaps))


def bounds(x: Intervals | Packed) -> tuple[int, int] | None:
    """The first start and the last end of the normalised set `x` (None: empty)."""
    if not len(x):
        return None
    if isinstance(x, Packed):
        return x.bounds()
    return int(x[0, 0]), int(x[-1, 1])


def unpacked(x: Intervals | Packed) -> Intervals:
    """`x` itself, or the set a `Packed` stands for."""
    return x.unpack() if isinstance(x, Packed) else x


class _Column:
    """A 1-D column of positive int64 values held in the narrowest dtype of `pack` that holds
    every value so far. Its room is reserved, not touched: `ROOM_BYTES` at first (mapped by the
    allocator on its own, its pages resident only once written), so growing it neither copies
    it nor leaves a freed copy in the heap (a worker keeps freed heap, `parallel.keep_heap`);
    the unused room is given back by `take`."""

    ROOM_BYTES = 64 << 20

    def __init__(self) -> None:
        self.a = np.empty(0, np.uint8)
        self.n = 0

    def add(self, values: np.ndarray) -> None:
        k = len(values)
        if not k:
            return
        top = int(values.max())
        dtype = self.a.dtype
        if dtype != np.int64 and top > np.iinfo(dtype).max:  # (rare: widened once a dtype)
            dtype = _narrowest(top)
        if dtype != self.a.dtype or self.n + k > len(self.a):
            room = max(self.ROOM_BYTES // dtype.itemsize, 2 * (self.n + k))
            a = np.empty(room, dtype)  # (np.resize would write zeros over the room)
            a[:self.n] = self.a[:self.n]
            self.a = a
        self.a[self.n:self.n + k] = values
        self.n += k

    def take(self) -> np.ndarray:
        a, self.a = self.a, np.empty(0, np.uint8)
        if len(a) == self.n:
            return a
        a.resize(self.n, refcheck=False)  # (shrunk where it lies: no copy)
        return a


class Folded:
    """The union of rows given run by run (`add`), held packed as `pack` would pack it (6 bytes
    a device-dense row instead of 16), never the rows themselves: `packed` gives the parts.

    Rows recorded in time order (each run starting no earlier than the previous run's
    earliest start) are folded in as they come: the union of the rows so far is kept as its
    finished rows (packed) and an open tail (the rows reaching the earliest start of the last
    run, which a later row may still touch). A run starting earlier than that gives the
    folding up: the union so far and every later row are held whole (16 bytes a row) and
    merged at the end. Either way the union is exactly `merge` of every row added."""

    def __init__(self) -> None:
        self.head: tuple[int, int] | None = None  # the first finished row
        self.last_end = 0  # the end of the last finished row
        self.lengths = _Column()  # of the finished rows after the first
        self.gaps = _Column()  # before each of them
        self.open = np.empty((0, 2), np.int64)  # normalised, after the finished rows
        self.floor: int | None = None  # every later row must start at or after it
        self.loose: list[Intervals] | None = None  # rows held whole (folding given up)

    def add(self, rows: Intervals) -> None:
        """Fold in the rows of one run (an ``(n, 2)`` int64 array, any order; not kept)."""
        if not len(rows):
            return
        if self.loose is not None:
            self.loose.append(rows)
            return
        lo = int(rows[:, 0].min())
        if self.floor is not None and lo < self.floor:  # out of order: hold the rows whole
            self.loose = [self._unfolded(), rows]
            return
        u = union(self.open, rows) if len(self.open) else union(rows)
        done = int(np.searchsorted(u[:, 1], lo, "left"))  # rows ending before `lo`: finished
        self._finish(u[:done])
        self.open = np.array(u[done:])
        self.floor = lo

    def _finish(self, x: Intervals) -> None:
        if not len(x):
            return
        if self.head is None:
            self.head = (int(x[0, 0]), int(x[0, 1]))
            self.last_end = self.head[1]
            x = x[1:]
            if not len(x):
                return
        self.lengths.add(x[:, 1] - x[:, 0])
        gaps = np.empty(len(x), np.int64)
        gaps[0] = int(x[0, 0]) - self.last_end
        np.subtract(x[1:, 0], x[:-1, 1], out=gaps[1:])
        self.gaps.add(gaps)
        self.last_end = int(x[-1, 1])

    def _unfolded(self) -> Intervals:
        """The union so far as one ``(n, 2)`` array; the folded state emptied."""
        head = np.array([self.head] if self.head is not None else [], np.int64).reshape(-1, 2)
        done = unpack(head, self.lengths.take(), self.gaps.take())
        out = np.concatenate((done, self.open)) if len(self.open) else done
        self.head, self.open = None, np.empty((0, 2), np.int64)
        return out

    def packed(self) -> tuple[Intervals, np.ndarray, np.ndarray]:
        """The union of every row added, as `pack` gives it (the folded state given up)."""
        if self.loose is not None:
            rows, self.loose = self.loose, None
            return pack(union(*rows))
        self._finish(self.open)
        self.open = np.empty((0, 2), np.int64)
        if self.head is None:
            return np.empty((0, 2), np.int64), np.empty(0, np.uint8), np.empty(0, np.uint8)
        head = np.array([self.head], np.int64)
        self.head = None
        return head, self.lengths.take(), self.gaps.take()
