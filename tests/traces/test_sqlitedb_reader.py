"""The compiled column reader of SQLite files (`_sqlitedb.c`) against the Python reading:
the same columns, the same refusals, the same bounds."""

from __future__ import annotations

import os
import shutil
import sqlite3
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.traces import sqlitedb
from residency.traces.files import TraceError
from residency.traces.kineto_scan import DISABLE_ENV

needs_reader = pytest.mark.skipif(not sqlitedb.compiled_reader(),
                                  reason="the compiled SQLite reader is not built here")

_VALUES = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5), st.none(),
                    st.floats(allow_nan=False), st.text(max_size=3), st.binary(max_size=3))


def _table(path: Path, rows: list[tuple]) -> Path:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE T (a INTEGER, b, c INTEGER)")
    con.executemany("INSERT INTO T VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    return path


def _both(path: Path, columns: list[str], rest: str, rules: str | None = None,
          **kwargs) -> tuple[object, object]:
    """Each reader's answer: its columns as lists, None, or the error's type and text."""
    out = []
    for compiled in (True, False):
        db = sqlitedb.open_untrusted(path, **kwargs)
        try:
            got = db.int_columns(columns, rest, rules, compiled=compiled)
            out.append(None if got is None else
                       [(c.dtype.str, c.tolist()) for c in got])
        except (TraceError, sqlite3.Error) as exc:
            out.append((type(exc).__name__, str(exc)))
        finally:
            db.close()
    return out[0], out[1]


@needs_reader
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_VALUES, _VALUES, st.integers(-3, 3)), max_size=12),
       st.sampled_from([["a", "b", "c"], ["c", "a"], ["c"], ["b", "b"],
                        ["CAST(b AS INTEGER)", "a"]]),
       st.lists(st.sampled_from("vik"), min_size=3, max_size=3),
       st.sampled_from(["", " WHERE c > 0", " WHERE a IS NOT NULL"]))
def test_the_compiled_reader_gives_the_python_reading(tmp_path, rows, columns, rules, where):
    """Any mix of integers (to the int64 bounds), NULLs, reals, text and blobs, under every
    rule: the same int64 columns, or None from both where a rule refuses a value."""
    path = _table(tmp_path / "t.db", rows)
    rules = "".join(rules[:len(columns)])
    compiled, python = _both(path, columns, f"FROM T{where}", rules)
    assert compiled == python


_CLASSES = {"integer": 7, "null": None, "real": 2.5, "text": "7", "blob": b"7"}
_RULED = {("v", "integer"): 7, ("i", "integer"): 7, ("k", "integer"): 7,
          ("i", "null"): sqlitedb.NO_INTEGER, ("k", "null"): sqlitedb.NO_INTEGER,
          **{("i", c): sqlitedb.NO_INTEGER for c in ("real", "text", "blob")}}


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_reader), False],
                         ids=["compiled", "python"])
@pytest.mark.parametrize("rule", "vik")
@pytest.mark.parametrize("storage", list(_CLASSES))
def test_each_rule_on_each_storage_class(tmp_path, compiled, rule, storage):
    """``v`` takes an integer only; ``i`` any other value as NO_INTEGER; ``k`` NULL as
    NO_INTEGER and refuses the rest; a refused value refuses the whole read (None)."""
    path = tmp_path / "c.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE T (x, y INTEGER)")  # (x: no affinity, each value as given)
    con.executemany("INSERT INTO T VALUES (?, ?)", [(1, 1), (_CLASSES[storage], 2)])
    con.commit()
    con.close()
    db = sqlitedb.open_untrusted(path)
    try:
        got = db.int_columns(["x", "y"], "FROM T", rule + "v", compiled=compiled)
    finally:
        db.close()
    want = _RULED.get((rule, storage), "refused")
    assert (None if got is None else got[0].tolist()) == (None if want == "refused" else
                                                          [1, want])


@needs_reader
def test_the_compiled_reader_keeps_the_bounds(tmp_path):
    """The row bound, the time budget and the value length limit stop the compiled reader with
    the errors the Python reading gives; SQLite's own errors are SQLite errors."""
    path = _table(tmp_path / "b.db", [(i, i, i) for i in range(3000)])
    compiled, python = _both(path, ["a", "c"], "FROM T", budget_s=0.0)
    assert compiled == python == ("TraceError", f"{path}: a query took longer than 0 s and "
                                  "was stopped (a hostile or damaged database?)")
    compiled, python = _both(path, ["length(hex(zeroblob(10000000)))"], "FROM T")
    assert compiled == python and "a value is longer than 16777216 bytes" in compiled[1]
    compiled, python = _both(path, ["a"], "FROM NOPE")
    assert compiled == python and compiled[0] == "OperationalError"

    def rows_past(compiled: bool) -> str:
        db = sqlitedb.open_untrusted(path)
        db.max_rows = 2999
        try:
            with pytest.raises(TraceError, match="a query returned more than 2999 rows") as e:
                db.int_columns(["a"], "FROM T", compiled=compiled)
        finally:
            db.close()
        return str(e.value)

    assert rows_past(True) == rows_past(False)


@needs_reader
def test_the_compiled_reader_writes_nothing_beside_the_file(tmp_path):
    """Read-only and immutable as the Python connection: no journal, -wal or -shm appears."""
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "w.db"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE T (a INTEGER, b, c INTEGER)")
    con.executemany("INSERT INTO T VALUES (?, ?, ?)", [(i, i, i) for i in range(10)])
    con.commit()
    con.close()
    before = sorted(p.name for p in folder.iterdir())
    db = sqlitedb.open_untrusted(path)
    try:
        assert db.int_columns(["a"], "FROM T", compiled=True)[0].tolist() == list(range(10))
    finally:
        db.close()
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_compiled_reader_is_built_where_sqlite_and_a_compiler_are():
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        pytest.skip(f"{DISABLE_ENV} is set: the compiled readers are off")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here: the package installs without the reader")
    include = Path(sysconfig.get_config_var("INCLUDEDIR") or "/usr/include")
    if not any((d / "sqlite3.h").is_file() for d in (include, Path("/usr/include"))):
        pytest.skip("no sqlite3.h here: the package installs without the SQLite reader")
    assert sqlitedb.compiled_reader(), (
        "a C compiler and SQLite's header are here but residency.traces._sqlitedb is not "
        "built: reinstall (pip install -e .) so that torch-npu databases are read at full speed")


def test_the_python_reader_can_be_chosen(tmp_path):
    """`python_reader()` turns the compiled reader off within, and on again after."""
    was = sqlitedb.compiled_reader()
    with sqlitedb.python_reader():
        assert not sqlitedb.compiled_reader()
        path = _table(tmp_path / "p.db", [(1, 2, 3)])
        db = sqlitedb.open_untrusted(path)
        try:
            assert [c.tolist() for c in db.int_columns(["a", "c"], "FROM T")] == [[1], [3]]
            with pytest.raises(ValueError, match="not available"):
                db.int_columns(["a"], "FROM T", compiled=True)
            with pytest.raises(ValueError, match="rules must be"):
                db.int_columns(["a"], "FROM T", "x")
        finally:
            db.close()
    assert sqlitedb.compiled_reader() == was
