"""`residency idle` folds a torch-npu database's device tasks as it reads them
(`ascend_db.read_db`'s `fold`: one union per set of task classes, counts by type), batch by
batch of rowids (`ascend_db.BATCH_ROWS`), never holding the rank's task rows: each rank's
`RankReduction`, and so the CLI's answer, is the one of the reading that keeps every row."""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import ascend_db
from residency.traces import intervals as iv
from residency.traces.busy import classify
from residency.traces.sqlitedb import UntrustedDatabase
from tests.helpers import (
    reductions_reading,
    same_reduction,
    torch_npu_tables,
    tracegen,
    write_sqlite,
    write_torch_npu_db,
)

from ..helpers import run_cli

PATTERNS = [None, "aten", "mm|release", "hcom"]


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(torch_npu_tables(), st.sampled_from(PATTERNS),
       st.sampled_from(["ascend", "msprof", "all"]), st.integers(1, 3))
def test_the_folded_reduction_is_the_whole_readings(tmp_path, tables, marker, busy, batch):
    """Tasks in any order, communication tasks and operations, names NULL or absent, batches of
    1-3 rowids (so a table is read in several): the same reduction, field by field."""
    write_torch_npu_db(tmp_path, tables)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ascend_db, "BATCH_ROWS", batch)
        folded, whole = reductions_reading(
            tmp_path, dict(busy=busy, marker=marker),
            [{"reading": "columns"}, {"reading": "columns", "fold": None}])
    if isinstance(whole, type):
        assert folded is whole
        return
    assert not isinstance(folded, type), folded
    same_reduction(folded, whole)


def _reads(monkeypatch) -> list[tuple[str, int]]:
    """Every query `UntrustedDatabase.int_columns` reads from now on: its table and rows."""
    seen: list[tuple[str, int]] = []
    read = UntrustedDatabase.int_columns

    def spy(self, columns, rest, *args, **kwargs):
        out = read(self, columns, rest, *args, **kwargs)
        seen.append((re.search(r"FROM main\.(\w+)", rest).group(1),
                     len(out[0]) if out else 0))
        return out

    monkeypatch.setattr(UntrustedDatabase, "int_columns", spy)
    return seen


def _unfolded(args: tuple[str, ...]) -> dict:
    """The CLI's JSON for `args` with every database read whole (no `fold`)."""
    read = ascend_db.read_db
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ascend_db, "read_db", lambda *a, **kw: read(*a, **{**kw, "fold": None}))
        rc, whole, err = run_cli(*args)
    assert rc == 0, err
    return json.loads(whole)


@pytest.mark.parametrize("options", [(), ("--busy", "msprof"), ("--busy", "all"),
                                     ("--marker", "aten::mm")])
def test_idle_folds_a_generated_database_batch_by_batch(tmp_path, monkeypatch, options):
    """Each rank's tables are read in batches of `BATCH_ROWS` rowids and its tasks folded: the
    parse keeps no task row, the unions stay folded (the batches come in time order: never
    held whole), and the JSON is the one of the reading that keeps every row."""
    d = tmp_path / "db"
    tracegen().generate(d, 2, 6000, 7, fmt="ascend-db")
    monkeypatch.setattr(ascend_db, "BATCH_ROWS", 300)
    parses: list = []
    loose: list[bool] = []
    read, add = ascend_db.read_db, iv.Folded.add

    def parse(*args, **kw):
        parses.append(read(*args, **kw))
        return parses[-1]

    def folded(self, rows):
        add(self, rows)
        loose.append(self.loose is not None)

    args = ("idle", str(d), "--no-cache", "--json", "--workers", "1", *options)
    with pytest.MonkeyPatch.context() as mp:
        reads = _reads(mp)
        mp.setattr(ascend_db, "read_db", parse)
        mp.setattr(iv.Folded, "add", folded)
        rc, got, err = run_cli(*args)
    assert rc == 0, err
    assert len(parses) == 2 and all(p.device_classes is not None and not len(p.device)
                                    for p in parses)
    tasks = [n for table, n in reads if table == "TASK"]
    assert len(tasks) > 2 * 3 and max(tasks) <= 300, reads
    assert loose and not any(loose)
    assert json.loads(got) == _unfolded(args)


def test_tasks_recorded_stream_by_stream_fold_to_the_same_figures(tmp_path, monkeypatch):
    """A TASK table written type by type (each in time order, the whole not): the batches out
    of time order are held once and folded at the end, the same JSON as the whole reading."""
    d = tmp_path / "db"
    tracegen().generate(d, 2, 6000, 9, fmt="ascend-db")
    for db in sorted(d.rglob("*.db")):
        con = sqlite3.connect(db)
        con.executescript("CREATE TABLE T2 AS SELECT * FROM TASK ORDER BY taskType, startNs;"
                          "DROP TABLE TASK; ALTER TABLE T2 RENAME TO TASK;")
        con.close()
    monkeypatch.setattr(ascend_db, "BATCH_ROWS", 300)
    args = ("idle", str(d), "--no-cache", "--json", "--workers", "1", "--busy", "all")
    rc, got, err = run_cli(*args)
    assert rc == 0, err
    assert json.loads(got) == _unfolded(args)


def test_a_table_that_may_not_scan_in_rowid_order_is_read_at_once(tmp_path, monkeypatch):
    """An index (SQLite may scan it instead of the table) or a column named rowid: one batch,
    so the first row of a key is still the first in the order SQLite scans."""
    rows = [(i, i + 1, 1, i) for i in range(20)]
    monkeypatch.setattr(ascend_db, "BATCH_ROWS", 4)
    sizes = {}
    compute = frozenset({"compute"})
    for name, extra in (("plain", ""), ("indexed", "CREATE INDEX i ON TASK(startNs)"),
                        ("rowid", None)):
        columns = "startNs INTEGER, endNs INTEGER, taskType INTEGER, globalTaskId INTEGER"
        if extra is None:
            columns, rows_ = columns + ", rowid INTEGER", [(*r, 0) for r in rows]
        else:
            rows_ = rows
        path = write_sqlite(tmp_path / f"{name}.db", {
            "STRING_IDS": ("id INTEGER, value TEXT", [(1, "AI_CORE")]),
            "TASK": (columns, rows_)})
        if extra:
            con = sqlite3.connect(path)
            con.execute(extra)
            con.commit()
            con.close()
        with pytest.MonkeyPatch.context() as mp:
            reads = _reads(mp)
            p = ascend_db.read_db(path, reading="columns", fold=[compute], classify=classify)
        sizes[name] = [n for table, n in reads if table == "TASK"]
        assert p.device_classes.tasks == 20 and p.device_classes.types == {"AI_CORE": 20}
        assert np.array_equal(p.device_classes.unions[compute].unpack(), [[0, 20]])
    assert sizes["plain"] == [4] * 5 and sizes["indexed"] == [20] and sizes["rowid"] == [20]


def test_a_fold_needs_the_classes_of_task_types(tmp_path):
    path = write_sqlite(tmp_path / "t.db", {"STRING_IDS": ("id INTEGER, value TEXT", []),
                                            "TASK": ("startNs INTEGER, endNs INTEGER", [])})
    with pytest.raises(ValueError, match="`fold` needs `classify`"):
        ascend_db.read_db(path, fold=[frozenset({"compute"})])
