"""The consecutive-requests notebook: per rank x request counts, the gates, and each normal
check's memory state. Counts and the replay gate are `residency.evidence` attributions
(`requests`, `replay_gate`): this module only renders them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from residency import evidence
from residency.analysis import stats
from residency.evidence import REQUEST_COLUMNS, Evidence, notes
from residency.policy.cache import CANDIDATE
from residency.rundir.run import Run

__all__ = ["check_gates", "consecutive_notes", "consecutive_summary", "consecutive_table",
           "fractions", "gate_failures"]

_GATE_KEYS = ("requests", "request_gates", "replay_gate", "normal_call_durations")


def _evidence(run: Run | Evidence) -> Evidence:
    if isinstance(run, Evidence):
        return run
    return evidence.build(run, traces=False, keys=_GATE_KEYS)


def consecutive_table(run: Run | Evidence) -> pd.DataFrame:
    """Per run x rank x measured request of the candidate arm: normal checks (retained /
    released), forced releases (released), telemetry errors and OOMs (None when the service
    did not report them). Warm-up requests excluded (the evidence's `requests`)."""
    ev = _evidence(run)
    a = ev.get("requests")
    rows = [] if a is None else [dict(r) for r in a.detail["rows"]]
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    df["oom"] = df["oom"].astype(object).where(df["oom"].notna(), None)
    df.attrs.update(device_kind=ev.device_kind, arm=CANDIDATE)
    return df


def consecutive_summary(run: Run | Evidence, table: pd.DataFrame | None = None, **extra: Any
                        ) -> dict[str, Any]:
    """The `results.json` of consecutive_requests: `device_kind`, `ranks`, `requests`,
    `normal_total`, `normal_retained`, `forced_total`, `forced_released`,
    `telemetry_errors`, `oom` (None when not reported), `service` (which service ran and
    what it reported), `request_attribution` (per run: how decisions were attributed to
    requests, how many lay outside every request and when), `attribution_note`, plus
    `extra`. `table` (from `consecutive_table`) is rendered when given."""
    t = consecutive_table(run) if table is None else table
    ev = _evidence(run)
    ooms = t["oom"].tolist()
    kind = run.device_kind
    return {"device_kind": kind, "ranks": int(t["rank"].nunique()),
            "requests": int(t[["run", "request"]].drop_duplicates().shape[0]),
            "normal_total": int(t["normal_checks"].sum()),
            "normal_retained": int(t["normal_retained"].sum()),
            "forced_total": int(t["forced"].sum()),
            "forced_released": int(t["forced_released"].sum()),
            "telemetry_errors": int(t["telemetry_errors"].sum()),
            "oom": None if not ooms or any(o is None for o in ooms) else int(sum(ooms)),
            "service": ev.to_dict()["service"],
            "request_attribution": [dict(r) for r in ev.request_assignment],
            "attribution_note": ev.assignment_note, **extra}


def consecutive_notes(summary: Mapping[str, Any]) -> dict[str, str]:
    """What the counts of `consecutive_summary` support (Clopper-Pearson 95 % intervals, on
    calls that are outcomes of a deterministic rule): `normal_retained`, `forced_released`."""
    out = {}
    said = False
    for key, total in (("normal_retained", "normal_total"), ("forced_released", "forced_total")):
        n = int(summary[total])
        if not n:
            out[key] = "No calls of this kind recorded: nothing to estimate."
            continue
        out[key] = notes.note(stats.proportion(int(summary[key]), n))
        if not said:  # the shared sentence once, under the first count (one page)
            out[key] += (" The calls are outcomes of a deterministic rule on each call's memory "
                         "state, clustered in ranks and requests: each interval describes these "
                         "calls, not a rate for other runs.")
            said = True
    return out


def gate_failures(run: Run | Evidence, *, arm: str = CANDIDATE) -> list[str]:
    """One sentence per failed gate (empty when all pass): `arm` has no normal decision;
    the consecutive-request gates from the attribution of decisions to requests (by time,
    for any service: a rank without decisions and its likely cause, the normal and forced
    calls per rank and measured request the service declares, telemetry errors, OOM; the
    evidence's `request_gates`); or any recorded normal decision (any arm, warm-up
    included) that disagrees with the policy's bounds rule replayed on its snapshot (the one
    replay gate, `residency.analysis.whatif.consistency`)."""
    ev = _evidence(run)
    failures = []
    durations = ev.get("normal_call_durations")
    if durations is None or not durations.n.get(arm):
        failures.append(f"The {arm} arm recorded no normal policy decision, so nothing was "
                        "checked.")
    requests = ev.get("request_gates")
    if arm == CANDIDATE and requests is not None:
        failures += list(requests.detail["failures"])
    gate = ev.get("replay_gate")
    mismatches = list(gate.detail["mismatches"]) if gate is not None else []
    if mismatches:
        text = [f"{m['run']} rank {m['rank']} {m['request_id']}: recorded "
                f"{m['recorded_outcome']} ({m['recorded_reason']}), re-evaluated on its "
                f"snapshot {m['replayed_outcome']} ({m['replayed_reason']})"
                for m in mismatches]
        more = f" (and {len(text) - 3} more)" if len(text) > 3 else ""
        failures.append(f"{len(text)} recorded decision(s) disagree with the policy "
                        f"re-evaluated on their snapshots: {'; '.join(text[:3])}{more}.")
    return failures


def check_gates(failures: Sequence[str]) -> None:
    """Raise `GateError` listing `failures` when there are any; print that all passed
    otherwise."""
    from residency.notebook.params import GateError

    if failures:
        raise GateError(failures)
    print("All gates passed: no telemetry error or OOM with the candidate, and every recorded "
          "normal decision matches the policy re-evaluated on its snapshot.")


FRACTION_COLUMNS = ["run", "rank", "request", "request_id", "cached_fraction", "free_fraction",
                    "outcome", "reason", "max_cached_fraction", "min_free_fraction"]


def fractions(run: Run, *, arm: str = CANDIDATE) -> pd.DataFrame:
    """Per normal decision of `arm`'s measured requests with a snapshot: cached fraction
    (max(0, reserved - allocated) / total), free fraction (free / total), outcome, reason,
    its bounds, rank and measured request number."""
    d = evidence.decisions_by_request(run)
    d = d[(d["run_arm"] == arm) & (d["kind"] == "normal") & ~d["warmup"].astype(bool)]
    d = d.dropna(subset=["reserved", "allocated", "free", "total"])
    d = d[d["total"] > 0].sort_values(["run_index", "start_ns"])
    rows = [{"run": r["run"], "rank": int(r["rank"]), "request": int(r["request"]) or None,
             "request_id": r["request_id"],
             "cached_fraction": max(0, int(r["reserved"]) - int(r["allocated"]))
             / int(r["total"]),
             "free_fraction": int(r["free"]) / int(r["total"]),
             "outcome": r["outcome"], "reason": r["reason"],
             "max_cached_fraction": float(r["max_cached_fraction"]),
             "min_free_fraction": float(r["min_free_fraction"])}
            for r in d.to_dict(orient="records")]
    df = pd.DataFrame(rows, columns=FRACTION_COLUMNS)
    df.attrs.update(device_kind=run.device_kind, arm=arm)
    return df
