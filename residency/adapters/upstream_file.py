"""Load the installed vLLM-Omni's real `module_residency.py` where vLLM itself is absent.

The published `vllm-omni` wheel can be installed without its dependencies (no vLLM, no
device stack). Its `vllm_omni/diffusion/offloader/module_residency.py` then cannot be
imported normally: it needs `vllm.logger.init_logger` and
`vllm_omni.platforms.current_omni_platform` (whose `empty_cache()` and
`get_device_memory(device)` are all the policy uses), and the package `__init__` files pull
in much more. `load_module_residency` executes the real file from the installed
distribution with exactly those two imports stubbed; its relative import (`.tensor_utils`)
loads the real sibling file. The stubs are registered in `sys.modules` (process-global):
call it only in a process made for it (a subprocess in tests, the selftest's own process),
and never where a real vLLM is importable.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

DISTRIBUTION = "vllm-omni"
PACKAGE = "vllm_omni"
UPSTREAM_MODULE = "vllm_omni.diffusion.offloader.module_residency"
RELATIVE_PATH = "vllm_omni/diffusion/offloader/module_residency.py"


class StubPlatform:
    """What `module_residency` uses of `current_omni_platform`, backed by torch's registered
    device module: `get_device_memory(device)` is its `mem_get_info(device)` (what vLLM-Omni's
    NPU platform calls); `empty_cache()` counts the call and empties the current
    accelerator's cache (as the platform does), when there is one."""

    def __init__(self) -> None:
        self.empty_cache_calls = 0

    def get_device_memory(self, device: Any = None) -> tuple[int, int]:
        import torch

        free, total = torch.get_device_module(device).mem_get_info(device)
        return int(free), int(total)

    def empty_cache(self) -> None:
        import torch

        self.empty_cache_calls += 1
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None:
            torch.get_device_module(accelerator.type).empty_cache()


def installed_file() -> Path | None:
    """The installed distribution's `module_residency.py`, or None when vllm-omni is not
    installed (or the file is not part of it)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(RELATIVE_PATH)))
    return path if path.is_file() else None


def load_module_residency(platform: Any | None = None) -> types.ModuleType:
    """Execute the installed `module_residency.py` as `UPSTREAM_MODULE` with `vllm.logger`
    and `vllm_omni.platforms` stubbed (`platform`: the `current_omni_platform` to give it,
    default a new `StubPlatform`). Returns the module, also registered in `sys.modules`.

    Raises:
        FileNotFoundError: vllm-omni is not installed, or its wheel has no such file.
        RuntimeError: a real `vllm` is importable (stubbing it would hide the real one), or
            `vllm_omni` was already imported for real in this process.
    """
    path = installed_file()
    if path is None:
        raise FileNotFoundError(f"{DISTRIBUTION} is not installed, or its distribution has no "
                                f"{RELATIVE_PATH}")
    existing = sys.modules.get(PACKAGE)
    if existing is not None and not getattr(existing, "_residency_stub", False):
        raise RuntimeError(f"{PACKAGE} is already imported for real in this process; import "
                           f"{UPSTREAM_MODULE} normally instead")
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is not None:
        raise RuntimeError("a real vllm is importable here: import "
                           f"{UPSTREAM_MODULE} normally instead of stubbing vllm")
    root = path.parents[2]  # .../vllm_omni
    _stub("vllm", path=[])
    _stub("vllm.logger", init_logger=logging.getLogger)
    _stub(PACKAGE, path=[str(root)])
    _stub(f"{PACKAGE}.platforms",
          current_omni_platform=platform if platform is not None else StubPlatform())
    _stub(f"{PACKAGE}.diffusion", path=[str(root / "diffusion")])
    _stub(f"{PACKAGE}.diffusion.offloader", path=[str(path.parent)])
    spec = importlib.util.spec_from_file_location(UPSTREAM_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[UPSTREAM_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[UPSTREAM_MODULE]
        raise
    return module


def _stub(name: str, *, path: list[str] | None = None, **attrs: Any) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module._residency_stub = True  # type: ignore[attr-defined]
        if path is not None:
            module.__path__ = path  # a package: submodules load from the real files
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


__all__ = ["StubPlatform", "UPSTREAM_MODULE", "installed_file", "load_module_residency"]
