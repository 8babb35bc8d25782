"""What the selftest's environment step records: versions of the stack and of the device's
toolkit and driver, read from their own files where they keep them."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

ASCEND_DRIVER_VERSION_FILE = Path("/usr/local/Ascend/driver/version.info")
NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
ASCEND_TOOLKIT_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")


def _first_version_line(path: Path) -> str | None:
    """The value of the first `version=` / `Version=` line of a toolkit or driver file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() in ("version", "runtime_running_version"):
            return value.strip().strip("[]") or None
    return None


def cann_version(*, ask_torch_npu: bool = False) -> dict[str, Any]:
    """CANN's version from the toolkit's own version file, and which file; with
    `ask_torch_npu`, torch-npu's `torch_npu.npu.utils.get_cann_version()` when no file is
    found. None when neither answers."""
    roots = [os.environ.get(v) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    roots += ASCEND_TOOLKIT_ROOTS
    for root in (Path(r) for r in roots if r):
        candidates = [*sorted(root.glob("*/ascend_toolkit_install.info")), root / "version.cfg",
                      root / "compiler" / "version.info", root / "runtime" / "version.info"]
        for path in candidates:
            if path.is_file() and (version := _first_version_line(path)):
                return {"version": version, "source": str(path)}
    if ask_torch_npu:
        with contextlib.suppress(Exception):  # an older torch-npu has no such function
            from torch_npu.npu.utils import get_cann_version  # type: ignore[import-not-found]

            version = str(get_cann_version() or "").strip()
            if version:
                return {"version": version,
                        "source": "torch_npu.npu.utils.get_cann_version()"}
    return {"version": None, "source": None}


def driver_version(kind: str) -> dict[str, Any]:
    """The accelerator driver's version and where it was read (None when not found)."""
    if kind == "npu":
        path = ASCEND_DRIVER_VERSION_FILE
        version = _first_version_line(path) if path.is_file() else None
        return {"version": version, "source": str(path) if version else None}
    if kind == "cuda":
        path = NVIDIA_VERSION_FILE
        with contextlib.suppress(OSError):
            # "... x86_64 Kernel Module  580.159.03  Release Build ..." (proprietary) or
            # "... Open Kernel Module for x86_64  580.159.04  Release Build ..." (open)
            match = re.search(r"Kernel Module\b[^\n]*?\s(\d+(?:\.\d+)+)\s",
                              path.read_text(errors="replace"))
            if match:
                return {"version": match[1], "source": str(path)}
        import subprocess

        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20, check=True).stdout.split()
            if out:
                return {"version": out[0], "source": "nvidia-smi"}
    return {"version": None, "source": None}


def dist_version(name: str) -> str | None:
    """An installed distribution's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def collect_environment(kind: str, device_count: int) -> dict[str, Any]:
    """Versions and devices: python, torch (+ CUDA build), torch-npu, CANN, driver, device
    count and name, vllm, vllm-omni, vllm-ascend, residency and its git commit."""
    import platform

    import torch

    from residency.rundir.run import versions

    env: dict[str, Any] = dict(versions())
    env.update(platform=f"{platform.system()} {platform.machine()}",
               torch_cuda=torch.version.cuda, cann=cann_version(ask_torch_npu=kind == "npu"),
               driver=driver_version(kind),
               device_kind=kind, device_count=device_count,
               vllm=dist_version("vllm"), vllm_omni=dist_version("vllm-omni"),
               vllm_ascend=dist_version("vllm-ascend"))
    if kind == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
    elif kind == "npu":
        env["device_name"] = torch.npu.get_device_name(0)  # type: ignore[attr-defined]
    else:
        env["device_name"] = "emulated NPU (host-backed)"
    return env


__all__ = ["cann_version", "collect_environment", "dist_version", "driver_version"]
