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

import importlib.util
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from residency import devices
from residency.errors import BadInput
from residency.selftest.core import (
    HINTS,
    SCHEMA,
    CheckFailed,
    Context,
    Report,
    Skipped,
    StepResult,
)
from residency.selftest.environment import cann_version, collect_environment, driver_version
from residency.selftest.steps import STEP_NAMES, STEPS, check_trace_dir

DEFAULT_MAX_RANKS = 2


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
                 on_step: Callable[[StepResult], None] | None = None,
                 inject_failure: str = "none") -> Report:
    """Every step in order on an already resolved device kind; `out` must exist (`keep`:
    the report names it). An interrupt (KeyboardInterrupt, SIGTERM in the CLI) fails the
    running step, skips the rest and returns the report marked `interrupted`."""
    ctx = Context(kind=kind, ranks=ranks, out=out, device_count=device_count,
                  inject_failure=inject_failure)
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


# --- what the CLI resolves (`residency.cli.main.cmd_selftest`) ------------------------------

def device_count(kind: str, ranks: int | None) -> int:
    """Devices visible for a real kind; for the emulated NPU, as many as the ranks need."""
    count = devices.device_count(kind)
    return (ranks or DEFAULT_MAX_RANKS) if count is None else count


def resolve(device: str, ranks: int | None) -> tuple[str, int, int]:
    """(device kind, ranks, device count) for the CLI's `--device` and `--ranks`.

    Raises:
        BadInput: an unknown or unavailable device, or ranks < 1 or above the devices.
    """

    if ranks is not None and ranks < 1:
        raise BadInput(f"--ranks must be >= 1, but {ranks} was passed")
    try:
        kind = devices.resolve(device)
    except (ValueError, RuntimeError) as exc:
        raise BadInput(f"--device {device}: {exc}") from None
    if devices.emulated(kind) and importlib.util.find_spec("torch_npu") is not None:
        raise BadInput("--device emulated-npu: torch_npu is installed here; the emulated NPU "
                         "cannot register beside it (use --device npu)")
    count = device_count(kind, ranks)
    if ranks is None:
        ranks = max(1, min(count, DEFAULT_MAX_RANKS))
    if count < ranks:
        raise BadInput(f"--ranks {ranks}, but only {count} {kind} device(s) are visible")
    return kind, ranks, count


def out_dir(path: str | None) -> tuple[Path, bool]:
    if path is None:
        return Path(tempfile.mkdtemp(prefix="residency-selftest-")), False
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"--out {out}: exists and is not an empty folder; choose a new one")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot create it: {exc.strerror or exc}") from None
    return out, True


__all__ = ["SCHEMA", "STEP_NAMES", "CheckFailed", "Context", "Report", "Skipped", "StepResult",
           "cann_version", "check_trace_dir", "collect_environment",
           "driver_version", "out_dir", "resolve", "run_selftest", "run_step"]
