"""`residency idle` folds a Kineto rank's device tasks into their busy union as the rank is
parsed (`residency.traces.intervals.Folded`), never holding their rows: the same figures to
the nanosecond as the whole-timeline path, in order or not, with the compiled reader or not,
and where a row would be dropped once ``baseTimeNanoseconds`` is added (parsed again, whole)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from residency.analysis.idle import idle_summary, idle_summary_at
from residency.analysis.idle import reduce as idle_reduce
from residency.traces import intervals as iv
from residency.traces import load
from residency.traces.columns import NotFoldable
from residency.traces.load import load_traces, parse_source
from tests.helpers import MARKER, many_ranks


def _parse(path: Path, **kw):
    return parse_source("kineto", path, root=path.parent, chunk_bytes=512, max_bytes=1 << 30,
                        device_names=False, **kw)


def test_a_parse_folds_its_device_rows_into_their_union(tmp_path, trace_reader):
    d = many_ranks(tmp_path / "t", 2)
    for path in (d / "rank0" / "trace.json", d / "rank1" / "trace.json.gz"):
        whole, folded = _parse(path), _parse(path, fold_device=True)
        f = folded.device_folded
        assert whole.device_folded is None and folded.device.shape == (0, 2)  # no rows held
        rows = whole.device
        assert f.tasks == len(rows) > 0 and folded.rejected == whole.rejected
        assert (f.first_start, f.last_end, f.first_end) == (
            rows[:, 0].min(), rows[:, 1].max(), rows[:, 1].min())
        assert np.array_equal(f.union.unpack(), iv.merge(rows))
        assert np.array_equal(folded.ranges, whole.ranges)


def _kineto(d: Path, events: list[dict], base: int, rank: int) -> None:
    (d / f"rank{rank}").mkdir(parents=True)
    doc = {"traceEvents": events, "baseTimeNanoseconds": base,
           "distributedInfo": {"rank": rank, "world_size": 2}}
    (d / f"rank{rank}" / "trace.json").write_text(json.dumps(doc))


def _events(seed: int, n: int = 600, *, shuffled: bool = False) -> list[dict]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.uniform(0.0, 3.0)
        out.append({"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7,
                    "ts": round(t, 3), "dur": round(rng.uniform(0.0, 4.0), 3)})
        if i % 97 == 0:
            out.append({"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1,
                        "name": "residency.release[normal]", "ts": round(t, 3), "dur": 9.5})
    if shuffled:  # device rows out of order: folding given up, the rows held whole
        rng.shuffle(out)
    return out


@pytest.mark.parametrize("shape", ["in order", "shuffled", "a start out of range"])
def test_folded_reductions_equal_the_whole_timeline_path(tmp_path, trace_reader, shape,
                                                         monkeypatch):
    late = shape == "a start out of range"
    base = 4_520_000_000_000_000_000 if late else 1_764_500_000_000_000_000
    d = tmp_path / "t"
    for rank in (0, 1):
        events = _events(rank, shuffled=shape == "shuffled")
        if late and rank == 1:  # a row starting beyond 2**62 ns once based: dropped
            events.append({"ph": "X", "cat": "kernel", "name": "late", "pid": 0, "tid": 7,
                           "ts": 1e14, "dur": 1.0})
        _kineto(d, events, base, rank)
    seen: dict[str, int] = {"loose": 0, "refused": 0}
    add, parse = iv.Folded.add, load.parse_source

    def spy_add(self, rows):
        add(self, rows)
        seen["loose"] += self.loose is not None

    def spy_parse(*args, **kw):
        try:
            return parse(*args, **kw)
        except NotFoldable:
            seen["refused"] += 1
            raise

    monkeypatch.setattr(iv.Folded, "add", spy_add)
    monkeypatch.setattr(load, "parse_source", spy_parse)
    whole = idle_summary(load_traces(d, cache=False), marker=MARKER)
    if shape == "a start out of range":
        assert whole.rejected_events == 1
    for kw in (dict(cache=False, workers=1), dict(cache=True, workers=1),
               dict(cache=False, workers=2), dict(cache=True, workers=2)):
        assert idle_summary_at(d, marker=MARKER, chunk_bytes=2048, **kw) == whole
    assert seen["loose"] > 0 if shape == "shuffled" else seen["loose"] == 0
    assert seen["refused"] > 0 if late else seen["refused"] == 0


def test_a_spilled_union_comes_back_once_exactly(tmp_path):
    x = iv.merge(np.array([[0, 5], [7, 9], [20, 1 << 40]], np.int64))
    s = idle_reduce.Spilled(iv.Packed(x), str(tmp_path))
    assert Path(s.path).parent == tmp_path
    assert np.array_equal(s.packed().unpack(), x) and not list(tmp_path.iterdir())


@pytest.mark.parametrize("spill_min", [0, 1 << 40])
def test_unions_come_back_through_files_or_pickles_alike(tmp_path, monkeypatch, spill_min):
    """A worker's packed union of `SPILL_MIN_BYTES` or more comes back through a file
    (`Spilled`), a smaller one pickled: the same figures either way."""
    d = tmp_path / "t"
    for rank in (0, 1):
        _kineto(d, _events(rank), 1_764_500_000_000_000_000, rank)
    whole = idle_summary(load_traces(d, cache=False), marker=MARKER)
    monkeypatch.setattr(idle_reduce, "SPILL_MIN_BYTES", spill_min)
    plan = load.plan_traces(d)
    job = dict(busy=None, marker=MARKER, window_marker=None, cache=False, chunk_bytes=2048,
               max_trace_bytes=1 << 30)
    folder = tmp_path / "spill"
    folder.mkdir()
    for i in range(len(plan.sources)):  # (what a worker hands back, made here)
        sent = idle_reduce.packed_reduction(plan, i, spill=str(folder), **job)
        assert isinstance(sent.busy, idle_reduce.Spilled) == (spill_min == 0)
        busy = (sent.busy.packed().unpack() if spill_min == 0 else
                pickle.loads(pickle.dumps(sent.busy)).unpack())
        assert np.array_equal(busy, idle_reduce.rank_reduction(plan, i, **job).busy)
    assert not list(folder.iterdir())  # (each file read back once, and removed)
    assert idle_summary_at(d, marker=MARKER, cache=False, workers=2) == whole


@pytest.mark.parametrize("workers", [1, 2])
def test_a_warm_run_measures_the_cached_unions_as_they_are_packed(tmp_path, monkeypatch,
                                                                 workers):
    """The busy unions from cache entries (and from worker processes) stay packed on the
    client: `summarize` measures them as packed (the compiled merge decodes them row by row),
    never unpacking them (40 MB a device-dense rank faulted in): the same figures."""
    if not iv.compiled():
        pytest.skip("residency.traces._intervals is not built or turned off here")
    d = many_ranks(tmp_path / "t", 3)
    cold = idle_summary_at(d, marker=MARKER, workers=workers)

    def never(*args):
        raise AssertionError("unpacked")

    monkeypatch.setattr(iv, "unpack", never)
    assert idle_summary_at(d, marker=MARKER, workers=workers).to_dict() == cold.to_dict()
    assert idle_summary_at(d, marker=MARKER, workers=workers, cache=False).to_dict() == (
        cold.to_dict())


def test_a_packed_set_is_measured_and_bounded_as_its_rows():
    rng = np.random.default_rng(3)
    for n in (1, 2, 50, 3000):
        x = iv.merge(np.cumsum(rng.integers(1, 1 << 20, 2 * n)).reshape(-1, 2))
        p = iv.Packed(x).checked()
        assert (len(p), p.measure(), p.bounds()) == (len(x), iv.measure(x),
                                                     (int(x[0, 0]), int(x[-1, 1])))
        assert iv.bounds(p) == iv.bounds(x) and iv.measure(p) == iv.measure(x)
    empty = iv.Packed(np.empty((0, 2), np.int64))
    assert (len(empty), empty.measure(), iv.bounds(empty)) == (0, 0, None)
    with pytest.raises(ValueError, match="not positive"):
        iv.Packed.of_parts(np.array([[0, 5]], np.int64), np.zeros(1, np.uint8),
                           np.ones(1, np.uint8)).checked()
