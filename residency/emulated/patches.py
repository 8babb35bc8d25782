"""Accelerator patches of serving stacks, applied to the emulated NPU.

vllm-ascend's `patch/platform/patch_torch_accelerator.py` (before its PR #12344) replaces
`torch.accelerator.memory_reserved`, `memory_stats`, `empty_cache` and `get_memory_info` with
their `torch.npu` counterparts but leaves `memory_allocated` alone. Inside a real vLLM-Omni
process on Ascend the generic telemetry's first query (reserved) therefore answers and the
second (allocated) raises PyTorch's "Allocator for npu is not a DeviceAllocator".
`apply_accelerator_patch(module, "vllm-ascend")` makes the same replacements with the emulated
module, so the baseline arm fails on the same query, in the same order.
"""

from __future__ import annotations

from typing import Any

import torch

from residency.emulated.model import ACCELERATOR_PATCHES

VLLM_ASCEND_REDIRECTED = ("memory_reserved", "memory_stats", "empty_cache", "get_memory_info")
"""The `torch.accelerator` functions vllm-ascend redirects (not `memory_allocated`)."""


def apply_accelerator_patch(module: Any, patch: str) -> tuple[str, ...]:
    """Redirect `torch.accelerator` functions to `module` as `patch` does; returns their names.

    Process-global, like the patch it emulates; `"none"` changes nothing.
    """
    if patch not in ACCELERATOR_PATCHES:
        raise ValueError(f"The value for `patch` must be one of {list(ACCELERATOR_PATCHES)}, "
                         f"but {patch!r} was passed.")
    if patch == "none":
        return ()

    def empty_cache() -> None:
        module.empty_cache()

    empty_cache.__qualname__ = f"{type(module).__name__}.empty_cache"
    torch.accelerator.memory_reserved = module.memory_reserved
    torch.accelerator.memory_stats = module.memory_stats
    torch.accelerator.empty_cache = empty_cache
    torch.accelerator.get_memory_info = module.mem_get_info
    return VLLM_ASCEND_REDIRECTED


__all__ = ["VLLM_ASCEND_REDIRECTED", "apply_accelerator_patch"]
