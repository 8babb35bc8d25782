"""The retention policy: bounds, forced release, telemetry failure, arms (CPU only)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from residency import BoundedAllocatorCache, MemorySnapshot, policy_for
from residency.policy.cache import JsonlRecorder, ListRecorder, retains
from residency.policy.telemetry import TelemetryUnavailable
from residency.records import decisions as decisions_format
from residency.records.decisions import decisions_file

GiB = 1024**3
TOTAL = 64 * GiB


class FixedTelemetry:
    """Returns one snapshot, counting reads."""

    name = "fixed"

    def __init__(self, snapshot: MemorySnapshot) -> None:
        self.snapshot_value = snapshot
        self.reads = 0

    def snapshot(self, device):
        self.reads += 1
        return self.snapshot_value


class BrokenTelemetry:
    name = "broken"

    def snapshot(self, device):
        raise TelemetryUnavailable("registered", "RuntimeError", "device lost")


def make(telemetry, **kw):
    released = []
    recorder = ListRecorder()
    policy = BoundedAllocatorCache("cpu", telemetry=telemetry, release=lambda: released.append(1),
                                   recorder=recorder, rank=0, **kw)
    return policy, released, recorder


def snap(*, cached: int, free: int, allocated: int = 10 * GiB) -> MemorySnapshot:
    return MemorySnapshot(reserved=allocated + cached, allocated=allocated, free=free,
                          total=TOTAL)


@dataclass(frozen=True)
class Case:
    name: str
    snapshot: MemorySnapshot
    released: bool
    reason: str


CASES = [
    Case("retains well within bounds", snap(cached=1 * GiB, free=20 * GiB), False,
         "within-bounds"),
    Case("cached exactly 25 % retains", snap(cached=int(TOTAL * 0.25), free=20 * GiB), False,
         "within-bounds"),
    Case("cached one byte over 25 % releases", snap(cached=int(TOTAL * 0.25) + 1, free=20 * GiB),
         True, "cached-bound"),
    Case("free exactly 5 % retains", snap(cached=1 * GiB, free=int(TOTAL * 0.05)), False,
         "within-bounds"),
    Case("free one byte under 5 % releases", snap(cached=1 * GiB, free=int(TOTAL * 0.05) - 1),
         True, "free-bound"),
    Case("far above the cached threshold releases", snap(cached=40 * GiB, free=10 * GiB), True,
         "cached-bound"),
    Case("far below the free threshold releases", snap(cached=0, free=0), True, "free-bound"),
    Case("reserved below allocated counts as zero cached",
         MemorySnapshot(reserved=1 * GiB, allocated=2 * GiB, free=20 * GiB, total=TOTAL), False,
         "within-bounds"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bounds(case: Case) -> None:
    policy, released, recorder = make(FixedTelemetry(case.snapshot))
    assert policy.release_if_needed() is case.released
    assert len(released) == int(case.released)
    (decision,) = recorder.decisions
    assert (decision.kind, decision.reason, decision.snapshot) == ("normal", case.reason,
                                                                   case.snapshot)
    assert decision.outcome == ("released" if case.released else "retained")
    assert decision.end_ns >= decision.start_ns


def test_telemetry_unavailable_releases_and_records_error() -> None:
    policy, released, recorder = make(BrokenTelemetry())
    assert policy.release_if_needed() is True
    assert released == [1]
    (decision,) = recorder.decisions
    assert decision.reason == "telemetry-unavailable"
    assert decision.snapshot is None
    assert "RuntimeError: device lost" in decision.error


class ForeignTelemetry:
    """A third-party telemetry that raises its own exceptions, not TelemetryUnavailable."""

    name = "third-party"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def snapshot(self, device):
        raise self.exc


@pytest.mark.parametrize("exc", [RuntimeError("driver reset"), KeyError("reserved"),
                                 ZeroDivisionError("total is 0")])
def test_any_telemetry_exception_releases_and_records_type_and_message(exc) -> None:
    # the contract says any telemetry failure releases: narrowing the catch back to
    # TelemetryUnavailable lets these escape release_if_needed (and crash an offload path)
    policy, released, recorder = make(ForeignTelemetry(exc))
    assert policy.release_if_needed() is True
    assert released == [1]
    (decision,) = recorder.decisions
    assert (decision.outcome, decision.reason, decision.snapshot) == (
        "released", "telemetry-unavailable", None)
    assert decision.error == (f"third-party telemetry unavailable: {type(exc).__name__}: "
                              f"{exc}")


def test_bounds_rule_is_one_function_for_scalars_and_arrays() -> None:
    import numpy as np

    from residency.policy.cache import crossed_bounds

    total = np.array([100, 100, 100, 1000], dtype=np.int64)
    cached = np.array([25, 26, 0, 250])
    free = np.array([50, 50, 4, 50])
    over, under = crossed_bounds(cached, free, total, 0.25, 0.05)
    assert over.tolist() == [False, True, False, False]  # equality retains
    assert under.tolist() == [False, False, True, False]
    for i in range(4):
        assert crossed_bounds(int(cached[i]), int(free[i]), int(total[i]), 0.25, 0.05) == (
            over[i], under[i])


def test_forced_release_bypasses_telemetry() -> None:
    telemetry = FixedTelemetry(snap(cached=0, free=30 * GiB))
    policy, released, recorder = make(telemetry)
    assert policy.release_if_needed(force=True) is True
    assert telemetry.reads == 0 and released == [1]
    assert recorder.decisions[0].kind == "forced" and recorder.decisions[0].reason == "forced"


def test_forced_release_works_with_broken_telemetry() -> None:
    policy, released, recorder = make(BrokenTelemetry())
    assert policy.release_if_needed(force=True) is True
    assert recorder.decisions[0].error is None


@pytest.mark.parametrize("name", ["max_cached_fraction", "min_free_fraction"])
@pytest.mark.parametrize("value", [-0.01, 1.5, float("nan"), "0.25"])
def test_fraction_out_of_range_names_parameter(name: str, value) -> None:
    with pytest.raises(ValueError, match=name):
        BoundedAllocatorCache("cpu", **{name: value})


def test_device_type_without_module_releases_and_records_error() -> None:
    released = []
    recorder = ListRecorder()
    policy = policy_for("candidate", "meta", release=lambda: released.append(1),
                        recorder=recorder, rank=0)
    assert policy.release_if_needed() is True
    assert recorder.decisions[0].reason == "telemetry-unavailable"
    assert recorder.decisions[0].error


def test_always_release_arm_releases_without_telemetry() -> None:
    telemetry = FixedTelemetry(snap(cached=0, free=30 * GiB))
    released = []
    policy = policy_for("always-release", "cpu", telemetry=telemetry,
                        release=lambda: released.append(1), rank=0)
    assert policy.release_if_needed() is True
    assert telemetry.reads == 0 and policy.last_decision.reason == "always-release"


def test_unknown_arm() -> None:
    with pytest.raises(ValueError, match="arm"):
        policy_for("fast", "cpu")


def test_jsonl_recorder_lines_replay_to_their_outcome(tmp_path) -> None:
    recorder = JsonlRecorder(tmp_path / decisions_file(0), device_kind="emulated-npu")
    policy = BoundedAllocatorCache("cpu", telemetry=FixedTelemetry(snap(cached=0, free=30 * GiB)),
                                   release=lambda: None, recorder=recorder, rank=3,
                                   arm="candidate")
    recorder.set_context(request_id="r0001")
    policy.release_if_needed()
    policy.release_if_needed(force=True)
    recorder.close()
    lines = decisions_format.read_records(tmp_path / decisions_format.decisions_file(0))
    assert [x["kind"] for x in lines] == ["normal", "forced"]
    assert lines[0]["request_id"] == "r0001" and lines[0]["rank"] == 3
    assert set(lines[0]["snapshot"]) == {"reserved", "allocated", "free", "total"}
    again = retains(MemorySnapshot.from_dict(lines[0]["snapshot"]),
                    lines[0]["max_cached_fraction"], lines[0]["min_free_fraction"])
    assert (again, lines[0]["outcome"]) == ("within-bounds", "retained")
    assert lines[1]["snapshot"] is None and lines[1]["reason"] == "forced"


# --- NPU: the fix reads the registered device module, never torch.accelerator -----------------
# The PrivateUse1 rename is process-global and irreversible: it runs in a subprocess.
NPU_EXPECTATIONS = r"""
import json, types, torch
torch.utils.rename_privateuse1_backend("npu")
GiB = 1024**3
calls = []
mod = types.ModuleType("fake_npu")
mod.is_available = lambda: True
mod.device_count = lambda: 1
mod.current_device = lambda: 0
def rec(name, value):
    def f(device=None):
        calls.append((name, str(device)))
        return value
    return f
mod.memory_allocated = rec("memory_allocated", 10 * GiB)
mod.memory_reserved = rec("memory_reserved", 12 * GiB)
mod.mem_get_info = rec("mem_get_info", (40 * GiB, 64 * GiB))
mod.empty_cache = lambda: calls.append(("empty_cache", None))
torch._register_device_module("npu", mod)
generic_calls = []
for name in ("memory_allocated", "memory_reserved", "memory_stats"):
    real = getattr(torch.accelerator, name)
    def spy(*a, _real=real, _name=name, **k):
        generic_calls.append(_name)
        return _real(*a, **k)
    setattr(torch.accelerator, name, spy)

from residency import policy_for
from residency.policy.cache import ListRecorder

def expectations(arm):
    calls.clear(); generic_calls.clear()
    rec_ = ListRecorder()
    p = policy_for(arm, torch.device("npu:0"), recorder=rec_, rank=0)
    released = p.release_if_needed()
    d = rec_.decisions[0]
    failures = []
    if released: failures.append(f"released ({d.reason}: {d.error})")
    if ("memory_allocated", "npu:0") not in calls: failures.append("module.memory_allocated unused")
    if ("memory_reserved", "npu:0") not in calls: failures.append("module.memory_reserved unused")
    if generic_calls: failures.append(f"generic queries called: {generic_calls}")
    if d.snapshot is None or d.snapshot.cached != 2 * GiB: failures.append("snapshot wrong")
    return failures, d.error

out = {arm: expectations(arm) for arm in ("candidate", "baseline")}
print(json.dumps(out))
"""


def test_npu_candidate_uses_registered_module_and_baseline_fails_the_same_checks(
        subprocess_python) -> None:
    out = subprocess_python(NPU_EXPECTATIONS)
    candidate_failures, candidate_error = out["candidate"]
    assert candidate_failures == [] and candidate_error is None
    # the same expectations against the pre-fix arm must fail: the tests catch a revert
    baseline_failures, baseline_error = out["baseline"]
    assert baseline_failures, "baseline arm passed the NPU expectations: the test cannot fail"
    assert any("generic queries called" in f for f in baseline_failures)
    assert "Allocator for npu is not a DeviceAllocator" in baseline_error
