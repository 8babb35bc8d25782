"""The built-in service's configuration, shared by its front process and its ranks (picklable
for spawned processes), and the service's own log line."""

from __future__ import annotations

import sys
from dataclasses import dataclass

REQUEST_TIMEOUT_S = 3600.0      # default of `serve --request-timeout`


@dataclass(frozen=True)
class ServeConfig:
    """Everything a rank needs; picklable for spawned processes."""

    arm: str
    device_kind: str
    ranks: int
    decisions_dir: str
    profile_dir: str | None = None
    scale: float = 1.0
    capacity_bytes: int | None = None
    resident_mib: float = 1024
    rendezvous: str = ""        # file:// init method; empty: serve() makes a private one
    warmup_steps: int = 1
    request_timeout_s: float = REQUEST_TIMEOUT_S
    inject_failure: str = "none"  # devices.INJECTIONS: injected into the baseline arm only
    accelerator_patch: str = "none"  # with inject_failure: vllm-ascend's redirection on top
    resident_on_device: bool = False  # the resident footprint made on the device (scale auto)


def log(message: str) -> None:
    """One line of the service's own log on stderr (`[service] ...`)."""
    sys.stderr.write(f"[service] {message}\n")
    sys.stderr.flush()
