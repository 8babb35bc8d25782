"""The attributions: one registered function each (`@attributor("key")`), and `build`, which
runs them over a run loaded once (`RunData`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from residency import humanize, markers
from residency.analysis import stats
from residency.evidence import notes
from residency.evidence.model import PAIRED_ARMS, Attribution, Evidence, Scope
from residency.evidence.runs import RunData, measured_requests, service_of
from residency.evidence.verdicts import e2e_verdict
from residency.jsonio import plain
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run, RunEntry

TRACE_SOURCE = f"trace window marker {markers.PHASE_PREPARE}"
RESPONSE_SOURCE = "service response, max over ranks of per_rank prepare_ns"

__all__ = ["ATTRIBUTORS", "REQUEST_COLUMNS", "aa_pairs", "attributor", "build"]


ATTRIBUTORS: dict[str, Callable[[RunData], Attribution | None]] = {}


def attributor(key: str) -> Callable[[Callable[[RunData], Attribution | None]],
                                     Callable[[RunData], Attribution | None]]:
    """Register `fn(data) -> Attribution | None` as the attribution `key` (None: no data)."""
    def register(fn: Callable[[RunData], Attribution | None]
                 ) -> Callable[[RunData], Attribution | None]:
        ATTRIBUTORS[key] = fn
        return fn
    return register


def build(run: Run, *, idle: Mapping[str, Mapping[str, int]] | None = None,
          idle_error: str | None = None, traces: bool = True,
          keys: Sequence[str] | None = None, **inputs: Any) -> Evidence:
    """The evidence of a loaded run: every registered attribution that has data.

    `idle` (arm -> idle figures in ns) and `idle_error` replace the trace analysis of the
    reference pair; `traces=False` skips it. `keys` limits the attributions computed.
    Further keyword arguments reach the attributors as `RunData.inputs`: `aa` (a loaded
    `Run` or a run directory recorded with `--design aa`) adds the `e2e_aa` attribution and
    reads the unprofiled E2E delta against its spread.
    """
    if isinstance(inputs.get("aa"), (str, Path)):
        from residency.rundir.run import load_run

        inputs["aa"] = load_run(inputs["aa"])
    data = RunData(run, idle_override=idle, idle_error_override=idle_error, traces=traces,
                   inputs=inputs)
    out = []
    for key, fn in ATTRIBUTORS.items():
        if keys is not None and key not in keys:
            continue
        a = fn(data)
        if a is not None:
            out.append(a)
    pair = data.pair
    needs_idle = keys is None or any(k in keys for k in ("idle_intersection", "all_rank_idle",
                                                          "preparation_window"))
    from residency.rundir.assignment import scope_note

    assigned = data.assignments
    return Evidence(run_dir=run.path, device_kind=run.device_kind, design=run.design,
                    status=run.status, injection=run.injection,
                    reference_pair=(pair[0].name, pair[1].name) if pair else None,
                    attributions=tuple(out), idle_error=data.idle_error if needs_idle else None,
                    assignment_note=scope_note(list(assigned.values())),
                    request_assignment=tuple(
                        MappingProxyType({"run": name, "method": a.method,
                                          "outside_count": a.outside_count,
                                          "outside_first_wall_ns": a.outside_first_wall_ns,
                                          "outside_last_wall_ns": a.outside_last_wall_ns,
                                          "startup_count": a.startup_count,
                                          "warmup_by_kind": a.warmup_by_kind,
                                          "id_mismatch_count": len(a.id_mismatches),
                                          "note": a.outside_note()})
                        for name, a in assigned.items()),
                    service=MappingProxyType(service_of(run.manifest)),
                    digest=(run.manifest.get("seal") or {}).get("digest"))


# ----------------------------------------------------------------------------- helpers
def _normal_calls_ms(data: RunData, entry: RunEntry) -> dict[int, list[float]]:
    """Rank -> duration (ms) of each normal call of the entry's measured requests, in order;
    from the decisions, else from the service response's per-call durations."""
    d = data.measured
    normal = d[(d["run"] == entry.name) & (d["kind"] == "normal")]
    if not normal.empty:
        return {int(r): [float(v) / 1e6 for v in g.sort_values("start_ns")["duration_ns"]]
                for r, g in normal.groupby("rank")}
    out: dict[int, list[float]] = {}
    for response in data.responses(entry):
        for pr in response.get("per_rank") or []:
            n = pr.get("normal") or {}
            if n.get("count"):
                dur = n["duration_ns"]
                calls = list(dur) if isinstance(dur, (list, tuple)) else [dur]
                out.setdefault(int(pr["rank"]), []).extend(float(v) / 1e6 for v in calls)
    return out


def _normal_ms_by_rank(data: RunData, entry: RunEntry) -> dict[int, float]:
    """Rank -> median duration (ms) per normal call of the entry's measured requests."""
    return {r: float(np.median(v)) for r, v in _normal_calls_ms(data, entry).items() if v}


def _range(values: Sequence[float]) -> tuple[float, float]:
    return float(min(values)), float(max(values))


def _fmt_range(values: Sequence[float], unit: str) -> str:
    lo, hi = _range(values)
    return humanize.span_text(lo, hi, unit)


# ----------------------------------------------------------------------------- attributions
@attributor("normal_call_per_rank")
def _normal_call_per_rank(data: RunData) -> Attribution | None:
    """Per-rank normal-call duration of the reference pair, per call (each rank's median over
    its calls): a description of every rank of one run pair, no test."""
    if data.pair is None:
        return None
    by_rank = {a: _normal_ms_by_rank(data, e) for a, e in zip(PAIRED_ARMS, data.pair, strict=True)}
    if not all(by_rank.values()):
        return None
    vals = {a: [by_rank[a][r] for r in sorted(by_rank[a])] for a in PAIRED_ARMS}
    b, c = vals[BASELINE], vals[CANDIDATE]
    bm, cm = float(np.median(b)), float(np.median(c))
    if max(c) < min(b):
        order = "every candidate rank below every baseline rank"
    elif max(b) < min(c):
        order = "every baseline rank below every candidate rank"
    else:
        order = "the two arms' ranks overlap"
    names = f"{data.pair[0].name} / {data.pair[1].name}"
    what = "profiled pair" if data.pair[0].profiled else "reference pair"
    speed = humanize.speed_text(cm / bm if bm else None)
    note = (f"Every rank, in this run pair ({what} {names}): baseline {_fmt_range(b, 'ms')}, "
            f"candidate {_fmt_range(c, 'ms')} per call, {order}; median over ranks "
            f"{humanize.sig(bm)} -> {humanize.quantity(cm, 'ms')} ({speed}). A description of the "
            f"ranks of one run each, not a test: ranks of one run are not independent "
            f"replicates (the cross-run claim is the per-run attribution).")
    return Attribution(
        key="normal_call_per_rank", metric=f"normal-call duration per rank, {what} {names}",
        kind="description", unit="ms", values=vals, n={a: len(vals[a]) for a in PAIRED_ARMS},
        labels={a: [f"rank {r}" for r in sorted(by_rank[a])] for a in PAIRED_ARMS},
        judged_on="rank (each rank's median per call; every rank, in this run pair; no "
                  "test)",
        scope=Scope(runs=(data.pair[0].name, data.pair[1].name), what=what), note=note,
        detail={"ranks": {a: sorted(by_rank[a]) for a in PAIRED_ARMS}, "medians": {
            BASELINE: bm, CANDIDATE: cm}})


@attributor("normal_call_per_run")
def _normal_call_per_run(data: RunData) -> Attribution | None:
    """One value per measured run, per call: the run's median over all its normal calls
    (every rank, every measured request); arms compared with an exact Mann-Whitney U test,
    the run as the unit. Profiled and unprofiled runs are never pooled: the unprofiled runs
    when each arm has at least 2, else the profiled ones (n = 1 per arm allows no test)."""
    per_run: dict[bool, dict[str, list[tuple[RunEntry, float, list[float], list[float]]]]] = {
        p: {a: [] for a in PAIRED_ARMS} for p in (False, True)}
    for a in PAIRED_ARMS:
        for e in data.entries(a):
            calls = _normal_calls_ms(data, e)
            flat = [v for r in sorted(calls) for v in calls[r]]
            if flat:
                per_rank = [float(np.median(calls[r])) for r in sorted(calls)]
                per_run[e.profiled][a].append((e, float(np.median(flat)), per_rank,
                                              [min(flat), max(flat), len(flat)]))
    profiled = next((p for p in (False, True)
                     if min(len(v) for v in per_run[p].values()) >= 2), None)
    if profiled is None:  # one run per arm: the per-rank view says it
        return None
    runs_of = per_run[profiled]
    vals = {a: [v for _, v, _, _ in runs_of[a]] for a in PAIRED_ARMS}
    result = stats.compare_groups(vals[BASELINE], vals[CANDIDATE], unit="ms",
                                  replicate="run")
    word = "profiled" if profiled else "unprofiled"
    other = sum(len(per_run[not profiled][a]) for a in PAIRED_ARMS)
    left = (f" The {other} {'unprofiled' if profiled else 'profiled'} run(s) are not pooled "
            "with these (profiling adds trace markers to every call)." if other else "")
    calls = {a: sorted({int(r[2]) for _, _, _, r in runs_of[a]}) for a in PAIRED_ARMS}
    note = (f"{notes.note(result)} Each value is one {word} run's median over its normal calls "
            f"(all ranks and measured requests: "
            + "; ".join(f"{a} {'/'.join(map(str, calls[a]))} calls per run" for a in PAIRED_ARMS)
            + f").{left}")
    runs = tuple(e.name for a in PAIRED_ARMS for e, _, _, _ in runs_of[a])
    return Attribution(
        key="normal_call_per_run",
        metric=f"normal-call duration per call, {word} runs (each run's median)",
        kind="groups", unit="ms", values=vals, n={a: len(vals[a]) for a in PAIRED_ARMS},
        labels={a: [e.name for e, _, _, _ in runs_of[a]] for a in PAIRED_ARMS},
        judged_on=f"run (one value per {word} service run: its median per call over its "
                  "calls and ranks)", result=result,
        scope=Scope(runs=runs, what=f"{word} runs"), note=note,
        detail={"profiled": {a: [e.profiled for e, _, _, _ in runs_of[a]] for a in PAIRED_ARMS},
                "per_rank_ms": {a: [v for _, _, v, _ in runs_of[a]] for a in PAIRED_ARMS},
                "per_call_range_ms": {a: [r[:2] for _, _, _, r in runs_of[a]] for a in PAIRED_ARMS},
                "calls": {a: [int(r[2]) for _, _, _, r in runs_of[a]] for a in PAIRED_ARMS},
                "runs_kind": word})


@attributor("normal_call_durations")
def _normal_call_durations(data: RunData) -> Attribution | None:
    """Every measured normal call's duration (ms) per arm, with its outcome and run: the
    samples the what-if effect model prices calls with. No test (calls are not the unit)."""
    d = data.measured
    normal = d[d["kind"] == "normal"].sort_values(["run_index", "rank", "start_ns"])
    if normal.empty:
        return None
    vals, outcomes, runs = {}, {}, {}
    for a in PAIRED_ARMS:
        mine = normal[normal["run_arm"] == a]
        vals[a] = [float(x) / 1e6 for x in mine["duration_ns"]]
        outcomes[a] = [str(x) for x in mine["outcome"]]
        runs[a] = [str(x) for x in mine["run"]]
    return Attribution(
        key="normal_call_durations", metric="normal-call duration per call", kind="samples",
        unit="ms", values=vals, n={a: len(vals[a]) for a in PAIRED_ARMS},
        labels={a: [f"{r} rank {k}" for r, k in zip(runs[a], normal[normal["run_arm"] == a][
            "rank"], strict=True)] for a in PAIRED_ARMS},
        judged_on="call (samples for the what-if cost model; no test: calls of one run are "
                  "not independent replicates)",
        scope=Scope(runs=tuple(sorted(set(normal["run"]))), what="all measured runs"),
        note="Per-call durations of the measured requests, by arm, with each call's outcome "
             "and run; the what-if model prices predicted calls with their medians.",
        detail={"outcome": outcomes, "run": runs})


def _counts(data: RunData, kind: str, key: str, metric: str) -> Attribution | None:
    d = data.measured
    calls = d[d["kind"] == kind]
    if calls.empty:
        return None
    k = {a: int((calls[calls["run_arm"] == a]["outcome"] == "released").sum()) for a in PAIRED_ARMS}
    n = {a: int((calls["run_arm"] == a).sum()) for a in PAIRED_ARMS}
    runs = {a: sorted(set(calls[calls["run_arm"] == a]["run"])) for a in PAIRED_ARMS}
    ranks = {a: int(calls[calls["run_arm"] == a]["rank"].nunique()) for a in PAIRED_ARMS}
    result = {a: stats.proportion(k[a], n[a]) for a in PAIRED_ARMS if n[a]}
    ci = ", ".join(f"{a} {humanize.percent_span(*p.ci)}" for a, p in result.items())
    clusters = "; ".join(f"{a}: {humanize.count_text(n[a], 'call')} in "
                         f"{humanize.count_text(len(runs[a]), 'run')} x "
                         f"{humanize.count_text(ranks[a], 'rank')}"
                         for a in PAIRED_ARMS if n[a])
    note = (f"Clopper-Pearson 95 %: {ci or 'no calls'}. The calls are outcomes of a "
            f"deterministic rule (the policy on each call's memory state), clustered in runs "
            f"and ranks ({clusters}): the interval describes these calls as if they were "
            f"independent draws; it supports \"this many of these calls\", not a rate for "
            f"other runs, workloads or devices.")
    if not all(n.values()):
        note = "No calls of this kind recorded in at least one arm: nothing to compare. " + note
    return Attribution(
        key=key, metric=metric, kind="counts", unit="calls",
        values={a: [k[a]] for a in PAIRED_ARMS}, n=n, judged_on="call (k of n; clustered in runs "
        "and ranks)", result=result or None,
        scope=Scope(runs=tuple(sorted(set(calls["run"]))), what="all measured runs"),
        note=note, detail={"runs": runs, "ranks": ranks})


@attributor("normal_released")
def _normal_released(data: RunData) -> Attribution | None:
    return _counts(data, "normal", "normal_released", "normal calls that released cache")


@attributor("forced_released")
def _forced_released(data: RunData) -> Attribution | None:
    return _counts(data, "forced", "forced_released", "forced releases that released")


@attributor("telemetry_errors")
def _telemetry_errors(data: RunData) -> Attribution | None:
    d = data.measured
    if d.empty:
        return None
    errors = {a: int((d[d["run_arm"] == a]["reason"] == "telemetry-unavailable").sum())
              for a in PAIRED_ARMS}
    first = {a: next((str(x) for x in d[(d["run_arm"] == a) & (
        d["reason"] == "telemetry-unavailable")]["error"]), None) for a in PAIRED_ARMS}
    return Attribution(
        key="telemetry_errors", metric="telemetry errors", kind="tally", unit="calls",
        values={a: [errors[a]] for a in PAIRED_ARMS}, n={a: int((d["run_arm"] == a).sum())
                                                   for a in PAIRED_ARMS},
        judged_on="call (plain counts)", scope=Scope(runs=tuple(sorted(set(d["run"]))),
                                                     what="all measured runs"),
        note="Counts over all measured runs. A telemetry error makes a normal call release "
             "(the conservative path).", detail={"first_error": first})


@attributor("oom")
def _oom(data: RunData) -> Attribution | None:
    vals: dict[str, list[int | None]] = {}
    unreported = []
    for a in PAIRED_ARMS:  # each arm on its own: an arm without runs blanks only itself
        ooms = [pr.get("oom") for e in data.entries(a) for resp in data.responses(e)
                for pr in resp.get("per_rank") or []]
        if data.entries(a) and (not ooms or None in ooms):
            unreported.append(a)
        vals[a] = [None] if not ooms or None in ooms else [int(sum(ooms))]
    if not data.run.runs:
        return None
    missing = "".join(f" No {a} runs in this design." for a in PAIRED_ARMS
                      if not data.entries(a))
    return Attribution(
        key="oom", metric="out-of-memory errors", kind="tally", unit="errors",
        values=vals, n={a: len(data.entries(a)) for a in PAIRED_ARMS},
        judged_on="run (plain counts)",
        scope=Scope(runs=tuple(e.name for e in data.run.runs), what="all measured runs"),
        note="Out-of-memory errors the service reported per rank, summed over measured "
             "requests." + missing + ("" if not unreported else
                                     f" Not reported by this service ({', '.join(unreported)})"
                                     ": n/a."))


def _single(key: str, metric: str, unit: str, scale: float, b: float, c: float,
            data: RunData, source: str) -> Attribution:
    result = stats.single(b / scale, c / scale, unit=unit)
    pair = data.pair
    runs = (pair[0].name, pair[1].name) if pair else ()
    return Attribution(
        key=key, metric=metric, kind="single", unit=unit,
        values={BASELINE: [result.baseline], CANDIDATE: [result.candidate]},
        n={a: 1 for a in PAIRED_ARMS}, judged_on="single observation per arm", result=result,
        scope=Scope(runs=runs, what="profiled pair" if pair and pair[0].profiled else
                    "reference pair"),
        note=f"{notes.note(result)} Source: {source}.", source=source)


@attributor("idle_intersection")
def _idle_intersection(data: RunData) -> Attribution | None:
    idle = data.idle or {}
    if not all("marker_idle_intersection_ns" in (idle.get(a) or {}) for a in PAIRED_ARMS):
        return None
    return _single("idle_intersection", "normal-release markers ∩ all-rank no-device-task time",
                   "ms", 1e6, idle[BASELINE]["marker_idle_intersection_ns"],
                   idle[CANDIDATE]["marker_idle_intersection_ns"], data,
                   "trace analysis of the profiled pair")


@attributor("all_rank_idle")
def _all_rank_idle(data: RunData) -> Attribution | None:
    idle = data.idle or {}
    if not all("all_rank_idle_ns" in (idle.get(a) or {}) for a in PAIRED_ARMS):
        return None
    return _single("all_rank_idle", "all-rank no-device-task time", "s", 1e9,
                   idle[BASELINE]["all_rank_idle_ns"], idle[CANDIDATE]["all_rank_idle_ns"],
                   data, "trace analysis of the profiled pair")


@attributor("preparation_window")
def _preparation_window(data: RunData) -> Attribution | None:
    idle = data.idle or {}
    prep = {a: (idle.get(a) or {}).get("prepare_ns") for a in PAIRED_ARMS}
    source = TRACE_SOURCE
    if None in prep.values() and data.pair is not None:
        source = RESPONSE_SOURCE
        prep = {}
        for a, e in zip(PAIRED_ARMS, data.pair, strict=True):
            per_rank = [pr for resp in data.responses(e) for pr in resp.get("per_rank") or []]
            prep[a] = max((pr["prepare_ns"] for pr in per_rank if "prepare_ns" in pr),
                          default=None)
    if None in prep.values() or len(prep) < 2:
        return None
    return _single("preparation_window", "preparation window", "s", 1e9, prep[BASELINE],
                   prep[CANDIDATE], data, source)


def _e2e(data: RunData, entry: RunEntry) -> float | None:
    if entry.e2e_s is not None:
        return float(entry.e2e_s)
    v = data.clients[entry.name].get("median_e2e_s")
    return None if v is None else float(v)


def aa_pairs(run: Run) -> tuple[list[float], list[float], list[str]]:
    """The E2E pairs of an A/A run (`design` "aa"): slot A values, slot B values (s) and a
    label per pair, pair i = the i-th run of each slot (ABBA order).

    Raises:
        ValueError: the run is not an A/A run, a run has no slot or no E2E, or the slots
            are unbalanced.
    """
    if run.design != "aa":
        raise ValueError(f"{run.path}: not an A/A run (design {run.design!r}; record one with "
                         "`residency pair --design aa`)")
    slots: dict[str, list[tuple[str, float]]] = {"A": [], "B": []}
    for i, entry in enumerate(run.manifest.get("runs") or []):
        slot, e2e = entry.get("slot"), entry.get("e2e_s")
        if slot not in slots or e2e is None:
            raise ValueError(f"{run.path}: manifest field runs[{i}] has no slot A/B with an "
                             "e2e_s")
        slots[slot].append((Path(str(entry.get("dir", i))).name, float(e2e)))
    if not slots["A"] or len(slots["A"]) != len(slots["B"]):
        raise ValueError(f"{run.path}: an A/A run needs as many slot-A as slot-B runs (got "
                         f"{len(slots['A'])} and {len(slots['B'])})")
    labels = [f"{a} / {b}" for (a, _), (b, _) in zip(slots["A"], slots["B"], strict=True)]
    return [v for _, v in slots["A"]], [v for _, v in slots["B"]], labels


def _aa_source(data: RunData) -> Run | None:
    """The A/A run an E2E claim is read against: the run itself when it is one, else the
    `aa` input of `build` (a loaded `Run`)."""
    if data.run.design == "aa":
        return data.run
    aa = data.inputs.get("aa")
    if aa is None:
        return None
    if aa.device_kind != data.run.device_kind:
        raise ValueError(f"{aa.path}: the A/A run's device kind {aa.device_kind} differs from "
                         f"the run's ({data.run.device_kind}): noise of one device says nothing "
                         "about another")
    return aa


def _aa_noise(data: RunData) -> tuple[Run, stats.AANoise, list[float], list[float],
                                      list[str]] | None:
    aa = _aa_source(data)
    if aa is None:
        return None
    a, b, labels = aa_pairs(aa)
    return aa, stats.aa_noise(a, b, unit="s"), a, b, labels


_SAME_SETUP = ("ranks", "steps", "scale", "requests")


@attributor("e2e_aa")
def _e2e_aa(data: RunData) -> Attribution | None:
    """The E2E noise of an A/A run (the same arm in both slots, ABBA order): median |delta|
    of its pairs and the runs' coefficient of variation, the spread an A/B E2E delta is read
    against; from the run itself (design aa) or the `aa` input of `build`."""
    found = _aa_noise(data)
    if found is None:
        return None
    aa, noise, a, b, labels = found
    arm = next((e.arm for e in aa.runs), "?")
    own = aa is data.run
    setup = (aa.manifest.get("params") or {}), (data.run.manifest.get("params") or {})
    differs = [k for k in _SAME_SETUP if not own and setup[0].get(k) != setup[1].get(k)]
    where = "this run" if own else f"A/A run {aa.path.name}"
    note = (f"{notes.note(noise)} Source: {where} ({arm} in both slots, {len(a)} pair(s), "
            f"{2 * len(a)} service runs, each run's E2E the median of its measured requests).")
    if differs:
        note += (" Set up differently from this run (" + ", ".join(
            f"{k} {setup[0].get(k)} vs {setup[1].get(k)}" for k in differs)
            + "): read the comparison with care.")
    ab = data.run.design != "aa" and data.entries(BASELINE, profiled=False)
    if ab:
        note += (" The unprofiled A/B E2E note compares its median delta with this spread.")
    return Attribution(
        key="e2e_aa", metric=f"client E2E noise, A/A ({arm} in both slots)", kind="aa",
        unit="s", values={"A": a, "B": b}, n={"A": len(a), "B": len(b)},
        labels={"A": labels, "B": labels},
        judged_on="pair of same-arm runs (A/A; no test: the spread an A/B delta is read "
                  "against)", result=noise,
        scope=Scope(runs=tuple(e.name for e in aa.runs), what=where), note=note,
        source=str(aa.path),
        detail={"deltas_s": list(noise.deltas), "spread_s": noise.spread,
                "max_abs_s": noise.max_abs, "cv": noise.cv, "arm": arm,
                "setup_differs": differs})


def _e2e_pairs(data: RunData, profiled: bool) -> Attribution | None:
    runs = tuple(data.entries(a, profiled=profiled) for a in PAIRED_ARMS)
    both = [(b, c, _e2e(data, b), _e2e(data, c)) for b, c in zip(*runs, strict=False)]
    pairs = [(b, c, x, y) for b, c, x, y in both if x is not None and y is not None]
    if not pairs:
        return None
    left = len(runs[0]) + len(runs[1]) - 2 * len(pairs)
    extra = f" {left} run(s) without a complete pair left out." if left else ""
    aa = None if profiled else _aa_noise(data)
    result = stats.compare_pairs([p[2] for p in pairs], [p[3] for p in pairs], unit="s",
                                 noise=None if aa is None else aa[1].spread,
                                 labels=[f"{p[0].name} / {p[1].name}" for p in pairs])
    present = {r.profiled for r in data.run.runs}
    key = "e2e_profiled" if profiled else "e2e_unprofiled"
    if len(present) > 1:
        metric = "client E2E, profiled pair" if profiled else "client E2E per unprofiled pair"
    else:
        metric = "client E2E per pair"
    verdict, detail = "", {}
    if not profiled:  # the E2E claim: a significant delta, equivalence, or no verdict
        base = [p[2] for p in pairs]
        baseline_median = float(np.median(base))  # the median shown, never the upper one
        margin = stats.E2E_MARGIN_FRACTION * baseline_median
        if margin > 0:
            eq = stats.equivalence_pairs(
                base, [p[3] for p in pairs], margin=margin, unit="s",
                margin_label=f"{stats.E2E_MARGIN_FRACTION:.0%} of the baseline median E2E".replace(
                    "%", " %"))
            sentence = e2e_verdict(result, eq)
            # (the verdict sentence itself is `detail["verdict"]`: the first screen's E2E line
            # says it, the note does not repeat it on the same page)
            verdict = " " + notes.note(eq)
            detail = {"equivalence_margin_s": margin, "equivalence_p": eq.p_value,
                      "equivalent": eq.equivalent, "equivalence": eq.outcome,
                      "equivalence_p_below": eq.p_below, "equivalence_p_above": eq.p_above,
                      "baseline_median_s": baseline_median, "verdict": sentence}
            seq = _sequential(data, base, [p[3] for p in pairs], result)
            if seq is not None:  # the claim is the rule's, at its adjusted figures
                detail.update(sequential=seq[0], verdict=seq[1])
                verdict = (f" {seq[1]} {seq[0]['text']} Unadjusted figures of the last look "
                           f"(not the claim): {notes.note(eq)}")
    if aa is not None:
        detail["aa_spread_s"] = aa[1].spread
        detail["aa_run"] = aa[0].path.name
        verdict += f" (A/A noise from {aa[0].path.name}: {aa[1].n} same-arm pair(s).)"
    elif not profiled:
        verdict += (" No A/A run given: the delta is not read against same-arm noise (record "
                    "one with `residency pair --design aa`).")
    labels = [f"{p[0].name} / {p[1].name}" for p in pairs]
    return Attribution(
        key=key, metric=metric, kind="pairs", unit="s",
        values={BASELINE: [p[2] for p in pairs], CANDIDATE: [p[3] for p in pairs]},
        n={a: len(pairs) for a in PAIRED_ARMS},
        labels={a: [f"{p[0].name} / {p[1].name}" for p in pairs] for a in PAIRED_ARMS},
        judged_on="pair (pair i: the i-th run of each arm; ABBA order)", result=result,
        scope=Scope(runs=tuple(e.name for p in pairs for e in p[:2]),
                    what="profiled runs" if profiled else "unprofiled runs"),
        note=notes.note(result) + verdict + extra,
        detail={"deltas_s": list(result.deltas), "delta_of_medians_s":
                result.candidate_median - result.baseline_median,
                "median_of_deltas_s": result.delta, "relative": result.relative,
                "ci_s": list(result.ci) if result.ci else None,
                "ci_coverage": result.ci_coverage,
                "reversed_pairs": [labels[i] for i in result.reversed_pairs],
                "outlier_pairs": [labels[i] for i in result.outlier_pairs],
                "requests_per_run": _requests_per_run(data, [e for p in pairs for e in p[:2]]),
                **detail})


def _sequential(data: RunData, base: list[float], cand: list[float],
                result: stats.PairComparison) -> tuple[dict[str, Any], str] | None:
    """A run recorded with `--stop-when-decided`: its rule's looks and adjusted figures,
    recomputed from the pairs (`residency.analysis.sequential`), and the verdict sentence."""
    record = data.run.manifest.get("sequential")
    if not isinstance(record, Mapping) or not isinstance(record.get("rule"), Mapping):
        return None
    from residency.analysis.sequential import SequentialRule, verdict_sentence

    rule = SequentialRule.from_dict(record["rule"])
    try:
        found = rule.result(base, cand)
    except ValueError as exc:  # stopped (interrupted) before the first look
        out = {"rule": rule.to_dict(), "text": f"{rule.describe()} {exc}."}
        return out, f"No verdict: {exc} (the sequential rule's first look never came)."
    out = found.to_dict()
    out["text"] = f"{found.sentence()} {rule.describe()}"
    return out, verdict_sentence(found, result)


def _requests_per_run(data: RunData, entries: Sequence[RunEntry]) -> list[int]:
    """How many measured requests each run's E2E is the median of (sorted, distinct)."""
    return sorted({len(data.responses(e)) for e in entries})


@attributor("e2e_profiled")
def _e2e_profiled(data: RunData) -> Attribution | None:
    return _e2e_pairs(data, True)


@attributor("e2e_unprofiled")
def _e2e_unprofiled(data: RunData) -> Attribution | None:
    return _e2e_pairs(data, False)


REQUEST_COLUMNS = ["run", "request", "request_id", "rank", "normal_checks", "normal_retained",
                   "normal_released", "forced", "forced_released", "telemetry_errors", "oom"]


@attributor("requests")
def _requests(data: RunData) -> Attribution | None:
    """Per run x measured request x rank of the candidate arm: normal checks (retained /
    released), forced releases, telemetry errors and OOM (None when not reported)."""
    rows = []
    d = data.measured
    ranks = set(range(int((data.run.manifest.get("params") or {}).get("ranks") or 0)))
    for entry in data.entries(CANDIDATE):
        for number, req in enumerate(measured_requests(data.run, entry), 1):
            mine = d[(d["run"] == entry.name) & (d["request"] == number)]
            oom = {int(pr["rank"]): int(pr["oom"]) for pr in req["response"].get("per_rank")
                   or [] if "rank" in pr and pr.get("oom") is not None}
            for rank in sorted(set(mine["rank"].astype(int)) | set(oom) | ranks):
                r = mine[mine["rank"] == rank]
                normal, forced = r[r["kind"] == "normal"], r[r["kind"] == "forced"]
                rows.append({
                    "run": entry.name, "request": number, "request_id": req["request_id"],
                    "rank": rank, "normal_checks": len(normal),
                    "normal_retained": int((normal["outcome"] == "retained").sum()),
                    "normal_released": int((normal["outcome"] == "released").sum()),
                    "forced": len(forced),
                    "forced_released": int((forced["outcome"] == "released").sum()),
                    "telemetry_errors": int((r["reason"] == "telemetry-unavailable").sum()),
                    "oom": oom.get(rank)})
    if not rows:
        return None
    rows.sort(key=lambda x: (x["run"], x["rank"], x["request"]))
    total = {k: sum(r[k] for r in rows) for k in ("normal_checks", "normal_retained",
                                                   "forced", "forced_released",
                                                   "telemetry_errors")}
    ooms = [r["oom"] for r in rows]
    total["oom"] = None if any(o is None for o in ooms) else sum(ooms)
    return Attribution(
        key="requests", metric="candidate calls per rank and measured request", kind="tally",
        unit="calls", values={CANDIDATE: [total[k] for k in total]},
        labels={CANDIDATE: list(total)}, n={CANDIDATE: len(rows)},
        judged_on="rank x measured request (plain counts)",
        scope=Scope(runs=tuple(sorted({r["run"] for r in rows})), what="candidate runs"),
        note="Counts from the per-rank decision logs, each decision attributed to its "
             "request (warm-up and decisions outside every request excluded); oom from the "
             "service's response (None when the service does not report it).",
        detail={"rows": rows, "totals": total,
                "ranks": len({r["rank"] for r in rows}),
                "requests": len({(r["run"], r["request"]) for r in rows})})


@attributor("request_gates")
def _request_gates(data: RunData) -> Attribution | None:
    """The consecutive-request gates of the candidate from the attribution of decisions to
    requests (by time for any service): every rank wrote decisions, the normal and forced
    calls per rank and measured request the service declares, no telemetry error, no OOM
    (`residency.rundir.assignment.consecutive_gates`)."""
    from residency.rundir.assignment import consecutive_gates, expected_calls

    entries = data.entries(CANDIDATE)
    if not entries:
        return None
    failures = consecutive_gates(data.run, arm=CANDIDATE)
    return Attribution(
        key="request_gates", metric="consecutive-request gates of the candidate",
        kind="gate", unit="gates", values={CANDIDATE: [len(failures)]},
        labels={CANDIDATE: ["failed"]}, n={CANDIDATE: len(entries)},
        judged_on="rank x measured request (every one checked)",
        scope=Scope(runs=tuple(e.name for e in entries), what="candidate runs"),
        note=("Every rank wrote decisions; per rank and measured request the calls the "
              "service declares; no telemetry error; no OOM where reported."
              if not failures else " ".join(failures)),
        detail={"failures": list(failures), "passed": not failures,
                "expect": expected_calls(data.run.manifest)})


@attributor("replay_gate")
def _replay_gate(data: RunData) -> Attribution | None:
    """The one replay gate: every recorded normal decision with a snapshot, of every arm,
    warm-up included, replayed with its own bounds by `residency.policy.cache`'s rule
    (`residency.analysis.whatif.consistency`) must reproduce its outcome and reason."""
    from residency.analysis import whatif

    try:
        gate = whatif.consistency(data.run, arm=None)
    except whatif.WhatIfError as exc:
        return Attribution(
            key="replay_gate", metric="decisions reproduced by the policy on their snapshots",
            kind="gate", unit="decisions", values={"all": [0, 0]}, n={"all": 0},
            judged_on="decision (every one checked)",
            scope=Scope(runs=tuple(e.name for e in data.run.runs), warmup=True,
                        what="all runs"),
            note=f"Nothing to replay: {exc}", detail={"mismatches": [], "passed": None})
    mismatches = gate.to_dict(orient="records")
    checked = int(gate.attrs.get("checked", 0))
    return Attribution(
        key="replay_gate", metric="decisions reproduced by the policy on their snapshots",
        kind="gate", unit="decisions", values={"all": [checked - len(mismatches),
                                                       len(mismatches)]},
        labels={"all": ["reproduced", "mismatched"]}, n={"all": checked},
        judged_on="decision (every one checked)",
        scope=Scope(runs=tuple(gate.attrs.get("runs", [])), warmup=True,
                    what="all runs, every arm"),
        note=(f"{checked - len(mismatches)} of {checked} recorded normal decisions (warm-up "
              f"included) reproduced by residency.policy.cache's bounds rule on their own "
              f"snapshots and bounds."),
        detail={"mismatches": plain(mismatches), "passed": not mismatches})
