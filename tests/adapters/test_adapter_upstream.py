"""The vLLM-Omni adapter against the real upstream file, from the published wheel.

Ran against vLLM-Omni 0.30.0 (PyPI `vllm-omni`, installed with `--no-deps` by `.ci/run`):
its real `vllm_omni/diffusion/offloader/module_residency.py` is executed with `vllm.logger`
and `current_omni_platform` (`empty_cache`, `get_device_memory`) stubbed
(`residency.adapters.upstream_file`), on a fake `npu` device module whose generic
`torch.accelerator` queries raise PyTorch's real "Allocator for npu is not a
DeviceAllocator" error. Every case runs in a fresh interpreter: the adapter patches a class
and the rename of PyTorch's PrivateUse1 backend is process-global.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from residency.records.decisions import decisions_file
from tests.helpers import ROOT

UPSTREAM_VERSION = "0.30.0"  # the version .ci/run installs; keep both in step


def _installed() -> str | None:
    try:
        return version("vllm-omni")
    except PackageNotFoundError:
        return None


if _installed() is None:
    if os.environ.get("CI"):
        raise RuntimeError(f"vllm-omni {UPSTREAM_VERSION} must be installed on CI (.ci/run "
                           "installs it with --no-deps)")
    pytest.skip(f"vllm-omni is not installed: `pip install --no-deps "
                f"vllm-omni=={UPSTREAM_VERSION}` to test the adapter against it",
                allow_module_level=True)

EXERCISE = '''
import json, os, sys, types, torch
torch.utils.rename_privateuse1_backend("npu")
GiB = 1024**3
npu = types.ModuleType("fake_npu")
npu.is_available = lambda: True
npu.device_count = lambda: 1
npu.current_device = lambda: 0
npu.memory_allocated = lambda device=None: 10 * GiB
npu.memory_reserved = lambda device=None: 12 * GiB
npu.mem_get_info = lambda device=None: (40 * GiB, 64 * GiB)
npu.empty_cache_calls = 0
def empty_cache():
    npu.empty_cache_calls += 1
npu.empty_cache = empty_cache
torch._register_device_module("npu", npu)

from residency.adapters import upstream_file
from residency.adapters import vllm_omni as adapter
platform = upstream_file.StubPlatform()
mr = upstream_file.load_module_residency(platform)
Cache = mr.BoundedAllocatorCache
device = torch.device("npu:0")
before = Cache(device)
unpatched = [before.release_if_needed(), before.release_if_needed(force=True)]
calls_unpatched = platform.empty_cache_calls
original = Cache.release_if_needed
adapter.register()
after = Cache(device, max_cached_fraction=0.5)
# normal calls as PinnedModuleStager.offload makes them, forced as its failure paths do
stager = types.SimpleNamespace(cache_retention=after)
outcomes = [before.release_if_needed(), after.release_if_needed(),
            before.release_if_needed(force=True)]
mr.PinnedModuleStager._release_cache(stager, force=True)
out = os.environ.get("RESIDENCY_DECISIONS_DIR", "")
files = sorted(os.listdir(out)) if out and os.path.isdir(out) else []
lines = [json.loads(x) for f in files for x in open(os.path.join(out, f))]
print(json.dumps({
    "file": mr.__file__, "installed_file": str(upstream_file.installed_file()),
    "version": adapter.upstream_version(), "unpatched": unpatched,
    "calls_unpatched": calls_unpatched, "patched": Cache.release_if_needed is not original,
    "outcomes": outcomes, "platform_calls": platform.empty_cache_calls - calls_unpatched,
    "device_module_calls": npu.empty_cache_calls, "files": files, "lines": lines}))
'''

CONTRACT_KEYS = {"rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason",
                 "start_ns", "end_ns", "wall_ns", "snapshot", "error", "max_cached_fraction",
                 "min_free_fraction"}


@dataclass(frozen=True)
class ArmCase:
    arm: str
    normal_outcome: str
    normal_reason: str


ARM_CASES = [
    ArmCase("candidate", "retained", "within-bounds"),
    ArmCase("baseline", "released", "telemetry-unavailable"),
    ArmCase("always-release", "released", "always-release"),
]


def _run(subprocess_python, tmp_path: Path, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items()
            if k not in ("RESIDENCY_ARM", "RESIDENCY_DECISIONS_DIR", "RANK", "LOCAL_RANK")}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess_python(EXERCISE, env=full)


def test_installed_version_is_the_pinned_one() -> None:
    assert _installed() == UPSTREAM_VERSION, (
        f"tests were written against vllm-omni {UPSTREAM_VERSION}, {_installed()} is installed")


@pytest.mark.parametrize("case", ARM_CASES, ids=lambda c: c.arm)
def test_every_arm_against_the_real_upstream_class(subprocess_python, tmp_path: Path,
                                                   case: ArmCase) -> None:
    decisions = tmp_path / "decisions"
    out = _run(subprocess_python, tmp_path, RESIDENCY_ARM=case.arm,
               RESIDENCY_DECISIONS_DIR=str(decisions), RANK="3")
    # the real file of the installed wheel ran, and the adapter saw its version
    assert out["file"] == out["installed_file"] and out["version"] == UPSTREAM_VERSION
    assert out["file"].endswith("vllm_omni/diffusion/offloader/module_residency.py")
    # upstream's own policy on this device: its torch.accelerator query raises -> releases
    assert out["unpatched"] == [True, True] and out["calls_unpatched"] == 2
    assert out["patched"]
    released = case.normal_outcome == "released"
    assert out["outcomes"] == [released, released, True]
    # every release went through upstream's current_omni_platform.empty_cache()
    assert out["platform_calls"] == 2 + 2 * released
    assert out["device_module_calls"] == out["platform_calls"] + 2
    assert out["files"] == [decisions_file(3)]
    lines = out["lines"]
    assert len(lines) == 4 and all(set(x) == CONTRACT_KEYS for x in lines)
    assert [x["kind"] for x in lines] == ["normal", "normal", "forced", "forced"]
    assert all(x["arm"] == case.arm and x["rank"] == 3 and x["device_kind"] == "npu"
               for x in lines)
    # the bounds of each real instance: upstream's defaults, and the one passed to it
    assert [x["max_cached_fraction"] for x in lines] == [0.25, 0.5, 0.25, 0.5]
    for normal in lines[:2]:
        assert (normal["outcome"], normal["reason"]) == (case.normal_outcome,
                                                         case.normal_reason)
    if case.arm == "candidate":  # the registered module's telemetry, read by the candidate
        gib = 1024**3
        assert all(x["snapshot"] == {"reserved": 12 * gib, "allocated": 10 * gib,
                                     "free": 40 * gib, "total": 64 * gib} for x in lines[:2])
        assert all(x["error"] is None for x in lines)
    else:
        assert all(x["snapshot"] is None for x in lines[:2])
    if case.arm == "baseline":
        assert all("Allocator for npu is not a DeviceAllocator" in x["error"] for x in lines[:2])
    for forced in lines[2:]:  # forced calls release without reading telemetry
        assert (forced["outcome"], forced["reason"], forced["snapshot"]) == (
            "released", "forced", None)


def test_check_upstream_accepts_the_real_class(subprocess_python, tmp_path: Path) -> None:
    code = '''
import json
from residency.adapters import upstream_file
from residency.adapters import vllm_omni as adapter
module = upstream_file.load_module_residency()
cls = adapter.check_upstream(module)
print(json.dumps({"class": cls.__qualname__, "version": adapter.upstream_version()}))
'''
    out = subprocess_python(code, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out == {"class": "BoundedAllocatorCache", "version": UPSTREAM_VERSION}
