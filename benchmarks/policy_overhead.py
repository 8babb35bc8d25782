"""The policy's own cost per normal call (instant telemetry and release), beside one
`torch.get_device_module` lookup. Target: median under 20 us per call on a 2-core machine.

    python benchmarks/policy_overhead.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from residency import BoundedAllocatorCache, MemorySnapshot

SNAPSHOT = MemorySnapshot(reserved=12 << 30, allocated=10 << 30, free=40 << 30, total=64 << 30)


class InstantTelemetry:
    name = "instant"

    def snapshot(self, device: object) -> MemorySnapshot:
        return SNAPSHOT


def per_call_ns(fn, calls: int, batch: int = 100) -> list[float]:
    """Per-call times (ns), each the mean of one batch of `batch` calls."""
    samples = []
    for _ in range(calls // batch):
        start = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter_ns() - start) / batch)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    policy = BoundedAllocatorCache("cpu", telemetry=InstantTelemetry(), release=lambda: None,
                                   rank=0)
    device = torch.device("cpu")
    for fn in (policy.release_if_needed, lambda: torch.get_device_module(device)):
        per_call_ns(fn, 2000)  # warm-up
    policy_ns = statistics.median(per_call_ns(policy.release_if_needed, args.calls))
    lookup_ns = statistics.median(per_call_ns(lambda: torch.get_device_module(device), args.calls))
    n = args.calls // 100
    print(f"policy normal call (retains): median {policy_ns / 1000:.2f} us  (n={n} batches "
          f"of 100 calls; target < 20 us: {'met' if policy_ns < 20_000 else 'NOT met'})")
    print(f"torch.get_device_module:      median {lookup_ns / 1000:.3f} us  (n={n} batches)")
    print(f"ratio policy call / lookup:   {policy_ns / lookup_ns:.1f}x")


if __name__ == "__main__":
    main()
