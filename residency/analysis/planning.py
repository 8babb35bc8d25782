"""Plan a paired design within a device budget, before anything starts.

From the costs (`Costs`: per-request time, service start, warm-up; typed, or read from any
recorded run by `costs_from_run`), the noise (`Noise`: a stated coefficient of variation, or
read from an A/A or pilot run by `noise_from_run`) and the effect of interest (stated, or
the published relative E2E change applied to this request time: `published_effect`),
`plan_designs` gives, for each candidate design (unprofiled pairs x measured requests per
run, after one profiled pair), its device time, the power of the suite's E2E test (the exact
Wilcoxon signed-rank test, two-sided 5 %, `residency.analysis.stats.PAIRED_TEST`) to detect
the effect in its direction, the smallest effect it detects with the target power, and what
the mechanism attributions get whatever the E2E outcome. `Plan.lines()` says which design
to run, or that the E2E claim is out of the budget and which claims the budget supports.

Power is computed by seeded Monte Carlo (`simulations` sequences per design, normal noise):
each run's E2E is the median of its measured requests, each request `mean x (1 + run_cv x
z_run + request_cv x z_request)`; for each simulated sequence of paired deltas the smallest
shift that makes the exact test reject is read off its Walsh averages (the signed-rank
statistic of deltas + c counts the Walsh averages above -c), so power at any effect and the
smallest detectable effect come from the same draws. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from residency import humanize
from residency.analysis import stats
from residency.analysis.sequential import signed_rank_tables
from residency.policy.cache import BASELINE, CANDIDATE

__all__ = ["PUBLISHED_START_S", "Costs", "DesignRow", "Noise", "Plan", "PlanError",
           "claims_for", "costs_from_run", "design_statement", "make_plan", "min_pairs_for",
           "noise_from_run", "plan_designs", "published_costs", "published_effect",
           "with_costs"]

PUBLISHED_START_S = 300.0
"""The published study says only that a service start takes minutes: 5 minutes assumed."""
DEFAULT_PAIRS = (3, 4, 6, 8, 10, 15, 20, 30, 40)
DEFAULT_REQUESTS = (1, 3, 5)
PUBLISHED_E2E_ROW = "client E2E, one isolated pair"


class PlanError(ValueError):
    """Planning input that cannot be used (names the option or the run's field)."""


@dataclass(frozen=True)
class Costs:
    """Seconds of device time: one measured request, one service start (spawn to healthy),
    one warm-up request per start, the rest of a run (stopping, profiler control), and one
    profiled request (default: a measured request)."""

    request_s: float
    start_s: float
    warmup_s: float
    other_s: float = 0.0
    profiled_request_s: float | None = None
    source: str = "typed"

    def run_s(self, requests: int, *, profiled: bool = False) -> float:
        """One service run: start, warm-up, its measured requests, the rest."""
        measured = (self.profiled_request_s or self.request_s) if profiled else (
            requests * self.request_s)
        return self.start_s + self.warmup_s + measured + self.other_s

    def design_s(self, pairs: int, requests: int, *, profiled_pairs: int = 1) -> float:
        """A paired-profile design: `profiled_pairs` profiled pairs (one request each), then
        `pairs` unprofiled pairs of `requests` requests per run."""
        return (2 * profiled_pairs * self.run_s(1, profiled=True)
                + 2 * pairs * self.run_s(requests))


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise of E2E: `run_cv` between service runs (does not shrink with more
    requests per run) and `request_cv` between requests of one run (the run's median of R
    requests averages it), both as fractions of the mean E2E."""

    run_cv: float
    request_cv: float = 0.0
    source: str = "stated"

    def run_sd(self, mean_s: float, requests: int) -> float:
        """Approximate SD of one run's E2E (the median of `requests` requests), seconds."""
        return mean_s * math.sqrt(self.run_cv ** 2
                                  + self.request_cv ** 2 * _median_factor(requests) / requests)


@dataclass(frozen=True)
class DesignRow:
    """One candidate design and what it can show."""

    pairs: int  # unprofiled pairs
    requests: int  # measured requests per unprofiled run
    runs: int  # service runs, the profiled pair included
    device_s: float
    power: float  # of the exact two-sided 5 % test, in the effect's direction
    mde_s: float | None  # smallest |effect| detected with the target power; None: never
    within_budget: bool


@dataclass(frozen=True)
class Plan:
    """Every candidate design, the recommendation and the inputs it rests on."""

    costs: Costs
    noise: Noise
    effect_s: float
    effect_source: str
    baseline_s: float
    rows: tuple[DesignRow, ...]
    recommended: DesignRow | None
    cheapest_powered: DesignRow | None  # whatever the budget
    budget_s: float | None
    target_power: float
    simulations: int
    seed: int
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out = asdict(self)
        out["lines"] = self.lines()
        return out

    def lines(self) -> list[str]:
        """The plan as text: inputs, one row per design, the recommendation."""
        from residency.humanize import sig

        c, nz = self.costs, self.noise
        out = [f"Costs ({c.source}): request {_dur(c.request_s)}, service start "
               f"{_dur(c.start_s)}, warm-up {_dur(c.warmup_s)} per start"
               + (f", other {_dur(c.other_s)} per run" if c.other_s else "")
               + (f", profiled request {_dur(c.profiled_request_s)}"
                  if c.profiled_request_s else "") + ".",
               f"Noise ({nz.source}): between runs CV {_pct(nz.run_cv)}, between requests of a "
               f"run CV {_pct(nz.request_cv)}.",
               f"Effect of interest ({self.effect_source}): {sig(self.effect_s)} s "
               f"({_pct(self.effect_s / self.baseline_s, sign=True)} of {_dur(self.baseline_s)}"
               f").",
               f"Power: the {stats.PAIRED_TEST} at 5 % (the E2E verdict's test), in the "
               f"effect's direction; seeded Monte Carlo, {self.simulations} simulations per "
               f"design (seed {self.seed}), normal noise; target {_pct(self.target_power)}.",
               "",
               "| pairs x requests | service runs | device time | power | smallest effect at "
               f"{_pct(self.target_power)} power | E2E |",
               "|---|---|---|---|---|---|"]
        for r in self.rows:
            mde = ("unreachable (p < 0.05 needs 6 pairs)" if r.mde_s is None else
                   f"{sig(r.mde_s)} s ({_pct(r.mde_s / self.baseline_s)})")
            verdict = ("reaches the power" if r.power >= self.target_power else "underpowered")
            if not r.within_budget:
                verdict += ", over budget"
            out.append(f"| {r.pairs} x {r.requests} | {r.runs} | {_dur(r.device_s)} | "
                       f"{_pct(r.power)} | {mde} | {verdict} |")
        out += ["", "Mechanism attributions, whatever the E2E outcome: " + claims_for(None),
                "", self.recommendation()]
        return out

    def recommendation(self) -> str:
        """One paragraph: the design to run, or why none within the budget reaches the
        power and what the budget supports instead."""
        from residency.humanize import sig

        budget = "" if self.budget_s is None else f" (budget {_dur(self.budget_s)})"
        r = self.recommended
        if r is not None:
            return (f"Recommended: {r.pairs} pairs x {r.requests} requests per run "
                    f"(`residency pair --design paired-profile --pairs {r.pairs} --requests "
                    f"{r.requests}`), {_dur(r.device_s)} of device time{budget}: the cheapest "
                    f"design whose power reaches {_pct(self.target_power)} ({_pct(r.power)}) "
                    f"for an effect of {sig(self.effect_s)} s. " + claims_for(r))
        within = [x for x in self.rows if x.within_budget]
        best = min(within, key=lambda x: (x.mde_s is None, x.mde_s or 0.0, x.device_s),
                   default=None)
        need = self.cheapest_powered
        head = (("The E2E claim is out of the budget" + budget if self.budget_s is not None
                 else "The E2E claim is out of reach of every design considered") + ": " + (
            f"the cheapest design reaching {_pct(self.target_power)} power is {need.pairs} "
            f"pairs x {need.requests} requests per run ({_dur(need.device_s)})." if need else
            f"no design considered reaches {_pct(self.target_power)} power for "
            f"{sig(self.effect_s)} s."))
        if best is None:
            one = self.costs.design_s(0, 1)
            return (f"{head} Not even the profiled pair fits ({_dur(one)}): the budget "
                    "supports no claim.")
        mde = ("no E2E test (fewer than 6 pairs)" if best.mde_s is None else
               f"the smallest E2E effect it detects at {_pct(self.target_power)} power is "
               f"{sig(best.mde_s)} s ({_pct(best.mde_s / self.baseline_s)})")
        return (f"{head} Within the budget, {best.pairs} pairs x {best.requests} requests per run "
                f"({_dur(best.device_s)}) supports: {claims_for(best)} For E2E, {mde}.")


def min_pairs_for(alpha: float = stats.ALPHA) -> int:
    """The fewest pairs whose exact two-sided paired test can reach p < `alpha`: all deltas
    in one direction give p = 2^(1-n)."""
    n = 1
    while 2.0 ** (1 - n) >= alpha:
        n += 1
    return n


def claims_for(row: DesignRow | None) -> str:
    """What the mechanism attributions of a paired-profile design support (`row` None: the
    part every such design gets from its profiled pair)."""
    base = ("one profiled pair gives the release durations per rank, the normal and forced "
            "release counts (k of n calls, Clopper-Pearson) and normal-release markers ∩ "
            "all-rank no-device-task time: every rank, in that pair, descriptions without a "
            "cross-run test.")
    if row is None:
        return base
    runs = "" if row.pairs >= 4 else (" With fewer than 4 unprofiled pairs the per-run "
                                      "normal-call comparison cannot reach p < 0.05 "
                                      "(2/C(6,3) = 0.1 at 3 runs per arm).")
    more = (" The per-run normal-call duration is tested across runs (exact Mann-Whitney, "
            f"{row.pairs} vs {row.pairs} runs)." if row.pairs >= 4 else runs)
    return f"{base[0].upper()}{base[1:]}{more}"


# ----------------------------------------------------------------------------- inputs
def published_costs(*, start_s: float = PUBLISHED_START_S) -> Costs:
    """The published NPU figures (residency/data): one 50-step Ref2VA request 2,248.8 s on 8 x
    Ascend 910B1, a warm-up request (the same request) per service start, the start itself
    `start_s` (minutes: 5 assumed)."""
    row = _published_row()
    request = float(row[BASELINE])
    return Costs(request_s=request, start_s=start_s, warmup_s=request,
                 source=f"published NPU figures ({row['metric']}); service start "
                        f"{_dur(start_s)} assumed")


def published_effect(baseline_s: float) -> tuple[float, str]:
    """The published E2E change (candidate - baseline of the isolated pair, -0.19 %) as a
    fraction of `baseline_s`, and where it comes from."""
    row = _published_row()
    rel = (float(row[CANDIDATE]) - float(row[BASELINE])) / float(row[BASELINE])
    return rel * baseline_s, (f"the published {rel:+.2%} E2E change ({row['metric']}) of "
                              "this request time").replace("%", " %")


def _published_row() -> Mapping[str, Any]:
    import json
    from importlib import resources

    data = json.loads(resources.files("residency.data").joinpath("h3_ref2va_910b1.json")
                      .read_text(encoding="utf-8"))
    return next(r for r in data["rows"] if r["metric"] == PUBLISHED_E2E_ROW)


def costs_from_run(run: Any, **typed: float | None) -> Costs:
    """Costs read from a recorded run (`residency.rundir.run.Run`): medians over its runs of
    the recorded `runs[].cost` (service start, warm-up, the rest), else of the warm-up E2E
    in each `client.json`; the request time from the unprofiled runs' E2E (profiled ones
    when there are none). A value given in `typed` (`request_s`, `start_s`, `warmup_s`,
    `other_s`) replaces the run's.

    Raises:
        PlanError: a cost neither recorded nor typed (older runs record no service start:
            type it), naming the option.
    """
    entries = list(run.manifest.get("runs") or [])
    costs = [e.get("cost") for e in entries if isinstance(e.get("cost"), Mapping)]
    unprofiled = [e for e in entries if not e.get("profiled")] or entries
    profiled = [e for e in entries if e.get("profiled")]

    def median(values: Sequence[float]) -> float | None:
        vals = [float(v) for v in values if v is not None]
        return float(np.median(vals)) if vals else None

    per_request = []
    for e in unprofiled:
        reqs = e.get("e2e_s_requests") or ([e["e2e_s"]] if e.get("e2e_s") is not None else [])
        per_request += [float(x) for x in reqs]
    found: dict[str, float | None] = {
        "request_s": median(per_request),
        "start_s": median([c.get("start_s") for c in costs]),
        "warmup_s": median([c.get("warmup_s") for c in costs]),
        "other_s": median([c.get("other_s") for c in costs]),
    }
    if found["warmup_s"] is None:
        warm = []
        for entry in run.runs:
            w = (run.client(entry).get("warmup") or {}).get("e2e_ns")
            if w is not None:
                warm.append(float(w) / 1e9)
        found["warmup_s"] = median(warm)
    profiled_s = median([e.get("e2e_s") for e in profiled])
    recorded = [k for k, v in found.items() if v is not None]
    for key, value in typed.items():
        if value is not None:
            found[key] = float(value)
    if found["other_s"] is None:
        found["other_s"] = 0.0
    for key in ("request_s", "start_s", "warmup_s"):
        if found[key] is None:
            why = (" (this run was recorded before service starts were timed)"
                   if key == "start_s" and not costs else "")
            raise PlanError(f"{run.path}: the run records no {key.replace('_s', '')} time"
                            f"{why}: give --{key.replace('_', '-')}")
    typed_names = [k for k, v in typed.items() if v is not None]
    source = f"run {run.path.name}: " + ", ".join(
        f"{k.removesuffix('_s')} {'typed' if k in typed_names else 'recorded'}"
        for k in ("request_s", "start_s", "warmup_s") if k in recorded or k in typed_names)
    return Costs(request_s=found["request_s"], start_s=found["start_s"],  # type: ignore[arg-type]
                 warmup_s=found["warmup_s"], other_s=found["other_s"],  # type: ignore[arg-type]
                 profiled_request_s=profiled_s, source=source)


def noise_from_run(run: Any) -> Noise:
    """Noise read from an A/A run (slots A and B) or a pilot A/B run (its unprofiled runs,
    per arm): `request_cv` from the spread of the requests within each run (runs of 2+
    requests), `run_cv` from the spread of the runs' E2E around their arm's (slot's) mean,
    less what the requests' spread explains.

    Raises:
        PlanError: fewer than 2 unprofiled runs of one arm or slot.
    """
    entries = [e for e in run.manifest.get("runs") or [] if not e.get("profiled")
               and e.get("e2e_s") is not None]
    group = "slot" if run.design == "aa" else "arm"
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries:
        groups.setdefault(str(e.get(group)), []).append(e)
    if not groups or min(len(g) for g in groups.values()) < 2:
        found = ", ".join(f"{k}: {len(v)}" for k, v in groups.items()) or "none"
        raise PlanError(f"{run.path}: noise needs at least 2 unprofiled runs of each "
                        f"{group} (found {found})")
    means, dev, within, sizes = [], [], [], []
    for g in groups.values():
        vals = np.array([float(e["e2e_s"]) for e in g])
        means += list(vals)
        dev += list(vals - vals.mean())
        for e in g:
            reqs = np.array([float(x) for x in e.get("e2e_s_requests") or []])
            if reqs.size >= 2:
                within += list(reqs - reqs.mean())
                sizes.append(reqs.size)
    mean = float(np.mean(means))
    k = len(dev) - len(groups)
    var_run = float(np.sum(np.square(dev)) / k)
    req_cv = 0.0
    if within:
        var_req = float(np.sum(np.square(within)) / (len(within) - len(sizes)))
        req_cv = math.sqrt(var_req) / mean
        r = int(np.median(sizes))
        var_run = max(0.0, var_run - var_req * _median_factor(r) / r)
    what = "A/A run" if run.design == "aa" else "pilot run"
    return Noise(run_cv=math.sqrt(var_run) / mean, request_cv=req_cv,
                 source=f"{what} {run.path.name}: {len(dev)} unprofiled runs"
                        + (f", {len(within)} requests within runs" if within else
                           ", 1 request per run (all noise counted between runs)"))


# ----------------------------------------------------------------------------- power
def _median_factor(r: int) -> float:
    """Variance of the median of r standard normal draws, times r (1 for r <= 2; pi/2 in
    the limit), from a fixed seeded simulation."""
    if r <= 2:
        return 1.0
    z = np.random.default_rng(12345).standard_normal((20000, r))
    return float(np.var(np.median(z, axis=1)) * r)


def _thresholds(noise_deltas: np.ndarray) -> np.ndarray | None:
    """Per simulated sequence (rows), the smallest positive shift c for which the exact
    two-sided 5 % signed-rank test rejects upwards on deltas + c; None when n < 6."""
    n = noise_deltas.shape[1]
    two, _, _ = signed_rank_tables(n)
    m = n * (n + 1) // 2
    upper = [w for w in range(m + 1) if w > m / 2 and two[w] < stats.ALPHA]
    if not upper:
        return None
    w_crit = upper[0]
    i, j = np.triu_indices(n)
    walsh = (noise_deltas[:, i] + noise_deltas[:, j]) / 2
    walsh.sort(axis=1)
    return -walsh[:, m - w_crit]


def _noise_deltas(noise: Noise, mean_s: float, pairs: int, requests: int, sims: int,
                  rng: np.random.Generator) -> np.ndarray:
    def arm() -> np.ndarray:
        run = noise.run_cv * rng.standard_normal((sims, pairs))
        req = (np.median(rng.standard_normal((sims, pairs, requests)), axis=2)
               * noise.request_cv)
        return mean_s * (run + req)
    return arm() - arm()


def plan_designs(costs: Costs, noise: Noise, *, effect_s: float | None = None,
                 effect_source: str = "stated", pairs: Sequence[int] = DEFAULT_PAIRS,
                 requests: Sequence[int] = DEFAULT_REQUESTS, budget_s: float | None = None,
                 target_power: float = 0.8, simulations: int = 2000, seed: int = 0) -> Plan:
    """Every design pairs x requests (after one profiled pair) with its device time, power
    and smallest detectable effect; the cheapest design reaching `target_power` within
    `budget_s` is recommended. `effect_s` None: the published relative change
    (`published_effect`) of the request time.

    Raises:
        PlanError: a non-positive cost, a negative CV, an effect of 0, a design value < 1, a
            budget <= 0 or a power or simulation count out of range.
    """
    for name, value in (("request-s", costs.request_s), ("start-s", costs.start_s),
                        ("warmup-s", costs.warmup_s)):
        if not (math.isfinite(value) and value >= 0) or (name == "request-s" and value == 0):
            raise PlanError(f"--{name} must be a finite number of seconds > 0, got {value!r}")
    for name, value in (("cv", noise.run_cv), ("request-cv", noise.request_cv)):
        if not (math.isfinite(value) and value >= 0):
            raise PlanError(f"--{name} must be a finite fraction >= 0, got {value!r}")
    if noise.run_cv == 0 and noise.request_cv == 0:
        raise PlanError("--cv: the noise is 0 (state a CV, or give an A/A or pilot run)")
    if effect_s is None:
        effect_s, effect_source = published_effect(costs.request_s)
    if not math.isfinite(effect_s) or effect_s == 0:
        raise PlanError(f"--effect must be a finite non-zero number of seconds, got {effect_s!r}")
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
        raise PlanError(f"--budget-hours must be > 0, got {budget_s / 3600!r}")
    if not 0 < target_power < 1:
        raise PlanError(f"--power must be in (0, 1), got {target_power!r}")
    if isinstance(simulations, bool) or not isinstance(simulations, int) or simulations < 100:
        raise PlanError(f"--simulations must be an integer >= 100, got {simulations!r}")
    for name, values in (("pairs", pairs), ("requests", requests)):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                             for v in values):
            raise PlanError(f"--{name} must list integers >= 1, got {list(values)!r}")
    rows = []
    for r in sorted(set(requests)):
        for n in sorted(set(pairs)):
            rng = np.random.default_rng([seed, n, r])
            thr = _thresholds(_noise_deltas(noise, costs.request_s, n, r, simulations, rng))
            if thr is None:
                power, mde = 0.0, None
            else:
                power = float(np.mean(thr < abs(effect_s)))
                mde = float(np.quantile(thr, target_power))
            device = costs.design_s(n, r)
            rows.append(DesignRow(pairs=n, requests=r, runs=2 + 2 * n, device_s=device,
                                  power=power, mde_s=mde,
                                  within_budget=budget_s is None or device <= budget_s))
    rows.sort(key=lambda x: (x.device_s, x.pairs))
    powered = [x for x in rows if x.power >= target_power]
    cheapest = powered[0] if powered else None
    recommended = next((x for x in powered if x.within_budget), None)
    return Plan(costs=costs, noise=noise, effect_s=float(effect_s), effect_source=effect_source,
                baseline_s=costs.request_s, rows=tuple(rows), recommended=recommended,
                cheapest_powered=cheapest, budget_s=budget_s, target_power=target_power,
                simulations=simulations, seed=seed)


def with_costs(costs: Costs, **changes: Any) -> Costs:
    """`costs` with some fields replaced (typed values over a run's)."""
    return replace(costs, **{k: v for k, v in changes.items() if v is not None})


# ----------------------------------------------------------------------------- formatting
def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    from residency.humanize import sig

    if seconds >= 3600:
        return f"{sig(seconds / 3600)} h"
    if seconds >= 60:
        return f"{sig(seconds / 60)} min"
    return f"{sig(seconds)} s"


def _pct(x: float, *, sign: bool = False) -> str:
    from residency.humanize import sig

    text = sig(100 * x)
    return f"{'+' if sign and x > 0 else ''}{text} %"


def make_plan(*, pilot: str | Any = None, aa: str | Any = None, published: bool = False,
              request_s: float | None = None, start_s: float | None = None,
              warmup_s: float | None = None, other_s: float | None = None,
              cv: float | None = None, request_cv: float | None = None,
              effect_s: float | None = None, effect_percent: float | None = None,
              pairs: Sequence[int] = DEFAULT_PAIRS, requests: Sequence[int] = DEFAULT_REQUESTS,
              budget_hours: float | None = None, power: float = 0.8, simulations: int = 2000,
              seed: int = 0) -> Plan:
    """`residency plan` and the notebook's planning cell: costs from `published` (the NPU
    figures), a `pilot` run (a directory or a loaded run) or typed values (typed values win);
    noise from `cv`/`request_cv` (stated), else the `aa` run, else the pilot; the effect
    stated (`effect_s`, or `effect_percent` of the request time) or the published one.

    Raises:
        PlanError: inputs that do not make a plan (naming the option).
    """
    from residency.rundir.run import load_run

    def loaded(x: Any) -> Any:
        return load_run(x) if isinstance(x, (str, bytes)) or hasattr(x, "__fspath__") else x

    pilot_run, aa_run = loaded(pilot), loaded(aa)
    typed = {"request_s": request_s, "start_s": start_s, "warmup_s": warmup_s,
             "other_s": other_s}
    if published and pilot_run is not None:
        raise PlanError("--published and --pilot both give costs: choose one")
    if published:
        costs = with_costs(published_costs(**({} if start_s is None else
                                                {"start_s": start_s})), **typed)
    elif pilot_run is not None:
        costs = costs_from_run(pilot_run, **typed)
    else:
        missing = [k for k in ("request_s", "start_s", "warmup_s") if typed[k] is None]
        if missing:
            raise PlanError("costs: give --pilot RUN_DIR, --published, or every one of "
                            "--request-s, --start-s and --warmup-s (missing: "
                            + ", ".join("--" + k.replace("_", "-") for k in missing) + ")")
        costs = Costs(request_s=float(request_s), start_s=float(start_s),  # type: ignore[arg-type]
                      warmup_s=float(warmup_s), other_s=float(other_s or 0.0))  # type: ignore[arg-type]
    if cv is not None or request_cv is not None:
        noise = Noise(run_cv=float(cv or 0.0), request_cv=float(request_cv or 0.0))
    elif aa_run is not None:
        noise = noise_from_run(aa_run)
    elif pilot_run is not None:
        noise = noise_from_run(pilot_run)
    else:
        raise PlanError("noise: give --cv (a run's E2E coefficient of variation, e.g. 0.01), "
                        "--aa RUN_DIR or --pilot RUN_DIR")
    source = "stated"
    if effect_s is not None and effect_percent is not None:
        raise PlanError("--effect and --effect-percent both state the effect: choose one")
    if effect_percent is not None:
        effect_s = effect_percent / 100 * costs.request_s
        source = f"stated, {effect_percent:+g} % of the request time"
    budget = None if budget_hours is None else float(budget_hours) * 3600
    return plan_designs(costs, noise, effect_s=effect_s, effect_source=source, pairs=pairs,
                        requests=requests, budget_s=budget, target_power=power,
                        simulations=simulations, seed=seed)


def design_statement(design: str, pairs: int, requests: int) -> str:
    """What `residency pair` runs and what that design can decide about E2E, in one line."""
    if design == "consecutive":
        return (f"design consecutive: one candidate service, {requests} requests: counts, no "
                "E2E comparison.")
    if design == "aa":
        return (f"design aa: {pairs} A/A pairs x {requests} requests per run ({2 * pairs} "
                "service runs): the E2E noise of one arm, no A/B claim.")
    profiled = design in ("profiled-pair", "paired-profile")
    n = pairs if design != "profiled-pair" else 0
    runs = 2 * profiled + 2 * n
    what = ("1 profiled pair" if profiled else "") + (
        f"{' + ' if profiled else ''}{n} unprofiled pairs x {requests} requests per run"
        if n else "")
    if design == "profiled-pair":
        e2e = ("one pair: E2E is a single observation, no test (the mechanism attributions "
               "are every rank, in this pair)")
    elif n < min_pairs_for():
        e2e = (f"E2E cannot reach p < 0.05 with {n} pairs (smallest two-sided p "
               f"{humanize.p_text(2.0 ** (1 - n))}; at least {min_pairs_for()} needed)")
    else:
        e2e = (f"E2E can reach p = {humanize.p_text(2.0 ** (1 - n))} at best; `residency plan` "
               "says the effect it detects")
    return f"design {design}: {what} ({runs} service runs): {e2e}."
