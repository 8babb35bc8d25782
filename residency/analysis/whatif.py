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

The effect model and the text `residency whatif` prints are `residency.reports.whatif`.

Which decisions are replayed: normal calls that carry a snapshot (a call whose telemetry
failed saw no memory state; forced calls read none), of every run of the chosen arm
(default `candidate`), warm-up requests included by default because the learned budget's
peak accumulates across them; counts of measured requests are reported separately.

The two policies, on one snapshot (cached = max(0, reserved - allocated), all in bytes):

* `bounded` (`residency.policy.cache.retains`): retain iff cached <= int(total *
  max_cached_fraction)
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

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from residency.errors import BadInput
from residency.policy.cache import ALWAYS_RELEASE, CANDIDATE, crossed_bounds, limit_bytes
from residency.rundir.assignment import decisions_by_request
from residency.rundir.run import Run, RunDirError, load_run

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

__all__ = ["DEFAULT_CACHED", "DEFAULT_FREE", "POLICIES", "WhatIfError", "as_run", "consistency",
           "parse_range", "replay_decisions", "replay_run", "replayable", "totals"]


class WhatIfError(BadInput):
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
def as_run(run: Run | str | os.PathLike[str]) -> Run:
    """`run` itself, or the run directory at that path loaded."""
    return run if isinstance(run, Run) else load_run(Path(run))


def _nothing(run: Run, arm: str | None, why: str) -> WhatIfError:
    which = "any arm" if arm is None else f"the {arm} arm"
    return WhatIfError(f"Nothing can be replayed from {run.path} ({which}, device kind "
                      f"{run.device_kind}): {why}")


def replayable(run: Run | str | os.PathLike[str], *, arm: str | None = CANDIDATE,
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
    run = as_run(run)
    entries = run.runs if arm is None else run.arm(arm)
    if not entries:
        arms = sorted({e.arm for e in run.runs}) or ["none"]
        raise _nothing(run, arm, f"the run has no run of that arm (arms present: "
                       f"{', '.join(arms)}).")
    frames: list[pd.DataFrame] = []
    skipped: dict[str, int] = {}
    normal_total = 0
    every = decisions_by_request(run)  # the one assignment of decisions to requests and warm-up
    for entry in entries:
        df = every[every["run"] == entry.name]
        if not warmup:
            df = df[~df["warmup"].astype(bool)]
        normal = df[df["kind"] == "normal"].drop(columns=["run_arm", "profiled", "run_index",
                                                          "request"])
        normal_total += len(normal)
        has = normal[list(SNAPSHOT)].notna().all(axis=1) & (normal["reason"] != ALWAYS_RELEASE)
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
            if ALWAYS_RELEASE in skipped:
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
               arm: str = CANDIDATE, warmup: bool = True) -> pd.DataFrame:
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
