"""What-if: replay the memory snapshots a run recorded through other bounds and policies.

Every normal policy call of an arm whose telemetry worked recorded the snapshot it saw
(`docs/contracts.md`, decisions JSONL). Re-evaluating those snapshots answers "what would
other bounds, or the learned budget, have done with the same memory states" without
re-running the workload:

* `replayable(run)`: the decisions that can be replayed, in replay order;
* `consistency(run)`: the gate: replaying every decision with its own recorded bounds must
  reproduce its recorded outcome and reason; returns the mismatches (empty: passed);
* `replay_run(run, cached=..., free=..., policy=...)`: retained/released counts per
  (setting, rank); `totals(grid)` sums them per setting;
* `estimated_effect(run, grid)`: predicted releases x measured per-call costs: a model;
* `report(run, ...)`: what `residency whatif RUN_DIR` prints.

Which decisions are replayed: normal calls that carry a snapshot (a call whose telemetry
failed saw no memory state; forced calls read none), of every run of the chosen arm
(default `candidate`), warm-up requests included by default because the learned budget's
peak accumulates across them; counts of measured requests are reported separately.

The two policies, on one snapshot (cached = max(0, reserved - allocated), all in bytes):

* `bounded` (`residency.policy.retains`): retain iff cached <= int(total * max_cached_fraction)
  and free >= int(total * min_free_fraction); the cached bound is checked first, so a call
  crossing both is reported as `cached-bound`;
* `learned-budget` (vLLM-Omni PR #6629, `module_residency.BoundedAllocatorCache._should_release`
  at vllm-project/vllm-omni 6a9867f3f304f3ae973a2c1a08d72b4bfffa5022): retain iff
  cached <= min(int(peak * 1.25), int(total * max_cached_fraction)) and the same free floor,
  where `peak` is the largest cached value of the *earlier* replayed calls of the same rank in
  the same service run (0 before the first). As upstream, the call is decided against the
  pre-observation budget and its own cached value then updates the peak, whatever the
  outcome; so the first call with cached > 0 of every rank releases. Upstream resets the peak
  when the last stager detaches; a run's decisions do not record detaches, so the peak is
  kept for the whole service run (one run directory entry) and starts at 0 in each.

Replay order: per run entry and rank, requests in the order they first appear in the
decisions file, calls by `start_ns` within a request (monotonic within a rank's process).

What a replay cannot tell: snapshots were taken on the trajectory the recorded policy
produced; under other bounds a release would change the memory state later calls see. The
counts are those of the recorded memory states, not of a re-run. No torch here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from residency import stats
from residency.evidence import load_decisions
from residency.policy import crossed_bounds, limit_bytes
from residency.rundir import Run, RunDirError, load_run

Policy = Literal["bounded", "learned-budget"]
POLICIES: tuple[str, ...] = ("bounded", "learned-budget")
PEAK_MARGIN = 1.25  # upstream `_OBSERVED_PEAK_MARGIN`
DEFAULT_CACHED = (0.05, 0.5, 0.05)
DEFAULT_FREE = (0.01, 0.2, 0.01)
MAX_POINTS = 1001  # per range
_DECIMALS = 12  # grid values are rounded to this many decimals (float-safe)
SNAPSHOT = ("reserved", "allocated", "free", "total")
GRID_COLUMNS = (
    "policy", "max_cached_fraction", "min_free_fraction", "own", "rank", "calls", "retained",
    "released", "retention_rate", "warmup_calls", "warmup_released",
)
MISMATCH_COLUMNS = (
    "run", "arm", "rank", "request_id", "start_ns", "recorded_outcome", "recorded_reason",
    "replayed_outcome", "replayed_reason", "cached", "free", "total", "max_cached_fraction",
    "min_free_fraction",
)

__all__ = [
    "DEFAULT_CACHED", "DEFAULT_FREE", "POLICIES", "EffectEstimate", "WhatIfError",
    "consistency", "report",
    "device_note", "effect_lines", "estimated_effect", "gate_lines",
    "parse_range", "replay_decisions", "replay_run", "replayable",
    "results", "totals", "totals_lines",
]


class WhatIfError(ValueError):
    """An input the what-if cannot use: a bad range or policy, or a run with nothing to replay.

    Notebooks show its one-sentence message without a traceback.
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of a traceback: the message alone."""
        return [f"WhatIfError: {self}"]


# ----------------------------------------------------------------------------- ranges
def parse_range(value: str | float | Sequence[float], *, name: str = "range"
                ) -> tuple[float, ...]:
    """The inclusive grid `start:stop:step` (or one value) as fractions rounded to 12 decimals.

    Accepts `"0.05:0.5:0.05"`, `"0.25"`, a number, or a `(start, stop, step)` tuple.

    Raises:
        WhatIfError: naming `name`, when the text is malformed, a bound lies outside [0, 1],
            start > stop, step <= 0, or the grid would exceed 1001 values.
    """
    def bad(why: str) -> WhatIfError:
        return WhatIfError(f"The value for `{name}` must be 'start:stop:step' or one value, "
                          f"fractions in [0, 1] with start <= stop and step > 0 ({why}), but "
                          f"{value!r} was passed.")

    if isinstance(value, bool):
        raise bad("not a number")
    if isinstance(value, str):
        parts = value.strip().split(":")
        if len(parts) not in (1, 3):
            raise bad(f"{len(parts)} fields")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            raise bad("not a number") from None
    elif isinstance(value, (int, float, np.integer, np.floating)):
        nums = [float(value)]
    elif isinstance(value, Sequence) and len(value) == 3:
        try:
            nums = [float(v) for v in value]
        except (TypeError, ValueError):
            raise bad("not a number") from None
    else:
        raise bad("unsupported type")
    if not all(math.isfinite(x) for x in nums):
        raise bad("not finite")
    start, stop, step = (nums[0], nums[0], 1.0) if len(nums) == 1 else nums
    if not 0.0 <= start <= 1.0 or not 0.0 <= stop <= 1.0:
        raise bad("outside [0, 1]")
    if start > stop:
        raise bad("start > stop")
    if step <= 0:
        raise bad("step <= 0")
    span = (stop - start) / step  # inf when the step is a subnormal: too many values
    count = math.floor(span + 1e-9) + 1 if math.isfinite(span) and span < 2**53 else 2**53
    if count > MAX_POINTS:
        raise bad(f"{count} values, at most {MAX_POINTS}")
    values = tuple(round(start + i * step, _DECIMALS) for i in range(count))
    return tuple(v for v in values if v <= round(stop, _DECIMALS))


# ----------------------------------------------------------------------------- loading
def _as_run(run: Run | str | os.PathLike[str]) -> Run:
    return run if isinstance(run, Run) else load_run(Path(run))


def _nothing(run: Run, arm: str | None, why: str) -> WhatIfError:
    which = "any arm" if arm is None else f"the {arm} arm"
    return WhatIfError(f"Nothing can be replayed from {run.path} ({which}, device kind "
                      f"{run.device_kind}): {why}")


def replayable(run: Run | str | os.PathLike[str], *, arm: str | None = "candidate",
               warmup: bool = True) -> pd.DataFrame:
    """The normal decisions of `arm` (None: every arm) that carry a snapshot, in replay order.

    One row per decision with the decisions columns plus `run` (entry name), `cached` and
    `prev_peak` (largest cached of the earlier replayed calls of the same run and rank, 0 at
    first; int64 bytes). `attrs`: `runs`, `skipped` (normal decisions without a snapshot, by
    reason), `own_settings` ([(max_cached_fraction, min_free_fraction)] recorded).

    Raises:
        WhatIfError: no run of `arm`, or none of its normal decisions has a snapshot (says why:
            e.g. every call failed to read telemetry).
        RunDirError: a snapshot field is not an integer or a recorded fraction is missing.
    """
    run = _as_run(run)
    entries = run.runs if arm is None else run.arm(arm)
    if not entries:
        arms = sorted({e.arm for e in run.runs}) or ["none"]
        raise _nothing(run, arm, f"the run has no run of that arm (arms present: "
                       f"{', '.join(arms)}).")
    frames: list[pd.DataFrame] = []
    skipped: dict[str, int] = {}
    normal_total = 0
    every = load_decisions(run)  # the one assignment of decisions to requests and warm-up
    for entry in entries:
        df = every[every["run"] == entry.name]
        if not warmup:
            df = df[~df["warmup"].astype(bool)]
        normal = df[df["kind"] == "normal"].drop(columns=["run_arm", "profiled", "run_index",
                                                          "request"])
        normal_total += len(normal)
        has = normal[list(SNAPSHOT)].notna().all(axis=1) & (normal["reason"] != "always-release")
        for reason, n in normal.loc[~has, "reason"].fillna("unknown").value_counts().items():
            skipped[str(reason)] = skipped.get(str(reason), 0) + int(n)
        if has.any():
            frames.append(_ordered(normal[has].assign(run=entry.name), run, entry.name))
    if not frames:
        if normal_total == 0:
            why = "it recorded no normal policy calls."
        else:
            counts = ", ".join(f"{n} {r}" for r, n in sorted(skipped.items()))
            why = (f"none of its {normal_total} normal decisions carries a memory snapshot "
                   f"({counts}).")
            if "telemetry-unavailable" in skipped:
                why += (" A call whose telemetry could not be read saw no memory state (the bug"
                        " this suite reproduces: torch.accelerator on an NPU), so there is "
                        "nothing to re-evaluate.")
            if "always-release" in skipped:
                why += " An always-release arm reads no telemetry at all."
            why += " Replay a candidate run whose telemetry worked."
        raise _nothing(run, arm, why)
    out = pd.concat(frames, ignore_index=True)
    own = sorted({(round(float(c), _DECIMALS), round(float(f), _DECIMALS)) for c, f in
                  zip(out["max_cached_fraction"], out["min_free_fraction"], strict=True)})
    out.attrs.update(runs=[e.name for e in entries], skipped=skipped, own_settings=own,
                     device_kind=run.device_kind, path=str(run.path), arm=arm, warmup=warmup)
    return out


def _int_column(col: pd.Series) -> pd.Series | None:
    """`col` as int64 when every value is an integer (a float column holding whole numbers
    included: JSON nulls elsewhere make pandas read integers as floats), else None."""
    if pd.api.types.is_bool_dtype(col):
        return None
    if pd.api.types.is_integer_dtype(col):
        return col.astype("int64")
    if pd.api.types.is_float_dtype(col):
        values = col.to_numpy()
        ok = np.isfinite(values).all() and (values == np.floor(values)).all()
        return col.astype("int64") if ok else None
    if all((isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
           or (isinstance(v, float) and v.is_integer()) for v in col):
        return col.astype("int64")
    return None


def _ordered(df: pd.DataFrame, run: Run, name: str) -> pd.DataFrame:
    df = df.reset_index(drop=True)
    ints: dict[str, pd.Series] = {}
    for k in SNAPSHOT:
        col = _int_column(df[k])
        if col is None:
            raise RunDirError(run.path / "runs" / name, f"a snapshot field `{k}` is not an "
                              "integer", field="snapshot")
        ints[k] = col
    for k in ("max_cached_fraction", "min_free_fraction"):
        values = pd.to_numeric(df[k], errors="coerce")
        if values.isna().any() or not values.between(0, 1).all():
            raise RunDirError(run.path / "runs" / name, "a normal decision lacks a recorded "
                              "fraction in [0, 1]", field=k)
        ints[k] = values.astype("float64")
    df = df.assign(**ints)
    df["cached"] = (df["reserved"] - df["allocated"]).clip(lower=0)
    df["_line"] = np.arange(len(df))
    df["_request"] = df.groupby("rank", sort=False)["request_id"].transform(
        lambda s: pd.factorize(s.fillna("\0none"))[0])
    df = df.sort_values(["rank", "_request", "start_ns", "_line"], kind="stable")
    prev = df.groupby("rank", sort=False)["cached"].transform(
        lambda s: s.cummax().shift(1, fill_value=0))
    df["prev_peak"] = prev.astype("int64")
    return df.drop(columns=["_line", "_request"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- engine
def _flags(d: pd.DataFrame, max_cached: Any, min_free: Any, policy: str
           ) -> tuple[np.ndarray, np.ndarray]:
    """(cached over its limit, free under its floor); fractions broadcast against rows."""
    if policy not in POLICIES:
        raise WhatIfError(f"The value for `policy` must be one of {list(POLICIES)}, but "
                         f"{policy!r} was passed.")
    total = d["total"].to_numpy(np.int64)
    max_cached = np.asarray(max_cached, dtype=np.float64)
    min_free = np.asarray(min_free, dtype=np.float64)
    budget = None
    if policy == "learned-budget":  # upstream's variant tightens the cached limit only
        peak = d["prev_peak"].to_numpy(np.int64)
        budget = np.minimum(limit_bytes(peak.astype(np.float64), PEAK_MARGIN),
                            limit_bytes(total.astype(np.float64), max_cached))
    return crossed_bounds(d["cached"].to_numpy(np.int64), d["free"].to_numpy(np.int64),
                          total.astype(np.float64), max_cached, min_free, cached_limit=budget)


def replay_decisions(decisions: pd.DataFrame, *, max_cached_fraction: float | None = None,
                     min_free_fraction: float | None = None, policy: Policy = "bounded"
                     ) -> pd.DataFrame:
    """`decisions` (from `replayable`) with `replayed_outcome` and `replayed_reason` added.

    A fraction left None is each decision's own recorded one.
    """
    c = decisions["max_cached_fraction"].to_numpy(float) if max_cached_fraction is None \
        else float(max_cached_fraction)
    f = decisions["min_free_fraction"].to_numpy(float) if min_free_fraction is None \
        else float(min_free_fraction)
    over, under = _flags(decisions, c, f, policy)
    reason = np.where(over, "cached-bound", np.where(under, "free-bound", "within-bounds"))
    out = decisions.copy()
    out["replayed_reason"] = reason
    out["replayed_outcome"] = np.where(over | under, "released", "retained")
    return out


def consistency(run: Run | str | os.PathLike[str], *, arm: str | None = None) -> pd.DataFrame:
    """Mismatches of replaying every replayable decision with its own recorded bounds.

    Bounded policy (what the recorded runs executed); outcome and reason must both match.
    Empty frame: the gate passed. `attrs`: `checked` (decisions replayed), `runs`, `arm`.

    Raises:
        WhatIfError: nothing can be replayed (see `replayable`).
    """
    d = replay_decisions(replayable(run, arm=arm, warmup=True))
    bad = d[(d["replayed_outcome"] != d["outcome"]) | (d["replayed_reason"] != d["reason"])]
    out = bad.rename(columns={"outcome": "recorded_outcome", "reason": "recorded_reason"})
    out = out[list(MISMATCH_COLUMNS)].reset_index(drop=True)
    out.attrs.update(checked=len(d), runs=list(d["run"].unique()), arm=arm,
                     ranks=sorted(int(r) for r in d["rank"].unique()),
                     own_settings=d.attrs["own_settings"])
    return out


def replay_run(run: Run | str | os.PathLike[str], *,
               cached: str | float | Sequence[float] = DEFAULT_CACHED,
               free: str | float | Sequence[float] = DEFAULT_FREE, policy: Policy = "bounded",
               arm: str = "candidate", warmup: bool = True) -> pd.DataFrame:
    """Retained/released counts of the replayed decisions, one row per (setting, rank).

    A setting is (`max_cached_fraction` from `cached`, `min_free_fraction` from `free`); both
    are ranges as `parse_range` reads them. One scope rule with every other view:
    `calls`/`retained`/`released`/`retention_rate` count the calls of measured requests only;
    warm-up decisions are replayed first (when `warmup`) because the learned budget's peak
    carries across them, and are counted apart in `warmup_calls`/`warmup_released`. `own`
    marks the run's recorded bounds. `attrs` carry the run's path, device kind, arm, policy,
    runs, skipped decisions and own settings.

    Raises:
        WhatIfError: a bad range or policy, or nothing can be replayed (see `replayable`).
    """
    cs = np.array(parse_range(cached, name="cached"))
    fs = np.array(parse_range(free, name="free"))
    if policy not in POLICIES:
        raise WhatIfError(f"The value for `policy` must be one of {list(POLICIES)}, but "
                         f"{policy!r} was passed.")
    d = replayable(run, arm=arm, warmup=warmup)
    over, under = _flags(d, cs[:, None], fs[:, None], policy)  # (C, N), (F, N)
    released = over[:, None, :] | under[None, :, :]  # (C, F, N)
    ranks = np.sort(d["rank"].unique())
    onehot = (d["rank"].to_numpy()[:, None] == ranks[None, :]).astype(np.int64)  # (N, R)
    measured = (~d["warmup"].astype(bool).to_numpy()).astype(np.int64)
    flat = released.reshape(-1, len(d)).astype(np.int64)
    mrel = flat @ (onehot * measured[:, None])  # (C*F, R)
    wrel = flat @ (onehot * (1 - measured)[:, None])
    mcalls = (onehot * measured[:, None]).sum(axis=0)
    wcalls = (onehot * (1 - measured)[:, None]).sum(axis=0)
    cc, ff = np.meshgrid(cs, fs, indexing="ij")
    own = set(d.attrs["own_settings"])
    rows = []
    for i, (c, f) in enumerate(zip(cc.ravel(), ff.ravel(), strict=True)):
        for j, rank in enumerate(ranks):
            rate = (mcalls[j] - mrel[i, j]) / mcalls[j] if mcalls[j] else math.nan
            rows.append((policy, float(c), float(f), (float(c), float(f)) in own, int(rank),
                         int(mcalls[j]), int(mcalls[j] - mrel[i, j]), int(mrel[i, j]),
                         float(rate), int(wcalls[j]), int(wrel[i, j])))
    grid = pd.DataFrame(rows, columns=list(GRID_COLUMNS))
    grid.attrs.update({**d.attrs, "policy": policy})
    return grid


def totals(grid: pd.DataFrame) -> pd.DataFrame:
    """Per-setting sums over ranks of a `replay_run` frame (same columns but `rank`)."""
    keys = ["policy", "max_cached_fraction", "min_free_fraction", "own"]
    counts = ["calls", "retained", "released", "warmup_calls", "warmup_released"]
    out = grid.groupby(keys, sort=False, as_index=False)[counts].sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        out.insert(7, "retention_rate", out["retained"] / out["calls"].replace(0, np.nan))
    out["released_per_rank"] = grid.groupby(keys, sort=False)["released"].agg(list).to_list()
    out.attrs.update(grid.attrs)
    return out


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
        rel = "n/a" if self.release_cost_ms is None else f"{stats.fmt_num(self.release_cost_ms)}"
        ret = "n/a" if self.retain_cost_ms is None else f"{stats.fmt_num(self.retain_cost_ms)}"
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
    return "n/a" if x is None else f"{stats.fmt_num(round(x, 6))} ms"


def estimated_effect(run: Run | str | os.PathLike[str], grid: pd.DataFrame) -> EffectEstimate:
    """Estimated normal-call time of the measured requests under each setting of `grid`.

    Per setting: predicted releases x the median duration of a release, plus predicted
    retained checks x the median duration of a retained check, summed over ranks. A release
    costs what baseline-arm normal calls that released took (candidate-arm releases when the
    baseline has none); a retained check what candidate-arm normal calls that retained took;
    both from the measured requests of `run`. The note says what the model leaves out.
    """
    from residency import evidence

    run = _as_run(run)
    ev = evidence.build(run, traces=False, keys=("normal_call_durations",))
    tot = totals(grid)
    arm = grid.attrs.get("arm") or "candidate"
    release, release_runs = _cost_samples(ev, "baseline", "released")
    release_source = "baseline-arm normal calls that released"
    own_releases, own_release_runs = _cost_samples(ev, "candidate", "released")
    if not release:
        release, release_runs = own_releases, own_release_runs
        release_source = "candidate-arm normal calls that released (the baseline released none)"
    retain, retain_runs = _cost_samples(ev, "candidate", "retained")
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
                 f"replicates): {cmp.test}, p={stats.fmt_p(cmp.p_value)} "
                 f"({'significant' if cmp.p_value < stats.ALPHA else 'Not significant'} at "
                 f"the 5 % level).")
    else:
        missing = [w for w, s in (("release", release), ("retained check", retain)) if not s]
        costs = (f"No estimate: this run's measured requests hold no {' and no '.join(missing)}"
                 f" (a release: {release_source}; a retained check: {retain_source}); rerun a "
                 "profiled pair whose baseline arm releases and whose candidate arm retains.")
    if own_releases and release_source.startswith("baseline"):
        costs += (f" The candidate arm's own {len(own_releases)} releases took "
                  f"{_ms(float(np.median(own_releases)))} median (not used by the model).")
    calib = ""
    if own_ms is not None:
        calib = (f" At the run's own setting the model gives {_ms(own_ms)} against "
                 f"{_ms(recorded)} of normal-call time measured in the {arm} arm.")
    elif own_rows.empty:
        calib = (" The run's own bounds are not on this grid: no check of the model against "
                 f"the {_ms(recorded)} of normal-call time measured in the {arm} arm.")
    device = device_note(run.device_kind)
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


def device_note(kind: str) -> str:
    """One sentence naming the device kind; for `emulated-npu`, that these are not NPU figures."""
    from residency import devices

    return devices.note(kind)


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
            f"{device_note(str(a.get('device_kind')))}")


def gate_lines(gate: pd.DataFrame) -> list[str]:
    """The consistency gate's verdict, and one line per mismatch."""
    a = gate.attrs
    own = ", ".join(f"max_cached_fraction {c:g}, min_free_fraction {f:g}"
                    for c, f in a.get("own_settings", []))
    what = (f"{a.get('checked')} recorded normal decisions (runs {', '.join(a.get('runs', []))};"
            f" ranks {', '.join(map(str, a.get('ranks', [])))}) replayed with their own bounds "
            f"({own})")
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
    from residency.tables import markdown_table

    return markdown_table(header, rows).rstrip("\n").split("\n")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


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
        return "n/a" if not math.isfinite(x) else f"{x:.3f}"

    rows = [(f"{r.max_cached_fraction:g}{' *' if r.own else ''}", f"{r.min_free_fraction:g}",
             f"{r.released}/{r.calls}", ms(r.estimated_ms),
             f"{ms(r.estimated_low_ms)}-{ms(r.estimated_high_ms)}",
             "n/a" if not math.isfinite(r.delta_vs_own_ms) else f"{r.delta_vs_own_ms:+.3f}")
            for r in effect.table.itertuples(index=False)]
    head = ("max_cached_fraction", "min_free_fraction", "measured released/calls",
            "estimated ms", "low-high ms", "vs own ms")
    return (["### Estimated effect on normal-call time (a model, not a measurement)", ""]
            + _md_table(head, rows) + ["", f"*Units: ms, summed over ranks. {effect.note}*"])


# ----------------------------------------------------------------------------- report
def report(run: Run, *, cached: str = "0.05:0.5:0.05", free: str = "0.01:0.2:0.01",
           policy: Policy = "bounded", arm: str = "candidate", fmt: str = "md"
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
        parts = ["# " + line for line in gate_lines(gate)]
        if not gate.empty:
            parts.append(gate.to_csv(index=False, lineterminator="\n").rstrip("\n"))
        if grid is not None and effect is not None:
            parts += ["", f"# {_replay_note(grid)}",
                      grid.to_csv(index=False, lineterminator="\n").rstrip("\n"),
                      "", f"# {effect.note}",
                      effect.table.to_csv(index=False, lineterminator="\n").rstrip("\n")]
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
