"""Real torch-npu layouts and busy definitions: answers computed independently on a 1-us grid
from the fixtures' JSON (stdlib json, Python sets), never with residency's interval code."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.analysis.causes import NO_HOST_RANGE, cause_diff, idle_by_cause, top_cause
from residency.analysis.idle import busy_intervals, idle_summary, idle_summary_at
from residency.traces import cache as tracecache
from residency.traces.busy import classify, resolve
from residency.traces.load import CACHE_DIR, TraceError, TraceNote, load_traces
from tests.helpers import ROOT, write_sqlite
from tests.helpers import copy_fixture as copy

DATA = ROOT / "tests" / "data" / "traces"
EPOCH_US = 1_764_500_000_000_000
NORMAL = r"residency\.release\[normal\]"

# the test's own reading of which Task Types are work (from the definitions)
COMPUTE = {"AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "AI_CPU"}
COPIES = {"SDMA_SQE", "PCIE_DMA_SQE"}
WAITS = {"EVENT_WAIT_SQE", "EVENT_RECORD_SQE", "NOTIFY_WAIT_SQE", "EVENT_WAIT"}
UNKNOWN = {"FUTURE_SQE"}


def counts_busy(definition: str, lane: str, task_type: str | None) -> bool:
    if definition == "all":
        return True
    if lane == "Communication":
        return True
    if task_type in UNKNOWN:
        return True  # unknown types count busy (and are warned about)
    if definition == "msprof":
        return task_type in COMPUTE
    return task_type in COMPUTE | COPIES  # ascend


def grid_rank(path: Path, definition: str) -> dict[str, object]:
    """One rank's busy cells, host ranges by name and Free cells, from the raw JSON."""
    events = json.loads(path.read_text())
    process = {e["pid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "process_name"}
    busy, free, ranges, excluded = set(), set(), {}, {}
    for e in events:
        if e["ph"] != "X":
            continue
        start = int(Decimal_us(e["ts"]))
        cells = set(range(start, start + int(e["dur"])))
        lane = process[e["pid"]]
        if lane in ("Ascend Hardware", "Communication"):
            task_type = e.get("args", {}).get("Task Type")
            if counts_busy(definition, lane, task_type):
                busy |= cells
            else:
                excluded[task_type] = excluded.get(task_type, 0) + 1
        elif lane == "Overlap Analysis":
            if e["name"] == "Free":
                free |= cells
        else:
            ranges.setdefault(e["name"], set()).update(cells)
    return {"busy": busy, "free": free, "ranges": ranges, "excluded": excluded}


def Decimal_us(text: str) -> int:  # noqa: N802 - "us after EPOCH" of '%.3f' text
    whole, _, frac = text.partition(".")
    assert set(frac) <= {"0"}
    return int(whole) - EPOCH_US


def grid(definition: str, root: Path = DATA / "ascend_real") -> dict[int, dict[str, object]]:
    out = {}
    for d in sorted(root.iterdir()):
        rank = int(next(d.glob("profiler_info_*.json")).stem.rsplit("_", 1)[1])
        out[rank] = grid_rank(d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", definition)
    return out


def expected(definition: str) -> dict[str, object]:
    g = grid(definition)
    cells = set().union(*(r["busy"] for r in g.values()))
    window = set(range(min(cells), max(cells) + 1))
    idle = window - cells
    marker = set().union(*(r["ranges"].get("residency.release[normal]", set())
                           for r in g.values())) & window
    return {"window_ns": [(EPOCH_US + min(window)) * 1000, (EPOCH_US + max(window) + 1) * 1000],
            "all_rank_idle_ns": len(idle) * 1000, "marker_ns": len(marker) * 1000,
            "marker_idle_intersection_ns": len(marker & idle) * 1000,
            "per_rank": {str(r): {"busy_ns": len(v["busy"] & window) * 1000,
                                  "idle_ns": len(window - v["busy"]) * 1000,
                                  "excluded_tasks": dict(sorted(v["excluded"].items())),
                                  "reported_free_ns": len(v["free"] & window) * 1000}
                         for r, v in g.items()},
            "idle_cells": idle, "grid": g}


@pytest.fixture(scope="module")
def real():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_traces(DATA / "ascend_real", cache=False)


@pytest.mark.parametrize("definition", ["ascend", "msprof", "all"])
def test_busy_definitions_against_an_independent_grid(real, definition):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = idle_summary(real, marker=NORMAL, busy=definition).to_dict()
    want = expected(definition)
    assert got["busy_definition"] == definition
    for key in ("window_ns", "all_rank_idle_ns", "marker_ns", "marker_idle_intersection_ns"):
        assert got[key] == want[key], key
    for rank, row in want["per_rank"].items():
        mine = {k: got["per_rank"][rank][k] for k in row}
        assert mine == row, (rank, definition)


def test_waits_overlapping_gaps_are_not_busy_by_default(real):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ascend, everything = (idle_summary(real, busy=b) for b in ("default", "all"))
    # rank 0 waits on an event over [200,600) us: counted as work it hides 260 us of idle
    assert ascend.all_rank_idle_ns > everything.all_rank_idle_ns
    assert ascend.per_rank[0].excluded_tasks == {"EVENT_RECORD_SQE": 1, "EVENT_WAIT_SQE": 1}


def test_reported_free_equals_our_idle_under_msprof(real):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = idle_summary(real, busy="msprof")
    for r in s.per_rank:
        assert r.reported_free_ns == r.idle_ns
    assert not [w for w in caught if "Free time" in str(w.message)]


def test_msprof_warns_when_free_slices_disagree(tmp_path):
    d = copy("ascend_real", tmp_path)
    view = next(d.glob("*1002*")) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(view.read_text())
    events = [e for e in events if not (e.get("name") == "Free" and e["dur"] == 400)]
    view.write_text(json.dumps(events))
    with pytest.warns(UserWarning, match=r"rank 1: idle time under the msprof definition "
                      r"\(0\.690000 ms.*Free time \(0\.290000 ms\) by more than 1 %"):
        idle_summary(load_traces(d, cache=False), busy="msprof")


def test_unknown_task_types_count_busy_and_are_warned_with_counts(real):
    with pytest.warns(UserWarning, match=r"counted busy \(ascend\): 'FUTURE_SQE' x 1"):
        s = idle_summary(real)
    assert sum(r.unknown_tasks.get("FUTURE_SQE", 0) for r in s.per_rank) == 1
    assert classify("FUTURE_SQE") == "unknown" and classify("event_wait_sqe") == "sync"


def test_bad_busy_name():
    with pytest.raises(ValueError, match=r"`busy` must be one of .*'msprof'.* 'nope'"):
        resolve("nope", "ascend")
    assert resolve(None, "kineto").name == "kineto" and resolve("default", "ascend").name == \
        "ascend"


def test_hostname_with_rank7_is_never_a_rank(tmp_path):
    d = copy("ascend_real", tmp_path)
    for info in d.glob("*/profiler_info_*.json"):
        info.unlink()
    with pytest.raises(TraceError, match=r"cannot tell the rank of .*gpu-rank7-a_1001"):
        load_traces(d, cache=False)
    for i, sub in enumerate(sorted(d.iterdir())):  # folders named after hosts: no rank either
        host = d / ("gpu-rank7", "node.rank8")[i]
        host.mkdir()
        sub.rename(host / sub.name)
    with pytest.raises(TraceError, match=r"cannot tell the rank of .*gpu-rank7/gpu-rank7-a_1001"
                                         r".*node\.rank8/gpu-rank7-a_1002"):
        load_traces(d, cache=False)


def test_rank_from_a_folder_below_the_root_and_groups(tmp_path):
    d = copy("ascend_real", tmp_path)
    dirs = sorted(d.iterdir())
    for info in d.glob("*/profiler_info_*.json"):
        info.unlink()
    for rank, sub in enumerate(dirs):  # vLLM-Omni: <dir>/diffusion_rank<N>/<host>_..._ascend_pt
        (d / f"diffusion_rank{rank}").mkdir()
        sub.rename(d / f"diffusion_rank{rank}" / sub.name)
    assert list(load_traces(d, cache=False).ranks) == [0, 1]
    (d / "stage0_rank0").mkdir()
    shutil.copytree(d / "diffusion_rank1" / dirs[1].name, d / "stage0_rank0" / dirs[1].name)
    with pytest.raises(TraceError, match=r"several process groups: 'diffusion' \(2 directories"
                       r"\), 'stage0' \(1 directories\); choose one with --group"):
        load_traces(d, cache=False)
    assert list(load_traces(d, cache=False, group="diffusion").ranks) == [0, 1]
    stage = load_traces(d, cache=False, group="stage0")
    assert list(stage.ranks) == [0] and "diffusion" not in str(stage.ranks[0].source)
    with pytest.raises(TraceError, match=r"no group 'x'; the groups are: 'diffusion', 'stage0'"):
        load_traces(d, cache=False, group="x")


def two_sessions(tmp_path: Path) -> Path:
    d = copy("ascend_real", tmp_path)
    first = next(d.glob("*_1001_*"))
    later = d / first.name.replace("20251130010203004", "20251130020304005")
    shutil.copytree(first, later)
    view = later / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    view.write_text(view.read_text().replace('"aten::mm"', '"aten::mm_later"'))
    return d


def test_two_sessions_for_one_rank_are_listed_and_chosen(tmp_path):
    d = two_sessions(tmp_path)
    with pytest.raises(TraceError, match=r"rank 0 has 2 profiling sessions \(\[0\] "
                       r"2025-11-30T01:02:03\.004 .*; \[1\] 2025-11-30T02:03:04\.005 .*\); "
                       r"choose one with --session latest\|N\|ISO-time"):
        load_traces(d, cache=False)

    def names(session: str) -> tuple[str, list[str]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = load_traces(d, cache=False, session=session).ranks[0]
        return t.session, sorted(set(t.range_names.tolist()))

    assert names("latest")[0] == "2025-11-30T02:03:04.005"
    assert "aten::mm_later" in names("latest")[1]
    assert names("0") == names("2025-11-30T01:02")
    assert "aten::mm_later" not in names("0")[1]
    assert names("2025-11-30 02:03:04")[0] == "2025-11-30T02:03:04.005"
    with pytest.raises(TraceError, match=r"--session 2024 matches no session of rank 0: "
                       r"\[0\] 2025-11-30T01:02:03\.004"):
        load_traces(d, cache=False, session="2024")
    with pytest.raises(TraceError, match=r"--session 2025-11-30 matches 2 sessions of rank 0"):
        load_traces(d, cache=False, session="2025-11-30")
    with pytest.raises(TraceError, match=r"--session 5: rank 0 has 2 session"):
        load_traces(d, cache=False, session="5")


def test_cli_session_and_busy(tmp_path):
    d = two_sessions(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "residency", "idle", str(d), *args],
                              capture_output=True, text=True, cwd=ROOT)

    bad = run("--json")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("residency idle: error: ") and "[1] 2025-11-30T02" in bad.stderr
    ok = run("--session", "0", "--busy", "msprof", "--json", "--by-cause")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["busy_definition"] == "msprof"
    assert out["per_rank"]["0"]["reported_free_ns"] == out["per_rank"]["0"]["idle_ns"]
    assert out["idle_by_cause"][0]["cause"] == "residency.release[normal]"  # 200 us of 440
    table = run("--session", "latest")
    assert table.returncode == 0 and "busy: ascend (compute" in table.stdout
    assert "excluded from busy (all ranks): 'EVENT_RECORD_SQE' x 1" in table.stdout


def host_ranges(root: Path = DATA / "ascend_real") -> list[tuple[int, int, str]]:
    """(start us, end us, name) of every host range of every rank, from the raw JSON."""
    out = []
    for view in sorted(root.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json")):
        events = json.loads(view.read_text())
        process = {e["pid"]: e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "process_name"}
        out += [(Decimal_us(e["ts"]), Decimal_us(e["ts"]) + int(e["dur"]), e["name"])
                for e in events if e["ph"] == "X" and process[e["pid"]] in ("Python", "CANN")]
    return out


def test_idle_by_cause_against_the_grid(real):
    idle = expected("ascend")["idle_cells"]
    ranges = host_ranges()
    exclusive: dict[str, int] = {}
    for cell in idle:  # the innermost range: latest start, then shortest, then name
        running = [(-a, b, n) for a, b, n in ranges if a <= cell < b]
        name = min(running)[2] if running else NO_HOST_RANGE
        exclusive[name] = exclusive.get(name, 0) + 1000
    inclusive = {n: 1000 * len(idle & {c for a, b, m in ranges if m == n
                                       for c in range(a, b)}) for _, _, n in ranges}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = idle_by_cause(real)
    got = dict(zip(frame["cause"], frame["idle_ns"], strict=True))
    assert {k: v for k, v in got.items() if v} == exclusive
    assert sum(got.values()) == len(idle) * 1000  # a partition of all-rank idle
    assert exclusive[NO_HOST_RANGE] == 50_000 and exclusive["residency.release[normal]"] == \
        120_000
    got_inclusive = dict(zip(frame["cause"], frame["inclusive_idle_ns"], strict=True))
    assert {k: v for k, v in got_inclusive.items() if k != NO_HOST_RANGE} == \
        {k: v for k, v in inclusive.items() if v}
    assert frame["idle_ns"].is_monotonic_decreasing
    assert frame.loc[frame["cause"] == "residency.phase[denoise]", "kind"].item() == "phase"
    assert top_cause(frame).cause == "residency.release[normal]"
    # the difference of two arms: the cause only the baseline had leads, at its full size
    gone = frame.assign(idle_ns=np.where(frame["cause"] == "residency.release[normal]", 0,
                                         frame["idle_ns"]))
    diff = cause_diff(frame, gone[gone["idle_ns"] > 0])
    first = diff.iloc[0]
    assert (first["cause"], first["baseline_idle_ns"], first["candidate_idle_ns"],
            first["delta_idle_ms"]) == ("residency.release[normal]", 120_000, 0, -0.12)
    assert (diff["delta_idle_ns"].iloc[1:] == 0).all()


# -- the SQLite export -------------------------------------------------------------------------

def as_db_type(task_type: str) -> str:
    """The DB's TASK.taskType of a text-export Task Type: a memory copy's text type is its SQE
    type, the DB keeps the host type MEMCPY_ASYNC (msprof's ascend_hardware_assembler.cpp)."""
    return "MEMCPY_ASYNC" if task_type in COPIES else task_type


def test_db_export_gives_the_text_export_timelines():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = load_traces(DATA / "ascend_real", cache=False)
        db = load_traces(DATA / "ascend_real_db", cache=False)
    assert list(db.ranks) == list(text.ranks) == [0, 1]
    for rank in text.ranks:
        a, b = text.ranks[rank], db.ranks[rank]
        assert b.source.name == f"ascend_pytorch_profiler_{rank}.db"
        assert a.ranges.tolist() == b.ranges.tolist()
        assert a.range_names.tolist() == b.range_names.tolist()
        # every task with the Task Type the text export shows (a compute task's GE type from
        # COMPUTE_TASK_INFO), but a MEMCPY_ASYNC task, whose text type is its SQE type
        assert sorted(zip(a.device_names, map(as_db_type, a.device_types), strict=True)) == (
            sorted(zip(b.device_names, b.device_types, strict=True)))
    for definition in ("ascend", "msprof", "all"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, _, busy_a, excl_a = busy_intervals(text, busy=definition)
            _, _, busy_b, excl_b = busy_intervals(db, busy=definition)
            sa = idle_summary(text, marker=NORMAL, busy=definition).to_dict()
            sb = idle_summary(db, marker=NORMAL, busy=definition).to_dict()
        for rank in text.ranks:
            assert busy_a[rank].tolist() == busy_b[rank].tolist(), (definition, rank)
            assert {as_db_type(k): v for k, v in excl_a[rank].items()} == excl_b[rank]
            assert sb["per_rank"][str(rank)]["reported_free_ns"] is None  # no Overlap lane
            for row in (sa, sb):
                row["per_rank"][str(rank)].pop("excluded_tasks")
                row["per_rank"][str(rank)].pop("reported_free_ns")
        assert sa == sb


def test_db_without_the_expected_tables_names_the_table(tmp_path):
    d = copy("ascend_real_db", tmp_path)
    db = next(d.glob("*_1001_*/ASCEND_PROFILER_OUTPUT/*.db"))
    con = sqlite3.connect(db)
    con.execute("DROP TABLE TASK")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match=r"ascend_pytorch_profiler_0\.db: no table TASK: not "
                       r"a torch-npu profiler database"):
        load_traces(d, cache=False)
    db.write_bytes(b"not sqlite at all" * 10)
    with pytest.raises(TraceError, match=r"ascend_pytorch_profiler_0\.db: cannot read"):
        load_traces(d, cache=False)


def test_db_rank_from_its_file_name(tmp_path):
    d = copy("ascend_real_db", tmp_path)
    for info in d.glob("*/profiler_info_*.json"):
        info.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert list(load_traces(d, cache=False).ranks) == [0, 1]


# -- relative timestamps (Ascend/pytorch PR #156) and the cache --------------------------------

def relative(tmp_path: Path, ranks: int) -> Path:
    d = copy("ascend_real", tmp_path)
    for sub in sorted(d.iterdir())[ranks:]:
        shutil.rmtree(sub)
    for view in d.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        events = json.loads(view.read_text())
        for e in events:
            if "ts" in e:
                e["ts"] = float(Decimal_us(e["ts"]))  # numbers, relative to the profile
        view.write_text(json.dumps(events))
    return d


def test_relative_timestamps_are_refused_for_several_ranks(tmp_path):
    with pytest.raises(TraceError, match=r"timestamps are relative to the profile's start .* "
                       r"PR #156 .*cannot be aligned"):
        load_traces(relative(tmp_path, 2), cache=False)


def test_relative_timestamps_of_one_rank_warn(tmp_path):
    with pytest.warns(UserWarning, match="relative to the profile's start, not epoch times"):
        t = load_traces(relative(tmp_path, 1), cache=False).ranks[0]
    assert t.device[0].tolist() == [100_000, 200_000]


def test_cache_keeps_types_names_and_overlap(tmp_path):
    d = copy("ascend_real", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cold = load_traces(d)
        assert not list(d.glob(f"*/ASCEND_PROFILER_OUTPUT/{CACHE_DIR}"))  # never beside
        assert list(tracecache.cache_dir().glob("*.entry"))
        warm = load_traces(d)
    for rank, a in cold.ranks.items():
        b = warm.ranks[rank]
        for field in ("device", "ranges", "overlap"):
            assert np.array_equal(getattr(a, field), getattr(b, field))
        for field in ("range_names", "device_names", "device_types", "overlap_names"):
            assert getattr(a, field).tolist() == getattr(b, field).tolist()
        assert "EVENT_WAIT_SQE" in a.device_types.tolist() or rank == 1


def test_the_older_hccl_lane_is_communication(real, tmp_path):
    d = copy("ascend_real", tmp_path)
    for view in d.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        view.write_text(view.read_text().replace('"name": "Communication"\n',
                                                 '"name": "HCCL"\n'))
    assert '"HCCL"' in next(d.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json")).read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = idle_summary(load_traces(d, cache=False), busy="msprof").to_dict()
        new = idle_summary(real, busy="msprof").to_dict()
    assert old == new


def test_db_markers_from_mstx_events(tmp_path):
    d = copy("ascend_real_db", tmp_path)
    db = next(d.glob("*_1001_*/ASCEND_PROFILER_OUTPUT/*.db"))
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE MSTX_EVENTS (startNs INTEGER, endNs INTEGER, eventType INTEGER, "
                "rangeId INTEGER, category INTEGER, message INTEGER, globalTid INTEGER, "
                "endGlobalTid INTEGER, domainId INTEGER, connectionId INTEGER)")
    con.execute("INSERT INTO STRING_IDS VALUES (9001, 'step 1')")
    start = (EPOCH_US + 20) * 1000
    con.execute("INSERT INTO MSTX_EVENTS VALUES (?, ?, 2, 1, 0, 9001, 5, 5, 0, 4000000001)",
                (start, start + 5000))
    con.execute("INSERT INTO MSTX_EVENTS VALUES (?, NULL, 0, 2, 0, 9001, 5, 5, 0, 4000000002)",
                (start,))  # a point marker without an end: not a range
    con.commit()
    con.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = load_traces(d, cache=False).ranks[0]
    hits = t.ranges[t.range_names == "step 1"].tolist()
    assert hits == [[start, start + 5000]]


def test_plain_profiler_info_is_rank_0(tmp_path):
    d = copy("ascend_real", tmp_path)
    for sub in sorted(d.iterdir())[1:]:
        shutil.rmtree(sub)
    info = next(d.glob("*/profiler_info_0.json"))
    info.rename(info.with_name("profiler_info.json"))
    with pytest.warns(TraceNote, match="records no rank.*read as rank 0, the only trace"):
        assert list(load_traces(d, cache=False).ranks) == [0]


def _plain_infos_in_rank_folders(tmp_path, folder: str) -> Path:
    """ascend_real's sessions, each with a plain profiler_info.json, in <folder><r>/."""
    d = copy("ascend_real", tmp_path)
    out = tmp_path / "tree"
    for r, sub in enumerate(sorted(p for p in d.iterdir() if p.is_dir())):
        for info in sub.glob("profiler_info_*.json"):
            info.rename(info.with_name("profiler_info.json"))
        (out / f"{folder}{r}").mkdir(parents=True)
        sub.rename(out / f"{folder}{r}" / sub.name)
    return out


@pytest.mark.parametrize("folder", ["rank", "diffusion_rank"])
def test_a_plain_profiler_info_takes_its_rank_from_the_folder(tmp_path, folder):
    """A plain profiler_info.json records no rank: the rank<N> folder tells it, with no
    warning that the profiler recorded another (it read as rank 0 on every rank)."""
    d = _plain_infos_in_rank_folders(tmp_path, folder)
    n = len(list(d.iterdir()))
    assert n >= 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traces = load_traces(d, cache=False)
        summary = idle_summary_at(d, cache=False)
    assert list(traces.ranks) == list(range(n)) == list(summary.ranks)
    assert not [w for w in caught if "recorded rank" in str(w.message)]


def test_npu_analysis_modules_import_neither_torch_nor_the_workload():
    code = ("import sys, warnings; warnings.simplefilter('ignore'); "
            "import residency.traces.ascend, residency.traces.busy, residency.analysis.causes, "
            "residency.traces.memory, "
            "residency.analysis.tracediff; from residency.traces.load import load_traces; "
            f"a = load_traces({str(DATA / 'ascend_real')!r}, cache=False); "
            f"b = load_traces({str(DATA / 'ascend_real_db')!r}, cache=False); "
            "residency.analysis.causes.idle_by_cause(a); "
            "residency.traces.memory.memory_timeline(a); "
            "residency.analysis.tracediff.trace_diff(a, b); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or m.startswith(('residency.workload.pipeline', 'residency.emulated'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_undecodable_task_args_mean_no_type(tmp_path):
    d = copy("ascend_real", tmp_path)
    view = next(d.glob("*_1001_*/ASCEND_PROFILER_OUTPUT/trace_view.json"))
    text = view.read_bytes().replace(b'"Task Type": "MIX_AIC"',
                                     b'"Task Type": "MIX_' + bytes([0xFF]) + b'"', 1)
    view.write_bytes(text.replace(b'"Task Type": "AI_CORE"', b'"Task Type": ["AI_CORE"]', 1))
    t = load_traces(d, cache=False)
    # counted busy; not warned about: the time only they cover lies in the trace's own
    # Overlap Analysis Computing slices, so the trace counts it busy too
    s = idle_summary(t)
    assert t.ranks[0].device_types.tolist().count("") == 2
    assert s.per_rank[0].unknown_tasks[""] == 2


@pytest.mark.parametrize(("dur", "want_ns"), [("1764499999000001", 1_764_499_999_000_001_000),
                                              ("1764499999000001.5", 1_764_499_999_000_001_500),
                                              ("50.25", 50_250)])
def test_durations_are_exact_however_written(tmp_path, dur, want_ns):
    # a JSON integer or float dur too large for float64 at 1 ns (found by the fuzz test)
    d = tmp_path / "h_1_20251130010203000_ascend_pt"
    (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (d / "profiler_info_0.json").write_text("{}")
    (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(
        '[{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"Ascend Hardware"}},'
        '{"ph":"X","name":"k","pid":1,"tid":0,"ts":"1764499999000000.000","dur":' + dur + ',"args":'
        '{"Task Type":"AI_CORE"}}]')
    t = load_traces(tmp_path, cache=False).ranks[0]
    assert t.device.tolist() == [[EPOCH_US * 1000 - 10**9, EPOCH_US * 1000 - 10**9 + want_ns]]


def test_device_names_survive_the_cache(tmp_path):
    d = copy("ascend_real", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cold = load_traces(d).ranks[0]
        warm = load_traces(d).ranks[0]
    assert cold.device_names.tolist()[:2] == ["MatMul_1", "EVENT_WAIT_SQE"]
    assert warm.device_names.tolist() == cold.device_names.tolist()
    assert warm.overlap_names.tolist() == cold.overlap_names.tolist() != []


def _task_db(path: Path, tasks: int) -> Path:
    """A torch-npu database of `tasks` compute tasks (each with its COMPUTE_TASK_INFO row)
    and as many communication task rows looked up by id."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE STRING_IDS (id INTEGER, value TEXT)")
    con.execute("CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, globalTaskId INTEGER, "
                "taskType INTEGER)")
    con.execute("CREATE TABLE COMPUTE_TASK_INFO (name INTEGER, globalTaskId INTEGER, "
                "taskType INTEGER)")
    con.executemany("INSERT INTO STRING_IDS VALUES (?, ?)",
                    [(1, "AI_CORE"), (2, "MatMul"), (3, "KERNEL_AICORE")])
    con.executemany("INSERT INTO TASK VALUES (?, ?, ?, 3)",
                    [(1000 * i, 1000 * i + 500, i) for i in range(tasks)])
    con.executemany("INSERT INTO COMPUTE_TASK_INFO VALUES (2, ?, 1)",
                    [(i,) for i in range(tasks)])
    con.commit()
    con.close()
    return path


def test_the_database_lookups_are_not_quadratic_in_the_tasks(tmp_path, monkeypatch):
    """Each task's COMPUTE_TASK_INFO row is found through an index, never a scan per task:
    SQLite's VM instructions (counted by the connection's progress handler, which runs every
    fixed number of them) grow about as the tasks do (before: 8 x 27.5k tasks took 480 s)."""
    from residency.traces import ascend_db
    from residency.traces.sqlitedb import UntrustedDatabase, python_reader

    steps = [0]

    def counting(self):
        steps[0] += 1
        return 0

    monkeypatch.setattr(UntrustedDatabase, "_past_budget", counting)
    counts = {}
    for n in (1000, 4000):
        steps[0] = 0
        with python_reader():  # (every query on the connection the handler counts)
            parsed = ascend_db.read_db(_task_db(tmp_path / f"t{n}.db", n))
        assert len(parsed.device) == n and set(parsed.device_names.tolist()) == {"MatMul"}
        counts[n] = steps[0]
    assert counts[4000] < 6 * counts[1000], counts  # quadratic: about 16x


def _statements(monkeypatch) -> list[str]:
    """Every SQL statement the databases opened from now on run (SQLite's trace callback)."""
    from residency.traces import sqlitedb

    seen: list[str] = []
    opened = sqlitedb.open_untrusted

    def tracing(*args, **kwargs):
        db = opened(*args, **kwargs)
        db._con.set_trace_callback(seen.append)
        return db

    monkeypatch.setattr(sqlitedb, "open_untrusted", tracing)
    monkeypatch.setattr("residency.traces.ascend_db.open_untrusted", tracing)
    return seen


def test_a_usual_database_is_read_by_plain_scans(monkeypatch):
    """torch-npu's database is read one plain scan per table, joined on numpy columns (before:
    indexed temporary copies and a correlated lookup per task, 3-5x the bare read of the same
    rows); the answer is the row-by-row reading's."""
    from residency.traces import ascend_db

    seen = _statements(monkeypatch)
    for db in sorted((DATA / "ascend_real_db").rglob("*.db")):
        seen.clear()
        parsed = ascend_db.read_db(db)
        assert seen and not [s for s in seen if "JOIN" in s.upper() or "TEMP" in s.upper()], seen
        _same_parse(parsed, ascend_db.read_db(db, reading="columns"))
        _same_parse(parsed, ascend_db.read_db(db, reading="rows"))


def test_the_reading_of_a_database_is_one_of_the_readings():
    from residency.traces import ascend_db

    db = next((DATA / "ascend_real_db").rglob("*.db"))
    with pytest.raises(ValueError, match=r"`reading` must be one of \['auto', 'columns', "
                                         r"'rows'\], but 'sql' was passed"):
        ascend_db.read_db(db, reading="sql")


def _same_parse(a, b) -> None:
    for field in ("device", "ranges", "names", "device_task_type", "range_task_type",
                  "range_lane", "device_names"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x.dtype, x.shape, x.tolist()) == (y.dtype, y.shape, y.tolist()), field
    assert (a.task_types, a.lanes) == (b.task_types, b.lanes)


_IDS = st.one_of(st.integers(0, 6), st.none(), st.just("x"), st.just(2.5))
_TIMES = st.one_of(st.integers(0, 50), st.integers(0, 50).map(str), st.none())


@st.composite
def _odd_database(draw) -> dict:
    odd = draw(st.integers(0, 3)) == 0  # else the ids and task times the column reading takes
    strings = draw(st.lists(st.tuples(st.one_of(st.integers(0, 6), st.just("x")) if odd else
                                      st.integers(0, 6),
                                      st.one_of(st.sampled_from(["AI_CORE", "N/A", "", "Mm",
                                                                 "AI_CORE"]), st.none())),
                            max_size=8, unique_by=None if odd else (lambda r: r[0])))
    span = (st.tuples(_TIMES, _TIMES) if odd else
            st.tuples(st.integers(0, 50), st.integers(0, 9)).map(lambda t: (t[0], t[0] + t[1])))
    keys = _IDS if odd else st.one_of(st.integers(0, 6), st.none())
    tasks = [(*t, i, k) for t, i, k in draw(st.lists(st.tuples(span, _IDS, keys),
                                                      max_size=10))]
    python = [(*t, i) for t, i in draw(st.lists(st.tuples(span, _IDS), max_size=6))]
    ops = [(*t, i) for t, i in draw(st.lists(st.tuples(span, _IDS), max_size=3))]
    return {"STRING_IDS": ("id INTEGER, value TEXT", strings),
            "TASK": ("startNs INTEGER, endNs INTEGER, taskType INTEGER, "
                     "globalTaskId INTEGER", tasks),
            "COMPUTE_TASK_INFO": ("globalTaskId INTEGER, name INTEGER, taskType INTEGER",
                                  draw(st.lists(st.tuples(keys, _IDS, _IDS), max_size=8))),
            "COMMUNICATION_TASK_INFO": ("globalTaskId INTEGER, name INTEGER",
                                        draw(st.lists(st.tuples(keys, _IDS), max_size=4))),
            "PYTORCH_API": ("startNs TEXT, endNs TEXT, name INTEGER", python),
            "COMMUNICATION_OP": ("startNs INTEGER, endNs INTEGER, opName INTEGER", ops)}


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_odd_database())
def test_the_column_reading_is_the_row_reading_on_odd_databases(tmp_path, tables):
    """NULLs, text ids, repeated ids and keys, NULL and 'N/A' values, text times, ends before
    starts: wherever the column reading answers, it is the row-by-row reading's answer."""
    from residency.traces import ascend_db

    path = write_sqlite(tmp_path / "odd.db", tables)
    try:
        want = ascend_db.read_db(path, reading="rows")
    except (TraceError, TypeError) as exc:
        want = exc
    try:
        got = ascend_db.read_db(path, reading="columns")
    except ascend_db.UnusualDatabase:
        return
    assert not isinstance(want, Exception), want
    _same_parse(got, want)


def test_a_database_is_digested_in_place_not_copied(tmp_path, monkeypatch):
    """For the cache, the database's digest is taken of the file itself (before: a private
    copy of every byte was written first, 1 GB a rank), and is the file's content digest."""
    from residency.traces import ascend_db, sqlitedb
    from residency.traces.files import file_digest

    def no_copy(*args, **kwargs):
        raise AssertionError("copied")

    monkeypatch.setattr(sqlitedb, "hashed_copy", no_copy)
    db = next((DATA / "ascend_real_db").rglob("*.db"))
    assert ascend_db.read_db(db, digest=True).digest == file_digest(db)


def test_a_database_written_while_read_is_refused(tmp_path, monkeypatch):
    """A digest taken in place vouches for the bytes read only if the file did not change
    meanwhile: a write during the read (its status changes) is an error, never a cache entry."""
    from residency.traces import ascend_db
    from residency.traces.sqlitedb import UntrustedDatabase

    db = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(next((DATA / "ascend_real_db").rglob("*.db")), db)
    read = UntrustedDatabase.int_columns

    def read_then_write(self, *args, **kwargs):
        got = read(self, *args, **kwargs)
        with open(db, "ab") as f:
            f.write(b"\0")
        return got

    monkeypatch.setattr(UntrustedDatabase, "int_columns", read_then_write)
    with pytest.raises(TraceError, match=r"ascend_pytorch_profiler_0\.db: changed while it "
                                         r"was read"):
        ascend_db.read_db(db, digest=True)
