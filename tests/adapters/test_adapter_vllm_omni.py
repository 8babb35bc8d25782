"""The vLLM-Omni adapter against stand-in packages shaped like upstream's module_residency.

Every case that imports the stand-in runs in a fresh interpreter: the adapter patches a class
and the emulated NPU renames torch's PrivateUse1 backend, both process-global.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from residency.adapters import vllm_omni as adapter
from residency.records.decisions import decisions_file
from tests.helpers import ROOT

STANDIN_VERSION = "0.0.0+standin"

# Written from the fixed-bounds class at vllm-project/vllm-omni 08dd3091 (same shape, own code).
PLATFORM = '''
import torch

class _Platform:
    """What module_residency uses of vllm_omni.platforms.current_omni_platform."""

    def __init__(self):
        self.empty_cache_calls = 0

    def get_device_memory(self, device=None):
        return torch.get_device_module(device).mem_get_info(device)

    def empty_cache(self):
        self.empty_cache_calls += 1


current_omni_platform = _Platform()
'''

INIT_FIXED = '''
    def __init__(self, device, *, max_cached_fraction=0.25, min_free_fraction=0.05):
        self.device = device
        self.max_cached_fraction = max_cached_fraction
        self.min_free_fraction = min_free_fraction
'''

SHOULD_RELEASE = '''
    def _should_release(self):
        cached = max(0, int(torch.accelerator.memory_reserved(self.device))
                     - int(torch.accelerator.memory_allocated(self.device)))
        free, total = current_omni_platform.get_device_memory(self.device)
        return (cached > int(total * self.max_cached_fraction)
                or free < int(total * self.min_free_fraction))
'''

RELEASE = '''
    def release_if_needed(self, *, force=False):
        if not force:
            try:
                if not self._should_release():
                    return False
            except Exception:
                pass
        current_omni_platform.empty_cache()
        return True
'''

# Written from the learned-budget class at vllm-project/vllm-omni 6a9867f3 (PR #6629).
LEARNED = '''
    def __init__(self, device, *, min_free_fraction=0.05):
        self.device = device
        self.min_free_fraction = min_free_fraction
        self._staged_bytes = 0
        self._observed_cached_peak = 0

    def grow_retention_budget(self, staged_bytes):
        self._staged_bytes += int(staged_bytes)

    def shrink_retention_budget(self, staged_bytes):
        self._staged_bytes = max(0, self._staged_bytes - int(staged_bytes))

    @property
    def budget_bytes(self):
        return int(self._observed_cached_peak * 1.25)
'''

VARIANTS = {
    "fixed": INIT_FIXED + SHOULD_RELEASE + RELEASE,
    "learned": LEARNED + RELEASE,
    "no-should-release": INIT_FIXED + RELEASE,
    "no-force": INIT_FIXED + SHOULD_RELEASE + RELEASE.replace("*, force=False", "flush=False")
    .replace("not force", "not flush"),
    "no-max-cached": INIT_FIXED.replace("max_cached_fraction=0.25, ", "") + RELEASE,
}


def make_standin(root: Path, variant: str) -> Path:
    """A `vllm_omni` package under `root` whose module_residency has the `variant` shape."""
    package = root / "vllm_omni"
    offloader = package / "diffusion" / "offloader"
    offloader.mkdir(parents=True)
    for directory in (package, package / "diffusion", offloader):
        (directory / "__init__.py").write_text("")
    body = "" if variant == "no-class" else "\n\nclass BoundedAllocatorCache:\n" + VARIANTS[variant]
    (offloader / "module_residency.py").write_text(PLATFORM + body)
    info = root / f"vllm_omni-{STANDIN_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm-omni\nVersion: {STANDIN_VERSION}\n")
    return root


# An emulated NPU: the registered module answers, torch.accelerator raises the real
# "Allocator for npu is not a DeviceAllocator" error (the bug both arms must show).
EMULATED_NPU = '''
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
npu.empty_cache = lambda: None
torch._register_device_module("npu", npu)
'''

EXERCISE = EMULATED_NPU + '''
from vllm_omni.diffusion.offloader import module_residency as mr
from residency.adapters import vllm_omni as adapter
Cache = mr.BoundedAllocatorCache
original = Cache.release_if_needed
before = Cache(torch.device("npu:0"))
os.environ["RANK"] = os.environ.get("LATE_RANK", "")   # the rank is read at the first call
adapter.register()
patched = Cache.release_if_needed
adapter.register()                                     # idempotent
after = Cache(torch.device("npu:0"), max_cached_fraction=0.5)
outcomes = [before.release_if_needed(), after.release_if_needed(),
            before.release_if_needed(force=True), after.release_if_needed(force=True)]
switch = None
if os.environ.get("RESIDENCY_ARM"):
    os.environ["RESIDENCY_ARM"] = "always-release" if os.environ["RESIDENCY_ARM"] != \
        "always-release" else "candidate"
    try:
        adapter.register()
    except RuntimeError as exc:
        switch = str(exc)
out = os.environ.get("RESIDENCY_DECISIONS_DIR", "")
files = sorted(os.listdir(out)) if out and os.path.isdir(out) else []
lines = [json.loads(x) for f in files for x in open(os.path.join(out, f))]
print(json.dumps({
    "patched": patched is not original, "stable": Cache.release_if_needed is patched,
    "wrapped": getattr(patched, "__wrapped__", None) is original,
    "outcomes": outcomes, "empty_cache_calls": mr.current_omni_platform.empty_cache_calls,
    "files": files, "lines": lines, "switch": switch}))
'''

CONTRACT_KEYS = {"rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason",
                 "start_ns", "end_ns", "wall_ns", "snapshot", "error", "max_cached_fraction",
                 "min_free_fraction"}


def run_standin(run: Callable[..., dict], tmp_path: Path, variant: str, code: str,
                **env: str) -> dict:
    """Run `code` with the stand-in and this checkout on PYTHONPATH and `env` set."""
    standin = make_standin(tmp_path / "standin", variant)
    full = {k: v for k, v in os.environ.items()
            if k not in ("RESIDENCY_ARM", "RESIDENCY_DECISIONS_DIR", "RANK", "LOCAL_RANK")}
    full.update(env, PYTHONPATH=os.pathsep.join([str(standin), str(ROOT)]))
    return run(code, env=full)


@dataclass(frozen=True)
class ArmCase:
    arm: str
    normal_outcome: str
    normal_reason: str
    snapshot: bool


ARM_CASES = [
    ArmCase("candidate", "retained", "within-bounds", True),
    ArmCase("baseline", "released", "telemetry-unavailable", False),
    ArmCase("always-release", "released", "always-release", False),
]


@pytest.mark.parametrize("case", ARM_CASES, ids=lambda c: c.arm)
def test_arm_patches_class_and_records_every_call(subprocess_python, tmp_path: Path,
                                                  case: ArmCase) -> None:
    decisions = tmp_path / "decisions"
    out = run_standin(subprocess_python, tmp_path, "fixed", EXERCISE, RESIDENCY_ARM=case.arm,
                      RESIDENCY_DECISIONS_DIR=str(decisions), LATE_RANK="5")
    assert out["patched"] and out["stable"] and out["wrapped"]
    released = case.normal_outcome == "released"
    assert out["outcomes"] == [released, released, True, True]
    assert out["empty_cache_calls"] == 2 + 2 * released   # through upstream's release path
    assert out["files"] == [decisions_file(5)]       # rank read lazily, at the first call
    lines = out["lines"]
    assert len(lines) == 4                                 # one line per call, no double wrap
    assert all(set(line) == CONTRACT_KEYS for line in lines)
    assert [x["kind"] for x in lines] == ["normal", "normal", "forced", "forced"]
    assert all(x["rank"] == 5 and x["arm"] == case.arm and x["device_kind"] == "npu"
               and x["request_id"] is None for x in lines)
    assert [x["max_cached_fraction"] for x in lines] == [0.25, 0.5, 0.25, 0.5]
    assert all(x["min_free_fraction"] == 0.05 for x in lines)
    for normal in lines[:2]:
        assert (normal["outcome"], normal["reason"]) == (case.normal_outcome, case.normal_reason)
        assert (normal["snapshot"] is not None) == case.snapshot
    if case.arm == "baseline":
        assert "Allocator for npu is not a DeviceAllocator" in lines[0]["error"]
    if case.snapshot:
        assert lines[0]["snapshot"] == {"reserved": 12 * 1024**3, "allocated": 10 * 1024**3,
                                        "free": 40 * 1024**3, "total": 64 * 1024**3}
    for forced in lines[2:]:
        assert (forced["outcome"], forced["reason"], forced["snapshot"]) == (
            "released", "forced", None)
        assert forced["end_ns"] >= forced["start_ns"] and forced["wall_ns"] > 0
    assert "already patched for arm" in out["switch"]


def test_rank_falls_back_to_local_rank(subprocess_python, tmp_path: Path) -> None:
    decisions = tmp_path / "decisions"
    out = run_standin(subprocess_python, tmp_path, "fixed", EXERCISE, RESIDENCY_ARM="candidate",
                      RESIDENCY_DECISIONS_DIR=str(decisions), LOCAL_RANK="2")
    assert out["files"] == [decisions_file(2)]


def test_unset_arm_leaves_upstream_untouched(subprocess_python, tmp_path: Path) -> None:
    decisions = tmp_path / "decisions"
    out = run_standin(subprocess_python, tmp_path, "fixed", EXERCISE,
                      RESIDENCY_DECISIONS_DIR=str(decisions))
    assert not out["patched"] and out["files"] == [] and out["switch"] is None
    # upstream's own telemetry hits the NPU bug and releases on every normal call
    assert out["outcomes"] == [True, True, True, True]


def test_arm_without_decisions_dir_applies_but_records_nothing(subprocess_python,
                                                              tmp_path: Path) -> None:
    out = run_standin(subprocess_python, tmp_path, "fixed", EXERCISE, RESIDENCY_ARM="candidate")
    assert out["patched"] and out["outcomes"] == [False, False, True, True]
    assert out["files"] == []


# One interpreter tries every refused shape in turn (torch imports once).
REFUSE = '''
import importlib, json, sys
from residency.adapters import vllm_omni as adapter
results = {}
for variant, root in json.loads(sys.argv[1]).items():
    for name in [m for m in sys.modules if m.split(".")[0] == "vllm_omni"]:
        del sys.modules[name]
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    try:
        adapter.register()
        results[variant] = {"error": None}
    except adapter.UnsupportedUpstream as exc:
        results[variant] = {"error": str(exc), "missing": exc.missing, "version": exc.version,
                            "runtime_error": isinstance(exc, RuntimeError)}
    sys.path.remove(root)
print(json.dumps(results))
'''

REFUSED = {
    "learned": "BoundedAllocatorCache.max_cached_fraction",
    "no-should-release": "BoundedAllocatorCache._should_release",
    "no-force": "BoundedAllocatorCache.release_if_needed(force)",
    "no-max-cached": "BoundedAllocatorCache.__init__(max_cached_fraction)",
    "no-class": "vllm_omni.diffusion.offloader.module_residency.BoundedAllocatorCache",
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What `register()` raised for each refused stand-in shape."""
    roots = {variant: str(make_standin(tmp_path_factory.mktemp(variant), variant))
             for variant in REFUSED}
    env = {k: v for k, v in os.environ.items() if k != "RESIDENCY_DECISIONS_DIR"}
    env.update(RESIDENCY_ARM="candidate", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", REFUSE, json.dumps(roots)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("variant", "missing"), REFUSED.items())
def test_unrecognised_upstream_is_refused_by_name_and_version(
        refusals: dict, variant: str, missing: str) -> None:
    out = refusals[variant]
    assert out["error"] is not None, f"{variant} stand-in was accepted"
    assert out["runtime_error"] and out["missing"] == missing
    assert out["version"] == STANDIN_VERSION
    assert f"`{missing}`" in out["error"] and STANDIN_VERSION in out["error"]
    if variant == "learned":
        assert "learned retention budget" in out["error"]


def test_unknown_arm_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(adapter.ARM_ENV, "fast")
    with pytest.raises(ValueError, match="must be one of"):
        adapter.register()


def test_unset_arm_logs_once(monkeypatch: pytest.MonkeyPatch,
                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(adapter.ARM_ENV, raising=False)
    monkeypatch.setattr(adapter, "_logged", set())
    with caplog.at_level(logging.INFO, logger=adapter.__name__):
        adapter.register()
        adapter.register()
    assert len(caplog.records) == 1
    assert "RESIDENCY_ARM is unset" in caplog.records[0].getMessage()


def test_entry_point_resolves_to_register() -> None:
    points = importlib.metadata.entry_points(group="vllm_omni.general_plugins")
    (point,) = [p for p in points if p.name == "residency"]
    assert point.value == "residency.adapters.vllm_omni:register"
    assert point.load() is adapter.register
