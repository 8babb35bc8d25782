"""Fault injection for selftest tests: put this folder first on PYTHONPATH and name faults in
`RESIDENCY_TEST_FAULTS` (comma-separated). Every interpreter started with that environment
(the selftest, the services it starts, their spawned ranks) patches the named module right
after it is imported; nothing else changes.

Faults in the selftest's own process: `environment`, `probe`, `policy`, `adapter`, `verify`.
Faults in the service's rank processes: `profiler-empty` (the profiler writes nothing),
`profiler-garbled` (it writes truncated JSON), `rank-fail` (the last rank's process dies at the
start of the measured request).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

FAULTS = {f.strip() for f in os.environ.get("RESIDENCY_TEST_FAULTS", "").split(",") if f.strip()}


def in_selftest():
    """True in the selftest's own process (not in the services it starts)."""
    return "selftest" in sys.argv


def _selftest(module):
    if "environment" in FAULTS:
        def collect_environment(kind, device_count):
            raise PermissionError("injected fault: cannot read the toolkit's version file")
        module.collect_environment = collect_environment


def _device(module):
    if "probe" in FAULTS and in_selftest():
        def memory_allocated(self, device=None):
            raise RuntimeError("injected fault: the driver refuses memory_allocated")
        module.EmulatedNPU.memory_allocated = memory_allocated
    if "policy" in FAULTS and in_selftest():
        module.EmulatedNPU.empty_cache = lambda self: None  # releases nothing


def _adapter(module):
    if "adapter" in FAULTS and in_selftest():
        def check_upstream(upstream):
            raise module.UnsupportedUpstream("BoundedAllocatorCache._should_release", "0.30.0",
                                             "is missing (injected fault)")
        module.check_upstream = check_upstream


def _experiments(module):
    if "verify" in FAULTS and in_selftest():
        original = module.run_design

        def run_design(design, out, **kw):
            result = original(design, out, **kw)
            client = sorted(Path(out).glob("runs/*/client.json"))[0]
            client.write_text(client.read_text() + "\n")  # changed after the run was sealed
            return result
        module.run_design = run_design


def _profiling(module):
    stop = module.EmulatedProfiler._stop

    def stop_faulty(self, out):
        if "profiler-empty" in FAULTS:
            self.module.stop_trace()  # stops recording, exports nothing
            return
        stop(self, out)
        if "profiler-garbled" in FAULTS:
            for path in out.glob("rank*.trace.json"):
                path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    if FAULTS & {"profiler-empty", "profiler-garbled"}:
        module.EmulatedProfiler._stop = stop_faulty


def _workload(module):
    if "rank-fail" in FAULTS:
        run = module.Pipeline.run

        def run_faulty(self, request_id, **kw):
            if self.rank == self.world_size - 1 and request_id.startswith("r"):
                print(f"injected fault: rank {self.rank} exits", file=sys.stderr, flush=True)
                os._exit(3)  # the rank process dies mid-request
            return run(self, request_id, **kw)
        module.Pipeline.run = run_faulty


PATCHES = {"residency.selftest.environment": _selftest, "residency.emulated.device": _device,
           "residency.adapters.vllm_omni": _adapter,
           "residency.experiments.designs": _experiments,
           "residency.workload.profiling": _profiling, "residency.workload.pipeline": _workload}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)
        spec.loader.exec_module = exec_and_patch
        return spec


if FAULTS:
    sys.meta_path.insert(0, _PatchAfterImport())
