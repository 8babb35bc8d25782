"""torch-npu's SQLite database export (``ExportType.Db``): ``ascend_pytorch_profiler_<rank>.db``
in a session's ``ASCEND_PROFILER_OUTPUT/``; its schema, file names and reader.

SQLite schema (`read_db`): tables and columns as torch-npu writes them (Ascend/pytorch
``torch_npu/profiler/analysis/prof_common_func/_constant.py``: ``DbConstant``,
``TableColumnsManager``: ``STRING_IDS``, ``RANK_DEVICE_MAP``, ``PYTORCH_API``, ``CANN_API``)
and msprof's database (Ascend/msprof ``analysis/csrc/application/database/msprof_db.cpp``:
``TASK(startNs, endNs, deviceId, connectionId, globalTaskId, globalPid, taskType, contextId,
streamId, taskId, modelId)``, ``COMPUTE_TASK_INFO(name, globalTaskId, blockNum, mixBlockNum,
taskType, opType, ...)``, ``COMMUNICATION_TASK_INFO``, ``COMMUNICATION_OP``, ``MSTX_EVENTS``;
``TASK.taskType`` a ``STRING_IDS`` id of ``TaskProcessor::GetTaskType``'s type: the host task
type, or the device SQE type for FFTS+ / unknown host types; ``COMPUTE_TASK_INFO.taskType``
the GE task type the text export shows), read the way msprof-analyze's cluster_time_summary
recipe reads them (``prof_exports/cluster_time_summary_export.py``: computing = ``TASK`` joined with
``COMPUTE_TASK_INFO``, communication = ``COMMUNICATION_OP``, memory = ``MEMCPY_ASYNC`` tasks).
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from residency.traces import intervals as iv
from residency.traces.columns import FoldedClasses, FoldedHost, Parsed
from residency.traces.files import TraceError
from residency.traces.sqlitedb import NO_INTEGER, UntrustedDatabase, open_untrusted

__all__ = ["BLOCK_ROWS", "DB_GLOB", "DB_RE", "HOST_LANES", "READINGS", "UnusualDatabase",
           "first_codes", "omit_host", "profiler_db_problem", "read_db", "read_db_memory",
           "taken_pair"]

DB_RE = re.compile(r"ascend_pytorch_profiler_(\d+)\.db")  # the export's name; group 1: rank
DB_GLOB = "ascend_pytorch_profiler*.db"  # the files a session's output folder is searched for


def profiler_db_problem(path: Path) -> str | None:
    """Why the SQLite file `path` is not a torch-npu profiler database (None: it is one, with
    the tables `read_db` needs)."""
    try:
        con = _open_db(path)
        try:
            tables = _tables(con)
        finally:
            con.close()
    except (TraceError, sqlite3.Error) as exc:
        return f"a SQLite file that cannot be read ({exc})"
    missing = [t for t in _REQUIRED if t not in tables]
    if missing:
        return (f"a SQLite database without the table(s) {', '.join(missing)}: not a torch-npu "
                "profiler database")
    return None


_REQUIRED = ("STRING_IDS", "TASK")
# the type: the compute task's GE task type (AI_CORE, ...) when it has one, else the TASK's,
# as msprof's text export chooses it (AscendHardwareAssembler::GetTaskType; module doc)
_DEVICE_SQL = """
SELECT t.startNs, t.endNs,
       COALESCE((SELECT s.value FROM {compute} ci JOIN {strings} s ON s.id = ci.name
                 WHERE ci.globalTaskId = t.globalTaskId LIMIT 1),
                (SELECT s.value FROM {comm} c JOIN {strings} s ON s.id = c.name
                 WHERE c.globalTaskId = t.globalTaskId LIMIT 1), tt.value, ''),
       COALESCE((SELECT s.value FROM {compute} ci JOIN {strings} s ON s.id = ci.taskType
                 WHERE ci.globalTaskId = t.globalTaskId AND s.value != 'N/A' LIMIT 1),
                tt.value, ''),
       EXISTS (SELECT 1 FROM {comm} c WHERE c.globalTaskId = t.globalTaskId)
FROM TASK t
LEFT JOIN {strings} tt ON tt.id = t.taskType
"""
# The lookups above run once per task: without an index on the looked-up column each is a
# scan, quadratic in the tasks (8 x 27.5k tasks took 480 s). torch-npu's tables have no
# index and the file is opened immutable, so the columns read are copied into indexed
# temporary tables first (the connection's own temp database; scan order kept, so "the
# first row" is the same one). name: (source, columns, indexed column)
_LOOKUPS = {"strings": ("STRING_IDS", "id, value", "id"),
            "compute": ("COMPUTE_TASK_INFO", "globalTaskId, name, taskType", "globalTaskId"),
            "comm": ("COMMUNICATION_TASK_INFO", "globalTaskId, name", "globalTaskId")}


def _indexed_lookups(con: UntrustedDatabase, tables: set[str]) -> dict[str, str]:
    """The tables `_DEVICE_SQL` looks rows up in, as indexed temporary copies (an absent
    optional table: an empty stand-in); their names by placeholder."""
    names = {}
    for key, (table, columns, column) in _LOOKUPS.items():
        if table not in tables:
            names[key] = ("(SELECT NULL AS globalTaskId, NULL AS name, NULL AS taskType "
                          "WHERE 0)")
            continue
        temp = f"residency_{key}"
        con.execute(f"CREATE TEMP TABLE {temp} AS SELECT {columns} FROM main.{table}")
        con.execute(f"CREATE INDEX temp.{temp}_{column} ON {temp}({column})")
        names[key] = f"temp.{temp}"
    return names
_COMM_OP_SQL = """
SELECT o.startNs, o.endNs, COALESCE(s.value, '') FROM COMMUNICATION_OP o
LEFT JOIN STRING_IDS s ON s.id = o.opName
"""
_HOST_SQL = {  # table -> (lane, its host ranges); times CAST: PYTORCH_API's are TEXT
    table: (lane, f"SELECT CAST(a.startNs AS INTEGER), CAST(a.endNs AS INTEGER), "
                  f"COALESCE(s.value, '') FROM {table} a LEFT JOIN STRING_IDS s ON "
                  f"s.id = a.{name} WHERE a.startNs IS NOT NULL AND a.endNs IS NOT NULL")
    for table, name, lane in (("PYTORCH_API", "name", "Python"), ("CANN_API", "name", "CANN"),
                              ("MSTX_EVENTS", "message", "MsTx"))
}
_COMM_LANE = "Communication"
HOST_LANES = frozenset(lane for lane, _ in _HOST_SQL.values())  # the ranges `keep_host` filters


def _open_db(path: Path, *, digest: bool = False) -> UntrustedDatabase:
    """`path` opened read-only and immutable, schema untrusted, every query bounded
    (`residency.traces.sqlitedb`; with `digest`, a private copy hashed as it is made);
    TraceError when it cannot be."""
    return open_untrusted(path, digest=digest)


def _tables(con: UntrustedDatabase) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


READINGS = ("auto", "columns", "rows")
"""How `read_db` reads the tables: `auto` by columns where that reading is exact, else row by
row; `columns` by columns only (`UnusualDatabase` where it declines); `rows` row by row only
(SQLite's joins: the reference semantics). The answer is the same wherever both answer."""


def read_db(path: Path, *, digest: bool = False, device_names: bool = True,
            reading: str = "auto", keep_host: Callable[[str], bool] | None = None,
            fold: Sequence[frozenset[str]] | None = None,
            classify: Callable[[str], str] | None = None) -> Parsed:
    """Read a torch-npu ``ascend_pytorch_profiler_<rank>.db`` (or msprof database) with the
    standard library, into the columns a text export gives: every ``TASK`` row a device task
    (type: its ``COMPUTE_TASK_INFO.taskType`` when it has one, else ``TASK.taskType``, both
    through ``STRING_IDS``, as the text export's ``Task Type``; its name, from
    ``COMPUTE_TASK_INFO``, kept as ``device_names``), except those listed in
    ``COMMUNICATION_TASK_INFO``, which with the ``COMMUNICATION_OP`` operations are ranges of
    the ``Communication`` lane as in the text export; ``PYTORCH_API`` (lane ``Python``),
    ``CANN_API`` (``CANN``) and ``MSTX_EVENTS`` (``MsTx``) rows host ranges; the rank from
    ``RANK_DEVICE_MAP``. With `digest`, SQLite reads a private copy of the file and the
    parse's `digest` is the content digest of exactly those bytes. Without `device_names`
    the device tasks' names may be left out (``None``), as a Kineto parse leaves them.
    `reading` (`READINGS`) chooses the column reading, the row reading, or (`auto`) the
    first where it is exact. With `keep_host` (a predicate on a name, asked once per distinct
    name), the ``Python``, ``CANN`` and ``MsTx`` ranges (`HOST_LANES`) whose name it refuses
    are left out of `ranges` as each table is read, and counted with their extremes in
    `host_folded` (None: none left out); the ``Communication`` ranges are always kept. The kept
    rows, their order and codes are those of the whole reading filtered (`omit_host`).
    With `fold` (sets of task classes, `residency.traces.busy.CLASSES`; `classify` gives a
    task type's class, as `residency.traces.busy.classify` does) and the column
    reading, the device tasks are not kept but folded as they are read, one union per set
    (a set with ``communication``: with the Communication lane's ranges, as
    `residency.traces.busy.busy_tasks` counts them), with their counts by type
    (`Parsed.device_classes`; `device` then empty); the row reading keeps them as ever.

    Raises:
        TraceError: not a SQLite database, or a required table (``STRING_IDS``, ``TASK``)
            missing, named in the message.
        UnusualDatabase: with `reading="columns"`, a database the column reading declines.
        ValueError: `reading` is not one of `READINGS`, or `fold` without `classify`.
    """
    if fold is not None and classify is None:
        raise ValueError("`fold` needs `classify`: the class of a task type")
    if reading not in READINGS:
        raise ValueError(f"The value for `reading` must be one of {list(READINGS)}, but "
                         f"{reading!r} was passed.")
    con = _open_db(path, digest=digest)
    try:
        tables = _tables(con)
        for table in _REQUIRED:
            if table not in tables:
                raise TraceError(path, f"no table {table}: not a torch-npu profiler database "
                                 f"(tables: {', '.join(sorted(tables)) or 'none'})")
        if reading == "rows":
            parsed = omit_host(_read_rows(path, con, tables), keep_host)
        elif reading == "columns":
            parsed = _read_columns(con, tables, device_names, keep_host, fold, classify)
        else:
            try:
                parsed = _read_columns(con, tables, device_names, keep_host, fold, classify)
            except (UnusualDatabase, sqlite3.DatabaseError):  # (an odd schema or odd values,
                # or an error: SQLite's own joins, row by row, which name it as they always did)
                parsed = omit_host(_read_rows(path, con, tables), keep_host)
        rank = None
        if "RANK_DEVICE_MAP" in tables:
            found = {r[0] for r in con.execute("SELECT rankId FROM RANK_DEVICE_MAP")}
            valid = {r for r in found if type(r) is int and 0 <= r < 2**31}  # -1: no rank
            rank = valid.pop() if len(valid) == 1 else None
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"cannot read the database: {exc}") from None
    finally:
        con.close()
    parsed.rank = rank
    parsed.digest = con.digest
    return parsed


def _read_rows(path: Path, con: UntrustedDatabase, tables: set[str]) -> Parsed:
    """`read_db`'s reading by SQLite's joins, row by row in Python: the reference semantics,
    used where `_read_columns` declines (`UnusualDatabase`)."""
    rows = con.execute(_DEVICE_SQL.format(**_indexed_lookups(con, tables))).fetchall()
    device = [(s, e, n, t) for s, e, n, t, c in rows if not c]
    host = [(s, e, n, lane) for table, (lane, sql) in _HOST_SQL.items() if table in tables
            for s, e, n in con.execute(sql).fetchall()]
    if "COMMUNICATION_OP" in tables:
        host += [(s, e, n, _COMM_LANE) for s, e, n in con.execute(_COMM_OP_SQL).fetchall()]
    host += [(s, e, n, _COMM_LANE) for s, e, n, _, c in rows if c]
    device.sort(key=lambda r: r[0])
    host.sort(key=lambda r: r[0])
    types: dict[str, int] = {}
    lanes: dict[str, int] = {}
    task = np.array([types.setdefault(r[3], len(types)) for r in device], np.int16)
    lane = np.array([lanes.setdefault(r[3], len(lanes)) for r in host], np.int16)
    return Parsed(None, _times(path, [r[:2] for r in device]),
                  _times(path, [r[:2] for r in host]), _texts([r[2] for r in host]), 0,
                  task, np.full(len(host), -1, np.int16), lane, tuple(types), tuple(lanes),
                  device_names=_texts([r[2] for r in device]))


def omit_host(p: Parsed, keep_host: Callable[[str], bool] | None) -> Parsed:
    """`p` (a whole reading of a database) without the ranges of `HOST_LANES` whose name
    `keep_host` refuses (asked once per distinct name), those counted in `p.host_folded`; lanes
    renumbered by first appearance among the rows kept. `p` itself where nothing is refused
    (or `keep_host` is None)."""
    if keep_host is None or not len(p.ranges):
        return p
    lanes = [k for k, lane in enumerate(p.lanes) if lane in HOST_LANES]
    names = p.names.tolist()
    verdict = {n: bool(keep_host(n)) for n in set(names)}
    kept = ~np.isin(p.range_lane, lanes) | np.fromiter(map(verdict.__getitem__, names), bool,
                                                       len(names))
    if bool(kept.all()):
        return p
    left = p.ranges[~kept]
    counted = FoldedHost(len(left), int(left[:, 0].min()), int(left[:, 1].max()),
                         int(left[:, 1].min())).joined(p.host_folded)
    lane, old = first_codes(p.range_lane[kept])
    return dataclasses.replace(p, ranges=p.ranges[kept], names=p.names[kept],
                               range_task_type=p.range_task_type[kept], range_lane=lane,
                               lanes=tuple(p.lanes[i] for i in old.tolist()),
                               host_folded=counted)


# -- the same reading, by columns ------------------------------------------------------------
# Each table is scanned once, plainly (no join, no subquery, no temporary table), in batches
# of consecutive rowids (`_batches`: a rank's raw columns are never all held at once), each
# turned into int64 columns at once; the joins are done on the columns (sorted keys, first
# rows by scan order), as `_DEVICE_SQL`'s lookups and the LEFT JOINs of `_HOST_SQL` do them.
# That equivalence holds when every id is an integer that appears once in STRING_IDS, every
# id column has INTEGER affinity (so no text is converted to match a number), the string
# values are text or NULL and the times the SQL does not CAST are integers in order; in
# any other case `UnusualDatabase` sends the file to `_read_rows`.

_NO_ID = NO_INTEGER  # an id column's NULL or non-integer: matches no STRING_IDS id
_ABSENT, _NULL = -1, -2  # lookups: no such id; the id's value is NULL
_ID_COLUMNS = {"STRING_IDS": ("id",), "TASK": ("taskType", "globalTaskId"),
               "COMPUTE_TASK_INFO": ("globalTaskId", "name", "taskType"),
               "COMMUNICATION_TASK_INFO": ("globalTaskId", "name"),
               "PYTORCH_API": ("name",), "CANN_API": ("name",), "MSTX_EVENTS": ("message",),
               "COMMUNICATION_OP": ("opName",)}
_HOST_COLUMNS = (("PYTORCH_API", "name", "Python"), ("CANN_API", "name", "CANN"),
                 ("MSTX_EVENTS", "message", "MsTx"))


class UnusualDatabase(Exception):
    """The database is outside what the column reading reads exactly (see above): `read_db`
    reads it row by row instead (`reading="columns"` raises this)."""


def _integer_affinity(con: UntrustedDatabase, table: str, columns: tuple[str, ...]) -> bool:
    declared = {r[1]: str(r[2] or "").upper()
                for r in con.execute(f"PRAGMA main.table_info({table})")}
    return all(c in declared and "INT" in declared[c] for c in columns)


def _columns(con: UntrustedDatabase, table: str, columns: list[str], kinds: str,
             cond: str = "") -> list[np.ndarray]:
    """Int64 columns of `table` (its rows where the SQL condition `cond` holds, if given), per
    `kinds` letter: ``t`` an integer (else `UnusualDatabase`), ``c`` one CAST to an integer,
    ``i`` an id (NULL or not an integer: `_NO_ID`), ``k`` a key (NULL: `_NO_ID`; another
    non-integer, or the integer `_NO_ID` itself: `UnusualDatabase`).
    Each value's storage class decides, as typeof() tells it (`UntrustedDatabase.int_columns`:
    ``t`` and ``c`` its rule ``v``, ``i`` and ``k`` its own)."""
    exprs = [f"CAST({c} AS INTEGER)" if k == "c" else c for c, k in zip(columns, kinds,
                                                                          strict=True)]
    rules = kinds.replace("t", "v").replace("c", "v")
    where = f" WHERE {cond}" if cond else ""
    out = con.int_columns(exprs, f"FROM main.{table}{where}", rules)
    if out is None:  # a value of another type
        raise UnusualDatabase
    for c, k, col in zip(columns, kinds, out, strict=True):
        if k == "k" and bool((col == _NO_ID).any()) and con.execute(
                f"SELECT 1 FROM main.{table} WHERE {f'({cond}) AND ' if cond else ''}"
                f"{c} = {_NO_ID} LIMIT 1").fetchall():
            raise UnusualDatabase  # (that integer itself, not a NULL)
    return out


BATCH_ROWS = 1 << 18  # rowids a batch of `_batches` spans (at least)
_MAX_BATCHES = 4096  # a table of sparse rowids is read in at most about this many batches
_ROWID_NAMES = frozenset({"rowid", "_rowid_", "oid"})


def _batches(con: UntrustedDatabase, table: str, columns: list[str], kinds: str,
             cond: str = "") -> Iterator[list[np.ndarray]]:
    """`_columns` of `table` batch by batch: the rows of consecutive rowid ranges, in scan
    order, so a reader holds one batch of raw columns, not the table's. A table whose scan
    order might not be its rowid order (an index, a column that hides the rowid, WITHOUT
    ROWID) is one batch, read as `_columns` reads it."""
    info = con.execute(f"PRAGMA main.table_info({table})").fetchall()
    lo = hi = None
    if (not con.execute(f"PRAGMA main.index_list({table})").fetchall()
            and not any(str(r[1]).lower() in _ROWID_NAMES for r in info)):
        try:  # (one aggregate a query: SQLite then reads one end of the table, no scan)
            lo = con.execute(f"SELECT min(rowid) FROM main.{table}").fetchall()[0][0]
            hi = con.execute(f"SELECT max(rowid) FROM main.{table}").fetchall()[0][0]
        except sqlite3.DatabaseError:
            lo = hi = None
    if type(lo) is not int or type(hi) is not int or hi - lo < BATCH_ROWS:
        yield _columns(con, table, columns, kinds, cond)
        return
    step = max(BATCH_ROWS, (hi - lo) // _MAX_BATCHES + 1)
    for first in range(lo, hi + 1, step):
        span = f"rowid BETWEEN {first} AND {min(first + step - 1, hi)}"
        yield _columns(con, table, columns, kinds, f"({cond}) AND {span}" if cond else span)


class _Strings:
    """STRING_IDS as sorted ids beside value codes into `table` (distinct text values;
    `_NULL` for a NULL value)."""

    def __init__(self, con: UntrustedDatabase) -> None:
        rows = con.execute("SELECT id, value FROM STRING_IDS").fetchall()
        if not all(type(i) is int and i != _NO_ID and (v is None or type(v) is str)
                   for i, v in rows):
            raise UnusualDatabase
        ids = np.array([i for i, _ in rows], np.int64)
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        if len(self.ids) > 1 and bool((self.ids[1:] == self.ids[:-1]).any()):
            raise UnusualDatabase  # a repeated id multiplies SQLite's joins: `_read_rows` says so
        distinct: dict[str, int] = {}
        codes = [_NULL if v is None else distinct.setdefault(v, len(distinct)) for _, v in rows]
        self.codes = np.array(codes, np.int32)[order]  # (codes: int32 columns throughout)
        self.empty = distinct.setdefault("", len(distinct))
        self.na = distinct.get("N/A", _ABSENT)
        self.table = np.empty(len(distinct), dtype=object)
        self.table[:] = list(distinct)

    def code(self, ids: np.ndarray) -> np.ndarray:
        """Each id's value code; `_ABSENT` where no row has the id."""
        if not len(self.ids):
            return np.full(len(ids), _ABSENT, np.int32)
        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[at] == ids, self.codes[at], _ABSENT)


def _first_by_key(keys: np.ndarray, values: np.ndarray, keep: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct key (`_NO_ID` left out) the value of its first kept row, in scan order."""
    keep = keep & (keys != _NO_ID)
    if bool(keep.all()):
        kept, held = keys, values
    else:
        kept, held = keys[keep], values[keep]
    if len(kept) < 2 or bool((kept[1:] > kept[:-1]).all()):  # (as torch-npu writes them:
        return kept, held  # ascending and distinct, so no sort)
    unique, first = np.unique(kept, return_index=True)
    return unique, held[first]


def _lookup(unique: np.ndarray, values: np.ndarray, keys: np.ndarray,
            missing: int = _ABSENT) -> np.ndarray:
    if not len(unique):
        return np.full(len(keys), missing, values.dtype)
    at = np.minimum(np.searchsorted(unique, keys), len(unique) - 1)
    return np.where((unique[at] == keys) & (keys != _NO_ID), values[at], missing)


def _coalesce(*codes: np.ndarray) -> np.ndarray:
    """The first value code that is a value (neither `_ABSENT` nor `_NULL`), row by row."""
    out = codes[-1]
    for c in reversed(codes[:-1]):
        out = np.where(c >= 0, c, out)
    return out


BLOCK_ROWS = 1 << 20  # rows a block where a column is rewritten block by block


def first_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes renumbered by first appearance (as a dict filled row by row numbers them): the
    new codes and the old code of each new one."""
    if not len(codes):
        return np.empty(0, np.int16), np.empty(0, np.int64)
    n, block = len(codes), BLOCK_ROWS  # (block by block: no int64 copy of a narrow column)
    counts = np.zeros(int(codes.max()) + 1, np.int64)  # (codes are small: a table's positions)
    for lo in range(0, n, block):
        counts += np.bincount(codes[lo:lo + block].astype(np.int64), minlength=len(counts))
    present = np.flatnonzero(counts)
    first = np.array([int(np.argmax(codes == c)) for c in present.tolist()], np.int64)
    old = present[np.argsort(first, kind="stable")]
    new = np.zeros(int(present[-1]) + 1, np.int16)
    new[old] = np.arange(len(old))
    out = np.empty(n, np.int16)
    for lo in range(0, n, block):
        out[lo:lo + block] = new[codes[lo:lo + block]]
    return out, old


def _drain(parts: list[np.ndarray]) -> np.ndarray:
    out = np.concatenate(parts)
    parts.clear()
    return out


class _TaskLookups:
    """What a ``TASK`` row takes from ``COMPUTE_TASK_INFO`` and ``COMMUNICATION_TASK_INFO``
    by its ``globalTaskId`` (each key's first row in scan order, as `_DEVICE_SQL`'s lookups):
    the compute task's type (and name, with `names`) and whether it is a communication task
    (and that task's name, with `names`), as value codes of `strings`."""

    def __init__(self, con: UntrustedDatabase, tables: set[str], strings: _Strings, *,
                 names: bool) -> None:
        self.strings = strings
        self.ci_type = self.ci_name = self.comm_name = self.comm = None
        if "COMPUTE_TASK_INFO" in tables:
            cols, kinds = ["globalTaskId", "taskType"], "ki"
            if names:
                cols, kinds = [*cols, "name"], kinds + "i"
            parts: list[list[np.ndarray]] = [[] for _ in cols]
            for batch in _batches(con, "COMPUTE_TASK_INFO", cols, kinds):
                parts[0].append(batch[0])
                for j in range(1, len(cols)):  # (codes: a table's positions, int32)
                    parts[j].append(strings.code(batch[j]).astype(np.int32))
                del batch
            key = _drain(parts[0])
            ctype = _drain(parts[1])
            self.ci_type = _first_by_key(key, ctype, (ctype >= 0) & (ctype != strings.na))
            del ctype
            if names:
                cname = _drain(parts[2])
                self.ci_name = _first_by_key(key, cname, cname != _ABSENT)
        if "COMMUNICATION_TASK_INFO" in tables:
            mkey, mname = _columns(con, "COMMUNICATION_TASK_INFO", ["globalTaskId", "name"],
                                   "ki")
            mname = strings.code(mname)
            self.comm_name = _first_by_key(mkey, mname, mname != _ABSENT) if names else None
            self.comm = _first_by_key(mkey, mkey, np.ones(len(mkey), bool))

    def kinds(self, gid: np.ndarray, task_type: np.ndarray) -> np.ndarray:
        """Each task's type code: its compute task's type, else its own (`task_type`), else
        the empty value."""
        ci = _lookup(*self.ci_type, gid) if self.ci_type is not None else np.int32(_ABSENT)
        return _coalesce(ci, task_type, np.int32(self.strings.empty)).astype(np.int32,
                                                                               copy=False)

    def names(self, gid: np.ndarray, task_type: np.ndarray) -> np.ndarray:
        """Each task's name code: its compute task's name, else its communication task's,
        else its type (`task_type`), else the empty value (built with `names`)."""
        none = np.int32(_ABSENT)
        ci = _lookup(*self.ci_name, gid) if self.ci_name is not None else none
        comm = _lookup(*self.comm_name, gid) if self.comm_name is not None else none
        return _coalesce(ci, comm, task_type, np.int32(self.strings.empty)).astype(
            np.int32, copy=False)

    def communication(self, gid: np.ndarray) -> np.ndarray:
        """Whether each task is listed in ``COMMUNICATION_TASK_INFO``."""
        if self.comm is None:
            return np.zeros(len(gid), bool)
        return _lookup(*self.comm, gid) != _ABSENT


def _task_batches(con: UntrustedDatabase, lookups: _TaskLookups
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray]]:
    """``TASK`` batch by batch (`_batches`): starts, ends, ``globalTaskId``, the tasks' own
    type codes and their type codes (`_TaskLookups.kinds`)."""
    for start, end, ttype, gid in _batches(con, "TASK", ["startNs", "endNs", "taskType",
                                                         "globalTaskId"], "ttik"):
        if bool((end < start).any()):
            raise UnusualDatabase  # (`_read_rows` names the first such row)
        task_type = lookups.strings.code(ttype).astype(np.int32)
        del ttype
        yield start, end, gid, task_type, lookups.kinds(gid, task_type)


def _read_columns(con: UntrustedDatabase, tables: set[str], device_names: bool = True,
                  keep_host: Callable[[str], bool] | None = None,
                  fold: Sequence[frozenset[str]] | None = None,
                  classify: Callable[[str], str] | None = None) -> Parsed:
    """`_read_rows`' result (`omit_host`'s with `keep_host`), read by columns (see above);
    `UnusualDatabase` where it cannot be. The host tables' rows `keep_host` refuses are let go
    as each batch is read. With `fold`, the device tasks are folded as they are read
    (`_DeviceFold`), never kept: `Parsed.device_classes`.
    Every table is read batch by batch (`_batches`), and each batch's columns are let go as
    soon as what they give is taken from them, so that a rank is held about once, not in every
    intermediate form at the same time."""
    if not all(_integer_affinity(con, t, cols) for t, cols in _ID_COLUMNS.items()
               if t in tables):
        raise UnusualDatabase
    strings = _Strings(con)
    ops = None
    if "COMMUNICATION_OP" in tables:
        s, e, n = _columns(con, "COMMUNICATION_OP", ["startNs", "endNs", "opName"], "tti")
        if bool((e < s).any()):
            raise UnusualDatabase  # (`_read_rows` names the first such row)
        ops = (s, e, _coalesce(strings.code(n), np.full(len(n), strings.empty)))
        del s, e, n
    lookups = _TaskLookups(con, tables, strings, names=device_names
                           or "COMMUNICATION_TASK_INFO" in tables)
    cs: list[np.ndarray] = []  # the communication tasks: starts, ends, name codes
    ce: list[np.ndarray] = []
    cn: list[np.ndarray] = []
    table = strings.table
    if fold is not None:
        folding = _DeviceFold(table, fold, classify or (lambda _: ""), ops)
        for start, end, gid, task_type, kind in _task_batches(con, lookups):
            comm = lookups.communication(gid)
            tasks = None
            if bool(comm.any()):
                tasks = (start[comm], end[comm])
                cs.append(tasks[0])
                ce.append(tasks[1])
                cn.append(lookups.names(gid[comm], task_type[comm]))
                dev = ~comm
                start, end, kind = start[dev], end[dev], kind[dev]
            folding.add(start, end, kind, tasks)
            del start, end, gid, task_type, kind, comm, tasks
        folded = folding.finish()
        device, task, kinds = np.empty((0, 2), np.int64), np.empty(0, np.int16), ()
        names_of_tasks = None
    else:
        ds: list[np.ndarray] = []  # the device tasks: starts, ends, type codes (, names)
        de: list[np.ndarray] = []
        dk: list[np.ndarray] = []
        dn: list[np.ndarray] = []
        for start, end, gid, task_type, kind in _task_batches(con, lookups):
            comm = lookups.communication(gid)
            name = lookups.names(gid, task_type) if device_names or comm.any() else None
            if bool(comm.any()):
                cs.append(start[comm])
                ce.append(end[comm])
                cn.append(name[comm])
                dev = ~comm
                start, end, kind = start[dev], end[dev], kind[dev]
                name = name[dev] if device_names else None
            ds.append(start)
            de.append(end)
            dk.append(kind)
            if device_names:
                dn.append(name)
            del start, end, gid, task_type, kind, comm, name
        start, end = _drain(ds), _drain(de)
        order = np.argsort(start, kind="stable")
        device = taken_pair(start, end, order)
        del start, end
        task, type_codes = first_codes(_drain(dk)[order])
        kinds = tuple(table[type_codes])
        names_of_tasks = table[_drain(dn)[order]] if device_names else None
        del order
        folded = None
    del lookups
    communication = (_drain(cs), _drain(ce), _drain(cn)) if cs else None
    ranges, h_name, lane, lanes, counted = _host_rows(con, tables, strings, keep_host, ops,
                                                      communication)
    return Parsed(None, device, ranges, table[h_name], 0, task,
                  np.full(len(h_name), -1, np.int16), lane, kinds, lanes,
                  device_names=names_of_tasks, host_folded=counted, device_classes=folded)


def _host_rows(con: UntrustedDatabase, tables: set[str], strings: _Strings,
               keep_host: Callable[[str], bool] | None,
               ops: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
               communication: tuple[np.ndarray, np.ndarray, np.ndarray] | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...],
                          FoldedHost | None]:
    """The host ranges (sorted by start), their name codes, lane codes and lanes, and what
    the rows `keep_host` refused give (None: none refused): the host tables' rows (batch by
    batch), then `ops` (``COMMUNICATION_OP``) and the `communication` tasks, both in the
    ``Communication`` lane."""
    lanes: list[str] = []
    hs: list[np.ndarray] = []  # the host rows' starts, ends, value codes, lanes, by table
    he: list[np.ndarray] = []
    hn: list[np.ndarray] = []
    hl: list[np.ndarray] = []

    def add(s: np.ndarray, e: np.ndarray, n: np.ndarray, lane: str) -> None:
        if lane not in lanes:
            lanes.append(lane)
        hs.append(s)
        he.append(e)
        hn.append(n.astype(np.int32, copy=False))  # (a table's positions)
        hl.append(np.full(len(s), lanes.index(lane), np.int8))

    refused = None if keep_host is None else _refused_ids(strings, keep_host)
    counted = None
    for tab, column, lane in _HOST_COLUMNS:
        if tab not in tables:
            continue
        for s, e, n in _batches(con, tab, ["startNs", "endNs", column], "cci",
                                "startNs IS NOT NULL AND endNs IS NOT NULL"):
            if refused is not None:
                if bool((e < s).any()):
                    raise UnusualDatabase  # (as below, before any row is let go)
                s, e, n, left = _kept_rows(s, e, n, *refused)
                counted = left.joined(counted) if left is not None else counted
            add(s, e, _coalesce(strings.code(n), np.full(len(n), strings.empty)), lane)
            del s, e, n
    if ops is not None:
        add(*ops, _COMM_LANE)
    if communication is not None:
        add(*communication, _COMM_LANE)
    if not hs:
        return (np.empty((0, 2), np.int64), np.empty(0, np.int32), np.empty(0, np.int16), (),
                counted)
    h_start, h_end = _drain(hs), _drain(he)
    if bool((h_end < h_start).any()):
        raise UnusualDatabase  # (`_read_rows` names the first such row)
    horder = np.argsort(h_start, kind="stable")
    ranges = taken_pair(h_start, h_end, horder)
    del h_start, h_end
    lane, lane_codes = first_codes(_drain(hl)[horder])
    h_name = _drain(hn)[horder]
    del horder
    return ranges, h_name, lane, tuple(lanes[i] for i in lane_codes.tolist()), counted


class _DeviceFold:
    """torch-npu device tasks folded batch by batch (`add`) into one union per set of task
    classes asked for (`residency.traces.intervals.Folded`), with their counts by type and
    their extremes: `finish` gives the `FoldedClasses`. A set with ``communication`` takes
    the Communication lane's ranges too (``COMMUNICATION_OP``, communication tasks), as
    `residency.traces.busy.busy_tasks` counts them. Batches in time order (each starting no
    earlier than the one before) fold with one batch held; from the first batch out of that
    order on, the batches' rows are held once (20 bytes a task) and folded in at `finish`, one
    set at a time, so the unions are exact in any order and a rank's rows are never held once
    per set."""

    def __init__(self, table: np.ndarray, fold: Sequence[frozenset[str]],
                 classify: Callable[[str], str],
                 ops: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        self.table = table
        self.classify = classify
        self.sets = list(dict.fromkeys(fold))
        # per set, whether each value code's class is in it: filled for the codes tasks take
        # as their type (`_classified`), not for every string of STRING_IDS (op names too)
        self.member = [np.zeros(len(table), bool) for _ in self.sets]
        self.known = np.zeros(len(table), bool)
        self.unions = [iv.Folded() for _ in self.sets]
        self.bounds: list[tuple[int, int] | None] = [None] * len(self.sets)  # as recorded
        self.counts = np.zeros(len(table), np.int64)
        self.tasks = 0
        self.extremes: list[int] = []  # earliest start, latest end, earliest end
        if ops is not None and len(ops[0]):
            order = np.argsort(ops[0], kind="stable")
            self.ops: np.ndarray = taken_pair(ops[0], ops[1], order)
        else:
            self.ops = np.empty((0, 2), np.int64)
        self.op_at = [0] * len(self.sets)  # the next `ops` row each set takes
        self.held: list[tuple[np.ndarray, ...]] | None = None  # batches out of order, and after

    def add(self, start: np.ndarray, end: np.ndarray, kind: np.ndarray,
            communication: tuple[np.ndarray, np.ndarray] | None) -> None:
        """One batch: its device tasks (starts, ends, type codes) and its communication
        tasks' starts and ends (None: none)."""
        if len(start):
            self._classified(kind)
            seen = np.bincount(kind)  # (up to the largest code seen, not the whole table:
            self.counts[:len(seen)] += seen  # STRING_IDS may hold millions of op names)
            self.tasks += len(start)
            got = (int(start.min()), int(end.max()), int(end.min()))
            self.extremes = list(got) if not self.extremes else [
                min(got[0], self.extremes[0]), max(got[1], self.extremes[1]),
                min(got[2], self.extremes[2])]
        if self.held is None and not self._fold(start, end, kind, communication):
            self.held = []  # (out of time order: held from here on, folded at the end)
        if self.held is not None:
            none = np.empty(0, np.int64)
            self.held.append((start, end, kind, *(communication or (none, none))))

    def _classified(self, kind: np.ndarray) -> None:
        """Classify the type codes of `kind` not seen before (each distinct one once)."""
        new = np.unique(kind[~self.known[kind]])
        for code in new.tolist():
            klass = self.classify(str(self.table[code]))
            for member, classes in zip(self.member, self.sets, strict=True):
                member[code] = klass in classes
        self.known[new] = True

    def _fold(self, start: np.ndarray, end: np.ndarray, kind: np.ndarray,
              communication: tuple[np.ndarray, np.ndarray] | None) -> bool:
        """Fold one batch into every set's union where each set's rows of it start no earlier
        than its last batch's did (`Folded.floor`), so that no union gives up folding; False
        (nothing folded) where one would."""
        if len(start) and not iv.starts_sorted(start):  # (sorted once: each set's rows then
            order = np.argsort(start, kind="stable")  # come sorted)
            start, end, kind = start[order], end[order], kind[order]
        runs = []
        for j, (classes, member) in enumerate(zip(self.sets, self.member, strict=True)):
            m = member[kind]
            rows = [np.column_stack((start[m], end[m]))] if bool(m.any()) else []
            if "communication" in classes and communication is not None:
                rows.append(np.column_stack(communication))
            if not rows:
                continue
            cut = min(int(r[:, 0].min()) for r in rows)
            floor = self.unions[j].floor
            if floor is not None and cut < floor:
                return False
            stop = int(np.searchsorted(self.ops[:, 0], cut, "left")) if len(self.ops) else 0
            runs.append((j, rows, stop if "communication" in classes else None))
        for j, rows, stop in runs:
            if stop is not None and stop > self.op_at[j]:  # the operations that start
                rows.append(self.ops[self.op_at[j]:stop])  # before this batch's rows
                self.op_at[j] = stop
            self._add(j, rows)
        return True

    def _add(self, j: int, rows: list[np.ndarray]) -> None:
        """Rows of set `j`, in parts (each in any order), recorded and folded."""
        got = (min(int(r[:, 0].min()) for r in rows), max(int(r[:, 1].max()) for r in rows))
        was = self.bounds[j]
        self.bounds[j] = got if was is None else (min(was[0], got[0]), max(was[1], got[1]))
        self.unions[j].add(rows[0] if len(rows) == 1 else iv.union(*rows))

    def finish(self) -> FoldedClasses:
        """The folded tasks (the folding given up)."""
        unions = {}
        held, self.held = self.held or [], None
        for j, classes in enumerate(self.sets):
            if held:  # (one set's rows of the held batches at a time)
                rows = [np.column_stack((s[self.member[j][k]], e[self.member[j][k]]))
                        for s, e, k, _, _ in held]
                if "communication" in classes:
                    rows += [np.column_stack((cs, ce)) for _, _, _, cs, ce in held]
                rows = [r for r in rows if len(r)]
                if rows:
                    self._add(j, [np.concatenate(rows)])
                del rows
            if "communication" in classes and self.op_at[j] < len(self.ops):
                self._add(j, [self.ops[self.op_at[j]:]])
            unions[classes] = iv.Packed.of_parts(*self.unions[j].packed())
        present = np.flatnonzero(self.counts)
        counts = {str(self.table[c]): int(self.counts[c]) for c in present.tolist()}
        first_start, last_end, first_end = self.extremes or (0, 0, 0)
        return FoldedClasses(unions, dict(zip(self.sets, self.bounds, strict=True)), counts,
                             self.tasks, first_start, last_end, first_end)


def _refused_ids(strings: _Strings, keep_host: Callable[[str], bool]
                 ) -> tuple[np.ndarray, bool]:
    """The STRING_IDS ids (sorted) whose name `keep_host` decides otherwise than the empty
    name, and its verdict on the empty name (that of a NULL value, an absent id, no id): a
    host row is kept when its id is listed xor that verdict. Asked once per distinct value."""
    verdict = np.fromiter((bool(keep_host(v)) for v in strings.table.tolist()), bool,
                          len(strings.table))
    default = bool(verdict[strings.empty])
    by_id = np.where(strings.codes >= 0, verdict[np.maximum(strings.codes, 0)], default)
    return strings.ids[by_id != default], default


def _kept_rows(s: np.ndarray, e: np.ndarray, n: np.ndarray, listed: np.ndarray,
               default: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, FoldedHost | None]:
    """A host table's rows (starts, ends, name ids) that `_refused_ids` keeps, and what the
    others give (None: none left out)."""
    if len(listed):
        at = np.minimum(np.searchsorted(listed, n), len(listed) - 1)
        keep = listed[at] == n  # (`_NO_ID` is never a STRING_IDS id)
        if default:
            np.logical_not(keep, out=keep)
    else:
        keep = np.full(len(n), default)
    left = len(keep) - int(np.count_nonzero(keep))
    if not left:
        return s, e, n, None
    drop = ~keep
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    counted = FoldedHost(left, int(np.min(s, where=drop, initial=big)),
                         int(np.max(e, where=drop, initial=small)),
                         int(np.min(e, where=drop, initial=big)))
    del drop
    return s[keep], e[keep], n[keep], counted


def taken_pair(first: np.ndarray, second: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`np.column_stack([first[order], second[order]])`, written straight into place."""
    out = np.empty((len(order), 2), np.int64)
    for j, col in enumerate((first, second)):  # block by block: np.take into a column of
        for lo in range(0, len(order), BLOCK_ROWS):  # `out` (strided) buffers a whole copy
            out[lo:lo + BLOCK_ROWS, j] = col[order[lo:lo + BLOCK_ROWS]]
    return out


_MEMORY_SQL = """
SELECT m.timestamp, m.totalAllocated, m.totalReserved, COALESCE(s.value, '')
FROM MEMORY_RECORD m LEFT JOIN STRING_IDS s ON s.id = m.component
ORDER BY m.timestamp
"""


def read_db_memory(path: Path) -> list[tuple[int, int, int, str]]:
    """The ``MEMORY_RECORD`` rows of a torch-npu database (``profile_memory=True``), as
    ``(ts_ns, allocated_bytes, reserved_bytes, component)``: torch-npu writes ``timestamp`` in
    ns and the totals in bytes, ``component`` a ``STRING_IDS`` id of PTA, GE, PTA+GE or
    WORKSPACE (``prof_view/prof_db_parse/_memory_db_parser.py``, ``TableColumnsManager``).
    No such table: no rows. Rows whose values are not integers are left out.

    Raises:
        TraceError: not a SQLite database, or the table cannot be read.
    """
    con = _open_db(path)
    try:
        if "MEMORY_RECORD" not in _tables(con):
            return []
        rows = con.execute(_MEMORY_SQL).fetchall()
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"cannot read the table MEMORY_RECORD: {exc}") from None
    finally:
        con.close()
    return [(t, a, r, str(c)) for t, a, r, c in rows
            if type(t) is int and type(a) is int and type(r) is int]


def _times(path: Path, rows: list[tuple[Any, Any]]) -> np.ndarray:
    if not rows:
        return np.empty((0, 2), np.int64)
    bad = next((r for r in rows if type(r[0]) is not int or type(r[1]) is not int
                or r[1] < r[0]), None)
    if bad is not None:
        raise TraceError(path, f"a row's startNs/endNs are not ordered integer nanoseconds: "
                         f"{bad!r}")
    return np.array(rows, np.int64).reshape(-1, 2)


def _texts(values: list[str]) -> np.ndarray:
    distinct: dict[str, str] = {}
    out = np.empty(len(values), dtype=object)
    out[:] = [distinct.setdefault(v, v) for v in map(str, values)]
    return out
