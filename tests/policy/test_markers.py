"""Markers reach torch.profiler when it records, and registered sinks always."""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

from residency import markers
from residency.policy.cache import BoundedAllocatorCache
from residency.policy.telemetry import MemorySnapshot


class Instant:
    name = "instant"

    def snapshot(self, device):
        return MemorySnapshot(reserved=0, allocated=0, free=100, total=100)


def test_policy_calls_appear_in_profiler_trace() -> None:
    policy = BoundedAllocatorCache("cpu", telemetry=Instant(), release=lambda: None, rank=0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        policy.release_if_needed()
        policy.release_if_needed(force=True)
    names = {e.name for e in prof.events()}
    assert {markers.RELEASE_NORMAL, markers.RELEASE_FORCED} <= names


def test_sink_receives_ranges_without_profiler() -> None:
    seen = []

    def sink(name, start, end):
        seen.append((name, start, end))

    markers.add_sink(sink)
    try:
        with markers.span(markers.PHASE_PREPARE):
            pass
    finally:
        markers.remove_sink(sink)
    ((name, start, end),) = seen
    assert name == markers.PHASE_PREPARE and end >= start
