"""An emulated Ascend NPU: a host-backed device registered as PyTorch's `npu` backend.

`install_emulated_npu()` renames PyTorch's PrivateUse1 backend to `npu` and registers an
`EmulatedNPU` device module, so that -- as on Ascend with torch-npu up to the 2.12 line --
`torch.accelerator.memory_allocated(npu)` raises PyTorch's own "Allocator for npu is not a
DeviceAllocator" while `torch.get_device_module(npu)` answers from a real allocator.

Each emulated device has

* a caching allocator over real host buffers (`CachingHostAllocator`): blocks are rounded like
  PyTorch's CUDA caching allocator, freed blocks stay reserved and are reused, `empty_cache`
  returns them to the operating system, and the device capacity is enforced;
* streams (`Stream`): one worker thread each, running submitted device tasks in submission
  order while the host goes on; by default a task's torch operators are not computed: the
  worker waits out a modelled time (FLOPs and bytes over the `DeviceModel`'s throughput and
  bandwidth) without holding a core; `DeviceModel(compute="real")` computes them as real torch
  CPU ops; `Event`s mark points on a stream;
* a tracer exporting device tasks and host ranges (`residency.markers.span`) as Kineto JSON.

The rename is process-global and irreversible: install only in processes made for it.
Everything except `install_emulated_npu` works without the rename (`EmulatedNPU(...)` builds a
module that is simply not registered), which is how the tests exercise it in-process. Device
kinds, their resolution and labels live in `residency.devices`; this package is only the
emulator.
"""

from __future__ import annotations

import importlib.util
import sys
import threading

import torch

from residency.emulated.allocator import (
    LARGE_ROUND_BYTES,
    MIN_BLOCK_BYTES,
    OVERSIZE_SLACK_BYTES,
    SMALL_SIZE_BYTES,
    Block,
    CachingHostAllocator,
    check_positive_int,
    round_size,
)
from residency.emulated.device import (
    BACKEND_NAME,
    DEFAULT_CAPACITY_BYTES,
    DEVICE_NAME,
    DeviceTensor,
    EmulatedNPU,
)
from residency.emulated.model import (
    ACCELERATOR_PATCHES,
    COMPUTE_MODES,
    ENV_VAR,
    Cost,
    DeviceModel,
    ShapeOnlyMode,
    modelled_cost,
)
from residency.emulated.patches import VLLM_ASCEND_REDIRECTED, apply_accelerator_patch
from residency.emulated.streams import TASK_CATEGORIES, DeviceTaskError, Event, Stream, Task
from residency.emulated.trace import DEVICE_PID_BASE, HOST_RANGE_CATEGORY, TraceRecord

_INSTALL_LOCK = threading.Lock()
_INSTALLED: EmulatedNPU | None = None


def _torch_npu_present() -> bool:
    return "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None


def install_emulated_npu(devices: int = 1,
                         capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
                         model: DeviceModel | None = None) -> EmulatedNPU:
    """Register the emulated NPU as PyTorch's `npu` backend in this process; returns its module.

    `model` (default: the one in the environment variable `ENV_VAR`, else `DeviceModel()`)
    says how device tasks take time and which accelerator patch to apply after registering.
    Irreversible. Calling again with the same arguments returns the same module; different
    arguments raise ValueError. RuntimeError if torch-npu is present or PrivateUse1 is taken.
    """
    global _INSTALLED
    check_positive_int("devices", devices)
    check_positive_int("capacity_bytes", capacity_bytes)
    if model is None:
        model = DeviceModel.from_env()
    with _INSTALL_LOCK:
        if _INSTALLED is not None:
            installed = (_INSTALLED.device_count(), _INSTALLED.capacity_bytes)
            if installed != (devices, capacity_bytes) or _INSTALLED.model != model:
                raise ValueError(
                    f"the emulated NPU is already installed in this process with devices="
                    f"{installed[0]}, capacity_bytes={installed[1]}, model={_INSTALLED.model};"
                    f" devices={devices}, capacity_bytes={capacity_bytes}, model={model} was "
                    "passed (the registration cannot be undone: start a new process)")
            return _INSTALLED
        backend = torch._C._get_privateuse1_backend_name()
        if backend not in ("privateuseone", BACKEND_NAME):
            raise RuntimeError(f"PyTorch's PrivateUse1 backend is already registered as "
                               f"{backend!r}; the emulated NPU needs it as 'npu'")
        if _torch_npu_present():
            raise RuntimeError("torch_npu is installed in this environment: use the real NPU "
                               "(device kind 'npu') instead of the emulated one")
        existing = getattr(torch, BACKEND_NAME, None)
        if existing is not None:
            raise RuntimeError(f"a device module is already registered as torch.npu: "
                               f"{existing!r}")
        module = EmulatedNPU(devices, capacity_bytes, model=model)
        if backend != BACKEND_NAME:
            torch.utils.rename_privateuse1_backend(BACKEND_NAME)
        torch._register_device_module(BACKEND_NAME, module)
        apply_accelerator_patch(module, model.accelerator_patch)
        _INSTALLED = module
        return module


__all__ = [
    "ACCELERATOR_PATCHES", "COMPUTE_MODES", "ENV_VAR", "VLLM_ASCEND_REDIRECTED", "Cost",
    "DeviceModel", "ShapeOnlyMode", "apply_accelerator_patch", "modelled_cost",
    "BACKEND_NAME", "DEFAULT_CAPACITY_BYTES", "DEVICE_NAME", "DEVICE_PID_BASE",
    "HOST_RANGE_CATEGORY", "LARGE_ROUND_BYTES", "MIN_BLOCK_BYTES",
    "OVERSIZE_SLACK_BYTES", "SMALL_SIZE_BYTES", "TASK_CATEGORIES", "Block",
    "CachingHostAllocator", "DeviceTaskError", "DeviceTensor", "EmulatedNPU", "Event", "Stream",
    "Task", "TraceRecord", "install_emulated_npu", "round_size",
]
