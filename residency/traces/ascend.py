"""torch-npu profiles: which directories form one run, their ranks, clocks and SQLite export.

Layouts read (torch-npu 2.x, ``tensorboard_trace_handler`` / ``ExportType``; vLLM-Omni):

* ``{worker or host}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt/`` per rank and profiling session;
  ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (text export) or
  ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{rank}.db`` (``ExportType.Db``, SQLite).
* Several sessions of one rank (repeated start/stop) are listed; `choose_sessions` picks one per
  rank by ``latest``, an index ``N`` (0 = earliest) or an ISO time prefix of the session start
  (the directory name's timestamp), and refuses to guess.
* vLLM-Omni writes ``<dir>/diffusion_rank<N>/...`` and ``<dir>/stage<K>_rank<N>/...``: the text
  before ``rank<N>`` names a *group* (``diffusion``, ``stage0``); ranks of different groups are
  different processes, so one group is analysed at a time.
* Rank: ``profiler_info_<rank>.json``, else ``ascend_pytorch_profiler_<rank>.db``, else a
  ``[<group>_]rank<N>`` folder *below* the given root, never the ``*_ascend_pt`` directory's
  own name (it starts with the host name: ``gpu-rank7-a_...`` is not rank 7) nor a folder
  named after a host (``gpu-rank7/``: host names have no ``_``). A plain
  ``profiler_info.json`` (written without torch.distributed) records no rank: a lone session
  without a rank folder is read as rank 0, as any lone trace.
* Times: torch-npu writes absolute epoch microseconds. Ascend/pytorch PR #156 (open) would
  write them as numbers relative to the trace's own start (its ``_normalize_timestamps``),
  recording no offset; `align_clocks` detects times that cannot be epoch microseconds and
  refuses to put two such ranks on one time line (a lone rank is analysed, with a warning).
  The collection times in ``profiler_info_<rank>.json`` are not the reference the PR
  subtracts, so using them would misalign ranks silently.

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

import datetime as dt
import itertools
import re
import sqlite3
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from residency.traces.columns import Parsed
from residency.traces.files import RANK_COMPONENT_RE, TraceError
from residency.traces.sqlitedb import UntrustedDatabase, open_untrusted

__all__ = ["AscendSession", "RELATIVE_LIMIT_NS", "SUMMARIES_ONLY", "StepCheck", "align_clocks",
           "choose_sessions", "find_sessions", "profiler_db_problem", "read_db",
           "read_db_memory", "read_kernel_details", "read_step_trace", "step_checks",
           "summaries_only"]

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
KERNEL_DETAILS = "kernel_details.csv"
STEP_TRACE = "step_trace_time.csv"
_DIR_RE = re.compile(r"^(?P<worker>.+)_(?P<pid>\d+)_(?P<time>\d{17})_ascend_pt$")
_INFO_RE = re.compile(r"profiler_info_(\d+)\.json")
_DB_RE = re.compile(r"ascend_pytorch_profiler_(\d+)\.db")
# "[<group>_]rank<N>": "_" never occurs in host names (RFC 1123), so a folder named after a host
# ("gpu-rank7", "node.rank7") is no rank folder
RELATIVE_LIMIT_NS = 10**17  # 1e17 ns after the epoch is in 1973: earlier, not epoch times


@dataclass(frozen=True)
class AscendSession:
    """One ``*_ascend_pt`` directory: its rank, vLLM-Omni group and session start."""

    directory: Path
    source: Path  # trace_view.json, or the SQLite export when there is no text export
    rank: int | None
    group: str  # "" outside vLLM-Omni's <group>_rank<N>/ folders
    started: dt.datetime | None  # from the directory name, local time of the profiled host

    @property
    def session(self) -> str:
        """The session's label: its start as ISO text (ms), else the directory name."""
        if self.started is None:
            return self.directory.name
        return self.started.isoformat(timespec="milliseconds")


def find_sessions(root: Path, directories: list[Path]) -> list[AscendSession]:
    """Describe every ``*_ascend_pt`` directory found below `root`, and every torch-npu export
    file found outside one (a ``trace_view.json`` or ``ascend_pytorch_profiler_<rank>.db``
    in ``ASCEND_PROFILER_OUTPUT/`` given as the path, a loose ``rank0/trace_view.json``).

    Raises:
        TraceError: a directory with neither a text nor a database export (one with only
            ``kernel_details.csv`` and other summaries: not supported), or with more than one
            ``profiler_info_<rank>.json``.

    Warns:
        UserWarning: a ``profiler_info_<rank>.json`` (or database) rank that contradicts the
            ``rank<N>`` folder it lies in (the profiler's own rank is used).
    """
    found = []
    for d in directories:
        if d.is_dir():
            session, source = d, _source(d)
        elif d.parent.name == OUTPUT_DIR and d.parent.parent.name.endswith("_ascend_pt"):
            session, source = d.parent.parent, d  # the export of a session: its directory
        else:
            session, source = d, d  # a loose export file stands for itself
        m = _DIR_RE.match(session.name)
        started = None
        if m:
            try:
                started = dt.datetime.strptime(m.group("time") + "000", "%Y%m%d%H%M%S%f")
            except ValueError:
                started = None
        # profiler_info_<rank>.json lies in the session directory (for a loose export: beside
        # it, or above its ASCEND_PROFILER_OUTPUT folder)
        info = session if session.is_dir() else session.parent
        info = info.parent if info.name == OUTPUT_DIR else info
        rank = _info_rank(info)
        if rank is None and (db := _DB_RE.fullmatch(source.name)):
            rank = int(db.group(1))
        group, path_rank = _path_rank(d, root)
        if rank is not None and path_rank is not None and rank != path_rank:
            warnings.warn(f"{d}: the profiler recorded rank {rank} but it lies in a rank"
                          f"{path_rank} folder; rank {rank} is used", UserWarning, stacklevel=3)
        found.append(AscendSession(session, source, rank if rank is not None else path_rank,
                                   group, started))
    return found


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


def summaries_only(d: Path) -> bool:
    """Whether `d` (a session or its ``ASCEND_PROFILER_OUTPUT``) holds torch-npu's CSV
    summaries (``kernel_details.csv``, ...) but no timeline."""
    out = d if d.name == OUTPUT_DIR else d / OUTPUT_DIR
    return (out / KERNEL_DETAILS).is_file() and not (out / TRACE_VIEW).is_file()


SUMMARIES_ONLY = ("holds kernel_details.csv but no trace_view.json and no "
                  "ascend_pytorch_profiler_<rank>.db: a layout of summaries only, which is not "
                  "supported (idle needs the timeline: profile with the text export, "
                  "torch_npu.profiler ExportType.Text, or the database export, ExportType.Db)")


def _source(d: Path) -> Path:
    out = d / OUTPUT_DIR
    if (out / TRACE_VIEW).is_file():
        return out / TRACE_VIEW
    dbs = sorted(p for p in out.glob("ascend_pytorch_profiler*.db") if p.is_file())
    if len(dbs) == 1:
        return dbs[0]
    if len(dbs) > 1:
        raise TraceError(d, f"more than one database export: {', '.join(p.name for p in dbs)}")
    if summaries_only(d):
        raise TraceError(d, SUMMARIES_ONLY)
    raise TraceError(d, f"no {OUTPUT_DIR}/{TRACE_VIEW} and no {OUTPUT_DIR}/"
                     "ascend_pytorch_profiler_<rank>.db (was the profile parsed? torch-npu "
                     "writes them when profiling stops)")


def _info_rank(d: Path) -> int | None:
    ranks = {int(m.group(1)) for f in d.glob("profiler_info_*.json")
             if (m := _INFO_RE.fullmatch(f.name))}
    if len(ranks) > 1:
        raise TraceError(d, f"more than one profiler_info_<rank>.json: {sorted(ranks)}")
    return ranks.pop() if ranks else None  # (a plain profiler_info.json records no rank)


def _path_rank(d: Path, root: Path) -> tuple[str, int | None]:
    """The group and rank of the deepest ``[<group>_]rank<N>`` folder between `root` and `d`
    (both excluded: `d`'s name starts with a host name)."""
    try:
        parts = d.relative_to(root).parts[:-1]
    except ValueError:
        parts = ()
    for part in reversed(parts):
        if m := RANK_COMPONENT_RE.fullmatch(part):
            return (m.group("group") or ""), int(m.group("rank"))
    return "", None


def choose_sessions(root: Path, directories: list[Path], *, session: str | None = None,
                    group: str | None = None) -> list[AscendSession]:
    """One session per rank of one group, as chosen by `session` (``latest``, an index ``N``
    counted from the earliest, or an ISO time prefix such as ``2025-11-30T01:02``) and `group`.
    `session` applies to the ranks with several sessions; a rank with one keeps it.

    Raises:
        TraceError: several groups and no (or an unknown) `group`; several sessions of a rank
            and no `session`; a `session` that matches no session, or several, of a rank. Each
            message lists the candidates.
    """
    found = find_sessions(root, directories)
    groups = sorted({s.group for s in found})
    if group is not None:
        if group not in groups:
            raise TraceError(root, f"no group {group!r}; the groups are: "
                             f"{', '.join(repr(g) for g in groups)}")
        found = [s for s in found if s.group == group]
    elif len(groups) > 1:
        listed = ", ".join(f"{g!r} ({sum(s.group == g for s in found)} directories)"
                           for g in groups)
        raise TraceError(root, f"holds the traces of several process groups: {listed}; "
                         "choose one with --group NAME (group= in the API)")
    by_rank: dict[int | None, list[AscendSession]] = {}
    for s in found:
        by_rank.setdefault(s.rank, []).append(s)
    chosen = list(by_rank.pop(None, []))  # unknown ranks: load_traces names them
    several = {r: v for r, v in by_rank.items() if len(v) > 1}
    for rank, candidates in sorted(by_rank.items()):
        candidates = sorted(candidates, key=_order)
        if session is None or len(candidates) == 1:  # a lone session is its rank's choice
            if len(candidates) > 1:
                raise TraceError(root, f"rank {rank} has {len(candidates)} profiling sessions "
                                 f"({_listing(candidates)}); choose one with --session "
                                 "latest|N|ISO-time (session= in the API)"
                                 + (f"; {len(several) - 1} other rank(s) too"
                                    if len(several) > 1 else ""))
            chosen.append(candidates[0])
        else:
            chosen.append(_pick(root, rank, candidates, session))
    return chosen


def _order(s: AscendSession) -> tuple[Any, ...]:
    return (s.started is None, s.started or dt.datetime.min, s.directory.name)


def _listing(candidates: list[AscendSession]) -> str:
    return "; ".join(f"[{i}] {s.session} {s.directory.name}" for i, s in enumerate(candidates))


def _pick(root: Path, rank: int, candidates: list[AscendSession], choice: str) -> AscendSession:
    text = choice.strip()
    if text == "latest":
        return candidates[-1]
    if re.fullmatch(r"-?\d{1,3}", text):  # longer digit strings are years
        i = int(text)
        if -len(candidates) <= i < len(candidates):
            return candidates[i]
        raise TraceError(root, f"--session {choice}: rank {rank} has {len(candidates)} "
                         f"session(s): {_listing(candidates)}")
    prefix = text.replace(" ", "T")
    hits = [s for s in candidates if s.session.startswith(prefix)]
    if len(hits) == 1:
        return hits[0]
    what = "matches no session" if not hits else f"matches {len(hits)} sessions"
    raise TraceError(root, f"--session {choice} {what} of rank {rank}: "
                     f"{_listing(candidates)} (use latest, an index or a longer ISO time)")


def align_clocks(sources: list[Path], parsed: list[Any]) -> list[Any]:
    """Check that every rank's times are epoch times (or were anchored when parsed).

    A rank whose every time lies below `RELATIVE_LIMIT_NS` was written relative to its own
    start (Ascend/pytorch PR #156): alone it is analysed (with a warning); beside other ranks
    it is refused, since nothing in the profile records the offset that puts the ranks on
    one clock.

    Raises:
        TraceError: relative times in a run of more than one rank.
    """
    relative = [src for src, p in zip(sources, parsed, strict=True) if _is_relative(p)]
    if relative and len(parsed) > 1:
        raise TraceError(relative[0], "timestamps are relative to the profile's start (numbers "
                         f"below {RELATIVE_LIMIT_NS // 10**9} s after the epoch, as Ascend/"
                         "pytorch PR #156 writes them) and the profile records no offset to "
                         "epoch time; the ranks cannot be aligned, so they are not analysed "
                         f"together ({len(relative)} of {len(parsed)} ranks; analyse one "
                         "rank's directory alone)")
    if relative:
        warnings.warn(f"{relative[0]}: timestamps are relative to the profile's start, not "
                      "epoch times; figures of this one rank are unaffected", UserWarning,
                      stacklevel=3)
    return parsed


def _is_relative(p: Any) -> bool:
    ends = [a[:, 1] for a in (p.device, p.ranges) if len(a)]
    if not ends:
        return False
    return max(int(np.abs(e).max()) for e in ends) < RELATIVE_LIMIT_NS


# -- SQLite export -----------------------------------------------------------------------------

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


def _open_db(path: Path, *, digest: bool = False) -> UntrustedDatabase:
    """`path` opened read-only and immutable, schema untrusted, every query bounded
    (`residency.traces.sqlitedb`; with `digest`, a private copy hashed as it is made);
    TraceError when it cannot be."""
    return open_untrusted(path, digest=digest)


def _tables(con: UntrustedDatabase) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def read_db(path: Path, *, digest: bool = False) -> Parsed:
    """Read a torch-npu ``ascend_pytorch_profiler_<rank>.db`` (or msprof database) with the
    standard library, into the columns a text export gives: every ``TASK`` row a device task
    (type: its ``COMPUTE_TASK_INFO.taskType`` when it has one, else ``TASK.taskType``, both
    through ``STRING_IDS``, as the text export's ``Task Type``; its name, from
    ``COMPUTE_TASK_INFO``, kept as ``device_names``), except those listed in
    ``COMMUNICATION_TASK_INFO``, which with the ``COMMUNICATION_OP`` operations are ranges of
    the ``Communication`` lane as in the text export; ``PYTORCH_API`` (lane ``Python``),
    ``CANN_API`` (``CANN``) and ``MSTX_EVENTS`` (``MsTx``) rows host ranges; the rank from
    ``RANK_DEVICE_MAP``. With `digest`, SQLite reads a private copy of the file and the
    parse's `digest` is the content digest of exactly those bytes.

    Raises:
        TraceError: not a SQLite database, or a required table (``STRING_IDS``, ``TASK``)
            missing, named in the message.
    """
    con = _open_db(path, digest=digest)
    try:
        tables = _tables(con)
        for table in _REQUIRED:
            if table not in tables:
                raise TraceError(path, f"no table {table}: not a torch-npu profiler database "
                                 f"(tables: {', '.join(sorted(tables)) or 'none'})")
        try:
            parsed = _read_columns(con, tables)
        except (_Unusual, sqlite3.DatabaseError):  # (an odd schema or odd values, or an
            # error: SQLite's own joins, row by row, which name it as they always did)
            parsed = _read_rows(path, con, tables)
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
    used where `_read_columns` declines (`_Unusual`)."""
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


# -- the same reading, by columns ------------------------------------------------------------
# Each table is scanned once, plainly (no join, no subquery, no temporary table), in batches
# turned into int64 columns at once; the joins are done on the columns (sorted keys, first
# rows by scan order), as `_DEVICE_SQL`'s lookups and the LEFT JOINs of `_HOST_SQL` do them.
# That equivalence holds when every id is an integer that appears once in STRING_IDS, every
# id column has INTEGER affinity (so no text is converted to match a number), the string
# values are text or NULL and the times the SQL does not CAST are integers in order; in
# any other case `_Unusual` sends the file to `_read_rows`.

_NO_ID = -(2**63)  # an id column's NULL or non-integer: matches no STRING_IDS id
_ABSENT, _NULL = -1, -2  # lookups: no such id; the id's value is NULL
_ID_COLUMNS = {"STRING_IDS": ("id",), "TASK": ("taskType", "globalTaskId"),
               "COMPUTE_TASK_INFO": ("globalTaskId", "name", "taskType"),
               "COMMUNICATION_TASK_INFO": ("globalTaskId", "name"),
               "PYTORCH_API": ("name",), "CANN_API": ("name",), "MSTX_EVENTS": ("message",),
               "COMMUNICATION_OP": ("opName",)}
_HOST_COLUMNS = (("PYTORCH_API", "name", "Python"), ("CANN_API", "name", "CANN"),
                 ("MSTX_EVENTS", "message", "MsTx"))


class _Unusual(Exception):
    """The database is outside what `_read_columns` reads exactly (see above)."""


def _integer_affinity(con: UntrustedDatabase, table: str, columns: tuple[str, ...]) -> bool:
    declared = {r[1]: str(r[2] or "").upper()
                for r in con.execute(f"PRAGMA main.table_info({table})")}
    return all(c in declared and "INT" in declared[c] for c in columns)


def _columns(con: UntrustedDatabase, table: str, columns: list[str], kinds: str,
             where: str = "") -> list[np.ndarray]:
    """Int64 columns of `table`, per `kinds` letter: ``t`` an integer (else `_Unusual`), ``c``
    one CAST to an integer, ``i`` an id (NULL or not an integer: `_NO_ID`), ``k`` a key
    (NULL: `_NO_ID`; another non-integer, or the integer `_NO_ID` itself: `_Unusual`).
    SQLite's typeof() decides in the query, so every value fetched is an int (or NULL where
    the table is unusual), and each batch goes into numpy in one pass."""
    exprs = []
    for c, k in zip(columns, kinds, strict=True):
        exprs.append(f"CAST({c} AS INTEGER)" if k == "c" else
                     f"CASE typeof({c}) WHEN 'integer' THEN {c} END" if k == "t" else
                     f"CASE typeof({c}) WHEN 'integer' THEN {c} ELSE {_NO_ID} END" if k == "i"
                     else f"CASE typeof({c}) WHEN 'integer' THEN {c} WHEN 'null' THEN {_NO_ID} "
                     "END")
    width = len(kinds)
    parts: list[list[np.ndarray]] = [[] for _ in kinds]
    for batch in con.batches(f"SELECT {', '.join(exprs)} FROM main.{table}{where}"):
        try:
            block = np.fromiter(itertools.chain.from_iterable(batch), np.int64,
                                len(batch) * width).reshape(-1, width)
        except (TypeError, ValueError, OverflowError):  # a NULL: a value of another type
            raise _Unusual from None
        for j, part in enumerate(parts):
            part.append(block[:, j].copy())
    out = []
    for part in parts:  # (each column's batches freed as it is joined)
        out.append(np.concatenate(part) if part else np.empty(0, np.int64))
        part.clear()
    for c, k, col in zip(columns, kinds, out, strict=True):
        if k == "k" and bool((col == _NO_ID).any()) and con.execute(
                f"SELECT 1 FROM main.{table} WHERE {c} = {_NO_ID} LIMIT 1").fetchall():
            raise _Unusual  # (that integer itself, not a NULL)
    return out


class _Strings:
    """STRING_IDS as sorted ids beside value codes into `table` (distinct text values;
    `_NULL` for a NULL value)."""

    def __init__(self, con: UntrustedDatabase) -> None:
        rows = con.execute("SELECT id, value FROM STRING_IDS").fetchall()
        if not all(type(i) is int and i != _NO_ID and (v is None or type(v) is str)
                   for i, v in rows):
            raise _Unusual
        ids = np.array([i for i, _ in rows], np.int64)
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        if len(self.ids) > 1 and bool((self.ids[1:] == self.ids[:-1]).any()):
            raise _Unusual  # a repeated id multiplies SQLite's joins: `_read_rows` says so
        distinct: dict[str, int] = {}
        codes = [_NULL if v is None else distinct.setdefault(v, len(distinct)) for _, v in rows]
        self.codes = np.array(codes, np.int64)[order]
        self.empty = distinct.setdefault("", len(distinct))
        self.na = distinct.get("N/A", _ABSENT)
        self.table = np.empty(len(distinct), dtype=object)
        self.table[:] = list(distinct)

    def code(self, ids: np.ndarray) -> np.ndarray:
        """Each id's value code; `_ABSENT` where no row has the id."""
        if not len(self.ids):
            return np.full(len(ids), _ABSENT, np.int64)
        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[at] == ids, self.codes[at], _ABSENT)


def _first_by_key(keys: np.ndarray, values: np.ndarray, keep: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct key (`_NO_ID` left out) the value of its first kept row, in scan order."""
    keep = keep & (keys != _NO_ID)
    unique, first = np.unique(keys[keep], return_index=True)
    return unique, values[keep][first]


def _lookup(unique: np.ndarray, values: np.ndarray, keys: np.ndarray,
            missing: int = _ABSENT) -> np.ndarray:
    if not len(unique):
        return np.full(len(keys), missing, np.int64)
    at = np.minimum(np.searchsorted(unique, keys), len(unique) - 1)
    return np.where((unique[at] == keys) & (keys != _NO_ID), values[at], missing)


def _coalesce(*codes: np.ndarray) -> np.ndarray:
    """The first value code that is a value (neither `_ABSENT` nor `_NULL`), row by row."""
    out = codes[-1]
    for c in reversed(codes[:-1]):
        out = np.where(c >= 0, c, out)
    return out


def _first_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes renumbered by first appearance (as a dict filled row by row numbers them): the
    new codes and the old code of each new one."""
    if not len(codes):
        return np.empty(0, np.int16), np.empty(0, np.int64)
    codes = codes.astype(np.int64, copy=False)
    present = np.flatnonzero(np.bincount(codes))  # (codes are small: a table's positions)
    first = np.array([int(np.argmax(codes == c)) for c in present.tolist()], np.int64)
    old = present[np.argsort(first, kind="stable")]
    new = np.zeros(int(present[-1]) + 1, np.int16)
    new[old] = np.arange(len(old))
    return new[codes], old


def _drain(parts: list[np.ndarray]) -> np.ndarray:
    out = np.concatenate(parts)
    parts.clear()
    return out


def _read_columns(con: UntrustedDatabase, tables: set[str]) -> Parsed:
    """`_read_rows`' result, read by columns (see above); `_Unusual` where it cannot be."""
    if not all(_integer_affinity(con, t, cols) for t, cols in _ID_COLUMNS.items()
               if t in tables):
        raise _Unusual
    strings = _Strings(con)
    start, end, ttype, gid = _columns(con, "TASK", ["startNs", "endNs", "taskType",
                                                    "globalTaskId"], "ttik")
    task_type = strings.code(ttype)
    none = np.full(len(gid), _ABSENT, np.int64)
    ci_name, ci_type = none, none
    if "COMPUTE_TASK_INFO" in tables:
        ckey, cname, ctype = _columns(con, "COMPUTE_TASK_INFO",
                                      ["globalTaskId", "name", "taskType"], "kii")
        cname, ctype = strings.code(cname), strings.code(ctype)
        ci_name = _lookup(*_first_by_key(ckey, cname, cname != _ABSENT), gid)
        ci_type = _lookup(*_first_by_key(ckey, ctype, (ctype >= 0) & (ctype != strings.na)),
                          gid)
        del ckey, cname, ctype
    comm_name, comm = none, np.zeros(len(gid), bool)
    if "COMMUNICATION_TASK_INFO" in tables:
        mkey, mname = _columns(con, "COMMUNICATION_TASK_INFO", ["globalTaskId", "name"],
                               "ki")
        mname = strings.code(mname)
        comm_name = _lookup(*_first_by_key(mkey, mname, mname != _ABSENT), gid)
        comm = _lookup(*_first_by_key(mkey, mkey, np.ones(len(mkey), bool)), gid) != _ABSENT
    empty = np.full(len(gid), strings.empty, np.int64)
    name = _coalesce(ci_name, comm_name, task_type, empty)
    kind = _coalesce(ci_type, task_type, empty)
    del ci_name, ci_type, comm_name, task_type, empty, ttype, gid, none
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
        hn.append(n.astype(np.int32))  # (a table's positions)
        hl.append(np.full(len(s), lanes.index(lane), np.int8))

    for table, column, lane in _HOST_COLUMNS:
        if table in tables:
            s, e, n = _columns(con, table, ["startNs", "endNs", column], "cci",
                               " WHERE startNs IS NOT NULL AND endNs IS NOT NULL")
            add(s, e, _coalesce(strings.code(n), np.full(len(n), strings.empty)), lane)
    if "COMMUNICATION_OP" in tables:
        s, e, n = _columns(con, "COMMUNICATION_OP", ["startNs", "endNs", "opName"], "tti")
        add(s, e, _coalesce(strings.code(n), np.full(len(n), strings.empty)), _COMM_LANE)
    add(start[comm], end[comm], name[comm], _COMM_LANE)
    s = e = n = None  # type: ignore[assignment]  (held only by the lists, freed as drained)
    dev = ~comm
    start, end, name, kind = start[dev], end[dev], name[dev], kind[dev]
    h_start, h_end, h_name, h_lane = _drain(hs), _drain(he), _drain(hn), _drain(hl)
    if bool((end < start).any()) or bool((h_end < h_start).any()):
        raise _Unusual  # (`_read_rows` names the first such row)
    order = np.argsort(start, kind="stable")
    horder = np.argsort(h_start, kind="stable")
    task, type_codes = _first_codes(kind[order])
    lane, lane_codes = _first_codes(h_lane[horder])
    table = strings.table
    h_name = h_name[horder]
    return Parsed(None, np.column_stack([start[order], end[order]]),
                  np.column_stack([h_start[horder], h_end[horder]]), table[h_name], 0, task,
                  np.full(len(horder), -1, np.int16), lane, tuple(table[type_codes]),
                  tuple(lanes[i] for i in lane_codes.tolist()),
                  device_names=table[name[order]])


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


# -- torch-npu's own figures: step_trace_time.csv, kernel_details.csv ------------------------

@dataclass(frozen=True)
class StepCheck:
    """One row of ``step_trace_time.csv`` beside our figures for the same step (ns).

    `step`: the row's ``Step`` ("" when the profile had no steps: the row covers the whole
    timeline); `window`: the step's device time range, from ``kernel_details.csv`` (the
    first start to the last end of the step's kernels, as torch-npu bounds a step by the
    tasks it launched), None for the whole timeline; ours are None when the step's range is
    unknown (no ``kernel_details.csv`` row of that step)."""

    step: str
    reported_computing_ns: int
    reported_free_ns: int
    computing_ns: int | None
    free_ns: int | None
    window: tuple[int, int] | None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object."""
        return {"step": self.step, "reported_computing_ns": self.reported_computing_ns,
                "computing_ns": self.computing_ns, "reported_free_ns": self.reported_free_ns,
                "free_ns": self.free_ns,
                "window_ns": None if self.window is None else list(self.window)}


_CSV_MAX_BYTES = 4 << 30


def _csv_rows(path: Path) -> Any:
    """The rows of a torch-npu CSV summary as dicts (opened as traces are: a regular file
    within the size limit); TraceError when it cannot be read."""
    import csv

    from residency.traces.files import open_regular

    fd, _ = open_regular(path, max_bytes=_CSV_MAX_BYTES)
    with open(fd, encoding="utf-8-sig", errors="replace", newline="") as f:
        try:
            yield from csv.DictReader(f)
        except csv.Error as exc:
            raise TraceError(path, f"cannot read the CSV: {exc}") from None


def _us(text: Any) -> int | None:
    """Microsecond text as torch-npu writes it (``"1736413971558972.912\\t"``: a trailing
    tab keeps spreadsheets from rounding it) to int64 ns; None when not a number."""
    from residency.traces.units import decimal_us_to_ns

    return decimal_us_to_ns(text.strip()) if isinstance(text, str) and text.strip() else None


def read_step_trace(path: Path) -> list[tuple[str, int, int]]:
    """``(step, computing_ns, free_ns)`` per row of a ``step_trace_time.csv`` (columns
    ``Step``, ``Computing``, ``Free`` in us, as torch-npu's ``TraceStepTimeParser`` writes them:
    sums of the ``Overlap Analysis`` slices that start in the step). Rows whose figures are not
    numbers are left out.

    Raises:
        TraceError: the file cannot be read, or lacks one of those columns (named).
    """
    out = []
    for i, row in enumerate(_csv_rows(path)):
        if i == 0:
            missing = [c for c in ("Step", "Computing", "Free") if c not in row]
            if missing:
                raise TraceError(path, f"no column {missing[0]!r} (columns: "
                                 f"{', '.join(map(str, row))})")
        computing, free = _us(row.get("Computing")), _us(row.get("Free"))
        if computing is not None and free is not None:
            out.append((str(row.get("Step") or "").strip(), computing, free))
    return out


def read_kernel_details(path: Path) -> dict[str, tuple[int, int]]:
    """Each ``Step Id`` of a ``kernel_details.csv`` and its kernels' range ``[first start,
    last end)`` in ns (``Start Time(us)``, with its trailing tab, + ``Duration(us)``); {} when
    the file has no ``Step Id`` column (a profile without steps).

    Raises:
        TraceError: the file cannot be read, or lacks ``Start Time(us)`` / ``Duration(us)``.
    """
    out: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(_csv_rows(path)):
        if i == 0:
            missing = [c for c in ("Start Time(us)", "Duration(us)") if c not in row]
            if missing:
                raise TraceError(path, f"no column {missing[0]!r} (columns: "
                                 f"{', '.join(map(str, row))})")
            if "Step Id" not in row:
                return {}
        start, dur = _us(row.get("Start Time(us)")), _us(row.get("Duration(us)"))
        step = str(row.get("Step Id") or "").strip()
        if start is None or dur is None or dur < 0 or not step:
            continue
        lo, hi = out.get(step, (start, start + dur))
        out[step] = (min(lo, start), max(hi, start + dur))
    return out


def _starting_in(merged: np.ndarray, window: tuple[int, int] | None) -> int:
    """Total length of the merged intervals whose start lies in `window` (all: None), as
    torch-npu assigns an Overlap Analysis slice to the step it starts in."""
    if window is not None:
        merged = merged[(merged[:, 0] >= window[0]) & (merged[:, 0] < window[1])]
    return int((merged[:, 1] - merged[:, 0]).sum())


def step_checks(output_dir: Path, computing: np.ndarray, free: np.ndarray) -> list[StepCheck]:
    """torch-npu's per-step Computing and Free (``step_trace_time.csv`` in `output_dir`)
    beside ours: `computing` and `free` are our merged computing and free intervals (ns).
    No ``step_trace_time.csv``: []. Steps are bounded by ``kernel_details.csv``.

    Raises:
        TraceError: either CSV exists but cannot be read (named).
    """
    steps_csv = output_dir / STEP_TRACE
    if not steps_csv.is_file():
        return []
    rows = read_step_trace(steps_csv)
    kernels = output_dir / KERNEL_DETAILS
    ranges = read_kernel_details(kernels) if kernels.is_file() else {}
    out = []
    for step, computing_ns, free_ns in rows:
        window = None if not step else ranges.get(step)
        known = not step or window is not None
        out.append(StepCheck(step, computing_ns, free_ns,
                             _starting_in(computing, window) if known else None,
                             _starting_in(free, window) if known else None, window))
    return out
