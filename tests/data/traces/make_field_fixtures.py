"""Write the field-layout fixtures (deterministic; rerun after editing): small traces written by
this project that reproduce, field by field, the structure of real profiler output nobody on
the project wrote. None of the real files is copied; each layout's source is named below.

* field/rocm_single/: one Kineto file from an AMD GPU, as HolisticTraceAnalysis'
  ``tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz`` (PyTorch on ROCm 6.2):
  top-level keys ``schemaVersion, deviceProperties, record_shapes, traceEvents, traceName,
  displayTimeUnit, baseTimeNanoseconds``, no ``distributedInfo``; ``process_name`` /
  ``process_labels`` metadata (``CPU``, ``GPU 0``..), ``cpu_op``, ``cuda_runtime``
  (``hipLaunchKernel``), ``ac2g`` flows, ``kernel`` / ``gpu_memcpy`` with ``device``,
  ``stream``, ``correlation``, ``kind`` args, ``gpu_user_annotation`` over the kernels, a
  ``Trace`` span, instant events. Named as tensorboard's handler names files
  (``<worker>.<ms>.pt.trace.json.gz``): the file names no rank.
* field/mtia/: an MTIA capture, as HTA's ``tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz``:
  ``distributedInfo`` (``mtia:hccl,cpu:gloo``, ``pg_config``), ``trace_id``, ``host_name``,
  device process ``MTIA 9``, device tasks of category ``mtia_ccp_events`` (``dma_request``,
  ``pe_exe``, ``event_wait``), ``mtia_runtime`` host calls, ``INFO`` / ``ERROR`` lists.
* field/cuda_with_et/: two CUDA ranks as HTA's ``tests/data/trace_filter`` and
  ``ns_resolution_trace`` files (``rank-<N>.<date>.<pid>.pt.trace.json.gz``, integer ``ts``,
  ``distributedInfo`` nccl), with ``cuda_sync`` events on the device lane (never work), beside
  an execution trace as HTA's ``tests/data/execution_trace/benchmark_simple_add_et.json.gz``
  (``{"schema", "pid", "time", "start_ts", "nodes": [...], "finish_ts"}``) and a memory
  timeline export (torch.profiler ``export_memory_timeline``: ``[times, sizes]``).
* field/cpu_only_gloo/: a CPU-only 2-rank gloo capture (torch.profiler with CPU activity,
  as HTA's ``tests/data/cpu_only`` rank file): host ranges only.
* field/npu_loose/rank0/trace_view.json: torch-npu's text export copied off the NPU host, as
  msprof-analyze's ``test/ut/advisor/timeline_advice/trace_view.json`` (a real capture, Jan
  2024): one JSON array; ``process_name`` / ``process_labels`` / ``process_sort_index`` /
  ``thread_name`` metadata; ``Python`` host ranges (``ProfilerStep#N``), ``CANN`` ``AscendCL``
  calls, ``Ascend Hardware`` tasks whose ``args`` hold ``Model Id``, ``Task Type`` (mostly
  ``Other``, as in the real file), ``Physic Stream Id``, ``Task Id``, ``Batch Id``,
  ``Subtask Id``, ``connection_id``; ``Overlap Analysis`` slices (Computing, Free) counting
  every task as msprof does; ``ts`` as decimal text.
* field/npu_session/<host>_<pid>_<time>_ascend_pt/: the same profile in a session directory
  with ``profiler_info_0.json``, ``ASCEND_PROFILER_OUTPUT/kernel_details.csv`` (torch-npu's
  columns, ``Step Id`` first, ``Start Time(us)`` quoted with a trailing tab as msprof-analyze's
  ``test/ut/advisor/compute_advice/data/kernel_details.csv`` has it) and
  ``step_trace_time.csv`` (torch-npu ``_trace_step_time.py``'s columns: per step the sums of
  the Overlap Analysis slices that start in the step's device range).
* field/npu_summaries_only/: a session with the CSV summaries but no timeline (no
  ``trace_view.json``, no database): not supported.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAB_RE = __import__("re").compile(r"@([0-9.]+)@")
OUT = HERE / "field"


def dump(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text, mtime=0))
    else:
        path.write_bytes(text)


def meta(pid: object, name: str, value: dict, ts: float = 0.0) -> dict:
    return {"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": value}


# -- AMD MI250, one process, no distributedInfo ----------------------------------------------

ROCM_T0 = 4203669603000.0  # us, relative to baseTimeNanoseconds, as the capture's
# device work: (cat, name, start offset us, dur us)
ROCM_DEVICE = [("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 450.206, 22.441),
               ("kernel", "void at::native::elementwise_kernel<128, 2>", 771.648, 6.88),
               ("kernel", "Cijk_Ailk_Bljk_SB_MT64x64x16", 775.125, 40.5),  # overlaps
               ("kernel", "void at::native::reduce_kernel<512, 1>", 900.0, 12.25),
               ("gpu_memcpy", "Memcpy DtoH (Device -> Host)", 1500.5, 3.125)]


def rocm() -> None:
    pid, gpu = 597913, 2
    ev: list[dict] = [meta(pid, "process_name", {"name": "python3"}, ROCM_T0),
                      meta(pid, "process_labels", {"labels": "CPU"}, ROCM_T0)]
    for d in range(3):
        ev += [meta(d, "process_name", {"name": "python3"}, ROCM_T0),
               meta(d, "process_labels", {"labels": f"GPU {d}"}, ROCM_T0)]
    ev.append({"ph": "X", "cat": "Trace", "ts": ROCM_T0 + 18.756, "dur": 1761.878,
               "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
               "args": {"Op count": 0}})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": pid,
               "tid": pid, "ts": ROCM_T0 + 187.439, "dur": 1288.291,
               "args": {"External id": 1, "Record function id": 1, "Ev Idx": 34}})
    for i, (cat, name, start, dur) in enumerate(ROCM_DEVICE):
        corr = 117 + i
        launch = ROCM_T0 + start - 30.0
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_" if cat != "kernel" else
                   "aten::mm", "pid": pid, "tid": 598009, "ts": launch - 5.0, "dur": 70.0,
                   "args": {"External id": 8 + i, "Record function id": 0,
                            "Sequence number": 7, "Fwd thread id": 1, "Ev Idx": i}})
        ev.append({"ph": "X", "cat": "cuda_runtime",
                   "name": "hipLaunchKernel" if cat == "kernel" else "hipMemcpyWithStream",
                   "pid": pid, "tid": pid, "ts": launch, "dur": 20.204,
                   "args": {"External id": 8 + i, "stream": "0x0", "cid": 153,
                            "correlation": corr}})
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": launch,
                   "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": gpu, "tid": 0,
                   "ts": ROCM_T0 + start, "dur": dur,
                   "args": {"External id": 8 + i, "device": gpu, "stream": 0,
                            "correlation": corr,
                            "kind": "Dispatch Kernel" if cat == "kernel" else "HtoD"}})
        ev.append({"ph": "f", "id": corr, "pid": gpu, "tid": 0, "ts": ROCM_T0 + start,
                   "cat": "ac2g", "name": "ac2g", "bp": "e"})
    ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#SGD.step",
               "pid": gpu, "tid": 0, "ts": ROCM_T0 + 700.0, "dur": 400.0,
               "args": {"External id": 35}})
    ev.append({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
               "tid": "Trace PyTorch Profiler", "ts": ROCM_T0 + 18.756})
    dump(OUT / "rocm_single" / "worker0.1735632360123.pt.trace.json.gz", {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": "AMD Radeon Graphics",
                              "totalGlobalMem": 68702699520, "computeMajor": 9,
                              "computeMinor": 0, "warpSize": 64, "numSms": 104}
                             for d in range(3)],
        "record_shapes": 1, "traceEvents": ev,
        "traceName": "./logs/mi250_minitoy_train_ROCm6_2_kineto.json",
        "displayTimeUnit": "ms", "baseTimeNanoseconds": 1735632360000000000})


# -- MTIA --------------------------------------------------------------------------------------

MTIA_T0 = 3605054881000.0
MTIA_DEVICE = [("dma_request", 801, 202.837, 8.136), ("dma_request", 801, 1966.677, 48.024),
               ("pe_exe", 3910, 400.0, 690.41), ("event_wait", 3774, 350.5, 120.25),
               ("customized_fba_mul_const-dtype_Float", 3911, 3000.125, 250.0)]


def mtia() -> None:
    pid, dev = 3100453, 9
    ev: list[dict] = [meta(dev, "process_name", {"name": f"MTIA {dev}"}),
                      meta(dev, "process_labels", {"labels": f"MTIA {dev}"}),
                      meta(pid, "process_name", {"name": "python3"}, MTIA_T0),
                      meta(pid, "process_labels", {"labels": "CPU"}, MTIA_T0)]
    for step, (start, dur) in enumerate(((100.0, 1800.0), (1950.0, 1400.0))):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                   "pid": pid, "tid": pid, "ts": MTIA_T0 + start, "dur": dur,
                   "args": {"External id": step + 1, "Record function id": 0, "Ev Idx": step}})
    for i, (name, tid, start, dur) in enumerate(MTIA_DEVICE):
        ev.append({"ph": "X", "cat": "mtia_runtime",
                   "name": "runFunction - job_prep_and_submit_for_execution", "pid": pid,
                   "tid": pid, "ts": MTIA_T0 + start - 50.0, "dur": 32.247,
                   "args": {"correlation": 177948 + i}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": pid, "tid": pid,
                   "ts": MTIA_T0 + start - 60.0, "dur": 45.0,
                   "args": {"External id": 68944 + i, "Ev Idx": 35663 + i}})
        ev.append({"ph": "X", "cat": "mtia_ccp_events", "name": name, "pid": dev, "tid": tid,
                   "ts": MTIA_T0 + start, "dur": dur,
                   "args": {"stream": 108, "sqid": 1, "packet_ptr": i}})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "hccl:all_reduce", "pid": pid,
               "tid": 3243097, "ts": MTIA_T0 + 2500.0, "dur": 25.459,
               "args": {"External id": 70000}})
    dump(OUT / "mtia" / "mtia_rank_0.json.gz", {
        "schemaVersion": 1, "deviceProperties": [], "record_shapes": 1,
        "distributedInfo": {"backend": "mtia:hccl,cpu:gloo", "rank": 0, "world_size": 1,
                            "pg_count": 1, "pg_config": [{"pg_name": "0",
                                                          "pg_desc": "default_pg",
                                                          "backend_config": "mtia:hccl,cpu:gloo",
                                                          "pg_size": 1, "ranks": [0]}]},
        "trace_id": "D84EEAE1F7B4478F9F2D86023BDD9BA9", "host_name": "devhost.example",
        "traceEvents": ev,
        "INFO": ["INFO:2024-11-11 10:02:56 MTIAActivityProfilerApi.cpp:46] MTIA: start"],
        "ERROR": ["ERROR:2024-11-11 10:03:10 DeviceProperties.cpp:47] gpuGetDeviceCount "
                  "failed with code 35"],
        "traceName": "/tmp/libkineto_activities_3100453.json", "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1727743122000000000})


# -- CUDA ranks with an execution trace and a memory timeline beside them ----------------------

CUDA_T0 = 1682725898082000  # integer us, as the trace_filter files write ts
CUDA_DEVICE = {0: [("kernel", 100, 10), ("kernel", 105, 20), ("gpu_memset", 200, 4),
                   ("gpu_memcpy", 300, 16), ("kernel", 500, 100)],
               1: [("kernel", 110, 30), ("gpu_memcpy", 180, 40), ("kernel", 560, 90)]}
CUDA_SYNC = {0: [(130, 60)], 1: [(150, 20)]}  # cudaStreamSynchronize on the device lane


def cuda_with_et() -> None:
    for rank, tasks in CUDA_DEVICE.items():
        pid = 1100 + rank
        ev: list[dict] = [meta(pid, "process_name", {"name": "python"}),
                          meta(rank, "process_name", {"name": "python"}),
                          meta(rank, "process_labels", {"labels": f"GPU {rank}"})]
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": pid,
                   "tid": pid, "ts": CUDA_T0 + 50, "dur": 650, "args": {"External id": 1}})
        for i, (cat, start, dur) in enumerate(tasks):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": pid, "tid": pid, "ts": CUDA_T0 + start - 8, "dur": 5,
                       "args": {"External id": 10 + i, "cbid": 211, "correlation": 900 + i}})
            ev.append({"ph": "X", "cat": cat, "name": f"{cat}_{i}", "pid": rank, "tid": 7,
                       "ts": CUDA_T0 + start, "dur": dur,
                       "args": {"External id": 10 + i, "queued": 0, "device": rank,
                                "context": 1, "stream": 7, "correlation": 900 + i,
                                "grid": [2400, 1, 1], "block": [256, 1, 1]}})
        for start, dur in CUDA_SYNC[rank]:
            ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": rank,
                       "tid": 7, "ts": CUDA_T0 + start, "dur": dur,
                       "args": {"cuda_sync_kind": "stream_sync", "stream": 7,
                                "device": rank}})
        dump(OUT / "cuda_with_et" / f"rank-{rank}.Apr_03_18_51_38.{1102 + rank}.pt.trace.json.gz",
             {"schemaVersion": 1, "deviceProperties": [], "record_shapes": 1,
              "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
              "traceEvents": ev, "displayTimeUnit": "ms"})
    dump(OUT / "cuda_with_et" / "benchmark_simple_add_et.json.gz", {
        "schema": "1.0.1", "pid": 563677, "time": "2023-07-14 11:53:07",
        "start_ts": 6278907328,
        "nodes": [{"name": "[pytorch|profiler|execution_trace|thread]", "id": 2, "rf_id": 0,
                   "parent": 1, "fw_parent": 0, "seq_id": -1, "scope": 7, "tid": 1,
                   "fw_tid": 0, "op_schema": "", "inputs": [], "input_shapes": [],
                   "input_types": [], "outputs": [], "output_shapes": [],
                   "output_types": []},
                  {"name": "aten::add", "id": 5, "rf_id": 3, "parent": 2, "fw_parent": 0,
                   "seq_id": -1, "scope": 0, "tid": 1, "fw_tid": 0,
                   "op_schema": "aten::add.Tensor(Tensor self, Tensor other, *, Scalar "
                                "alpha=1) -> Tensor",
                   "inputs": [[1, 2, 0, 4, 4, "cuda:0"]], "input_shapes": [[4]],
                   "input_types": ["Tensor(float)"], "outputs": [], "output_shapes": [],
                   "output_types": []}],
        "finish_ts": 6278917328})
    dump(OUT / "cuda_with_et" / "memory_timeline.raw.json.gz",
         [[CUDA_T0 * 1000 + 100_000, CUDA_T0 * 1000 + 200_000], [[0, 512, 0], [0, 1024, 0]]])


# -- CPU only, 2 ranks, gloo -------------------------------------------------------------------

def cpu_only() -> None:
    for rank in (0, 1):
        pid = 2000 + rank
        ev = [meta(pid, "process_name", {"name": "python"}),
              meta(pid, "process_labels", {"labels": "CPU"})]
        for step in range(2):
            t = 1_000 * step + 10 * rank
            ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                    "pid": pid, "tid": pid, "ts": t, "dur": 900, "args": {"External id": step}},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid,
                    "ts": t + 100, "dur": 300, "args": {"External id": 10 + step}},
                   {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce",
                    "pid": pid, "tid": pid, "ts": t + 500, "dur": 200,
                    "args": {"External id": 20 + step}},
                   {"ph": "X", "cat": "python_function", "name": "train.py(12): step",
                    "pid": pid, "tid": pid, "ts": t + 50, "dur": 800,
                    "args": {"Python id": 3 + step}}]
        dump(OUT / "cpu_only_gloo" / f"rank{rank}.pt.trace.json", {
            "schemaVersion": 1, "deviceProperties": [],
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "traceEvents": ev, "traceName": f"/tmp/rank{rank}.json", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1764500000000000000})


# -- torch-npu text export: loose, and in a session with its CSV summaries ---------------------

NPU_T0 = 1706083261497000  # epoch us (the real file's day)
# Ascend Hardware tasks: (name, Task Type, start us offset, dur us, step); "Other" dominates
# as in the real trace; EVENT_WAIT_SQE is a wait (never work)
NPU_TASKS = [("aclnnMatmul_MatMulCommon_MatMulV2", "Other", 394.810, 185.504, "1"),
             ("aclnnAdd_AddAiCore_Add", "Other", 500.125, 120.25, "1"),  # overlaps
             ("aclnnMatmul_MatMulV3Common_MatMulV3", "AI_CORE", 900.0, 50.0, "1"),
             ("EVENT_WAIT_SQE", "EVENT_WAIT_SQE", 950.0, 300.0, "1"),
             ("aclnnFlashAttentionScore_FlashAttentionScore", "Other", 1400.5, 410.188, "2"),
             ("aclnnAdd_AddAiCore_Add", "Other", 2000.25, 26.78, "2"),
             ("MemCopy", "Other", 2100.0, 31.201, "2")]
NPU_STEPS = [("1", 300.0, 1000.0), ("2", 1350.0, 800.0)]  # ProfilerStep#N on the host
PIDS = {"Python": 2119016, "CANN": 2119017, "Ascend Hardware": 2022,
        "Overlap Analysis": 2023}


def _d(x: float) -> Decimal:
    return Decimal(repr(x))


def _us(x: float | Decimal) -> str:
    """Epoch us as torch-npu writes them: decimal text, 3 fraction digits (exact: a float64
    cannot hold 1.7e15 us to the ns)."""
    return f"{Decimal(NPU_T0) + Decimal(str(x)):.3f}"


def _union(rows: list[tuple[Decimal, Decimal]]) -> list[tuple[Decimal, Decimal]]:
    out: list[list[Decimal]] = []
    for s, e in sorted(rows):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def npu_events() -> list[dict]:
    ev: list[dict] = []
    for i, (lane, pid) in enumerate(PIDS.items()):
        ev += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": lane}},
               {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                "args": {"labels": "CPU" if lane in ("Python", "CANN") else "NPU"}},
               {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "args": {"sort_index": i}}]
    ev.append({"ph": "M", "name": "thread_name", "pid": PIDS["Ascend Hardware"], "tid": 2,
               "args": {"name": "Stream 2"}})
    for step, start, dur in NPU_STEPS:
        ev.append({"ph": "X", "name": f"ProfilerStep#{step}", "pid": PIDS["Python"],
                   "tid": 2119016, "ts": _us(start), "dur": dur,
                   "args": {"Call stack": "train.py(40): <module>",
                            "Sequence number": -1}})
    for i, (name, task_type, start, dur, _) in enumerate(NPU_TASKS):
        ev.append({"name": "AscendCL@" + name.split("_")[0], "pid": PIDS["CANN"],
                   "tid": 2119016, "ts": _us(start - 40.0), "dur": 12.5, "ph": "X",
                   "args": {"Thread Id": 2119016, "Mode": "ACL_OP", "level": "acl",
                            "id": name, "item_id": 0, "connection_id": 1000 + i}})
        ev.append({"name": name, "pid": PIDS["Ascend Hardware"], "tid": 2, "ts": _us(start),
                   "dur": dur, "ph": "X",
                   "args": {"Model Id": 4294967295, "Task Type": task_type,
                            "Physic Stream Id": 2, "Task Id": 61653 + i, "Batch Id": 0,
                            "Subtask Id": 4294967295, "connection_id": 1000 + i}})
        ev += [{"ph": "s", "bp": "e", "name": "async_npu", "id": 1000 + i,
                "pid": PIDS["CANN"], "tid": 2119016, "ts": _us(start - 40.0),
                "cat": "async_npu"},
               {"ph": "f", "bp": "e", "name": "async_npu", "id": 1000 + i,
                "pid": PIDS["Ascend Hardware"], "tid": 2, "ts": _us(start),
                "cat": "async_npu"}]
    for kind, tid, s, e in overlap_slices():
        ev.append({"name": kind, "pid": PIDS["Overlap Analysis"], "tid": tid,
                   "ts": _us(s), "dur": float(e - s), "ph": "X"})
    return ev


def overlap_slices() -> list[tuple[str, int, Decimal, Decimal]]:
    """msprof's Overlap Analysis: Computing = union of the compute tasks, Free = the gaps."""
    busy = _union([(_d(s), _d(s) + _d(d)) for _, t, s, d, _ in NPU_TASKS
                   if t != "EVENT_WAIT_SQE"])
    out = [("Computing", 0, s, e) for s, e in busy]
    out += [("Free", 3, a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False)]
    return sorted(out, key=lambda r: r[2])


def step_range(step: str) -> tuple[Decimal, Decimal]:
    rows = [(_d(s), _d(s) + _d(d)) for _, t, s, d, st in NPU_TASKS
            if st == step and t != "EVENT_WAIT_SQE"]
    return min(s for s, _ in rows), max(e for _, e in rows)


def step_trace_rows() -> list[list[str]]:
    rows = []
    for step, _, _ in NPU_STEPS:
        lo, hi = step_range(step)
        inside = [(k, e - s) for k, _, s, e in overlap_slices() if lo <= s < hi]
        computing = sum(d for k, d in inside if k == "Computing")
        free = sum(d for k, d in inside if k == "Free")
        rows.append([step, f"{computing:.3f}", "0", "0", "0", f"{free:.3f}",
                     f"{hi - lo:.3f}", "0", "0", "40.0"])
    return rows


STEP_HEADER = ["Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
               "Communication", "Free", "Stage", "Bubble",
               "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
KERNEL_HEADER = ["Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "OP State",
                 "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                 "Block Dim", "Mix Block Dim", "HF32 Eligible", "Input Shapes",
                 "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
                 "Output Formats", "Context ID"]


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    # a time with its trailing tab is quoted, as torch-npu's files have it
    path.write_text(TAB_RE.sub(lambda m: f'"{m.group(1)}\t"', buf.getvalue()))


def kernel_rows() -> list[list[str]]:
    return [[step, "4294967295", str(61653 + i), "2", name, name.split("_")[-1], "dynamic",
             "AI_CORE" if t != "Other" else "MIX_AIC", f"@{_us(s)}@", f"{d:.3f}", "1.087",
             "16", "0", "NO", '"81920,4096;8192,512"', "DT_BF16;DT_BF16", "ND;ND",
             '"4096,512"', "DT_BF16", "ND", "N/A"]
            for i, (name, t, s, d, step) in enumerate(NPU_TASKS) if t != "EVENT_WAIT_SQE"]


def npu() -> None:
    ev = npu_events()
    dump(OUT / "npu_loose" / "rank0" / "trace_view.json", ev)
    session = OUT / "npu_session" / "localhost.localdomain_2119016_20240124150101123_ascend_pt"
    out = session / "ASCEND_PROFILER_OUTPUT"
    dump(out / "trace_view.json", ev)
    dump(session / "profiler_info_0.json", {
        "config": {"common_config": {"activities": ["ProfilerActivity.CPU",
                                                    "ProfilerActivity.NPU"],
                                     "schedule": {"wait": 1, "warmup": 1, "active": 2}},
                   "experimental_config": {"_profiler_level": "Level1",
                                           "_export_type": ["text"]}},
        "start_info": {"syscnt_enable": True, "freq": 100.0, "start_cnt": 1234,
                       "start_monotonic": 5678}, "end_info": {"collectionTimeEnd": 1},
        "torch_npu_version": "2.1.0", "cann_version": "7.0.0"})
    write_csv(out / "kernel_details.csv", KERNEL_HEADER, kernel_rows())
    write_csv(out / "step_trace_time.csv", STEP_HEADER, step_trace_rows())
    only = OUT / "npu_summaries_only" / "localhost.localdomain_2119017_20240124150102456_ascend_pt"
    (only / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True, exist_ok=True)
    dump(only / "profiler_info_0.json", {"torch_npu_version": "2.1.0"})
    write_csv(only / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", KERNEL_HEADER,
              kernel_rows())
    write_csv(only / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv", STEP_HEADER,
              step_trace_rows())
    write_csv(only / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv",
              ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
               "Avg Time(us)", "Max Time(us)", "Ratio(%)"],
              [["MatMulV2", "AI_CORE", "1", "185.504", "185.504", "185.504", "185.504",
                "100"]])


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    rocm()
    mtia()
    cuda_with_et()
    cpu_only()
    npu()


if __name__ == "__main__":
    main()
