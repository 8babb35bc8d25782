"""Write the torch-npu fixtures shaped like real output (deterministic; rerun after editing).

* ascend_real/: two ranks in directories named after a host called ``gpu-rank7-a`` (ranks come
  from ``profiler_info_<rank>.json``), ``trace_view.json`` with the lanes torch-npu writes:
  Python and CANN host ranges, ``Ascend Hardware`` tasks with ``args["Task Type"]`` (compute,
  copies, and EVENT/NOTIFY wait and record tasks overlapping the gaps between work), a
  ``Communication`` lane (operations and a plane task), and ``Overlap Analysis`` slices
  (Computing, Communication, Communication(Not Overlapped), Free) consistent with
  msprof-analyze's definition (compute + communication).
* ascend_real_db/: the same profile as torch-npu's ``ExportType.Db`` writes it:
  ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db`` only, with the tables and columns
  of torch-npu's ``TableColumnsManager`` and msprof's ``TASK`` table (host task types in
  ``TASK.taskType``, as msprof's ``TaskProcessor::GetTaskType`` stores them).
* ascend_real/'s rank 0 also has ``ASCEND_PROFILER_OUTPUT/memory_record.csv`` (torch-npu's
  header; timestamps end in a tab, as torch-npu writes them), and ascend_real_db/'s rank 0 the
  same records (but APP) in its ``MEMORY_RECORD`` table (ns, bytes).

Times: integer microseconds after EPOCH_US, so tests can check them on a 1-us grid.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCH_US = 1_764_500_000_000_000
HOST = "gpu-rank7-a"  # a host name that contains "rank7": never a rank

# device tasks: (name, Task Type as trace_view writes it, TASK.taskType as the DB stores it,
# start us, end us). As msprof writes them (ascend_hardware_assembler.cpp, task_processor.cpp):
# a compute task's text type is its GE task type, also COMPUTE_TASK_INFO.taskType, while
# TASK.taskType holds its host type (KERNEL_*); a task with a host type the runtime registers
# (EVENT_WAIT, the runtime's name for STREAM_WAIT_EVENT) shows it in both; one with an UNKNOWN
# host type shows its SQE type in both; a MEMCPY_ASYNC task shows its device (SQE) type in
# the text export. "FUTURE_SQE" stands for a type no list knows.
DEVICE = {
    0: [("MatMul_1", "AI_CORE", "KERNEL_AICORE", 100, 200),
        ("EVENT_WAIT_SQE", "EVENT_WAIT_SQE", "EVENT_WAIT_SQE", 200, 600),
        ("Add_2", "AI_VECTOR_CORE", "KERNEL_AIVEC", 600, 650),
        ("MEMCPY_ASYNC", "SDMA_SQE", "MEMCPY_ASYNC", 650, 700),
        ("EVENT_RECORD_SQE", "EVENT_RECORD_SQE", "EVENT_RECORD_SQE", 700, 701),
        ("MatMul_3", "MIX_AIC", "KERNEL_MIX_AIC", 800, 1000)],
    1: [("MatMul_1", "AI_CORE", "KERNEL_AICORE", 100, 150),
        ("NOTIFY_WAIT_SQE", "NOTIFY_WAIT_SQE", "NOTIFY_WAIT_SQE", 150, 500),
        ("MatMul_2", "AI_CORE", "KERNEL_AICORE", 500, 550),
        ("MEMCPY_ASYNC", "PCIE_DMA_SQE", "MEMCPY_ASYNC", 550, 580),
        ("EVENT_WAIT", "EVENT_WAIT", "EVENT_WAIT", 600, 940),
        ("Sort_4", "AI_CPU", "KERNEL_AICPU", 950, 1000),
        ("FUTURE_SQE", "FUTURE_SQE", "FUTURE_SQE", 960, 970)],
}
COMPUTE_DB_TYPES = {"KERNEL_AICORE", "KERNEL_AIVEC", "KERNEL_MIX_AIC", "KERNEL_AICPU"}
# Communication lane: (name, thread, start, end); plane tasks lie inside their operation
COMM = {0: [("hcom_allReduce__123_1", "Group 1 Communication", 300, 350),
            ("Notify_Wait", "Plane 0", 300, 310)],
        1: [("hcom_allReduce__123_1", "Group 1 Communication", 300, 360),
            ("Notify_Wait", "Plane 0", 300, 320)]}
# host ranges: (name, process, start, end)
HOST_RANGES = {
    0: [("residency.phase[denoise]", "Python", 50, 750),
        ("residency.release[normal]", "Python", 400, 700),
        ("aten::mm", "Python", 10, 60),
        ("AscendCL@aclnnMatmul", "CANN", 12, 14)],
    1: [("residency.phase[denoise]", "Python", 50, 750),
        ("aten::add", "Python", 210, 260),
        ("AscendCL@aclnnAdd", "CANN", 211, 213)],
}
# Overlap Analysis under msprof-analyze's definition (compute + communication busy)
OVERLAP = {
    0: [("Computing", 100, 200), ("Computing", 600, 650), ("Computing", 800, 1000),
        ("Communication", 300, 350), ("Communication(Not Overlapped)", 300, 350),
        ("Free", 200, 300), ("Free", 350, 600), ("Free", 650, 800)],
    1: [("Computing", 100, 150), ("Computing", 500, 550), ("Computing", 950, 1000),
        ("Communication", 300, 360), ("Communication(Not Overlapped)", 300, 360),
        ("Free", 150, 300), ("Free", 360, 500), ("Free", 550, 950)],
}
PIDS = {"Python": 101, "CANN": 102, "Ascend Hardware": 103, "Communication": 104,
        "Overlap Analysis": 105}


def us(offset: int) -> str:
    return f"{EPOCH_US + offset}.000"


def directory(root: Path, rank: int) -> Path:
    return root / f"{HOST}_{1001 + rank}_2025113001020300{4 + rank}_ascend_pt"


def trace_view(rank: int) -> list[dict]:
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": name}} for name, pid in PIDS.items()]
    threads = {"Stream 2": 2, "Group 1 Communication": 7, "Plane 0": 8}
    events += [{"ph": "M", "name": "thread_name", "pid": PIDS["Ascend Hardware"] if t == 2
                else PIDS["Communication"], "tid": t, "args": {"name": n}}
               for n, t in threads.items()]
    for name, task_type, _, start, end in DEVICE[rank]:
        events.append({"ph": "X", "name": name, "pid": PIDS["Ascend Hardware"], "tid": 2,
                       "ts": us(start), "dur": end - start,
                       "args": {"Model Id": 4294967295, "Task Type": task_type,
                                "Stream Id": 2, "Task Id": 7}})
    for name, thread, start, end in COMM[rank]:
        events.append({"ph": "X", "name": name, "pid": PIDS["Communication"],
                       "tid": threads[thread], "ts": us(start), "dur": end - start,
                       "args": {"connection_id": 12}})
    for name, process, start, end in HOST_RANGES[rank]:
        events.append({"ph": "X", "name": name, "pid": PIDS[process], "tid": 5,
                       "ts": us(start), "dur": end - start, "args": {"Sequence number": -1}})
    for name, start, end in OVERLAP[rank]:
        events.append({"ph": "X", "name": name, "pid": PIDS["Overlap Analysis"],
                       "tid": ["Computing", "Communication", "Communication(Not Overlapped)",
                               "Free"].index(name), "ts": us(start), "dur": end - start})
    events.append({"ph": "f", "id": "1", "name": "HostToDevice", "cat": "HostToDevice",
                   "pid": PIDS["Ascend Hardware"], "tid": 2, "ts": us(100), "bp": "e"})
    return events


def profiler_info(rank: int) -> str:
    return json.dumps({"config": {"common_config": {"activities": ["ProfilerActivity.CPU",
                                                                   "ProfilerActivity.NPU"]}},
                       "rank_id": rank, "torch_npu_version": "2.10.0"}) + "\n"


# memory_record.csv of rank 0 (profile_memory=True): (component, us, allocated MB, reserved MB);
# torch-npu (MemoryViewParser) also writes PTA+GE sums and APP rows (the process as the driver
# sees it, whose allocated column holds KB, unconverted)
MEMORY = [("PTA", 100, "512.000", "1024.000"), ("GE", 120, "4.000", "8.000"),
          ("PTA+GE", 120, "516.000", "1032.000"), ("APP", 130, "2097152", "2048.000"),
          ("PTA", 500, "512.500", "1024.000"), ("PTA", 690, "256.250", "256.250")]


def memory_record() -> str:
    lines = ["Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),"
             "Stream Ptr,Device Type"]
    lines += [f"{c},{us(t)}\t,{a},{r},{a},94571714520304,NPU:0" for c, t, a, r in MEMORY]
    return "\n".join(lines) + "\n"


def ascend_real() -> None:
    root = HERE / "ascend_real"
    shutil.rmtree(root, ignore_errors=True)
    for rank in DEVICE:
        d = directory(root, rank)
        (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        (d / f"profiler_info_{rank}.json").write_text(profiler_info(rank))
        (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(
            json.dumps(trace_view(rank), indent=1) + "\n")
        if rank == 0:
            (d / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv").write_text(memory_record())


SCHEMA = {  # torch-npu's own tables (_constant.py, TableColumnsManager) and msprof's
    # (analysis/csrc/application/database/msprof_db.cpp), columns in their order
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
    "COMMUNICATION_TASK_INFO": "name INTEGER, globalTaskId INTEGER, taskType INTEGER, "
                               "planeId INTEGER, groupName INTEGER, notifyId INTEGER, "
                               "rdmaType INTEGER, srcRank INTEGER, dstRank INTEGER, "
                               "transportType INTEGER, size INTEGER, dataType INTEGER, "
                               "linkType INTEGER, opId INTEGER, isMaster INTEGER, "
                               "bandwidth NUMERIC",
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
    "MEMORY_RECORD": "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, "
                     "totalReserved INTEGER, totalActive INTEGER, streamPtr INTEGER, "
                     "deviceId INTEGER",
}


def mib_bytes(text: str) -> int:
    whole, _, frac = text.partition(".")
    return int(whole) * 1024**2 + int(frac or 0) * 1024**2 // 10 ** len(frac or "")


def ns(offset_us: int) -> int:
    return (EPOCH_US + offset_us) * 1000


def write_db(path: Path, rank: int) -> None:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    for table, columns in SCHEMA.items():
        con.execute(f"CREATE TABLE {table} ({columns})")
    ids: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in ids:
            ids[text] = len(ids) + 1
            con.execute("INSERT INTO STRING_IDS VALUES (?, ?)", (ids[text], text))
        return ids[text]

    gid = 0
    for name, text_type, task_type, start, end in DEVICE[rank]:
        gid += 1
        con.execute("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (ns(start), ns(end), rank, gid, gid, 1001 + rank, sid(task_type),
                     4294967295, 2, gid, 4294967295))
        if task_type in COMPUTE_DB_TYPES:  # its GE task type is what the text export shows
            na = sid("N/A")
            con.execute("INSERT INTO COMPUTE_TASK_INFO VALUES "
                        "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (sid(name), gid, 8, 0, sid(text_type), sid(name.split("_")[0]),
                         na, na, na, na, na, na, na, sid("static"), sid("NO"), na, na))
    for name, thread, start, end in COMM[rank]:
        if thread.startswith("Group"):
            con.execute("INSERT INTO COMMUNICATION_OP VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (sid(name), ns(start), ns(end), 12, sid("group1"), 1, 0, 0, 4, 0,
                         1024, sid("hcom_allReduce_"), rank, 2))
        else:  # a plane task: a TASK row described by COMMUNICATION_TASK_INFO
            gid += 1
            con.execute("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (ns(start), ns(end), rank, 12, gid, 1001 + rank, sid("NOTIFY_WAIT"),
                         4294967295, 8, gid, 4294967295))
            con.execute("INSERT INTO COMMUNICATION_TASK_INFO VALUES "
                        "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (sid(name), gid, sid("Notify_Wait"), 0, sid("group1"), 1, 0, rank,
                         1 - rank, 0, 0, 4, 1, 1, 1, 0.0))
    for name, process, start, end in HOST_RANGES[rank]:
        if process == "Python":
            con.execute("INSERT INTO PYTORCH_API VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (str(ns(start)), str(ns(end)), 5, None, sid(name), -1, 5, None,
                         None, None, 50001))
        else:
            con.execute("INSERT INTO CANN_API VALUES (?,?,?,?,?,?)",
                        (ns(start), ns(end), 20000, 5, 12, sid(name)))
    con.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?, ?)", (rank, rank))
    if rank == 0:  # rank 0's memory_record.csv as the DB holds it: ns, bytes; no APP rows
        for component, t, alloc, res in MEMORY:
            if component != "APP":
                con.execute("INSERT INTO MEMORY_RECORD VALUES (?,?,?,?,?,?,?)",
                            (sid(component), ns(t), mib_bytes(alloc), mib_bytes(res),
                             mib_bytes(alloc), 94571714520304, rank))
    con.commit()
    con.close()


def ascend_real_db() -> None:
    root = HERE / "ascend_real_db"
    shutil.rmtree(root, ignore_errors=True)
    for rank in DEVICE:
        d = directory(root, rank)
        (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        (d / f"profiler_info_{rank}.json").write_text(profiler_info(rank))
        write_db(d / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db", rank)


if __name__ == "__main__":
    ascend_real()
    ascend_real_db()
