"""Allocator telemetry: a `MemorySnapshot` from the generic or the registered-module source."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from residency.errors import ResidencyError


@dataclass(frozen=True)
class MemorySnapshot:
    """Allocator state of one device, in bytes."""

    reserved: int
    allocated: int
    free: int
    total: int

    @property
    def cached(self) -> int:
        """Reserved but unallocated bytes: max(0, reserved - allocated)."""
        return max(0, self.reserved - self.allocated)

    def to_dict(self) -> dict[str, int]:
        """The four byte counts, for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemorySnapshot:
        """Inverse of `to_dict`; raises ValueError naming a missing or non-integer field."""
        values = {}
        for name in ("reserved", "allocated", "free", "total"):
            value = data.get(name) if isinstance(data, dict) else None
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"snapshot field `{name}` must be an integer, got {value!r}")
            values[name] = value
        return cls(**values)


class TelemetryUnavailable(ResidencyError, RuntimeError):
    """Telemetry could not be read; carries the original exception's type and message, and
    the query that raised it when known (e.g. `torch.accelerator.memory_allocated`)."""

    def __init__(self, source: str, error_type: str, error_message: str,
                 query: str | None = None) -> None:
        self.source = source
        self.error_type = error_type
        self.error_message = error_message
        self.query = query
        where = f" [query: {query}]" if query else ""
        super().__init__(f"{source} telemetry unavailable: {error_type}: {error_message}{where}")

    @classmethod
    def wrap(cls, source: str, exc: BaseException,
             query: str | None = None) -> TelemetryUnavailable:
        """Wrap `exc` raised while reading `source` telemetry (in `query`, when known)."""
        return cls(source, type(exc).__name__, str(exc), query)


@runtime_checkable
class Telemetry(Protocol):
    """Anything that can snapshot a device's allocator."""

    name: str

    def snapshot(self, device: Any) -> MemorySnapshot: ...


def as_device(device: Any) -> Any:
    """`device` as a `torch.device` (accepts strings such as "npu:0")."""
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)


def _free_total(device: Any) -> tuple[int, int]:
    import torch

    free, total = torch.get_device_module(device).mem_get_info(device)
    return int(free), int(total)


class GenericTelemetry:
    """`torch.accelerator.memory_reserved/memory_allocated`; free/total from the device module."""

    name = "generic"

    def snapshot(self, device: Any) -> MemorySnapshot:
        import torch

        query = "torch.accelerator.memory_reserved"  # queried in this order, as upstream
        try:
            device = as_device(device)
            reserved = int(torch.accelerator.memory_reserved(device))
            query = "torch.accelerator.memory_allocated"
            allocated = int(torch.accelerator.memory_allocated(device))
            query = "mem_get_info"
            free, total = _free_total(device)
        except Exception as exc:  # any failure of the device stack means "unavailable"
            raise TelemetryUnavailable.wrap(self.name, exc, query) from exc
        return MemorySnapshot(reserved, allocated, free, total)

    def __repr__(self) -> str:
        return "GenericTelemetry(torch.accelerator)"


class RegisteredModuleTelemetry:
    """`torch.get_device_module(device).memory_reserved/memory_allocated/mem_get_info`."""

    name = "registered"

    def snapshot(self, device: Any) -> MemorySnapshot:
        import torch

        try:
            device = as_device(device)
            module = torch.get_device_module(device)
            reserved = int(module.memory_reserved(device))
            allocated = int(module.memory_allocated(device))
            free, total = _free_total(device)
        except Exception as exc:  # any failure of the device stack means "unavailable"
            raise TelemetryUnavailable.wrap(self.name, exc) from exc
        return MemorySnapshot(reserved, allocated, free, total)

    def __repr__(self) -> str:
        return "RegisteredModuleTelemetry(torch.get_device_module)"


def telemetry_for(device: Any) -> Telemetry:
    """The fixed source: the registered device module for `npu`, the generic API otherwise."""
    if as_device(device).type == "npu":
        return RegisteredModuleTelemetry()
    return GenericTelemetry()


GENERIC_QUERIES = {"allocated": "memory_allocated", "reserved": "memory_reserved",
                    "memory_stats": "memory_stats", "get_memory_info": "get_memory_info",
                    "empty_cache": "empty_cache"}

POLICY_QUERIES = ("allocated", "reserved")
"""The two queries the policy's telemetry makes; `bug_present` is decided on these."""

EXTRA_GENERIC_QUERIES = ("memory_stats", "get_memory_info")
"""Read-only generic queries the probe also calls, because vllm-ascend redirects them
(`empty_cache` is redirected too, but the probe never calls it: it changes the cache)."""
