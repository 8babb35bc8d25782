"""Load profiler traces into per-rank timelines of int64-nanosecond intervals.

One entry point, `load_traces`, for both formats the brief names:

* Kineto JSON (`*.json`, `*.json.gz`, from torch.profiler and the emulated NPU). Device tasks:
  ``ph == "X"`` with category (case-insensitive) in `DEVICE_CATEGORIES`; host ranges: ``ph ==
  "X"`` with category in `HOST_CATEGORIES`. ``ts``/``dur`` are microseconds (number or decimal
  string); absolute ns = ``baseTimeNanoseconds`` + ts * 1000 when the trace has a base.
* torch-npu ``*_ascend_pt/`` directories: device tasks are the ``X`` events of the process
  named `ASCEND_DEVICE_PROCESS` in ``ASCEND_PROFILER_OUTPUT/trace_view.json``; host ranges
  are the ``X`` events of every other process except the derived `ASCEND_DERIVED_PROCESSES`.

Timestamps are parsed exactly: decimal text goes to int64 ns without passing through float64,
and float64 values are used only where they still resolve one nanosecond. An event whose ``ts``
is not a number, whose ``dur`` is missing or negative, or whose times lie 2**62 ns (146 years)
or more from the epoch is rejected: counted in `RankTimeline.rejected_events` and never used.
Parsed files are cached as Parquet in a `CACHE_DIR` folder beside each trace, keyed on the
trace's size and mtime.

Kineto files are decoded by a typed fast path (float64 times, tagged by phase) that falls back
to an any-type decoder keeping every number's decimal text when the fast path cannot be exact.
Parsing needs neither pandas nor pyarrow; pyarrow serves the Parquet cache (and imports pandas
when it writes one).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import math
import multiprocessing
import operator
import os
import re
import reprlib
import threading
import warnings
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec
import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ASCEND_DERIVED_PROCESSES", "ASCEND_DEVICE_PROCESS", "CACHE_DIR", "DEVICE_CATEGORIES",
           "HOST_CATEGORIES", "RankTimeline", "TraceError", "TraceSet", "load_traces"]

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
HOST_CATEGORIES = frozenset({"user_annotation", "cpu_op", "python_function", "operator"})
ASCEND_DEVICE_PROCESS = "Ascend Hardware"
ASCEND_DERIVED_PROCESSES = frozenset({"Overlap Analysis"})
CACHE_DIR = "residency.parquet.cache"
_CACHE_VERSION = 1
_PARALLEL_MIN_BYTES = 16 << 20  # below this, starting worker processes costs more than it saves
_EXACT_FLOAT_US = 2.0**52 / 1000  # float64 microseconds below this still resolve 1 ns
_LIMIT_NS = 2**62  # |times|, durations and bases must stay below: sums of two never overflow
_RANK_RE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class TraceError(ValueError):
    """A trace that cannot be analysed: `path`, the byte `position` where known, `message`."""

    def __init__(self, path: str | os.PathLike[str], message: str,
                 position: int | None = None) -> None:
        self.path, self.message, self.position = Path(path), message, position
        where = f" (at byte {position})" if position is not None else ""
        super().__init__(f"{self.path}{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # survives the trip back from a worker process
        return (TraceError, (self.path, self.message, self.position))


@dataclass(frozen=True, eq=False)
class RankTimeline:
    """One rank's device tasks and named host ranges, int64 ns, half-open ``[start, end)``.

    `device`: ``(n, 2)`` as recorded (sorted by start; overlaps and zero-length tasks kept).
    `ranges`: ``(m, 2)`` host ranges sorted by start; `range_names`: their names, an ``(m,)``
    object array of str.
    """

    rank: int
    source: Path
    device: np.ndarray
    ranges: np.ndarray
    range_names: np.ndarray
    rejected_events: int

    @property
    def device_tasks(self) -> int:
        """Number of device tasks."""
        return len(self.device)

    def ranges_frame(self) -> pd.DataFrame:
        """The host ranges as a DataFrame: ``name`` (categorical), ``start_ns``, ``end_ns``."""
        import pandas as pd

        return pd.DataFrame({"name": pd.Categorical(self.range_names.tolist()),
                             "start_ns": self.ranges[:, 0], "end_ns": self.ranges[:, 1]})


@dataclass(frozen=True, eq=False)
class TraceSet:
    """The ranks of one profiled run, in one format."""

    format: Literal["kineto", "ascend"]
    ranks: dict[int, RankTimeline]

    @property
    def rejected_events(self) -> int:
        """Events rejected over all ranks."""
        return sum(t.rejected_events for t in self.ranks.values())


@dataclass
class _Parsed:
    """What one trace file yields before its rank is settled."""

    rank: int | None  # from the file's content (Kineto distributedInfo)
    device: np.ndarray
    ranges: np.ndarray
    names: np.ndarray
    rejected: int


def load_traces(path: str | os.PathLike[str], *, cache: bool = True,
                workers: int | None = None) -> TraceSet:
    """Load every rank's trace under `path`.

    `path` is a trace file, a directory of rank traces of one format (searched recursively),
    or a run directory whose ``trace/`` subdirectory holds them. A Kineto file's rank is its
    ``distributedInfo.rank``, else a ``rank<N>`` in its name (then in its folders' names); a
    torch-npu directory's rank is in its ``profiler_info_<rank>.json``, else a ``rank<N>`` in
    its path (vLLM-Omni writes ``diffusion_rank<N>/``). Files are parsed in `workers` processes
    (default: one per CPU when the traces are large). With `cache`, parsed files are read from
    and written to Parquet beside them; a cache that cannot be used is ignored.

    Raises:
        TraceError: nothing to load, both formats under `path`, unreadable or invalid JSON
            (with the byte position where known), a rank that cannot be told or appears
            twice, or ranks whose time ranges do not overlap.

    Warns:
        UserWarning: a rank without device tasks (its busy time is zero).
    """
    root = Path(path)
    fmt, items = _discover(root)
    sources = [item if fmt == "kineto" else _ascend_trace(item) for item in items]
    parsed = _parse_all(fmt, sources, cache=cache, workers=workers)
    ranks: dict[int, RankTimeline] = {}
    origin: dict[int, Path] = {}
    unknown = []
    for item, source, p in zip(items, sources, parsed, strict=True):
        rank = p.rank if fmt == "kineto" else _ascend_rank(item)
        if rank is None:
            rank = _rank_from_path(item, root)
        if rank is None:
            unknown.append(item)
            continue
        if rank in ranks:
            raise TraceError(item, f"rank {rank} appears twice: in {origin[rank]} and in {item}")
        origin[rank] = item
        for a in (p.device, p.ranges, p.names):
            a.setflags(write=False)
        ranks[rank] = RankTimeline(rank, source, p.device, p.ranges, p.names, p.rejected)
    if unknown:
        listed = ", ".join(str(u) for u in unknown)
        where = ("no distributedInfo.rank and no rank<N> in the name" if fmt == "kineto"
                 else "no profiler_info_<rank>.json and no rank<N> in the path")
        raise TraceError(root, f"cannot tell the rank of {listed} ({where})")
    _check_overlap(root, ranks)
    for t in ranks.values():
        if not len(t.device):
            warnings.warn(f"rank {t.rank} ({t.source}) has no device tasks; its busy time is 0",
                          UserWarning, stacklevel=2)
    return TraceSet(fmt, dict(sorted(ranks.items())))


# -- discovery -------------------------------------------------------------------------------

def _is_kineto_name(p: Path) -> bool:
    return p.name.endswith((".json", ".json.gz"))


def _discover(path: Path) -> tuple[Literal["kineto", "ascend"], list[Path]]:
    if not path.exists():
        raise TraceError(path, "no such file or directory")
    if path.is_file():
        if _is_kineto_name(path):
            return "kineto", [path]
        raise TraceError(path, "not a trace: expected *.json, *.json.gz or *_ascend_pt/")
    root = path / "trace" if (path / "trace").is_dir() else path
    if root.name.endswith("_ascend_pt"):
        return "ascend", [root]
    kineto: list[Path] = []
    ascend: list[Path] = []
    runs: list[Path] = []  # trace/ folders of run directories below PATH
    for d, dirs, files in os.walk(root):
        ascend += [Path(d, x) for x in dirs if x.endswith("_ascend_pt")]
        runs += [Path(d, x) for x in dirs if x == "trace"]
        dirs[:] = [x for x in dirs if not x.endswith("_ascend_pt") and x != CACHE_DIR]
        kineto += [p for f in files if _is_kineto_name(p := Path(d, f))]
    if len(runs) > 1:
        listed = ", ".join(str(r.parent.relative_to(root)) for r in sorted(runs)[:4])
        raise TraceError(root, f"holds the traces of {len(runs)} runs ({listed}"
                         f"{', ...' if len(runs) > 4 else ''}); point PATH at one of them")
    if runs:
        return _discover(runs[0].parent)
    if kineto and ascend:
        raise TraceError(root, f"holds both Kineto files ({kineto[0].name}, ...) and torch-npu "
                         f"directories ({ascend[0].name}, ...); point PATH at one format")
    if not (kineto or ascend):
        raise TraceError(root, "no traces found: expected Kineto *.json / *.json.gz files or "
                         "torch-npu *_ascend_pt directories")
    return ("kineto", sorted(kineto)) if kineto else ("ascend", sorted(ascend))


def _ascend_trace(d: Path) -> Path:
    trace = d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    if not trace.is_file():
        raise TraceError(d, "no ASCEND_PROFILER_OUTPUT/trace_view.json (was the profile "
                         "parsed? torch-npu writes it when profiling stops)")
    return trace


def _ascend_rank(d: Path) -> int | None:
    found = sorted(d.glob("profiler_info_*.json"))
    ranks = {int(m.group(1)) for f in found if (m := re.fullmatch(r"profiler_info_(\d+)\.json",
                                                                   f.name))}
    if len(ranks) > 1:
        raise TraceError(d, f"more than one profiler_info_<rank>.json: {sorted(ranks)}")
    return ranks.pop() if ranks else None


def _rank_from_path(p: Path, root: Path) -> int | None:
    try:
        parts = p.relative_to(root).parts
    except ValueError:
        parts = (p.name,)
    for part in reversed(parts or (p.name,)):
        if m := _RANK_RE.search(part):
            return int(m.group(1))
    return None


def _check_overlap(root: Path, ranks: dict[int, RankTimeline]) -> None:
    spans = {}
    for r, t in ranks.items():
        lo = [int(a.min()) for a in (t.device[:, 0], t.ranges[:, 0]) if len(a)]
        hi = [int(a.max()) for a in (t.device[:, 1], t.ranges[:, 1]) if len(a)]
        if lo:
            spans[r] = (min(lo), max(hi))
    if len(spans) > 1 and max(s for s, _ in spans.values()) >= min(e for _, e in spans.values()):
        listed = "; ".join(f"rank {r} ({ranks[r].source}) [{s}, {e}) ns"
                           for r, (s, e) in sorted(spans.items()))
        raise TraceError(root, "the ranks' time ranges do not overlap, so they cannot be one "
                         f"run on one clock: {listed}")


# -- parsing, one file per call (in a worker process when parallel) --------------------------

def _parse_all(fmt: str, sources: list[Path], *, cache: bool,
               workers: int | None) -> list[_Parsed]:
    """Cached parses first, then the rest, in worker processes when that pays."""
    stats = [_stat(s) for s in sources]
    found = [_read_cache(s, st) if cache else None for s, st in zip(sources, stats, strict=True)]
    todo = [i for i, f in enumerate(found) if f is None]
    jobs = ([fmt] * len(todo), [sources[i] for i in todo])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = workers if workers is not None else min(len(todo), cpus or 1)
    small = sum(stats[i].st_size for i in todo) < _PARALLEL_MIN_BYTES
    if n <= 1 or len(todo) <= 1 or (workers is None and small):
        parsed = list(map(_parse_file, *jobs))
    else:
        # fork is cheapest but unsafe in a process with threads (a notebook kernel has some)
        method = "fork" if (threading.active_count() == 1 and "fork" in
                            multiprocessing.get_all_start_methods()) else "spawn"
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(method)) as pool:
            parsed = list(pool.map(_parse_file, *jobs))
    for i, p in zip(todo, parsed, strict=True):
        found[i] = p
        if cache:
            _write_cache(sources[i], stats[i], p)
    return found  # type: ignore[return-value]


def _stat(source: Path) -> os.stat_result:
    try:
        return source.stat()
    except OSError as exc:
        raise TraceError(source, f"cannot read: {exc.strerror or exc}") from None


def _parse_file(fmt: str, source: Path) -> _Parsed:
    data = _read_bytes(source)
    try:
        return _parse_kineto(source, data) if fmt == "kineto" else _parse_ascend(source, data)
    except RecursionError:  # msgspec's nesting limit
        raise TraceError(source, "invalid JSON: nested too deeply to decode") from None
    except msgspec.DecodeError as exc:  # a raw field decoded late (names, metadata args)
        raise TraceError(source, f"invalid JSON: {exc}") from None


def _read_bytes(source: Path) -> bytes:
    try:
        data = source.read_bytes()
        return gzip.decompress(data) if source.name.endswith(".gz") else data
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(source, f"cannot read: {exc}") from None


def _decode(source: Path, data: bytes, typ: Any, *, exact: bool) -> Any:
    """Decode `data`. Malformed JSON raises TraceError; so does a shape that even the exact
    (any-type) decoder rejects. A type mismatch on the fast path raises ValidationError."""
    try:
        return msgspec.json.Decoder(typ, float_hook=str if exact else None).decode(data)
    except msgspec.ValidationError as exc:
        if not exact:
            raise
        raise TraceError(source, f"not a trace of the expected shape: {exc}") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceError(source, "truncated JSON (the file ends early)", len(data)) from None
        m = re.search(r"\(byte (\d+)\)", text)
        msg = text.replace(m.group(0), "").strip() if m else text
        if m and source.name.endswith(".gz"):
            msg += " (the byte counts the decompressed JSON)"
        raise TraceError(source, f"invalid JSON: {msg}", int(m.group(1)) if m else None) from None


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


_GET_CAT, _GET_TS, _GET_DUR = (operator.attrgetter(a) for a in ("cat", "ts", "dur"))


def _parse_kineto(source: Path, data: bytes) -> _Parsed:
    try:  # fast path: every field of the expected type, times small enough for float64
        doc = _decode(source, data, _KTrace | list[_FastEvent], exact=False)
        events = _events_of(source, doc)
        kinds = _category_kinds(map(_GET_CAT, events), len(events))
        idx = np.flatnonzero(kinds)
        ts, dur = _floats_at(events, idx, _GET_TS), _floats_at(events, idx, _GET_DUR)
        if np.nanmax(np.abs(np.concatenate((ts, dur))), initial=0.0) < _EXACT_FLOAT_US:
            ts_ns, ts_ok = _floats_to_ns(ts)
            dur_ns, dur_ok = _floats_to_ns(dur)
            return _finish(source, doc, kinds[idx], ts_ns, dur_ns, ts_ok & dur_ok,
                           lambda h: _raw_names([events[i] for i in idx[h].tolist()]))
    except msgspec.ValidationError:
        pass
    # exact path: any field types; every float literal kept as its decimal text
    doc = _decode(source, data, _AnyTrace | list[_AnyEvent], exact=True)
    events = _events_of(source, doc)
    kinds = _category_kinds((e.cat if type(e.cat) is str and e.ph == "X" else ""
                             for e in events), len(events))
    sel = _take(events, np.flatnonzero(kinds))
    ts_ns, ts_ok = _us_to_ns([e.ts for e in sel])
    dur_ns, dur_ok = _us_to_ns([e.dur for e in sel])
    return _finish(source, doc, kinds[kinds > 0], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: _any_names([sel[i] for i in h.tolist()]))


def _floats_at(events: list[Any], idx: np.ndarray, get: Callable[[Any], float]) -> np.ndarray:
    """A float attribute of ``events[idx]``; one pass over every event when most are wanted."""
    if 2 * len(idx) > len(events):
        return np.fromiter(map(get, events), np.float64, len(events))[idx]
    return np.fromiter(map(get, [events[i] for i in idx.tolist()]), np.float64, len(idx))


def _raw_names(events: list[Any]) -> list[str]:
    """Names of fast-path events: their raw JSON decoded in one call."""
    text = b"[" + b",".join(e.name if len(e.name) else b'""' for e in events) + b"]"
    try:
        return msgspec.json.decode(text, type=list[str])
    except msgspec.ValidationError:
        return _any_names([_Named(v) for v in msgspec.json.decode(text)])


class _Named(msgspec.Struct):
    name: Any


def _any_names(events: list[Any]) -> list[str]:
    return [n if type(n) is str else "" if n is None else str(n) for n in (e.name for e in events)]


def _events_of(source: Path, doc: Any) -> list[Any]:
    """The event list of a JSON Object Format document, or the document if it is an array."""
    if isinstance(doc, list):
        return doc
    if doc.traceEvents is None:
        raise TraceError(source, "no traceEvents: not a trace")
    return doc.traceEvents


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


def _finish(source: Path, doc: Any, kinds: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray,
            ok: np.ndarray, names_of: Callable[[np.ndarray], list[str]]) -> _Parsed:
    """Timeline of the selected events (`kinds` 1 device, 2 host) of a decoded document;
    `names_of` gives the names of selected events at some positions."""
    base = getattr(doc, "baseTimeNanoseconds", None)
    info = getattr(doc, "distributedInfo", None)
    rank = info.get("rank") if isinstance(info, dict) else None
    if base is not None:
        if isinstance(base, str) and base.isascii() and base.isdigit() and len(base) < 20:
            base = int(base)
        if type(base) is not int or not -_LIMIT_NS < base < _LIMIT_NS:
            raise TraceError(source, "baseTimeNanoseconds must be an integer of magnitude "
                             f"below 2**62, not {reprlib.repr(base)}")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise TraceError(source, f"distributedInfo.rank must be a non-negative integer, "
                         f"not {reprlib.repr(rank)}")
    # times out of range are rejected, before any sum could wrap around int64
    ok &= (np.abs(ts_ns) < _LIMIT_NS) & (dur_ns >= 0) & (dur_ns < _LIMIT_NS)
    ts_ns, dur_ns = np.where(ok, ts_ns, 0) + (base or 0), np.where(ok, dur_ns, 0)
    ok &= np.abs(ts_ns) < _LIMIT_NS
    dev, host = ok & (kinds == 1), ok & (kinds == 2)
    device = np.column_stack((ts_ns[dev], ts_ns[dev] + dur_ns[dev]))
    device = device[np.argsort(device[:, 0], kind="stable")]
    hidx = np.flatnonzero(host)
    hidx = hidx[np.argsort(ts_ns[hidx], kind="stable")]
    ranges = np.column_stack((ts_ns[hidx], ts_ns[hidx] + dur_ns[hidx]))
    distinct: dict[str, str] = {}  # one str object per distinct name
    names = [distinct.setdefault(n, n) for n in names_of(hidx)]
    return _Parsed(rank, device, ranges, _object_array(names), int((~ok).sum()))


def _object_array(items: list[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _floats_to_ns(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.abs(us) < _LIMIT_NS / 1000  # NaN, inf or out of range: no int64 to cast to
    return np.rint(np.where(ok, us, 0.0) * 1000).astype(np.int64), ok


def _us_to_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond values (int, float or decimal text) to int64 ns, and which were numbers."""
    convert = {int: _ints_to_ns, float: _float_list_to_ns, str: _decimal_text_to_ns}
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


def _decimal_text_to_ns(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
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
    parsed = [_decimal_us_to_ns(v) for v in values]
    return (np.array([0 if v is None else v for v in parsed], np.int64),
            np.array([v is not None for v in parsed], bool))


def _decimal_us_to_ns(text: str) -> int | None:
    try:
        us = Decimal(text)
    except InvalidOperation:
        return None
    if not us.is_finite() or us.adjusted() > 18:  # |us| >= 1e19: out of range anyway
        return None
    # us * 1000 must not round before the rounding to ns: 28 digits (the default context)
    # hold 24 characters' worth; longer text gets a context with room for every digit
    scaled = us * 1000 if len(text) <= 24 else Context(prec=len(text) + 4).multiply(us, 1000)
    ns = int(scaled.to_integral_value(rounding=ROUND_HALF_UP))
    return ns if abs(ns) < 2**63 else None


class _AscendX(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    ts: str | int | None = None  # torch-npu writes decimal text; a float goes the exact path
    dur: float = math.nan


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


_GET_PID = operator.attrgetter("pid")


def _parse_ascend(source: Path, data: bytes) -> _Parsed:
    try:  # fast path: the types torch-npu writes
        doc = _decode(source, data, _AscendTrace | list[_AscendEvent], exact=False)
        events = _events_of(source, doc)
        metas = [(e.process, e.args) for e in events
                 if type(e) is _AscendMeta and e.name == "process_name"]
        pids = list(map(_GET_PID, events))
        names_of = _raw_names
    except msgspec.ValidationError:  # exact path: any types, numbers kept as decimal text
        doc = _decode(source, data, _AnyTrace | list[_AnyEvent], exact=True)
        events = _events_of(source, doc)
        metas = [(e.pid, e.args) for e in events if e.ph == "M" and e.name == "process_name"]
        pids = [e.pid if e.ph == "X" and type(e.pid) in (int, str) else None for e in events]
        names_of = _any_names
    process: dict[Any, Any] = {}
    for pid, raw in metas:
        args = msgspec.json.decode(raw) if len(raw) else None  # invalid UTF-8: TraceError
        if isinstance(args, dict) and type(pid) in (int, str):
            name = args.get("name")
            process[pid] = name if type(name) is str else None  # a list or dict: no name
    lut = {p: 0 if p is None else 1 if process.get(p) == ASCEND_DEVICE_PROCESS else
           0 if process.get(p) in ASCEND_DERIVED_PROCESSES else 2 for p in set(pids)}
    kinds = np.fromiter(map(lut.__getitem__, pids), np.int8, len(pids))
    sel = _take(events, np.flatnonzero(kinds))
    ts_ns, ts_ok = _us_to_ns([e.ts for e in sel])
    dur_ns, dur_ok = _us_to_ns([e.dur for e in sel])
    # times are absolute: no Kineto baseTimeNanoseconds (or distributedInfo) applies
    return _finish(source, None, kinds[kinds > 0], ts_ns, dur_ns, ts_ok & dur_ok,
                   lambda h: names_of([sel[i] for i in h.tolist()]))


# -- Parquet cache -----------------------------------------------------------------------------

def _cache_path(source: Path) -> Path:
    return source.parent / CACHE_DIR / f"{source.name}.parquet"


def _cache_key(stat: os.stat_result) -> dict[str, int]:
    return {"version": _CACHE_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _read_cache(source: Path, stat: os.stat_result) -> _Parsed | None:
    """The cached parse of `source` if it matches the file as it is now, else None."""
    path = _cache_path(source)
    if not path.is_file():
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        meta = json.loads(file.schema_arrow.metadata[b"residency"])
        if {k: meta.get(k) for k in _cache_key(stat)} != _cache_key(stat):
            return None
        table = file.read().unify_dictionaries().combine_chunks()
        rows = np.column_stack([_ints(table[c].chunk(0)) if table[c].num_chunks else
                                np.empty(0, np.int64) for c in ("start_ns", "end_ns")])
        ndev = int(meta["device_rows"])
        names = np.empty(0, object)
        if len(rows) > ndev:  # range rows follow device rows and all have a name
            col = table["name"].chunk(0)
            names = _object_array(col.dictionary.to_pylist())[_ints(col.indices[ndev:])]
        rank = meta.get("rank")
        return _Parsed(rank if type(rank) is int else None, rows[:ndev], rows[ndev:], names,
                       int(meta["rejected"]))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            pa.ArrowException):
        return None  # an unusable cache is parsed anew and overwritten


def _ints(arr: Any) -> np.ndarray:
    """A null-free Arrow integer array as a numpy view (pyarrow's to_numpy imports pandas)."""
    if arr.null_count:
        raise ValueError("unexpected nulls in a cached column")
    width = arr.type.bit_width // 8
    return np.frombuffer(arr.buffers()[1], dtype=f"<i{width}", count=len(arr),
                         offset=arr.offset * width)


def _write_cache(source: Path, stat: os.stat_result, p: _Parsed) -> None:
    """Write the parse of `source` beside it: device rows, then named range rows. A failure
    (read-only folder, full disk...) is ignored."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _cache_path(source)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        encoded = pa.array(p.names.tolist(), pa.string()).dictionary_encode()
        codes = np.concatenate((np.full(len(p.device), -1, np.int32),
                                _ints(encoded.indices)))
        names = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0),
                                               encoded.dictionary)
        rows = np.concatenate((p.device, p.ranges)).reshape(-1, 2)
        table = pa.table({"start_ns": rows[:, 0], "end_ns": rows[:, 1], "name": names})
        table = table.replace_schema_metadata({"residency": json.dumps(
            {**_cache_key(stat), "device_rows": len(p.device), "rank": p.rank,
             "rejected": p.rejected})})
        path.parent.mkdir(exist_ok=True)
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
