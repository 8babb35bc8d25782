"""Stop when decided: a sequential rule for the paired E2E question, fixed before the first
pair, that keeps the two-sided type-I error at or under 5 %.

The rule (`SequentialRule`): looks after `first_look`, `first_look + look_every`, ... pairs up
to `max_pairs`. At each look the suite's own fixed-design tests run on the pairs so far (the
exact Wilcoxon signed-rank test for a difference, the TOST of two one-sided exact
signed-rank tests against the declared ±2 % margin for equivalence: `residency.analysis.
stats`), each at the share of alpha that look spends. Alpha is spent along the Kim-DeMets
power family alpha x (n / max_pairs)^rho (rho = 2 by default, between Pocock's front-loading
and O'Brien-Fleming's back-loading); what the pairs before the first look would have spent
goes to the first look. A difference is claimed at the first look whose exact p is at or
under its spent alpha, equivalence likewise with the TOST p; otherwise the next pair is run,
until `max_pairs`.

Why this rule: each look's test is exact for any symmetric distribution of the deltas (no
normal approximation, which 6-20 heavy-tailed E2E deltas do not support), and the union
bound over looks (sum of the spent alphas = alpha) caps the chance of any false claim at
alpha whatever the dependence between looks: no boundary has to be computed from a joint
normal distribution. The price is conservatism, measured by `benchmarks/sequential.py`.

Adjusted figures (`Look`, `SequentialResult`): the adjusted p-value is the smallest alpha at
which this rule would have claimed by the stopping look, min over looks of p / (share of
alpha spent there), capped at 1 (P(adjusted p <= a) <= a by the same union bound). The
adjusted interval is a repeated confidence interval: the distribution-free interval for the
median delta at level 1 - (alpha spent at the stopping look), so that the intervals of all
looks cover the median delta together with probability >= 95 %.

`simulate` runs the rule over many sequences at once (exact signed-rank null tables, no
ties) for the simulation test and the benchmark. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from residency import humanize
from residency.analysis import stats

__all__ = ["DECISIONS", "Look", "SequentialResult", "SequentialRule", "signed_rank_tables",
           "simulate", "stop_sentence", "verdict_sentence"]

DECISIONS = ("continue", "difference", "equivalent", "maximum")
"""What a look decided: go on, a significant difference, equivalence within the margin, or
the maximum number of pairs reached undecided."""


@dataclass(frozen=True)
class Look:
    """One look of the rule: after `pairs` pairs, the exact p-values, the alpha this look
    spends, and what it decided."""

    pairs: int
    alpha_spent: float  # the share of the two-sided 5 % this look tests at
    p_difference: float
    p_equivalence: float | None  # TOST p; None when the margin is 0
    decision: str  # one of DECISIONS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class SequentialRule:
    """Looks and alpha spending, fixed before the first pair (see the module docstring)."""

    max_pairs: int
    first_look: int = 6
    look_every: int = 1
    rho: float = 2.0
    alpha: float = stats.ALPHA
    margin_fraction: float = stats.E2E_MARGIN_FRACTION

    def __post_init__(self) -> None:
        for name in ("max_pairs", "first_look", "look_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The value for `{name}` must be an integer >= 1, but {v!r} "
                                 "was passed.")
        if self.first_look > self.max_pairs:
            raise ValueError(f"The value for `max_pairs` must be at least `first_look` "
                             f"({self.first_look}), but {self.max_pairs!r} was passed.")
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError(f"The value for `rho` must be a positive number, but {self.rho!r}"
                             " was passed.")
        if not 0 < self.alpha < 1:
            raise ValueError(f"The value for `alpha` must be in (0, 1), but {self.alpha!r} "
                             "was passed.")

    @classmethod
    def default(cls, max_pairs: int) -> SequentialRule:
        """The suite's rule for `max_pairs`: first look at 6 pairs (the fewest that can reach
        p < 0.05), then about three more evenly spaced looks, rho = 2."""
        first = min(6, max_pairs)
        return cls(max_pairs=max_pairs, first_look=first,
                   look_every=max(1, math.ceil((max_pairs - first) / 3)))

    # ------------------------------------------------------------------ the schedule
    def looks(self) -> tuple[int, ...]:
        """Pair counts at which the rule looks (always ending with `max_pairs`)."""
        out = list(range(self.first_look, self.max_pairs + 1, self.look_every))
        if out[-1] != self.max_pairs:
            out.append(self.max_pairs)
        return tuple(out)

    def weights(self) -> tuple[float, ...]:
        """Share of alpha spent at each look (sums to 1)."""
        t = [(n / self.max_pairs) ** self.rho for n in self.looks()]
        return tuple(b - a for a, b in zip([0.0, *t[:-1]], t, strict=True))

    def alpha_at(self, pairs: int) -> float:
        """The alpha the look after `pairs` pairs tests at (0 when it is not a look)."""
        return dict(zip(self.looks(), (self.alpha * w for w in self.weights()),
                        strict=True)).get(pairs, 0.0)

    def describe(self) -> str:
        """The rule in one sentence."""
        looks = self.looks()
        every = "after every pair" if self.look_every == 1 else f"every {self.look_every} pairs"
        return (f"Sequential rule fixed before the first pair: looks {every} from pair "
                f"{looks[0]} to {self.max_pairs} ({len(looks)} looks); at each look the exact "
                f"Wilcoxon signed-rank test (difference) and the TOST against ±"
                f"{self.margin_fraction:.0%} of the baseline median (equivalence) at the alpha "
                f"that look spends, alpha x (n/{self.max_pairs})^{self.rho:g} cumulative "
                f"(Kim-DeMets power spending, union bound over looks: two-sided type-I error "
                f"<= {self.alpha:g}); adjusted p = min over looks of p / share spent."
                ).replace("%", " %")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the parameters, the looks and their spent alpha, the description."""
        return {"kind": "alpha-spending-union-bound", **asdict(self),
                "looks": list(self.looks()),
                "alpha_spent": [self.alpha * w for w in self.weights()],
                "text": self.describe()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SequentialRule:
        """The rule recorded by `to_dict`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        try:
            return cls(max_pairs=data["max_pairs"], first_look=data["first_look"],
                       look_every=data["look_every"], rho=float(data["rho"]),
                       alpha=float(data["alpha"]),
                       margin_fraction=float(data["margin_fraction"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"sequential rule: missing or invalid field {exc}") from None

    # ------------------------------------------------------------------ one look
    def look(self, baseline: Sequence[float], candidate: Sequence[float]) -> Look | None:
        """The look after len(baseline) pairs, or None when that count is not a look.

        Raises:
            ValueError: unequal or invalid inputs (`stats.compare_pairs`' checks).
        """
        n = len(baseline)
        if n not in self.looks():
            if len(candidate) != n:
                raise ValueError("baseline and candidate must have as many values")
            return None
        a = self.alpha_at(n)
        diff = stats.compare_pairs(baseline, candidate, unit="s")
        p = 1.0 if diff.p_value is None else diff.p_value
        margin = self.margin_fraction * float(np.median(np.asarray(baseline, dtype=float)))
        q = None
        if margin > 0:
            q = stats.equivalence_pairs(baseline, candidate, margin=margin,
                                        unit="s").p_value
        if p <= a and diff.delta != 0:
            decision = "difference"
        elif q is not None and q <= a:
            decision = "equivalent"
        elif n >= self.max_pairs:
            decision = "maximum"
        else:
            decision = "continue"
        return Look(pairs=n, alpha_spent=a, p_difference=p, p_equivalence=q,
                    decision=decision)

    def result(self, baseline: Sequence[float], candidate: Sequence[float],
               looks: Sequence[Look | Mapping[str, Any]] | None = None) -> SequentialResult:
        """The adjusted figures after the pairs run so far (`looks`: the recorded ones; else
        recomputed from the pairs).

        Raises:
            ValueError: no look was taken yet.
        """
        if looks is None:
            looks = [lk for n in range(1, len(baseline) + 1)
                     if (lk := self.look(baseline[:n], candidate[:n])) is not None]
        done = [lk if isinstance(lk, Look) else Look(**dict(lk)) for lk in looks]
        if not done:
            raise ValueError(f"no look of the sequential rule after {len(baseline)} pairs "
                             f"(first look after {self.first_look})")
        weights = dict(zip(self.looks(), self.weights(), strict=True))
        p_adj = min(1.0, min(lk.p_difference / weights[lk.pairs] for lk in done))
        qs = [lk.p_equivalence / weights[lk.pairs] for lk in done
              if lk.p_equivalence is not None]
        q_adj = min(1.0, min(qs)) if qs else None
        last = done[-1]
        n = last.pairs
        d = np.asarray(candidate[:n], dtype=float) - np.asarray(baseline[:n], dtype=float)
        level = 1 - last.alpha_spent
        found = stats.median_interval(d, level=level)
        reason = {
            "difference": (f"the exact Wilcoxon signed-rank p "
                           f"{humanize.p_text(last.p_difference)} <= "
                           f"{humanize.p_text(last.alpha_spent)}, the alpha spent at this look"),
            "equivalent": (f"the TOST p {humanize.p_text(last.p_equivalence or 1.0)} <= "
                           f"{humanize.p_text(last.alpha_spent)}, the alpha spent at this look"),
            "maximum": f"the maximum of {self.max_pairs} pairs reached undecided",
            "continue": "not stopped yet",
        }[last.decision]
        return SequentialResult(
            rule=self, looks=tuple(done), stopped_after=n, max_pairs=self.max_pairs,
            decision=last.decision, reason=reason, p_adjusted=p_adj,
            p_equivalence_adjusted=q_adj, median_delta=float(np.median(d)),
            ci=None if found is None else (found[0], found[1]),
            ci_level=level, ci_coverage=None if found is None else found[2])


@dataclass(frozen=True)
class SequentialResult:
    """Where a sequential run stopped, why, and its adjusted p-values and interval."""

    rule: SequentialRule
    looks: tuple[Look, ...]
    stopped_after: int
    max_pairs: int
    decision: str
    reason: str
    p_adjusted: float  # difference, adjusted for every look
    p_equivalence_adjusted: float | None
    median_delta: float
    ci: tuple[float, float] | None  # repeated confidence interval at the stopping look
    ci_level: float
    ci_coverage: float | None
    notes: tuple[str, ...] = field(default=())

    def sentence(self, unit: str = "s") -> str:
        """'Stopped after k of N pairs: ...' with the adjusted p-value and interval."""
        return stop_sentence(self.to_dict(), unit=unit)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the manifest's `sequential` record and the evidence's detail)."""
        return {"rule": self.rule.to_dict(), "looks": [lk.to_dict() for lk in self.looks],
                "stopped_after": self.stopped_after, "max_pairs": self.max_pairs,
                "decision": self.decision, "reason": self.reason,
                "p_adjusted": self.p_adjusted,
                "p_equivalence_adjusted": self.p_equivalence_adjusted,
                "median_delta": self.median_delta,
                "ci": list(self.ci) if self.ci else None, "ci_level": self.ci_level,
                "ci_coverage": self.ci_coverage}


def stop_sentence(record: Mapping[str, Any], unit: str = "s") -> str:
    """The plain-words line of a sequential record (`SequentialResult.to_dict()`): stopped
    after k of N pairs, why, the adjusted p-values and the repeated confidence interval."""
    k, n = record["stopped_after"], record["max_pairs"]
    what = {"difference": "a difference", "equivalent": "equivalence",
            "maximum": "undecided", "continue": "still running"}.get(record["decision"],
                                                                      record["decision"])
    ci = record.get("ci")
    level = float(record.get("ci_level") or 0.95)
    interval = (f"; {level:.2%} repeated confidence interval for the median delta "
                f"{humanize.quantity(ci[0])}..{humanize.quantity(ci[1], unit)} (95 % jointly over "
                "all looks)" if ci else
                f"; no {level:.2%} repeated confidence interval reachable with {k} pairs")
    q = record.get("p_equivalence_adjusted")
    return (f"Stopped after {k} of {n} pairs ({what}: {record['reason']}); adjusted p = "
            f"{humanize.p_text(record['p_adjusted'])} (difference)"
            + ("" if q is None else f", {humanize.p_text(q)} (equivalence, TOST)")
            + f", over {len(record.get('looks') or ())} looks{interval}.").replace("%", " %"
                                                                              ).replace("  ", " ")


# ----------------------------------------------------------------------------- simulation
def signed_rank_tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact null tables of the Wilcoxon signed-rank statistic W+ (ranks 1..n, no ties):
    (two-sided p, P(W+ >= w), P(W+ <= w)) indexed by w = 0 .. n(n+1)/2."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r]
        counts = counts + shifted
    probs = counts / counts.sum()
    w = np.arange(probs.size)
    mean = n * (n + 1) / 4
    dev = np.abs(w - mean)
    order = np.argsort(-dev, kind="stable")
    two = np.empty_like(probs)
    cum = np.cumsum(probs[order])
    # p(w) = P(|W - mean| >= |w - mean|): sum over all w' with dev >= dev(w)
    sorted_dev = dev[order]
    last_index = np.searchsorted(-sorted_dev, -dev, side="right") - 1
    two = np.minimum(1.0, cum[last_index])
    greater = np.minimum(1.0, np.cumsum(probs[::-1])[::-1])
    less = np.minimum(1.0, np.cumsum(probs))
    return two, greater, less


def _w_plus(d: np.ndarray) -> np.ndarray:
    """W+ of each row of `d` (no zeros, no ties assumed)."""
    ranks = np.argsort(np.argsort(np.abs(d), axis=1), axis=1) + 1
    return (ranks * (d > 0)).sum(axis=1)


def simulate(rule: SequentialRule, baseline: np.ndarray, candidate: np.ndarray
             ) -> dict[str, np.ndarray]:
    """Run `rule` over many sequences at once: row i of `baseline`/`candidate` (S x
    max_pairs, continuous values: no ties) is one sequence. Returns `pairs` (where each
    stopped) and `decision` (codes into `DECISIONS`) per sequence, plus the fixed design's
    `fixed_difference` (the exact test at 5 % after all max_pairs pairs)."""
    b = np.asarray(baseline, dtype=float)
    c = np.asarray(candidate, dtype=float)
    if b.shape != c.shape or b.ndim != 2 or b.shape[1] < rule.max_pairs:
        raise ValueError(f"baseline and candidate must both be S x {rule.max_pairs} arrays")
    s = b.shape[0]
    d = c - b
    stop = np.zeros(s, dtype=int)
    decision = np.zeros(s, dtype=int)
    open_ = np.ones(s, dtype=bool)
    for n, w in zip(rule.looks(), rule.weights(), strict=True):
        a = rule.alpha * w
        two, greater, less = signed_rank_tables(n)
        dn = d[:, :n]
        p = two[_w_plus(dn)]
        margin = rule.margin_fraction * np.median(b[:, :n], axis=1, keepdims=True)
        p_lo = greater[_w_plus(dn + margin)]  # H0: delta <= -margin
        p_hi = less[_w_plus(dn - margin)]  # H0: delta >= +margin
        q = np.maximum(p_lo, p_hi)
        diff = open_ & (p <= a)
        eq = open_ & ~diff & (q <= a)
        for mask, code in ((diff, 1), (eq, 2)):
            stop[mask], decision[mask] = n, code
        open_ &= ~(diff | eq)
        if n == rule.max_pairs:
            stop[open_], decision[open_] = n, 3
    two, _, _ = signed_rank_tables(rule.max_pairs)
    fixed = two[_w_plus(d[:, :rule.max_pairs])] < stats.ALPHA
    return {"pairs": stop, "decision": decision, "fixed_difference": fixed}


def verdict_sentence(found: SequentialResult, difference: stats.PairComparison, *,
                     expected: str = "faster") -> str:
    """The E2E verdict of a sequential run in one sentence ("Verdict:" or "No verdict:"),
    at the adjusted figures, saying "stopped after k of N pairs"."""
    u = difference.unit
    rel = ("" if difference.relative is None else
           f" ({difference.relative:+.2%} of the baseline median)".replace("%", " %"))
    k, n = found.stopped_after, found.max_pairs
    delta = humanize.quantity(found.median_delta, u, sign=True)
    if found.decision == "difference":
        direction = "faster" if found.median_delta < 0 else "slower"
        where = ("in the expected direction" if direction == expected
                 else "AGAINST the expected direction")
        return (f"Verdict: the candidate is {direction} in E2E, {where}: median paired delta "
                f"{delta}{rel}; stopped after {k} of {n} pairs by the sequential rule, "
                f"adjusted p = {humanize.p_text(found.p_adjusted)}.")
    if found.decision == "equivalent":
        return (f"Verdict: E2E equivalent within ±{found.rule.margin_fraction:.0%} of the "
                f"baseline median E2E: median paired delta {delta}{rel}; stopped after {k} of "
                f"{n} pairs by the sequential rule, adjusted TOST p = "
                f"{humanize.p_text(found.p_equivalence_adjusted or 1.0)}.").replace("%", " %")
    q = found.p_equivalence_adjusted
    return (f"No verdict: stopped after {k} of {n} pairs "
            f"({'maximum reached' if found.decision == 'maximum' else 'not finished'}), "
            f"neither a difference nor equivalence decided by the sequential rule: median "
            f"paired delta {delta}{rel}, adjusted p = {humanize.p_text(found.p_adjusted)}"
            + ("" if q is None else f", adjusted TOST p = {humanize.p_text(q)}") + ".")
