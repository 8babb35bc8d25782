"""`residency selftest`: run this suite's own paths on the device at hand, in minutes.

A pipeline of small named steps, each a function of one `Context` that returns what it
checked (`detail`, `data`) or raises: `CheckFailed` (a check did not hold, with a hint),
`Skipped` (does not apply, with the reason) or any other exception (failed, with the
exception's type and message and the step's hint). No step stops the others, except that
`profiler` reads what `service` wrote.

* `environment`: python, torch (and its CUDA build), torch-npu, CANN (from the toolkit's
  version file when present), driver, device count, vLLM / vLLM-Omni / vllm-ascend versions;
* `probe`: the API reproduction (`residency probe`) and which arm's telemetry answers;
* `policy`: on device 0, allocate, offload (free: the block stays cached), then each arm's
  `release_if_needed` normal and forced; the cache must really be kept or returned as
  decided, and the snapshot must agree with the device's own counters and `mem_get_info`;
* `adapter`: the installed vLLM-Omni's `BoundedAllocatorCache` against the adapter
  (skipped when vllm-omni is not installed);
* `service`: the built-in service with the requested ranks, one profiled few-step request,
  its decisions files;
* `profiler`: the trace the device's real profiler wrote around that request, parsed back by
  the `residency idle` analysis: device tasks on every rank, the markers found;
* `paired`: a tiny `profiled-pair` run directory, checked by `residency verify`.

Results are `StepResult` value objects; `Report.to_dict()` is the `--json` object
(`schema` residency.selftest/1: `device_kind`, `ranks`, `environment`, `steps` list of
`{name, status, seconds, detail}` plus `error_type`/`error`/`hint` when failed, `data` when
any, and `interrupted`). Exit 0 when no step failed, 1 when one did, 2 on bad input, 130
when interrupted (SIGINT/SIGTERM: the running step's services are stopped, the partial
report is still printed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA = "residency.selftest/1"
STEP_NAMES = ("environment", "probe", "policy", "adapter", "service", "profiler", "paired")
DEFAULT_MAX_RANKS = 2
REQUEST_STEPS = 2
SEED = 2101
SERVICE_TIMEOUT_S = 300.0
# workload sizes per device kind: small, so that a service starts and answers in seconds
WORKLOAD = {"emulated-npu": {"scale": 0.02, "resident_mib": 256.0},
            "cuda": {"scale": 0.25, "resident_mib": 256.0},
            "npu": {"scale": 0.25, "resident_mib": 256.0}}
POLICY_BLOCK_BYTES = {"emulated-npu": 64 << 20, "cuda": 256 << 20, "npu": 256 << 20}
PROFILERS = {"emulated-npu": "the emulated NPU's Kineto export",
             "cuda": "torch.profiler (CPU + CUDA activities, export_chrome_trace)",
             "npu": "torch_npu.profiler with tensorboard_trace_handler"}
TRACE_FORMATS = {"emulated-npu": "kineto", "cuda": "kineto", "npu": "ascend"}
REQUIRED_MARKERS = ("residency.request", "residency.release[normal]",
                    "residency.release[forced]")
Status = Literal["passed", "failed", "skipped"]

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
        label = " (emulated NPU - not an NPU measurement)" if self.device_kind == \
            "emulated-npu" else ""
        out = [f"residency selftest on {self.device_kind}{label}, {self.ranks} rank(s)"]
        for s in self.steps:
            out.append(f"  {s.status.upper():<8} {s.name:<12} {s.seconds:7.1f} s  {s.detail}")
            if s.status == "failed":
                message = (s.error or "").splitlines() or [""]
                out.append(f"{'':13}{s.error_type}: {message[0]}")
                out += [f"{'':15}{line}" for line in message[1:20]]
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

        from residency.experiments import builtin_service

        spec = builtin_service(device_kind=self.kind, ranks=self.ranks,
                               health_timeout_s=SERVICE_TIMEOUT_S, **WORKLOAD[self.kind])
        return dataclasses.replace(spec, request_timeout_s=SERVICE_TIMEOUT_S,
                                   profile_stop_timeout_s=SERVICE_TIMEOUT_S)


StepOutput = tuple[str, dict[str, Any]]


# --- environment --------------------------------------------------------------------------

def _first_version_line(path: Path) -> str | None:
    """The value of the first `version=` / `Version=` line of a toolkit or driver file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() in ("version", "runtime_running_version"):
            return value.strip().strip("[]") or None
    return None


def cann_version() -> dict[str, Any]:
    """CANN's version from the toolkit's own version file, and which file (None when no
    toolkit is found)."""
    roots = [os.environ.get(v) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    roots += ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"]
    for root in (Path(r) for r in roots if r):
        candidates = [root / "version.cfg", *sorted(root.glob("*/ascend_toolkit_install.info")),
                      root / "compiler" / "version.info", root / "runtime" / "version.info"]
        for path in candidates:
            if path.is_file() and (version := _first_version_line(path)):
                return {"version": version, "source": str(path)}
    return {"version": None, "source": None}


def driver_version(kind: str) -> dict[str, Any]:
    """The accelerator driver's version and where it was read (None when not found)."""
    if kind == "npu":
        path = Path("/usr/local/Ascend/driver/version.info")
        version = _first_version_line(path) if path.is_file() else None
        return {"version": version, "source": str(path) if version else None}
    if kind == "cuda":
        path = Path("/proc/driver/nvidia/version")
        with contextlib.suppress(OSError):
            match = re.search(r"Kernel Module\s+(\S+)", path.read_text(errors="replace"))
            if match:
                return {"version": match[1], "source": str(path)}
        import subprocess

        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20, check=True).stdout.split()
            if out:
                return {"version": out[0], "source": "nvidia-smi"}
    return {"version": None, "source": None}


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def collect_environment(kind: str, device_count: int) -> dict[str, Any]:
    """Versions and devices: python, torch (+ CUDA build), torch-npu, CANN, driver, device
    count and name, vllm, vllm-omni, vllm-ascend, residency and its git commit."""
    import platform

    import torch

    from residency.experiments import versions

    env: dict[str, Any] = dict(versions())
    env.update(platform=f"{platform.system()} {platform.machine()}",
               torch_cuda=torch.version.cuda, cann=cann_version(), driver=driver_version(kind),
               device_kind=kind, device_count=device_count,
               vllm=_dist_version("vllm"), vllm_omni=_dist_version("vllm-omni"),
               vllm_ascend=_dist_version("vllm-ascend"))
    if kind == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
    elif kind == "npu":
        env["device_name"] = torch.npu.get_device_name(0)  # type: ignore[attr-defined]
    else:
        env["device_name"] = "emulated NPU (host-backed)"
    return env


def _major_minor(version: str | None) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


def step_environment(ctx: Context) -> StepOutput:
    """Record the environment; fail on a torch build that cannot drive the device."""
    env = collect_environment(ctx.kind, ctx.device_count)
    ctx.environment.update(env)
    if ctx.kind == "cuda" and not env.get("torch_cuda"):
        raise CheckFailed(f"torch {env['torch']} is a CPU build", hint="Install the CUDA "
                          "build of torch (README, 'Installing on accelerator hosts').")
    if ctx.kind == "npu":
        if _major_minor(env.get("torch")) != _major_minor(env.get("torch_npu")):
            raise CheckFailed(f"torch {env.get('torch')} and torch-npu {env.get('torch_npu')} "
                              "are not a matching pair", hint="Install the torch / torch-npu "
                              "pair listed for your CANN version (README).")
        if env["cann"]["version"] is None:
            raise CheckFailed("no CANN toolkit version file found (ASCEND_TOOLKIT_HOME, "
                              "ASCEND_HOME_PATH, /usr/local/Ascend/ascend-toolkit/latest)",
                              hint="Source CANN's environment first: `source "
                              "/usr/local/Ascend/ascend-toolkit/set_env.sh`.")
    parts = [f"python {env['python']}", f"torch {env['torch']}"
             + (f" (CUDA {env['torch_cuda']})" if env.get("torch_cuda") else "")]
    if env.get("torch_npu"):
        parts.append(f"torch-npu {env['torch_npu']}")
    if env["cann"]["version"]:
        parts.append(f"CANN {env['cann']['version']}")
    if env["driver"]["version"]:
        parts.append(f"driver {env['driver']['version']}")
    parts.append(f"{env['device_count']} x {env['device_name']}")
    for name in ("vllm", "vllm_omni", "vllm_ascend"):
        if env.get(name):
            parts.append(f"{name.replace('_', '-')} {env[name]}")
    return ", ".join(parts), {}


# --- probe ----------------------------------------------------------------------------------

def step_probe(ctx: Context) -> StepOutput:
    """The API reproduction on device 0, and which arm's telemetry answers."""
    from residency.telemetry import probe_queries

    device, _ = ctx.device()
    result = probe_queries(device)
    _write_json(ctx.out / "probe.json", {"device_kind": ctx.kind, **result})
    arms = result["arms"]
    answers = {arm: ("answers" if info["error"] is None else "unavailable")
               for arm, info in arms.items() if info["telemetry"] is not None}
    candidate = arms["candidate"]
    if candidate["error"] is not None:
        raise CheckFailed(f"the candidate's {candidate['telemetry']} telemetry does not answer "
                          f"on {device}: {candidate['error']}", hint="The fix cannot read "
                          "allocator telemetry on this device, so every normal call would "
                          "release; " + HINTS["probe"])
    if ctx.kind == "emulated-npu" and not result["bug_present"]:
        raise CheckFailed(f"the emulated NPU must reproduce the bug (generic query failing, "
                          f"registered module answering), but: {result['verdict']}",
                          hint=HINTS["probe"])
    baseline = arms["baseline"]
    base = ("answers" if baseline["error"] is None
            else f"fails ({_short_error(baseline['error'])}) -> releases on every normal call")
    detail = (f"{result['verdict']}; candidate reads {candidate['telemetry']} telemetry: "
              f"answers; baseline reads {baseline['telemetry']}: {base}")
    return detail, {"bug_present": result["bug_present"], "telemetry": answers}


def _short_error(message: str) -> str:
    """`Type: ...last sentence` of a telemetry error (PyTorch's asserts are long)."""
    text = message.split(" telemetry unavailable: ", 1)[-1]
    kind, _, rest = text.partition(": ")
    sentences = [x for x in rest.strip().split(". ") if x]
    return f"{kind}: ...{sentences[-1]}" if len(sentences) > 1 else text


# --- policy arms on the device --------------------------------------------------------------

class _Block:
    """A device allocation held by the policy step (freed = offloaded: the block is cached)."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        import torch

        device, module = ctx.device()
        self._emulated = ctx.kind == "emulated-npu"
        self._tensor: Any = (module.empty((nbytes,), dtype=torch.uint8, device=device)
                             if self._emulated
                             else torch.empty(nbytes, dtype=torch.uint8, device=device))
        module.synchronize(device)

    def free(self) -> None:
        if self._emulated:
            self._tensor.free()
        self._tensor = None


def _counters(module: Any, device: Any) -> dict[str, int]:
    free, total = module.mem_get_info(device)
    return {"reserved": int(module.memory_reserved(device)),
            "allocated": int(module.memory_allocated(device)),
            "free": int(free), "total": int(total)}


def step_policy(ctx: Context) -> StepOutput:
    """Each arm on device 0: allocate, offload, normal then forced `release_if_needed`."""
    from residency.policy import ARMS, JsonlRecorder, policy_for, retains

    device, module = ctx.device()
    nbytes = POLICY_BLOCK_BYTES[ctx.kind]
    recorder = JsonlRecorder(ctx.out / "policy" / "decisions.jsonl", device_kind=ctx.kind,
                             request_id="selftest-policy")
    summary: dict[str, Any] = {}
    try:
        for arm in ARMS:
            policy = policy_for(arm, device, recorder=recorder, rank=0)
            outcomes = {}
            for force in (False, True):
                module.empty_cache()
                block = _Block(ctx, nbytes)                      # allocate (a component)
                block.free()                                     # offload: the block is cached
                module.synchronize(device)
                before = _counters(module, device)
                if before["reserved"] - before["allocated"] < nbytes:
                    raise CheckFailed(
                        f"after freeing {nbytes} bytes the allocator caches only "
                        f"{before['reserved'] - before['allocated']} bytes on {device}: "
                        "nothing for the policy to retain", hint=HINTS["policy"])
                released = policy.release_if_needed(force=force)
                decision = policy.last_decision
                assert decision is not None
                after = _counters(module, device)
                kind = "forced" if force else "normal"
                _check_decision(ctx, arm, kind, decision, before, retains)
                outcomes[kind] = f"{decision.outcome} ({decision.reason})"
                if released and after["reserved"] > before["reserved"] - nbytes:
                    raise CheckFailed(
                        f"arm {arm}, {kind} call: released, but memory_reserved went from "
                        f"{before['reserved']} to {after['reserved']} bytes (expected a drop "
                        f"of at least {nbytes})", hint="The device module's empty_cache(), "
                        "through which the policy releases, did not return the cached block.")
                if not released and after["reserved"] != before["reserved"]:
                    raise CheckFailed(
                        f"arm {arm}, {kind} call: retained, but memory_reserved went from "
                        f"{before['reserved']} to {after['reserved']} bytes",
                        hint=HINTS["policy"])
            summary[arm] = outcomes
    finally:
        recorder.close()
        module.empty_cache()
    detail = "; ".join(f"{arm}: normal {o['normal']}, forced {o['forced']}"
                       for arm, o in summary.items())
    return detail + "; candidate snapshot matches the device's counters and mem_get_info", {
        "arms": summary, "block_bytes": nbytes}


def _check_decision(ctx: Context, arm: str, kind: str, decision: Any, before: dict[str, int],
                    retains: Callable[..., str]) -> None:
    where = f"arm {arm}, {kind} call"
    if kind == "forced":
        if (decision.outcome, decision.reason, decision.snapshot) != ("released", "forced",
                                                                      None):
            raise CheckFailed(f"{where}: expected released/forced without reading telemetry, "
                              f"got {decision.outcome}/{decision.reason}", hint=HINTS["policy"])
        return
    if arm == "always-release":
        if decision.outcome != "released":
            raise CheckFailed(f"{where}: always-release retained", hint=HINTS["policy"])
        return
    if decision.snapshot is None:
        if arm == "candidate":
            raise CheckFailed(f"{where}: the candidate could not read telemetry: "
                              f"{decision.error}", hint=HINTS["probe"])
        if decision.reason != "telemetry-unavailable" or decision.outcome != "released":
            raise CheckFailed(f"{where}: no snapshot but {decision.outcome}/{decision.reason}",
                              hint=HINTS["policy"])
        return
    snap = decision.snapshot.to_dict()
    expected = retains(decision.snapshot, decision.max_cached_fraction,
                       decision.min_free_fraction)
    if decision.reason != expected:
        raise CheckFailed(f"{where}: decided {decision.reason} on a snapshot whose bounds say "
                          f"{expected}: {snap}", hint=HINTS["policy"])
    if arm != "candidate":
        return
    # the snapshot against the device's own counters, read just before and just after
    tolerance = 0 if ctx.kind == "emulated-npu" else max(64 << 20, before["total"] // 100)
    for name in ("reserved", "allocated", "free"):
        if abs(snap[name] - before[name]) > tolerance:
            raise CheckFailed(f"{where}: snapshot {name} = {snap[name]} bytes but the device "
                              f"module says {before[name]} (tolerance {tolerance})",
                              hint=HINTS["policy"])
    if snap["total"] != before["total"]:
        raise CheckFailed(f"{where}: snapshot total = {snap['total']} bytes but mem_get_info "
                          f"says {before['total']}", hint=HINTS["policy"])


# --- the installed vLLM-Omni against the adapter --------------------------------------------

def step_adapter(ctx: Context) -> StepOutput:
    """Whether the adapter accepts the installed vLLM-Omni's class, and one normal and one
    forced call through the patched class on device 0 (candidate arm)."""
    import importlib

    from residency.adapters import upstream_file
    from residency.adapters import vllm_omni as adapter

    version = _dist_version("vllm-omni")
    if version is None:
        raise Skipped("vllm-omni is not installed (nothing to check the adapter against)")
    try:
        module = importlib.import_module(upstream_file.UPSTREAM_MODULE)
        how = "imported"
    except ImportError as exc:
        if _dist_version("vllm") is not None:
            raise CheckFailed(f"vllm-omni {version} is installed but "
                              f"{upstream_file.UPSTREAM_MODULE} cannot be imported: "
                              f"{type(exc).__name__}: {exc}",
                              hint="Install vLLM-Omni's dependencies (vllm) as its docs say."
                              ) from exc
        module = upstream_file.load_module_residency()
        how = "its file loaded with vllm stubbed, as vllm is not installed"
    cls = adapter.check_upstream(module)
    device, _ = ctx.device()
    adapter.install(cls, module, arm="candidate", decisions_dir=ctx.out / "adapter")
    instance = cls(device)
    outcomes = [instance.release_if_needed(), instance.release_if_needed(force=True)]
    session = cls.__dict__[adapter.SESSION_ATTR]
    if session.recorder is not None:
        session.recorder.close()
    lines = [json.loads(x) for f in sorted((ctx.out / "adapter").glob("decisions-rank*.jsonl"))
             for x in f.read_text().splitlines() if x.strip()]
    if [x["kind"] for x in lines] != ["normal", "forced"]:
        raise CheckFailed(f"expected one normal and one forced decision through the patched "
                          f"class, got {[x['kind'] for x in lines]}", hint=HINTS["adapter"])
    if lines[0]["snapshot"] is None or lines[1]["outcome"] != "released" or not outcomes[1]:
        raise CheckFailed(f"the patched class did not use the candidate's telemetry or did "
                          f"not release when forced: {lines}", hint=HINTS["adapter"])
    return (f"vllm-omni {version}: compatible ({how}); candidate normal call "
            f"{lines[0]['outcome']} ({lines[0]['reason']}), forced call released",
            {"vllm_omni": version, "how": how})


# --- service, profiler, paired run ----------------------------------------------------------

def step_service(ctx: Context) -> StepOutput:
    """One profiled few-step request on the built-in service with the requested ranks."""
    from residency.experiments import run_arm

    root = ctx.out / "service"
    root.mkdir(parents=True, exist_ok=True)
    entry = run_arm(ctx.service_spec(), "candidate", 0, root, steps=REQUEST_STEPS, seed=SEED,
                    profiled=True)
    run_dir = root / entry["dir"]
    client = json.loads((run_dir / "client.json").read_text(encoding="utf-8"))
    per_rank = client["response"].get("per_rank", [])
    request_id = entry["request_id"]
    if sorted(r.get("rank") for r in per_rank) != list(range(ctx.ranks)):
        raise CheckFailed(f"the response covers ranks {[r.get('rank') for r in per_rank]}, "
                          f"not 0..{ctx.ranks - 1}", hint=HINTS["service"])
    for r in per_rank:
        if (r["normal"]["count"], r["forced"]["count"], r["forced"]["released"]) != (1, 2, 2):
            raise CheckFailed(f"rank {r['rank']}: expected 1 normal and 2 forced calls "
                              f"(both released), got {r['normal']} / {r['forced']}",
                              hint=HINTS["service"])
        if r["telemetry_errors"] or r["oom"]:
            raise CheckFailed(f"rank {r['rank']}: {r['telemetry_errors']} telemetry errors, "
                              f"{r['oom']} OOM with the candidate", hint=HINTS["probe"])
    counts = []
    for rank in range(ctx.ranks):
        path = run_dir / f"decisions-rank{rank}.jsonl"
        if not path.is_file():
            raise CheckFailed(f"{path.name} was not written", hint=HINTS["service"])
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        mine = [x for x in lines if x.get("request_id") == request_id]
        kinds = sorted(x["kind"] for x in mine)
        if kinds != ["forced", "forced", "normal"] or any(
                x.get("device_kind") != ctx.kind for x in mine):
            raise CheckFailed(f"{path.name}: request {request_id} has decisions {kinds} "
                              f"(device_kind {[x.get('device_kind') for x in mine]}), expected "
                              f"1 normal + 2 forced on {ctx.kind}", hint=HINTS["service"])
        counts.append(len(lines))
    ctx.service_run = run_dir
    normal = [r["normal"]["retained"] for r in per_rank]
    return (f"{ctx.ranks} rank(s), request {request_id} ({REQUEST_STEPS} steps) in "
            f"{client['e2e_s']:.2f} s; per rank 1 normal call ({sum(normal)} retained), "
            f"2 forced released; decisions files {counts} lines (warm-up included)",
            {"run_dir": str(run_dir), "request_id": request_id})


def check_trace_dir(trace: Path, *, kind: str, ranks: int) -> StepOutput:
    """Parse a profiled request's trace directory back with the idle analysis.

    Raises:
        CheckFailed: nothing written, torch-npu DB-only output, a parse error, the wrong
            format, a rank missing or without device tasks, or a marker missing on a rank.
    """
    import warnings

    from residency.idle import idle_summary
    from residency.traces import TraceError, load_traces

    profiler = PROFILERS[kind]
    files = sorted(p for p in trace.rglob("*") if p.is_file()) if trace.is_dir() else []
    if not files:
        raise CheckFailed(f"the profiler wrote nothing under {trace}", hint=(
            f"{profiler} produced no file for this request; on NPU the trace handler writes "
            "at stop (check the service log for its errors), on CUDA check that "
            "torch.profiler's CUDA activity (CUPTI) is available." if kind != "emulated-npu"
            else "The emulated NPU's trace export did not run; check the service log."))
    if kind == "npu" and not any(p.name == "trace_view.json" for p in files) and any(
            p.suffix == ".db" for p in files):
        raise CheckFailed(f"torch_npu.profiler wrote DB-only output under {trace} "
                          f"({', '.join(p.name for p in files if p.suffix == '.db')}), no "
                          "ASCEND_PROFILER_OUTPUT/trace_view.json", hint="The analysis reads "
                          "the text export: use export_type Text (ExportType.Db writes only "
                          "the SQLite file).")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            traces = load_traces(trace, cache=False)
        except TraceError as exc:
            raise CheckFailed(str(exc), hint=(
                f"The trace written by {profiler} could not be parsed; `residency idle "
                f"{trace}` shows the same error. Keep the file (--out DIR) for a bug "
                "report.")) from exc
    if traces.format != TRACE_FORMATS[kind]:
        raise CheckFailed(f"expected {TRACE_FORMATS[kind]} traces from {profiler}, found "
                          f"{traces.format}", hint=HINTS["profiler"])
    if sorted(traces.ranks) != list(range(ranks)):
        raise CheckFailed(f"traces of ranks {sorted(traces.ranks)} found, expected "
                          f"0..{ranks - 1}", hint=HINTS["profiler"])
    for rank, timeline in traces.ranks.items():
        if not timeline.device_tasks:
            raise CheckFailed(f"rank {rank} ({timeline.source}) has no device tasks "
                              f"({'; '.join(str(w.message) for w in caught)})",
                              hint=f"{profiler} recorded host activity only; "
                              + HINTS["profiler"])
        names = set(timeline.range_names.tolist())
        missing = [m for m in REQUIRED_MARKERS if m not in names]
        if missing:
            raise CheckFailed(f"rank {rank}: markers {missing} not found among "
                              f"{len(names)} host range names", hint="record_function "
                              "ranges are emitted only while a profiler records; "
                              + HINTS["profiler"])
    summary = idle_summary(traces, marker=re.escape("residency.release[normal]"))
    tasks = {rank: t.device_tasks for rank, t in traces.ranks.items()}
    detail = (f"{traces.format} traces of {len(tasks)} rank(s) from {profiler}: device tasks "
              f"{list(tasks.values())}, markers {', '.join(REQUIRED_MARKERS)} on every rank; "
              f"all-rank idle {summary.all_rank_idle_ns / 1e6:.3f} ms of "
              f"{summary.window_measure_ns / 1e6:.3f} ms, normal-release markers in it "
              f"{summary.marker_idle_intersection_ns / 1e6:.3f} ms")
    return detail, {"format": traces.format, "device_tasks": {str(k): v for k, v in
                                                              tasks.items()},
                    "rejected_events": summary.rejected_events}


def step_profiler(ctx: Context) -> StepOutput:
    """The service request's traces, parsed back by the idle analysis."""
    if ctx.service_run is None:
        raise Skipped("needs the service step's profiled request, which did not complete")
    return check_trace_dir(ctx.service_run / "trace", kind=ctx.kind, ranks=ctx.ranks)


def step_paired(ctx: Context) -> StepOutput:
    """A tiny profiled-pair run directory, then `residency verify` on it."""
    from residency.experiments import run_design
    from residency.rundir import load_run, verify_run

    out = ctx.out / "pair"
    run_design("profiled-pair", out, spec=ctx.service_spec(), steps=REQUEST_STEPS, seed=SEED,
               params={**WORKLOAD[ctx.kind], "capacity_bytes": None, "selftest": True},
               progress=False)
    result = verify_run(out)
    if not result.ok:
        raise CheckFailed("residency verify: " + "; ".join(result.lines()),
                          hint=HINTS["paired"])
    run = load_run(out)
    arms = [r.arm for r in run.runs]
    return (f"profiled-pair run directory ({', '.join(arms)}), {result.summary()} by "
            f"residency verify", {"run_dir": str(out)})


STEPS: dict[str, Callable[[Context], StepOutput]] = {
    "environment": step_environment, "probe": step_probe, "policy": step_policy,
    "adapter": step_adapter, "service": step_service, "profiler": step_profiler,
    "paired": step_paired,
}


def run_step(name: str, ctx: Context) -> StepResult:
    """Run one step; every exception becomes a failed result (KeyboardInterrupt aside)."""
    start = time.perf_counter()
    try:
        detail, data = STEPS[name](ctx)
    except Skipped as exc:
        return StepResult(name, "skipped", time.perf_counter() - start, str(exc))
    except CheckFailed as exc:
        cause = exc.__cause__
        error_type = type(cause).__name__ if cause else "CheckFailed"
        return _failed(name, ctx, start, error_type, str(exc), exc.hint or HINTS[name],
                       with_type=cause is not None)
    except Exception as exc:  # noqa: BLE001 - every failure of a step is its result
        return _failed(name, ctx, start, type(exc).__name__, str(exc), HINTS[name])
    return StepResult(name, "passed", time.perf_counter() - start, detail, data=data)


def _failed(name: str, ctx: Context, start: float, error_type: str, error: str, hint: str,
            *, with_type: bool = True) -> StepResult:
    detail = f"{error_type}: {error}" if with_type else error
    return StepResult(name, "failed", time.perf_counter() - start, _one_line(detail),
                      error_type=error_type, error=error,
                      hint=hint.replace("--device D", f"--device {ctx.kind}"))


def _one_line(text: str, limit: int = 200) -> str:
    first = (text.splitlines() or [""])[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def run_selftest(kind: str, *, ranks: int, out: Path, device_count: int, keep: bool = True,
                 on_step: Callable[[StepResult], None] | None = None) -> Report:
    """Every step in order on an already resolved device kind; `out` must exist (`keep`:
    the report names it). An interrupt (KeyboardInterrupt, SIGTERM in the CLI) fails the
    running step, skips the rest and returns the report marked `interrupted`."""
    ctx = Context(kind=kind, ranks=ranks, out=out, device_count=device_count)
    results: list[StepResult] = []
    interrupted = False
    for name in STEP_NAMES:
        start = time.perf_counter()
        if interrupted:
            result = StepResult(name, "skipped", 0.0, "not run: the selftest was interrupted")
        else:
            try:
                result = run_step(name, ctx)
            except KeyboardInterrupt:
                interrupted = True
                result = StepResult(
                    name, "failed", time.perf_counter() - start, "interrupted",
                    error_type="KeyboardInterrupt", error="interrupted (SIGINT or SIGTERM) "
                    "while this step ran; the services it started were stopped",
                    hint="The step did not finish in the time it was given; rerun it with "
                    "--out DIR to keep what it wrote.")
        results.append(result)
        if on_step is not None:
            on_step(result)
    return Report(kind, ranks, ctx.environment, tuple(results),
                  out=str(out) if keep else None, interrupted=interrupted)


# --- CLI ------------------------------------------------------------------------------------

class UsageError(ValueError):
    """Bad input: the CLI prints it on one line and exits 2."""


def device_count(kind: str, ranks: int | None) -> int:
    """Devices visible for a real kind; for the emulated NPU, as many as the ranks need."""
    if kind == "emulated-npu":
        return ranks or DEFAULT_MAX_RANKS
    import torch

    if kind == "npu":
        import torch_npu  # noqa: F401  - registers torch.npu

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    return int(torch.cuda.device_count())


def resolve(device: str, ranks: int | None) -> tuple[str, int, int]:
    """(device kind, ranks, device count) for the CLI's `--device` and `--ranks`.

    Raises:
        UsageError: an unknown or unavailable device, or ranks < 1 or above the devices.
    """
    from residency.emulated import resolve_device

    if ranks is not None and ranks < 1:
        raise UsageError(f"--ranks must be >= 1, but {ranks} was passed")
    try:
        kind = resolve_device(device)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"--device {device}: {exc}") from None
    if kind == "emulated-npu" and importlib.util.find_spec("torch_npu") is not None:
        raise UsageError("--device emulated-npu: torch_npu is installed here; the emulated NPU "
                         "cannot register beside it (use --device npu)")
    count = device_count(kind, ranks)
    if ranks is None:
        ranks = max(1, min(count, DEFAULT_MAX_RANKS))
    if count < ranks:
        raise UsageError(f"--ranks {ranks}, but only {count} {kind} device(s) are visible")
    return kind, ranks, count


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `selftest`."""
    p = subparsers.add_parser(
        "selftest", help="run this suite's own paths on the device at hand, step by step",
        description="Environment, API reproduction, policy arms, the vLLM-Omni adapter, a "
        "profiled 1-request service, its trace parsed back, and a verified paired run "
        "directory; each step passed / failed (with a hint) / skipped.")
    p.add_argument("--device", default="auto", help="auto|npu|cuda|emulated-npu "
                   "(default: auto)")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="service ranks (default: all devices, at most 2)")
    p.add_argument("--out", metavar="DIR", help="keep everything the steps write here "
                   "(a new or empty folder; default: a temporary folder, removed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_cli(args: argparse.Namespace) -> int:
    """Run `selftest`: 0 all applicable steps passed, 1 a step failed, 2 bad input, 130
    interrupted (the partial report is still printed)."""
    try:
        kind, ranks, count = resolve(args.device, args.ranks)
        out, keep = _out_dir(args.out)
    except UsageError as exc:
        print(f"residency selftest: error: {exc}", file=sys.stderr)
        return 2

    def progress(result: StepResult) -> None:
        if not args.json:
            print(f"  {result.status.upper():<8} {result.name}", file=sys.stderr, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)  # stop services, report, exit 130
    try:
        report = run_selftest(kind, ranks=ranks, out=out, device_count=count, keep=keep,
                              on_step=progress)
        if keep:
            _write_json(out / "selftest.json", report.to_dict())
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(report.to_dict(), indent=2) if args.json else "\n".join(report.lines()))
    if report.interrupted:
        return 130
    return 0 if report.ok else 1


def _out_dir(path: str | None) -> tuple[Path, bool]:
    if path is None:
        return Path(tempfile.mkdtemp(prefix="residency-selftest-")), False
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder; choose a new one")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create it: {exc.strerror or exc}") from None
    return out, True


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


__all__ = ["CheckFailed", "Context", "Report", "STEP_NAMES", "Skipped", "StepResult",
           "add_cli", "cann_version", "check_trace_dir", "collect_environment",
           "driver_version", "resolve", "run_cli", "run_selftest", "run_step"]
