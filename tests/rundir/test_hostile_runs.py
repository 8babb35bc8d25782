"""Hostile runs (issue 28): each built by copying a recorded run, changing it as an author or
a sender could, and sealing it again with the project's own sealing code, so that nothing but
the finding stands between the change and the analysis."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from residency.evidence.runs import idle_from_traces, load_run_traces, reference_pair
from residency.records.client import CLIENT
from residency.records.decisions import DECISIONS_GLOB, decisions_file
from residency.records.files import RunReading
from residency.rundir.assignment import assigned_decisions
from residency.rundir.run import load_run, verify_run
from residency.traces.files import TraceError
from residency.traces.load import load_traces
from tests.helpers import PAIRED, reseal


def _third_rank(trace_dir: Path, name: str) -> Path:
    """A copy of rank 0's trace that says it is rank 2."""
    text = (trace_dir / "rank0.trace.json").read_text()
    old = '"distributedInfo":{"backend":"gloo","rank":0,"world_size":2}'
    assert old in text
    path = trace_dir / name
    path.write_text(text.replace(old, old.replace('"rank":0', '"rank":2')))
    return path


# ------------------------------------------------------------- hidden files: sealed, not read
def test_a_hidden_file_added_after_the_seal_is_listed_by_verify(paired: Path) -> None:
    """Before: any path part starting with "." was skipped by the seal, so a planted
    `.rank2.trace.json` passed `verify` (and `--digest`) while the analysis read it."""
    digest = verify_run(paired).digest
    _third_rank(paired / "runs" / "01-candidate" / "trace", ".rank2.trace.json")
    result = verify_run(paired, expected_digest=digest)
    assert result.extra == ("runs/01-candidate/trace/.rank2.trace.json",)
    assert not result.ok


def test_a_sealed_hidden_file_is_never_read_as_a_trace(paired: Path) -> None:
    """Sealed by its author, a hidden file still never becomes a rank (before: a 2-rank run
    became 3 ranks)."""
    trace = paired / "runs" / "01-candidate" / "trace"
    _third_rank(trace, ".rank2.trace.json")
    reseal(paired)
    assert verify_run(paired).ok
    assert sorted(load_traces(trace, cache=False).ranks) == [0, 1]


def test_trace_ranks_must_be_the_runs_ranks(paired: Path) -> None:
    """A sealed run whose trace folder holds a rank the run never had (params.ranks = 2):
    the analysis refuses it naming the folder (before: analysed as 3 ranks)."""
    trace = paired / "runs" / "01-candidate" / "trace"
    _third_rank(trace, "rank2.trace.json")
    reseal(paired)
    run = load_run(paired)
    _, candidate = reference_pair(run)
    with pytest.raises(TraceError, match=r"ranks \[0, 1, 2\], but the run had "
                                         r"params.ranks = 2"):
        load_run_traces(run, candidate)
    figures, error = idle_from_traces(run)
    assert figures is None and "params.ranks = 2" in error


# -------------------------------------------------- the bytes parsed are the bytes verified
def test_a_file_changed_after_verification_is_never_parsed(paired: Path) -> None:
    """`load_run` verified every sha256 on the bytes it read and kept; a decisions file and a
    client record swapped after that (as a hostile mount can) are never parsed: the run's
    analyses parse the bytes verified, read once (issue 44; before: read again and refused,
    issue 41 F4/F5). A file too large to keep is read again and checked against the seal."""
    from residency.records import files as record_files
    from residency.rundir.run import RunDirError

    run = load_run(paired)
    entry = run.runs[0]
    decisions = entry.dir / decisions_file(0)
    honest = decisions.read_text()
    decisions.write_text("\n".join(honest.split("\n")[1:]))  # a decision gone, rest valid
    assert len(assigned_decisions(run, entry, warmup=True)) == len(
        assigned_decisions(load_run(paired, verify=False), entry, warmup=True)) + 1
    client = entry.dir / CLIENT
    record = client.read_bytes()
    honest_client = load_run(paired, verify=False).client(entry)
    forged = record.replace(b'"e2e_s": ', b'"e2e_s": 1', 1)
    assert forged != record
    client.write_bytes(forged)
    assert load_run(paired, verify=False).client(entry) != honest_client  # (forgery shows)
    assert run.client(entry) == honest_client
    client.write_bytes(record)
    decisions.write_text(honest)
    with pytest.MonkeyPatch.context() as mp:  # nothing kept: every read checked again
        mp.setattr(record_files, "KEEP_BYTES", 0)
        run = load_run(paired)
        decisions.write_text("\n".join(honest.split("\n")[1:]))
        with pytest.raises(RunDirError, match="changed since the run was verified"):
            assigned_decisions(run, entry)
    unverified = load_run(paired, verify=False)  # --no-verify reads what is there
    assert len(assigned_decisions(unverified, entry, warmup=True)) > 0


def _edit_in_place(path: Path) -> None:
    """One device task made 1 us longer, size and mtime kept (as a swap or a hostile mount
    would serve it)."""
    import os

    st = path.stat()
    data = path.read_bytes()
    at = data.index(b'"dur":') + len(b'"dur":')
    digit = data[at:at + 1]
    assert digit.isdigit()
    path.write_bytes(data[:at] + (b"1" if digit != b"1" else b"2") + data[at + 1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def test_a_trace_changed_after_verification_is_never_analysed(paired: Path) -> None:
    """`load_run` verified every sha256, then a trace changed (size and mtime kept) before it
    was parsed: the parse hashes the bytes it reads and refuses them, on the first read and
    when the user cache holds the file's earlier parse (before: verify hashed the file, the
    loader reopened it by path and analysed the changed bytes under the verified digest)."""
    run = load_run(paired)
    _, candidate = reference_pair(run)
    before = load_run_traces(run, candidate)  # fills the user cache for the intact bytes
    assert before.seal is not None and sorted(before.ranks) == [0, 1]
    _edit_in_place(candidate.dir / "trace" / "rank1.trace.json")
    # (the same reading keeps the parse of the verified bytes: `load_run_traces` loads a
    # folder once per reading; the next command's reading parses the changed file again)
    assert load_run_traces(run, candidate) is before
    # a new reading of the verified run (as the next analysis of a run verified earlier):
    # the trace is parsed again, from the changed bytes, and refused, user cache or not
    run = dataclasses.replace(run, reading=RunReading())
    with pytest.raises(TraceError, match=r"rank1\.trace\.json: changed since the run was "
                                         r"verified"):
        load_run_traces(run, candidate)
    figures, error = idle_from_traces(run)
    assert figures is None and "changed since the run was verified" in error
    # the same change after a first load with an empty cache
    fresh = load_run(paired, verify=False)
    assert fresh.sealed_artifacts is None  # --no-verify reads what is there, unsealed
    assert sorted(load_run_traces(fresh, reference_pair(fresh)[1]).ranks) == [0, 1]


def test_a_trace_changed_after_verification_is_refused_without_the_cache(
        paired: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above with the cache off: the stream's own sha256 of the bytes it parsed refuses
    them."""
    monkeypatch.setenv("RESIDENCY_NO_CACHE", "1")
    run = load_run(paired)
    _, candidate = reference_pair(run)
    _edit_in_place(candidate.dir / "trace" / "rank0.trace.json")
    with pytest.raises(TraceError, match="changed since the run was verified"):
        load_run_traces(run, candidate)


def test_a_file_planted_after_verification_is_never_read(paired: Path) -> None:
    """A trace added between `verify` and the parse is outside the seal: refused as never
    sealed, before it is read as a rank."""
    run = load_run(paired)
    _, candidate = reference_pair(run)
    _third_rank(candidate.dir / "trace", "rank2.trace.json")
    with pytest.raises(TraceError, match=r"rank2\.trace\.json: is not in the run's sha256 "
                                         r"list"):
        load_run_traces(run, candidate)


def test_the_memory_timeline_reads_the_traces_under_their_seal(paired: Path) -> None:
    """The memory timeline reads the trace files again after the load: under the run's seal
    too (before: it read whatever the files held by then)."""
    from residency.traces.memory import memory_timeline

    run = load_run(paired)
    _, candidate = reference_pair(run)
    traces = load_run_traces(run, candidate)
    assert len(memory_timeline(traces))
    _edit_in_place(candidate.dir / "trace" / "rank0.trace.json")
    with pytest.raises(TraceError, match="changed since the run was verified"):
        memory_timeline(traces)


def test_a_sealed_file_is_read_from_a_private_copy(tmp_path: Path) -> None:
    """Whole-file readers (CSV summaries, SQLite exports) read a copy made while checking the
    seal, so a change after the check never reaches them; SQLite's copy is removed on close
    and nothing is written beside the original."""
    import hashlib
    import os
    import sqlite3

    from residency.traces.files import Sealed, open_regular, sealed_reads
    from residency.traces.sqlitedb import open_untrusted

    csv = tmp_path / "kernel_details.csv"
    csv.write_bytes(b"Name,Start Time(us)\nmatmul,1.0\n")
    db = tmp_path / "ascend_pytorch_profiler_0.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.execute("INSERT INTO t VALUES (42)")
    con.commit()
    con.close()
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (csv, db)}
    (tmp_path / "planted.csv").write_bytes(b"Name\n")
    listing = sorted(os.listdir(tmp_path))
    with sealed_reads(Sealed(tmp_path, sha)):
        fd, _ = open_regular(csv)
        csv.write_bytes(b"Name,Start Time(us)\nmatmul,9.0\n")  # after the check
        with os.fdopen(fd, "rb") as f:
            assert f.read() == b"Name,Start Time(us)\nmatmul,1.0\n"
        with pytest.raises(TraceError, match="changed since the run was verified"):
            open_regular(csv)
        database = open_untrusted(db)
        assert list(database.execute("SELECT x FROM t")) == [(42,)]
        copy = database._copy
        assert copy is not None and copy.is_file() and copy.parent != tmp_path
        database.close()
        assert not copy.parent.exists()
        with db.open("r+b") as f:  # a byte of the database changed
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 1]))
        with pytest.raises(TraceError, match="changed since the run was verified"):
            open_untrusted(db)
        with pytest.raises(TraceError, match="is not in the run's sha256 list"):
            open_regular(tmp_path / "planted.csv")
    assert sorted(os.listdir(tmp_path)) == listing


def test_decisions_lines_split_on_newline_only(paired: Path) -> None:
    """A JSON string may hold U+2028 (valid JSONL); `str.splitlines` split the record there
    and the run was refused as invalid JSON."""
    entry = load_run(paired).runs[0]
    path = entry.dir / decisions_file(0)
    lines = path.read_text().split("\n")
    record = json.loads(lines[0])
    record["error"] = "line\u2028separator"
    lines[0] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines), encoding="utf-8")
    reseal(paired)
    rows = assigned_decisions(load_run(paired), entry, warmup=True)
    assert "line\u2028separator" in set(rows["error"])


def test_decisions_have_a_total_budget_per_service_run(paired: Path, monkeypatch) -> None:
    """Each decisions file within the per-file limit, but all of a service run's together
    over the budget: one error naming the file where it ran out (before: no total)."""
    from residency.records import decisions as decisions_format
    from residency.rundir.run import RunDirError

    entry = load_run(paired).runs[0]
    sizes = [f.stat().st_size for f in sorted(entry.dir.glob(DECISIONS_GLOB))]
    monkeypatch.setattr(decisions_format, "MAX_DECISIONS_BYTES", sizes[0] + sizes[1] // 2)
    with pytest.raises(RunDirError, match=r"decisions-rank1\.jsonl: the decisions "
                                                 r"files of this service run exceed"):
        assigned_decisions(load_run(paired), entry)


# ------------------------------------------------------------ the memory-timeline reader
def _memory_trace(path: Path, ts_values: list[str], *, gz: bool = False) -> Any:
    """A Kineto trace of `[memory]` events, one per `ts` (JSON number text), as a TraceSet
    of one rank (all `memory_timeline` reads of it)."""
    import gzip
    from types import SimpleNamespace

    events = ",".join(
        f'{{"name":"[memory]","ph":"i","ts":{ts},"pid":1,"tid":1,"args":{{"Device Id":0,'
        f'"Total Allocated":{100 + i},"Total Reserved":{200 + i}}}}}'
        for i, ts in enumerate(ts_values))
    text = ('{"baseTimeNanoseconds":1000000000,"traceEvents":[' + events + "]}").encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return SimpleNamespace(format="kineto", ranks={0: SimpleNamespace(source=path)})


def test_memory_ts_converts_like_the_trace_loader(tmp_path: Path) -> None:
    """Half-up to the ns (0.0025 us is 3 ns, as `decimal_us_to_ns` gives; before: 2, half to
    even), and an absurd exponent rejected before any arithmetic (before: decimal.Overflow
    out of the paired notebook, or 37 s per event for 1e999000)."""
    from residency.traces.memory import memory_timeline
    from residency.traces.units import decimal_us_to_ns

    traces = _memory_trace(tmp_path / "rank0.trace.json",
                           ["0.0025", "1e999999", "1e999000", '"12.5"', "7"])
    with pytest.warns(UserWarning, match="2 memory event"):
        f = memory_timeline(traces)
    base = 1_000_000_000
    assert f["ts_ns"].tolist() == [base + 3, base + 7000, base + 12500]
    assert decimal_us_to_ns("0.0025") == 3
    assert f["allocated_bytes"].tolist() == [100, 104, 103]  # sorted by time


def test_memory_reader_is_bounded_like_the_trace_loader(tmp_path: Path) -> None:
    """The gzip of a memory trace is inflated through the loader's stream within its limit
    (before: `gzip.decompress` of the whole file, no bound: 2.85 GB for 1.5 MB of gzip)."""
    from residency.traces.memory import memory_timeline

    traces = _memory_trace(tmp_path / "rank0.trace.json.gz", ["1"] * 2000, gz=True)
    assert len(memory_timeline(traces)) == 2000
    assert (tmp_path / "rank0.trace.json.gz").stat().st_size < 50_000
    with pytest.raises(TraceError, match="decompresses to more than 50000 bytes"):
        memory_timeline(traces, max_trace_bytes=50_000)


def test_memory_record_megabytes_refuse_absurd_exponents(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from residency.traces.memory import memory_timeline

    session = tmp_path / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    session.mkdir(parents=True)
    (session / "memory_record.csv").write_text(
        "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB)\n"
        "PTA,1.5,1e999999,2\nPTA,2.5,1,2\n")
    traces = SimpleNamespace(format="ascend",
                             ranks={0: SimpleNamespace(source=session / "trace_view.json")})
    f = memory_timeline(traces)
    assert f["allocated_bytes"].tolist() == [2**20]


# ---------------------------------------------------------------- SQLite exports, untrusted
def _db(path: Path, *, tasks: int = 3, strings: int = 1, value_sql: str | None = None,
        wal: bool = False) -> Path:
    """A minimal torch-npu database: STRING_IDS (each id 1, `strings` times: a join over
    repeated ids multiplies) and `tasks` TASK rows of type 1."""
    import sqlite3

    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
    if value_sql is None:
        con.execute("CREATE TABLE STRING_IDS (id INTEGER, value TEXT)")
    else:  # a generated column: computed by whoever reads the row
        con.execute(f"CREATE TABLE STRING_IDS (id INTEGER, v TEXT, value TEXT AS ({value_sql}))")
    con.executemany("INSERT INTO STRING_IDS (id, v) VALUES (1, 'AI_CORE')" if value_sql else
                    "INSERT INTO STRING_IDS VALUES (1, 'AI_CORE')", [()] * strings)
    con.execute("CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, globalTaskId INTEGER, "
                "taskType INTEGER)")
    con.executemany("INSERT INTO TASK VALUES (?, ?, ?, 1)",
                    [(1000 * i, 1000 * i + 500, i) for i in range(tasks)])
    con.commit()
    con.close()
    return path


def test_a_wal_database_is_read_without_writing_beside_it(tmp_path: Path) -> None:
    """Before: `mode=ro` alone made SQLite create `-shm`/`-wal` in the run directory (then
    `verify` listed them and `tables` refused the run)."""
    from residency.traces.ascend_db import read_db

    folder = tmp_path / "run"
    folder.mkdir()
    path = _db(folder / "ascend_pytorch_profiler_0.db", wal=True)
    before = sorted(p.name for p in folder.iterdir())
    assert len(read_db(path).device) == 3
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_database_value_over_the_length_limit_is_refused(tmp_path: Path) -> None:
    from residency.traces.ascend_db import read_db

    path = _db(tmp_path / "big.db", value_sql="hex(zeroblob(10000000))")  # 20 MB of text
    with pytest.raises(TraceError, match=r"big\.db: a value is longer than 16777216 bytes"):
        read_db(path)


def test_a_join_multiplied_by_repeated_ids_is_stopped(tmp_path: Path) -> None:
    """400 tasks x 400 strings of one id: 160,000 rows out of a 20 KB file (before: read;
    the issue's 12 KB database reached 2.97 GB this way)."""
    from residency.traces.ascend_db import read_db

    path = _db(tmp_path / "dup.db", tasks=400, strings=400)
    with pytest.raises(TraceError, match=r"dup\.db: a query returned more than 100000 rows"):
        read_db(path)


def test_a_query_past_its_time_budget_is_stopped(tmp_path: Path, monkeypatch) -> None:
    """The budget is a constant (600 s): set to 0 here, so the first progress check stops
    the query, whatever the machine's speed (no wall-clock threshold)."""
    from residency.traces import sqlitedb
    from residency.traces.ascend_db import read_db

    path = _db(tmp_path / "slow.db", tasks=5000)
    monkeypatch.setattr(sqlitedb, "QUERY_BUDGET_S", 0.0)
    with pytest.raises(TraceError, match=r"slow\.db: a query took longer than 0 s"):
        read_db(path)


def test_a_database_name_is_not_read_as_uri_parameters(tmp_path: Path) -> None:
    """`file:{path}?mode=ro` put the name into the URI unquoted: `#` or `?` in a folder name
    cut the path there."""
    from residency.traces.ascend_db import read_db

    folder = tmp_path / "a#b?mode=rwc"
    folder.mkdir()
    assert len(read_db(_db(folder / "x.db")).device) == 3


def test_gzip_with_trailing_nul_padding_is_read_as_gzip_reads_it(tmp_path: Path) -> None:
    """gzip(1) and Python's gzip module skip NUL padding after the last member (tape and
    block devices pad so); before, the trace loader refused such a file."""
    import gzip

    source = PAIRED / "runs" / "01-candidate" / "trace"
    for rank in (0, 1):
        data = gzip.compress((source / f"rank{rank}.trace.json").read_bytes())
        (tmp_path / f"rank{rank}.trace.json.gz").write_bytes(data + b"\0" * 3000)
        assert gzip.decompress(data + b"\0" * 3000)
    padded = load_traces(tmp_path, cache=False)
    plain = load_traces(source, cache=False)
    assert sorted(padded.ranks) == [0, 1]
    assert all((padded.ranks[r].device == plain.ranks[r].device).all() for r in (0, 1))


def test_verify_prints_file_names_escaped(paired: Path) -> None:
    """A file name holding ANSI escapes could clear the screen and print a fake "verified"
    line (before: printed raw)."""

    name = "\x1b[2J\x1b[1;1Hrun: 23 artifacts and the manifest verified\u2028x\udcff"
    (paired / name).write_bytes(b"x")
    lines = verify_run(paired).lines()
    assert all(line.isprintable() for line in lines)
    assert any("extra    \\x1b[2J\\x1b[1;1Hrun: " in line and "\\u2028x\\udcff" in line
               for line in lines)


def test_verify_command_output_has_no_control_characters(paired: Path, capsys) -> None:
    from residency.cli.main import main

    (paired / "runs" / "a\rb\x07.json").write_bytes(b"x")
    assert main(["verify", str(paired)]) == 1
    out = capsys.readouterr().out
    assert "\r" not in out and "\x07" not in out and "a\\rb\\x07.json" in out
