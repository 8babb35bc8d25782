"""Write the small trace fixtures beside this file (deterministic; rerun after editing).

Expected figures are worked out by hand in tests/analysis/test_idle.py. Scenarios:
* kineto_basic/: two Kineto ranks (base time, float/int/"us.nnn" string ts, legacy categories,
  excluded categories, rejected events); rank 1 is gzipped and named only by its file name.
* kineto_epoch/: one Kineto file without a base whose ts are absolute epoch-us JSON numbers.
* ascend_basic/: two torch-npu ``*_ascend_pt`` trees with ``profiler_info_<rank>.json`` and
  ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (an array for rank 0, an object for rank 1).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE_NS = 1_764_500_000_000_000_000
EPOCH_US = 1_764_500_000_000_000


def x(cat: str, name: str, ts: object, dur: object, pid: object = 1, tid: object = 1) -> dict:
    """A complete ("X") event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"note": "args are skipped"}}


def kineto_basic() -> None:
    d = HERE / "kineto_basic"
    d.mkdir(exist_ok=True)
    rank0 = [
        x("kernel", "gemm", 100.0, 50.0, 0, 7),                 # [100 000, 150 000)
        x("kernel", "add", "120.5005", 10, 0, 8),              # [120 501, 130 501), string ts
        x("gpu_memcpy", "Memcpy HtoD", 200, 25.5, 0, 7),       # [200 000, 225 500), int ts
        x("Memset", "legacy memset", 300.25, 0.0004, 0, 7),    # rounds to 0 ns: no busy time
        x("Kernel", "legacy kernel", 400, 100, 0, 7),          # [400 000, 500 000)
        x("cuda_sync", "sync", 150, 50, 0, 7),                 # never a device task
        x("gpu_user_annotation", "annot", 0, 1000, 0, 7),      # never a device task
        x("cuda_runtime", "cudaLaunchKernel", 90, 5),          # neither task nor range
        x("kernel", "negative", 600, -5, 0, 7),                # rejected
        x("kernel", "no-number", "abc", 5, 0, 7),              # rejected
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 700, "pid": 0, "tid": 7},
        {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 100, "pid": 0, "tid": 7, "id": 1},
        x("user_annotation", "residency.release[normal]", 150, 100),   # [150 000, 250 000)
        x("cpu_op", "aten::empty", 10, 5),
        x("user_annotation", "residency.phase[prepare]", 50, 400),     # [50 000, 450 000)
        x("user_annotation", "residency.release[normal]", 800, -1),    # rejected
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {
        "backend": "gloo", "rank": 0, "world_size": 2}, "baseTimeNanoseconds": BASE_NS,
        "traceEvents": rank0, "traceName": "rank0"}
    (d / "rank0.trace.json").write_text(json.dumps(doc, indent=1) + "\n")
    rank1 = [
        x("kernel", "gemm", 120, 40, 0, 7),                    # [120 000, 160 000)
        x("kernel", "gemm", 240.0, 60.0, 0, 7),                # [240 000, 300 000)
        x("gpu_memset", "Memset (Device)", 450, 100, 0, 7),    # [450 000, 550 000)
        x("user_annotation", "residency.release[normal]", 140, 120),   # [140 000, 260 000)
        x("user_annotation", "residency.release[forced]", 320, 10),
    ]
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "traceEvents": rank1}
    (d / "rank1.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))


def kineto_epoch() -> None:
    d = HERE / "kineto_epoch"
    d.mkdir(exist_ok=True)
    text = ('{"traceEvents": [\n'
            ' {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
            '"ts": 1764500000123456.789, "dur": 2.5},\n'
            ' {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
            '"ts": 1764500000123460, "dur": 1}\n]}\n')
    (d / "trace_rank3.json").write_text(text)


def ascend_events(pid_names: dict[int, str]) -> list[dict]:
    meta = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": n}}
            for p, n in pid_names.items()]
    meta.append({"ph": "M", "name": "thread_name", "pid": 3, "tid": 9,
                 "args": {"name": "Stream 9"}})
    return meta


def us(offset: str) -> str:
    """An absolute epoch-microsecond string, as torch-npu writes them."""
    whole, _, frac = offset.partition(".")
    return f"{EPOCH_US + int(whole)}.{frac or '000'}"


def ascend_basic() -> None:
    procs = {1: "Python", 2: "CANN", 3: "Ascend Hardware", 4: "Overlap Analysis"}
    rank0 = ascend_events(procs) + [
        x("", "aclnnMatmul", us("100.251"), 50.5, 3, 9),        # [100 251, 150 751)
        x("", "aclnnAdd", us("200"), "30", 3, 9),                # [200 000, 230 000)
        {"ph": "s", "name": "flow", "pid": 3, "tid": 9, "ts": us("100"), "id": 4},
        {"ph": "C", "name": "AI Core Freq", "pid": 3, "tid": 9, "ts": us("100"), "args": {}},
        x("", "Computing", us("100.251"), 130, 4, 0),            # derived: excluded
        x("", "Free", us("150.751"), 49.249, 4, 1),              # derived: excluded
        x("", "residency.release[normal]", us("140"), 100, 1, 5),  # [140 000, 240 000)
        x("", "AscendCL@aclnnMatmul", us("99"), 1.0, 2, 5),
    ]
    rank1 = ascend_events(procs) + [
        x("", "aclnnMatmul", us("120"), 60, 3, 9),               # [120 000, 180 000)
        x("", "hcom_allReduce_", us("190.5"), 9.5, 3, 9),        # [190 500, 200 000)
        x("", "residency.release[normal]", us("150"), 80, 1, 5),  # [150 000, 230 000)
        x("", "Computing", us("120"), 80, 4, 0),
    ]
    for e in rank0 + rank1:  # device tasks carry their Task Type, as torch-npu writes them
        if e["ph"] == "X" and e["pid"] == 3:
            e["args"] = {"Task Type": "AI_CORE", "Stream Id": 9}
    for rank, events, wrap in ((0, rank0, False), (1, rank1, True)):
        d = HERE / "ascend_basic" / f"host_{100 + rank}_20251130010203_ascend_pt"
        (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True, exist_ok=True)
        (d / f"profiler_info_{rank}.json").write_text(json.dumps({"rank_id": rank}) + "\n")
        doc: object = {"traceEvents": events} if wrap else events
        (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    kineto_basic()
    kineto_epoch()
    ascend_basic()
