"""The NPU's telemetry failure injected on a device where it is absent (CUDA).

On Ascend with torch-npu up to the 2.12 line, every generic `torch.accelerator` memory
function raises PyTorch's own `RuntimeError: ... Allocator for npu is not a DeviceAllocator.`
(checked on torch 2.13 with the emulated NPU: `memory_allocated`, `memory_reserved`,
`memory_stats`, `max_memory_allocated`, `max_memory_reserved`, `reset_peak_memory_stats`,
`reset_accumulated_memory_stats`, `get_memory_info` and `empty_cache` all raise it).
`inject_generic_telemetry_failure` replaces those functions in this process with ones that
raise the same error for the device's type, so the baseline arm's normal calls take the
telemetry-failure path and release, as they do on that NPU. The registered device module
(`torch.cuda`) is untouched: the candidate, and every release the policy makes
(`torch.get_device_module(device).empty_cache()`), go through it.

With `patch="vllm-ascend"` vllm-ascend's redirection is applied on top, exactly as on the
emulated NPU (`residency.emulated.patches`): `memory_reserved`, `memory_stats`,
`empty_cache` and `get_memory_info` answer from the device module, `memory_allocated` keeps
raising. Process-global and irreversible: apply it only in a process made for the arm.
"""

from __future__ import annotations

from typing import Any

from residency import devices

FAILING_FUNCTIONS = ("memory_allocated", "memory_reserved", "memory_stats",
                     "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
                     "reset_accumulated_memory_stats", "get_memory_info", "empty_cache")
"""The `torch.accelerator` functions that raise on torch-npu <= 2.12 (and on the emulated NPU)."""

ERROR_TEMPLATE = devices.INJECTED_ERROR
"""PyTorch 2.13's own message for a device whose allocator is not a DeviceAllocator."""


def injected_error(device_type: str) -> str:
    """The message the injected functions raise for `device_type` (e.g. cuda)."""
    return ERROR_TEMPLATE.format(device_type=device_type)


def _raiser(name: str, message: str) -> Any:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    failing.__name__ = name
    failing.__qualname__ = f"injected_generic_telemetry_failure.{name}"
    failing.__module__ = __name__
    return failing


def inject_generic_telemetry_failure(device_type: str, patch: str = "none", *,
                                     module: Any = None) -> dict[str, Any]:
    """Make `torch.accelerator`'s memory functions raise for this process as torch-npu <= 2.12
    does; with `patch="vllm-ascend"` redirect vllm-ascend's functions to `module` (default:
    `torch.get_device_module(device_type)`). Returns what the manifest records: `kind`,
    `device_type`, `accelerator_patch`, `failing` (the functions that raise), `redirected`
    and `error`.

    Raises:
        ValueError: an unknown patch.
    """
    import torch

    from residency.emulated.patches import apply_accelerator_patch

    message = injected_error(device_type)
    for name in FAILING_FUNCTIONS:
        setattr(torch.accelerator, name, _raiser(name, message))
    redirected: tuple[str, ...] = ()
    if patch != "none":
        target = module if module is not None else torch.get_device_module(device_type)
        redirected = apply_accelerator_patch(target, patch)
    return {"kind": "generic-telemetry", "device_type": device_type, "accelerator_patch": patch,
            "failing": [n for n in FAILING_FUNCTIONS if n not in redirected],
            "redirected": list(redirected), "error": f"RuntimeError: {message}"}


def inject_for_arm(kind: str, arm: str, injection: str, patch: str = "none"
                   ) -> dict[str, Any] | None:
    """Inject `injection` when `arm` is one of `devices.INJECTED_ARMS`; None otherwise (the
    candidate is never touched). ValueError where the injection cannot apply
    (`devices.check_injection`)."""
    if devices.check_injection(kind, injection) == "none" or arm not in devices.INJECTED_ARMS:
        return None
    return inject_generic_telemetry_failure(devices.info(kind).torch_type, patch)


__all__ = ["ERROR_TEMPLATE", "FAILING_FUNCTIONS", "inject_for_arm",
           "inject_generic_telemetry_failure", "injected_error"]
