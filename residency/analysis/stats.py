"""What a comparison of two arms can and cannot claim, as small immutable results.

Entry points, one per shape of evidence:

* `compare_groups`: per-rank values of one run pair (exact Mann-Whitney U test);
* `compare_pairs`: arm-level paired measurements (the exact Wilcoxon signed-rank test: its
  null distribution enumerates all 2^n sign patterns of the ranked deltas);
* `equivalence_pairs`: the same pairs tested for equivalence within a declared margin
  (TOST: two one-sided exact Wilcoxon signed-rank tests) and for non-equivalence;
* `sign_flip_test`, `wilcoxon_signed_rank`: the two exact paired tests on deltas, alone;
* `median_interval`: a distribution-free interval for a median with its exact coverage;
* `aa_noise`: the spread of A/A (same-arm) pairs, the noise an A/B delta is read against;
* `proportion`: k of n with a Clopper-Pearson 95 % interval;
* `single`: one value per arm, no test possible.

Every result carries `n`, `p_value` (float or None), `ci` (tuple or None), an effect
(`ratio` and/or `delta`, in `unit`) and the fields its plain-words note needs; the note itself
is written by `residency.evidence.notes` (statistics here, prose there), and `to_dict(note=)`
puts it in its place in the `results.json` record. Tests are two-sided at the 5 % level. The
fields keep full precision. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np
from scipy import stats as _sps

from residency.humanize import full_number, p_text, quantity, speed_text
from residency.policy.cache import BASELINE, CANDIDATE

ALPHA = 0.05
MIN_REPETITIONS = 9  # Google Benchmark compare.py warns below this
MIN_CI_PAIRS = 10  # no interval for paired deltas below this many pairs
E2E_MARGIN_FRACTION = 0.02
"""The declared E2E equivalence margin: 2 % of the baseline median E2E."""
_MAX_ENUMERATION = 200_000  # exact permutation enumeration limit for tied groups

__all__ = [
    "E2E_MARGIN_FRACTION", "AANoise", "Equivalence", "GroupComparison", "PairComparison",
    "Proportion", "Single",
    "aa_noise", "compare_groups", "compare_pairs", "equivalence_pairs",
    "proportion", "single", "median_interval", "sign_flip_test",
    "wilcoxon_signed_rank", "EQUIVALENCE_OUTCOMES", "MIN_CI_PAIRS", "MIN_REPETITIONS",
    "OUTLIER_SPREADS", "PAIRED_TEST", "REPLICATES", "robust_spread",
]
OUTLIER_SPREADS = 3.0
"""A paired delta further than this many robust spreads (1.4826 x MAD) from the median delta
is named an outlier in the note."""


class _Result:
    """Shared helpers: `to_dict(note=)` for JSON and a readable repr."""

    RECORD: ClassVar[tuple[str, ...]]
    """The `results.json` keys of the result, in their order (`kind` follows): its fields, less
    those only its note reads, and `note`, the note layer's sentence."""

    def to_dict(self, note: str | None = None) -> dict[str, Any]:
        """The result as plain JSON-ready values in its record's key order; `note` (the
        sentence of `residency.evidence.notes.note`) fills the `note` key, which is left out
        when None."""
        values = asdict(self)  # type: ignore[call-overload]
        out = {k: note if k == "note" else values[k] for k in self.RECORD
               if k != "note" or note is not None}
        out["kind"] = type(self).__name__
        return out

    def _summary(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._summary()}>"

    def __str__(self) -> str:
        return self._summary()


# ----------------------------------------------------------------------------- input checks
def _values(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Validated non-empty, finite, non-negative float array."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(
            f"The value for `{name}` must be a sequence of numbers, but {values!r} was passed.")
    try:
        arr = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"The value for `{name}` must be a sequence of numbers, "
                         f"but {values!r} was passed.") from None
    if arr.size == 0:
        raise ValueError(f"The value for `{name}` must be a non-empty sequence of numbers, "
                         f"but an empty sequence was passed.")
    _check_finite(name, arr)
    return arr


def _check_finite(name: str, arr: np.ndarray) -> None:
    bad = arr[~np.isfinite(arr)]
    if bad.size:
        raise ValueError(f"The value for `{name}` must contain only finite numbers, "
                         f"but {bad[0]!r} was passed.")
    neg = arr[arr < 0]
    if neg.size:
        raise ValueError(f"The value for `{name}` must hold non-negative durations, "
                         f"but {neg[0]!r} was passed.")


def _scalar(name: str, value: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"The value for `{name}` must be a number, "
                         f"but {value!r} was passed.") from None
    _check_finite(name, np.array([x]))
    return x


def _ratio(candidate: float, baseline: float) -> float | None:
    return candidate / baseline if baseline > 0 else None


# ----------------------------------------------------------------------------- groups
@dataclass(frozen=True, repr=False)
class GroupComparison(_Result):
    """Per-rank values of one run pair compared with an exact Mann-Whitney U test."""

    n: tuple[int, int]
    baseline_range: tuple[float, float]
    candidate_range: tuple[float, float]
    baseline_median: float
    candidate_median: float
    ratio: float | None  # candidate median / baseline median
    delta: float  # candidate median - baseline median
    unit: str
    p_value: float
    test: str
    ci: None
    replicate: str  # what one value is: a key of REPLICATES
    RECORD: ClassVar[tuple[str, ...]] = (
        "n", "baseline_range", "candidate_range", "baseline_median", "candidate_median",
        "ratio", "delta", "unit", "p_value", "test", "ci", "note")

    @property
    def separated(self) -> bool:
        """Every value of one arm lies below every value of the other."""
        return (self.candidate_range[1] < self.baseline_range[0]
                or self.baseline_range[1] < self.candidate_range[0])

    @property
    def min_p(self) -> float:
        """The smallest two-sided p reachable with these group sizes: 2 / C(n0 + n1, n0)
        (complete separation)."""
        return 2 / math.comb(sum(self.n), self.n[0])

    def _summary(self) -> str:
        b, c, u = self.baseline_range, self.candidate_range, self.unit
        bm, cm = full_number(self.baseline_median), full_number(self.candidate_median)
        return (f"n={self.n[0]} vs {self.n[1]}: {full_number(b[0])}-{full_number(b[1])} {u} -> "
                f"{full_number(c[0])}-{full_number(c[1])} {u}, medians {bm}"
                f" -> {cm} {u}: {speed_text(self.ratio)}, "
                f"p={p_text(self.p_value)}")


def _mann_whitney_exact(b: np.ndarray, c: np.ndarray) -> tuple[float, str]:
    """Two-sided p of the U test: scipy exact without ties, else exact enumeration."""
    pooled = np.concatenate([b, c])
    if np.unique(pooled).size == pooled.size:
        res = _sps.mannwhitneyu(b, c, alternative="two-sided", method="exact")
        return float(res.pvalue), "exact"
    if math.comb(pooled.size, b.size) > _MAX_ENUMERATION:
        res = _sps.mannwhitneyu(b, c, alternative="two-sided", method="asymptotic")
        return float(res.pvalue), "normal approximation with tie correction"
    ranks = _sps.rankdata(pooled)
    expected = b.size * (pooled.size + 1) / 2
    observed = abs(ranks[: b.size].sum() - expected)
    sums = np.fromiter((ranks[list(ix)].sum() for ix in combinations(range(pooled.size), b.size)),
                       dtype=float)
    p = np.mean(np.abs(sums - expected) >= observed - 1e-9)
    return float(min(1.0, p)), "exact permutation with ties"


REPLICATES = ("rank", "run")
"""What one value of `compare_groups` can be: a rank of one run pair, or one service run."""


def compare_groups(
    baseline: Sequence[float], candidate: Sequence[float], *, unit: str = "ms",
    replicate: str = "rank",
) -> GroupComparison:
    """Compare two groups of values with an exact Mann-Whitney U test.

    `replicate` names what one value is: `rank` (per-rank values of one run pair: the ranks
    of one run are not independent replicates, a small p supports a claim about every rank
    in this run pair only) or `run` (one value per service run: the unit of a cross-run
    claim). The note says which.

    Raises:
        ValueError: an input is empty or holds NaN, infinite or negative values.
    """
    if replicate not in REPLICATES:
        raise ValueError(f"The value for `replicate` must be one of {list(REPLICATES)}, but "
                         f"{replicate!r} was passed.")
    b, c = _values(BASELINE, baseline), _values(CANDIDATE, candidate)
    p, method = _mann_whitney_exact(b, c)
    test = f"Mann-Whitney U test ({method}, two-sided)"
    bm, cm = float(np.median(b)), float(np.median(c))
    return GroupComparison(
        n=(int(b.size), int(c.size)), baseline_range=(float(b.min()), float(b.max())),
        candidate_range=(float(c.min()), float(c.max())), baseline_median=bm,
        candidate_median=cm, ratio=_ratio(cm, bm), delta=cm - bm, unit=unit, p_value=p,
        test=test, ci=None, replicate=replicate)


# ----------------------------------------------------------------------------- pairs
PAIRED_TEST = "exact Wilcoxon signed-rank test (two-sided)"
"""The paired test the E2E notes compute, named once: ranks of |delta|, null distribution
over all 2^n sign patterns (zero deltas dropped, midranks for ties)."""


@dataclass(frozen=True, repr=False)
class PairComparison(_Result):
    """Arm-level paired measurements compared with the exact Wilcoxon signed-rank test."""

    n: int
    deltas: tuple[float, ...]  # candidate - baseline, per pair
    baseline_median: float
    candidate_median: float
    delta: float  # median of the paired deltas
    relative: float | None  # delta / baseline median
    ratio: float | None  # candidate median / baseline median
    unit: str
    p_value: float | None
    min_p: float | None  # smallest two-sided p reachable at this n: 2^(1-n)
    ci: tuple[float, float] | None  # distribution-free interval for the median delta
    pairs_needed: int | None
    test: str
    ci_coverage: float | None = None  # the interval's exact coverage (binomial)
    ci_order: tuple[int, int] | None = None  # its order statistics, 1-based, of n
    reversed_pairs: tuple[int, ...] = ()  # 0-based: deltas of the sign opposite the median's
    outlier_pairs: tuple[int, ...] = ()  # 0-based: beyond OUTLIER_SPREADS robust spreads
    tested_pairs: int = 0  # pairs the test ranked: the non-zero deltas
    spread: float | None = None  # what `pairs_needed` assumed: robust_spread, else the noise
    noise: float | None = None  # the A/A noise given, in `unit`
    labels: tuple[str, ...] | None = None  # the pairs' names, as given
    RECORD: ClassVar[tuple[str, ...]] = (
        "n", "deltas", "baseline_median", "candidate_median", "delta", "relative", "ratio",
        "unit", "p_value", "min_p", "ci", "pairs_needed", "test", "note", "ci_coverage",
        "ci_order", "reversed_pairs", "outlier_pairs")

    @property
    def median_difference(self) -> float:
        """The delta of the medians (candidate - baseline), not the median delta."""
        return self.candidate_median - self.baseline_median

    @property
    def within_noise(self) -> bool | None:
        """|median delta| is at most the A/A noise (None without a noise estimate)."""
        return None if self.noise is None else abs(self.delta) <= self.noise

    @property
    def noise_multiple(self) -> float | None:
        """|median delta| / A/A noise (None without a noise estimate, or a zero one)."""
        return abs(self.delta) / self.noise if self.noise else None

    def _summary(self) -> str:
        u = self.unit
        rel = "" if self.relative is None else f" ({self.relative:+.2%})"
        p = "p=None" if self.p_value is None else f"p={p_text(self.p_value)}"
        ci = "" if self.ci is None else (f", {self.ci_coverage:.2%} interval "
                                         f"{quantity(self.ci[0])}..{quantity(self.ci[1])}")
        pairs = "pair" if self.n == 1 else "pairs"
        return (f"n={self.n} {pairs}: medians {quantity(self.baseline_median)} -> "
                f"{quantity(self.candidate_median)} {u}, median delta "
                f"{quantity(self.delta, u, sign=True)}{rel}{ci}, {p}")


def _rank_sum_distribution(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(doubled midranks of |d|, probability of each doubled positive-rank sum under random
    signs); `d` without zeros."""
    r2 = np.rint(2 * _sps.rankdata(np.abs(d))).astype(np.int64)  # midranks, doubled
    counts = np.zeros(int(r2.sum()) + 1)
    counts[0] = 1.0
    for r in r2:  # distribution of the positive-rank sum under random signs
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r] if r else counts
        counts = counts + shifted
    return r2, counts / counts.sum()


def _signed_rank_exact(d: np.ndarray) -> tuple[float, int]:
    """Exact two-sided Wilcoxon signed-rank p over all 2^n sign flips (zeros dropped)."""
    d = d[d != 0]
    if d.size == 0:
        return 1.0, 0
    r2, probs = _rank_sum_distribution(d)
    mean = r2.sum() / 2
    observed = abs(r2[d > 0].sum() - mean)
    p = probs[np.abs(np.arange(probs.size) - mean) >= observed - 1e-9].sum()
    return float(min(1.0, p)), int(d.size)


def wilcoxon_signed_rank(deltas: Sequence[float]) -> float:
    """Two-sided p of the exact Wilcoxon signed-rank test of paired deltas against 0 (ranks
    of |delta|, midranks for ties, zero deltas dropped; all 2^n sign patterns enumerated).

    Raises:
        ValueError: empty or non-finite input.
    """
    d = _deltas("deltas", deltas)
    return _signed_rank_exact(d)[0]


def sign_flip_test(deltas: Sequence[float]) -> float:
    """Two-sided p of the exact sign-flip (Fisher-Pitman) test of paired deltas against 0:
    the share of the 2^n sign patterns whose |sum| is at least the observed |sum| (n <= 24).

    Raises:
        ValueError: empty or non-finite input, or more than 24 deltas.
    """
    d = _deltas("deltas", deltas)
    if d.size > 24:
        raise ValueError(f"The value for `deltas` must hold at most 24 values (2^n sign "
                         f"patterns are enumerated), but {d.size} were passed.")
    signs = 1 - 2 * ((np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1)
    sums = np.abs(signs @ d)
    observed = abs(float(d.sum()))
    return float(np.mean(sums >= observed - 1e-12 * max(1.0, observed)))


def _deltas(name: str, values: Sequence[float]) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"The value for `{name}` must be a sequence of numbers, but "
                         f"{values!r} was passed.")
    d = np.asarray(values, dtype=float).ravel()
    if d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"The value for `{name}` must be a non-empty sequence of finite "
                         f"numbers, but {values!r} was passed.")
    return d


def median_interval(values: Sequence[float], level: float = 0.95
                    ) -> tuple[float, float, float, int, int] | None:
    """A distribution-free interval for the median: the k-th smallest and k-th largest value
    with the largest k whose exact coverage, 1 - 2 P(X <= k-1) for X ~ Binomial(n, 1/2), is
    at least `level`. Returns (low, high, coverage, k, n + 1 - k); None when no k >= 1
    reaches `level` (n = 10 at 95 %: the 2nd and 9th values, coverage 1 - 22/1024 =
    97.85 %)."""
    s = np.sort(np.asarray(values, dtype=float).ravel())
    n = s.size
    tail = (1 - level) / 2
    k = 0
    while k + 1 <= n // 2 and _sps.binom.cdf(k, n, 0.5) <= tail + 1e-15:
        k += 1
    if k < 1:
        return None
    coverage = float(1 - 2 * _sps.binom.cdf(k - 1, n, 0.5))
    return float(s[k - 1]), float(s[n - k]), coverage, k, n + 1 - k


def robust_spread(values: Sequence[float] | np.ndarray) -> float:
    """1.4826 x the median absolute deviation: a standard-deviation estimate that one
    outlier cannot pull (equals the SD for normal data)."""
    x = np.asarray(values, dtype=float)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _pairs_needed(effect: float, sd: float | None) -> int | None:
    """Pairs for 80 % power at the 5 % level, normal approximation; at least 6; None when
    the effect is 0 or too small against the spread for any practical number of pairs."""
    if effect == 0:
        return None
    if not sd:
        return 6
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.80)
    ratio = z * sd / abs(effect)
    if not math.isfinite(ratio) or ratio > 1e6:
        return None
    return max(6, math.ceil(ratio ** 2))


def _unusual_pairs(d: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reversed, outliers), 0-based: deltas whose sign opposes the median delta's, and
    deltas more than OUTLIER_SPREADS robust spreads from the median delta."""
    md = float(np.median(d))
    rev = tuple(int(i) for i in np.flatnonzero(np.sign(d) == -np.sign(md))) if md else ()
    spread = robust_spread(d)
    out = tuple(int(i) for i in np.flatnonzero(np.abs(d - md) > OUTLIER_SPREADS * spread)
                ) if spread > 0 else ()
    return rev, out


def compare_pairs(
    baseline: Sequence[float], candidate: Sequence[float], *, unit: str = "s",
    noise: float | None = None, labels: Sequence[str] | None = None,
) -> PairComparison:
    """Compare paired arm-level measurements, pair i = (baseline[i], candidate[i]), with the
    exact Wilcoxon signed-rank test (`PAIRED_TEST`).

    `noise` is an optional A/A noise estimate in `unit` (e.g. the typical |delta| of
    same-arm pairs); the median delta is compared with it. `labels` name the pairs in the
    note (reversed pairs and outliers are named).

    Raises:
        ValueError: empty, NaN, infinite or negative inputs; unequal lengths; bad `noise`.
    """
    b, c = _values(BASELINE, baseline), _values(CANDIDATE, candidate)
    if b.size != c.size:
        raise ValueError(f"The value for `candidate` must have as many values as `baseline` "
                         f"({b.size}), but a sequence of length {c.size} was passed.")
    if noise is not None:
        noise = _scalar("noise", noise)
    if labels is not None and len(labels) != b.size:
        raise ValueError(f"The value for `labels` must name {b.size} pairs, but "
                         f"{len(labels)} labels were passed.")
    n = int(b.size)
    d = c - b
    bm, cm, md = float(np.median(b)), float(np.median(c)), float(np.median(d))
    p = min_p = ci = coverage = order = None
    rev: tuple[int, ...] = ()
    out: tuple[int, ...] = ()
    used = 0
    test = "none (single pair)"
    if n >= 2:
        p, used = _signed_rank_exact(d)
        min_p = 2.0 ** (1 - n)
        test = PAIRED_TEST
        found = median_interval(d) if n >= MIN_CI_PAIRS else None
        if found is not None:
            ci, coverage, order = (found[0], found[1]), found[2], (found[3], found[4])
        rev, out = _unusual_pairs(d)
    spread = robust_spread(d) if n >= 2 else noise
    return PairComparison(
        n=n, deltas=tuple(float(x) for x in d), baseline_median=bm, candidate_median=cm,
        delta=md, relative=md / bm if bm > 0 else None, ratio=_ratio(cm, bm), unit=unit,
        p_value=p, min_p=min_p, ci=ci, pairs_needed=_pairs_needed(md, spread), test=test,
        ci_coverage=coverage, ci_order=order, reversed_pairs=rev, outlier_pairs=out,
        tested_pairs=used, spread=spread, noise=noise,
        labels=None if labels is None else tuple(str(x) for x in labels))


# ----------------------------------------------------------------------------- equivalence
EQUIVALENCE_OUTCOMES = ("equivalent", "not equivalent", "cannot tell")


@dataclass(frozen=True, repr=False)
class Equivalence(_Result):
    """Paired deltas tested for equivalence within +-`margin` (TOST, exact signed-rank) and
    for non-equivalence (the deltas lie beyond one bound)."""

    n: int
    deltas: tuple[float, ...]  # candidate - baseline, per pair
    delta: float  # median of the paired deltas
    margin: float  # declared equivalence margin, in `unit`
    margin_label: str  # how the margin was declared, e.g. "2 % of the baseline median E2E"
    p_lower: float | None  # one-sided p against H0 "delta <= -margin"
    p_upper: float | None  # one-sided p against H0 "delta >= +margin"
    p_value: float | None  # max(p_lower, p_upper): equivalence when < 0.05
    equivalent: bool
    min_p: float | None  # smallest reachable TOST p at this n: 2^-n
    pairs_needed: int | None
    unit: str
    test: str
    ci: None
    p_below: float | None = None  # one-sided p against H0 "delta >= -margin" (beyond below)
    p_above: float | None = None  # one-sided p against H0 "delta <= +margin" (beyond above)
    outcome: str = "cannot tell"  # one of EQUIVALENCE_OUTCOMES
    margin_declared: bool = False  # `margin_label` was given (else it is the margin itself)
    mean: float | None = None  # mean of the paired deltas (what `pairs_needed` assumed)
    sd: float | None = None  # their standard deviation (ddof 1)
    RECORD: ClassVar[tuple[str, ...]] = (
        "n", "deltas", "delta", "margin", "margin_label", "p_lower", "p_upper", "p_value",
        "equivalent", "min_p", "pairs_needed", "unit", "test", "ci", "note", "p_below",
        "p_above", "outcome")

    def _summary(self) -> str:
        p = "p=None" if self.p_value is None else f"p={p_text(self.p_value)}"
        return (f"n={self.n} pairs: median delta {quantity(self.delta, self.unit, sign=True)} "
                f"vs margin +-{quantity(self.margin, self.unit)}: {self.outcome}, TOST {p}")


def _signed_rank_one_sided(d: np.ndarray, alternative: str) -> float:
    """Exact one-sided Wilcoxon signed-rank p over all 2^n sign flips (zeros dropped):
    `greater` tests whether the deltas lie above 0, `less` below."""
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    r2, probs = _rank_sum_distribution(d)
    observed = int(r2[d > 0].sum())
    sums = np.arange(probs.size)
    tail = sums >= observed if alternative == "greater" else sums <= observed
    return float(min(1.0, probs[tail].sum()))


def _equivalence_pairs_needed(mean: float, sd: float | None, margin: float) -> int | None:
    """Pairs for 80 % power of the TOST at the 5 % level, normal approximation; at least 5."""
    if abs(mean) >= margin:
        return None
    if not sd:
        return 5
    z = NormalDist().inv_cdf(0.95) + NormalDist().inv_cdf(0.90 if mean == 0 else 0.80)
    return max(5, math.ceil((z * sd / (margin - abs(mean))) ** 2))


def equivalence_pairs(
    baseline: Sequence[float], candidate: Sequence[float], *, margin: float,
    unit: str = "s", margin_label: str | None = None,
) -> Equivalence:
    """TOST on paired measurements: is candidate - baseline within +-`margin`, beyond it, or
    cannot the data tell?

    Two one-sided exact Wilcoxon signed-rank tests at the 5 % level: H0 "delta <= -margin"
    (`p_lower`) and H0 "delta >= +margin" (`p_upper`); the TOST p is the larger, and
    equivalence is claimed only when it is below 0.05. Non-equivalence is claimed when one
    of the reverse one-sided tests rejects H0 "delta >= -margin" (`p_below`) or H0 "delta <=
    +margin" (`p_above`) at 0.05; otherwise the outcome is "cannot tell" and the note says
    how many pairs would tell. `margin_label` says how the margin was declared.

    Raises:
        ValueError: empty, NaN, infinite or negative inputs; unequal lengths; margin <= 0.
    """
    b, c = _values(BASELINE, baseline), _values(CANDIDATE, candidate)
    if b.size != c.size:
        raise ValueError(f"The value for `candidate` must have as many values as `baseline` "
                         f"({b.size}), but a sequence of length {c.size} was passed.")
    m = _scalar("margin", margin)
    if m <= 0:
        raise ValueError(f"The value for `margin` must be > 0, but {margin!r} was passed.")
    label = margin_label or f"+-{quantity(m, unit)}"
    n, d = int(b.size), c - b
    md, mean = float(np.median(d)), float(np.mean(d))
    test = "TOST: two one-sided exact Wilcoxon signed-rank tests, 5 % level each"
    if n < 2:
        return Equivalence(
            n=n, deltas=tuple(float(x) for x in d), delta=md, margin=m, margin_label=label,
            p_lower=None, p_upper=None, p_value=None, equivalent=False, min_p=None,
            pairs_needed=None, unit=unit, test="none (single pair)", ci=None,
            margin_declared=margin_label is not None, mean=mean)
    p_lower = _signed_rank_one_sided(d + m, "greater")
    p_upper = _signed_rank_one_sided(d - m, "less")
    p_below = _signed_rank_one_sided(d + m, "less")
    p_above = _signed_rank_one_sided(d - m, "greater")
    p = max(p_lower, p_upper)
    sd = float(np.std(d, ddof=1))
    if p < ALPHA:
        outcome = "equivalent"
    elif min(p_below, p_above) < ALPHA:
        outcome = "not equivalent"
    else:
        outcome = "cannot tell"
    return Equivalence(
        n=n, deltas=tuple(float(x) for x in d), delta=md, margin=m, margin_label=label,
        p_lower=p_lower, p_upper=p_upper, p_value=p, equivalent=p < ALPHA, min_p=2.0 ** -n,
        pairs_needed=_equivalence_pairs_needed(mean, sd, m), unit=unit, test=test, ci=None,
        p_below=p_below, p_above=p_above, outcome=outcome,
        margin_declared=margin_label is not None, mean=mean, sd=sd)


@dataclass(frozen=True, repr=False)
class AANoise(_Result):
    """The spread of A/A pairs (same arm in both slots): what an A/B delta is read against."""

    n: int
    deltas: tuple[float, ...]  # slot B - slot A, per pair
    spread: float  # median |delta|
    max_abs: float
    cv: float | None  # SD of every run's value / their mean
    unit: str
    p_value: None
    ci: None
    RECORD: ClassVar[tuple[str, ...]] = (
        "n", "deltas", "spread", "max_abs", "cv", "unit", "p_value", "ci", "note")

    def _summary(self) -> str:
        cv = "" if self.cv is None else f", CV {self.cv:.2%}"
        return (f"A/A n={self.n} pairs: median |delta| {full_number(self.spread)} {self.unit}, "
                f"max {full_number(self.max_abs)} {self.unit}{cv}")


def aa_noise(slot_a: Sequence[float], slot_b: Sequence[float], *, unit: str = "s") -> AANoise:
    """A/A noise from pairs of same-arm runs: pair i = (slot_a[i], slot_b[i]).

    Raises:
        ValueError: empty, NaN, infinite or negative inputs; unequal lengths.
    """
    a, b = _values("slot_a", slot_a), _values("slot_b", slot_b)
    if a.size != b.size:
        raise ValueError(f"The value for `slot_b` must have as many values as `slot_a` "
                         f"({a.size}), but a sequence of length {b.size} was passed.")
    d = b - a
    both = np.concatenate([a, b])
    cv = float(np.std(both, ddof=1) / np.mean(both)) if both.size > 1 and np.mean(both) else None
    spread, mx = float(np.median(np.abs(d))), float(np.max(np.abs(d)))
    return AANoise(n=int(a.size), deltas=tuple(float(x) for x in d), spread=spread,
                   max_abs=mx, cv=cv, unit=unit, p_value=None, ci=None)


# ----------------------------------------------------------------------------- counts
@dataclass(frozen=True, repr=False)
class Proportion(_Result):
    """k of n with a Clopper-Pearson 95 % interval."""

    successes: int
    n: int
    fraction: float
    ci: tuple[float, float]
    p_value: None
    ratio: None
    delta: None
    unit: str
    RECORD: ClassVar[tuple[str, ...]] = (
        "successes", "n", "fraction", "ci", "p_value", "ratio", "delta", "unit", "note")

    def _summary(self) -> str:
        lo, hi = self.ci
        return f"{self.successes}/{self.n} ({self.fraction:.1%}), 95 % CI {lo:.3f}..{hi:.3f}"


def proportion(successes: int, n: int) -> Proportion:
    """`successes` of `n` with an exact Clopper-Pearson 95 % interval.

    Raises:
        ValueError: `n` < 1, or `successes` not an integer in [0, n].
    """
    for name, v in (("n", n), ("successes", successes)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"The value for `{name}` must be an integer, but {v!r} was passed.")
    if n < 1:
        raise ValueError(f"The value for `n` must be at least 1, but {n!r} was passed.")
    if not 0 <= successes <= n:
        raise ValueError(f"The value for `successes` must be between 0 and n={n}, "
                         f"but {successes!r} was passed.")
    k = int(successes)
    lo = 0.0 if k == 0 else float(_sps.beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(_sps.beta.ppf(0.975, k + 1, n - k))
    return Proportion(successes=k, n=int(n), fraction=k / n, ci=(lo, hi), p_value=None,
                      ratio=None, delta=None, unit="fraction")


# ----------------------------------------------------------------------------- single
@dataclass(frozen=True, repr=False)
class Single(_Result):
    """One value per arm: a single observation, no test or interval."""

    baseline: float
    candidate: float
    delta: float
    relative: float | None
    ratio: float | None
    unit: str
    n: int
    p_value: None
    ci: None
    RECORD: ClassVar[tuple[str, ...]] = (
        BASELINE, CANDIDATE, "delta", "relative", "ratio", "unit", "n", "p_value", "ci",
        "note")

    def _summary(self) -> str:
        rel = "" if self.relative is None else f" ({self.relative:+.2%})"
        return (f"{full_number(self.baseline)} -> {full_number(self.candidate)} {self.unit}, "
                f"delta {self.delta:+.6f} {self.unit}{rel}")


def single(baseline: float, candidate: float, *, unit: str = "ms") -> Single:
    """One value per arm, labelled as a single observation.

    Raises:
        ValueError: a value is NaN, infinite, negative or not a number.
    """
    b, c = _scalar(BASELINE, baseline), _scalar(CANDIDATE, candidate)
    return Single(baseline=b, candidate=c, delta=c - b,
                  relative=(c - b) / b if b > 0 else None, ratio=_ratio(c, b), unit=unit, n=1,
                  p_value=None, ci=None)
