"""The release cost curve: `empty_cache` with C GiB cached, and re-acquiring C GiB after it.

On the device at hand (CUDA, a real NPU, or the emulated NPU in a subprocess made for it),
for C over a range up to the policy's 25 % cached bound (or `--max-gib`), each sample:

1. allocates C GiB in `--block-mib` blocks and frees them (C GiB cached), synchronizes;
2. times `empty_cache()` (synchronized): the release;
3. times allocating the same blocks again (synchronized): the re-acquire;
4. frees them and times allocating them once more from the cache: the reuse, for contrast.

It prints each size's medians as ms and ms per GiB, the least-squares line of release and
re-acquire time on GiB (with n), writes every sample to `release_cost.csv` and, when
matplotlib imports, the figure `release_cost.png` into `--out`. The emulated NPU's device
model reads the CSV back: `residency pair --release-curve release_cost.csv` (see README).

    python benchmarks/release_cost.py [--device auto|cuda|npu|emulated-npu] [--out DIR]
        [--max-gib G] [--points 6] [--repeats 3] [--block-mib 128] [--capacity BYTES]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from residency import devices
from residency.devicemodel import DEFAULT_CAPACITY_BYTES, fit_line
from residency.policy.cache import DEFAULT_MAX_CACHED_FRACTION, limit_bytes

GiB = 1 << 30
MiB = 1 << 20
CSV_NAME = "release_cost.csv"
PNG_NAME = "release_cost.png"
COLUMNS = ("device_kind", "device_name", "total_bytes", "block_bytes", "cached_gib", "repeat",
           "release_ms", "reacquire_ms", "reuse_ms")
IN_PROCESS = "--in-process"  # internal: this process was made for the device


@dataclass(frozen=True)
class Device:
    """What the benchmark does on one device: allocate a block, drop it, sync, release."""

    kind: str
    name: str
    total_bytes: int
    free_bytes: Callable[[], int]
    allocate: Callable[[int], Any]
    drop: Callable[[Any], None]
    synchronize: Callable[[], None]
    empty_cache: Callable[[], None]


def open_device(kind: str, capacity_bytes: int | None) -> Device:
    """Device 0 of `kind` (the emulated NPU installed in this process)."""
    import torch

    if devices.emulated(kind):
        from residency.emulated import install_emulated_npu

        module = install_emulated_npu(capacity_bytes=capacity_bytes or DEFAULT_CAPACITY_BYTES)
        dev = devices.torch_device(kind, 0)
        return Device(kind, module.get_device_name(0), module.capacity_bytes,
                      lambda: int(module.mem_get_info(dev)[0]),
                      lambda n: module.empty(n, dtype=torch.uint8, device=dev),
                      lambda t: t.free(), lambda: module.synchronize(dev), module.empty_cache)
    devices.load_device_package(kind)
    dev = devices.torch_device(kind, 0)
    module = torch.get_device_module(dev)
    module.set_device(0)
    return Device(kind, str(module.get_device_name(0)), int(module.mem_get_info(dev)[1]),
                  lambda: int(module.mem_get_info(dev)[0]),
                  lambda n: torch.empty(n, dtype=torch.uint8, device=dev),
                  lambda t: None, lambda: module.synchronize(dev), module.empty_cache)


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[float, Any]:
    sync()
    start = time.perf_counter_ns()
    out = fn()
    sync()
    return (time.perf_counter_ns() - start) / 1e6, out


def sample(device: Device, nbytes: int, block_bytes: int) -> tuple[float, float, float]:
    """(release_ms, reacquire_ms, reuse_ms) with `nbytes` cached in `block_bytes` blocks."""
    count = max(1, nbytes // block_bytes)

    def allocate() -> list[Any]:
        return [device.allocate(block_bytes) for _ in range(count)]

    def drop(blocks: list[Any]) -> None:
        for b in blocks:
            device.drop(b)
        blocks.clear()

    device.empty_cache()
    blocks = allocate()
    drop(blocks)                                             # nbytes cached
    release_ms, _ = _timed(device.empty_cache, device.synchronize)
    reacquire_ms, blocks = _timed(allocate, device.synchronize)
    drop(blocks)
    reuse_ms, blocks = _timed(allocate, device.synchronize)  # from the cache
    drop(blocks)
    device.empty_cache()
    return release_ms, reacquire_ms, reuse_ms


def sizes(max_bytes: int, points: int, block_bytes: int) -> list[int]:
    """`points` sizes evenly spaced up to `max_bytes`, whole blocks, distinct, >= 1 block."""
    out = sorted({max(1, round(max_bytes * i / points / block_bytes)) * block_bytes
                  for i in range(1, points + 1)})
    return out


def measure(device: Device, *, max_bytes: int, points: int, repeats: int,
            block_bytes: int) -> list[dict[str, Any]]:
    """Every sample as a CSV row; sizes over the device's free memory are left out."""
    rows = []
    for nbytes in sizes(max_bytes, points, block_bytes):
        device.empty_cache()
        if nbytes > device.free_bytes() - block_bytes:
            print(f"  {nbytes / GiB:.3f} GiB: skipped, more than the free memory "
                  f"({device.free_bytes() / GiB:.3f} GiB)")
            continue
        for repeat in range(repeats):
            release_ms, reacquire_ms, reuse_ms = sample(device, nbytes, block_bytes)
            rows.append({"device_kind": device.kind, "device_name": device.name,
                         "total_bytes": device.total_bytes, "block_bytes": block_bytes,
                         "cached_gib": nbytes / GiB, "repeat": repeat,
                         "release_ms": release_ms, "reacquire_ms": reacquire_ms,
                         "reuse_ms": reuse_ms})
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    """The printed summary: per size medians (ms, ms per GiB), then the fitted lines."""
    if not rows:
        return ["no sample: every size was over the free memory"]
    first = rows[0]
    lines = [f"{first['device_kind']} ({devices.label(first['device_kind'])}), "
             f"{first['device_name']}: capacity {first['total_bytes'] / GiB:.2f} GiB, blocks "
             f"of {first['block_bytes'] / MiB:g} MiB, medians of "
             f"{len([r for r in rows if r['cached_gib'] == first['cached_gib']])} repeats",
             f"{'cached GiB':>10} {'release ms':>11} {'ms/GiB':>8} {'re-acquire ms':>14} "
             f"{'ms/GiB':>8} {'reuse ms':>9}"]
    for gib in sorted({r["cached_gib"] for r in rows}):
        at = [r for r in rows if r["cached_gib"] == gib]
        rel = statistics.median(r["release_ms"] for r in at)
        acq = statistics.median(r["reacquire_ms"] for r in at)
        reuse = statistics.median(r["reuse_ms"] for r in at)
        lines.append(f"{gib:>10.3f} {rel:>11.3f} {rel / gib:>8.3f} {acq:>14.3f} "
                     f"{acq / gib:>8.3f} {reuse:>9.3f}")
    xs = [r["cached_gib"] for r in rows]
    for what, key in (("release", "release_ms"), ("re-acquire", "reacquire_ms")):
        try:
            a, b = fit_line(xs, [r[key] for r in rows])
            lines.append(f"{what}: {a:.3f} ms + {b:.3f} ms/GiB x C (least squares, n = "
                         f"{len(rows)} samples at {len(set(xs))} sizes)")
        except ValueError as exc:
            lines.append(f"{what}: no line ({exc})")
    return lines


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """Every sample, one row each (`COLUMNS`)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_figure(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Release and re-acquire time against GiB with their lines; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:
        return None
    xs = [r["cached_gib"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, what, colour in (("release_ms", "empty_cache (release)", "#b91c1c"),
                              ("reacquire_ms", "re-acquire after release", "#1d4ed8"),
                              ("reuse_ms", "reuse from the cache", "#6b7280")):
        ys = [r[key] for r in rows]
        ax.scatter(xs, ys, s=14, color=colour, label=what)
        if key != "reuse_ms" and len(set(xs)) > 1:
            a, b = fit_line(xs, ys)
            top = max(xs)
            ax.plot([0, top], [a, a + b * top], color=colour, lw=1,
                    label=f"{a:.2f} ms + {b:.2f} ms/GiB")
    kind = rows[0]["device_kind"]
    ax.set_xlabel("GiB cached (released, then re-acquired)")
    ax.set_ylabel("ms (synchronized)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(f"Release cost: {kind} ({devices.label(kind)}), {rows[0]['device_name']}\n"
                 f"n = {len(rows)} samples", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=devices.SPECS)
    p.add_argument("--out", default=".", metavar="DIR", help="CSV and PNG go here")
    p.add_argument("--max-gib", type=float, default=None,
                   help="largest size (default: the 25 %% cached bound of the capacity)")
    p.add_argument("--points", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--block-mib", type=float, default=128)
    p.add_argument("--capacity", type=int, default=None, metavar="BYTES",
                   help="emulated NPU capacity (default 4 GiB)")
    p.add_argument(IN_PROCESS, action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    for name in ("points", "repeats"):
        if getattr(args, name) < 1:
            print(f"release_cost: error: --{name} must be >= 1", file=sys.stderr)
            return 2
    if not math.isfinite(args.block_mib) or args.block_mib <= 0:
        print("release_cost: error: --block-mib must be positive", file=sys.stderr)
        return 2
    kind = devices.resolve(args.device)
    if devices.emulated(kind) and not args.in_process:
        # the emulated NPU's registration is process-global: a process made for it
        return subprocess.call([sys.executable, os.path.abspath(__file__), *argv,
                                "--device", kind, IN_PROCESS])
    device = open_device(kind, args.capacity)
    block = int(args.block_mib * MiB)
    max_bytes = (int(args.max_gib * GiB) if args.max_gib is not None
                 else limit_bytes(device.total_bytes, DEFAULT_MAX_CACHED_FRACTION))
    start = time.perf_counter()
    rows = measure(device, max_bytes=max_bytes, points=args.points, repeats=args.repeats,
                   block_bytes=block)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("\n".join(report(rows)))
    print(f"wrote {write_csv(rows, out / CSV_NAME)}")
    figure = write_figure(rows, out / PNG_NAME)
    print(f"wrote {figure}" if figure else "no figure: matplotlib does not import here "
          "(the CSV holds every sample)")
    print(f"measured in {time.perf_counter() - start:.1f} s")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
