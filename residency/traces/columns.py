"""What the Trace Event Format readers share: `Parsed` (the columns one trace file yields), the
any-type event the exact path decodes, name tables, and turning kept times into sorted
``[start, end)`` rows.

The format modules (`residency.traces.kineto`, `residency.traces.ascend_text`) each give a
`Reader`; `residency.traces.formats` dispatches to them by format name.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from residency.traces.units import LIMIT_NS

NO_CODE = -1  # an int16 code into a name table: none


@dataclass
class Parsed:
    """What one trace file yields before its rank is settled (arrays as in `RankTimeline`)."""

    rank: int | None  # from the file's content (Kineto distributedInfo)
    device: np.ndarray
    ranges: np.ndarray
    names: np.ndarray
    rejected: int
    device_task_type: np.ndarray  # int16 codes into task_types, -1: none
    range_task_type: np.ndarray
    range_lane: np.ndarray  # int16 codes into lanes, -1: none
    task_types: tuple[str, ...] = ()
    lanes: tuple[str, ...] = ()
    digest: str | None = None  # content digest of the trace file as stored, when asked for
    device_names: np.ndarray | None = None  # (n,) object array of str beside `device`
    world_size: int | None = None  # from the file's content (Kineto distributedInfo)
    # a parse with the device tasks folded (`device` then empty): their union and figures
    device_folded: FoldedDevice | None = None
    # a parse that kept only the host ranges it was asked for: what the others were
    host_folded: FoldedHost | None = None
    # a torch-npu database parse with the device tasks folded by class (`device` then empty)
    device_classes: FoldedClasses | None = None


@dataclass(frozen=True)
class FoldedDevice:
    """The device tasks of a parse that folded them into their union as they were read
    (`residency.traces.intervals.Folded`) instead of keeping their rows: what a rank's busy
    reduction needs of them. Times absolute, in ns."""

    union: Any  # residency.traces.intervals.Packed: the merged rows
    tasks: int  # rows folded in
    first_start: int  # earliest start (meaningless when `tasks` is 0)
    last_end: int  # latest end
    first_end: int  # earliest end


@dataclass(frozen=True)
class FoldedClasses:
    """torch-npu device tasks a parse folded by class as they were read instead of keeping
    their rows (`residency.traces.ascend_db.read_db`'s `fold`): what a rank's busy reduction
    needs of them. Times absolute, in ns."""

    unions: dict[frozenset[str], Any]  # per set of classes: residency.traces.intervals.Packed
    # per set: the earliest start and latest end of its rows as recorded (None: no row)
    bounds: dict[frozenset[str], tuple[int, int] | None]
    types: dict[str, int]  # tasks by type (every task, whatever its class)
    tasks: int  # rows folded in
    first_start: int  # earliest start (meaningless when `tasks` is 0)
    last_end: int  # latest end
    first_end: int  # earliest end


@dataclass(frozen=True)
class FoldedHost:
    """The host ranges a parse counted but did not keep (their names matched nothing it was
    asked to keep): what a rank's reduction needs of them. Times absolute, in ns."""

    ranges: int  # rows counted, not kept
    first_start: int  # earliest start (meaningless when `ranges` is 0)
    last_end: int  # latest end
    first_end: int  # earliest end

    def joined(self, other: FoldedHost | None) -> FoldedHost:
        """These ranges and `other`'s (None: none) as one count."""
        if other is None:
            return self
        return FoldedHost(self.ranges + other.ranges, min(self.first_start, other.first_start),
                          max(self.last_end, other.last_end),
                          min(self.first_end, other.first_end))


class NotFoldable(Exception):
    """A folded parse would have dropped rows its fold no longer holds (a start out of range
    once ``baseTimeNanoseconds`` is added; a torch-npu process named anew after rows of its
    were counted as host ranges): parse again without folding."""


class HostFilter:
    """Which host ranges a parse keeps (a format's `keep_host`: those whose name is wanted,
    asked once per distinct name), and the figures of those it only counts ([start, end)
    relative to the base until `finish`)."""

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        self._wanted = wanted
        self._by_code = np.zeros(0, bool)  # per name code, whether wanted
        self.ranges = 0
        self.starts = [0, 0]  # earliest and latest start
        self.ends = [0, 0]  # earliest and latest end

    def wanted(self, codes: np.ndarray, names: Names) -> np.ndarray:
        """Whether each row of name `codes` (into `names`) is kept."""
        known = len(self._by_code)
        if len(names.codes) > known:  # (dicts keep their order: the codes' order)
            new = [bool(self._wanted(n)) for n in
                   itertools.islice(names.codes, known, None)]
            self._by_code = np.concatenate([self._by_code, np.array(new, bool)])
        return self._by_code[codes]

    def count(self, ts: np.ndarray, dur: np.ndarray) -> None:
        """Count rows of these starts and durations (not kept)."""
        if not len(ts):
            return
        end = ts + dur  # (no wrap: both were checked below 2**62)
        lo, hi, e_lo, e_hi = int(ts.min()), int(ts.max()), int(end.min()), int(end.max())
        if self.ranges:
            lo, hi = min(lo, self.starts[0]), max(hi, self.starts[1])
            e_lo, e_hi = min(e_lo, self.ends[0]), max(e_hi, self.ends[1])
        self.starts, self.ends = [lo, hi], [e_lo, e_hi]
        self.ranges += len(ts)

    def finish(self, base: int) -> FoldedHost:
        """The counted rows' figures made absolute; NotFoldable where a start leaves the range
        once `base` is added (`intervals` would drop that row, which a count cannot tell)."""
        if self.ranges and not (self.starts[0] + base > -LIMIT_NS
                                and self.starts[1] + base < LIMIT_NS):
            raise NotFoldable
        return FoldedHost(self.ranges, self.starts[0] + base, self.ends[1] + base,
                          self.ends[0] + base)


@dataclass(frozen=True)
class Reader:
    """One trace file format as `residency.traces.formats` reads it."""

    columns: Callable[[bool], Any]  # a fresh column builder; the flag: keep device task names
    fast: Any  # the msgspec type of a whole document on the typed fast path
    reads_document: bool  # whether the builder's `finish` reads the document-level fields


# -- the any-type event (the exact path of every reader: numbers kept as decimal text) ---------

class AnyEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw()


class AnyTrace(msgspec.Struct, gc=False):
    traceEvents: list[AnyEvent] | None = None
    baseTimeNanoseconds: Any = None
    distributedInfo: Any = None


EXACT = msgspec.json.Decoder(list[AnyEvent], float_hook=str)
GET_CAT, GET_TS, GET_DUR, GET_NAME, GET_PID, GET_TASK = (
    operator.attrgetter(a) for a in ("cat", "ts", "dur", "name", "pid", "args.task_type"))


# -- columns ----------------------------------------------------------------------------------

def add_run(columns: Any, data: bytes, fast: msgspec.json.Decoder,
            exact: msgspec.json.Decoder) -> int:
    """Decode one run of events (a JSON array) into `columns` (a format's column builder):
    by the `fast` typed decoder where `columns.add_fast` keeps the events (every time exact
    as float64), else by the `exact` one (`columns.add_exact`); the number of events."""
    try:
        events = fast.decode(data)
        if columns.add_fast(events):
            return len(events)
    except msgspec.ValidationError:
        pass
    events = exact.decode(data)
    columns.add_exact(events)
    return len(events)


def concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


class Names:
    """Distinct names, each one str object; names that could not be decoded are marked."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def code(self, names: list[str]) -> np.ndarray:
        codes = self.codes
        for n in dict.fromkeys(names):  # each distinct name once; the rest in C
            if n not in codes:
                codes[n] = len(codes)
        return np.fromiter(map(codes.__getitem__, names), np.int32, len(names))

    def table(self) -> np.ndarray:
        return object_array(list(self.codes))

    def absorb(self, other: Names) -> np.ndarray:
        """Add `other`'s names; their codes here, indexed by their codes there."""
        return self.code(list(other.codes))


def decoded_names(events: list[Any]) -> tuple[list[str], np.ndarray | None, str | None]:
    """Names of fast-path events (raw JSON), which could not be decoded, and the first
    decode error (raised only if such an event is used)."""
    try:
        return raw_names(events), None, None
    except msgspec.DecodeError:
        pass
    names, bad, first = [], np.zeros(len(events), bool), None
    for i, e in enumerate(events):
        try:
            names.extend(raw_names([e]))
        except msgspec.DecodeError as exc:
            names.append("")
            bad[i], first = True, first or str(exc)
    return names, bad, first


def intervals(ts: np.ndarray, dur: np.ndarray, base: int
              ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(n, 2)`` [start, end) of the rows whose start with `base` stays in range, sorted by
    start (stable); the kept rows' indices in that order (None: all, in order); how many were
    rejected. Uses `ts` as scratch (it may be overwritten)."""
    start = ts
    if base:
        start += base  # no wrap: |ts| and |base| are below 2**62
    inside = np.abs(start) < LIMIT_NS
    keep = None if inside.all() else np.flatnonzero(inside)
    del inside
    if keep is not None:
        start = start[keep]
    if len(start) > 1 and not (start[1:] >= start[:-1]).all():  # sorted already: no argsort
        order = np.argsort(start, kind="stable")
        keep = order if keep is None else keep[order]
        start = start[order]
        del order
    out = np.empty((len(start), 2), np.int64)
    out[:, 0] = start
    out[:, 1] = start
    out[:, 1] += dur if keep is None else dur[keep]
    return out, keep, len(ts) - len(start)


def take_rows(a: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    return a if keep is None else a[keep]


def drain_parts(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The concatenation of `parts`, which is emptied (its arrays are freed)."""
    out = concat(parts, dtype)
    parts.clear()
    return out


# -- fields -----------------------------------------------------------------------------------

def pick(events: list[Any], idx: np.ndarray) -> Any:
    """``events[idx]`` as a sequence, picked in C."""
    if len(idx) == len(events):
        return events
    if len(idx) < 2:
        return [events[i] for i in idx.tolist()]
    return operator.itemgetter(*idx.tolist())(events)


def raw_names(events: list[Any]) -> list[str]:
    """Names of fast-path events: their raw JSON decoded in one call."""
    raws = list(map(GET_NAME, events))
    if not all(map(len, raws)):  # a missing name reads as ""
        raws = [r if len(r) else b'""' for r in raws]
    return json_names(b"[" + b",".join(raws) + b"]")


def json_names(text: bytes) -> list[str]:
    """Names from the JSON array of their raw values (a value that is not a string as
    `any_names` reads it)."""
    try:
        return msgspec.json.decode(text, type=list[str])
    except msgspec.ValidationError:
        return any_names([Named(v) for v in msgspec.json.decode(text)])


class Named(msgspec.Struct):
    name: Any


def any_names(events: list[Any]) -> list[str]:
    return [n if type(n) is str else "" if n is None else str(n) for n in (e.name for e in events)]


def take(events: list[Any], idx: np.ndarray) -> list[Any]:
    return events if len(idx) == len(events) else [events[i] for i in idx.tolist()]


def object_array(items: list[Any]) -> np.ndarray:
    """`items` as a 1-D numpy object array (no nested-sequence unpacking)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out

