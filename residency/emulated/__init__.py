"""An emulated Ascend NPU: a host-backed device registered as PyTorch's `npu` backend.

`install_emulated_npu()` renames PyTorch's PrivateUse1 backend to `npu` and registers an
`EmulatedNPU` device module, so that -- as on Ascend with torch-npu up to the 2.12 line --
`torch.accelerator.memory_allocated(npu)` raises PyTorch's own "Allocator for npu is not a
DeviceAllocator" while `torch.get_device_module(npu)` answers from a real allocator.

Each emulated device has

* a caching allocator over real host buffers (`CachingHostAllocator`): blocks are rounded like
  PyTorch's CUDA caching allocator, freed blocks stay reserved and are reused, `empty_cache`
  returns them to the operating system, and the device capacity is enforced;
* streams (`Stream`): one worker thread each, running submitted device tasks (real torch CPU
  ops) in submission order while the host goes on; `Event`s mark points on a stream;
* a tracer exporting device tasks and host ranges (`residency.markers.span`) as Kineto JSON.

The rename is process-global and irreversible: install only in processes made for it.
Everything except `install_emulated_npu` works without the rename (`EmulatedNPU(...)` builds a
module that is simply not registered), which is how the tests exercise it in-process.
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
from residency.emulated.streams import TASK_CATEGORIES, DeviceTaskError, Event, Stream, Task
from residency.emulated.trace import DEVICE_PID_BASE, HOST_RANGE_CATEGORY, TraceRecord

DEVICE_KINDS = ("npu", "cuda", "emulated-npu")
DEVICE_SPECS = ("auto", *DEVICE_KINDS)

_INSTALL_LOCK = threading.Lock()
_INSTALLED: EmulatedNPU | None = None


def _torch_npu_present() -> bool:
    return "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None


def install_emulated_npu(devices: int = 1,
                         capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> EmulatedNPU:
    """Register the emulated NPU as PyTorch's `npu` backend in this process; returns its module.

    Irreversible. Calling again with the same arguments returns the same module; different
    arguments raise ValueError. RuntimeError if torch-npu is present or PrivateUse1 is taken.
    """
    global _INSTALLED
    check_positive_int("devices", devices)
    check_positive_int("capacity_bytes", capacity_bytes)
    with _INSTALL_LOCK:
        if _INSTALLED is not None:
            installed = (_INSTALLED.device_count(), _INSTALLED.capacity_bytes)
            if installed != (devices, capacity_bytes):
                raise ValueError(
                    f"the emulated NPU is already installed in this process with devices="
                    f"{installed[0]}, capacity_bytes={installed[1]}; devices={devices}, "
                    f"capacity_bytes={capacity_bytes} was passed (the registration cannot be "
                    "undone: start a new process)")
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
        module = EmulatedNPU(devices, capacity_bytes)
        if backend != BACKEND_NAME:
            torch.utils.rename_privateuse1_backend(BACKEND_NAME)
        torch._register_device_module(BACKEND_NAME, module)
        _INSTALLED = module
        return module


def installed_module() -> EmulatedNPU | None:
    """The module `install_emulated_npu` registered in this process, if any."""
    return _INSTALLED


def _real_npu_status() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)

        available = bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable NPU", with its text
        return False, f"importing torch_npu failed: {type(exc).__name__}: {exc}"
    return available, "" if available else "torch.npu.is_available() is False"


def resolve_device(spec: str = "auto") -> str:
    """The device kind for `spec`: `npu`, `cuda` or `emulated-npu`; installs nothing.

    `auto` picks a real NPU (torch_npu importable and available), else CUDA, else the
    emulated NPU. An explicit `npu` or `cuda` that is not available raises RuntimeError.
    """
    if spec not in DEVICE_SPECS:
        raise ValueError(f"The device spec must be one of {list(DEVICE_SPECS)}, but "
                         f"{spec!r} was passed.")
    if spec == "emulated-npu":
        return spec
    if spec in ("auto", "npu"):
        available, why = _real_npu_status()
        if available:
            return "npu"
        if spec == "npu":
            raise RuntimeError(f"device 'npu' requested but no real NPU is usable ({why}); "
                               "use 'emulated-npu' to run on the host-backed emulation")
    if torch.cuda.is_available():
        return "cuda"
    if spec == "cuda":
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False; "
                           "use 'emulated-npu' or 'auto'")
    return "emulated-npu"


def torch_device(kind: str, index: int) -> torch.device:
    """The torch.device of device `index` of a kind (`npu:i` for npu and emulated-npu).

    For `emulated-npu` call it after `install_emulated_npu` (before, torch knows no `npu`).
    """
    if kind not in DEVICE_KINDS:
        raise ValueError(f"The value for `kind` must be one of {list(DEVICE_KINDS)}, but "
                         f"{kind!r} was passed.")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"The value for `index` must be a non-negative integer, but {index!r} "
                         "was passed.")
    return torch.device(f"{'cuda' if kind == 'cuda' else BACKEND_NAME}:{index}")


__all__ = [
    "BACKEND_NAME", "DEFAULT_CAPACITY_BYTES", "DEVICE_KINDS", "DEVICE_NAME", "DEVICE_PID_BASE",
    "DEVICE_SPECS", "HOST_RANGE_CATEGORY", "LARGE_ROUND_BYTES", "MIN_BLOCK_BYTES",
    "OVERSIZE_SLACK_BYTES", "SMALL_SIZE_BYTES", "TASK_CATEGORIES", "Block",
    "CachingHostAllocator", "DeviceTaskError", "DeviceTensor", "EmulatedNPU", "Event", "Stream",
    "Task", "TraceRecord", "install_emulated_npu", "installed_module", "resolve_device",
    "round_size", "torch_device",
]
