"""The selftest's shared model: step outcomes (`StepResult`, `Report`), the exceptions a step
raises (`CheckFailed`, `Skipped`), the `Context` steps share, and each step's hint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from residency import devices

SCHEMA = "residency.selftest/1"
SERVICE_TIMEOUT_S = 300.0
# workload sizes per device kind: small, so that a service starts and answers in seconds
WORKLOAD = {k: {"scale": devices.REGISTRY[k].selftest_scale,
                "resident_mib": devices.REGISTRY[k].selftest_resident_mib}
            for k in devices.KINDS}  # the selftest service's sizes, per kind (`DeviceKind`)
Status = Literal["passed", "failed", "skipped"]
TEXT_TAIL_LINES = 12  # lines of a failed step's message beyond its first, in the text report

HINTS = {
    "environment": "Check the installation against the README's 'Installing on accelerator "
                   "hosts' section; `python -m torch.utils.collect_env` shows what torch sees.",
    "probe": "Run `residency probe --device D` for every query path's value or exception.",
    "policy": "Run `residency probe --device D`; the policy reads the same telemetry and "
              "releases through the device module's empty_cache().",
    "adapter": "The adapter patches vllm_omni.diffusion.offloader.module_residency."
               "BoundedAllocatorCache; see residency/adapters/vllm_omni.py for the shapes it "
               "accepts. Unset RESIDENCY_ARM to serve vLLM-Omni without it.",
    "service": "Read the service log quoted above (kept with --out DIR under "
               "service/runs/00-candidate/service.log); rerun with --ranks 1 to tell a "
               "collective (gloo/hccl/nccl) problem from a single-device one.",
    "profiler": "Rerun with --out DIR and look at service/runs/00-candidate/trace/; "
                "`residency idle DIR` parses it the same way.",
    "paired": "Rerun with --out DIR; the run directory is pair/ (its manifest.json records "
              "the error) and `residency verify DIR` lists what differs.",
}


class CheckFailed(Exception):
    """A step's check did not hold; `hint` says what to look at."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class Skipped(Exception):  # noqa: N818 - a step outcome, not an error
    """The step does not apply here; the message says why."""


@dataclass(frozen=True)
class StepResult:
    """One step's outcome: passed / failed (with the exception's type, message and a hint) /
    skipped (with the reason in `detail`)."""

    name: str
    status: Status
    seconds: float
    detail: str
    error_type: str | None = None
    error: str | None = None
    hint: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The step's object in `--json`."""
        out: dict[str, Any] = {"name": self.name, "status": self.status,
                               "seconds": round(self.seconds, 3), "detail": self.detail}
        if self.status == "failed":
            out.update(error_type=self.error_type, error=self.error, hint=self.hint)
        if self.data:
            out["data"] = self.data
        return out


@dataclass(frozen=True)
class Report:
    """Every step's result on one device kind."""

    device_kind: str
    ranks: int
    environment: dict[str, Any]
    steps: tuple[StepResult, ...]
    out: str | None = None
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """True when no step failed (and the run was not interrupted)."""
        return not self.interrupted and all(s.status != "failed" for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """The `--json` object."""
        return {"schema": SCHEMA, "device_kind": self.device_kind, "ranks": self.ranks,
                "status": "passed" if self.ok else "failed", "interrupted": self.interrupted,
                "out": self.out, "environment": self.environment,
                "steps": [s.to_dict() for s in self.steps]}

    def lines(self) -> list[str]:
        """A readable report, one line per step (failures with their error and hint)."""
        from residency import devices  # the one spelling of each device's label

        label = f" ({devices.label(self.device_kind)})" if devices.emulated(self.device_kind) \
            else ""
        out = [f"residency selftest on {self.device_kind}{label}, {self.ranks} rank(s)"]
        for s in self.steps:
            out.append(f"  {s.status.upper():<8} {s.name:<12} {s.seconds:7.1f} s  {s.detail}")
            if s.status == "failed":
                message = (s.error or "").splitlines() or [""]
                out.append(f"{'':13}{s.error_type}: {message[0]}")
                # the rest is usually a service log tail: its last lines, access log left out
                rest = [x for x in message[1:] if not x.lstrip().startswith("[http]")]
                if len(rest) > TEXT_TAIL_LINES:
                    out.append(f"{'':15}... ({len(rest) - TEXT_TAIL_LINES} lines more in "
                               "--json and the log)")
                out += [f"{'':15}{line}" for line in rest[-TEXT_TAIL_LINES:]]
                out.append(f"{'':13}hint: {s.hint}")
        failed = [s.name for s in self.steps if s.status == "failed"]
        out.append("all applicable steps passed" if not failed
                   else f"failed: {', '.join(failed)}")
        if self.interrupted:
            out.append("interrupted: the steps after the failed one did not run")
        if self.out:
            out.append(f"everything the steps wrote is in {self.out}")
        return out


@dataclass
class Context:
    """What the steps share: the resolved device kind, ranks, the output folder, and what
    earlier steps found."""

    kind: str
    ranks: int
    out: Path
    device_count: int
    environment: dict[str, Any] = field(default_factory=dict)
    service_run: Path | None = None
    inject_failure: str = "none"
    """`--inject-failure`: the NPU's telemetry failure injected into the paired step's
    baseline service (cuda only: `residency.devices.check_injection`)."""
    _device: Any = None
    _module: Any = None

    def device(self) -> tuple[Any, Any]:
        """(torch.device of device 0, its device module) in this process; installs the
        emulated NPU on first use (process-global, irreversible)."""
        if self._device is None:
            import torch

            if self.kind == "emulated-npu":
                from residency.emulated import install_emulated_npu

                self._module = install_emulated_npu(devices=self.device_count)
                self._device = torch.device("npu:0")
            elif self.kind == "npu":
                import torch_npu  # noqa: F401  - registers torch.npu

                self._device = torch.device("npu:0")
                self._module = torch.get_device_module(self._device)
                self._module.set_device(0)
            else:
                self._device = torch.device("cuda:0")
                self._module = torch.cuda
                torch.cuda.set_device(0)
        return self._device, self._module

    def service_spec(self) -> Any:
        """The built-in service of this kind and rank count, with the selftest's timeouts."""
        import dataclasses

        from residency.experiments.servicefile import builtin_service

        spec = builtin_service(device_kind=self.kind, ranks=self.ranks,
                               health_timeout_s=SERVICE_TIMEOUT_S,
                               inject_failure=self.inject_failure, **WORKLOAD[self.kind])
        return dataclasses.replace(spec, request_timeout_s=SERVICE_TIMEOUT_S,
                                   profile_stop_timeout_s=SERVICE_TIMEOUT_S)


StepOutput = tuple[str, dict[str, Any]]
"""What a step returns when it passed: a one-line detail and its figures."""


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


__all__ = ["HINTS", "SCHEMA", "CheckFailed", "Context", "Report", "Skipped", "StepOutput",
           "StepResult", "write_json"]
