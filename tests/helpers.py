"""What the tests share (never a test module itself): where the test data lies, the CLI run in
the test's own process or as a user runs it, copies of recorded runs and their re-sealing,
trace fixtures and their comparison, and papermill started as a user starts it.

Fixtures built on these live in `tests/conftest.py`; the other helper modules are
`tests/reading.py` (checks over text people read), `tests/servicekit.py` (`residency serve`
as a subprocess) and `tests/memorytraces.py` (emulated-NPU traces with memory records)."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from residency.analysis.idle.model import RankReduction
from residency.analysis.idle.reduce import rank_reduction
from residency.records import manifest as manifest_format
from residency.traces import ascend_db
from residency.traces.files import TraceError
from residency.traces.load import plan_traces

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "data" / "traces"          # trace fixtures, one folder each
FIXTURE_RUN = ROOT / "tests" / "data" / "rundir" / "fixture-run"
RUNS = ROOT / "data" / "runs"                          # the recorded runs
PAIRED = RUNS / "emulated-paired-profile-2r50s"
NOTEBOOKS = ROOT / "notebooks"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}          # a subprocess imports this tree
MARKER = r"residency\.release\[normal\]"               # the normal release marker, as a regex
BASE_NS = 1_764_500_000_000_000_000                    # `many_ranks` traces' baseTimeNanoseconds


# -------------------------------------------------------------------------------- processes
def run_python(code: str, *, timeout: float = 180, env: dict | None = None) -> dict:
    """Run `code` in a new interpreter; its last stdout line must be a JSON object."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env=env,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------------------------- the CLI
def run_cli(*argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `residency ARGV` run in this process."""
    from residency.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def residency(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
              cwd: Path | None = None, stdout: int | None = subprocess.PIPE
              ) -> subprocess.CompletedProcess:
    """`python -m residency ARGS` as a user runs it (text stdout and stderr captured;
    `timeout` is a hang guard, not a speed check)."""
    return subprocess.run([sys.executable, "-m", "residency", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, env=env,
                          cwd=cwd)


def idle_cli(*args: str, **kw: Any) -> subprocess.CompletedProcess:
    """`residency idle ARGS --no-cache` in a subprocess importing this tree."""
    kw.setdefault("timeout", 300)
    return residency("idle", *args, "--no-cache", env=ENV, **kw)


# -------------------------------------------------------------------------------- run folders
def copy_run(src: Path, dst: Path) -> Path:
    """A writable copy of the run folder `src` at `dst` (its Parquet cache left behind)."""
    from residency.traces.load import CACHE_DIR

    return Path(shutil.copytree(src, dst, ignore=shutil.ignore_patterns(CACHE_DIR)))


def read_manifest(run: Path) -> dict[str, Any]:
    """The run's manifest.json as a dict."""
    return manifest_format.read_manifest(run)


def edit_manifest(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the run's manifest.json in place (no re-sealing)."""
    m = manifest_format.read_manifest(run)
    change(m)
    manifest_format.write_manifest(run, m)


def reseal(run: Path) -> None:
    """Re-record every artifact's sha256 and the seal, as `residency pair` does at the end, so
    that a changed file reaches the analysis as a recorder would have left it."""
    from residency.records.manifest import artifact_hashes
    from residency.records.seal import seal

    def again(m: dict[str, Any]) -> None:
        m["artifacts"] = artifact_hashes(run)
        m.pop("seal", None)
        m["seal"] = seal(m)

    edit_manifest(run, again)


def sealed_copy(src: Path, dst: Path) -> Path:
    """A copy of the run `src` at `dst`, re-sealed (its sha256 list and seal recorded)."""
    copy_run(src, dst)
    reseal(dst)
    return dst


# -------------------------------------------------------------------------------- traces
def copy_fixture(name: str, dest: Path) -> Path:
    """A copy of the trace fixture `name` under `dest`, without any Parquet cache an earlier
    in-place load left there."""
    from residency.traces.load import CACHE_DIR

    return Path(shutil.copytree(TRACES / name, dest / name,
                                ignore=shutil.ignore_patterns(CACHE_DIR)))


def same_traces(a, b) -> None:
    """Two TraceSets hold the same ranks, columns and names."""
    assert list(a.ranks) == list(b.ranks)
    for r in a.ranks:
        x, y = a.ranks[r], b.ranks[r]
        assert np.array_equal(x.device, y.device) and x.rejected_events == y.rejected_events
        assert x.range_names.tolist() == y.range_names.tolist()
        assert x.device_names.tolist() == y.device_names.tolist()
        assert np.array_equal(x.ranges, y.ranges) and np.array_equal(x.overlap, y.overlap)
        assert x.device_types.tolist() == y.device_types.tolist()


def many_ranks(d: Path, ranks: int = 3, *, seed: int = 7) -> Path:
    """Kineto traces of `ranks` ranks with fractional string/number times, host ranges,
    flows and markers (some ranks named by path only)."""
    rng = np.random.default_rng(seed)
    for r in range(ranks):
        events, t = [], 0.0
        for i in range(400):
            t += float(rng.uniform(0.1, 3.0))
            ts = f"{t:.3f}" if i % 5 == 0 else round(t, 3)
            events.append({"ph": "X", "cat": "kernel", "name": f"k{i % 4}", "pid": 0, "tid": 7,
                           "ts": ts, "dur": round(float(rng.uniform(0.5, 2.0)), 3),
                           "args": {"correlation": i, "grid": [1, 1, 1]}})
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                           "tid": 1, "ts": round(t - 1, 3), "dur": 0.75})
            events.append({"ph": "s", "id": i, "pid": 1, "tid": 1, "ts": round(t - 1, 3),
                           "cat": "ac2g", "name": "ac2g"})
            if i % 50 == 0:
                events.append({"ph": "X", "cat": "user_annotation",
                               "name": "residency.release[normal]", "pid": 1, "tid": 1,
                               "ts": round(t + 0.5, 3), "dur": 20.125})
            if i % 100 == 0:
                t += 30  # a stall on every rank
        doc = {"traceEvents": events, "baseTimeNanoseconds": BASE_NS}
        if r % 2 == 0:
            doc["distributedInfo"] = {"rank": r, "world_size": ranks}
        (d / f"rank{r}").mkdir(parents=True, exist_ok=True)
        raw = json.dumps(doc).encode()
        name = d / f"rank{r}" / ("trace.json.gz" if r == 1 else "trace.json")
        name.write_bytes(gzip.compress(raw) if r == 1 else raw)
    return d


def ns(us: object) -> int:
    """Microseconds (a JSON number or string) as integer nanoseconds, exactly."""
    return int((Decimal(str(us)) * 1000).to_integral_value())


def figures(path: Path, **kw: object) -> dict[str, object]:
    """The idle figures the analysis reports for the traces at `path` (warnings silenced)."""
    from residency.analysis.idle import idle_summary
    from residency.traces.load import load_traces

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = idle_summary(load_traces(path, cache=False), **kw)
    return {"window_measure_ns": s.window_measure_ns, "all_rank_idle_ns": s.all_rank_idle_ns,
            "idle_ns": [r.idle_ns for r in s.per_rank],
            "span_idle_ns": [r.span_idle_ns for r in s.per_rank]}


# -------------------------------------------------------------------------------- notebooks
class Papermill:
    """`papermill notebooks/<notebook>.ipynb [OUT] -k python3 ARGS` started as a user would
    (stdout and stderr to files, not a terminal; no pytest variables in the environment)."""

    def __init__(self, notebook: str, out: Path | None, *args: str, cwd: Path) -> None:
        cmd = [sys.executable, "-m", "papermill", str(NOTEBOOKS / f"{notebook}.ipynb")]
        cmd += [str(out)] if out is not None else []
        # several kernels start at once on 2 cores: papermill's 60 s kernel start limit is
        # a guard against hangs here, not a speed check
        cmd += ["-k", "python3", "--start-timeout", "600", *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        self.out, self.cwd = out, cwd
        self._stdout, self._stderr = cwd / ".papermill.stdout", cwd / ".papermill.stderr"
        with open(self._stdout, "w") as o, open(self._stderr, "w") as e:
            self.proc = subprocess.Popen(cmd, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                         cwd=cwd, env=env)

    def kernel_up(self, timeout: float = 600) -> None:
        """Return once papermill says its kernel started (or the process ended): kernels
        launched at the same instant can pick the same free TCP port, and one then dies
        before replying to kernel_info. A hang guard, not a speed check."""
        deadline = time.monotonic() + timeout
        while (self.proc.poll() is None and time.monotonic() < deadline
               and "Executing notebook with kernel" not in self._stderr.read_text()):
            time.sleep(0.1)

    def wait(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return subprocess.CompletedProcess(self.proc.args, code, self._stdout.read_text(),
                                           self._stderr.read_text())

    def ok(self) -> subprocess.CompletedProcess[str]:
        done = self.wait()
        assert done.returncode == 0, done.stderr[-4000:]
        return done


# -- an independent oracle for trace figures (json + Decimal, no residency code) -------------

def oracle_json(path: Path) -> Any:
    """A trace file (gzip or not) parsed by the standard library, floats as Decimal."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    from decimal import Decimal

    return json.loads(raw, parse_float=Decimal)


def oracle_union(rows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of half-open [s, e) rows as sorted disjoint intervals (empty rows dropped)."""
    out: list[list[int]] = []
    for s, e in sorted(rows):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def tracegen() -> Any:
    """`benchmarks/tracegen.py` (the benchmark's trace generator) as a module."""
    import importlib.util

    if "tracegen" in sys.modules:
        return sys.modules["tracegen"]
    spec = importlib.util.spec_from_file_location("tracegen", ROOT / "benchmarks" /
                                                  "tracegen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tracegen"] = module
    spec.loader.exec_module(module)
    return module


def write_sqlite(path: Path, tables: dict[str, tuple[str, list[tuple]]]) -> Path:
    """A SQLite file at `path` (replaced) holding `tables`: name -> (column declarations, rows)."""
    import sqlite3

    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    for table, (columns, rows) in tables.items():
        con.execute(f"CREATE TABLE {table} ({columns})")
        if rows:
            con.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})",
                            rows)
    con.commit()
    con.close()
    return path


# -- torch-npu databases for the idle reduction (tests/analysis/test_idle_db_*.py) ----------
def write_torch_npu_db(folder: Path, tables: dict[str, tuple[str, list[tuple]]]) -> Path:
    """A torch-npu session under `folder` whose database has `tables`."""
    out = folder / "h_1_20261201120000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True, exist_ok=True)
    return write_sqlite(out / "ascend_pytorch_profiler_0.db", tables)


_DB_NAME_IDS = st.one_of(st.integers(1, 8), st.none())  # 7, 8: ids STRING_IDS lacks
_DB_VALUES = st.one_of(st.sampled_from(["aten::mm", "aclnnMm", "", "residency.release",
                                     "hcom_allReduce", "AI_CORE", "aten::add"]), st.none())


@st.composite
def torch_npu_tables(draw: Any) -> dict[str, tuple[str, list[tuple]]]:
    """(A hypothesis strategy) a small torch-npu database with every host table: names NULL,
    absent from STRING_IDS or with a NULL value, host times NULL (left out by the reading),
    negative, now and then an end before its start."""
    strings = list(enumerate(draw(st.lists(_DB_VALUES, min_size=1, max_size=6)), start=1))
    t = st.integers(-60, 60)
    odd = draw(st.integers(0, 9)) == 0

    def span(d):
        s, n = d(t), d(st.integers(-3 if odd else 0, 20))
        return s, s + n

    def host(text: bool) -> list[tuple]:
        rows = []
        for _ in range(draw(st.integers(0, 8))):
            start, end = span(draw)
            if draw(st.integers(0, 5)) == 0:
                start, end = draw(st.sampled_from([(None, end), (start, None), (None, None)]))
            rows.append((*(str(x) if text and x is not None else x for x in (start, end)),
                         draw(_DB_NAME_IDS)))
        return rows

    tasks = [(*span(draw), draw(st.integers(1, 8)), g) for g in range(draw(st.integers(0, 6)))]
    comm = draw(st.lists(st.integers(0, 6), max_size=2, unique=True))
    return {
        "STRING_IDS": ("id INTEGER, value TEXT", strings),
        "TASK": ("startNs INTEGER, endNs INTEGER, taskType INTEGER, globalTaskId INTEGER",
                 tasks),
        "COMPUTE_TASK_INFO": ("globalTaskId INTEGER, name INTEGER, taskType INTEGER",
                              [(g, 1, 6) for g in range(0, len(tasks), 2)]),
        "COMMUNICATION_TASK_INFO": ("globalTaskId INTEGER, name INTEGER",
                                    [(g, 5) for g in comm]),
        "COMMUNICATION_OP": ("startNs INTEGER, endNs INTEGER, opName INTEGER",
                             [(*span(draw), draw(_DB_NAME_IDS)) for _ in range(draw(
                                 st.integers(0, 2)))]),
        "PYTORCH_API": ("startNs TEXT, endNs TEXT, name INTEGER", host(True)),
        "CANN_API": ("startNs INTEGER, endNs INTEGER, name INTEGER", host(False)),
        "MSTX_EVENTS": ("startNs INTEGER, endNs INTEGER, message INTEGER", host(False)),
    }


def reductions_reading(folder: Path, options: dict, readings: list[dict]) -> list:
    """Rank 0's reduction of `folder` as `idle` computes it under `options`, once per entry of
    `readings` (the keywords that entry sets on every `ascend_db.read_db`); or the exception
    each raised."""
    plan = plan_traces(folder)
    job = {**dict(busy="ascend", marker=None, window_marker=None, cache=False,
                  chunk_bytes=1 << 20, max_trace_bytes=1 << 30), **options}
    read = ascend_db.read_db
    out = []
    for setting in readings:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ascend_db, "read_db", lambda *a, setting=setting, **kw: read(*a, **{
                **kw, **setting}))
            try:
                out.append(rank_reduction(plan, 0, **job))
            except (ascend_db.UnusualDatabase, TraceError) as exc:
                out.append(type(exc))
    return out


def same_reduction(a: RankReduction, b: RankReduction) -> None:
    """`a` and `b` field by field (arrays by dtype, shape and values)."""
    for f in dataclasses.fields(RankReduction):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert (x.dtype, x.shape, x.tolist()) == (y.dtype, y.shape, y.tolist()), f.name
        else:
            assert x == y, f.name
