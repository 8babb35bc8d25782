"""Evidence for allocator cache-retention policies in diffusion-model component offload."""

from residency.policy.cache import BoundedAllocatorCache, Decision, policy_for
from residency.policy.telemetry import MemorySnapshot, TelemetryUnavailable, telemetry_for

__version__ = "0.1.0"
__all__ = [
    "BoundedAllocatorCache", "Decision", "MemorySnapshot", "TelemetryUnavailable",
    "policy_for", "telemetry_for", "__version__",
]
