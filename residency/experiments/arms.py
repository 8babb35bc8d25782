"""One arm's service run: started, warmed, measured and stopped (`run_arm`), its files checked
and collected, `client.json` written, and its manifest entry with its cost (`run_cost`,
`cost_summary`)."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from residency.experiments.errors import ExperimentError
from residency.experiments.httpclient import fill, json_or_none, post_control, send_request
from residency.experiments.lifecycle import RunningService, start_service
from residency.experiments.servicefile import ServiceSpec
from residency.records.client import write_client
from residency.records.decisions import DECISIONS_GLOB
from residency.rundir import neighbours
from residency.rundir.layout import TRACE_RAW
from residency.rundir.layout import run_dir as run_dir_name


def run_arm(spec: ServiceSpec, arm: str, index: int, out: Path, *, steps: int, seed: int,
            profiled: bool, requests: int = 1, lister: neighbours.Lister | None = None,
            require_exclusive: bool = False) -> dict[str, Any]:
    """Start, warm, measure `requests` consecutive requests and stop one arm; returns its
    manifest entry. An arm that fails leaves no raw profiles (`trace-raw/`) behind.

    The entry's `neighbours` records the devices' processes (`lister`, default the device
    kind's: `residency.rundir.neighbours`) once the service is healthy and after the last
    measured request; with `require_exclusive`, a foreign one is an `ExperimentError`."""
    try:
        return _run_arm(spec, arm, index, out, steps=steps, seed=seed, profiled=profiled,
                        requests=requests, lister=lister, require_exclusive=require_exclusive)
    except BaseException:
        if spec.builtin:  # nobody will collect them; tmp/ already went with the service
            shutil.rmtree(out / run_dir_name(index, arm) / TRACE_RAW, ignore_errors=True)
        raise


def _look(lister: neighbours.Lister, service: RunningService, arm: str, when: str,
          require_exclusive: bool) -> tuple[dict[str, Any], set[int]]:
    """The devices' processes now, ours being this process and the service's tree."""
    own = {os.getpid(), *neighbours.own_pids([service.proc.pid])}  # not our other children
    found = neighbours.sample(lister, own)
    if require_exclusive:
        try:
            neighbours.check(found)
        except neighbours.NotExclusive as exc:
            raise ExperimentError(f"{arm}: at the {when} of its measured run, {exc}") from None
    return found, own


def _run_arm(spec: ServiceSpec, arm: str, index: int, out: Path, *, steps: int, seed: int,
             profiled: bool, requests: int = 1, lister: neighbours.Lister | None = None,
             require_exclusive: bool = False) -> dict[str, Any]:
    rel = run_dir_name(index, arm)
    run_dir = out / rel
    run_dir.mkdir(parents=True, exist_ok=False)
    began = time.perf_counter_ns()
    lister = lister or neighbours.lister_for(spec.device_kind)
    service = start_service(spec, arm, run_dir, profiled=profiled)
    started = time.perf_counter_ns()
    values = {**service.values, "steps": steps, "seed": seed}
    measured: list[dict[str, Any]] = []
    try:
        host_before = neighbours.host_cpu()
        first_look, _ = _look(lister, service, arm, "start", require_exclusive)
        warm = send_request(spec, values, warmup=True)
        if warm.status != 200:
            raise ExperimentError(f"{arm} warm-up answered {warm.status}: {warm.payload[:300]!r};"
                                  f" log tail:\n{service.log_tail()}")
        if profiled and spec.profile_start_url:
            post_control(spec.profile_start_url, values, timeout=60)
        for _ in range(requests):
            reply = send_request(spec, values)
            if reply.status != 200:
                raise ExperimentError(f"{arm} request answered {reply.status}: "
                                      f"{reply.payload[:300]!r}; log tail:\n"
                                      f"{service.log_tail()}")
            response = json_or_none(reply.payload)
            measured.append({"request_id": (response or {}).get("request_id"),
                             "e2e_ns": reply.e2e_ns, "e2e_s": reply.e2e_ns / 1e9,
                             "start_wall_ns": reply.start_wall_ns,
                             "end_wall_ns": reply.end_wall_ns,
                             "response": response if response is not None
                             else {"bytes": len(reply.payload)}})
        if profiled and spec.profile_stop_url:
            post_control(spec.profile_stop_url, values, timeout=spec.profile_stop_timeout_s)
        last_look, own = _look(lister, service, arm, "end", require_exclusive)
        seen = neighbours.record(first_look, last_look, host_before=host_before,
                                 host_after=neighbours.host_cpu(), own=own)
    except ExperimentError as exc:
        if service.proc.poll() is not None:
            raise ExperimentError(f"{exc}\nservice exited with code {service.proc.returncode};"
                                  f" log tail:\n{service.log_tail()}") from exc
        raise
    finally:
        service.stop()
    ended = time.perf_counter_ns()
    _check_decisions_written(spec, Path(fill(spec.decisions, values)), arm, requests + 1)
    first = measured[0]
    # the unit of the E2E claim is the run: with R requests, the median of its R E2Es
    median_ns = int(round(statistics.median(m["e2e_ns"] for m in measured)))
    median_s = median_ns / 1e9
    if spec.builtin and profiled:
        _collect_builtin_traces(run_dir, first["request_id"])
    # the current layout (`residency.records.client`): the run's median E2E, and one record
    # per measured request (id, E2E, window, response)
    write_client(run_dir, arm=arm, index=index, request={"steps": steps, "seed": seed},
                 median_e2e_ns=median_ns,
                 warmup={"request_id": (json_or_none(warm.payload) or {}).get("request_id"),
                         "e2e_ns": warm.e2e_ns, "start_wall_ns": warm.start_wall_ns,
                         "end_wall_ns": warm.end_wall_ns},
                 requests=measured, service_versions=service.versions)
    # `request_id` and `e2e_s` describe the same thing: one measured request and its E2E, or,
    # with R > 1, the R requests (`request_ids`) and their median (issue 25)
    entry = {"arm": arm, "index": index, "dir": rel, "e2e_s": median_s, "profiled": profiled,
             "cost": run_cost(start_ns=started - began, warmup_ns=warm.e2e_ns,
                              measured_ns=sum(m["e2e_ns"] for m in measured),
                              total_ns=ended - began),
             "neighbours": seen}
    if requests > 1:
        entry["request_ids"] = [m["request_id"] for m in measured]
        entry["e2e_s_requests"] = [m["e2e_s"] for m in measured]
    else:
        entry["request_id"] = first["request_id"]
    return entry


COST_FIELDS = ("start_s", "warmup_s", "measured_s", "other_s", "total_s")
"""`runs[].cost` of a service run (seconds of wall time on the device's host): `start_s`
spawn to healthy, `warmup_s` the warm-up request, `measured_s` the measured requests' E2E
summed, `other_s` the rest (profiler control, stopping the service, gaps), `total_s` spawn to
stopped. The manifest's `cost` sums them over the runs (with `runs`)."""


def run_cost(*, start_ns: int, warmup_ns: int, measured_ns: int, total_ns: int
             ) -> dict[str, float]:
    """A run's `cost` record (`COST_FIELDS`) from its measured times in ns."""
    other = max(0, total_ns - start_ns - warmup_ns - measured_ns)
    return {"start_s": start_ns / 1e9, "warmup_s": warmup_ns / 1e9,
            "measured_s": measured_ns / 1e9, "other_s": other / 1e9,
            "total_s": total_ns / 1e9}


def cost_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's `cost`: every `runs[].cost` field summed, with `runs` (how many runs
    recorded one)."""
    costs = [r["cost"] for r in runs if isinstance(r.get("cost"), dict)]
    return {"runs": len(costs), **{k: sum(float(c.get(k) or 0.0) for c in costs)
                                   for k in COST_FIELDS}}


def _check_decisions_written(spec: ServiceSpec, directory: Path, arm: str, sent: int) -> None:
    """Refuse a run whose decisions directory stayed empty: nothing could be attributed."""
    files = sorted(directory.glob(DECISIONS_GLOB)) if directory.is_dir() else []
    if any(f.stat().st_size for f in files):
        return
    if spec.builtin:
        raise ExperimentError(f"{directory}: the built-in {arm} service answered {sent} "
                              "requests but wrote no decisions-rank<r>.jsonl")
    raise ExperimentError(
        f"{directory}: the decisions directory (field `profile.decisions` of "
        f"{spec.source or spec.name}) stayed empty after the {arm} service answered {sent} "
        "requests; likely cause: the residency adapter did not load in the service's workers "
        "(residency not installed in the service's environment so its "
        "`vllm_omni.general_plugins` entry point is missing, VLLM_PLUGINS set without "
        "`residency`, or RESIDENCY_ARM / RESIDENCY_DECISIONS_DIR missing from `serve.env`)")


def _collect_builtin_traces(run_dir: Path, request_id: str | None) -> None:
    raw = run_dir / TRACE_RAW
    src = raw / str(request_id)
    if request_id is None or not src.is_dir():
        raise ExperimentError(f"{run_dir}: no traces for request {request_id} under {raw}")
    src.rename(run_dir / "trace")
    shutil.rmtree(raw, ignore_errors=True)
