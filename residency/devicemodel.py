"""The emulated NPU's device model (torch-free): rates, compute mode, accelerator patch.

The emulated NPU's device model: how long a device task takes, without computing it.

A real accelerator computes on its own silicon while the host goes on; an emulated device
that runs its kernels on host threads competes with the host for the same cores. With
`compute="modelled"` (the default) a stream worker does not compute: it runs the task's
Python with every torch operator intercepted (`ShapeOnlyMode`: outputs get their shapes, no
data is computed), adds up each operator's FLOPs and bytes, and waits out the modelled time

    launch_ns + sum over operators of max(FLOPs / flops_per_s, bytes / bytes_per_s)

(copies: bytes written / link_bytes_per_s) in a sleep, leaving the host's cores free.
Memory stays real: allocations map and fault their pages on the host (`prefault`), and
`empty_cache` unmaps them, since that host-side cost is what the retention policy saves.
`compute="real"` runs the kernels on the worker threads as real torch CPU ops (values are
computed; timings are noisier, as device work then competes with the host).

Configuration travels to service processes in the environment variable `ENV_VAR` (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

ENV_VAR = "RESIDENCY_EMULATED_NPU"
COMPUTE_MODES = ("modelled", "real")
ACCELERATOR_PATCHES = ("none", "vllm-ascend")

DEFAULT_FLOPS_PER_S = 100e12
"""Device compute throughput (FLOP/s): the order of an Ascend 910B's dense fp16 figure."""
DEFAULT_BYTES_PER_S = 1.6e12
"""Device memory bandwidth (bytes/s): HBM2e of the 910B class."""
DEFAULT_LINK_BYTES_PER_S = 25e9
"""Host <-> device copy bandwidth (bytes/s): an effective PCIe 4.0 x16 link."""
DEFAULT_CAPACITY_BYTES = 4 * 1024**3
"""Capacity of each emulated device (bytes)."""
DEFAULT_LAUNCH_NS = 5_000
"""Fixed cost of every device task (ns): launch and scheduling."""


@dataclass(frozen=True)
class DeviceModel:
    """Throughput, bandwidth and compute mode of the emulated NPU, plus the accelerator patch.

    `accelerator_patch="vllm-ascend"` applies vllm-ascend's `torch.accelerator` redirection
    (before its PR #12344) when the module is installed: `memory_reserved`, `memory_stats`,
    `empty_cache` and `get_memory_info` answer from the device module, `memory_allocated`
    keeps raising PyTorch's DeviceAllocator error.
    """

    compute: str = "modelled"
    flops_per_s: float = DEFAULT_FLOPS_PER_S
    bytes_per_s: float = DEFAULT_BYTES_PER_S
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S
    launch_ns: int = DEFAULT_LAUNCH_NS
    accelerator_patch: str = "none"
    release_ms: float | None = None
    """With a measured cost curve: `empty_cache` costs `release_ms + release_ms_per_gib x
    GiB released` (host time; released buffers kept in a host pool, not unmapped). None (the
    default): the host's own cost of unmapping, as before."""
    release_ms_per_gib: float | None = None
    reacquire_ms_per_gib: float | None = None
    """With a measured cost curve: each new block after a release costs this per GiB (host
    time; its buffer taken from the host pool, already faulted). None: the host's own cost of
    mapping and faulting a new buffer."""
    cost_curve: str | None = None
    """Where the curve came from (the release-cost CSV's device and file), for the manifest."""

    def __post_init__(self) -> None:
        if self.compute not in COMPUTE_MODES:
            raise ValueError(f"The value for `compute` must be one of {list(COMPUTE_MODES)}, "
                             f"but {self.compute!r} was passed.")
        if self.accelerator_patch not in ACCELERATOR_PATCHES:
            raise ValueError(f"The value for `accelerator_patch` must be one of "
                             f"{list(ACCELERATOR_PATCHES)}, but {self.accelerator_patch!r} "
                             "was passed.")
        for name in ("flops_per_s", "bytes_per_s", "link_bytes_per_s"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"The value for `{name}` must be a positive finite number, "
                                 f"but {value!r} was passed.")
        if (isinstance(self.launch_ns, bool) or not isinstance(self.launch_ns, int)
                or self.launch_ns < 0):
            raise ValueError(f"The value for `launch_ns` must be a non-negative integer, but "
                             f"{self.launch_ns!r} was passed.")
        curve = (self.release_ms, self.release_ms_per_gib, self.reacquire_ms_per_gib)
        if any(v is not None for v in curve) and any(v is None for v in curve):
            raise ValueError("The values for `release_ms`, `release_ms_per_gib` and "
                             "`reacquire_ms_per_gib` must be given together (a cost curve) or "
                             f"not at all, but {curve!r} was passed.")
        for name, value in zip(("release_ms", "release_ms_per_gib", "reacquire_ms_per_gib"),
                               curve, strict=True):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"The value for `{name}` must be a finite number >= 0, but "
                                 f"{value!r} was passed.")

    @property
    def cost_curve_set(self) -> bool:
        """Whether release and re-acquire costs follow a measured curve (not the host's)."""
        return self.release_ms is not None

    def release_s(self, released_bytes: int) -> float:
        """Seconds an `empty_cache` releasing `released_bytes` costs under the curve (0.0
        without one: the host's own cost is the cost)."""
        if self.release_ms is None or self.release_ms_per_gib is None:
            return 0.0
        return (self.release_ms + self.release_ms_per_gib * released_bytes / 2**30) / 1e3

    def reacquire_s(self, nbytes: int) -> float:
        """Seconds acquiring a new block of `nbytes` costs under the curve (0.0 without)."""
        if self.reacquire_ms_per_gib is None:
            return 0.0
        return self.reacquire_ms_per_gib * nbytes / 2**30 / 1e3

    @property
    def modelled(self) -> bool:
        """Whether device tasks wait out a modelled time instead of computing."""
        return self.compute == "modelled"

    def duration_ns(self, cost: Any, category: str) -> int:
        """Modelled duration of a task with `cost` (a `residency.emulated.model.Cost`: its
        `roofline_s`, and `written_bytes` over the link bandwidth for copies)."""
        if category == "gpu_memcpy":
            seconds = cost.written_bytes / self.link_bytes_per_s
        else:
            seconds = cost.roofline_s
        return self.launch_ns + int(round(seconds * 1e9))

    def describe(self) -> str:
        """The model in words, e.g. `modelled compute at 1e+14 FLOP/s, memory 1.6e+12 B/s,
        link 2.5e+10 B/s, launch 5 us, accelerator patch none`."""
        text = (f"{self.compute} compute at {self.flops_per_s:.3g} FLOP/s, memory "
                f"{self.bytes_per_s:.3g} B/s, link {self.link_bytes_per_s:.3g} B/s, launch "
                f"{self.launch_ns / 1000:g} us, accelerator patch {self.accelerator_patch}")
        if self.cost_curve_set:
            text += (f", release {self.release_ms:g} ms + {self.release_ms_per_gib:g} ms/GiB, "
                     f"re-acquire {self.reacquire_ms_per_gib:g} ms/GiB"
                     f" (from {self.cost_curve or 'a measured curve'})")
        return text

    def to_params(self) -> dict[str, Any]:
        """The model as plain values for a run manifest's `params` (the cost-curve fields
        only when a curve is set)."""
        params = asdict(self)
        if not self.cost_curve_set:
            for name in ("release_ms", "release_ms_per_gib", "reacquire_ms_per_gib",
                         "cost_curve"):
                params.pop(name)
        return params

    def to_env(self) -> str:
        """The JSON value of `ENV_VAR` that `from_env` reads back."""
        return json.dumps(self.to_params(), sort_keys=True)

    @classmethod
    def from_params(cls, data: dict[str, Any]) -> DeviceModel:
        """Inverse of `to_params`; ValueError naming an unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown emulated-NPU model field(s) {unknown}; known: "
                             f"{sorted(known)}")
        return cls(**data)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DeviceModel:
        """The model in `ENV_VAR` (defaults when unset); ValueError naming the variable."""
        raw = (os.environ if environ is None else environ).get(ENV_VAR)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls.from_params(data)
        except ValueError as exc:
            raise ValueError(f"environment variable {ENV_VAR}: {exc}") from None


# -- command line ---------------------------------------------------------------------------

def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the emulated NPU's model options (`--device-compute`, rates, `--accelerator-patch`)."""
    g = parser.add_argument_group("emulated NPU model (device emulated-npu only)")
    g.add_argument("--device-compute", choices=COMPUTE_MODES, default="modelled",
                   help="modelled: device tasks wait out FLOPs/bytes over the rates below, "
                   "leaving host cores free (default); real: compute on host threads (noisier)")
    g.add_argument("--device-flops", type=float, default=DEFAULT_FLOPS_PER_S, metavar="FLOP/S",
                   help=f"device compute throughput (default {DEFAULT_FLOPS_PER_S:g})")
    g.add_argument("--device-bandwidth", type=float, default=DEFAULT_BYTES_PER_S,
                   metavar="BYTES/S",
                   help=f"device memory bandwidth (default {DEFAULT_BYTES_PER_S:g})")
    g.add_argument("--link-bandwidth", type=float, default=DEFAULT_LINK_BYTES_PER_S,
                   metavar="BYTES/S",
                   help=f"host<->device copy bandwidth (default {DEFAULT_LINK_BYTES_PER_S:g})")
    g.add_argument("--release-curve", metavar="CSV", default=None,
                   help="set empty_cache and re-acquire costs from a release-cost CSV "
                   "(benchmarks/release_cost.py: its least-squares lines); default: the "
                   "host's own cost")
    g.add_argument("--accelerator-patch", choices=ACCELERATOR_PATCHES, default="none",
                   help="vllm-ascend: redirect torch.accelerator.memory_reserved (not "
                   "memory_allocated) to the device module, as vllm-ascend does")


def model_from_args(args: argparse.Namespace) -> DeviceModel:
    """The `DeviceModel` of parsed `add_model_arguments` options (ValueError naming the
    option if invalid)."""
    curve: dict[str, Any] = {}
    if getattr(args, "release_curve", None):
        curve = curve_from_csv(args.release_curve)
    try:
        return DeviceModel(compute=args.device_compute, flops_per_s=args.device_flops,
                           bytes_per_s=args.device_bandwidth,
                           link_bytes_per_s=args.link_bandwidth,
                           accelerator_patch=args.accelerator_patch, **curve)
    except ValueError as exc:
        text = str(exc)
        for field_name, option in _OPTIONS.items():
            text = text.replace(f"`{field_name}`", f"`{option}`")
        raise ValueError(text) from None


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys); ValueError with fewer
    than two distinct xs."""
    n = len(xs)
    if n != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"a line needs points at two or more distinct sizes, got {n} "
                         f"point(s) at {len(set(xs))} size(s)")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


CURVE_COLUMNS = ("device_kind", "cached_gib", "release_ms", "reacquire_ms")
"""Columns of a release-cost CSV the device model reads (benchmarks/release_cost.py)."""


def curve_from_csv(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `DeviceModel` cost-curve fields fitted from a release-cost CSV: release_ms and
    release_ms_per_gib (least squares of release time on GiB released), reacquire_ms_per_gib
    (slope of re-acquire time), cost_curve naming the device kind and file. A negative
    intercept or slope is clamped to 0. ValueError naming the file and what is wrong."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ValueError(f"--release-curve {path}: {exc.strerror or exc}") from None
    missing = [c for c in CURVE_COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise ValueError(f"--release-curve {path}: needs columns {list(CURVE_COLUMNS)} and "
                         f"rows{'; missing ' + ', '.join(missing) if missing else ''}")
    try:
        xs = [float(r["cached_gib"]) for r in rows]
        release = [float(r["release_ms"]) for r in rows]
        reacquire = [float(r["reacquire_ms"]) for r in rows]
        if not all(math.isfinite(v) and v >= 0 for v in (*xs, *release, *reacquire)):
            raise ValueError("a value is negative or not finite")
        r0, r1 = fit_line(xs, release)
        _, a1 = fit_line(xs, reacquire)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--release-curve {path}: {exc}") from None
    kinds = sorted({r["device_kind"] for r in rows})
    return {"release_ms": max(0.0, r0), "release_ms_per_gib": max(0.0, r1),
            "reacquire_ms_per_gib": max(0.0, a1),
            "cost_curve": f"{'/'.join(kinds)} curve {os.path.basename(str(path))} "
                          f"(n={len(rows)})"}


_OPTIONS = {"compute": "--device-compute", "flops_per_s": "--device-flops",
            "bytes_per_s": "--device-bandwidth", "link_bytes_per_s": "--link-bandwidth",
            "accelerator_patch": "--accelerator-patch", "release_ms": "--release-curve",
            "release_ms_per_gib": "--release-curve", "reacquire_ms_per_gib": "--release-curve"}


def model_changed(args: argparse.Namespace) -> bool:
    """Whether any model option differs from its default (they apply to emulated-npu only)."""
    return model_from_args(args) != DeviceModel()


__all__ = ["ACCELERATOR_PATCHES", "COMPUTE_MODES", "CURVE_COLUMNS", "curve_from_csv",
           "fit_line", "DEFAULT_BYTES_PER_S",
           "DEFAULT_CAPACITY_BYTES", "DEFAULT_FLOPS_PER_S", "DEFAULT_LAUNCH_NS",
           "DEFAULT_LINK_BYTES_PER_S", "DeviceModel", "ENV_VAR", "add_model_arguments",
           "model_changed", "model_from_args"]
