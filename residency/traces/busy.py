"""Busy definitions: which device tasks count as work when measuring idle time.

A device task's *type* (`RankTimeline.device_types`) falls in one class:

* ``compute``: the Task Types of compute tasks in the text export, AI_CORE, AI_VECTOR_CORE,
  AI_CPU, MIX_AIC, MIX_AIV, FFTS_PLUS (GE's task types) and the SQE types AI_CORE, AI_CPU,
  AIV_SQE (FFTS+ subtasks: AIC, AIV); the runtime's host task types KERNEL_AICORE,
  KERNEL_AICPU, KERNEL_AIVEC, KERNEL_MIX_AIC, KERNEL_MIX_AIV, KERNEL_FUSION, KERNEL_SIMT;
  Kineto ``kernel``.
* ``memcpy``: SDMA_SQE, PCIE_DMA_SQE, MEMCPY_ASYNC, REDUCE_ASYNC_V2 (an SDMA reduce);
  Kineto ``gpu_memcpy`` / ``memcpy``.
* ``memset``: Kineto ``gpu_memset`` / ``memset``.
* ``communication``: the ranges of the Communication (formerly HCCL) lane, operations and
  plane tasks (reported as `residency.traces.load.COMMUNICATION_LANE`); GE's COMMUNICATION and
  HCCL_AI_CPU; ROCCE_SQE, RDMA_SEND, RDMA_DB_SEND, CCU_LAUNCH.
* ``sync``: a stream waiting or signalling, not working: the SQE types EVENT_RECORD_SQE,
  EVENT_WAIT_SQE, NOTIFY_RECORD_SQE, NOTIFY_WAIT_SQE, PLACE_HOLDER_SQE, WRITE_VALUE_SQE; the
  host task types EVENT_RECORD, EVENT_WAIT (the runtime's name for STREAM_WAIT_EVENT, kept
  too), EVENT_RESET, REMOTE_EVENT_WAIT, IPC_EVENT_RECORD, IPC_EVENT_WAIT, CAPTURE_RECORD,
  CAPTURE_WAIT, DAVID_EVENT_RECORD, DAVID_EVENT_WAIT, DAVID_EVENT_RESET, NOTIFY_RECORD,
  NOTIFY_WAIT, MEM_WAIT_VALUE, MEM_WRITE_VALUE, WriteValueTask, BARRIER, NOP,
  PROFILING_ENABLE, PROFILING_DISABLE, PROFILER_TRACE, PROFILER_TRACE_EX; the Communication
  plane's Notify Wait / Notify Record; MsTx markers.
* ``other``: engines doing work msprof-analyze does not count as computing: the remaining SQE
  types (VQ6_SQE, TOF_SQE, VPC_SQE, JPEGE_SQE, JPEGD_SQE, DSA_SQE, HOST_CPU_SQE, CDQM_SQE,
  C_CORE_SQE) and GE's WRITE_BACK, DVPP, FUSION.
* ``unknown``: anything else, an empty type included (msprof's fallback ``Other``, an
  ``INVALID`` or ``MAX_SQE`` type, a raw number); counted busy and reported with counts.

Where the lists come from (read in the projects' sources; repository and path):

* What the text export's ``Task Type`` holds: msprof (Ascend/msprof)
  ``analysis/csrc/application/timeline/ascend_hardware_assembler.cpp``
  (``AscendHardwareAssembler::GetTaskType``: the task's GE task type when it has one, else
  the TASK type; MEMCPY_ASYNC tasks carry the device SQE type) and
  ``analysis/csrc/domain/data_process/ai_task/task_processor.cpp``
  (``TaskProcessor::GetTaskType``: the host task type, the device type for FFTS_PLUS, the SQE
  table's name for UNKNOWN host types, else ``Other``); the same type is ``TASK.taskType`` of
  the database export, and the GE type ``COMPUTE_TASK_INFO.taskType``
  (``analysis/csrc/application/database/db_assembler.cpp``, ``SaveComputeTaskInfo``).
* SQE types: ``analysis/csrc/viewer/database/finals/unified_db_constant.h``
  (``STARS_SQE_TYPE_TABLE``, ``HW_SQE_TYPE_TABLE``). GE task types:
  ``analysis/csrc/domain/services/persistence/host/number_mapping.cpp`` (``geTaskTypeMap``).
  KERNEL_SIMT: ``analysis/csrc/infrastructure/utils/common_constant.h``.
* Host task types: the CANN runtime (hicann/runtime)
  ``src/runtime/feature/src/common/profiling_agent.cc`` (``RegisterProfTypeInfo``: e.g.
  ``TS_TASK_TYPE_STREAM_WAIT_EVENT`` is registered as ``EVENT_WAIT``).
* msprof-analyze (Ascend/mstt, ``profiler/msprof_analyze``):
  ``compare_tools/compare_backend/compare_bean/origin_data_bean/trace_event_bean.py``
  (compute = AI_CORE, MIX_AIC, MIX_AIV, AI_CPU, AI_VECTOR_CORE, FFTS_PLUS; SDMA = SDMA_SQE,
  PCIE_DMA_SQE) and ``prof_exports/cluster_time_summary_export.py`` (computing = ``TASK``
  joined with ``COMPUTE_TASK_INFO``, communication = ``COMMUNICATION_OP``, memory =
  ``MEMCPY_ASYNC`` tasks).

Definitions (`DEFINITIONS`): ``ascend`` (default for torch-npu) counts compute, memory copies,
communication, other and unknown; ``msprof`` counts what msprof-analyze's free-time analyses
count, compute and communication (plus unknown, reported); ``kineto`` (default for Kineto)
counts kernels, memcpy and memset, and MTIA's ccp events (`residency.traces.categories`; the
loader never keeps ``cuda_sync``); ``all`` counts every device task. Each applies to the
formats `APPLIES_TO` names and is refused for the others (`resolve`): ``ascend`` and ``msprof``
read torch-npu Task Types, which Kineto traces lack; ``kineto`` reads Kineto categories.
Unknown types are reported with counts, and warned about unless the trace's own Overlap
Analysis counts the time only they cover as Computing/Communication (torch-npu's ``Other``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from residency.errors import BadInput
from residency.traces import intervals as iv
from residency.traces.load import ASCEND_COMM_PROCESSES, COMMUNICATION_LANE

if TYPE_CHECKING:
    from residency.traces.load import RankTimeline

__all__ = ["APPLIES_TO", "CLASSES", "DEFINITIONS", "OVERLAP_BUSY", "BusyDefinition",
           "BusyTasks", "OptionError", "busy_tasks", "class_rows", "classify", "resolve"]

_TYPES = {  # sources: module doc
    "compute": ("AI_CORE", "AI_CPU", "AIV_SQE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV",
                "FFTS_PLUS", "AIC", "AIV", "KERNEL_AICORE", "KERNEL_AICPU", "KERNEL_AIVEC",
                "KERNEL_MIX_AIC", "KERNEL_MIX_AIV", "KERNEL_FUSION", "KERNEL_SIMT", "kernel"),
    "memcpy": ("SDMA_SQE", "PCIE_DMA_SQE", "MEMCPY_ASYNC", "REDUCE_ASYNC_V2", "gpu_memcpy",
               "memcpy"),
    "memset": ("gpu_memset", "memset"),
    "communication": (COMMUNICATION_LANE, "COMMUNICATION", "HCCL_AI_CPU", "ROCCE_SQE",
                      "RDMA_SEND", "RDMA_DB_SEND", "CCU_LAUNCH"),
    "sync": ("EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "NOTIFY_RECORD_SQE", "NOTIFY_WAIT_SQE",
             "PLACE_HOLDER_SQE", "WRITE_VALUE_SQE", "EVENT_RECORD", "EVENT_WAIT",
             "STREAM_WAIT_EVENT", "EVENT_RESET", "REMOTE_EVENT_WAIT", "IPC_EVENT_RECORD",
             "IPC_EVENT_WAIT", "CAPTURE_RECORD", "CAPTURE_WAIT", "DAVID_EVENT_RECORD",
             "DAVID_EVENT_WAIT", "DAVID_EVENT_RESET", "NOTIFY_RECORD", "NOTIFY_WAIT",
             "MEM_WAIT_VALUE", "MEM_WRITE_VALUE", "WriteValueTask", "BARRIER", "NOP",
             "Notify Wait", "Notify Record", "PROFILING_ENABLE", "PROFILING_DISABLE",
             "PROFILER_TRACE", "PROFILER_TRACE_EX", "MsTx"),
    "other": ("VQ6_SQE", "TOF_SQE", "VPC_SQE", "JPEGE_SQE", "JPEGD_SQE", "DSA_SQE",
              "HOST_CPU_SQE", "CDQM_SQE", "C_CORE_SQE", "WRITE_BACK", "DVPP", "FUSION"),
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
                             "kernels, memcpy and memset (MTIA: its ccp events); "
                             "synchronisation is not"),
    "all": BusyDefinition("all", frozenset(CLASSES), "every device task"),
}


class OptionError(BadInput):
    """Bad input that one option (or API parameter) gave: the message names it as `render`
    is told (``--window-marker`` on the command line, ``window_marker`` in the API)."""

    def __init__(self, option: str, template: str, *values: object) -> None:
        # `template` is ours ("{option}" where the option is named, "{0}".. for `values`);
        # text from the input only ever arrives in `values`, never parsed as a template
        self.option, self.template, self.values = option, template, values
        super().__init__(self.render(f"`{option}`"))

    def render(self, name: str) -> str:
        """The message naming the option `name`."""
        return self.template.format(*self.values, option=name)


# the formats each definition applies to, and why it is refused for the others
APPLIES_TO = {"ascend": frozenset({"ascend"}), "msprof": frozenset({"ascend"}),
              "kineto": frozenset({"kineto"}), "all": frozenset({"ascend", "kineto"})}
_REFUSED = {
    "kineto": "{name} counts torch-npu Task Types (compute, copies, communication), which "
              "Kineto traces do not have: their device tasks are kernels, memcpy and memset "
              "by category; use kineto or all",
    "ascend": "{name} counts Kineto categories (kernels, memcpy, memset); torch-npu traces "
              "have Task Types instead: use ascend, msprof or all",
}


def resolve(name: str | None, fmt: str) -> BusyDefinition:
    """The definition called `name`; ``None`` or ``"default"`` is the format's default
    (``ascend`` for torch-npu traces, ``kineto`` for Kineto).

    Raises:
        OptionError: an unknown name, or a definition that does not apply to traces of
            format `fmt` (`APPLIES_TO`), with the reason.
    """
    if name is None or name == "default":
        name = "ascend" if fmt == "ascend" else "kineto"
    if name not in DEFINITIONS:
        raise OptionError("busy", "The value for {option} must be one of {0}, but {1!r} was "
                          "passed.", ["default", *DEFINITIONS], name)
    if fmt in _REFUSED and fmt not in APPLIES_TO[name]:
        label = "Kineto" if fmt == "kineto" else "torch-npu"
        raise OptionError("busy", "{option} {0} does not apply to {1} traces: "
                          + _REFUSED[fmt].replace("{name}", "{0}"), name, label)
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
    confirmed: frozenset[str] = frozenset()  # unknown types the trace's own Overlap Analysis
    # counts busy (every task of the type lies inside its Computing/Communication slices)


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
    confirmed = frozenset()
    if unknown and len(t.overlap):
        codes = np.asarray(types, object)
        known = t.device[mask & ~np.isin(codes, list(unknown))]
        if comm.any() and "communication" in definition.classes:
            known = np.concatenate((known, t.ranges[comm]))
        known = iv.merge(known)
        confirmed = frozenset(ty for ty in unknown if _inside_overlap_busy(
            t, iv.complement(known, iv.merge(t.device[codes == ty]))))
    return BusyTasks(rows, excluded, unknown, confirmed)


# the Overlap Analysis slices that say the device worked (msprof's Computing and
# Communication; "Free" is the rest)
OVERLAP_BUSY = frozenset({"Computing", "Communication", "Communication(Not Overlapped)"})


def _inside_overlap_busy(t: RankTimeline, rows: np.ndarray) -> bool:
    """Whether `rows` (the time of a type's tasks that no known busy task covers) is not
    empty and lies inside the union of the trace's own Overlap Analysis Computing /
    Communication slices: the trace counts that time busy, as residency does (False without
    that lane, or when the type's tasks only overlap known ones: nothing to tell)."""
    if not len(t.overlap) or not len(rows):
        return False
    slices = t.overlap[np.isin(t.overlap_names, list(OVERLAP_BUSY))]
    if not len(slices):
        return False
    slices = slices[np.argsort(slices[:, 0], kind="stable")]
    ends = np.maximum.accumulate(slices[:, 1])
    starts_new = np.r_[True, slices[1:, 0] > ends[:-1]]
    lo = slices[starts_new, 0]
    hi = np.maximum.reduceat(slices[:, 1], np.flatnonzero(starts_new))
    i = np.searchsorted(lo, rows[:, 0], side="right") - 1
    ok = i >= 0
    ok[ok] = rows[ok, 1] <= hi[i[ok]]
    return bool(ok.all())


def class_rows(t: RankTimeline, classes: frozenset[str]) -> np.ndarray:
    """The rows of `t`'s tasks whose class is in `classes` (torch-npu; with
    ``communication``, the Communication lane's ranges too), ``(k, 2)`` as recorded."""
    return busy_tasks(t, BusyDefinition("", classes, ""), "ascend").rows
