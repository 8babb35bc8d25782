"""`residency idle` reads a torch-npu database keeping only the host ranges its reduction
reads (`ascend_db.read_db`'s `keep_host`: the names the marker / window marker match; every
Communication range), the others counted (`Parsed.host_folded`): each rank's `RankReduction`,
and so the CLI's answer, is the one of the whole reading, field by field, in both readings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import ascend_db
from residency.traces.files import TraceError
from tests.helpers import (
    reductions_reading,
    same_reduction,
    torch_npu_tables,
    tracegen,
    write_torch_npu_db,
)

from ..helpers import run_cli

PATTERNS = [None, "zzz", "aten", "", "^$", "mm|release", "hcom"]  # none, some, all, empty


def _keep(*patterns: str | None):
    """The predicate `idle` reads a rank with: a name one of `patterns` matches."""
    compiled = [re.compile(p) for p in patterns if p is not None]
    return lambda name: any(rx.search(name) is not None for rx in compiled)


def _reductions(folder: Path, reading: str, marker: str | None, window: str | None,
                busy: str = "ascend"):
    """The rank's reduction as `idle` computes it (the database read by `reading`, only the
    host ranges the patterns match kept), and from the whole reading; or the exception each
    raised."""
    return reductions_reading(folder, dict(busy=busy, marker=marker, window_marker=window),
                              [{"reading": reading}, {"reading": reading, "keep_host": None}])


def _read(path: Path, reading: str, keep=None):
    try:
        return ascend_db.read_db(path, reading=reading, keep_host=keep)
    except (ascend_db.UnusualDatabase, TraceError) as exc:
        return type(exc)


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(torch_npu_tables(), st.sampled_from(PATTERNS), st.sampled_from(PATTERNS),
       st.sampled_from(["columns", "rows"]))
def test_the_reduction_of_a_filtered_reading_is_the_whole_readings(tmp_path, tables, marker,
                                                                    window, reading):
    path = write_torch_npu_db(tmp_path, tables)
    kept, whole = _reductions(tmp_path, reading, marker, window)
    if isinstance(whole, type):  # (refused, or an error: the same either way)
        assert kept is whole
        return
    assert not isinstance(kept, type), kept
    same_reduction(kept, whole)
    keep = _keep(marker, window)
    parsed = _read(path, reading, keep)
    lanes = [parsed.lanes[k] for k in parsed.range_lane.tolist()]
    if marker is None and window is None:  # (nothing asked for: no Python/CANN/MsTx range)
        assert not ascend_db.HOST_LANES & set(lanes)
    left = ascend_db.omit_host(_read(path, reading), keep)  # the whole reading, filtered
    for field in ("ranges", "names", "range_lane", "range_task_type"):
        assert getattr(parsed, field).tolist() == getattr(left, field).tolist(), field
    assert (parsed.lanes, parsed.host_folded) == (left.lanes, left.host_folded)


def test_names_null_absent_or_empty_are_one_name_and_every_aggregate_is_carried(tmp_path):
    """A NULL name, an id STRING_IDS lacks and a NULL value all read as ''; the ranges left
    out hold the earliest start, the latest end and the largest |end|, and are counted."""
    path = write_torch_npu_db(tmp_path, {
        "STRING_IDS": ("id INTEGER, value TEXT", [(1, "aten::mm"), (2, None), (3, "x")]),
        "TASK": ("startNs INTEGER, endNs INTEGER, taskType INTEGER, globalTaskId INTEGER",
                 [(0, 10, 3, 1)]),
        "PYTORCH_API": ("startNs TEXT, endNs TEXT, name INTEGER",
                        [("-500", "-400", 3), ("1", "2", 1), ("3", "4", None),
                         ("5", "6", 2), ("7", "8", 9), (None, "900", 3)]),
        "CANN_API": ("startNs INTEGER, endNs INTEGER, name INTEGER", [(20, 700, 3)]),
        "MSTX_EVENTS": ("startNs INTEGER, endNs INTEGER, message INTEGER", [(30, 40, 1)]),
    })
    for reading in ("columns", "rows"):
        empty = ascend_db.read_db(path, reading=reading, keep_host=_keep("^$"))
        assert empty.ranges.tolist() == [[3, 4], [5, 6], [7, 8]], reading
        f = empty.host_folded
        assert (f.ranges, f.first_start, f.last_end, f.first_end) == (4, -500, 700, -400)
        for marker in ("^$", "mm", None):
            same_reduction(*_reductions(tmp_path, reading, marker, None))


def test_each_distinct_name_is_asked_once_per_table_set(tmp_path):
    path = write_torch_npu_db(tmp_path, {
        "STRING_IDS": ("id INTEGER, value TEXT", [(1, "a"), (2, "b"), (3, "a")]),
        "TASK": ("startNs INTEGER, endNs INTEGER, taskType INTEGER, globalTaskId INTEGER", []),
        "PYTORCH_API": ("startNs TEXT, endNs TEXT, name INTEGER",
                        [(str(i), str(i + 1), 1 + i % 3) for i in range(50)]),
        "CANN_API": ("startNs INTEGER, endNs INTEGER, name INTEGER",
                     [(i, i + 1, 1 + i % 2) for i in range(50)]),
    })
    asked: list[str] = []

    def keep(name: str) -> bool:
        asked.append(name)
        return name == "b"

    parsed = ascend_db.read_db(path, reading="columns", keep_host=keep)
    assert sorted(asked) == ["", "a", "b"]  # (never per row; "a" once for both its ids)
    assert set(parsed.names.tolist()) == {"b"} and parsed.host_folded.ranges == 100 - len(
        parsed.ranges)


def _spy_reads(monkeypatch, *, whole: bool = False) -> list:
    """The `host_folded` of every database parse from now on; with `whole`, each database read
    whole (`keep_host` ignored)."""
    reads = []
    read = ascend_db.read_db

    def spy(*args, **kw):
        p = read(*args, **{**kw, **({"keep_host": None} if whole else {})})
        reads.append(p.host_folded)
        return p

    monkeypatch.setattr(ascend_db, "read_db", spy)
    return reads


@pytest.mark.parametrize("options", [
    (), ("--busy", "msprof"), ("--marker", "aten::mm"), ("--marker", "aclnn"),
    ("--marker", "residency", "--window-marker", "aten::(mm|add)"),
    ("--window-marker", "release", "--busy", "all"),
])
def test_idle_json_is_the_whole_readings_on_generated_databases(tmp_path, options):
    d = tmp_path / "db"
    tracegen().generate(d, 2, 4000, 3, fmt="ascend-db")
    args = ("idle", str(d), "--no-cache", "--json", "--workers", "1", *options)
    with pytest.MonkeyPatch.context() as mp:
        reads = _spy_reads(mp)
        rc, filtered, err = run_cli(*args)
    assert rc == 0, err
    assert len(reads) == 2 and all(f is not None and f.ranges for f in reads)  # (filtered)
    with pytest.MonkeyPatch.context() as mp:
        reads = _spy_reads(mp, whole=True)
        rc, whole, err = run_cli(*args)
    assert rc == 0, err
    assert reads == [None, None]
    assert json.loads(filtered) == json.loads(whole)


def test_a_database_with_fewer_files_than_workers_is_read_filtered_too(tmp_path):
    """One rank on two workers: no file each, so files are read in parts, but a database never
    is: it is read here, keeping only the host ranges its reduction reads."""
    d = tmp_path / "db"
    tracegen().generate(d, 1, 3000, 5, fmt="ascend-db")
    args = ("idle", str(d), "--no-cache", "--json", "--workers", "2", "--marker", "aten::mm")
    with pytest.MonkeyPatch.context() as mp:
        reads = _spy_reads(mp)
        rc, filtered, err = run_cli(*args)
    assert rc == 0, err
    assert len(reads) == 1 and reads[0] is not None and reads[0].ranges
    with pytest.MonkeyPatch.context() as mp:
        _spy_reads(mp, whole=True)
        rc, whole, err = run_cli(*args)
    assert rc == 0, err
    assert json.loads(filtered) == json.loads(whole)
