"""Runs of different devices side by side (`residency tables RUN RUN ... [--published]`): per
run one `DeviceColumn` with what sets it apart (device kind, failure injected or not, scale,
reserved bytes) and the mechanism's cost there: normal-call cost per call and per GiB
released, forced-call cost, normal-release markers ∩ all-rank idle, the E2E delta and its
share of E2E; `published_column()` the published NPU figures in the same shape. Computed here,
rendered by `residency.reports.cross_device`. No torch.

Scope of each run's figures: the measured requests (warm-up excluded) of its unprofiled runs
when both arms have some, else of its profiled pair; profiled and unprofiled runs are never
pooled. The E2E delta is the median paired delta of the unprofiled pairs (else of the
profiled pair), its share the delta over the baseline's median E2E.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from residency import devices
from residency.evidence.attributions import build
from residency.evidence.model import PAIRED_ARMS
from residency.evidence.runs import decisions_by_request
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

GIB = 2**30
PUBLISHED_NAME = "h3_ref2va_910b1.json"

__all__ = ["GIB", "DeviceColumn", "Spread", "cross_device", "device_column", "injected",
           "published_column"]


@dataclass(frozen=True)
class Spread:
    """Per-call durations of one arm (ms): median (None where only a range is published),
    lowest, highest and how many values (`what` says what one value is)."""

    median: float | None
    low: float
    high: float
    n: int
    what: str = "call"


@dataclass(frozen=True)
class DeviceColumn:
    """One run (or the published NPU run) in the cross-device table; arms are keys of the
    per-arm mappings; None: not measured or not published (`missing` says why, by field)."""

    name: str
    device_kind: str
    label: str
    injected: str  # "no" or what was injected (the manifest's `params.inject_failure`)
    scale: str | None
    reserved_bytes: int | None  # median reserved bytes at the measured normal calls
    total_bytes: int | None  # device capacity the snapshots report
    scope: str  # which runs the per-call figures come from
    normal_ms: Mapping[str, Spread | None]
    normal_released: Mapping[str, tuple[int, int] | None]  # (released, calls)
    released_gib_per_call: Mapping[str, float | None]
    normal_ms_per_gib: Mapping[str, float | None]
    forced_ms: Mapping[str, Spread | None]
    idle_intersection_ms: Mapping[str, float] | None
    e2e_baseline_s: float | None
    e2e_delta_s: float | None
    e2e_scope: str
    published: bool = False
    decimals: Mapping[str, int] = field(default_factory=dict)
    """Published figures: their published precision by field (`normal_ms`, ...)."""
    missing: Mapping[str, str] = field(default_factory=dict)
    digest: str | None = None

    @property
    def e2e_share(self) -> float | None:
        """The E2E delta as a fraction of the baseline's E2E."""
        if self.e2e_delta_s is None or not self.e2e_baseline_s:
            return None
        return self.e2e_delta_s / self.e2e_baseline_s

    @property
    def measurement(self) -> bool:
        """False for a kind whose figures are never device measurements (emulated NPU)."""
        return not devices.emulated(self.device_kind)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, `e2e_share` and `measurement` included."""
        return {**asdict(self), "e2e_share": self.e2e_share, "measurement": self.measurement}


def injected(manifest: Mapping[str, Any]) -> str:
    """What the run injected (`params.inject_failure`: its `kind`, with the accelerator
    patch when one was applied), "no" when the field is absent or none."""
    params = manifest.get("params") or {}
    inj = params.get("inject_failure", manifest.get("inject_failure"))
    if isinstance(inj, Mapping):
        kind = inj.get("kind") or inj.get("name")
        patch = inj.get("accelerator_patch")
        if not kind or kind == "none":
            return "no"
        return f"{kind}" + (f" ({patch})" if patch and patch != "none" else "")
    if isinstance(inj, str) and inj and inj != "none":
        return inj
    return "no"


def _spread(values: Sequence[float]) -> Spread | None:
    if not len(values):
        return None
    return Spread(float(np.median(values)), float(min(values)), float(max(values)), len(values))


def _scope(d: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The measured decisions the per-call figures use: unprofiled runs when both arms have
    some, else the profiled ones (never pooled)."""
    d = d[~d["warmup"].astype(bool)]
    unprofiled = d[~d["profiled"].astype(bool)]
    if all((unprofiled["run_arm"] == a).any() for a in PAIRED_ARMS):
        runs = unprofiled["run"].nunique()
        return unprofiled, f"{runs} unprofiled runs, measured requests"
    profiled = d[d["profiled"].astype(bool)]
    return profiled, f"profiled pair ({profiled['run'].nunique()} runs), measured request"


def _cached(rows: pd.DataFrame) -> pd.Series:
    have = rows.dropna(subset=["reserved", "allocated"])
    return (have["reserved"].astype("int64") - have["allocated"].astype("int64")).clip(lower=0)


def device_column(run: Run, *, idle: Mapping[str, Mapping[str, int]] | None = None) -> \
        DeviceColumn:
    """The cross-device column of one loaded run (its traces are analysed for the idle
    intersection unless `idle` replaces them, as in `residency.evidence.build`)."""
    ev = build(run, idle=idle, keys=("idle_intersection", "e2e_profiled", "e2e_unprofiled"))
    d, scope = _scope(decisions_by_request(run))
    normal, forced = d[d["kind"] == "normal"], d[d["kind"] == "forced"]
    missing: dict[str, str] = {}
    snap = normal.dropna(subset=["reserved"])
    reserved = int(np.median(snap["reserved"].astype("int64"))) if len(snap) else None
    total = int(snap["total"].astype("int64").max()) if len(snap) else None
    if reserved is None:
        missing["reserved_bytes"] = "no normal call read telemetry"
    all_cached = _cached(normal)
    normal_ms, released, gib, per_gib, forced_ms = {}, {}, {}, {}, {}
    for arm in PAIRED_ARMS:
        mine = normal[normal["run_arm"] == arm]
        normal_ms[arm] = _spread([v / 1e6 for v in mine["duration_ns"]])
        released[arm] = (int((mine["outcome"] == "released").sum()), len(mine)) if len(mine) \
            else None
        forced_ms[arm] = _spread([v / 1e6 for v in forced[forced["run_arm"] == arm][
            "duration_ns"]])
        rel = mine[mine["outcome"] == "released"]
        gib[arm] = per_gib[arm] = None
        if rel.empty:
            missing[f"normal_ms_per_gib.{arm}"] = "no normal call released"
            continue
        own = _cached(rel)
        cached = own if len(own) else all_cached
        if not len(cached):
            missing[f"normal_ms_per_gib.{arm}"] = "no snapshot of the cached bytes"
            continue
        if not len(own):
            missing[f"released_gib_per_call.{arm}"] = (
                "estimated: its calls read no telemetry, so the cached bytes are those the "
                "other arm's snapshots record at the same calls")
        gib[arm] = float(np.median(cached)) / GIB
        per_gib[arm] = float(np.median(rel["duration_ns"])) / 1e6 / gib[arm] if gib[arm] \
            else None
    idle_a = ev.get("idle_intersection")
    idle_ms = None if idle_a is None else {a: float(idle_a.values[a][0]) for a in PAIRED_ARMS}
    if idle_a is None:
        missing["idle_intersection_ms"] = ev.idle_error or "no traces of a profiled pair"
    e2e = ev.get("e2e_unprofiled") or ev.get("e2e_profiled")
    if e2e is None:
        missing["e2e_delta_s"] = "no complete baseline/candidate pair"
        e2e_scope = ""
    else:
        word = "unprofiled" if e2e.key == "e2e_unprofiled" else "profiled"
        n = e2e.result.n
        e2e_scope = (f"median paired delta of {n} {word} pairs" if n > 1
                     else f"1 {word} pair")
    params = run.manifest.get("params") or {}
    scale = params.get("scale")
    return DeviceColumn(
        name=run.path.name, device_kind=run.device_kind,
        label=devices.label(run.device_kind, devices.injection_of(params)),
        injected=injected(run.manifest), scale=None if scale is None else str(scale),
        reserved_bytes=reserved, total_bytes=total, scope=scope, normal_ms=normal_ms,
        normal_released=released, released_gib_per_call=gib, normal_ms_per_gib=per_gib,
        forced_ms=forced_ms, idle_intersection_ms=idle_ms,
        e2e_baseline_s=None if e2e is None else float(e2e.result.baseline_median),
        e2e_delta_s=None if e2e is None else float(e2e.result.delta), e2e_scope=e2e_scope,
        missing=missing, digest=(run.manifest.get("seal") or {}).get("digest"))


def _published_rows() -> tuple[dict[str, Any], dict[str, Any]]:
    text = resources.files("residency.data").joinpath(PUBLISHED_NAME).read_text(
        encoding="utf-8")
    data = json.loads(text)
    return data, {r["metric"]: r for r in data["rows"]}


def _row(rows: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    return next(r for m, r in rows.items() if m.startswith(prefix))


def published_column() -> DeviceColumn:
    """The published NPU figures (package data `residency/data/h3_ref2va_910b1.json`) as a
    column: per-rank normal-call ranges, released counts, markers ∩ idle and the isolated
    pair's E2E; what was not published (forced-call cost, bytes) is None with the reason."""
    data, rows = _published_rows()
    normal = _row(rows, "normal-call duration per rank")
    count = _row(rows, "normal calls that released")
    idle = _row(rows, "normal-release markers")
    e2e = _row(rows, "client E2E, one isolated pair")
    env = data.get("environment") or {}
    spreads = {a: Spread(None, float(normal[a][0]), float(normal[a][1]),
                         int(normal[f"n_{a}"]), what="rank") for a in PAIRED_ARMS}
    not_published = "not published"
    return DeviceColumn(
        name="published", device_kind=data["device_kind"],
        label=devices.label(data["device_kind"]),
        injected=f"no: the failure is real (torch-npu {env.get('torch_npu', '?')})",
        scale="MiniMax-H3 Ref2VA service", reserved_bytes=None, total_bytes=None,
        scope="isolated 50-step pair, every rank", normal_ms=spreads,
        normal_released={a: (int(count[a]["k"]), int(count[a]["n"])) for a in PAIRED_ARMS},
        released_gib_per_call={a: None for a in PAIRED_ARMS},
        normal_ms_per_gib={a: None for a in PAIRED_ARMS},
        forced_ms={a: None for a in PAIRED_ARMS},
        idle_intersection_ms={a: float(idle[a]) for a in PAIRED_ARMS},
        e2e_baseline_s=float(e2e[BASELINE]),
        e2e_delta_s=float(e2e[CANDIDATE]) - float(e2e[BASELINE]),
        e2e_scope="1 isolated (profiled) pair", published=True,
        decimals={"normal_ms": int(normal["decimals"]), "idle_intersection_ms":
                  int(idle["decimals"]), "e2e_delta_s": int(e2e["decimals"])},
        missing={"reserved_bytes": not_published, "normal_ms_per_gib.baseline":
                 "bytes released not published", "normal_ms_per_gib.candidate":
                 "bytes released not published", "forced_ms": not_published},
        digest=None)


def cross_device(runs: Sequence[Run], *, published: bool = False) -> tuple[DeviceColumn, ...]:
    """One column per run, in the order given, then the published NPU column when asked."""
    cols = [device_column(r) for r in runs]
    if published:
        cols.append(published_column())
    return tuple(cols)
