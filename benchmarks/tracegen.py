"""Realistic synthetic profiler traces for the trace-analysis benchmark.

Kineto (``torch.profiler`` export, PyTorch 2.x): the document head (``schemaVersion``,
``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``), ``process_name`` /
``thread_name`` metadata, ``ProfilerStep#N`` user annotations, ``cpu_op`` events with their
``args`` (External id, Input Dims, Input type, ...), ``python_function`` frames, one
``cuda_runtime`` launch per kernel with its ``correlation``, the device task itself (``kernel``
with grid/block/occupancy args, ``gpu_memcpy``, ``gpu_memset``), its ``ac2g`` flow pair
(``s``/``f``), ``cuda_sync`` events, ``gpu_user_annotation`` ranges and the release markers.
Times are fractional microseconds relative to ``baseTimeNanoseconds`` (``%.3f``); with
`string_ts` a share of them is written as decimal text, as some exporters do.

torch-npu (``ASCEND_PROFILER_OUTPUT/trace_view.json``): a bare event array; ``ts`` absolute
epoch microseconds as decimal text (``"1764500000123456.789"``), ``dur`` fractional numbers;
processes named by ``process_name`` metadata (``Python``, ``CANN``, ``Ascend Hardware``,
``Communication``, ``Overlap Analysis``), device tasks with ``args["Task Type"]``
(AI_CORE, AI_VECTOR_CORE, MIX_AIC, EVENT_WAIT_SQE, ...), HostToDevice flows.

Every rank shares one schedule of release stalls (no device work on any rank, a release
marker on each), so the marker / all-rank-idle intersection is not empty.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BASE_NS = 1_764_500_000_000_000_000
EPOCH_US = BASE_NS // 1000
MARKER = "residency.release[normal]"
KERNELS = [f"void at::native::elementwise_kernel<128, {i}, at::native::gpu_kernel_impl<"
           f"at::native::BinaryFunctor<c10::BFloat16> > >(int, T)" for i in range(16)] + [
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"]
OPS = ["aten::mm", "aten::add", "aten::mul", "aten::_flash_attention_forward",
       "aten::layer_norm", "aten::copy_", "aten::silu", "c10d::allreduce_"]
NPU_TASKS = [("AI_CORE", 50), ("AI_VECTOR_CORE", 25), ("MIX_AIC", 8), ("AI_CPU", 2),
             ("EVENT_WAIT_SQE", 8), ("EVENT_RECORD_SQE", 4), ("SDMA_SQE", 3)]


def _stalls(events: int, seed: int) -> list[tuple[float, float]]:
    rnd = random.Random(seed)
    stalls, t = [], 0.0
    for _ in range(max(1, events // 5000)):
        t += rnd.uniform(3000, 6000)
        stalls.append((t, t + rnd.uniform(50, 400)))
    return stalls


def _f(x: float, strings: bool, rr: random.Random) -> str:
    return f'"{x:.3f}"' if strings and rr.random() < 0.3 else f"{x:.3f}"


def kineto_rank(path: Path, rank: int, ranks: int, events: int, seed: int, *,
                string_ts: bool = False) -> int:
    """Write one rank's Kineto trace of about `events` events; return its device tasks."""
    rr = random.Random(seed * 1000 + rank)
    stalls = _stalls(events, seed)
    head = {"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
         "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
         "numSms": 132, "sharedMemPerBlock": 49152, "regsPerBlock": 65536}],
        "cupti_version": 24, "cuda_runtime_version": 12080, "cuda_driver_version": 12080,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks,
                            "pg_count": 1, "pg_config": [], "nccl_version": "2.21.5"},
        "with_flops": 1, "record_shapes": 1, "trace_id": f"{seed:016X}{rank:016X}",
        "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
    pid, n, corr, t, s, step, tasks = 4242 + rank, 0, 0, 0.0, 0, 0, 0
    out = path.open("w")
    text = json.dumps(head)[:-1] + ', "traceEvents": [\n'
    out.write(text)
    lines = [f'{{"name": "process_name", "ph": "M", "ts": 0.000, "pid": {pid}, "tid": 0, '
             f'"args": {{"name": "python3"}}}}',
             '{"name": "process_name", "ph": "M", "ts": 0.000, "pid": 0, "tid": 0, '
             '"args": {"name": "python3"}}',
             '{"name": "thread_name", "ph": "M", "ts": 0.000, "pid": 0, "tid": 7, '
             '"args": {"name": "stream 7"}}']
    first = True

    def flush() -> None:
        nonlocal first, lines
        if lines:
            out.write(("" if first else ",\n") + ",\n".join(lines))
            first, lines = False, []

    while n < events:
        if n % 4000 == 0:
            step += 1
            lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}",'
                         f' "pid": {pid}, "tid": {pid}, "ts": {t:.3f}, "dur": 2000.125, '
                         f'"args": {{"External id": {corr}, "Record function id": 0, '
                         f'"Ev Idx": {n}}}}}')
            n += 1
        if s < len(stalls) and t >= stalls[s][0]:
            a, b = stalls[s]
            at = _f(a + rr.uniform(-20, 5), string_ts, rr)
            lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "{MARKER}", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {at}, '
                         f'"dur": {b - a + rr.uniform(0, 30):.3f}, "args": {{"External id": '
                         f'{corr}, "Record function id": 0, "Ev Idx": {n}}}}}')
            t, s, n = b + rr.uniform(0, 20), s + 1, n + 1
        op = rr.choice(OPS)
        corr += 1
        op_dur = rr.uniform(8, 40)
        lines.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {pid}, '
                     f'"tid": {pid}, "ts": {_f(t - 10, string_ts, rr)}, "dur": {op_dur:.3f}, '
                     f'"args": {{"External id": {corr}, "Record function id": 0, '
                     f'"Concrete Inputs": ["", ""], "Input type": ["c10::BFloat16", '
                     f'"c10::BFloat16"], "Input Strides": [[4096, 1], [4096, 1]], '
                     f'"Input Dims": [[8, 4096], [4096, 4096]], "Ev Idx": {n}}}}}')
        n += 1
        if corr % 7 == 0:
            lines.append(f'{{"ph": "X", "cat": "python_function", "name": "torch/nn/modules/'
                         f'module.py(1762): _call_impl", "pid": {pid}, "tid": {pid}, '
                         f'"ts": {t - 12:.3f}, "dur": {op_dur + 4:.3f}, "args": {{"Python id": '
                         f'{corr}, "Python parent id": {corr - 1}, "Python thread": 0}}}}')
            n += 1
        for _ in range(rr.choice((1, 1, 1, 2, 3))):
            corr += 1
            dur = rr.uniform(1.0, 14.0)
            launch = t - rr.uniform(3, 8)
            lines.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {launch:.3f}, "dur": 4.125, '
                         f'"args": {{"External id": {corr}, "cbid": 211, "correlation": '
                         f'{corr}}}}}')
            lines.append(f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {pid}, '
                         f'"ts": {launch:.3f}, "cat": "ac2g", "name": "ac2g"}}')
            kind = corr % 50
            if kind == 0:
                lines.append(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device '
                             f'-> Device)", "pid": 0, "tid": 7, "ts": {_f(t, string_ts, rr)}, '
                             f'"dur": {dur:.3f}, "args": {{"External id": {corr}, "device": 0, '
                             f'"context": 1, "stream": 7, "correlation": {corr}, "bytes": '
                             f'1048576, "memory bandwidth (GB/s)": 1500.2}}}}')
            elif kind == 1:
                lines.append(f'{{"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", '
                             f'"pid": 0, "tid": 7, "ts": {t:.3f}, "dur": {dur:.3f}, '
                             f'"args": {{"correlation": {corr}, "stream": 7}}}}')
            else:
                lines.append(f'{{"ph": "X", "cat": "kernel", "name": "{rr.choice(KERNELS)}", '
                             f'"pid": 0, "tid": 7, "ts": {_f(t, string_ts, rr)}, '
                             f'"dur": {dur:.3f}, "args": {{"External id": {corr}, "queued": '
                             f'0, "device": 0, "context": 1, "stream": 7, "correlation": '
                             f'{corr}, "registers per thread": 128, "shared memory": 49152, '
                             f'"blocks per SM": 1.5, "warps per SM": 6.0, "grid": [132, 1, '
                             f'1], "block": [256, 1, 1], "est. achieved occupancy %": 12}}}}')
                tasks += 1
            lines.append(f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {t:.3f}, '
                         f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}')
            n += 4
            t += dur * rr.uniform(0.4, 1.05)
        if corr % 97 == 0:
            lines.append(f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce",'
                         f' "pid": 0, "tid": 7, "ts": {t:.3f}, "dur": 30.000, "args": '
                         f'{{"External id": {corr}}}}}')
            n += 1
        if len(lines) > 4096:
            flush()
    flush()
    out.write('\n], "traceName": "' + str(path.name) + '"}\n')
    out.close()
    return tasks


def kineto_dense_rank(path: Path, rank: int, ranks: int, events: int, seed: int) -> int:
    """Write one rank's *device-dense* Kineto trace: `events` kernels on one stream, each
    1-14 us, gaps 0-150 us, and nothing else but the document head, the metadata and one
    release marker per shared stall (as every rank has): a busy device profiled at Level 0.
    Returns its device tasks."""
    rr = random.Random(seed * 1000 + rank)
    stalls = _stalls(events, seed)
    scale = 80.0  # spread the shared stalls over a dense rank's longer timeline
    stalls = [(a * scale, b * scale - (b - a) * (scale - 1)) for a, b in stalls]
    head = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                    "world_size": ranks},
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
    pid = 4242 + rank
    out = path.open("w")
    out.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
    lines = [f'{{"name": "process_name", "ph": "M", "ts": 0.000, "pid": {pid}, "tid": 0, '
             f'"args": {{"name": "python3"}}}}']
    t, s, first = 0.0, 0, True
    kernels = [f"k{i}_gemm_bf16" for i in range(8)]
    for n in range(events):
        if s < len(stalls) and t >= stalls[s][0]:
            a, b = stalls[s]
            lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "{MARKER}", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {a:.3f}, "dur": {b - a:.3f}}}')
            t, s = max(t, b), s + 1
        dur = rr.uniform(1.0, 14.0)
        lines.append(f'{{"ph": "X", "cat": "kernel", "name": "{kernels[n & 7]}", "pid": 0, '
                     f'"tid": 7, "ts": {t:.3f}, "dur": {dur:.3f}, "args": {{"correlation": '
                     f'{n}, "stream": 7}}}}')
        t += dur + rr.uniform(0.0, 150.0)
        if len(lines) > 8192:
            out.write(("" if first else ",\n") + ",\n".join(lines))
            first, lines = False, []
    out.write(("" if first else ",\n") + ",\n".join(lines))
    out.write('\n], "traceName": "' + str(path.name) + '"}\n')
    out.close()
    return events


def kineto_host_rank(path: Path, rank: int, ranks: int, events: int, seed: int) -> int:
    """Write one rank's *host-dense* Kineto trace: `events` events, nearly all host ranges
    (``cpu_op``, ``python_function``, ``user_annotation``: names kept, the costly part of a
    parse), one kernel per 64 events, a release marker per shared stall. Returns its device
    tasks."""
    rr = random.Random(seed * 1000 + rank)
    stalls = _stalls(events, seed)
    head = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                    "world_size": ranks},
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
    pid = 4242 + rank
    out = path.open("w")
    out.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
    lines = [f'{{"name": "process_name", "ph": "M", "ts": 0.000, "pid": {pid}, "tid": 0, '
             f'"args": {{"name": "python3"}}}}']
    t, s, first, tasks = 0.0, 0, True, 0
    frames = [f"torch/nn/modules/module.py({1700 + i}): _call_impl" for i in range(12)]
    for n in range(events):
        if s < len(stalls) and t >= stalls[s][0]:
            a, b = stalls[s]
            lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "{MARKER}", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {a:.3f}, "dur": {b - a:.3f}}}')
            t, s = max(t, b), s + 1
        dur = rr.uniform(2.0, 40.0)
        if n % 64 == 63:
            lines.append(f'{{"ph": "X", "cat": "kernel", "name": "k_gemm", "pid": 0, '
                         f'"tid": 7, "ts": {t:.3f}, "dur": {dur:.3f}, "args": '
                         f'{{"correlation": {n}}}}}')
            tasks += 1
        elif n % 3 == 0:
            lines.append(f'{{"ph": "X", "cat": "python_function", "name": "{frames[n % 12]}", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {t:.3f}, "dur": {dur:.3f}, '
                         f'"args": {{"Python id": {n}}}}}')
        else:
            lines.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{OPS[n % len(OPS)]}", '
                         f'"pid": {pid}, "tid": {pid}, "ts": {t:.3f}, "dur": {dur:.3f}, '
                         f'"args": {{"External id": {n}, "Ev Idx": {n}}}}}')
        t += rr.uniform(0.5, 6.0)
        if len(lines) > 8192:
            out.write(("" if first else ",\n") + ",\n".join(lines))
            first, lines = False, []
    out.write(("" if first else ",\n") + ",\n".join(lines))
    out.write('\n], "traceName": "' + str(path.name) + '"}\n')
    out.close()
    return tasks


def ascend_rank(folder: Path, rank: int, ranks: int, events: int, seed: int) -> int:
    """Write one rank's torch-npu session (``<host>_<pid>_<time>_ascend_pt/``) of about
    `events` events; return its device tasks."""
    rr = random.Random(seed * 1000 + rank)
    stalls = _stalls(events, seed)
    session = folder / f"node{rank // 8}_{4242 + rank}_20261201120000{rank:03d}_ascend_pt"
    out_dir = session / "ASCEND_PROFILER_OUTPUT"
    out_dir.mkdir(parents=True, exist_ok=True)
    (session / f"profiler_info_{rank}.json").write_text(json.dumps(
        {"config": {"common_config": {"activities": ["CPU", "NPU"]}},
         "start_info": {"collectionTimeBegin": EPOCH_US}, "rank_id": rank}))
    pids = {"Python": 4242 + rank, "CANN": 4000 + rank, "Ascend Hardware": 2 + rank * 100,
            "Communication": 3 + rank * 100, "Overlap Analysis": 5 + rank * 100}
    out = (out_dir / "trace_view.json").open("w")
    lines = [f'{{"name": "process_name", "pid": {p}, "tid": 0, "ph": "M", '
             f'"args": {{"name": "{name}"}}}}' for name, p in pids.items()]
    types = [t for t, w in NPU_TASKS for _ in range(w)]
    n, t, s, tasks, first = 0, 0.0, 0, 0, True

    def ts(x: float) -> str:
        return f'"{EPOCH_US + x:.3f}"'

    out.write("[")
    while n < events:
        if s < len(stalls) and t >= stalls[s][0]:
            a, b = stalls[s]
            lines.append(f'{{"name": "{MARKER}", "pid": {pids["Python"]}, "tid": 1, '
                         f'"ts": {ts(a + rr.uniform(-20, 5))}, "dur": {b - a:.3f}, "ph": "X", '
                         f'"args": {{"Sequence number": -1}}}}')
            lines.append(f'{{"name": "Free", "pid": {pids["Overlap Analysis"]}, "tid": 2, '
                         f'"ts": {ts(a)}, "dur": {b - a:.3f}, "ph": "X"}}')
            t, s, n = b + rr.uniform(0, 20), s + 1, n + 2
        op = rr.choice(OPS)
        lines.append(f'{{"name": "{op}", "pid": {pids["Python"]}, "tid": 1, '
                     f'"ts": {ts(t - 10)}, "dur": {rr.uniform(8, 40):.3f}, "ph": "X", '
                     f'"args": {{"Sequence number": {n}, "Fwd thread id": 0, "Input Dims": '
                     f'"8,4096;4096,4096", "Input type": "BFloat16;BFloat16"}}}}')
        lines.append(f'{{"name": "AscendCL@aclnnMm", "pid": {pids["CANN"]}, "tid": 1, '
                     f'"ts": {ts(t - 6)}, "dur": 4.250, "ph": "X", "args": {{"Thread Id": 1, '
                     f'"Mode": "ACL_OP", "level": "acl", "id": "0", "item_id": "0", '
                     f'"connection_id": {n}}}}}')
        lines.append(f'{{"ph": "s", "bp": "e", "name": "HostToDevice{n}", "id": "{n}", '
                     f'"pid": {pids["CANN"]}, "tid": 1, "ts": {ts(t - 6)}, '
                     f'"cat": "HostToDevice"}}')
        ty = rr.choice(types)
        dur = rr.uniform(1.0, 14.0)
        lines.append(f'{{"name": "{op[6:]}_Op_{n % 13}", "pid": {pids["Ascend Hardware"]}, '
                     f'"tid": 2, "ts": {ts(t)}, "dur": {dur:.3f}, "ph": "X", "args": {{"Model '
                     f'Id": 4294967295, "Task Type": "{ty}", "Physic Stream Id": 2, "Task Id": '
                     f'{n % 65536}, "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": '
                     f'{n}}}}}')
        lines.append(f'{{"ph": "f", "bp": "e", "name": "HostToDevice{n}", "id": "{n}", '
                     f'"pid": {pids["Ascend Hardware"]}, "tid": 2, "ts": {ts(t)}, '
                     f'"cat": "HostToDevice"}}')
        tasks += 1
        n += 5
        if n % 300 < 5:
            lines.append(f'{{"name": "hcom_allReduce__{n}", "pid": {pids["Communication"]}, '
                         f'"tid": 3, "ts": {ts(t + dur)}, "dur": 25.500, "ph": "X", '
                         f'"args": {{"connection_id": {n}}}}}')
            lines.append(f'{{"name": "Computing", "pid": {pids["Overlap Analysis"]}, '
                         f'"tid": 1, "ts": {ts(t)}, "dur": {dur:.3f}, "ph": "X"}}')
            n += 2
        t += dur * rr.uniform(0.4, 1.05)
        if len(lines) > 4096:
            out.write(("" if first else ",\n") + ",\n".join(lines))
            first, lines = False, []
    out.write(("" if first else ",\n") + ",\n".join(lines) + "\n]\n")
    out.close()
    return tasks


DB_SCHEMA = {  # torch-npu's tables as it writes them (tests/data/traces/make_npu_fixtures.py)
    "STRING_IDS": "id INTEGER, value TEXT",
    "TASK": "startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, "
            "globalTaskId INTEGER, globalPid INTEGER, taskType INTEGER, contextId INTEGER, "
            "streamId INTEGER, taskId INTEGER, modelId INTEGER",
    "COMPUTE_TASK_INFO": "name INTEGER, globalTaskId INTEGER, blockNum INTEGER, "
                         "mixBlockNum INTEGER, taskType INTEGER, opType INTEGER, "
                         "inputFormats INTEGER, inputDataTypes INTEGER, inputShapes INTEGER, "
                         "outputFormats INTEGER, outputDataTypes INTEGER, "
                         "outputShapes INTEGER, attrInfo INTEGER, opState INTEGER, "
                         "hf32Eligible INTEGER, gridDim INTEGER, blockDim INTEGER",
    "COMMUNICATION_OP": "opName INTEGER, startNs INTEGER, endNs INTEGER, connectionId INTEGER, "
                        "groupName INTEGER, opId INTEGER, relay INTEGER, "
                        "retry INTEGER, dataType INTEGER, algType INTEGER, count NUMERIC, "
                        "opType INTEGER, deviceId INTEGER, rankSize INTEGER",
    "PYTORCH_API": "startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, "
                   "name INTEGER, sequenceNumber INTEGER, fwdThreadId INTEGER, "
                   "inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER, "
                   "type INTEGER",
    "CANN_API": "startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER, "
                "connectionId INTEGER, name INTEGER",
    "RANK_DEVICE_MAP": "rankId INTEGER, deviceId INTEGER",
    # PYTORCH_API.connectionId is an id of this table, whose connectionId is the CANN_API's
    # and TASK's (msprof-analyze's free_analysis joins through it)
    "CONNECTION_IDS": "id INTEGER, connectionId INTEGER",
}
COMPUTE_TYPES = {"AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "AI_CPU"}


def ascend_db_rank(folder: Path, rank: int, ranks: int, events: int, seed: int) -> int:
    """Write one rank's torch-npu *database* session (``ExportType.Db``: only
    ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db``) with the events of
    `ascend_rank`'s timeline: per op a ``PYTORCH_API`` and a ``CANN_API`` row, a ``TASK`` (a
    ``COMPUTE_TASK_INFO`` row for compute types), an all-reduce in ``COMMUNICATION_OP`` now
    and then, the release markers as ``PYTORCH_API`` ranges. Returns its device tasks."""
    import sqlite3

    rr = random.Random(seed * 1000 + rank)
    stalls = _stalls(events, seed)
    session = folder / f"node{rank // 8}_{4242 + rank}_20261201120000{rank:03d}_ascend_pt"
    out_dir = session / "ASCEND_PROFILER_OUTPUT"
    out_dir.mkdir(parents=True, exist_ok=True)
    (session / f"profiler_info_{rank}.json").write_text(json.dumps(
        {"config": {"common_config": {"activities": ["CPU", "NPU"]}},
         "start_info": {"collectionTimeBegin": EPOCH_US}, "rank_id": rank}))
    path = out_dir / f"ascend_pytorch_profiler_{rank}.db"
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    for table, columns in DB_SCHEMA.items():
        con.execute(f"CREATE TABLE {table} ({columns})")
    ids: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in ids:
            ids[text] = len(ids) + 1
        return ids[text]

    types = [t for t, w in NPU_TASKS for _ in range(w)]
    na = sid("N/A")
    task, compute, python, cann, comm, links = [], [], [], [], [], []

    def flush() -> None:
        con.executemany("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)", task)
        con.executemany("INSERT INTO COMPUTE_TASK_INFO VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                        "?,?)", compute)
        con.executemany("INSERT INTO PYTORCH_API VALUES (?,?,?,?,?,?,?,?,?,?,?)", python)
        con.executemany("INSERT INTO CANN_API VALUES (?,?,?,?,?,?)", cann)
        con.executemany("INSERT INTO COMMUNICATION_OP VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        comm)
        con.executemany("INSERT INTO CONNECTION_IDS VALUES (?, ?)", links)
        for rows in (task, compute, python, cann, comm, links):
            rows.clear()

    def ns(us: float) -> int:
        return EPOCH_US * 1000 + round(us * 1000)

    n, t, s, tasks = 0, 0.0, 0, 0
    while n < events:
        if s < len(stalls) and t >= stalls[s][0]:
            a, b = stalls[s]
            m = a + rr.uniform(-20, 5)
            python.append((str(ns(m)), str(ns(m + b - a)), 1, None, sid(MARKER), -1, 0, None,
                           None, None, 50001))
            t, s, n = b + rr.uniform(0, 20), s + 1, n + 1
        op = rr.choice(OPS)
        python.append((str(ns(t - 10)), str(ns(t - 10 + rr.uniform(8, 40))), 1, n,
                       sid(op), n, 0, na, na, None, 50001))
        cann.append((ns(t - 6), ns(t - 6 + 4.25), 20000, 1, n, sid("aclnnMm")))
        links.append((n, n))
        ty = rr.choice(types)
        dur = rr.uniform(1.0, 14.0)
        tasks += 1
        task.append((ns(t), ns(t + dur), rank, n, tasks, 4242 + rank, sid(ty), 4294967295, 2,
                     n % 65536, 4294967295))
        if ty in COMPUTE_TYPES:
            compute.append((sid(f"{op[6:]}_Op_{n % 13}"), tasks, 8, 0, sid(ty), sid(op[6:]),
                            na, na, na, na, na, na, na, sid("static"), sid("NO"), na, na))
        n += 4
        if n % 300 < 4:
            comm.append((sid(f"hcom_allReduce__{n}"), ns(t + dur), ns(t + dur + 25.5), n,
                         sid("group1"), n, 0, 0, 4, 0, 1024, sid("hcom_allReduce_"), rank,
                         ranks))
            n += 1
        t += dur * rr.uniform(0.4, 1.05)
        if len(task) >= 50_000:
            flush()
    flush()
    con.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", [(i, v) for v, i in ids.items()])
    con.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?, ?)", (rank, rank))
    con.commit()
    con.close()
    return tasks


SHAPES = {  # the shapes `generate` writes
    "kineto": "the standard Kineto export (mixed host and device events)",
    "kineto-dense": "device-dense Kineto: every event a kernel, gaps 0-150 us",
    "kineto-host": "host-dense Kineto: nearly every event a host range",
    "ascend": "torch-npu text export (trace_view.json per *_ascend_pt session)",
    "ascend-db": "torch-npu database export (ascend_pytorch_profiler_<rank>.db only)",
}


def trace_files(d: Path, fmt: str) -> list[Path]:
    """The files a shape's traces were written to under `d`."""
    if fmt.startswith("kineto"):
        return sorted(d.glob("*.json"))
    if fmt == "ascend":
        return sorted(d.glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"))
    return sorted(d.glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"))


def generate(d: Path, ranks: int, events: int, seed: int, *, fmt: str = "kineto",
             string_ts: bool = False) -> int:
    """Write `ranks` traces of about `events` events each into `d` in shape `fmt` (`SHAPES`);
    return their bytes. Files already written with the same parameters (a kept folder) are
    reused."""
    if fmt not in SHAPES:
        raise ValueError(f"The value for fmt must be one of {list(SHAPES)}, but {fmt!r} was "
                         "passed.")
    d.mkdir(parents=True, exist_ok=True)
    stamp = d / "generated.params"  # not *.json: no trace
    params = {"ranks": ranks, "events": events, "seed": seed, "fmt": fmt,
              "string_ts": string_ts, "version": 3 if fmt == "ascend-db" else 2}
    if stamp.is_file() and json.loads(stamp.read_text()) == params:
        return sum(p.stat().st_size for p in trace_files(d, fmt))
    for r in range(ranks):
        if fmt == "kineto":
            kineto_rank(d / f"rank{r}.pt.trace.json", r, ranks, events, seed,
                        string_ts=string_ts)
        elif fmt == "kineto-dense":
            kineto_dense_rank(d / f"rank{r}.pt.trace.json", r, ranks, events, seed)
        elif fmt == "kineto-host":
            kineto_host_rank(d / f"rank{r}.pt.trace.json", r, ranks, events, seed)
        elif fmt == "ascend":
            ascend_rank(d, r, ranks, events, seed)
        else:
            ascend_db_rank(d, r, ranks, events, seed)
    stamp.write_text(json.dumps(params))
    return sum(p.stat().st_size for p in trace_files(d, fmt))
