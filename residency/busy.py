"""Busy definitions: which device tasks count as work when measuring idle time.

A device task's *type* (`RankTimeline.device_types`) falls in one class:

* ``compute``: torch-npu device (SQE) types AI_CORE, AI_CPU, AIV_SQE, AI_VECTOR_CORE, MIX_AIC,
  MIX_AIV, FFTS_PLUS (and the FFTS+ subtask types AIC, AIV); the host task types the SQLite
  export stores for them, KERNEL_AICORE, KERNEL_AICPU, KERNEL_AIVEC, KERNEL_MIX_AIC,
  KERNEL_MIX_AIV; Kineto ``kernel``.
* ``memcpy``: SDMA_SQE, PCIE_DMA_SQE, MEMCPY_ASYNC; Kineto ``gpu_memcpy`` / ``memcpy``.
* ``memset``: Kineto ``gpu_memset`` / ``memset``.
* ``communication``: the ranges of the Communication (formerly HCCL) lane, operations and
  plane tasks (reported as `residency.traces.COMMUNICATION_LANE`), and ROCCE_SQE (RDMA).
* ``sync``: EVENT_RECORD_SQE, EVENT_WAIT_SQE, NOTIFY_RECORD_SQE, NOTIFY_WAIT_SQE,
  PLACE_HOLDER_SQE, WRITE_VALUE_SQE; host types EVENT_RECORD, STREAM_WAIT_EVENT, NOTIFY_RECORD,
  NOTIFY_WAIT, Notify Wait, Notify Record, PROFILING_ENABLE, PROFILING_DISABLE, MsTx: a stream
  waiting or signalling, not working.
* ``other``: the remaining SQE types of the table (VQ6_SQE, TOF_SQE, VPC_SQE, JPEGE_SQE,
  JPEGD_SQE, DSA_SQE, HOST_CPU_SQE, CDQM_SQE, C_CORE_SQE): engines doing work that
  msprof-analyze does not count as computing.
* ``unknown``: anything else, an empty type included; counted busy and reported with counts.

Where the lists come from: the SQE type table of msprof's unified database
(``analysis/csrc/viewer/database/finals/unified_db_constant.h``, ``STARS_SQE_TYPE_TABLE`` and
``HW_SQE_TYPE_TABLE``; the FFTS+ map in ``analysis/csrc/domain/services/...``), msprof-analyze's
compare tool (``compare_backend/compare_bean/origin_data_bean/trace_event_bean.py``:
``is_compute_event`` = AI_CORE, MIX_AIC, MIX_AIV, AI_CPU, AI_VECTOR_CORE, FFTS_PLUS;
``is_sdma_event`` = SDMA_SQE, PCIE_DMA_SQE), msprof's host task types
(``Constant.COMP_TASK_TYPE`` = KERNEL_AICORE, KERNEL_AIVEC, FFTS_PLUS, KERNEL_MIX_AIC,
KERNEL_MIX_AIV; PROFILING_ENABLE/DISABLE; ``RtsTaskTypeMap`` adds KERNEL_AICPU), the runtime's
task enum (``TS_TASK_TYPE_EVENT_RECORD``, ``_STREAM_WAIT_EVENT``, ``_NOTIFY_WAIT``,
``_NOTIFY_RECORD``) and msprof-analyze's cluster_time_summary recipe (MEMCPY_ASYNC as memory).

Definitions (`DEFINITIONS`): ``ascend`` (default for torch-npu) counts compute, memory copies,
communication, other and unknown; ``msprof`` counts what msprof-analyze's free-time analyses
count, compute and communication (plus unknown, reported); ``kineto`` (default for Kineto)
counts kernels, memcpy and memset (the loader never keeps ``cuda_sync``); ``all`` counts every
device task.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from residency.traces import ASCEND_COMM_PROCESSES, COMMUNICATION_LANE

if TYPE_CHECKING:
    from residency.traces import RankTimeline

__all__ = ["CLASSES", "DEFINITIONS", "BusyDefinition", "BusyTasks", "busy_tasks",
           "classify", "resolve"]

_TYPES = {
    "compute": ("AI_CORE", "AI_CPU", "AIV_SQE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV",
                "FFTS_PLUS", "AIC", "AIV", "KERNEL_AICORE", "KERNEL_AICPU", "KERNEL_AIVEC",
                "KERNEL_MIX_AIC", "KERNEL_MIX_AIV", "kernel"),
    "memcpy": ("SDMA_SQE", "PCIE_DMA_SQE", "MEMCPY_ASYNC", "gpu_memcpy", "memcpy"),
    "memset": ("gpu_memset", "memset"),
    "communication": (COMMUNICATION_LANE, "ROCCE_SQE"),
    "sync": ("EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "NOTIFY_RECORD_SQE", "NOTIFY_WAIT_SQE",
             "PLACE_HOLDER_SQE", "WRITE_VALUE_SQE", "EVENT_RECORD", "STREAM_WAIT_EVENT",
             "NOTIFY_RECORD", "NOTIFY_WAIT", "Notify Wait", "Notify Record",
             "PROFILING_ENABLE", "PROFILING_DISABLE", "MsTx"),
    "other": ("VQ6_SQE", "TOF_SQE", "VPC_SQE", "JPEGE_SQE", "JPEGD_SQE", "DSA_SQE",
              "HOST_CPU_SQE", "CDQM_SQE", "C_CORE_SQE"),
}
_CLASS_OF = {t.lower(): c for c, types in _TYPES.items() for t in types}
CLASSES = (*_TYPES, "unknown")


@dataclass(frozen=True)
class BusyDefinition:
    """A named set of task classes that count as busy."""

    name: str
    classes: frozenset[str]
    description: str

    def __str__(self) -> str:
        return f"{self.name} ({self.description})"


DEFINITIONS = {
    "ascend": BusyDefinition("ascend", frozenset({"compute", "memcpy", "communication", "other",
                                                  "unknown"}),
                             "compute, memory copies and communication; waits/records are not"),
    "msprof": BusyDefinition("msprof", frozenset({"compute", "communication", "unknown"}),
                             "msprof-analyze's: compute and communication"),
    "kineto": BusyDefinition("kineto", frozenset({"compute", "memcpy", "memset", "unknown"}),
                             "kernels, memcpy and memset; synchronisation is not"),
    "all": BusyDefinition("all", frozenset(CLASSES), "every device task"),
}


def resolve(name: str | None, fmt: str) -> BusyDefinition:
    """The definition called `name`; ``None`` or ``"default"`` is the format's default
    (``ascend`` for torch-npu traces, ``kineto`` for Kineto).

    Raises:
        ValueError: an unknown name.
    """
    if name is None or name == "default":
        name = "ascend" if fmt == "ascend" else "kineto"
    if name not in DEFINITIONS:
        raise ValueError(f"The value for `busy` must be one of {['default', *DEFINITIONS]}, "
                         f"but {name!r} was passed.")
    return DEFINITIONS[name]


def classify(task_type: str) -> str:
    """The class of one task type (case-insensitive), ``unknown`` when not listed."""
    return _CLASS_OF.get(task_type.lower(), "unknown")


@dataclass(frozen=True)
class BusyTasks:
    """A rank's busy work under one definition: `rows`, ``(k, 2)`` int64 ns as recorded (the
    device tasks that count, then the Communication lane's ranges when communication counts);
    `excluded`: counts of the tasks left out, by type (`COMMUNICATION_LANE` for that lane);
    `unknown`: counts of counted tasks of unlisted types."""

    rows: np.ndarray
    excluded: dict[str, int]
    unknown: dict[str, int]


def busy_tasks(t: RankTimeline, definition: BusyDefinition, fmt: str = "ascend") -> BusyTasks:
    """Apply `definition` to the device tasks of `t` (and its Communication lane). Kineto
    timelines keep only kernels, memcpy and memset (never ``cuda_sync``), with no type: every
    one of their tasks counts, under every definition."""
    if fmt == "kineto":
        return BusyTasks(t.device, {}, {})
    types = t.device_types.tolist()
    counts = Counter(types)
    klass = {ty: classify(ty) for ty in counts}
    keep = {ty: k in definition.classes for ty, k in klass.items()}
    mask = np.fromiter(map(keep.__getitem__, types), bool, len(types))
    excluded = {ty: n for ty, n in sorted(counts.items()) if not keep[ty]}
    unknown = {ty: n for ty, n in sorted(counts.items()) if klass[ty] == "unknown"}
    rows = t.device[mask]
    comm = t.lane_mask(ASCEND_COMM_PROCESSES)
    if comm.any():
        if "communication" in definition.classes:
            rows = np.concatenate((rows, t.ranges[comm]))
        else:
            excluded[COMMUNICATION_LANE] = int(comm.sum())
    return BusyTasks(rows, excluded, unknown)
