"""Evidence for allocator cache-retention policies in diffusion-model component offload.

The policy's public names are loaded on first use (PEP 562), so that analysis commands
(``residency idle``, ``tables``) start without the policy layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from residency.policy.cache import BoundedAllocatorCache, Decision, policy_for
    from residency.policy.telemetry import MemorySnapshot, TelemetryUnavailable, telemetry_for

__version__ = "0.1.0"
_LAZY = {
    "BoundedAllocatorCache": "residency.policy.cache", "Decision": "residency.policy.cache",
    "policy_for": "residency.policy.cache", "MemorySnapshot": "residency.policy.telemetry",
    "TelemetryUnavailable": "residency.policy.telemetry",
    "telemetry_for": "residency.policy.telemetry",
}
__all__ = [
    "BoundedAllocatorCache", "Decision", "MemorySnapshot", "TelemetryUnavailable",
    "policy_for", "telemetry_for", "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'residency' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
