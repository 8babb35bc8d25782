"""Reusing a cached block vs re-acquiring it after `empty_cache`, on the emulated NPU.

Each sample allocates a block and touches every byte of it from a device task, then
synchronizes: with the block still cached the pages are already mapped; after `empty_cache`
the memory went back to the OS and every page faults again. On the default modelled device
the pages fault in when the block is allocated (the touch task itself is modelled time); with
`--device-compute real` they fault in the touch task. Installs the emulated backend, so run it
in its own process:

    python benchmarks/emulated_allocator.py [--size-mib 512] [--repeats 7]
        [--device-compute modelled|real]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch

from residency.emulated import DeviceModel, EmulatedNPU, install_emulated_npu

_MiB = 1024**2


@dataclass(frozen=True)
class Result:
    """Per-sample durations (ns) of both modes and the RSS around one `empty_cache`."""

    size_bytes: int
    reuse_ns: tuple[int, ...]
    reacquire_ns: tuple[int, ...]
    rss_cached_bytes: int
    rss_released_bytes: int

    @property
    def reuse_median_ms(self) -> float:
        """Median reuse sample, ms."""
        return statistics.median(self.reuse_ns) / 1e6

    @property
    def reacquire_median_ms(self) -> float:
        """Median re-acquire sample, ms."""
        return statistics.median(self.reacquire_ns) / 1e6

    @property
    def ratio(self) -> float:
        """Re-acquire median over reuse median."""
        return self.reacquire_median_ms / self.reuse_median_ms


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sample(npu: EmulatedNPU, size_bytes: int) -> int:
    start_ns = time.perf_counter_ns()
    block = npu.empty((size_bytes,), torch.uint8)
    npu.launch("touch", partial(block.host.fill_, 1))
    npu.synchronize()
    elapsed_ns = time.perf_counter_ns() - start_ns
    block.free()
    return elapsed_ns


def measure(npu: EmulatedNPU, *, size_bytes: int = 512 * _MiB, repeats: int = 7) -> Result:
    """Time `repeats` samples of each mode, alternating, after one warm-up of each."""
    reuse, reacquire = [], []
    _sample(npu, size_bytes)  # warm-up: the block is now cached
    rss_cached = _rss_bytes()
    npu.empty_cache()
    rss_released = _rss_bytes()
    for _ in range(repeats):
        reacquire.append(_sample(npu, size_bytes))  # the cache was emptied just before
        reuse.append(_sample(npu, size_bytes))      # the block freed by the line above
        npu.empty_cache()
    return Result(size_bytes, tuple(reuse), tuple(reacquire), rss_cached, rss_released)


def format_result(result: Result) -> list[str]:
    """Report lines, units and n stated."""
    n = len(result.reuse_ns)
    return [
        f"emulated-npu (host-backed), block {result.size_bytes // _MiB} MiB, n={n} per mode, "
        "alloc + touch every byte + synchronize:",
        f"  reuse cached block     median {result.reuse_median_ms:8.2f} ms  "
        f"(min {min(result.reuse_ns) / 1e6:.2f}, max {max(result.reuse_ns) / 1e6:.2f})",
        f"  re-acquire after empty median {result.reacquire_median_ms:8.2f} ms  "
        f"(min {min(result.reacquire_ns) / 1e6:.2f}, max {max(result.reacquire_ns) / 1e6:.2f})",
        f"  ratio re-acquire/reuse {result.ratio:.2f}x",
        f"  process RSS with the block cached {result.rss_cached_bytes / _MiB:.0f} MiB, "
        f"after empty_cache {result.rss_released_bytes / _MiB:.0f} MiB",
    ]


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device-compute", choices=("modelled", "real"), default="modelled")
    args = parser.parse_args(argv)
    size_bytes = args.size_mib * _MiB
    npu = install_emulated_npu(devices=1, capacity_bytes=max(4 * size_bytes, 1024**3),
                               model=DeviceModel(compute=args.device_compute))
    print(f"device compute: {args.device_compute}")
    for line in format_result(measure(npu, size_bytes=size_bytes, repeats=args.repeats)):
        print(line)


if __name__ == "__main__":
    main()
