"""What-if, priced and told: the effect model (predicted releases x per-call costs measured
in the same run's evidence), the notebook's `results.json` document and the text `residency
whatif RUN_DIR` prints. The replay itself is `residency.analysis.whatif`. No torch here."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from residency import devices, humanize
from residency.analysis import stats
from residency.analysis.whatif import (
    Policy,
    as_run,
    consistency,
    replay_run,
    totals,
)
from residency.humanize import csv_comment, csv_text
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

__all__ = ["EffectEstimate", "effect_lines", "estimated_effect", "gate_lines", "report",
           "results", "totals_lines"]

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
            "rows": _records(self.table), "note": self.note,
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
    from residency import evidence  # the evidence layer prices the calls

    run = as_run(run)
    ev = evidence.build(run, traces=False, keys=("normal_call_durations",))
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


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records", double_precision=15))


# ----------------------------------------------------------------------------- notebook
def _own(grid: pd.DataFrame) -> list[dict[str, float]]:
    return [{"max_cached_fraction": c, "min_free_fraction": f}
            for c, f in grid.attrs.get("own_settings", [])]


def results(gate: pd.DataFrame, bounded: pd.DataFrame, learned: pd.DataFrame,
            effect: EffectEstimate, *, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The `results.json` document of the notebook: device kind, gate, both grids' totals,
    the estimated effect, and `files` (name -> path) written beside it."""
    tb, tl = totals(bounded), totals(learned)
    return {
        "device_kind": bounded.attrs.get("device_kind"),
        "run": bounded.attrs.get("path"),
        "arm": bounded.attrs.get("arm"),
        "own_setting": _own(bounded),
        "consistency": {"checked": int(gate.attrs.get("checked", 0)),
                        "mismatches": _records(gate), "passed": gate.empty},
        "bounded": _records(tb.drop(columns=["released_per_rank"])),
        "learned_budget": _records(tl.drop(columns=["released_per_rank"])),
        "estimated_effect": effect.to_dict(),
        "skipped": bounded.attrs.get("skipped", {}),
        "note": _replay_note(bounded),
        "files": dict(files or {}),
    }


# ----------------------------------------------------------------------------- formatters
def _replay_note(grid: pd.DataFrame) -> str:
    a = grid.attrs
    skipped = a.get("skipped") or {}
    skip = ("; not replayable (no snapshot): " + ", ".join(
        f"{n} {r}" for r, n in sorted(skipped.items()))) if skipped else ""
    warm = ("warm-up requests excluded from the counts (replayed first only to carry the "
            "learned budget's peak: warmup_* columns)" if a.get("warmup", True) else
            "warm-up requests excluded (not replayed either)")
    return (f"calls: normal decisions with a memory snapshot of the {a.get('arm')} arm's "
            f"measured requests, runs {', '.join(a.get('runs', []))}; {warm}"
            f"{skip}. The replay re-evaluates the recorded snapshots; it does not model how a "
            f"different decision would have changed later memory states. "
            f"{devices.note(str(a.get('device_kind')))}")


def gate_lines(gate: pd.DataFrame) -> list[str]:
    """The consistency gate's verdict, and one line per mismatch."""
    a = gate.attrs
    own = ", ".join(f"max_cached_fraction {c:g}, min_free_fraction {f:g}"
                    for c, f in a.get("own_settings", []))
    what = (f"{a.get('checked')} recorded normal decisions (runs {', '.join(a.get('runs', []))};"
            f" ranks {', '.join(map(str, a.get('ranks', [])))}) replayed with their own bounds "
            f"({own}); warm-up decisions included, unlike the counts below, which are of the "
            "measured requests only")
    if gate.empty:
        return [f"Consistency gate: PASS: all {what} reproduced their recorded outcome and "
                "reason."]
    lines = [f"Consistency gate: FAIL: {len(gate)} of {what} differ:"]
    for r in gate.itertuples(index=False):
        lines.append(f"  run {r.run} rank {r.rank} request {r.request_id} start_ns {r.start_ns}:"
                     f" recorded {r.recorded_outcome} ({r.recorded_reason}), replayed "
                     f"{r.replayed_outcome} ({r.replayed_reason}); cached {r.cached} free "
                     f"{r.free} total {r.total}")
    return lines


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    from residency.humanize import write_markdown_table

    return write_markdown_table(header, rows).rstrip("\n").split("\n")


def _pct(x: float) -> str:
    return humanize.percent(x)


def totals_lines(grid: pd.DataFrame) -> list[str]:
    """Markdown lines: per setting retained/released totals, the own setting marked `*`."""
    a = grid.attrs
    t = totals(grid)
    ranks = sorted(int(r) for r in grid["rank"].unique())
    rows = [(f"{r.max_cached_fraction:g}{' *' if r.own else ''}", f"{r.min_free_fraction:g}",
             r.calls, r.retained, r.released, _pct(r.retention_rate),
             ", ".join(f"r{k} {v}" for k, v in zip(ranks, r.released_per_rank, strict=True)),
             f"{r.warmup_released}/{r.warmup_calls}")
            for r in t.itertuples(index=False)]
    head = ("max_cached_fraction", "min_free_fraction", "calls", "retained", "released",
            "retention", "released per rank", "warm-up released/calls (not counted)")
    return ([f"### What-if: {a.get('policy')} policy on {Path(str(a.get('path'))).name} "
             f"(device kind {a.get('device_kind')})", ""] + _md_table(head, rows)
            + ["", f"*`*` marks the run's own bounds. {_replay_note(grid)}*"])


def effect_lines(effect: EffectEstimate) -> list[str]:
    """Markdown lines: the estimated normal-call time per setting, and the model's note."""
    def ms(x: float) -> str:
        return "n/a" if not math.isfinite(x) else humanize.sig(x)

    rows = [(f"{r.max_cached_fraction:g}{' *' if r.own else ''}", f"{r.min_free_fraction:g}",
             f"{r.released}/{r.calls}", ms(r.estimated_ms),
             "n/a" if not (math.isfinite(r.estimated_low_ms)
                           and math.isfinite(r.estimated_high_ms))
             else humanize.span_text(r.estimated_low_ms, r.estimated_high_ms, ""),
             "n/a" if not math.isfinite(r.delta_vs_own_ms) else humanize.signed(r.delta_vs_own_ms))
            for r in effect.table.itertuples(index=False)]
    head = ("max_cached_fraction", "min_free_fraction", "measured released/calls",
            "estimated ms", "low-high ms", "vs own ms")
    return (["### Estimated effect on normal-call time (a model, not a measurement)", ""]
            + _md_table(head, rows) + ["", f"*Units: ms, summed over ranks. {effect.note}*"])


# ----------------------------------------------------------------------------- report
def report(run: Run, *, cached: str = "0.05:0.5:0.05", free: str = "0.01:0.2:0.01",
           policy: Policy = "bounded", arm: str = CANDIDATE, fmt: str = "md"
           ) -> tuple[str, bool]:
    """What `residency whatif` prints: the gate, then (only when it passes) the totals and
    the effect, as `fmt` (md, csv or json); returns (text, gate passed).

    Raises:
        WhatIfError: a bad range or policy, or nothing to replay.
    """
    gate = consistency(run)
    grid = effect = None
    if gate.empty:
        grid = replay_run(run, cached=cached, free=free, policy=policy, arm=arm)
        effect = estimated_effect(run, grid)
    if fmt == "json":
        doc: dict[str, Any] = {"consistency": {
            "passed": gate.empty, "checked": gate.attrs["checked"],
            "mismatches": _records(gate)}}
        if grid is not None and effect is not None:
            doc["whatif"] = {"policy": policy, "device_kind": run.device_kind,
                             "own_settings": _own(grid),
                             "note": _replay_note(grid), "rows": _records(grid),
                             "totals": _records(totals(grid))}
            doc["estimated_effect"] = effect.to_dict()
        text = json.dumps(doc, indent=2, ensure_ascii=False)
    elif fmt == "csv":
        parts = [csv_comment(line) for line in gate_lines(gate)]
        if not gate.empty:
            parts.append(csv_text(gate).rstrip("\n"))
        if grid is not None and effect is not None:
            parts += ["", csv_comment(_replay_note(grid)), csv_text(grid).rstrip("\n"),
                      "", csv_comment(effect.note), csv_text(effect.table).rstrip("\n")]
        text = "\n".join(parts)
    else:
        lines = gate_lines(gate)
        if grid is not None and effect is not None:
            lines += ["", *totals_lines(grid), "", *effect_lines(effect)]
        else:
            lines.append("What-if not computed: the replay does not reproduce the recorded "
                         "decisions, so its counts for other bounds would not be trustworthy.")
        text = "\n".join(lines)
    return text, gate.empty
