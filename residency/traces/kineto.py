"""The Kineto trace document (``torch.profiler``'s Chrome trace JSON): its schema and the
columns analysis keeps of it (device tasks and host ranges by category,
`residency.traces.categories`).

Runs of events are read by the compiled reader (`residency.traces.kineto_scan`) where it handles
them, else decoded by msgspec: a typed fast path (float64 times) when every value of the run
has the expected type and resolves the nanosecond, else the any-type path that keeps every
number's decimal text (`residency.traces.columns.EXACT`). The document-level fields
(``baseTimeNanoseconds``, ``distributedInfo``) are settled at the end (`KinetoColumns.finish`).
"""

from __future__ import annotations

import functools
import math
import operator
import reprlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from residency.traces import intervals as iv
from residency.traces import kineto_scan
from residency.traces.categories import DEVICE_CATEGORIES, HOST_CATEGORIES
from residency.traces.columns import (
    EXACT,
    GET_CAT,
    GET_DUR,
    GET_NAME,
    GET_TS,
    NO_CODE,
    FoldedDevice,
    HostFilter,
    Named,
    Names,
    NotFoldable,
    Parsed,
    Reader,
    add_run,
    any_names,
    concat,
    decoded_names,
    drain_parts,
    intervals,
    json_names,
    pick,
    take,
    take_rows,
)
from residency.traces.files import TraceError
from residency.traces.units import LIMIT_NS, exact_floats, floats_to_ns, us_to_ns

__all__ = ["READER", "KinetoColumns"]


# -- event types ------------------------------------------------------------------------------

class _XEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event; its name stays raw JSON until it is known to be a host range."""

    cat: str = ""
    name: msgspec.Raw = msgspec.Raw()
    ts: float = math.nan
    dur: float = math.nan


# every other phase of the Trace Event Format decodes to an empty struct (fields skipped)
_OTHER_PHASES = [msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False,
                                   namespace={"cat": "", "ts": math.nan, "dur": math.nan},
                                   module=__name__)
                 for i, ph in enumerate("BEiICbnesftPNODMVvRc()")]
_FastEvent = functools.reduce(operator.or_, _OTHER_PHASES, _XEvent)


class _KTrace(msgspec.Struct, gc=False):
    traceEvents: list[_FastEvent] | None = None  # type: ignore[valid-type]
    baseTimeNanoseconds: Any = None
    distributedInfo: Any = None


_K_FAST = msgspec.json.Decoder(list[_FastEvent])
_K_EXACT = EXACT


# -- columns ----------------------------------------------------------------------------------

class KinetoColumns:
    """Kept columns of a Kineto trace: device tasks and host ranges, times relative to the
    (not yet known) ``baseTimeNanoseconds``."""

    def __init__(self, device_names: bool = True) -> None:
        self.want_names = device_names
        self.dev = _Rows()  # [start, end) relative to the base, grown in place
        self.dev_name: list[np.ndarray] = []  # name codes of the device rows
        self.host_ts: list[np.ndarray] = []
        self.host_dur: list[np.ndarray] = []
        self.host_name: list[np.ndarray] = []
        self.host_bad: list[np.ndarray] = []
        self.names = Names()
        self.name_error: str | None = None
        self.rejected = 0
        self._raw_kinds: dict[bytes, int] = {}
        self._kinds = _CategoryKinds()
        self.fold: _DeviceFold | None = None
        self.host_filter: HostFilter | None = None

    def fold_device(self) -> None:
        """Fold the device rows into their union as they are read, never holding them
        (`residency.traces.columns.FoldedDevice`; a parse without device names, whole)."""
        assert not self.want_names and not self.dev.n
        self.fold = _DeviceFold()

    def keep_host(self, wanted: Callable[[str], bool]) -> None:
        """Keep only the host ranges whose name is `wanted` (asked once per distinct name) and
        count the others (`residency.traces.columns.FoldedHost`), never holding their rows."""
        assert not self.host_ts
        self.host_filter = HostFilter(wanted)

    def kind_of(self, raw: bytes) -> int:
        """The kind (`_category_kinds`) of a category given as its raw JSON string."""
        kind = self._raw_kinds.get(raw)
        if kind is None:
            kind = self._raw_kinds[raw] = self._kinds[msgspec.json.decode(raw)]
        return kind

    def add_scanned(self, got: kineto_scan.Scanned) -> None:
        """Keep the columns the compiled reader gave for one run."""
        codes = (self.names.code(json_names(got.names))[got.name_ids]
                 if got.names is not None else np.zeros(0, np.int32))
        if not self.want_names:  # numbered are the host ranges only
            codes = codes[np.cumsum(got.kinds == 2) - 1] if len(codes) else codes
        self._keep(got.kinds, got.ts, got.dur, got.ok, codes_of=codes.__getitem__,
                   host_codes_of=codes.__getitem__)

    def compact(self) -> None:
        """Trim the grown arrays (before pickling)."""
        assert self.fold is None and self.host_filter is None
        self.dev.rows = self.dev.take()
        self.dev.n = len(self.dev.rows)

    def extend(self, other: KinetoColumns) -> None:
        """Append the columns of the events after ours (another part of the file)."""
        rows = other.dev.take()
        self.dev.add(rows[:, 0], rows[:, 1])
        names = self.names.absorb(other.names)
        self.dev_name += [names[c] for c in other.dev_name]
        self.host_ts += other.host_ts
        self.host_dur += other.host_dur
        self.host_name += [names[c] for c in other.host_name]
        self.host_bad += other.host_bad
        self.name_error = self.name_error or other.name_error
        self.rejected += other.rejected

    def add(self, data: bytes, index: int = 0) -> int:
        """Decode one run of events (a JSON array) and keep its columns: read by the compiled
        reader where it handles the run (`residency.traces.kineto_scan`), else by msgspec."""
        scanned = kineto_scan.scan(data, self.kind_of, 2 if self.want_names else 1)
        if scanned is not None:
            self.add_scanned(scanned)
            return scanned.events
        return add_run(self, data, _K_FAST, _K_EXACT)

    def add_fast(self, events: list[Any]) -> bool:
        """Keep the columns of fast-path events; False (nothing kept) when a time is not
        exact as float64."""
        kinds = _category_kinds(map(GET_CAT, events), len(events))
        idx = np.flatnonzero(kinds)
        sel = pick(events, idx)
        ts = np.fromiter(map(GET_TS, sel), np.float64, len(sel))
        dur = np.fromiter(map(GET_DUR, sel), np.float64, len(sel))
        if not (exact_floats(ts) and exact_floats(dur)):
            return False
        ts_ns, ts_ok = floats_to_ns(ts)
        dur_ns, dur_ok = floats_to_ns(dur)
        self._keep(kinds[idx], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: decoded_names([events[i] for i in idx[h].tolist()]),
                   lambda h: self._name_codes(list(map(events.__getitem__,
                                                       idx[h].tolist()))))
        return True

    def _name_codes(self, events: list[Any]) -> np.ndarray:
        """Name codes of fast-path events, each distinct raw name decoded once (device tasks
        repeat few names); an undecodable name is ``""``."""
        keys = list(map(bytes, map(GET_NAME, events)))
        distinct = list(dict.fromkeys(keys))
        texts = decoded_names([Named(k) for k in distinct])[0]
        lut = dict(zip(distinct, self.names.code(texts).tolist(), strict=True))
        return np.fromiter(map(lut.__getitem__, keys), np.int32, len(keys))

    def add_exact(self, events: list[Any]) -> None:
        """Keep the columns of any-type events (numbers as decimal text)."""
        kinds = _category_kinds((e.cat if type(e.cat) is str and e.ph == "X" else ""
                                 for e in events), len(events))
        sel = take(events, np.flatnonzero(kinds))
        ts_ns, ts_ok = us_to_ns([e.ts for e in sel])
        dur_ns, dur_ok = us_to_ns([e.dur for e in sel])
        self._keep(kinds[kinds > 0], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: (any_names([sel[i] for i in h.tolist()]), None, None))

    def _keep(self, kinds: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray, ok: np.ndarray,
              names_of: Callable[[np.ndarray], tuple[list[str], np.ndarray | None, str | None]]
              | None = None, codes_of: Callable[[np.ndarray], np.ndarray] | None = None,
              host_codes_of: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Keep the rows of the events of `kinds` 1 and 2 whose times are `ok` and in range;
        name codes of device rows from `codes_of` (else `names_of`), of host rows from
        `host_codes_of` (else `names_of`, whose undecodable names are marked)."""
        # times out of range are rejected, before any sum could wrap around int64
        ok &= (np.abs(ts_ns) < LIMIT_NS) & (dur_ns >= 0) & (dur_ns < LIMIT_NS)
        self.rejected += int((~ok).sum())
        dev, host = ok & (kinds == 1), np.flatnonzero(ok & (kinds == 2))
        start = ts_ns[dev]
        if self.fold is not None:
            self.fold.add(start, start + dur_ns[dev])
        else:
            self.dev.add(start, start + dur_ns[dev])
        if self.want_names:
            at = np.flatnonzero(dev)
            self.dev_name.append(codes_of(at) if codes_of is not None else
                                 self.names.code(names_of(at)[0]))
        bad = None
        if host_codes_of is not None:
            codes = host_codes_of(host)
        else:
            assert names_of is not None
            names, bad, error = names_of(host)
            codes = self.names.code(names)
            self.name_error = self.name_error or error
        ts, dur = ts_ns[host], dur_ns[host]
        if self.host_filter is not None:  # (an undecodable name is kept: `finish` names it)
            kept = self.host_filter.wanted(codes, self.names)
            if bad is not None:
                kept |= bad
            if not kept.all():
                self.host_filter.count(ts[~kept], dur[~kept])
                ts, dur, codes = ts[kept], dur[kept], codes[kept]
                bad = None if bad is None else bad[kept]
        self.host_ts.append(ts)
        self.host_dur.append(dur)
        self.host_name.append(codes)
        self.host_bad.append(np.zeros(len(ts), bool) if bad is None else bad)

    def finish(self, source: Path, doc: Any) -> Parsed:
        """The timeline, once the document-level fields are known."""
        base = getattr(doc, "baseTimeNanoseconds", None)
        info = getattr(doc, "distributedInfo", None)
        rank = info.get("rank") if isinstance(info, dict) else None
        world = info.get("world_size") if isinstance(info, dict) else None
        world = world if type(world) is int and 0 < world < 1 << 31 else None  # (else unsaid)
        if base is not None:
            if isinstance(base, str) and base.isascii() and base.isdigit() and len(base) < 20:
                base = int(base)
            if type(base) is not int or not -LIMIT_NS < base < LIMIT_NS:
                raise TraceError(source, "baseTimeNanoseconds must be an integer of magnitude "
                                 f"below 2**62, not {reprlib.repr(base)}")
        if rank is not None and (type(rank) is not int or rank < 0):
            raise TraceError(source, f"distributedInfo.rank must be a non-negative integer, "
                             f"not {reprlib.repr(rank)}")
        base = base or 0
        folded = None
        if self.fold is not None:
            folded = self.fold.finish(base)
            device, rejected = np.empty((0, 2), np.int64), 0
        else:
            rows = self.dev.take()
            device, rejected, dev_codes = _finish_rows(
                rows, base, drain_parts(self.dev_name, np.int32) if self.want_names
                else np.zeros(len(rows), np.int32))
        ranges, order, host_rejected = intervals(drain_parts(self.host_ts, np.int64),
                                                 drain_parts(self.host_dur, np.int64), base)
        codes = take_rows(concat(self.host_name, np.int32), order)
        if take_rows(concat(self.host_bad, bool), order).any():
            raise TraceError(source, f"invalid JSON: {self.name_error}")
        none = np.full(len(ranges), NO_CODE, np.int16)
        table = self.names.table()
        return Parsed(rank, device, ranges, table[codes],
                      self.rejected + rejected + host_rejected,
                      np.full(len(device), NO_CODE, np.int16), none, none.copy(),
                      device_names=table[dev_codes] if self.want_names else None,
                      world_size=world, device_folded=folded,
                      host_folded=None if self.host_filter is None else
                      self.host_filter.finish(base))


class _DeviceFold:
    """Device rows ([start, end) relative to the base) folded into their union as they come
    (`residency.traces.intervals.Folded`), with the figures `FoldedDevice` keeps."""

    def __init__(self) -> None:
        self.union = iv.Folded()
        self.tasks = 0
        self.starts = [0, 0]  # earliest and latest start
        self.ends = [0, 0]  # earliest and latest end

    def add(self, start: np.ndarray, end: np.ndarray) -> None:
        if not len(start):
            return
        lo, hi = int(start.min()), int(start.max())
        e_lo, e_hi = int(end.min()), int(end.max())
        if self.tasks:
            lo, hi = min(lo, self.starts[0]), max(hi, self.starts[1])
            e_lo, e_hi = min(e_lo, self.ends[0]), max(e_hi, self.ends[1])
        self.starts, self.ends = [lo, hi], [e_lo, e_hi]
        self.tasks += len(start)
        self.union.add(np.column_stack((start, end)))

    def finish(self, base: int) -> FoldedDevice:
        """The folded rows made absolute (`base` added); NotFoldable where a start leaves the
        range (`_finish_rows` would drop that row, which the union no longer tells apart)."""
        if self.tasks and not (self.starts[0] + base > -LIMIT_NS
                               and self.starts[1] + base < LIMIT_NS):
            raise NotFoldable
        head, lengths, gaps = self.union.packed()
        head += base
        return FoldedDevice(iv.Packed.of_parts(head, lengths, gaps), self.tasks,
                            self.starts[0] + base, self.ends[1] + base, self.ends[0] + base)


class _Rows:
    """An ``(n, 2)`` int64 array grown in place (realloc: no copy of what is held)."""

    def __init__(self) -> None:
        self.rows = np.empty((0, 2), np.int64)
        self.n = 0

    def add(self, start: np.ndarray, end: np.ndarray) -> None:
        k = len(start)
        if self.n + k > len(self.rows):
            if not self.rows.flags.owndata:  # unpickled: a view of the pickle's buffer
                self.rows = self.rows.copy()
            self.rows.resize((max(self.n + k, len(self.rows) * 9 // 8 + 65536), 2),
                             refcheck=False)
        self.rows[self.n:self.n + k, 0] = start
        self.rows[self.n:self.n + k, 1] = end
        self.n += k

    def take(self) -> np.ndarray:
        rows, self.rows = self.rows, np.empty((0, 2), np.int64)
        rows.resize((self.n, 2), refcheck=False)
        return rows


def _finish_rows(rows: np.ndarray, base: int, codes: np.ndarray
                 ) -> tuple[np.ndarray, int, np.ndarray]:
    """`rows` ([start, end) relative to `base`, in place) made absolute, rows whose start
    leaves the range dropped, sorted by start (stable); how many were dropped; `codes` (one
    per row) kept and ordered alike."""
    n = len(rows)
    if base:
        rows += base  # a row whose start stays in range cannot wrap (|dur| < 2**62)
    if n and not (rows[:, 0].min() > -LIMIT_NS and rows[:, 0].max() < LIMIT_NS):
        inside = np.abs(rows[:, 0]) < LIMIT_NS
        rows, codes = rows[inside], codes[inside]
    if len(rows) > 1 and not (rows[1:, 0] >= rows[:-1, 0]).all():
        order = np.argsort(rows[:, 0], kind="stable")
        rows, codes = rows[order], codes[order]
    return rows, n - len(rows), codes


class _CategoryKinds(dict):  # type: ignore[type-arg]
    """category -> 1 (device task), 2 (host range) or 0, worked out once per distinct name."""

    def __missing__(self, cat: str) -> int:
        low = cat.lower()
        self[cat] = kind = 1 if low in DEVICE_CATEGORIES else 2 if low in HOST_CATEGORIES else 0
        return kind


def _category_kinds(cats: Iterable[str], n: int) -> np.ndarray:
    """The kind of each of `n` categories: 1 device task, 2 host range, else 0."""
    return np.fromiter(map(_CategoryKinds().__getitem__, cats), np.int8, n)


READER = Reader(KinetoColumns, _KTrace | list[_FastEvent],  # type: ignore[operator]
                reads_document=True)
