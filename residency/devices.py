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

INJECTIONS: tuple[str, ...] = ("none", "generic-telemetry")
"""`--inject-failure` values: `generic-telemetry` makes PyTorch's generic `torch.accelerator`
memory queries raise in the baseline arm's processes exactly as torch-npu <= 2.12 does."""
INJECTED_ARMS: tuple[str, ...] = ("baseline",)
"""The arms whose processes get the injected failure (the candidate is never touched)."""
INJECTED_WORDING = {"generic-telemetry": "NPU telemetry failure injected into the baseline"}
"""How labels say a failure was injected (after the device's own label)."""
INJECTED_ERROR = ('device_allocator INTERNAL ASSERT FAILED at "/__w/pytorch/pytorch/c10/core/'
                  'CachingDeviceAllocator.h":261, please report a bug to PyTorch. Allocator '
                  'for {device_type} is not a DeviceAllocator.')
"""PyTorch 2.13's own message (a RuntimeError) for a device whose allocator is not a
DeviceAllocator: what torch-npu <= 2.12 raises, and what the injection raises."""


@dataclass(frozen=True)
class DeviceKind:
    """What the suite needs to know about one device kind."""

    name: str
    label: str  # how figures and tables name it
    torch_type: str  # torch.device type of its devices
    backend: str  # torch.distributed backend of its ranks
    measurement: bool  # False: its figures are never presented as device measurements
    device_package: str | None = None  # importing it registers torch's device module
    banner_colour: str = "#4b5563"  # the report banner's border (the emulated NPU stands out)
    trace_format: str | None = None  # what its profiler writes (`residency.traces` formats)
    profiler_text: str | None = None  # how the selftest names that profiler
    selftest_scale: float = 0.25  # the selftest service's component sizes (x S)
    selftest_resident_mib: float = 256.0  # ... and its resident tensor
    selftest_block_bytes: int = 256 << 20  # the selftest's policy step allocates this block


REGISTRY: dict[str, DeviceKind] = {}


def register(kind: DeviceKind) -> DeviceKind:
    """Add a device kind (one registered object per kind, no `if` elsewhere)."""
    REGISTRY[kind.name] = kind
    return kind


register(DeviceKind("npu", "Ascend NPU", "npu", "hccl", True, device_package="torch_npu",
                    banner_colour="#1d4ed8", trace_format="ascend",
                    profiler_text="torch_npu.profiler with tensorboard_trace_handler"))
register(DeviceKind("cuda", "CUDA GPU", "cuda", "nccl", True, banner_colour="#15803d",
                    trace_format="kineto",
                    profiler_text="torch.profiler (CPU + CUDA activities, export_chrome_trace)"))
register(DeviceKind("emulated-npu", EMULATED_LABEL, "npu", "gloo", False,
                    banner_colour="#b45309", trace_format="kineto",
                    profiler_text="the emulated NPU's Kineto export", selftest_scale=0.02,
                    selftest_block_bytes=64 << 20))
register(DeviceKind("cpu", "CPU", "cpu", "gloo", True))

KINDS: tuple[str, ...] = ("npu", "cuda", "emulated-npu")  # what a run can record
RECORDED_KINDS: tuple[str, ...] = (*KINDS, "cpu")  # what an artifact may say (probe: cpu)
SPECS: tuple[str, ...] = ("auto", *KINDS)

__all__ = ["EMULATED_LABEL", "INJECTED_ARMS", "INJECTED_ERROR", "INJECTED_WORDING",
           "INJECTIONS", "KINDS", "RECORDED_KINDS", "REGISTRY", "SPECS", "DeviceKind",
           "backend", "check_injection", "check_kind", "device_count", "emulated", "info",
           "injection_of", "injection_record", "label", "load_device_package", "note",
           "register", "resolve", "torch_device"]


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


def label(kind: str, injection: str | None = None) -> str:
    """How figures and tables name a device kind (the emulated NPU says it is not an NPU
    measurement); an unknown kind is named as is. With an `injection` other than `none`,
    the label says it: "CUDA GPU, NPU telemetry failure injected into the baseline"."""
    text = REGISTRY[kind].label if kind in REGISTRY else str(kind)
    if injection and injection != "none":
        text += ", " + INJECTED_WORDING.get(injection, f"failure {injection!r} injected")
    return text


def injection_of(params: Any) -> str:
    """The failure injected into a run, from its manifest's `params` (`inject_failure`:
    an object whose `kind` names it); "none" when nothing was injected or recorded."""
    record = params.get("inject_failure") if isinstance(params, dict) else None
    kind = record.get("kind") if isinstance(record, dict) else record
    return kind if isinstance(kind, str) and kind else "none"


def injection_record(kind: str, injection: str, patch: str = "none") -> dict[str, Any] | None:
    """What a run's manifest records of an injection (`params.inject_failure`): `kind`,
    `arms`, `device_type`, `accelerator_patch` and the `error` raised; None for `none`."""
    if check_injection(kind, injection) == "none":
        return None
    device_type = info(kind).torch_type
    return {"kind": injection, "arms": list(INJECTED_ARMS), "device_type": device_type,
            "accelerator_patch": patch,
            "error": "RuntimeError: " + INJECTED_ERROR.format(device_type=device_type),
            "label": label(kind, injection)}


def check_injection(kind: str, injection: str) -> str:
    """`injection` when it can be injected on device kind `kind`; ValueError saying why not.

    `generic-telemetry` is injected on CUDA only: on a real NPU the failure is real
    (torch-npu <= 2.12) or absent (>= 2.13), and the emulated NPU already fails exactly so.
    """
    if injection not in INJECTIONS:
        raise ValueError(f"The value for `--inject-failure` must be one of {list(INJECTIONS)}, "
                         f"but {injection!r} was passed.")
    if injection == "none":
        return injection
    if kind == "npu":
        raise ValueError("--inject-failure applies to cuda only: on a real NPU the generic "
                         "torch.accelerator failure is real (torch-npu <= 2.12: its allocator is "
                         "not a DeviceAllocator) or absent (torch-npu >= 2.13): run `residency "
                         "probe --device npu` to see which, nothing is injected there")
    if kind == "emulated-npu":
        raise ValueError("--inject-failure applies to cuda only: the emulated NPU's generic "
                         "torch.accelerator queries already raise PyTorch's own 'Allocator for "
                         "npu is not a DeviceAllocator' (it is failing without injection)")
    if kind != "cuda":
        raise ValueError(f"--inject-failure applies to cuda only, not {kind}")
    return injection


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


def note(kind: str, injection: str | None = None) -> str:
    """One sentence naming the device kind, saying when its figures are not device figures
    and when a failure was injected."""
    if emulated(kind):
        return (f"Device kind {kind} ({label(kind)}): host memory standing in for an NPU; "
                "these are not NPU figures.")
    if injection and injection != "none":
        return (f"Device kind {kind} ({label(kind, injection)}): the baseline's generic "
                "torch.accelerator queries were made to raise as on torch-npu <= 2.12; the "
                "figures are this device's, not an NPU's.")
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


