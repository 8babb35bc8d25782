"""`residency idle` folds a torch-npu database's device tasks as it reads them
(`ascend_db.read_db`'s `fold`: one union per set of task classes, counts by type), batch by
batch of rowids (`ascend_db.BATCH_ROWS`), never holding the rank's task rows: each rank's
`RankReduction`, and so the CLI's answer, is the one of the reading that keeps every row."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.analysis.idle.reduce import rank_reduction
from residency.traces import ascend_db
from residency.traces.files import TraceError
from residency.traces.load import plan_traces
from tests.helpers import tracegen

from ..helpers import run_cli
from .test_idle_db_host_filter import _database, _same_reduction, _write

PATTERNS = [None, "aten", "mm|release", "hcom"]


def _reductions(folder, marker, busy):
    """The rank's reduction as `idle` computes it (folded) and with every task row kept; or the
    exception each raised."""
    plan = plan_traces(folder)
    job = dict(busy=busy, marker=marker, window_marker=None, cache=False,
               chunk_bytes=1 << 20, max_trace_bytes=1 << 30)
    read = ascend_db.read_db
    out = []
    for fold in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ascend_db, "read_db", lambda *a, fold_=fold, **kw: read(*a, **{
                **kw, "reading": "columns", **({} if fold_ else {"fold": None})}))
            try:
                out.append(rank_reduction(plan, 0, **job))
            except (ascend_db.UnusualDatabase, TraceError) as exc:
                out.append(type(exc))
    return out


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_database(), st.sampled_from(PATTERNS), st.sampled_from(["ascend", "msprof", "all"]),
       st.integers(1, 3))
def test_the_folded_reduction_is_the_whole_readings(tmp_path, tables, marker, busy, batch):
    """Tasks in any order, communication tasks and operations, names NULL or absent, batches of
    1-3 rowids (so a table is read in several): the same reduction, field by field."""
    _write(tmp_path, tables)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ascend_db, "BATCH_ROWS", batch)
        folded, whole = _reductions(tmp_path, marker, busy)
    if isinstance(whole, type):
        assert folded is whole
        return
    assert not isinstance(folded, type), folded
    _same_reduction(folded, whole)


def _spy(monkeypatch) -> list:
    """Every database parse from now on, and (`_DeviceFold.add`) the rows of each batch."""
    parses: list = []
    read = ascend_db.read_db

    def spy(*args, **kw):
        p = read(*args, **kw)
        parses.append(p)
        return p

    monkeypatch.setattr(ascend_db, "read_db", spy)
    return parses


@pytest.mark.parametrize("options", [(), ("--busy", "msprof"), ("--busy", "all"),
                                     ("--marker", "aten::mm")])
def test_idle_folds_a_generated_database_batch_by_batch(tmp_path, monkeypatch, options):
    """Each rank's tasks are read in batches of `BATCH_ROWS` rowids and folded: the parse
    keeps no task row, every batch folds into unions that stay folded (the batches come in
    time order), and the JSON is the one of the reading that keeps every row."""
    d = tmp_path / "db"
    tracegen().generate(d, 2, 6000, 7, fmt="ascend-db")
    monkeypatch.setattr(ascend_db, "BATCH_ROWS", 300)
    batches: list[int] = []
    loose: list[bool] = []
    add, finish = ascend_db._DeviceFold.add, ascend_db._DeviceFold.finish

    def counted(self, start, *rest):
        batches.append(len(start))
        return add(self, start, *rest)

    def checked(self):
        loose.extend(u.loose is not None for u in self.unions)
        return finish(self)

    args = ("idle", str(d), "--no-cache", "--json", "--workers", "1", *options)
    with pytest.MonkeyPatch.context() as mp:
        parses = _spy(mp)
        mp.setattr(ascend_db._DeviceFold, "add", counted)
        mp.setattr(ascend_db._DeviceFold, "finish", checked)
        rc, folded, err = run_cli(*args)
    assert rc == 0, err
    assert len(parses) == 2 and all(p.device_classes is not None and not len(p.device)
                                    for p in parses)
    assert len(batches) > 2 * 3 and max(batches) <= 300, batches
    assert loose and not any(loose)
    with pytest.MonkeyPatch.context() as mp:
        read = ascend_db.read_db
        mp.setattr(ascend_db, "read_db", lambda *a, **kw: read(*a, **{**kw, "fold": None}))
        rc, whole, err = run_cli(*args)
    assert rc == 0, err
    assert json.loads(folded) == json.loads(whole)


def test_a_table_that_may_not_scan_in_rowid_order_is_read_at_once(tmp_path, monkeypatch):
    """An index (SQLite may scan it instead of the table) or a column named rowid: one batch,
    so the first row of a key is still the first in the order SQLite scans."""
    from tests.helpers import write_sqlite

    rows = [(i, i + 1, 1, i) for i in range(20)]
    monkeypatch.setattr(ascend_db, "BATCH_ROWS", 4)
    sizes = {}
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
            import sqlite3

            con = sqlite3.connect(path)
            con.execute(extra)
            con.commit()
            con.close()
        got: list[int] = []

        def spy(*a, got=got, batches=ascend_db._batches, **kw):
            for b in batches(*a, **kw):
                got.append(len(b[0]))
                yield b

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ascend_db, "_batches", spy)
            p = ascend_db.read_db(path, reading="columns", fold=[frozenset({"compute"})])
        sizes[name] = got
        assert p.device_classes.tasks == 20
        assert np.array_equal(p.device_classes.unions[frozenset({"compute"})].unpack(),
                              [[0, 20]])
    assert sizes["plain"] == [4] * 5 and sizes["indexed"] == [20] and sizes["rowid"] == [20]
