"""Stand-in for vLLM-Omni's module_residency: the fixed-bounds allocator-cache policy.

Upstream semantics (vLLM-Omni 0.30.0, PR #6526): a normal call reads allocated/reserved
through `torch.accelerator` and free/total through the platform; it releases when a bound is
crossed or any telemetry call raises; a forced call releases without reading anything.
"""

from __future__ import annotations

import torch


class _Platform:
    """What module_residency uses of `vllm_omni.platforms.current_omni_platform`."""

    def get_device_memory(self, device=None):
        return torch.get_device_module(device).mem_get_info(device)

    def empty_cache(self):
        torch.get_device_module("npu").empty_cache()


current_omni_platform = _Platform()


class BoundedAllocatorCache:
    def __init__(self, device, *, max_cached_fraction=0.25, min_free_fraction=0.05):
        self.device = device
        self.max_cached_fraction = max_cached_fraction
        self.min_free_fraction = min_free_fraction

    def _should_release(self):
        cached = max(0, int(torch.accelerator.memory_reserved(self.device))
                     - int(torch.accelerator.memory_allocated(self.device)))
        free, total = current_omni_platform.get_device_memory(self.device)
        return (cached > int(total * self.max_cached_fraction)
                or free < int(total * self.min_free_fraction))

    def release_if_needed(self, *, force=False):
        if not force:
            try:
                if not self._should_release():
                    return False
            except Exception:
                pass
        current_omni_platform.empty_cache()
        return True
