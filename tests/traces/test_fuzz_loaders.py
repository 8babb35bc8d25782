"""Fuzzing the trace loaders (issue 9, item 1).

Property: every input either *analyses* -- `load_traces` and `idle_summary` succeed, every
figure is an int of nanoseconds inside the window, and every event the loader selects is either
used with its exact value or counted in `rejected_events` (never silently used, never silently
dropped) -- or raises `TraceError` naming the file. Nothing else (no KeyError, TypeError,
RecursionError, OverflowError, decimal.Overflow, ..., nor a stray warning) and no hang.

Inputs:
* generated Kineto documents (plain and gzip) and torch-npu ``*_ascend_pt`` trees whose fields
  take every type (int, float, "us.nnn" text, null, lists, objects, huge and negative numbers,
  NaN/Infinity tokens, missing keys), judged against an independent reference model of what each
  event is worth (exact decimal arithmetic with `fractions.Fraction`);
* the same times written as JSON numbers (the typed float64 path) and as JSON strings (the
  decimal-text path): both must give the times the text says, to the nanosecond;
* the real fixtures under ``tests/data/traces/`` mutated byte-wise (truncated, bytes flipped,
  ranges deleted, inserted or duplicated), in the JSON and, for ``.gz``, in the compressed bytes;
* the real fixtures with one time field swapped to another type: a bad value (negative dur,
  non-numeric ts, ...) must remove exactly that event and count it; the same number written as
  another JSON type must change nothing.

``tests/data/fuzz/`` keeps the cases fuzzing found; its ``expected.json`` says what each must give
(the regression tests) and the CLI replays a few. Reproducible: hypothesis derandomized, no
example database. Hangs: each analysis runs in a thread joined with a generous timeout (a hang
detector, not a timing assertion). Set ``RESIDENCY_FUZZ_SAVE=DIR`` to keep failing inputs there.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.analysis.idle import IdleSummary, idle_summary
from residency.traces.load import (
    DEVICE_CATEGORIES,
    HOST_CATEGORIES,
    TraceError,
    TraceNote,
    TraceSet,
    load_traces,
)
from tests.helpers import ROOT

TRACES = ROOT / "tests" / "data" / "traces"
CORPUS = ROOT / "tests" / "data" / "fuzz"
HANG_S = 30.0  # only detects a hang; a healthy example takes milliseconds
BASE = 1_764_500_000_000_000_000
EPOCH_US = 1_764_500_000_000_000
SURE_NS = 4 * 10**18  # times (ns) this small must be representable: a valid event is used
INT64 = 2**63  # times outside [-INT64, INT64) cannot be represented: such an event is rejected

FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- running one analysis: bounded in time, classified ----------------------------------------

@dataclass
class Outcome:
    """What one input gave: a trace set (and its summary, None when no rank has a device
    task), or the TraceError."""

    traces: TraceSet | None = None
    summary: IdleSummary | None = None
    error: TraceError | None = None


def run_bounded(fn: Callable[[], Any]) -> Any:
    """`fn()` in a thread joined after HANG_S; its exception, if any, re-raised here. The only
    warning it may give is the loader's "rank N ... has no device tasks" (a RuntimeWarning from
    numpy, say, would reach the CLI's stderr)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.start()
        worker.join(HANG_S)
    if worker.is_alive():
        pytest.fail(f"hang: still analysing after {HANG_S:.0f} s")
    if "error" in box:
        raise box["error"]
    # generated tasks have no type and torch-npu ones small times
    expected = ("has no device tasks", "were counted busy", "timestamps are relative",
                "but its path names rank",  # fuzzed ranks in rank0.json
                "distributedInfo.world_size is", "different world sizes")  # a rank skipped
    stray = [f"{w.category.__name__}: {w.message}" for w in caught
             if not (w.category is UserWarning and any(e in str(w.message) for e in expected))
             and w.category is not TraceNote]  # notes: a file skipped, a lone file's rank 0
    assert not stray, f"stray warnings: {stray}"
    return box["value"]


def analyse(path: Path, *, cache: bool = True) -> Outcome:
    """Load `path` and summarise it. TraceError is an outcome; so is idle_summary's documented
    ValueError when no rank has a device task (no default window). Anything else propagates."""
    def work() -> Outcome:
        try:
            traces = load_traces(path, cache=cache)
        except TraceError as exc:
            return Outcome(error=exc)
        try:
            return Outcome(traces, idle_summary(traces))
        except ValueError as exc:
            if (("no rank has device tasks" in str(exc) or "no device task" in str(exc))
                    and not any(t.device_tasks for t in traces.ranks.values())):
                return Outcome(traces)
            raise
    return run_bounded(work)


def check_error(err: TraceError, *paths: Path) -> None:
    """The message names one of `paths` (the file that is wrong, or its torch-npu tree)."""
    text = str(err)
    assert str(err.path) in text
    assert any(str(p) in text for p in paths), f"{text!r} names none of {[str(p) for p in paths]}"


def union_ns(rows: Any) -> int:
    """Measure of the union of ``[start, end)`` rows, by a plain sweep (independent of
    residency.traces.intervals)."""
    total, reach = 0, None
    for s, e in sorted(map(tuple, np.asarray(rows).tolist())):
        if e <= s:
            continue
        if reach is None or s >= reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def check_analysis(out: Outcome) -> None:
    """Invariants of any successful analysis: int64 rows that end at or after they start,
    sorted; ints of ns; busy and idle inside the default window and adding up to it."""
    ts = out.traces
    assert ts is not None and ts.format in ("kineto", "ascend") and ts.ranks
    for r, t in ts.ranks.items():
        assert type(r) is int and r >= 0 and t.rank == r
        for rows in (t.device, t.ranges):
            assert rows.dtype == np.int64 and rows.ndim == 2 and rows.shape[1] == 2
            assert (rows[:, 1] >= rows[:, 0]).all(), "an interval ends before it starts"
            assert (np.diff(rows[:, 0]) >= 0).all()
        assert len(t.range_names) == len(t.ranges)
        assert all(type(n) is str for n in t.range_names.tolist())
        assert type(t.rejected_events) is int and t.rejected_events >= 0
    assert ts.rejected_events == sum(t.rejected_events for t in ts.ranks.values())
    s = out.summary
    if s is None:
        assert not any(t.device_tasks for t in ts.ranks.values())
        return
    figures = [*s.window_ns, s.window_measure_ns, s.all_rank_idle_ns, s.marker_ns,
               s.marker_idle_intersection_ns, s.rejected_events]
    assert all(type(v) is int for v in figures)
    lo, hi = s.window_ns
    rows = [t.device for t in ts.ranks.values() if len(t.device)]
    assert lo == min(int(d[:, 0].min()) for d in rows)
    assert hi == max(int(d[:, 1].max()) for d in rows)
    assert s.window_measure_ns == hi - lo >= 0
    assert s.all_rank_idle_ns == hi - lo - union_ns(np.concatenate(rows))
    assert 0 <= s.all_rank_idle_ns <= s.window_measure_ns
    assert s.rejected_events == ts.rejected_events and s.ranks == tuple(ts.ranks)
    for row in s.per_rank:
        busy = union_ns(ts.ranks[row.rank].device)
        assert all(type(v) is int for v in (row.busy_ns, row.idle_ns, row.span_idle_ns))
        assert (row.busy_ns, row.idle_ns) == (busy, hi - lo - busy)
        assert 0 <= row.busy_ns <= s.window_measure_ns and row.idle_ns >= s.all_rank_idle_ns
        assert row.device_tasks == ts.ranks[row.rank].device_tasks and row.span_idle_ns >= 0


def same_traces(a: TraceSet, b: TraceSet) -> None:
    assert a.format == b.format and list(a.ranks) == list(b.ranks)
    for r in a.ranks:
        x, y = a.ranks[r], b.ranks[r]
        assert np.array_equal(x.device, y.device) and np.array_equal(x.ranges, y.ranges)
        assert x.range_names.tolist() == y.range_names.tolist()
        assert x.rejected_events == y.rejected_events


def analyse_twice(path: Path) -> Outcome:
    """Analyse `path` writing the Parquet cache, then again reading it: the same result."""
    first = analyse(path)
    if first.error is None:
        check_analysis(first)
        again = analyse(path)
        assert again.error is None, f"the cached parse failed: {again.error}"
        same_traces(first.traces, again.traces)
    return first


_saved = itertools.count()


@contextmanager
def workdir(label: str) -> Iterator[Path]:
    """A fresh directory per example; kept under $RESIDENCY_FUZZ_SAVE when the example fails."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        try:
            yield Path(d)
        except BaseException:
            if save := os.environ.get("RESIDENCY_FUZZ_SAVE"):
                dest = Path(save) / f"{label}-{os.getpid()}-{next(_saved):04d}"
                shutil.copytree(d, dest, ignore=shutil.ignore_patterns("residency.parquet.cache"))
            raise


# -- generated JSON values and what they are worth -------------------------------------------

class Raw(str):
    """JSON text spliced in as is (NaN, Infinity, 1e400, deep nesting...)."""


MISSING = Raw("")  # a key left out of its object


def to_json(v: Any) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{to_json(x)}" for k, x in v.items()
                              if x is not MISSING) + "}"
    if isinstance(v, list):
        return "[" + ",".join(map(to_json, v)) + "]"
    return json.dumps(v)


def round_ns(us: Fraction) -> int:
    """Microseconds to the nearest ns, ties away from zero (the loader's documented rule)."""
    ns = us * 1000
    n = math.floor(abs(ns) + Fraction(1, 2))
    return n if ns >= 0 else -n


@dataclass(frozen=True)
class V:
    """A time value: its JSON, its exact worth in ns, and its status: ``num`` (a number: ns
    exact), ``approx`` (a number, ns within 1: an arbitrary float64 may round either way at a
    tie), ``bad`` (not a number: must be rejected), ``unknown`` (text the loader may or may
    not read as a number), ``fatal`` (invalid JSON: the whole file must fail)."""

    json: Any
    ns: int | None
    status: str


def num_text(text: str, json_value: Any = None, status: str = "num") -> V:
    return V(text if json_value is None else json_value, round_ns(Fraction(text)), status)


def float_value(f: float, status: str = "num") -> V:
    return num_text(repr(f), f, status)


EDGE_INTS = [0, -1, 2**53, 2**62 // 1000, 2**63 // 1000, 2**62, 2**63 - 1, 2**63, 2**64,
             10**30, -(2**63), 9_200_000_000_000_000, 9_000_000_000_000_000,
             7_500_000_000_000_000, -7_500_000_000_000_000]
EDGE_FLOATS = [1e300, -1e300, 9.2e15, 4.6e15, 7.5e15, 1e16, 5e-324, -0.0, 9.3e12,
               123456789012345.67, 4503599627370.495]
EDGE_TEXT = ["9e18", "9.3e15", "4611686018427387.904", "-4611686018427387.904", "0.0005",
             "-0.0005", "1764500000000100.2514999999999999999999999",
             "0.0004999999999999999999999999999", "1" + "0" * 30, "-0", "000123.4560"]
HUGE_TEXT = ["1e999999", "1e999999999", "-1E+1000000", "9" * 400, "1e400"]  # far out of range
BAD_TEXT = ["", "soon", "1,5", "0x10", "NaN", "nan", "Infinity", "-inf", "sNaN", "--1", "1.2.3",
            "1e", ".", "1e5.5"]
ODD_TEXT = [" 12 ", "1_000", "\u0661\u0662", "\u00b2", "+5", "5.", "\u221e"]  # Decimal's call
BAD_TYPES = [None, True, False, [], [1], {"us": 1}, MISSING]

raw_numbers = st.sampled_from([
    V(Raw("NaN"), None, "fatal"), V(Raw("Infinity"), None, "fatal"),
    V(Raw("-Infinity"), None, "fatal"), V(Raw("1e400"), None, "bad"),
    V(Raw("-1e400"), None, "bad"), num_text("-0", Raw("-0")), num_text("1E+2", Raw("1E+2")),
    num_text("0.1e-2", Raw("0.1e-2")), num_text("120.5005", Raw("120.5005"), "approx")])

times = st.one_of(
    st.integers(-(10**6), 10**10).map(lambda i: num_text(str(i), i)),
    st.integers(EPOCH_US - 10**6, EPOCH_US + 10**6).map(lambda i: num_text(str(i), i)),
    st.sampled_from(EDGE_INTS).map(lambda i: num_text(str(i), i)),
    st.integers(-(10**15), 4 * 10**18).map(lambda k: float_value(k / 1000)),
    st.sampled_from(EDGE_FLOATS).map(float_value),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: float_value(f, "approx")),
    st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,2})?", fullmatch=True)
    .map(num_text),
    st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 999))
    .map(lambda p: num_text(f"{EPOCH_US + p[0]}.{p[1]:03d}")),
    st.sampled_from(EDGE_TEXT).map(num_text),
    st.sampled_from(HUGE_TEXT).map(lambda t: V(t, None, "bad")),
    st.sampled_from(BAD_TEXT + BAD_TYPES).map(lambda t: V(t, None, "bad")),
    (st.sampled_from(ODD_TEXT) | st.text(max_size=6)).map(lambda t: V(t, None, "unknown")),
    raw_numbers,
)


NO_TIME = V(MISSING, None, "bad")


# only what the loader's typed fast path accepts (JSON numbers), so that path is fuzzed too
fast_times = st.one_of(
    st.integers(-(10**6), 10**10).map(lambda i: num_text(str(i), i)),
    st.sampled_from(EDGE_INTS).map(lambda i: num_text(str(i), i)),
    st.integers(-(10**9), 10**9).map(lambda k: float_value(k / 1000)),
    st.integers(-(10**15), 4 * 10**18).map(lambda k: float_value(k / 1000)),
    st.floats(4.6e12, 4e15).map(float_value),  # days to decades: float64 no longer resolves 1 ns
    st.sampled_from(EDGE_FLOATS).map(float_value),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: float_value(f, "approx")),
    st.just(V(MISSING, None, "bad")))
# small start times keep a document on the fast path (float64 microseconds below 2**52 / 1000)
fast_small = st.one_of(
    st.integers(-(10**6), 10**10).map(lambda i: num_text(str(i), i)),
    st.integers(-(10**9), 10**9).map(lambda k: float_value(k / 1000)),
    st.floats(-1e9, 1e9).map(lambda f: float_value(f, "approx")),
    st.just(V(MISSING, None, "bad")))


def deep(depth: int) -> Raw:
    return Raw("[" * depth + "]" * depth)


NAMES = st.one_of(st.text(max_size=6), st.sampled_from(
    [None, MISSING, 5, True, [1, "a"], {"k": "v"}, "residency.release[normal]", "caf\u00e9"]))
IDS = st.sampled_from([0, 1, "0", None, [1], MISSING, 2**70, -3])
# args and other skipped fields; now and then nested deeper than a decoder's recursion limit
EXTRA = st.integers(0, 15).flatmap(lambda i: st.sampled_from([2, 64, 5000]).map(deep) if i == 0 else
                                   st.sampled_from([MISSING, {"note": "args are skipped"},
                                                    [1, {"a": [None, 2.5]}], "x"]))


def expected_name(name: Any) -> str:
    if name is None or name is MISSING:
        return ""
    return name if isinstance(name, str) else str(name)


# -- the reference model ----------------------------------------------------------------------

@dataclass
class Expect:
    """What a generated input must give. `doc`: ``load`` (must analyse), ``fail`` (must raise
    TraceError) or ``either``. Per kind (1 device, 2 host): intervals that must be there
    (`must`), that may be there (`may`), and how many more of unknown value may be (`loose`) or
    must be (`loose_must`); `bad` events must be rejected."""

    doc: str = "load"
    rank: int | None = None
    must: dict[int, list] = field(default_factory=lambda: {1: [], 2: []})
    may: dict[int, list] = field(default_factory=lambda: {1: [], 2: []})
    loose: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0})
    loose_must: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0})
    bad: int = 0

    def worst(self, status: str) -> None:
        order = ["load", "either", "fail"]
        self.doc = max(self.doc, status, key=order.index)

    def event(self, kind: int, ts: V, dur: V, name: Any, base: int) -> None:
        for v in (ts, dur):
            if v.status == "fatal":
                self.worst("fail")
        if "fatal" in (ts.status, dur.status) or not kind:
            return
        if "bad" in (ts.status, dur.status):
            self.bad += 1
            return
        if "unknown" in (ts.status, dur.status):
            self.loose[kind] += 1
            return
        slack = 1 if "approx" in (ts.status, dur.status) else 0
        start, d = base + ts.ns, dur.ns
        values = (ts.ns, start, start + d, d)
        if d + slack < 0 or any(v - slack >= INT64 or v + slack < -INT64 for v in values):
            self.bad += 1  # negative duration, or a time no int64 holds: never used
        elif d - slack >= 0 and max(map(abs, values)) + slack <= SURE_NS:
            if slack:
                self.loose_must[kind] += 1
            else:
                self.must[kind].append((start, start + d, expected_name(name)))
        elif slack:
            self.loose[kind] += 1
        else:
            self.may[kind].append((start, start + d, expected_name(name)))

    def check(self, out: Outcome, path: Path, *names: Path) -> None:
        if out.error is not None:
            assert self.doc != "load", f"a valid input was refused: {out.error}"
            check_error(out.error, path, *names)
            return
        assert self.doc != "fail", "an input that must fail was analysed"
        check_analysis(out)
        (t,) = out.traces.ranks.values()
        if self.rank is not None:
            assert t.rank == self.rank
        used = 0
        for kind, rows, names in ((1, t.device, None), (2, t.ranges, t.range_names.tolist())):
            def tally(items: Any, kind: int = kind) -> Counter:
                return Counter((s, e, n if kind == 2 else "") for s, e, n in items)

            got = tally((s, e, names[i] if names else "") for i, (s, e) in enumerate(rows.tolist()))
            missing = tally(self.must[kind]) - got
            assert not missing, (f"valid {'device' if kind == 1 else 'host'} events lost or "
                                 f"altered: {sorted(missing)[:3]}; got {sorted(got)[:6]}")
            extra = got - tally(self.must[kind]) - tally(self.may[kind])
            assert sum(extra.values()) <= self.loose[kind] + self.loose_must[kind], (
                f"events used with values no input has: {sorted(extra)[:3]}")
            assert len(rows) >= len(self.must[kind]) + self.loose_must[kind]
            used += len(rows)
        selected = sum(len(self.must[k]) + len(self.may[k]) + self.loose[k] + self.loose_must[k]
                       for k in (1, 2)) + self.bad
        assert used + t.rejected_events == selected, "events neither used nor counted"
        assert t.rejected_events >= self.bad, "a bad event was used"


CATEGORIES = ["kernel", "Kernel", "KERNEL", "gpu_memcpy", "GPU_MEMSET", "Memcpy", "Memset",
              "cuda_sync", "gpu_user_annotation", "user_annotation", "cpu_op",
              "python_function", "operator", "cuda_runtime", "", None, 1, ["kernel"],
              {"k": 1}, MISSING]
PHASES = ["X"] * 8 + ["B", "E", "i", "M", "C", "Z", "x", "", None, 1, ["X"], MISSING]


def kineto_kind(ph: Any, cat: Any) -> int:
    if not (type(ph) is str and ph == "X" and type(cat) is str):
        return 0
    low = cat.lower()
    return 1 if low in DEVICE_CATEGORIES else 2 if low in HOST_CATEGORIES else 0


@st.composite
def kineto_events(draw: st.DrawFn, fast: bool) -> dict:
    if fast:  # field types of the typed fast path
        ph, cat = ["X"] * 6 + ["B", "E", "i", "M", "C"], [c for c in CATEGORIES if type(c) is str]
    else:
        ph, cat = PHASES, CATEGORIES
    event = {"ph": draw(st.sampled_from(ph)), "cat": draw(st.sampled_from(cat)),
             "name": draw(NAMES), "pid": draw(IDS), "tid": draw(IDS),
             "ts": draw((fast_small | fast_times) if fast else times),
             "dur": draw(fast_times if fast else times)}
    if draw(st.booleans()):
        event["args"] = draw(EXTRA)
    return event


BASES = [V(MISSING, 0, "num"), V(None, 0, "num"), V(BASE, BASE, "num"), V(0, 0, "num"),
         V(-(10**9), -(10**9), "num"), V(str(BASE), BASE, "num"), V(2**62 - 1, 2**62 - 1, "edge"),
         V(2**63 - 1, 2**63 - 1, "edge"), V(-(2**63), -(2**63), "edge"), V(2**63, None, "bad"),
         V(10**30, None, "bad"), V(-(9 * 10**20), None, "bad"), V("9" * 30, None, "bad"),
         V("\u00b2", None, "bad"), V("\u0661", None, "bad"), V("-5", None, "bad"),
         V(1.7e18, None, "bad"), V(True, None, "bad"), V([1], None, "bad"),
         V(Raw("NaN"), None, "bad")]
ODD_SHAPES = ["no events", "null events", "number events", "non-object event"]
RANKS = [MISSING, {"rank": 0}, {"rank": 3}, {"rank": None}, {"backend": "gloo"}, [3], None,
         {"rank": -1}, {"rank": "3"}, {"rank": True}, {"rank": 1.0}, {"rank": 10**30}]


@st.composite
def kineto_docs(draw: st.DrawFn) -> tuple[str, Expect]:
    """A Kineto document's text and what it must give (as rank0.json[.gz])."""
    events = draw(st.lists(kineto_events(draw(st.booleans())), max_size=12))
    expect = Expect(rank=0)
    odd = draw(st.integers(0, 2)) == 0  # a third of the documents get odd top-level fields
    shape = draw(st.sampled_from(["object", "object", "array"] + ODD_SHAPES * odd))
    if shape == "array":
        doc: Any = events
        base = 0
    else:
        b = draw(st.sampled_from(BASES if odd else BASES[:6]))
        info = draw(st.sampled_from(RANKS if odd else RANKS[:6]))
        doc = {"schemaVersion": 1, "distributedInfo": info, "baseTimeNanoseconds": b.json,
               "traceEvents": events}
        if draw(st.booleans()):
            doc["deviceProperties"] = draw(EXTRA)
        base = b.ns or 0
        if b.status == "bad":
            expect.worst("fail")
        elif b.status == "edge":  # representable, but leaves little room: may be refused
            expect.worst("either")
        rank = info.get("rank") if isinstance(info, dict) else None
        if rank is not None:
            if type(rank) is not int or rank < 0:
                expect.worst("fail")
            elif rank >= INT64:
                expect.worst("either")
            expect.rank = rank
        if shape == "no events":
            del doc["traceEvents"]
            expect.worst("fail")
        elif shape == "null events":
            doc["traceEvents"] = None
            expect.worst("fail")
        elif shape == "number events":
            doc["traceEvents"] = 5
            expect.worst("fail")
        elif shape == "non-object event":
            events.insert(draw(st.integers(0, len(events))), draw(st.sampled_from([1, "x", None,
                                                                                  []])))
            expect.worst("fail")
    for e in events:
        if not isinstance(e, dict):
            continue
        expect.event(kineto_kind(e["ph"], e["cat"]), e["ts"], e["dur"], e["name"], base)
        if isinstance(e.get("args"), Raw) and e["args"].startswith("["):
            expect.worst("either")  # deep nesting: a decoder may refuse it (with a TraceError)
    if isinstance(doc, dict) and isinstance(doc.get("deviceProperties"), Raw):
        expect.worst("either")
    text = to_json(_values(doc))
    return text, expect


def _values(doc: Any) -> Any:
    """The document with each V replaced by its JSON."""
    if isinstance(doc, V):
        return doc.json
    if isinstance(doc, dict):
        return {k: _values(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_values(v) for v in doc]
    return doc


@settings(FUZZ, max_examples=250)
@given(kineto_docs(), st.booleans())
def test_generated_kineto_documents(case, gz):
    text, expect = case
    with workdir("kineto") as d:
        path = d / ("rank0.json.gz" if gz else "rank0.json")
        path.write_bytes(gzip.compress(text.encode(), mtime=0) if gz else text.encode())
        expect.check(analyse_twice(path), path)


@settings(FUZZ, max_examples=60)
@given(st.lists(st.tuples(st.integers(-(10**9), 10**9), st.integers(0, 4 * 10**18)),
                min_size=1, max_size=8), st.sampled_from([None, 0, BASE]))
def test_numbers_and_their_text_give_the_same_times(pairs, base):
    """The same times as JSON numbers (the typed float64 path, when it can be exact) and as
    JSON strings (the decimal path): identical, and as the text says, to the nanosecond."""
    floats = [(ts / 1000, dur / 1000) for ts, dur in pairs]
    want = sorted(((base or 0) + round_ns(Fraction(repr(t))),
                   (base or 0) + round_ns(Fraction(repr(t))) + round_ns(Fraction(repr(u))))
                  for t, u in floats)
    with workdir("paths") as d:
        got = []
        for form in (lambda v: v, repr):
            events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": form(t), "dur": form(u)}
                      for t, u in floats]
            doc = {"traceEvents": events} | ({} if base is None else {"baseTimeNanoseconds": base})
            path = d / ("text" if form is repr else "numbers") / "rank0.json"
            path.parent.mkdir()
            path.write_text(json.dumps(doc))
            out = analyse(path, cache=False)
            assert out.error is None and out.traces.rejected_events == 0
            got.append(sorted(map(tuple, out.traces.ranks[0].device.tolist())))
        assert got[0] == got[1], "float64 and decimal text disagree"
        assert got[0] == want


# -- torch-npu trees --------------------------------------------------------------------------

PIDS = [1, 2, 3, "3", 4]
PROCESS_NAMES = ["Ascend Hardware", "Ascend Hardware", "Overlap Analysis", "Python", "CANN",
                 None, ["Ascend Hardware"], {"n": 1}, 5, MISSING]
ascend_times = st.one_of(
    st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 999))
    .map(lambda p: num_text(f"{EPOCH_US + p[0]}.{p[1]:03d}")),
    st.integers(EPOCH_US - 10**6, EPOCH_US + 10**6).map(lambda i: num_text(str(i), i)),
    times)


@st.composite
def ascend_events(draw: st.DrawFn) -> dict:
    if draw(st.integers(0, 3)) == 0:  # metadata
        pname = draw(st.sampled_from(PROCESS_NAMES))
        args = draw(st.sampled_from([{"name": pname}] * 4 + [{"label": "x"}, [pname], pname])
                    | EXTRA)
        return {"ph": draw(st.sampled_from(["M"] * 5 + ["X", None])),
                "name": draw(st.sampled_from(["process_name"] * 5 + ["thread_name",
                                                                     "process_sort_index", 7])),
                "pid": draw(st.sampled_from(PIDS + [True, None, [3]])), "tid": 0, "args": args}
    event = {"ph": draw(st.sampled_from(["X"] * 8 + ["B", "i", "s", "f", "Z", None, ["X"]])),
             "cat": draw(st.sampled_from(["", "kernel", None, MISSING])), "name": draw(NAMES),
             "pid": draw(st.sampled_from(PIDS * 3 + [True, None, [3], MISSING])),
             "tid": draw(IDS), "ts": draw(ascend_times), "dur": draw(times)}
    if draw(st.booleans()):
        event["args"] = draw(EXTRA)
    return event


def ascend_kinds(events: list) -> list[int]:
    """Per event: 1 device task, 2 host range, 0 neither (the brief's definitions)."""
    process: dict[Any, Any] = {}
    for e in events:
        pid, args = e.get("pid"), e.get("args")
        if (e.get("ph") == "M" and e.get("name") == "process_name"
                and type(pid) in (int, str) and isinstance(args, dict)):
            process[pid] = args.get("name")  # the last process_name of a pid wins
    kinds = []
    for e in events:
        pid = e.get("pid")
        if not (type(e.get("ph")) is str and e["ph"] == "X" and type(pid) in (int, str)):
            kinds.append(0)
            continue
        name = process.get(pid)
        kinds.append(1 if name == "Ascend Hardware" else 0 if name == "Overlap Analysis" else 2)
    return kinds


@st.composite
def ascend_trees(draw: st.DrawFn) -> tuple[str, list[str], Expect]:
    """trace_view.json text, the profiler_info files, and what the tree must give."""
    # a process table (one process_name per pid), then any events, in any order
    table = draw(st.dictionaries(st.sampled_from(PIDS), st.sampled_from(PROCESS_NAMES),
                                 max_size=4))
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
              for pid, name in table.items()] + draw(st.lists(ascend_events(), max_size=10))
    events = draw(st.permutations(events))
    expect = Expect(rank=0)
    for e, kind in zip(events, ascend_kinds(events), strict=True):
        expect.event(kind, e.get("ts", NO_TIME), e.get("dur", NO_TIME), e["name"], 0)
        if isinstance(e.get("args"), Raw) and e["args"].startswith("["):
            expect.worst("either")
    doc: Any = events
    if draw(st.booleans()):
        # torch-npu writes an array; as an object, the Kineto-only fields mean nothing here
        doc = {"traceEvents": events, **draw(st.fixed_dictionaries({}, optional={
            "baseTimeNanoseconds": st.sampled_from([BASE, "x", -1, 2**70]),
            "distributedInfo": st.sampled_from([{"rank": 5}, {"rank": -1}, "x"]),
            "displayTimeUnit": st.just("ns")}))}
    infos = draw(st.sampled_from([["profiler_info_0.json"]] * 12 + [
        [], ["profiler_info_0.json", "profiler_info_1.json"], ["profiler_info_x.json"]]))
    if infos == ["profiler_info_0.json", "profiler_info_1.json"]:
        expect.worst("fail")  # two ranks (a lone session without a rank is rank 0)
    return to_json(_values(doc)), infos, expect


@settings(FUZZ, max_examples=200)
@given(ascend_trees())
def test_generated_ascend_trees(case):
    text, infos, expect = case
    with workdir("ascend") as d:
        tree = d / "host_1_20251130010203_ascend_pt"
        (tree / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        for name in infos:
            (tree / name).write_text('{"rank_id": 0}')
        view = tree / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
        view.write_text(text)
        expect.check(analyse_twice(d), view, tree)


# -- the real fixtures, mutated byte-wise -----------------------------------------------------

FIXTURE_FILES = [
    ("kineto_basic", "rank0.trace.json"),
    ("kineto_basic", "rank1.trace.json.gz"),
    ("kineto_epoch", "trace_rank3.json"),
    ("ascend_basic", "host_100_20251130010203_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"),
    ("ascend_basic", "host_101_20251130010203_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"),
]
TOKENS = [b"NaN", b"-", b"9" * 25, b"[", b"{", b'"', b"\\", b"e999999", b"\x00", b"\xff", b"-1",
          b"[" * 2000, b'"ts": "soon", ', b"1e400", b"null"]
mutations = st.lists(st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)
              | st.sampled_from(TOKENS)),
    st.tuples(st.just("duplicate"), st.floats(0, 1), st.integers(1, 200)),
    st.tuples(st.just("digit"), st.floats(0, 1), st.sampled_from(list(b"0123456789-.eE")))),
    min_size=1, max_size=4)


def mutate(data: bytes, ops: list[tuple]) -> bytes:
    for op, where, *arg in ops:
        at = min(int(where * len(data)), max(len(data) - 1, 0))
        if op == "truncate":
            data = data[:at]
        elif op == "flip" and data:
            data = data[:at] + bytes([data[at] ^ arg[0]]) + data[at + 1:]
        elif op == "delete":
            data = data[:at] + data[at + arg[0]:]
        elif op == "insert":
            data = data[:at] + arg[0] + data[at:]
        elif op == "duplicate":
            data = data[:at] + data[at:at + arg[0]] + data[at:]
        elif op == "digit" and data:
            data = data[:at] + bytes([arg[0]]) + data[at + 1:]
    return data


_BASELINE: dict[str, TraceSet] = {}


def baseline(fixture: str) -> TraceSet:
    if fixture not in _BASELINE:
        _BASELINE[fixture] = load_traces(TRACES / fixture, cache=False)
    return _BASELINE[fixture]


@settings(FUZZ, max_examples=250)
@given(st.sampled_from(FIXTURE_FILES), st.sampled_from(["bytes", "json"]), mutations)
def test_mutated_fixture_bytes(target, layer, ops):
    fixture, rel = target
    with workdir("bytes") as d:
        root = Path(shutil.copytree(TRACES / fixture, d / fixture))
        path = root / rel
        data = path.read_bytes()
        if rel.endswith(".gz") and layer == "json":  # mutate the JSON inside, then recompress
            data = gzip.compress(mutate(gzip.decompress(data), ops), mtime=0)
        else:
            data = mutate(data, ops)
        path.write_bytes(data)
        out = analyse_twice(root)
        if out.error is not None:  # names the file (or, for torch-npu, its tree)
            check_error(out.error, path, *([path.parents[1]] if "ascend" in fixture else []))
            return
        # the other ranks' files were not touched: they load exactly as before
        before = {t.source.relative_to(TRACES / fixture): t
                  for t in baseline(fixture).ranks.values()}
        for t in out.traces.ranks.values():
            old = before.get(t.source.relative_to(root))
            if t.source != path and old is not None:
                assert np.array_equal(t.device, old.device) and t.rank == old.rank
                assert np.array_equal(t.ranges, old.ranges)
                assert t.rejected_events == old.rejected_events


# -- the real fixtures, one time field swapped to another type ---------------------------------

BAD_SWAPS = {
    "dur": st.one_of(st.integers(-(10**12), -1), st.floats(-1e12, -0.001),
                     st.sampled_from(["-5.000", "-0.001", Raw("-1e400"), None, [], {"us": 1},
                                      True, "soon", MISSING, "NaN"])),
    "ts": st.sampled_from(["soon", "", "NaN", "inf", None, [], [1], {"us": 1}, True, False,
                           MISSING, Raw("1e400"), "1e999999", "\u00b2", 10**30]),
}
SWAP_FILES = [("kineto_basic", "rank0.trace.json"),
              ("ascend_basic", FIXTURE_FILES[3][1]), ("ascend_basic", FIXTURE_FILES[4][1])]


def _events(doc: Any) -> list:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _time_text(v: Any) -> str | None:
    """The decimal text of a time as the fixture writes it, None when not a number."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    text = v if isinstance(v, str) else repr(v)
    try:
        Fraction(text)
    except ValueError:
        return None
    return text


def _selected(fixture: str, events: list) -> list[int]:
    if fixture == "ascend_basic":
        kinds = ascend_kinds(events)
    else:
        kinds = [kineto_kind(e.get("ph"), e.get("cat")) for e in events]
    return [i for i, k in enumerate(kinds) if k]


@settings(FUZZ, max_examples=120)
@given(st.sampled_from(SWAP_FILES), st.data())
def test_swapped_field_is_rejected_or_read_the_same(target, data):
    fixture, rel = target
    src = TRACES / fixture / rel
    doc = json.loads(src.read_text())
    events = _events(doc)
    base = doc.get("baseTimeNanoseconds", 0) if isinstance(doc, dict) else 0
    base = base if fixture != "ascend_basic" else 0
    usable = [i for i in _selected(fixture, events)
              if _time_text(events[i]["ts"]) and _time_text(events[i]["dur"])
              and Fraction(_time_text(events[i]["dur"])) >= 0]
    i = data.draw(st.sampled_from(usable), label="event")
    key = data.draw(st.sampled_from(["ts", "dur"]), label="field")
    e = events[i]
    start = base + round_ns(Fraction(_time_text(e["ts"])))
    interval = [start, start + round_ns(Fraction(_time_text(e["dur"])))]
    text = _time_text(e[key])
    value = Fraction(text)
    equivalents = [text]  # as JSON text, and as a number literal when it is whole ns: a
    if (value * 1000).denominator == 1:  # float64 may break a sub-ns tie either way
        equivalents.append(Raw(text))
    if value.denominator == 1:
        equivalents.append(int(value))
    bad = data.draw(st.booleans(), label="bad")
    e[key] = data.draw(BAD_SWAPS[key] if bad else st.sampled_from(equivalents), label="value")
    with workdir("swap") as d:
        root = Path(shutil.copytree(TRACES / fixture, d / fixture))
        (root / rel).write_text(to_json(doc))
        out = analyse(root, cache=False)
        assert out.error is None, f"one odd field refused the whole file: {out.error}"
        check_analysis(out)
        old = baseline(fixture)
        rank = next(r for r, t in old.ranks.items() if t.source == src)
        t, was = out.traces.ranks[rank], old.ranks[rank]
        if not bad:  # the same number as another JSON type: nothing changes
            same_traces(TraceSet(old.format, {rank: was}), TraceSet(old.format, {rank: t}))
            return
        assert t.rejected_events == was.rejected_events + 1, "the bad event was not counted"
        before = Counter(map(tuple, np.concatenate((was.device, was.ranges)).tolist()))
        after = Counter(map(tuple, np.concatenate((t.device, t.ranges)).tolist()))
        assert before - after == Counter([tuple(interval)]) and not after - before, (
            "the bad event still contributes, or another one was lost")


# -- the corpus of cases found ----------------------------------------------------------------

EXPECTED = json.loads((CORPUS / "expected.json").read_text()) if CORPUS.is_dir() else {}


def corpus_cases() -> list[str]:
    found = sorted(str(p.relative_to(CORPUS)) for fmt in ("kineto", "ascend")
                   for p in (CORPUS / fmt).iterdir()) if CORPUS.is_dir() else []
    return found


def stage(case: str, dest: Path) -> tuple[Path, Path]:
    """Copy a corpus case to `dest`: (PATH to load, the file it is about). A single Kineto
    file is loaded as ``<case>/rank0.json[.gz]``."""
    src = CORPUS / case
    if src.is_file():
        suffix = ".json.gz" if src.name.endswith(".gz") else ".json"
        path = dest / src.name.split(".")[0] / f"rank0{suffix}"
        path.parent.mkdir(parents=True)
        shutil.copyfile(src, path)
        return path, path
    root = Path(shutil.copytree(src, dest / src.name,
                                ignore=shutil.ignore_patterns("residency.parquet.cache")))
    about = EXPECTED[case].get("file")
    return root, root / about if about else root


def test_corpus_is_listed_in_expected():
    assert sorted(EXPECTED) == corpus_cases()
    assert all(EXPECTED[c].get("why") for c in EXPECTED)


@pytest.mark.parametrize("case", corpus_cases())
def test_corpus_case(tmp_path, case):
    want = EXPECTED[case]
    path, about = stage(case, tmp_path)
    out = analyse_twice(path)
    if "error" in want:
        assert out.error is not None, f"analysed, but must fail with {want['error']!r}"
        check_error(out.error, about)
        assert want["error"] in str(out.error)
        return
    assert out.error is None, f"must analyse, but: {out.error}"
    check_analysis(out)
    ts = out.traces
    if "device" in want:
        assert {str(r): t.device.tolist() for r, t in ts.ranks.items()} == want["device"]
    if "ranges" in want:
        assert {str(r): t.ranges.tolist() for r, t in ts.ranks.items()} == want["ranges"]
    if "names" in want:
        assert {str(r): t.range_names.tolist() for r, t in ts.ranks.items()} == want["names"]
    if "rejected" in want:
        assert ts.rejected_events == want["rejected"]


CLI_CASES = [c for c in EXPECTED if EXPECTED[c].get("cli")]


def test_cli_on_corpus_cases(tmp_path):
    """``residency idle PATH --json``: exit 0 with one JSON line, or 2 with one error line;
    never a traceback, no warning but "has no device tasks". Started together: each needs
    seconds."""
    assert CLI_CASES
    runs = []
    for i, case in enumerate(CLI_CASES):
        path, _ = stage(case, tmp_path / str(i))
        runs.append((case, subprocess.Popen(
            [sys.executable, "-m", "residency", "idle", str(path), "--json"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for case, proc in runs:
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and proc.returncode in (0, 2), (case, err)
        lines = err.splitlines()
        expected_warning = ("residency idle: warning: rank ", "has no device tasks; its busy "
                            "time is 0")
        typeless = ("residency idle: warning: device tasks of types not in", "(no Task Type)",
                    "timestamps are relative to the profile's start")  # generated tasks
        notes = [x for x in lines if not (x.startswith(expected_warning[0])
                                          and x.endswith(expected_warning[1]))
                 and not (x.startswith(typeless[0]) and typeless[1] in x)
                 and typeless[2] not in x]
        if proc.returncode == 0:
            assert notes == [] and isinstance(json.loads(out), dict), (case, err)
        else:
            assert len(notes) == 1 and notes[0].startswith("residency idle: error: "), (case, err)
            assert out == "" and EXPECTED[case]["error"] in notes[0]
        assert proc.returncode == (2 if "error" in EXPECTED[case] else 0), (case, err)
