"""Which Kineto event categories are device tasks and which are host ranges, per accelerator.

Read in the profilers' own sources (repository and path):

* Kineto (pytorch/kineto) ``libkineto/include/ActivityType.h`` (``_activityTypeNames``): the
  category written for each activity type. On-device types: ``CONCURRENT_KERNEL`` ->
  ``kernel``, ``GPU_MEMCPY`` -> ``gpu_memcpy``, ``GPU_MEMSET`` -> ``gpu_memset``,
  ``MTIA_CCP_EVENTS`` -> ``mtia_ccp_events`` ("MTIA ondevice CCP events"). Host-side
  types: ``cpu_op``, ``user_annotation``, ``python_function``, the runtimes and drivers
  (``cuda_runtime``, ``mtia_runtime``, ``xpu_runtime``, ``privateuse1_runtime``, ...),
  ``hpu_op`` ("HPU host side runtime event"); synchronisation: ``cuda_sync``, ``xpu_sync``,
  ``cuda_event``; ``gpu_user_annotation`` is a host range drawn on the device lane.
* Which accelerator writes which (PyTorch ``torch/csrc/autograd/profiler_kineto.cpp``,
  ``kCudaTypes``, ``kXpuTypes``, ``kMtiaTypes``, ``hpuTypes``, ``kPrivateUse1Types``): CUDA and
  ROCm (roctracer/rocprofiler in Kineto write the same categories), XPU and PrivateUse1
  backends record ``kernel``, ``gpu_memcpy``, ``gpu_memset``; MTIA records
  ``mtia_ccp_events`` (newer Kineto aliases it to ``CONCURRENT_KERNEL``: ``kernel``); HPU
  records only ``hpu_op``, a host-side event: Kineto documents no HPU device-task category,
  so an HPU trace has no device task this module recognises.
* HolisticTraceAnalysis (facebookresearch/HolisticTraceAnalysis) ``hta/common/types.py``
  (``KERNEL_CATEGORY_PATTERN``: ``kernel``, ``gpu_mem*``, ``mtia_ccp_events``) and
  ``hta/analyzers/breakdown_analysis.py`` (``kernel``, ``Kernel``, ``gpu_memset``,
  ``Memset``, ``gpu_memcpy``, ``Memcpy``, ``mtia_ccp_events``; ``cuda_sync`` filtered out).
  Legacy traces (PyTorch before 1.9) write ``Kernel``, ``Memcpy``, ``Memset``; categories
  are compared case-insensitively.
"""

from __future__ import annotations

__all__ = ["DEVICE_CATEGORIES", "HOST_CATEGORIES", "KINETO_BUSY_CATEGORIES"]

# category (lower case) -> the busy class residency.traces.busy gives it
KINETO_BUSY_CATEGORIES = {
    "kernel": "compute", "mtia_ccp_events": "compute",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
}
DEVICE_CATEGORIES = frozenset(KINETO_BUSY_CATEGORIES)
HOST_CATEGORIES = frozenset({"user_annotation", "cpu_op", "python_function", "operator"})
