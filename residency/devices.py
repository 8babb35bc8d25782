"""The device kinds: names, labels, resolution, distributed backend and profiler per kind.

One registered `DeviceKind` per kind (`npu`, `cuda`, `emulated-npu`; `cpu` only for `probe`).
Resolve a user's spec (`auto` or a kind) once at the edge with `resolve()` and pass the
resolved kind down. No torch at import: `resolve()` imports torch only to ask for CUDA, and
a profiler factory imports its profiler only when called.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

EMULATED_LABEL = "emulated NPU — not an NPU measurement"


@dataclass(frozen=True)
class DeviceKind:
    """What the suite needs to know about one device kind."""

    name: str
    label: str  # how figures and tables name it
    torch_type: str  # torch.device type of its devices
    backend: str  # torch.distributed backend of its ranks
    measurement: bool  # False: its figures are never presented as device measurements
    device_package: str | None = None  # importing it registers torch's device module


REGISTRY: dict[str, DeviceKind] = {}


def register(kind: DeviceKind) -> DeviceKind:
    """Add a device kind (one registered object per kind, no `if` elsewhere)."""
    REGISTRY[kind.name] = kind
    return kind


register(DeviceKind("npu", "Ascend NPU", "npu", "hccl", True, device_package="torch_npu"))
register(DeviceKind("cuda", "CUDA GPU", "cuda", "nccl", True))
register(DeviceKind("emulated-npu", EMULATED_LABEL, "npu", "gloo", False))
register(DeviceKind("cpu", "CPU", "cpu", "gloo", True))

KINDS: tuple[str, ...] = ("npu", "cuda", "emulated-npu")  # what a run can record
RECORDED_KINDS: tuple[str, ...] = (*KINDS, "cpu")  # what an artifact may say (probe: cpu)
SPECS: tuple[str, ...] = ("auto", *KINDS)

__all__ = ["EMULATED_LABEL", "KINDS", "RECORDED_KINDS", "REGISTRY", "SPECS", "DeviceKind",
           "backend", "check_kind", "device_count", "emulated", "info", "label",
           "load_device_package", "note", "register", "resolve", "torch_device"]


def check_kind(kind: Any, *, name: str = "device_kind", allowed: tuple[str, ...] = KINDS
               ) -> str:
    """`kind` when it is one of `allowed`; ValueError naming the parameter otherwise."""
    if not isinstance(kind, str) or kind not in allowed:
        raise ValueError(f"The value for `{name}` must be one of {list(allowed)}, but "
                         f"{kind!r} was passed.")
    return kind


def info(kind: str) -> DeviceKind:
    """The registered `DeviceKind` of `kind`; ValueError for an unknown kind."""
    return REGISTRY[check_kind(kind, allowed=tuple(REGISTRY))]


def label(kind: str) -> str:
    """How figures and tables name a device kind (the emulated NPU says it is not an NPU
    measurement); an unknown kind is named as is."""
    return REGISTRY[kind].label if kind in REGISTRY else str(kind)


def emulated(kind: str) -> bool:
    """True for a kind whose figures are never device measurements (the emulated NPU)."""
    return kind in REGISTRY and not REGISTRY[kind].measurement


def load_device_package(kind: str) -> None:
    """Import the package that registers `kind`'s torch device module (torch_npu for npu);
    nothing for kinds torch knows itself or the emulated NPU (installed by its own code)."""
    package = info(kind).device_package
    if package is not None:
        importlib.import_module(package)


def device_count(kind: str) -> int | None:
    """How many devices of a measured kind are visible (its torch device module's
    `device_count()`); None for the emulated NPU, whose devices are as many as its ranks."""
    if emulated(kind):
        return None
    import torch

    load_device_package(kind)
    return int(getattr(torch, info(kind).torch_type).device_count())


def note(kind: str) -> str:
    """One sentence naming the device kind, saying when its figures are not device figures."""
    if emulated(kind):
        return (f"Device kind {kind} ({label(kind)}): host memory standing in for an NPU; "
                "these are not NPU figures.")
    return f"Device kind {kind} ({label(kind)})."


def backend(kind: str) -> str:
    """The torch.distributed backend of a kind's ranks: hccl, nccl or gloo."""
    return info(kind).backend


def torch_device(kind: str, index: int) -> Any:
    """The `torch.device` of device `index` of `kind` (`npu:i` for npu and emulated-npu;
    for emulated-npu call it after `install_emulated_npu`)."""
    check_kind(kind, name="kind")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"The value for `index` must be a non-negative integer, but {index!r} "
                         "was passed.")
    import torch

    return torch.device(f"{info(kind).torch_type}:{index}")


def _real_npu_status() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)

        available = bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable NPU", with its text
        return False, f"importing torch_npu failed: {type(exc).__name__}: {exc}"
    return available, "" if available else "torch.npu.is_available() is False"


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve(spec: str = "auto") -> str:
    """The device kind for `spec`: `npu`, `cuda` or `emulated-npu`; installs nothing.

    `auto` picks a real NPU (torch_npu importable and available), else CUDA, else the
    emulated NPU. Call it once at the edge (CLI, notebook) and pass the kind down.

    Raises:
        ValueError: `spec` is not one of `SPECS`.
        RuntimeError: an explicit `npu` or `cuda` that is not usable here, saying why.
    """
    if spec not in SPECS:
        raise ValueError(f"The device spec must be one of {list(SPECS)}, but {spec!r} was "
                         "passed.")
    if spec == "emulated-npu":
        return spec
    if spec in ("auto", "npu"):
        available, why = _real_npu_status()
        if available:
            return "npu"
        if spec == "npu":
            raise RuntimeError(f"device 'npu' requested but no real NPU is usable ({why}); "
                               "use 'emulated-npu' to run on the host-backed emulation")
    if _cuda_available():
        return "cuda"
    if spec == "cuda":
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False; "
                           "use 'emulated-npu' or 'auto'")
    return "emulated-npu"


