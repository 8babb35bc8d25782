"""Memory timeline and trace diff: expected values written out from the fixtures' own numbers
(tests/data/traces/make_npu_fixtures.py), not from residency's code."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from residency.analysis.tracediff import NO_PHASE, name_group, task_groups, trace_diff
from residency.traces.load import TraceError, load_traces
from residency.traces.memory import (
    allocator_memory,
    memory_timeline,
    release_drops,
    release_markers,
)
from tests.helpers import copy_fixture as copy

DATA = Path(__file__).resolve().parent.parent / "data" / "traces"
EPOCH_NS = 1_764_500_000_000_000_000
MIB = 1024 * 1024


def load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_traces(path, cache=False)


def test_memory_record_csv_of_torch_npu():
    f = memory_timeline(load(DATA / "ascend_real"))
    assert f.columns.tolist() == ["rank", "ts_ns", "allocated_bytes", "reserved_bytes",
                                  "component", "source"]
    assert f["rank"].unique().tolist() == [0]  # rank 1 recorded no memory
    assert f[["ts_ns", "allocated_bytes", "reserved_bytes", "component"]].values.tolist() == [
        [EPOCH_NS + 100_000, 512 * MIB, 1024 * MIB, "PTA"],
        [EPOCH_NS + 120_000, 4 * MIB, 8 * MIB, "GE"],
        [EPOCH_NS + 120_000, 516 * MIB, 1032 * MIB, "PTA+GE"],
        [EPOCH_NS + 130_000, 2097152 * MIB, 2048 * MIB, "APP"],
        [EPOCH_NS + 500_000, 512 * MIB + MIB // 2, 1024 * MIB, "PTA"],
        [EPOCH_NS + 690_000, 256 * MIB + MIB // 4, 256 * MIB + MIB // 4, "PTA"]]
    marks = release_markers(load(DATA / "ascend_real"))
    assert marks.values.tolist() == [[0, "residency.release[normal]", EPOCH_NS + 400_000,
                                      EPOCH_NS + 700_000]]


def test_allocator_rows_and_what_the_release_handed_back():
    """Only the PyTorch allocator's rows (PTA) count; the release [400, 700) us of rank 0 runs
    from reserved 1024 MiB (the PTA record at 100 us; the GE, PTA+GE and APP records after it
    are other components) to 256.25 MiB (the record at 690 us)."""
    traces = load(DATA / "ascend_real")
    pta = allocator_memory(memory_timeline(traces))
    assert pta["component"].tolist() == ["PTA"] * 3
    assert pta["ts_ns"].tolist() == [EPOCH_NS + 100_000, EPOCH_NS + 500_000, EPOCH_NS + 690_000]
    drops = release_drops(memory_timeline(traces), release_markers(traces))
    assert drops[["rank", "reserved_before_bytes", "reserved_after_bytes",
                  "released_bytes"]].values.tolist() == [
        [0, 1024 * MIB, 256 * MIB + MIB // 4, 1024 * MIB - (256 * MIB + MIB // 4)]]


def test_release_drops_on_kineto_memory_events(tmp_path):
    """Kineto [memory] events of rank 2: reserved 6 MiB, then 2 MiB after the empty_cache inside
    the first release [20, 30) us; nothing recorded before the second release's rank (3)."""
    base = 1_764_500_000_000_000_000

    def mem(ts, alloc, res):
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                "tid": 1, "ts": ts, "args": {"Device Id": 0, "Total Allocated": alloc,
                                             "Total Reserved": res}}

    def rng(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
                "ts": ts, "dur": dur}

    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 40}
    for rank, events in ((2, [kernel, mem(10, 4 * MIB, 6 * MIB), mem(15, 2 * MIB, 6 * MIB),
                              rng("residency.release[normal]", 20, 10),
                              mem(25, 2 * MIB, 2 * MIB), mem(35, 3 * MIB, 4 * MIB)]),
                         (3, [kernel, rng("residency.release[forced]", 20, 10),
                              mem(40, 1 * MIB, 2 * MIB)])):
        (tmp_path / f"r{rank}.json").write_text(json.dumps(
            {"traceEvents": events, "baseTimeNanoseconds": base,
             "distributedInfo": {"rank": rank}}))
    traces = load(tmp_path)
    drops = release_drops(memory_timeline(traces), release_markers(traces))
    assert drops["name"].tolist() == ["residency.release[normal]", "residency.release[forced]"]
    assert drops["released_bytes"].tolist()[0] == 6 * MIB - 2 * MIB
    assert drops["reserved_before_bytes"].isna().tolist() == [False, True]
    assert drops["released_bytes"].isna().tolist() == [False, True]


def test_memory_of_the_db_export_is_the_text_exports():
    """The DB's MEMORY_RECORD table (ns, bytes) holds rank 0's records but APP (the driver's
    view goes to other tables): the same rows as memory_record.csv, to the byte."""
    text = memory_timeline(load(DATA / "ascend_real"))
    db = memory_timeline(load(DATA / "ascend_real_db"))
    cols = ["rank", "ts_ns", "allocated_bytes", "reserved_bytes", "component"]
    assert db[cols].values.tolist() == text[text["component"] != "APP"][cols].values.tolist()
    assert db["source"].str.endswith("ascend_pytorch_profiler_0.db").all()
    assert allocator_memory(db)["reserved_bytes"].tolist() == [
        1024 * MIB, 1024 * MIB, 256 * MIB + MIB // 4]


def test_db_memory_table_without_a_column_names_the_table(tmp_path):
    import sqlite3

    d = copy("ascend_real_db", tmp_path)
    db = next(d.glob("*_1001_*/ASCEND_PROFILER_OUTPUT/*.db"))
    con = sqlite3.connect(db)
    con.execute("DROP TABLE MEMORY_RECORD")
    con.execute("CREATE TABLE MEMORY_RECORD (component INTEGER, totalReserved INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match=r"ascend_pytorch_profiler_0\.db: cannot read the table "
                                         r"MEMORY_RECORD: no such column"):
        memory_timeline(load(d))


def test_memory_record_without_a_column_names_it(tmp_path):
    d = copy("ascend_real", tmp_path)
    record = next(d.glob("*/ASCEND_PROFILER_OUTPUT/memory_record.csv"))
    record.write_text("Component,Timestamp(us),Total Reserved(MB)\nPTA,1,2\n")
    with pytest.raises(TraceError, match=r"memory_record\.csv: no column 'Total Allocated"):
        memory_timeline(load(d))


def test_kineto_memory_events(tmp_path):
    base = 1_764_500_000_000_000_000
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
         "tid": 1, "ts": 12.5, "args": {"Device Type": 1, "Device Id": 0, "Addr": 1,
                                         "Bytes": 512, "Total Allocated": 1536,
                                         "Total Reserved": 2097152}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
         "tid": 1, "ts": 13, "args": {"Device Type": 0, "Device Id": -1, "Bytes": 64,
                                       "Total Allocated": 64, "Total Reserved": 0}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
         "tid": 1, "ts": "20.001", "args": {"Device Type": 1, "Device Id": 0, "Bytes": -512,
                                            "Total Allocated": 1024,
                                            "Total Reserved": 2097152}},
    ]
    (tmp_path / "rank3.json").write_text(json.dumps(
        {"traceEvents": events, "baseTimeNanoseconds": base,
         "distributedInfo": {"rank": 3}}))
    f = memory_timeline(load(tmp_path))
    assert f[["rank", "ts_ns", "allocated_bytes", "reserved_bytes"]].values.tolist() == [
        [3, base + 12_500, 1536, 2097152], [3, base + 20_001, 1024, 2097152]]
    assert memory_timeline(load(DATA / "kineto_basic")).empty


def test_name_groups():
    assert name_group("MatMul_12") == "MatMul"
    assert name_group("void gemm_kernel<float, 4>(float*, int)") == "gemm_kernel"
    assert name_group("hcom_allReduce__123_1") == "hcom_allReduce_"
    assert name_group("_") == "_"


def test_task_groups_by_phase():
    g = task_groups(load(DATA / "ascend_real"))
    rows = {(r.rank, r.phase, r.group): (r.count, r.total_ns) for r in g.itertuples()}
    # rank 0: phase[denoise] is [50,750) us; MatMul_3 starts at 800 (no phase)
    assert rows[(0, "denoise", "MatMul")] == (1, 100_000)
    assert rows[(0, NO_PHASE, "MatMul")] == (1, 200_000)
    assert rows[(0, "denoise", "EVENT_WAIT_SQE")] == (1, 400_000)
    assert rows[(1, "denoise", "MatMul")] == (2, 100_000)
    assert rows[(1, NO_PHASE, "Sort")] == (1, 50_000)
    assert rows[(0, "denoise", "hcom_allReduce_")] == (1, 50_000)


def test_trace_diff_largest_change_first(tmp_path):
    d = copy("ascend_real", tmp_path)
    for view in d.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        events = json.loads(view.read_text())
        for e in events:
            if e.get("name") == "EVENT_WAIT_SQE":
                e["dur"] = 100  # the candidate waits 300 us less
        events.append({**next(e for e in events if e.get("name") == "MatMul_1"),
                       "name": "Mul_9"})  # one more task, on each rank
        view.write_text(json.dumps(events))
    diff = trace_diff(load(DATA / "ascend_real"), load(d))
    top = diff.iloc[0]
    assert (top["phase"], top["group"]) == ("denoise", "EVENT_WAIT_SQE")
    assert top["delta_ms"] == pytest.approx(-0.3) and top["count_delta"] == 0
    mul = diff[diff["group"] == "Mul"].iloc[0]
    assert (mul["count_baseline"], mul["count_candidate"]) == (0, 2)
    same = diff[(diff["group"] == "MatMul") & (diff["phase"] == "denoise")].iloc[0]
    assert same["delta_ms"] == 0 and same["count_baseline"] == same["count_candidate"] == 3
    assert diff["delta_ms"].abs().is_monotonic_decreasing
