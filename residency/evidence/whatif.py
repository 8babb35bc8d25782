"""The effect model of a what-if replay: predicted releases (`residency.analysis.whatif`)
priced with per-call costs measured in the same run's evidence (`estimated_effect`,
`EffectEstimate`): a model, computed here once; `residency.reports.whatif` tells it. No torch
here."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from residency import devices, humanize
from residency.analysis import stats
from residency.analysis.whatif import as_run, totals
from residency.evidence.attributions import build
from residency.jsonio import frame_records
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

__all__ = ["EffectEstimate", "estimated_effect"]


# ----------------------------------------------------------------------------- effect
@dataclass(frozen=True, eq=False)
class EffectEstimate:
    """Predicted releases combined with per-call costs measured in the same run: a model.

    `table`: one row per setting: measured calls, predicted `released`/`retained`,
    `estimated_ms` (median costs), `estimated_low_ms`/`estimated_high_ms` (fastest/slowest
    observed costs), `delta_vs_own_ms`; NaN where a cost was not measured. Costs in ms.
    """

    policy: str
    device_kind: str
    release_cost_ms: float | None
    retain_cost_ms: float | None
    release_samples: tuple[float, ...]
    retain_samples: tuple[float, ...]
    release_source: str
    retain_source: str
    cost_test: str | None
    cost_p_value: float | None
    recorded_ms: float
    own_estimated_ms: float | None
    table: pd.DataFrame
    note: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (the table as a list of row objects)."""
        return {
            "policy": self.policy, "device_kind": self.device_kind,
            "release_cost_ms": self.release_cost_ms, "retain_cost_ms": self.retain_cost_ms,
            "release_samples": len(self.release_samples),
            "retain_samples": len(self.retain_samples),
            "release_source": self.release_source, "retain_source": self.retain_source,
            "cost_test": self.cost_test, "cost_p_value": self.cost_p_value,
            "recorded_ms": self.recorded_ms, "own_estimated_ms": self.own_estimated_ms,
            "rows": frame_records(self.table), "note": self.note,
        }

    def __repr__(self) -> str:
        rel = ("n/a" if self.release_cost_ms is None else
               humanize.full_number(self.release_cost_ms))
        ret = "n/a" if self.retain_cost_ms is None else humanize.full_number(self.retain_cost_ms)
        return (f"<EffectEstimate {self.policy}, {len(self.table)} settings: release {rel} ms, "
                f"retained check {ret} ms per call>\n  {self.note}")


def _cost_samples(ev: Any, arm: str, outcome: str) -> tuple[list[float], list[str]]:
    """Durations (ms) and run names of `arm`'s measured normal calls with `outcome`, from
    the evidence's `normal_call_durations` attribution."""
    a = ev.get("normal_call_durations")
    if a is None or arm not in a.values:
        return [], []
    keep = [i for i, o in enumerate(a.detail["outcome"][arm]) if o == outcome]
    return ([float(a.values[arm][i]) for i in keep],
            [str(a.detail["run"][arm][i]) for i in keep])


def _per_run_medians(values: list[float], runs: list[str]) -> list[float]:
    by_run: dict[str, list[float]] = {}
    for v, r in zip(values, runs, strict=True):
        by_run.setdefault(r, []).append(v)
    return [float(np.median(v)) for _, v in sorted(by_run.items())]


def _ms(x: float | None) -> str:
    return "n/a" if x is None else humanize.quantity(x, "ms")


def estimated_effect(run: Run | str | os.PathLike[str], grid: pd.DataFrame) -> EffectEstimate:
    """Estimated normal-call time of the measured requests under each setting of `grid`.

    Per setting: predicted releases x the median duration of a release, plus predicted
    retained checks x the median duration of a retained check, summed over ranks. A release
    costs what baseline-arm normal calls that released took (candidate-arm releases when the
    baseline has none); a retained check what candidate-arm normal calls that retained took;
    both from the measured requests of `run`. The note says what the model leaves out.
    """
    run = as_run(run)
    ev = build(run, traces=False, keys=("normal_call_durations",))
    tot = totals(grid)
    arm = grid.attrs.get("arm") or CANDIDATE
    release, release_runs = _cost_samples(ev, BASELINE, "released")
    release_source = "baseline-arm normal calls that released"
    own_releases, own_release_runs = _cost_samples(ev, CANDIDATE, "released")
    if not release:
        release, release_runs = own_releases, own_release_runs
        release_source = "candidate-arm normal calls that released (the baseline released none)"
    retain, retain_runs = _cost_samples(ev, CANDIDATE, "retained")
    retain_source = "candidate-arm normal calls that retained"
    rel_ms = float(np.median(release)) if release else None
    ret_ms = float(np.median(retain)) if retain else None
    durations = ev.get("normal_call_durations")
    recorded = float(sum(durations.values.get(arm, ()))) if durations is not None else 0.0

    def est(rel_cost: float | None, ret_cost: float | None) -> pd.Series:
        if rel_cost is None or ret_cost is None:
            return pd.Series(np.nan, index=tot.index)
        return tot["released"] * rel_cost + tot["retained"] * ret_cost

    table = tot[["policy", "max_cached_fraction", "min_free_fraction", "own",
                 "calls", "released", "retained"]].copy()
    table["estimated_ms"] = est(rel_ms, ret_ms)
    table["estimated_low_ms"] = est(min(release, default=None), min(retain, default=None))
    table["estimated_high_ms"] = est(max(release, default=None), max(retain, default=None))
    own_rows = table[table["own"]]
    own_ms = float(own_rows["estimated_ms"].iloc[0]) if len(own_rows) and \
        math.isfinite(own_rows["estimated_ms"].iloc[0]) else None
    table["delta_vs_own_ms"] = table["estimated_ms"] - own_ms if own_ms is not None else np.nan
    table.attrs.update(grid.attrs)

    test = p = None
    if release and retain:
        b_runs = _per_run_medians(release, release_runs)
        c_runs = _per_run_medians(retain, retain_runs)
        cmp = stats.compare_groups(b_runs, c_runs, unit="ms", replicate="run")
        test, p = cmp.test, cmp.p_value
        costs = (f"Per-call costs from this run's measured requests: a release "
                 f"{_ms(rel_ms)} median ({len(release)} {release_source}, "
                 f"{_ms(min(release))}-{_ms(max(release))}), a retained check {_ms(ret_ms)} "
                 f"median ({len(retain)} {retain_source}, {_ms(min(retain))}-"
                 f"{_ms(max(retain))}). Judged on the run as the unit (each run's median call, "
                 f"{len(b_runs)} vs {len(c_runs)} runs; calls of one run are not independent "
                 f"replicates): {cmp.test}, p={humanize.p_text(cmp.p_value)} "
                 f"({'significant' if cmp.p_value < stats.ALPHA else 'Not significant'} at "
                 f"the 5 % level).")
    else:
        missing = [w for w, s in (("release", release), ("retained check", retain)) if not s]
        costs = (f"No estimate: this run's measured requests hold no {' and no '.join(missing)}"
                 f" (a release: {release_source}; a retained check: {retain_source}); rerun a "
                 "profiled pair whose baseline arm releases and whose candidate arm retains.")
    if own_releases and release_source.startswith(BASELINE):
        costs += (f" The candidate arm's own {len(own_releases)} releases took "
                  f"{_ms(float(np.median(own_releases)))} median (not used by the model).")
    calib = ""
    if own_ms is not None:
        calib = (f" At the run's own setting the model gives {_ms(own_ms)} against "
                 f"{_ms(recorded)} of normal-call time measured in the {arm} arm.")
    elif own_rows.empty:
        calib = (" The run's own bounds are not on this grid: no check of the model against "
                 f"the {_ms(recorded)} of normal-call time measured in the {arm} arm.")
    # (the device's own note closes the replay note shown beside this one: not said twice)
    device = (f"Its costs are measured on {devices.label(run.device_kind)}: not NPU figures."
              if devices.emulated(run.device_kind) else "")
    note = (f"A model, not a measurement: estimated normal-call time of the measured requests ="
            f" predicted releases x median release cost + predicted retained checks x median "
            f"retained-check cost, summed over ranks; low/high use the fastest/slowest observed "
            f"costs. {costs}{calib} It leaves out what a release costs after the call (the next"
            f" stage re-acquires the memory), and that under other bounds a release changes the "
            f"memory state later calls would see (the replay keeps the recorded snapshots). "
            f"{device}")
    return EffectEstimate(
        policy=str(grid.attrs.get("policy", "bounded")), device_kind=run.device_kind,
        release_cost_ms=rel_ms, retain_cost_ms=ret_ms, release_samples=tuple(release),
        retain_samples=tuple(retain), release_source=release_source,
        retain_source=retain_source, cost_test=test, cost_p_value=p, recorded_ms=recorded,
        own_estimated_ms=own_ms, table=table, note=note)
