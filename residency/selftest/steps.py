"""The selftest's steps, in order: each a function of the shared `Context` that returns
(detail, data) or raises `CheckFailed` / `Skipped` / any exception (see the package doc)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from residency import devices, markers
from residency.policy.cache import ALWAYS_RELEASE, BASELINE, CANDIDATE
from residency.records.client import CLIENT, read_client
from residency.records.decisions import DECISIONS_GLOB, decisions_file, read_records
from residency.selftest import environment
from residency.selftest.core import (
    HINTS,
    WORKLOAD,
    CheckFailed,
    Context,
    Skipped,
    StepOutput,
    write_json,
)

REQUEST_STEPS = 2
SEED = 2101
# per device kind, from its registered `DeviceKind` (`residency.devices`)
POLICY_BLOCK_BYTES = {k: devices.REGISTRY[k].selftest_block_bytes for k in devices.KINDS}
PROFILERS = {k: devices.REGISTRY[k].profiler_text for k in devices.KINDS}
TRACE_FORMATS = {k: devices.REGISTRY[k].trace_format for k in devices.KINDS}
REQUIRED_MARKERS = (markers.REQUEST, markers.RELEASE_NORMAL, markers.RELEASE_FORCED)


# --- environment --------------------------------------------------------------------------

def _major_minor(version: str | None) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


def step_environment(ctx: Context) -> StepOutput:
    """Record the environment; fail on a torch build that cannot drive the device."""
    env = environment.collect_environment(ctx.kind, ctx.device_count)
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
    from residency.workload.probe import probe_queries

    device, _ = ctx.device()
    result = probe_queries(device)
    write_json(ctx.out / "probe.json", {"device_kind": ctx.kind, **result})
    arms = result["arms"]
    answers = {arm: ("answers" if info["error"] is None else "unavailable")
               for arm, info in arms.items() if info["telemetry"] is not None}
    candidate = arms[CANDIDATE]
    if candidate["error"] is not None:
        raise CheckFailed(f"the candidate's {candidate['telemetry']} telemetry does not answer "
                          f"on {device}: {candidate['error']}", hint="The fix cannot read "
                          "allocator telemetry on this device, so every normal call would "
                          "release; " + HINTS["probe"])
    if devices.emulated(ctx.kind) and not result["bug_present"]:
        raise CheckFailed(f"the emulated NPU must reproduce the bug (generic query failing, "
                          f"registered module answering), but: {result['verdict']}",
                          hint=HINTS["probe"])
    baseline = arms[BASELINE]
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
        self._emulated = devices.emulated(ctx.kind)
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
    from residency.policy.cache import ARMS, JsonlRecorder, policy_for, retains

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
    if arm == ALWAYS_RELEASE:
        if decision.outcome != "released":
            raise CheckFailed(f"{where}: always-release retained", hint=HINTS["policy"])
        return
    if decision.snapshot is None:
        if arm == CANDIDATE:
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
    if arm != CANDIDATE:
        return
    # the snapshot against the device's own counters, read just before and just after
    tolerance = 0 if devices.emulated(ctx.kind) else max(64 << 20, before["total"] // 100)
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

    version = environment.dist_version("vllm-omni")
    if version is None:
        raise Skipped("vllm-omni is not installed (nothing to check the adapter against)")
    try:
        module = importlib.import_module(upstream_file.UPSTREAM_MODULE)
        how = "imported"
    except ImportError as exc:
        if environment.dist_version("vllm") is not None:
            raise CheckFailed(f"vllm-omni {version} is installed but "
                              f"{upstream_file.UPSTREAM_MODULE} cannot be imported: "
                              f"{type(exc).__name__}: {exc}",
                              hint="Install vLLM-Omni's dependencies (vllm) as its docs say."
                              ) from exc
        module = upstream_file.load_module_residency()
        how = "its file loaded with vllm stubbed, as vllm is not installed"
    cls = adapter.check_upstream(module)
    device, _ = ctx.device()
    adapter.install(cls, module, arm=CANDIDATE, decisions_dir=ctx.out / "adapter")
    instance = cls(device)
    outcomes = [instance.release_if_needed(), instance.release_if_needed(force=True)]
    session = cls.__dict__[adapter.SESSION_ATTR]
    if session.recorder is not None:
        session.recorder.close()
    lines = [x for f in sorted((ctx.out / "adapter").glob(DECISIONS_GLOB))
             for x in read_records(f)]
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
    from residency.experiments.arms import run_arm

    root = ctx.out / "service"
    root.mkdir(parents=True, exist_ok=True)
    entry = run_arm(ctx.service_spec(), CANDIDATE, 0, root, steps=REQUEST_STEPS, seed=SEED,
                    profiled=True)
    run_dir = root / entry["dir"]
    client = read_client(run_dir / CLIENT, check=False)
    per_rank = (client["requests"][0].get("response") or {}).get("per_rank", [])
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
        path = run_dir / decisions_file(rank)
        if not path.is_file():
            raise CheckFailed(f"{path.name} was not written", hint=HINTS["service"])
        lines = read_records(path)
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
            f"{client['median_e2e_s']:.2f} s; per rank 1 normal call ({sum(normal)} retained), "
            f"2 forced released; decisions files {counts} lines (warm-up included)",
            {"run_dir": str(run_dir), "request_id": request_id})


def check_trace_dir(trace: Path, *, kind: str, ranks: int) -> StepOutput:
    """Parse a profiled request's trace directory back with the idle analysis.

    Raises:
        CheckFailed: nothing written, torch-npu DB-only output, a parse error, the wrong
            format, a rank missing or without device tasks, or a marker missing on a rank.
    """
    import warnings

    from residency.analysis.idle import idle_summary
    from residency.traces.load import TraceError, load_traces

    profiler = PROFILERS[kind]
    files = sorted(p for p in trace.rglob("*") if p.is_file()) if trace.is_dir() else []
    if not files:
        raise CheckFailed(f"the profiler wrote nothing under {trace}", hint=(
            f"{profiler} produced no file for this request; on NPU the trace handler writes "
            "at stop (check the service log for its errors), on CUDA check that "
            "torch.profiler's CUDA activity (CUPTI) is available." if not devices.emulated(kind)
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
    summary = idle_summary(traces, marker=re.escape(markers.RELEASE_NORMAL))
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
    from residency.experiments.designs import run_design
    from residency.rundir.assignment import assigned_decisions
    from residency.rundir.run import load_run, verify_run

    out = ctx.out / "pair"
    injected = ctx.inject_failure != "none"
    extra = {"inject_failure": {"kind": ctx.inject_failure, "arms": list(devices.INJECTED_ARMS)}
             } if injected else {}
    run_design("profiled-pair", out, spec=ctx.service_spec(), steps=REQUEST_STEPS, seed=SEED,
               params={**WORKLOAD[ctx.kind], "capacity_bytes": None, "selftest": True,
                       **extra}, progress=False)
    result = verify_run(out)
    if not result.ok:
        raise CheckFailed("residency verify: " + "; ".join(result.lines()),
                          hint=HINTS["paired"])
    run = load_run(out)
    arms = [r.arm for r in run.runs]
    detail = (f"profiled-pair run directory ({', '.join(arms)}), {result.summary()} by "
              f"residency verify")
    if injected:  # the injection took: the baseline's normal calls met the failure
        errors = {}
        for r in run.runs:
            calls = assigned_decisions(run, r)
            errors[r.arm] = int(((calls["kind"] == "normal")
                                 & (calls["reason"] == "telemetry-unavailable")).sum())
        if not errors.get(BASELINE) or errors.get(CANDIDATE):
            raise CheckFailed(f"--inject-failure {ctx.inject_failure}: normal calls with a "
                              f"telemetry error per arm {errors}; expected some in the "
                              f"baseline and none in the candidate", hint=HINTS["paired"])
        detail += (f"; {ctx.inject_failure} injected into the baseline: {errors[BASELINE]} "
                   f"normal calls met it, the candidate's none")
    return detail, {"run_dir": str(out)}


STEPS: dict[str, Callable[[Context], StepOutput]] = {
    "environment": step_environment, "probe": step_probe, "policy": step_policy,
    "adapter": step_adapter, "service": step_service, "profiler": step_profiler,
    "paired": step_paired,
}
STEP_NAMES = tuple(STEPS)


__all__ = ["PROFILERS", "STEPS", "STEP_NAMES", "check_trace_dir"]
