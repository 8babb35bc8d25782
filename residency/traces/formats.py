"""Decoding one trace file, streamed, into int64-nanosecond columns: Kineto and torch-npu.

`parse_trace` reads the file in chunks (`residency.traces.files`), has
`residency.traces.jsonstream` split
the events into runs, decodes each run with msgspec into the few columns analysis needs, and
settles the document-level fields (Kineto ``baseTimeNanoseconds``, ``distributedInfo.rank``;
torch-npu ``process_name`` metadata) at the end. Memory: about two chunks plus the kept columns
(16 bytes per Kineto device task, 27 per torch-npu event), whatever the file size.
`parse_whole` decodes a document held in memory the same way (the reference the streamed parse
is tested against; also the path of irregular documents). A large plain file can be parsed in
parts by several processes (`part_bounds`, `parse_part`, `join_parts`).

Per event, a run is decoded by a typed fast path (float64 times) when every value of the run
has the expected type and resolves the nanosecond; else by an any-type path that keeps every
number's decimal text. Both give the same int64 ns for every event: the fast path refuses (for
the run) any time that is not safely away from a half-nanosecond tie.

torch-npu columns keep, for issue 17's busy definitions, each task's ``args["Task Type"]`` and
each host range's lane (its process name) as int16 codes into name tables.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import operator
import reprlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import numpy as np

from residency.traces import kineto_scan
from residency.traces.categories import DEVICE_CATEGORIES, HOST_CATEGORIES
from residency.traces.files import CHUNK_BYTES, MAX_TRACE_BYTES, TraceError, TraceStream
from residency.traces.jsonstream import (
    PLACEHOLDER,
    PLACEHOLDER_VALUE,
    NotAligned,
    Part,
    Skeleton,
    decode_error,
    likely_boundary,
    read_whole,
    split_events,
    split_part,
)

__all__ = ["ASCEND_DERIVED_PROCESSES", "ASCEND_DEVICE_PROCESS", "DEVICE_CATEGORIES",
           "HOST_CATEGORIES", "NotAligned", "Parsed", "decimal_text_to_ns", "decimal_us_to_ns",
           "join_parts", "object_array", "parse_part", "parse_trace", "parse_whole",
           "part_bounds"]

ASCEND_DEVICE_PROCESS = "Ascend Hardware"
ASCEND_DERIVED_PROCESSES = frozenset({"Overlap Analysis"})
_EXACT_FLOAT_US = 2.0**49 / 1000  # float64 us below this: ns within 0.1 of the decimal's
_LIMIT_NS = 2**62  # |times|, durations and bases must stay below: sums of two never overflow
_NO_CODE = -1


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


class _AnyEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw()


class _AnyTrace(msgspec.Struct, gc=False):
    traceEvents: list[_AnyEvent] | None = None
    baseTimeNanoseconds: Any = None
    distributedInfo: Any = None


class _TaskArgs(msgspec.Struct, gc=False):
    task_type: str | None = msgspec.field(default=None, name="Task Type")


class _AscendX(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    ts: str | int | None = None  # torch-npu writes decimal text; a float goes the exact path
    dur: float = math.nan
    # no args: no Task Type (``"args": null`` goes the exact path, which reads it so too)
    args: _TaskArgs = msgspec.field(default_factory=_TaskArgs)


class _AscendMeta(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    pid: ClassVar[None] = None  # a metadata event belongs to no process's tasks
    name: str = ""
    process: int | str | None = msgspec.field(default=None, name="pid")
    args: msgspec.Raw = msgspec.Raw()


_AscendEvent = functools.reduce(operator.or_, [
    msgspec.defstruct(f"_AscendPhase{i}", [], tag_field="ph", tag=ph, gc=False,
                      namespace={"pid": None}, module=__name__)
    for i, ph in enumerate("BEiICbnesftPNODVvRc()")], _AscendX | _AscendMeta)


class _AscendTrace(msgspec.Struct, gc=False):
    traceEvents: list[_AscendEvent] | None = None  # type: ignore[valid-type]


class _Skeleton(msgspec.Struct, gc=False):
    traceEvents: Any = None
    baseTimeNanoseconds: Any = None
    distributedInfo: Any = None


_K_FAST = msgspec.json.Decoder(list[_FastEvent])
_K_EXACT = msgspec.json.Decoder(list[_AnyEvent], float_hook=str)
_A_FAST = msgspec.json.Decoder(list[_AscendEvent])
_A_EXACT = _K_EXACT
_GET_CAT, _GET_TS, _GET_DUR, _GET_NAME, _GET_PID, _GET_TASK = (
    operator.attrgetter(a) for a in ("cat", "ts", "dur", "name", "pid", "args.task_type"))


# -- one file ---------------------------------------------------------------------------------

def parse_trace(fmt: str, source: Path, *, root: Path | None = None,
                chunk_bytes: int = CHUNK_BYTES, max_bytes: int = MAX_TRACE_BYTES,
                digest: bool = False, device_names: bool = True) -> Parsed:
    """Stream `source` (format `fmt`: "kineto" or "ascend") into columns; without
    `device_names`, a Kineto parse leaves the device tasks' names out (``None``).

    Raises:
        TraceError: the file cannot be read (module `residency.traces.files`), is not valid JSON
            (with the byte position in the decompressed stream), or not a trace.
    """
    with _gc_paused(), _trace_errors(source), TraceStream(
            source, root=root, chunk_bytes=chunk_bytes, max_bytes=max_bytes,
            digest=digest) as stream:
        cols = _Kineto(device_names) if fmt == "kineto" else _Ascend()
        got = split_events(stream, cols.add, source)
        if isinstance(got, Skeleton):
            doc = _skeleton(source, got)
            if doc is not None:
                parsed = cols.finish(source, doc if got.in_object else None)
                parsed.digest = _drain(stream)
                return parsed
            prefix, offset = b"", 0  # a repeated traceEvents: read it all again, whole
            stream = TraceStream(source, root=root, chunk_bytes=chunk_bytes,
                                 max_bytes=max_bytes, digest=digest)
        else:
            prefix, offset = got
        with stream:
            data, offset = read_whole(stream, prefix, offset, source)
            parsed = parse_whole(fmt, source, data, offset=offset, total=stream.offset)
            parsed.digest = _drain(stream)
            return parsed


# -- one file in parts, in parallel -----------------------------------------------------------

def part_bounds(source: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """Byte ranges ``[start, stop)`` splitting a plain file into about `parts` parts at likely
    event boundaries (each range but the last ends with the comma the next one begins with)."""
    cuts = []
    with open(source, "rb") as f:
        for j in range(1, parts):
            f.seek(size * j // parts)
            at = likely_boundary(f.read(1 << 20))
            if at is not None:
                cuts.append(size * j // parts + at)
    cuts = sorted(set(cuts))
    starts = [0, *cuts]
    return [(a, b + 1) for a, b in zip(starts, cuts, strict=False)] + [(starts[-1], size)]


def parse_part(fmt: str, source: Path, start: int, stop: int, *, first: bool, last: bool,
               root: Path | None = None, chunk_bytes: int = CHUNK_BYTES,
               max_bytes: int = MAX_TRACE_BYTES, device_names: bool = True,
               digest: bool = False) -> tuple[Any, Part, str | None]:
    """The columns of one part of a plain trace file (`part_bounds`), not yet finished, with
    (`digest`) the content digest of exactly the bytes of the part as it read them (else
    None; `residency.traces.files.parts_digest` combines them).

    Raises:
        NotAligned, TraceError: the caller parses the whole file with `parse_trace` instead.
    """
    with _gc_paused(), _trace_errors(source), TraceStream(
            source, root=root, chunk_bytes=chunk_bytes, max_bytes=max_bytes, start=start,
            stop=stop, digest=digest) as stream:
        cols = _Kineto(device_names) if fmt == "kineto" else _Ascend()
        part = split_part(stream, cols.add, source, first=first, last=last)
        cols.compact()
        return cols, part, _drain(stream) if digest else None


def join_parts(source: Path, parts: list[tuple[Any, Part, str | None]]) -> Parsed:
    """The timeline of a file from its parts' columns, in file order.

    Raises:
        NotAligned: the document repeats ``traceEvents``; TraceError: as `parse_trace`.
    """
    cols = parts[0][0]
    for other, *_ in parts[1:]:
        cols.extend(other)
    head, tail = parts[0][1], parts[-1][1]
    assert head.head is not None and tail.tail is not None
    sk = Skeleton(head.head + PLACEHOLDER + tail.tail, len(head.head), head.h0,
                  tail.tail_offset, tail.total, head.layout == "object", tail.gaps)
    with _trace_errors(source):
        doc = _skeleton(source, sk)
        if doc is None:
            raise NotAligned("traceEvents repeated")
        return cols.finish(source, doc if sk.in_object else None)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a file is parsed: the parse allocates
    millions of objects that hold no cycles (structs are ``gc=False``), and each collection
    pass over them is wasted work (5-8 % of a parse here). Restored as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _trace_errors(source: Path) -> Iterator[None]:
    try:
        yield
    except RecursionError:  # msgspec's nesting limit
        raise TraceError(source, "invalid JSON: nested too deeply to decode") from None
    except msgspec.DecodeError as exc:  # a raw field decoded late (metadata args)
        raise TraceError(source, f"invalid JSON: {exc}") from None


def _drain(stream: TraceStream) -> str | None:
    """Read what is left (for the file's digest, or to check its seal) and return the
    digest."""
    if stream.digest is None:
        stream.finish()
        return None
    while stream.read():
        pass
    return stream.digest


def _skeleton(source: Path, sk: Skeleton) -> Any:
    """The document-level fields; None when the document repeats ``traceEvents``."""
    try:
        doc = msgspec.json.decode(sk.text)
    except msgspec.DecodeError as exc:
        raise decode_error(source, exc, sk.position, sk.total,
                           gz=source.name.endswith(".gz")) from None
    if not sk.in_object:
        return doc if doc == PLACEHOLDER_VALUE else None
    if not isinstance(doc, dict) or doc.get("traceEvents") != PLACEHOLDER_VALUE:
        return None
    return _Skeleton(doc.get("traceEvents"), doc.get("baseTimeNanoseconds"),
                     doc.get("distributedInfo"))


def parse_whole(fmt: str, source: Path, data: bytes, *, offset: int = 0,
                total: int | None = None) -> Parsed:
    """Decode a whole document held in memory (`data` begins at stream byte `offset`).

    Raises:
        TraceError: as `parse_trace`.
    """
    with _trace_errors(source):
        return _parse_whole(fmt, source, data, offset, total)


def _parse_whole(fmt: str, source: Path, data: bytes, offset: int, total: int | None) -> Parsed:
    gz = source.name.endswith(".gz")
    end = offset + len(data) if total is None else total

    def decode(typ: Any, exact: bool) -> Any:
        try:
            return msgspec.json.Decoder(typ, float_hook=str if exact else None).decode(data)
        except msgspec.ValidationError as exc:
            if not exact:
                raise
            raise TraceError(source, f"not a trace of the expected shape: {exc}") from None
        except msgspec.DecodeError as exc:
            raise decode_error(source, exc, lambda k: offset + k, end, gz=gz) from None

    fast = (_KTrace | list[_FastEvent]) if fmt == "kineto" else (  # type: ignore[operator]
        _AscendTrace | list[_AscendEvent])  # type: ignore[operator]
    try:
        doc = decode(fast, False)
        cols = _Kineto() if fmt == "kineto" else _Ascend()
        if cols.add_fast(_events_of(source, doc)):
            return cols.finish(source, doc if fmt == "kineto" else None)
    except msgspec.ValidationError:
        pass
    doc = decode(_AnyTrace | list[_AnyEvent], True)  # type: ignore[operator]
    cols = _Kineto() if fmt == "kineto" else _Ascend()
    cols.add_exact(_events_of(source, doc))
    return cols.finish(source, doc if fmt == "kineto" else None)


def _events_of(source: Path, doc: Any) -> list[Any]:
    """The event list of a JSON Object Format document, or the document if it is an array."""
    if isinstance(doc, list):
        return doc
    if doc.traceEvents is None:
        raise TraceError(source, "no traceEvents: not a trace")
    return doc.traceEvents


# -- columns ----------------------------------------------------------------------------------

def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


class _Names:
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

    def absorb(self, other: _Names) -> np.ndarray:
        """Add `other`'s names; their codes here, indexed by their codes there."""
        return self.code(list(other.codes))


def _decoded_names(events: list[Any]) -> tuple[list[str], np.ndarray | None, str | None]:
    """Names of fast-path events (raw JSON), which could not be decoded, and the first
    decode error (raised only if such an event is used)."""
    try:
        return _raw_names(events), None, None
    except msgspec.DecodeError:
        pass
    names, bad, first = [], np.zeros(len(events), bool), None
    for i, e in enumerate(events):
        try:
            names.extend(_raw_names([e]))
        except msgspec.DecodeError as exc:
            names.append("")
            bad[i], first = True, first or str(exc)
    return names, bad, first


class _Kineto:
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
        self.names = _Names()
        self.name_error: str | None = None
        self.rejected = 0
        self._raw_kinds: dict[bytes, int] = {}
        self._kinds = _CategoryKinds()

    def _kind_of(self, raw: bytes) -> int:
        """The kind (`_category_kinds`) of a category given as its raw JSON string."""
        kind = self._raw_kinds.get(raw)
        if kind is None:
            kind = self._raw_kinds[raw] = self._kinds[msgspec.json.decode(raw)]
        return kind

    def add_scanned(self, got: kineto_scan.Scanned) -> None:
        """Keep the columns the compiled reader gave for one run."""
        codes = (self.names.code(_json_names(got.names))[got.name_ids]
                 if got.names is not None else np.zeros(0, np.int32))
        if not self.want_names:  # numbered are the host ranges only
            codes = codes[np.cumsum(got.kinds == 2) - 1] if len(codes) else codes
        self._keep(got.kinds, got.ts, got.dur, got.ok, codes_of=codes.__getitem__,
                   host_codes_of=codes.__getitem__)

    def compact(self) -> None:
        """Trim the grown arrays (before pickling)."""
        self.dev.rows = self.dev.take()
        self.dev.n = len(self.dev.rows)

    def extend(self, other: _Kineto) -> None:
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
        scanned = kineto_scan.scan(data, self._kind_of, 2 if self.want_names else 1)
        if scanned is not None:
            self.add_scanned(scanned)
            return scanned.events
        try:
            events = _K_FAST.decode(data)
            if self.add_fast(events):
                return len(events)
        except msgspec.ValidationError:
            pass
        events = _K_EXACT.decode(data)
        self.add_exact(events)
        return len(events)

    def add_fast(self, events: list[Any]) -> bool:
        """Keep the columns of fast-path events; False (nothing kept) when a time is not
        exact as float64."""
        kinds = _category_kinds(map(_GET_CAT, events), len(events))
        idx = np.flatnonzero(kinds)
        sel = _pick(events, idx)
        ts = np.fromiter(map(_GET_TS, sel), np.float64, len(sel))
        dur = np.fromiter(map(_GET_DUR, sel), np.float64, len(sel))
        if not (_exact_floats(ts) and _exact_floats(dur)):
            return False
        ts_ns, ts_ok = _floats_to_ns(ts)
        dur_ns, dur_ok = _floats_to_ns(dur)
        self._keep(kinds[idx], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: _decoded_names([events[i] for i in idx[h].tolist()]),
                   lambda h: self._name_codes(list(map(events.__getitem__,
                                                       idx[h].tolist()))))
        return True

    def _name_codes(self, events: list[Any]) -> np.ndarray:
        """Name codes of fast-path events, each distinct raw name decoded once (device tasks
        repeat few names); an undecodable name is ``""``."""
        keys = list(map(bytes, map(_GET_NAME, events)))
        distinct = list(dict.fromkeys(keys))
        texts = _decoded_names([_Named(k) for k in distinct])[0]
        lut = dict(zip(distinct, self.names.code(texts).tolist(), strict=True))
        return np.fromiter(map(lut.__getitem__, keys), np.int32, len(keys))

    def add_exact(self, events: list[Any]) -> None:
        """Keep the columns of any-type events (numbers as decimal text)."""
        kinds = _category_kinds((e.cat if type(e.cat) is str and e.ph == "X" else ""
                                 for e in events), len(events))
        sel = _take(events, np.flatnonzero(kinds))
        ts_ns, ts_ok = _us_to_ns([e.ts for e in sel])
        dur_ns, dur_ok = _us_to_ns([e.dur for e in sel])
        self._keep(kinds[kinds > 0], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: (_any_names([sel[i] for i in h.tolist()]), None, None))

    def _keep(self, kinds: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray, ok: np.ndarray,
              names_of: Callable[[np.ndarray], tuple[list[str], np.ndarray | None, str | None]]
              | None = None, codes_of: Callable[[np.ndarray], np.ndarray] | None = None,
              host_codes_of: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Keep the rows of the events of `kinds` 1 and 2 whose times are `ok` and in range;
        name codes of device rows from `codes_of` (else `names_of`), of host rows from
        `host_codes_of` (else `names_of`, whose undecodable names are marked)."""
        # times out of range are rejected, before any sum could wrap around int64
        ok &= (np.abs(ts_ns) < _LIMIT_NS) & (dur_ns >= 0) & (dur_ns < _LIMIT_NS)
        self.rejected += int((~ok).sum())
        dev, host = ok & (kinds == 1), np.flatnonzero(ok & (kinds == 2))
        start = ts_ns[dev]
        self.dev.add(start, start + dur_ns[dev])
        if self.want_names:
            at = np.flatnonzero(dev)
            self.dev_name.append(codes_of(at) if codes_of is not None else
                                 self.names.code(names_of(at)[0]))
        self.host_ts.append(ts_ns[host])
        self.host_dur.append(dur_ns[host])
        if host_codes_of is not None:
            self.host_name.append(host_codes_of(host))
            self.host_bad.append(np.zeros(len(host), bool))
            return
        assert names_of is not None
        names, bad, error = names_of(host)
        self.host_name.append(self.names.code(names))
        self.host_bad.append(np.zeros(len(host), bool) if bad is None else bad)
        self.name_error = self.name_error or error

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
            if type(base) is not int or not -_LIMIT_NS < base < _LIMIT_NS:
                raise TraceError(source, "baseTimeNanoseconds must be an integer of magnitude "
                                 f"below 2**62, not {reprlib.repr(base)}")
        if rank is not None and (type(rank) is not int or rank < 0):
            raise TraceError(source, f"distributedInfo.rank must be a non-negative integer, "
                             f"not {reprlib.repr(rank)}")
        base = base or 0
        rows = self.dev.take()
        device, rejected, dev_codes = _finish_rows(
            rows, base, _drain_parts(self.dev_name, np.int32) if self.want_names
            else np.zeros(len(rows), np.int32))
        ranges, order, host_rejected = _intervals(_drain_parts(self.host_ts, np.int64),
                                                  _drain_parts(self.host_dur, np.int64), base)
        codes = _take_rows(_cat(self.host_name, np.int32), order)
        if _take_rows(_cat(self.host_bad, bool), order).any():
            raise TraceError(source, f"invalid JSON: {self.name_error}")
        none = np.full(len(ranges), _NO_CODE, np.int16)
        table = self.names.table()
        return Parsed(rank, device, ranges, table[codes],
                      self.rejected + rejected + host_rejected,
                      np.full(len(device), _NO_CODE, np.int16), none, none.copy(),
                      device_names=table[dev_codes] if self.want_names else None,
                      world_size=world)


def _intervals(ts: np.ndarray, dur: np.ndarray, base: int
               ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(n, 2)`` [start, end) of the rows whose start with `base` stays in range, sorted by
    start (stable); the kept rows' indices in that order (None: all, in order); how many were
    rejected. Uses `ts` as scratch (it may be overwritten)."""
    start = ts
    if base:
        start += base  # no wrap: |ts| and |base| are below 2**62
    inside = np.abs(start) < _LIMIT_NS
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
    if n and not (rows[:, 0].min() > -_LIMIT_NS and rows[:, 0].max() < _LIMIT_NS):
        inside = np.abs(rows[:, 0]) < _LIMIT_NS
        rows, codes = rows[inside], codes[inside]
    if len(rows) > 1 and not (rows[1:, 0] >= rows[:-1, 0]).all():
        order = np.argsort(rows[:, 0], kind="stable")
        rows, codes = rows[order], codes[order]
    return rows, n - len(rows), codes


def _take_rows(a: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    return a if keep is None else a[keep]


def _drain_parts(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The concatenation of `parts`, which is emptied (its arrays are freed)."""
    out = _cat(parts, dtype)
    parts.clear()
    return out


class _Ascend:
    """Kept columns of a torch-npu ``trace_view.json``: every ``X`` event of a process (which
    are device tasks is known only once every ``process_name`` is read)."""

    def __init__(self) -> None:
        self.pids: dict[Any, int] = {}
        self.pid: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.ok: list[np.ndarray] = []
        self.name: list[np.ndarray] = []
        self.bad: list[np.ndarray] = []
        self.task: list[np.ndarray] = []
        self.names = _Names()
        self.tasks: dict[str | None, int] = {None: _NO_CODE}
        self.name_error: str | None = None
        self.metas: list[tuple[Any, bytes]] = []

    def compact(self) -> None:
        """Nothing to trim."""

    def extend(self, other: _Ascend) -> None:
        """Append the columns of the events after ours (another part of the file)."""
        pids = np.array([self.pids.setdefault(p, len(self.pids)) for p in other.pids],
                        np.int32)
        names = self.names.absorb(other.names)
        tasks = np.array([self.tasks.setdefault(t, len(self.tasks) - 1)
                          for t in list(other.tasks)[1:]] + [_NO_CODE], np.int16)
        self.pid += [pids[c] for c in other.pid]
        self.name += [names[c] for c in other.name]
        self.task += [tasks[c] for c in other.task]  # code -1 reads the last entry: -1
        self.ts += other.ts
        self.dur += other.dur
        self.ok += other.ok
        self.bad += other.bad
        self.metas += other.metas
        self.name_error = self.name_error or other.name_error

    def add(self, data: bytes, index: int = 0) -> int:
        """Decode one run of events (a JSON array) and keep its columns."""
        try:
            events = _A_FAST.decode(data)
            if self.add_fast(events):
                return len(events)
        except msgspec.ValidationError:
            pass
        events = _A_EXACT.decode(data)
        self.add_exact(events)
        return len(events)

    def add_fast(self, events: list[Any]) -> bool:
        """Keep the columns of fast-path events; False (nothing kept) when a duration is not
        exact as float64."""
        # every other phase, metadata included, has no pid: the X events with one, in C
        has_pid = list(map(operator.is_not, map(_GET_PID, events), itertools.repeat(None)))
        xs = list(itertools.compress(events, has_pid))
        dur = np.fromiter(map(_GET_DUR, xs), np.float64, len(xs))
        if not _exact_floats(dur):
            return False
        self.metas += [(e.process, bytes(e.args))
                       for e in itertools.compress(events, map(operator.not_, has_pid))
                       if type(e) is _AscendMeta and e.name == "process_name"]
        names, bad, error = _decoded_names(xs)
        self._keep(xs, names, bad, error, list(map(_GET_TASK, xs)), _floats_to_ns(dur))
        return True

    def add_exact(self, events: list[Any]) -> None:
        """Keep the columns of any-type events."""
        self.metas += [(e.pid, bytes(e.args)) for e in events
                       if e.ph == "M" and e.name == "process_name"]
        xs = [e for e in events if e.ph == "X" and type(e.pid) in (int, str)]
        self._keep(xs, _any_names(xs), None, None, [_task_type(e.args) for e in xs],
                   _us_to_ns([e.dur for e in xs]))

    def _keep(self, xs: list[Any], names: list[str], bad: np.ndarray | None,
              error: str | None, tasks: list[str | None],
              durations: tuple[np.ndarray, np.ndarray]) -> None:
        pids, codes = self.pids, self.tasks
        pid = list(map(_GET_PID, xs))
        for p in dict.fromkeys(pid):  # each distinct pid once; the rest in C
            pids.setdefault(p, len(pids))
        self.pid.append(np.fromiter(map(pids.__getitem__, pid), np.int32, len(xs)))
        ts_ns, ts_ok = _us_to_ns(list(map(_GET_TS, xs)))
        dur_ns, dur_ok = durations
        ok = ts_ok & dur_ok & (np.abs(ts_ns) < _LIMIT_NS) & (dur_ns >= 0) & (dur_ns < _LIMIT_NS)
        self.ts.append(ts_ns)
        self.dur.append(dur_ns)
        self.ok.append(ok)
        self.name.append(self.names.code(names))
        self.bad.append(np.zeros(len(xs), bool) if bad is None else bad)
        self.name_error = self.name_error or error
        for t in dict.fromkeys(tasks):
            codes.setdefault(t, len(codes) - 1)
        self.task.append(np.fromiter(map(codes.__getitem__, tasks), np.int16, len(tasks)))

    def finish(self, source: Path, doc: Any) -> Parsed:
        """The timeline, once every process's name is known. torch-npu times are absolute: no
        Kineto ``baseTimeNanoseconds`` (or ``distributedInfo``) applies."""
        process: dict[Any, Any] = {}
        for pid, raw in self.metas:
            args = msgspec.json.decode(raw) if len(raw) else None  # invalid UTF-8: TraceError
            if isinstance(args, dict) and type(pid) in (int, str):
                name = args.get("name")
                process[pid] = name if type(name) is str else None  # a list or dict: no name
        lanes: dict[str, int] = {}
        kind_of = np.zeros(len(self.pids), np.int8)
        lane_of = np.full(len(self.pids), _NO_CODE, np.int16)
        for p, code in self.pids.items():
            name = process.get(p)
            # derived slices (3) are kept as rows of their lane; `traces` sets them apart
            kind_of[code] = (1 if name == ASCEND_DEVICE_PROCESS else
                             3 if name in ASCEND_DERIVED_PROCESSES else 2)
            if name is not None:
                lane_of[code] = lanes.setdefault(name, len(lanes))
        pid = _drain_parts(self.pid, np.int32)
        kinds, ok = kind_of[pid], _drain_parts(self.ok, bool)
        ts, dur = _drain_parts(self.ts, np.int64), _drain_parts(self.dur, np.int64)
        task = _drain_parts(self.task, np.int16)
        rejected = int((((kinds == 1) | (kinds == 2)) & ~ok).sum())  # a bad derived slice:
        # dropped, uncounted
        dev = np.flatnonzero(ok & (kinds == 1))
        device, order, _ = _intervals(ts[dev], dur[dev], 0)
        dev = _take_rows(dev, order)
        host = np.flatnonzero(ok & (kinds >= 2))
        ranges, horder, _ = _intervals(ts[host], dur[host], 0)
        host = _take_rows(host, horder)
        if _cat(self.bad, bool)[host].any():
            raise TraceError(source, f"invalid JSON: {self.name_error}")
        names, table = _cat(self.name, np.int32), self.names.table()
        return Parsed(None, device, ranges, table[names[host]],
                      rejected, task[dev], task[host], lane_of[pid[host]],
                      tuple(t for t in self.tasks if t is not None), tuple(lanes),
                      device_names=table[names[dev]])


def _task_type(raw: msgspec.Raw) -> str | None:
    try:
        args = msgspec.json.decode(raw) if len(raw) else None
    except (msgspec.DecodeError, RecursionError):
        return None
    task = args.get("Task Type") if isinstance(args, dict) else None
    return task if type(task) is str else None


# -- fields -----------------------------------------------------------------------------------

def _floats_at(events: list[Any], idx: np.ndarray, get: Callable[[Any], float]) -> np.ndarray:
    """A float attribute of ``events[idx]``; one pass over every event when most are wanted."""
    if 2 * len(idx) > len(events):
        return np.fromiter(map(get, events), np.float64, len(events))[idx]
    return np.fromiter(map(get, [events[i] for i in idx.tolist()]), np.float64, len(idx))


def _pick(events: list[Any], idx: np.ndarray) -> Any:
    """``events[idx]`` as a sequence, picked in C."""
    if len(idx) == len(events):
        return events
    if len(idx) < 2:
        return [events[i] for i in idx.tolist()]
    return operator.itemgetter(*idx.tolist())(events)


def _exact_floats(us: np.ndarray) -> bool:
    """Whether float64 microseconds give, rounded, the ns their decimal text gives: small
    enough (the parse is within 0.1 ns) and not near a half-nanosecond tie. NaN (missing) is
    fine: it is rejected on both paths."""
    if not len(us):
        return True
    if not np.nanmax(np.abs(us), initial=0.0) < _EXACT_FLOAT_US:
        return False
    ns = us * 1000
    return not bool((np.abs(ns - np.floor(ns) - 0.5) < 0.125).any())


def _raw_names(events: list[Any]) -> list[str]:
    """Names of fast-path events: their raw JSON decoded in one call."""
    raws = list(map(_GET_NAME, events))
    if not all(map(len, raws)):  # a missing name reads as ""
        raws = [r if len(r) else b'""' for r in raws]
    return _json_names(b"[" + b",".join(raws) + b"]")


def _json_names(text: bytes) -> list[str]:
    """Names from the JSON array of their raw values (a value that is not a string as
    `_any_names` reads it)."""
    try:
        return msgspec.json.decode(text, type=list[str])
    except msgspec.ValidationError:
        return _any_names([_Named(v) for v in msgspec.json.decode(text)])


class _Named(msgspec.Struct):
    name: Any


def _any_names(events: list[Any]) -> list[str]:
    return [n if type(n) is str else "" if n is None else str(n) for n in (e.name for e in events)]


def _take(events: list[Any], idx: np.ndarray) -> list[Any]:
    return events if len(idx) == len(events) else [events[i] for i in idx.tolist()]


class _CategoryKinds(dict):  # type: ignore[type-arg]
    """category -> 1 (device task), 2 (host range) or 0, worked out once per distinct name."""

    def __missing__(self, cat: str) -> int:
        low = cat.lower()
        self[cat] = kind = 1 if low in DEVICE_CATEGORIES else 2 if low in HOST_CATEGORIES else 0
        return kind


def _category_kinds(cats: Iterable[str], n: int) -> np.ndarray:
    """The kind of each of `n` categories: 1 device task, 2 host range, else 0."""
    return np.fromiter(map(_CategoryKinds().__getitem__, cats), np.int8, n)


def object_array(items: list[Any]) -> np.ndarray:
    """`items` as a 1-D numpy object array (no nested-sequence unpacking)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _floats_to_ns(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.abs(us) < _LIMIT_NS / 1000  # NaN, inf or out of range: no int64 to cast to
    return np.rint(np.where(ok, us, 0.0) * 1000).astype(np.int64), ok


def _us_to_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond values (int, float or decimal text) to int64 ns, and which were numbers."""
    convert = {int: _ints_to_ns, float: _float_list_to_ns, str: decimal_text_to_ns}
    n = len(values)
    ns, ok = np.zeros(n, np.int64), np.zeros(n, bool)
    types = set(map(type, values))
    if len(types) == 1 and (only := types.pop()) in convert:
        return convert[only](values)
    code = {t: i for i, t in enumerate(convert, 1)}
    codes = np.fromiter((code.get(t, 0) for t in map(type, values)), np.int8, n)
    for i, fn in enumerate(convert.values(), 1):
        idx = np.flatnonzero(codes == i)
        if len(idx):
            ns[idx], ok[idx] = fn([values[k] for k in idx.tolist()])
    return ns, ok


def _ints_to_ns(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ok = np.array([abs(v) < 2**63 // 1000 for v in values], dtype=bool)
    return np.array([v if k else 0 for v, k in zip(values, ok, strict=True)], np.int64) * 1000, ok


def _float_list_to_ns(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return _floats_to_ns(np.array(values, np.float64))


def decimal_text_to_ns(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Decimal microsecond text to int64 ns, exactly: nearest ns, ties away from zero.

    Text of one fixed layout (as torch-npu writes epoch microseconds, ``%.3f``) is parsed from
    its digits on a code matrix, with no float; anything else (other layouts, exponents,
    spaces, junk) goes through `Decimal` one value at a time."""
    n = len(values)
    ns, ok = np.zeros(n, np.int64), np.zeros(n, bool)
    widths, text = set(map(len, values)), "".join(values)
    if len(widths) == 1 and (width := widths.pop()) and text.isascii():
        c = np.frombuffer(text.encode(), np.uint8).reshape(n, width)
        point = values[0].find(".")
        point = width if point < 0 else point
        if point == width or bool((c[:, point] == 46).all()):
            ns, ok = _plain_decimal(c, point)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        ns[bad], ok[bad] = _decimal_one_by_one([values[i] for i in bad.tolist()])
    return ns, ok


def _plain_decimal(c: np.ndarray, point: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ASCII codes ``-?d+(.d+)?``, all with the decimal point (or end) at `point`;
    rows of another form are marked not ok. Works column by column (rows are short)."""
    n, width = c.shape
    u = c - np.uint8(48)  # a digit is 0..9; every other byte wraps above 9
    neg = c[:, 0] == 45  # '-'
    u[neg, 0] = 0
    cols = [u[:, j] for j in range(width) if j != point]
    top = np.maximum.reduce(cols) if cols else np.full(n, 255, np.uint8)
    ok = (top <= 9) & (point - neg >= 1) & (point <= 18) & (width != point + 1)
    us = np.zeros(n, np.int64)
    for j in range(point):
        us = us * 10 + u[:, j]
    ns = us * 1000
    for k, j in enumerate(range(point + 1, min(point + 4, width))):
        ns += u[:, j].astype(np.int64) * 10 ** (2 - k)
    if width > point + 4:
        ns += u[:, point + 4] >= 5  # the 4th fraction digit decides: ties away from zero
    ok &= us < 2**63 // 1000 - 1
    return np.where(neg, -ns, ns), ok


def _decimal_one_by_one(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    parsed = [decimal_us_to_ns(v) for v in values]
    return (np.array([0 if v is None else v for v in parsed], np.int64),
            np.array([v is not None for v in parsed], bool))


def decimal_us_to_ns(text: str) -> int | None:
    """Decimal microsecond text to int64 ns exactly; None when it is not a finite number or
    lies outside int64 ns."""
    try:
        us = Decimal(text)
    except InvalidOperation:
        return None
    if not us.is_finite() or (us and us.adjusted() > 18):  # |us| >= 1e19: out of range
        return None  # (a zero with any exponent, "0E20", is 0)
    # us * 1000 must not round before the rounding to ns: 28 digits (the default context)
    # hold 24 characters' worth; longer text gets a context with room for every digit
    scaled = us * 1000 if len(text) <= 24 else Context(prec=len(text) + 4).multiply(us, 1000)
    ns = int(scaled.to_integral_value(rounding=ROUND_HALF_UP))
    return ns if abs(ns) < 2**63 else None
