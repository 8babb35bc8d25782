"""Reading an untrusted SQLite file (a profiler's database export): bounded, read-only, inert.

`open_untrusted(path)` opens a regular file read-only and immutable (``mode=ro&immutable=1``:
nothing is ever written beside it, no ``-wal``/``-shm``/journal, WAL content not replayed),
with ``PRAGMA trusted_schema=OFF`` (functions with side effects and virtual tables in its
schema, views and generated columns refused), length limits (strings and blobs, SQL text),
and every query bounded in time (a progress handler stops it past the budget) and in rows
(a database of B bytes cannot hold more than about B / 8 rows of distinct facts: a join that
multiplies duplicate ids is stopped). Errors are `TraceError` naming the file and saying which
bound was met. Analysis-side: standard library and numpy.

`UntrustedDatabase.int_columns` reads a query's integer columns with the compiled reader
(``_sqlitedb.c``, built where SQLite's header is; the same guards on a connection of its
own, no Python object a value), else by batches of Python rows; ``RESIDENCY_PURE_PYTHON=1``
turns the compiled reader off, as it does the Kineto one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from residency.traces.files import (
    MAX_TRACE_BYTES,
    TraceError,
    active_seal,
    check_regular,
    content_hash,
    hashed_copy,
    open_regular,
    verified_copy,
)

__all__ = ["MAX_VALUE_BYTES", "NO_INTEGER", "QUERY_BUDGET_S", "UntrustedDatabase",
           "compiled_reader", "open_untrusted", "python_reader"]

QUERY_BUDGET_S = 600.0   # one query of one database; far beyond a real profile's
MAX_VALUE_BYTES = 16 << 20  # the longest string or blob a row may hold (SQLITE_LIMIT_LENGTH)
_MAX_SQL_BYTES = 1 << 20
_PROGRESS_EVERY = 10_000  # VM instructions between two checks of the budget
_MIN_ROWS = 100_000  # rows any query may return, whatever the file's size

try:
    from residency.traces import _sqlitedb as _ext
except ImportError:  # not built (no compiler or no SQLite header at install time)
    _ext = None


def _compiled_on() -> bool:
    from residency.traces.kineto_scan import DISABLE_ENV

    return _ext is not None and os.environ.get(DISABLE_ENV, "") in ("", "0")


_int_columns = _ext.int_columns if _compiled_on() else None  # type: ignore[union-attr]
_SQLITE_INTERRUPT, _SQLITE_TOOBIG = 9, 18  # SQLite's primary result codes
NO_INTEGER = -(2**63)  # `UntrustedDatabase.int_columns`: a value its rule maps to "none"


def compiled_reader() -> bool:
    """Whether `UntrustedDatabase.int_columns` reads with the compiled reader here."""
    return _int_columns is not None


@contextlib.contextmanager
def python_reader() -> Iterator[None]:
    """Within: every `UntrustedDatabase.int_columns` reads by Python rows (comparisons of the
    two readers, counts of SQLite's work on the connection)."""
    global _int_columns
    saved, _int_columns = _int_columns, None
    try:
        yield
    finally:
        _int_columns = saved


class Rows:
    """The rows of one query, fetched in full within the bounds (iterable, `fetchall`)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every row."""
        return self._rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


class UntrustedDatabase:
    """A read-only, immutable connection whose `execute` is bounded (module doc)."""

    def __init__(self, path: Path, con: sqlite3.Connection, *, max_rows: int,
                 budget_s: float, copy: Path | None = None, uri: str | None = None) -> None:
        self.path, self._con, self.max_rows, self.budget_s = path, con, max_rows, budget_s
        self._uri = uri  # the read-only, immutable URI `con` was opened with
        self._copy = copy  # a sealed file's private copy, removed on close
        self.digest: str | None = None  # of the bytes SQLite reads, when asked for
        self.unchanged: os.stat_result | None = None  # the status `digest` was taken at
        self._deadline = 0.0
        # SQLite enforces the length bound itself where Python can set it (3.11+)
        self._limited = hasattr(con, "setlimit")
        con.set_progress_handler(self._past_budget, _PROGRESS_EVERY)

    def _too_many_rows(self) -> TraceError:
        return TraceError(self.path, f"a query returned more than {self.max_rows} rows, more "
                          "than a database of this size holds (ids repeated to multiply a "
                          "join?); not read")

    def _past_budget(self) -> int:
        return int(time.monotonic() > self._deadline)

    def execute(self, sql: str, parameters: tuple[Any, ...] = ()) -> Rows:
        """Run one query and fetch its rows, within the time and row bounds.

        Raises:
            sqlite3.DatabaseError: the database's own errors (not a database, a bad table);
            TraceError: a bound met, named.
        """
        self._deadline = time.monotonic() + self.budget_s
        rows: list[tuple[Any, ...]] = []
        try:
            cur = self._con.execute(sql, parameters)
            while batch := cur.fetchmany(10_000):
                if not self._limited:
                    _check_lengths(self.path, batch)
                rows += batch
                if len(rows) > self.max_rows:
                    raise self._too_many_rows()
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:
            _raise_bound(self, exc)
            raise
        return Rows(rows)

    def batches(self, sql: str, size: int = 65_536) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of one query in batches of at most `size`, within the bounds `execute`
        keeps (the time budget and the row bound count the whole query), so a caller can
        turn each batch into columns and hold no more than one batch of Python rows.

        Raises:
            as `execute`.
        """
        self._deadline = time.monotonic() + self.budget_s
        seen = 0
        try:
            cur = self._con.execute(sql)
            while batch := cur.fetchmany(size):
                if not self._limited:
                    _check_lengths(self.path, batch)
                seen += len(batch)
                if seen > self.max_rows:
                    raise self._too_many_rows()
                yield batch
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:
            _raise_bound(self, exc)
            raise

    def int_columns(self, columns: Sequence[str], rest: str, rules: str | None = None, *,
                    compiled: bool | None = None) -> list[np.ndarray] | None:
        """The int64 columns of ``SELECT <columns> <rest>`` (`rest`: from FROM on), within the
        bounds `execute` keeps, each value taken by its column's letter of `rules` (default:
        every one ``v``), by SQLite's storage class: ``v`` an integer, else None (the whole
        read refused); ``i`` an integer, else `NO_INTEGER`; ``k`` an integer, NULL as
        `NO_INTEGER`, else None. By the compiled reader where it is built (`compiled_reader`),
        else by batches of Python rows; `compiled` False forces the Python reading (True: the
        compiled one, or ValueError where unavailable).

        Raises:
            as `execute`; ValueError: `rules` not one letter of v, i, k per column.
        """
        rules = "v" * len(columns) if rules is None else rules
        if len(rules) != len(columns) or not 0 < len(rules) <= 64 or set(rules) - set("vik"):
            raise ValueError(f"rules must be one of the letters v, i, k per column, not {rules!r}")
        use = _int_columns is not None if compiled is None else compiled
        if use and (_int_columns is None or self._uri is None):
            raise ValueError("the compiled SQLite reader is not available here")
        if not use:
            return self._int_columns_python(columns, rest, rules)
        status, payload = _int_columns(self._uri, f"SELECT {', '.join(columns)} {rest}", rules,
                                       self.max_rows, self.budget_s, MAX_VALUE_BYTES,
                                       _MAX_SQL_BYTES)
        if status == 0:
            return [np.frombuffer(b, np.int64) for b in payload]
        if status == 1:
            return None
        if status == 2:
            raise self._too_many_rows()
        code, message = payload
        exc = sqlite3.OperationalError(message)
        if code == _SQLITE_INTERRUPT:
            exc = sqlite3.OperationalError("interrupted")
        elif code == _SQLITE_TOOBIG:
            exc = sqlite3.DataError("string or blob too big")
        _raise_bound(self, exc)
        raise exc

    def _int_columns_python(self, columns: Sequence[str], rest: str, rules: str
                            ) -> list[np.ndarray] | None:
        # the rules in the query: what a rule refuses becomes NULL, which no batch may hold
        exprs = [c if r == "v" else
                 f"CASE typeof({c}) WHEN 'integer' THEN {c} ELSE {NO_INTEGER} END" if r == "i"
                 else f"CASE typeof({c}) WHEN 'integer' THEN {c} WHEN 'null' THEN {NO_INTEGER} "
                 "END" for c, r in zip(columns, rules, strict=True)]
        sql, width = f"SELECT {', '.join(exprs)} {rest}", len(rules)
        parts: list[list[np.ndarray]] = [[] for _ in range(width)]
        for batch in self.batches(sql):
            if not set(map(type, itertools.chain.from_iterable(batch))) <= {int}:
                return None  # a value of another type (numpy would take a real as an int)
            block = np.fromiter(itertools.chain.from_iterable(batch), np.int64,
                                len(batch) * width).reshape(-1, width)
            for j, part in enumerate(parts):
                part.append(block[:, j].copy())
        out = []
        for part in parts:  # (each column's batches freed as it is joined)
            out.append(np.concatenate(part) if part else np.empty(0, np.int64))
            part.clear()
        return out

    def close(self) -> None:
        """Close the connection (and remove a sealed file's private copy).

        Raises:
            TraceError: the file (digested in place) changed while it was read, so the
                digest may not be of the bytes SQLite read.
        """
        self._con.close()
        _remove(self._copy)
        self._copy = None
        if self.unchanged is not None:
            before, self.unchanged = self.unchanged, None
            try:
                after = os.stat(self.path)
            except OSError:
                after = None
            if after is None or _identity(after) != _identity(before):
                raise TraceError(self.path, "changed while it was read; read it again")


def open_untrusted(path: Path, *, budget_s: float | None = None,
                   max_bytes: int = MAX_TRACE_BYTES, digest: bool = False
                   ) -> UntrustedDatabase:
    """`path` (a regular file of at most `max_bytes`) as an `UntrustedDatabase`; with
    `digest`, SQLite reads a private copy and `UntrustedDatabase.digest` is the content digest
    of exactly the bytes copied (`residency.traces.files.hashed_copy`).

    Raises:
        TraceError: not a regular file, too large, or SQLite cannot open it.
    """
    st = check_regular(path, max_bytes=max_bytes)
    # under a seal SQLite reads a private copy made while checking its sha256 (it opens
    # by path: the file itself could change between the check and the reads)
    hashed, unchanged = None, None
    if digest and active_seal() is None:
        # the file itself, hashed first, then read by SQLite; its status (device, inode,
        # size, mtime, ctime: any write or replacement changes one) checked again on close.
        # (Copying it, as under a seal, wrote every byte again: 1 GB a rank of the database)
        copy = None
        hashed, unchanged = _digest_in_place(path, max_bytes)
    elif digest:
        copy, hashed = hashed_copy(path, max_bytes=max_bytes)
    else:
        copy = verified_copy(path, max_bytes=max_bytes)
    uri = ("file:" + urllib.parse.quote(os.fspath(copy or Path(path).resolve()))
           + "?mode=ro&immutable=1")
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        _remove(copy)
        raise TraceError(path, f"cannot open the database: {exc}") from None
    try:
        con.execute("PRAGMA trusted_schema=OFF")
        if hasattr(con, "setlimit"):  # Python >= 3.11
            con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, _MAX_SQL_BYTES)
            con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    except sqlite3.Error as exc:
        con.close()
        _remove(copy)
        raise TraceError(path, f"cannot open the database: {exc}") from None
    db = UntrustedDatabase(Path(path), con, max_rows=max(_MIN_ROWS, st.st_size // 8),
                           budget_s=QUERY_BUDGET_S if budget_s is None else budget_s,
                           copy=copy, uri=uri)
    db.digest, db.unchanged = hashed, unchanged
    return db


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _digest_in_place(path: Path, max_bytes: int) -> tuple[str, os.stat_result]:
    """The content digest of `path` as it is now, and its status before the read (a change
    during the read shows in the status `UntrustedDatabase.close` compares)."""
    fd, st = open_regular(path, max_bytes=max_bytes)
    digest, total = content_hash(), 0
    try:
        while block := os.read(fd, 8 << 20):
            total += len(block)
            if total > max_bytes:
                raise TraceError(path, f"grew past the limit of {max_bytes} bytes while read")
            digest.update(block)
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total != st.st_size:
        raise TraceError(path, "changed while it was read; read it again")
    return digest.hexdigest(), st


def _raise_bound(db: UntrustedDatabase, exc: Exception) -> None:
    """The TraceError of a bound SQLite met (`exc`: the query's error); nothing for others."""
    text = str(exc)
    if "interrupted" in text:
        raise TraceError(db.path, f"a query took longer than {db.budget_s:g} s "
                         "and was stopped (a hostile or damaged database?)") from None
    if "too big" in text:
        raise TraceError(db.path, f"a value is longer than {MAX_VALUE_BYTES} bytes, "
                         "the limit per string or blob; not read") from None


def _check_lengths(path: Path, batch: list[tuple[Any, ...]]) -> None:
    """The length bound of `MAX_VALUE_BYTES`, checked on fetched rows (Python 3.10, whose
    sqlite3 cannot set SQLite's own limit: a value is then read before it is refused)."""
    for row in batch:
        for value in row:
            if isinstance(value, (str, bytes)) and len(value) > MAX_VALUE_BYTES:
                raise TraceError(path, f"a value is longer than {MAX_VALUE_BYTES} bytes, "
                                 "the limit per string or blob; not read")


def _remove(copy: Path | None) -> None:
    if copy is not None:
        shutil.rmtree(copy.parent, ignore_errors=True)
