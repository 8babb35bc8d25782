"""The built-in workload service's contract with its callers: the request fields' limits
both sides check (`POST /v1/generate`), and the workload's sizes (`--scale auto`).

`--scale auto`: the built-in workload sized from the device's capacity (torch-free).

A large diffusion service holds most of its device: the resident denoiser and its buffers
stay allocated, and the staged components pass through the rest. At `--scale 1` the built-in
service holds 1.9 GB of a 150 GB H200 (1.3 %); sized automatically it holds `fill` of the
capacity at its peak, while the candidate's retained cache stays inside the policy's bounds:

* the text encoder (the component a normal call retains) is `STAGED_FRACTION` (10 %) of the
  capacity, so the cache it leaves is 40 % of the 25 % cached bound; the reference encoder
  and the VAE follow at the same scale (2/3 of it each), the frames buffer too (1/6);
* the resident footprint (made on the device, never uploaded) fills the rest up to `fill`
  (default 0.85) of the capacity at the preparation peak (resident + text encoder + the DiT's
  layers + `SLACK_MIB`), so after the text encoder's offload about 1 - `fill` (15 %) stays
  free: three times the 5 % free bound.

`auto_size(total_bytes)` is the pure rule; `device_total_bytes(kind)` asks the device (in a
subprocess for cuda and npu, so that no caller opens a device context of its own).
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

MAX_STEPS = 10_000  # `steps` accepted by POST /v1/generate: 1..MAX_STEPS
MAX_SEED = 2**53 - 1  # `seed`: 0..MAX_SEED (exact in every JSON client)

MiB = 1 << 20
TEXT_ENCODER_MIB = 768.0
"""Component sizes of the built-in workload at scale 1 (MiB): `WorkloadConfig`'s defaults."""
REFERENCE_ENCODER_MIB = 512.0
VAE_MIB = 512.0
RESIDENT_MIB = 1024.0
FRAMES_MIB = 128.0
DIT_LAYERS_BYTES = 8 * 512 * 512 * 4
"""The DiT's layers at the default hidden size (8 layers of 512 x 512 fp32)."""

AUTO_FILL = 0.85
"""Default share of capacity the service holds at its peak with `--scale auto`."""
MAX_FILL = 0.90
"""Highest `fill` accepted: the free bound (5 %) with room for a device context."""
STAGED_FRACTION = 0.10
"""The text encoder's share of capacity: the cache a normal call retains (<= 25 %)."""
SLACK_MIB = 64.0
"""Left for request activations (prompt, latents, scratch) at the preparation peak."""

RULE = ("scale = 10 % of capacity / 768 MiB (the text encoder, the cache a normal call "
        "retains: 40 % of the 25 % bound; reference encoder and VAE 2/3 of it, frames 1/6); "
        "resident footprint on the device = fill x capacity - text encoder - DiT layers - "
        "64 MiB, so the preparation peak holds `fill` of the capacity and about 1 - fill "
        "stays free after the offload (bound: 5 %)")


@dataclass(frozen=True)
class Sizing:
    """The workload sized from a capacity: the `serve` options and the bytes they hold."""

    total_bytes: int
    fill: float
    scale: float
    resident_mib: float
    text_encoder_bytes: int
    reference_encoder_bytes: int
    vae_bytes: int
    frames_bytes: int
    resident_bytes: int
    peak_reserved_bytes: int
    rule: str = RULE

    @property
    def cached_fraction(self) -> float:
        """The text encoder's cache after its offload, as a share of capacity."""
        return self.text_encoder_bytes / self.total_bytes

    def to_params(self) -> dict[str, Any]:
        """Plain values for a run manifest's `params.sizing`."""
        return {"mode": "auto", **asdict(self)}


def _check_fraction(name: str, value: Any, high: float) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not 0 < value <= high):
        raise ValueError(f"The value for `{name}` must be a number in (0, {high}], but "
                         f"{value!r} was passed.")
    return float(value)


def auto_size(total_bytes: int, *, fill: float = AUTO_FILL,
              staged_fraction: float = STAGED_FRACTION) -> Sizing:
    """The workload's sizes for a device of `total_bytes` (see the module's rule).

    Raises:
        ValueError: `total_bytes` not a positive integer, `fill` outside (0, 0.90],
            `staged_fraction` outside (0, 0.20], or no room left for the resident footprint.
    """
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes <= 0:
        raise ValueError(f"The value for `total_bytes` must be a positive integer, but "
                         f"{total_bytes!r} was passed.")
    fill = _check_fraction("fill", fill, MAX_FILL)
    staged_fraction = _check_fraction("staged_fraction", staged_fraction, 0.20)
    scale = staged_fraction * total_bytes / (TEXT_ENCODER_MIB * MiB)
    text_encoder = int(TEXT_ENCODER_MIB * scale * MiB)
    resident = int(fill * total_bytes) - text_encoder - DIT_LAYERS_BYTES - int(SLACK_MIB * MiB)
    if resident <= 0:
        raise ValueError(f"The value for `fill` ({fill}) leaves no room for the resident "
                         f"footprint beside the text encoder ({staged_fraction:.0%} of "
                         f"capacity); pass a larger fill")
    return Sizing(
        total_bytes=total_bytes, fill=fill, scale=scale, resident_mib=resident / (scale * MiB),
        text_encoder_bytes=text_encoder,
        reference_encoder_bytes=int(REFERENCE_ENCODER_MIB * scale * MiB),
        vae_bytes=int(VAE_MIB * scale * MiB), frames_bytes=int(FRAMES_MIB * scale * MiB),
        resident_bytes=resident,
        peak_reserved_bytes=resident + text_encoder + DIT_LAYERS_BYTES + int(SLACK_MIB * MiB))


_CAPACITY_CODE = """
import importlib, sys, torch
if sys.argv[2]:
    importlib.import_module(sys.argv[2])
print(int(torch.get_device_module(sys.argv[1]).mem_get_info(0)[1]))
"""


def device_total_bytes(kind: str, *, capacity_bytes: int | None = None,
                       timeout_s: float = 120.0) -> int:
    """The capacity of device 0 of `kind`: the emulated NPU's `capacity_bytes` (default
    4 GiB); for cuda and npu `mem_get_info(0)[1]` asked in a subprocess.

    Raises:
        RuntimeError: the subprocess failed or answered something else than a byte count.
    """
    from residency import devices
    from residency.devicemodel import DEFAULT_CAPACITY_BYTES

    if devices.emulated(kind):
        return int(capacity_bytes or DEFAULT_CAPACITY_BYTES)
    info = devices.info(kind)
    try:
        done = subprocess.run([sys.executable, "-c", _CAPACITY_CODE, info.torch_type,
                               info.device_package or ""], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"--scale auto: could not ask the {kind} device its capacity: "
                           f"{exc}") from None
    text = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not text or not text[0].isdigit():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"--scale auto: could not ask the {kind} device its capacity "
                           f"(exit {done.returncode}: {tail[0]})")
    return int(text[0])


__all__ = ["AUTO_FILL", "MAX_FILL", "MAX_SEED", "MAX_STEPS", "RULE", "STAGED_FRACTION",
           "Sizing", "auto_size", "device_total_bytes"]
