"""Loading a run once for the attributions: decisions assigned to runs and requests (the one
place: `decisions_by_request`), client records, the reference pair, the traces' idle figures."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from residency import markers
from residency.evidence.model import PAIRED_ARMS
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.assignment import assign_run, decisions_by_request
from residency.rundir.run import Run, RunEntry

NORMAL_MARKER = re.escape(markers.RELEASE_NORMAL)  # regular expressions for the trace loader
PREPARE_MARKER = re.escape(markers.PHASE_PREPARE)

__all__ = ["NORMAL_MARKER", "PREPARE_MARKER", "RunData", "decisions_by_request", "idle_from_traces",
           "load_run_traces", "measured_requests", "reference_pair"]


def measured_requests(run: Run, entry: RunEntry) -> list[dict[str, Any]]:
    """The measured requests of one run entry, in order: `request_id` and `response`."""
    return [{"request_id": r.get("request_id"), "response": r.get("response") or {}}
            for r in run.client(entry)["requests"]]  # (every layout read as the current one)


def service_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Which service a run used, from its manifest: `kind`, `name`, `file`, `command`,
    `versions`, `expect` (runs recorded before `service_info` give what they have)."""
    info = manifest.get("service_info") or {}
    return {"kind": manifest.get("service"),
            "name": info.get("name") or manifest.get("service_name"),
            "file": info.get("file"), "command": info.get("command"),
            "versions": info.get("versions"), "expect": info.get("expect")}


def reference_pair(run: Run) -> tuple[RunEntry, RunEntry] | None:
    """The profiled pair if any, else the first run of each arm (None without both arms)."""
    first = {}
    for arm in PAIRED_ARMS:
        runs = run.arm(arm)
        if not runs:
            return None
        first[arm] = next((r for r in runs if r.profiled), runs[0])
    return first[BASELINE], first[CANDIDATE]


def load_run_traces(run: Run, entry: RunEntry) -> Any:
    """The `TraceSet` of one run entry's ``trace/`` folder, whose ranks must be exactly the
    run's `params.ranks` (0..N-1): a trace folder with another rank set (a planted file
    read as an extra rank, a rank missing) is a `TraceError` naming the folder. A verified
    run's traces are read under its seal: only sealed files, each checked against its sha256
    as it is parsed (`residency.traces.files.sealed_reads`). Loaded once per reading of the
    run (`run.reading`: one command's): the evidence, the timeline, idle by cause and the
    trace diff of a notebook execution share it."""
    from residency.traces.files import Sealed, TraceError
    from residency.traces.load import load_traces

    folder = entry.trace_dir
    if folder is None:
        raise TraceError(entry.dir / "trace", "no such directory: the run recorded no traces")
    key = (os.path.abspath(folder), "trace set")
    got = run.reading.parsed.get(key)
    if got is not None:
        return got
    sealed = run.sealed_artifacts
    traces = load_traces(folder, seal=None if sealed is None else Sealed(run.path, sealed))
    ranks = (run.manifest.get("params") or {}).get("ranks")
    if isinstance(ranks, int) and not isinstance(ranks, bool) and \
            set(traces.ranks) != set(range(ranks)):
        raise TraceError(folder, f"holds the traces of ranks {sorted(traces.ranks)}, but the "
                         f"run had params.ranks = {ranks} (ranks 0..{ranks - 1})")
    run.reading.parsed[key] = traces
    return traces


def idle_from_traces(run: Run, pair: tuple[RunEntry, RunEntry] | None = None
                     ) -> tuple[dict[str, dict[str, int]] | None, str | None]:
    """Idle figures (ns) of the reference pair from its traces: arm ->
    {marker_idle_intersection_ns, all_rank_idle_ns, prepare_ns}; (None, reason) when the
    analysis failed, (None, None) when the pair has no traces."""
    pair = reference_pair(run) if pair is None else pair
    if pair is None or any(e.trace_dir is None for e in pair):
        return None, None
    try:
        from residency.analysis.idle import idle_summary

        out = {}
        for arm, entry in zip(PAIRED_ARMS, pair, strict=True):
            timelines = load_run_traces(run, entry)
            whole = idle_summary(timelines, marker=NORMAL_MARKER)
            prep = idle_summary(timelines, marker=NORMAL_MARKER, window_marker=PREPARE_MARKER)
            start, end = _get(prep, "window_ns")
            out[arm] = {"marker_idle_intersection_ns": int(_get(whole,
                                                                "marker_idle_intersection_ns")),
                        "all_rank_idle_ns": int(_get(whole, "all_rank_idle_ns")),
                        "prepare_ns": int(end) - int(start)}
        return out, None
    except (ImportError, AttributeError, TypeError, KeyError, ValueError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _get(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, Mapping) else getattr(obj, key)


@dataclass
class RunData:
    """A loaded run, read once: decisions (all, warm-up marked), client records, the
    reference pair and (lazily) the idle figures of its traces. `inputs` holds what an
    attribution needs beyond the run (e.g. an A/A run to compare E2E noise with), by name."""

    run: Run
    idle_override: Mapping[str, Mapping[str, int]] | None = None
    idle_error_override: str | None = None
    traces: bool = True
    inputs: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def decisions(self) -> pd.DataFrame:
        """`decisions_by_request(run)`."""
        return decisions_by_request(self.run)

    @cached_property
    def measured(self) -> pd.DataFrame:
        """Decisions of measured requests only (the scope rule)."""
        d = self.decisions
        return d[~d["warmup"].astype(bool)].reset_index(drop=True)

    @cached_property
    def assignments(self) -> dict[str, Any]:
        """Run name -> `residency.rundir.assignment.RequestAssignment` of its decisions."""
        return {e.name: assign_run(self.run, e) for e in self.run.runs}

    @cached_property
    def pair(self) -> tuple[RunEntry, RunEntry] | None:
        """`reference_pair(run)`."""
        return reference_pair(self.run)

    @cached_property
    def clients(self) -> dict[str, dict[str, Any]]:
        """Run name -> client.json."""
        return {e.name: self.run.client(e) for e in self.run.runs}

    @cached_property
    def _idle(self) -> tuple[dict[str, dict[str, int]] | None, str | None]:
        if self.idle_override is not None or self.idle_error_override is not None:
            idle = None if self.idle_override is None else {
                a: dict(v) for a, v in self.idle_override.items()}
            return idle, self.idle_error_override
        if not self.traces:
            return None, None
        return idle_from_traces(self.run, self.pair)

    @property
    def idle(self) -> dict[str, dict[str, int]] | None:
        """Arm -> idle figures (ns) of the reference pair, None without traces."""
        return self._idle[0]

    @property
    def idle_error(self) -> str | None:
        """Why the trace analysis failed, if it did."""
        return self._idle[1]

    def entries(self, arm: str, *, profiled: bool | None = None) -> tuple[RunEntry, ...]:
        """Run entries of `arm` (only profiled or unprofiled ones when given), by index."""
        return tuple(e for e in self.run.arm(arm) if profiled is None or e.profiled == profiled)

    def responses(self, entry: RunEntry) -> list[dict[str, Any]]:
        """Service responses of the entry's measured requests."""
        return [r.get("response") or {} for r in self.clients[entry.name]["requests"]]
