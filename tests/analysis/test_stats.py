"""Known answers, bad input and properties of `residency.analysis.stats`."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from residency.analysis import stats
from residency.evidence.notes import note, record
from residency.evidence.verdicts import e2e_verdict


@dataclass(frozen=True)
class PairCase:
    name: str
    baseline: list[float]
    candidate: list[float]
    p_value: float | None
    note_has: tuple[str, ...] = field(default=())


PAIR_CASES = [
    PairCase("one pair", [2248.795837], [2244.482967], None,
             ("Single observation", "no interval or test possible")),
    PairCase("three pairs one direction", [10, 11, 12], [9, 10, 11.5], 0.25,
             ("unreachable whatever the data", "at least 6 pairs")),
    PairCase("three pairs other direction", [1, 2, 3], [2, 4, 6], 0.25, ("at least 6 pairs",)),
    PairCase("six pairs one direction", [5, 6, 7, 8, 9, 10], [4, 5, 6, 7, 8, 9.5],
             2 ** -5, ("significant at the 5 % level",)),
    PairCase("mixed signs", [10, 10, 10, 10], [9, 11, 9.5, 10.4], 1.0, ("Not significant",)),
]


@pytest.mark.parametrize("case", PAIR_CASES, ids=lambda c: c.name)
def test_compare_pairs_known_answers(case: PairCase) -> None:
    r = stats.compare_pairs(case.baseline, case.candidate)
    assert r.n == len(case.baseline)
    if case.p_value is None:
        assert r.p_value is None
    else:
        assert r.p_value == pytest.approx(case.p_value)
    for text in case.note_has:
        assert text in note(r)


def test_one_pair_has_no_interval_and_no_test() -> None:
    r = stats.compare_pairs([12.3], [11.2])
    assert (r.p_value, r.ci, r.min_p) == (None, None, None)
    assert "Single observation" in note(r)
    assert r.delta == pytest.approx(-1.1)


def test_smallest_reachable_p_and_interval_threshold() -> None:
    r9 = stats.compare_pairs(list(range(10, 19)), list(range(9, 18)))
    assert r9.min_p == 2.0 ** -8 and r9.p_value == pytest.approx(2.0 ** -8)
    assert r9.ci is None and "no interval below 10 pairs" in note(r9)
    base = [100.0 + i for i in range(12)]
    r12 = stats.compare_pairs(base, [b - 1 - 0.01 * i for i, b in enumerate(base)])
    assert r12.ci is not None and r12.ci[0] <= r12.delta <= r12.ci[1]


def test_noise_and_pairs_needed() -> None:
    r = stats.compare_pairs([2248.795837], [2244.482967], noise=3.0)
    assert "1.438x the noise" in note(r) and r.pairs_needed == 6  # 4 significant digits
    within = stats.compare_pairs([10.0, 10.0], [9.9, 9.95], noise=0.5)
    assert "within the noise" in note(within)
    noisy = stats.compare_pairs([10, 10, 10, 10], [9, 11, 9.5, 10.4])
    assert noisy.pairs_needed is not None and noisy.pairs_needed > 6


def test_complete_separation_8_vs_8() -> None:
    base = [216.822, 220.1, 225.0, 230.4, 233.3, 240.0, 245.5, 251.161]
    cand = [1.334, 1.36, 1.4, 1.42, 1.45, 1.5, 1.55, 1.579]
    r = stats.compare_groups(base, cand)
    assert r.p_value == pytest.approx(2 / 12870, rel=1e-12)
    assert r.n == (8, 8) and r.ci is None
    assert r.baseline_range == (216.822, 251.161)
    assert "every rank, in this run pair" in note(r)
    assert "9+ repetitions recommended" in note(r)
    assert "faster" in repr(r)


def test_groups_with_ties_use_exact_enumeration() -> None:
    r = stats.compare_groups([1, 2, 2, 3, 4], [2, 3, 3, 4, 5])
    assert "exact permutation with ties" in r.test
    assert 0 < r.p_value <= 1
    tied_separation = stats.compare_groups([5, 5, 6, 6, 7, 7], [1, 1, 2, 2, 3, 3])
    assert tied_separation.p_value == pytest.approx(2 / math.comb(12, 6))


def test_proportion_clopper_pearson() -> None:
    r = stats.proportion(24, 24)
    assert round(r.ci[0], 3) == 0.858 and r.ci[1] == 1.0
    assert f"{r.ci[0]:.4f}" == "0.8575"
    assert stats.proportion(0, 8).ci[0] == 0.0
    assert stats.proportion(0, 8).ci[1] == pytest.approx(0.36942, abs=1e-5)
    assert r.p_value is None and "Clopper-Pearson" in note(r)


def test_single_is_labelled() -> None:
    r = stats.single(221.296680, 3.164550, unit="ms")
    assert r.delta == pytest.approx(-218.13213)
    assert (r.n, r.p_value, r.ci) == (1, None, None)
    assert "Single observation" in note(r)
    assert r.to_dict()["kind"] == "Single"


@dataclass(frozen=True)
class BadCase:
    name: str
    call: object
    argument: str


BAD_CASES = [
    BadCase("empty baseline", lambda: stats.compare_groups([], [1.0]), "baseline"),
    BadCase("empty candidate", lambda: stats.compare_pairs([1.0], []), "candidate"),
    BadCase("nan", lambda: stats.compare_groups([1.0, float("nan")], [1.0]), "baseline"),
    BadCase("negative", lambda: stats.compare_pairs([1.0], [-2.0]), "candidate"),
    BadCase("unequal pairs", lambda: stats.compare_pairs([1.0, 2.0], [1.0]), "candidate"),
    BadCase("string", lambda: stats.compare_groups("abc", [1.0]), "baseline"),
    BadCase("single nan", lambda: stats.single(float("nan"), 1.0), "baseline"),
    BadCase("negative noise", lambda: stats.compare_pairs([1.0], [2.0], noise=-1), "noise"),
    BadCase("successes > n", lambda: stats.proportion(5, 4), "successes"),
    BadCase("n zero", lambda: stats.proportion(0, 0), "n"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
def test_bad_input_names_the_argument(case: BadCase) -> None:
    with pytest.raises(ValueError, match=rf"The value for `{case.argument}` must .* was passed"):
        case.call()


durations = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1,
                     max_size=7)


@settings(max_examples=60, deadline=None)
@given(durations, durations)
def test_groups_p_in_unit_interval_and_symmetric(b: list[float], c: list[float]) -> None:
    r, swapped = stats.compare_groups(b, c), stats.compare_groups(c, b)
    assert 0 < r.p_value <= 1
    assert r.p_value == pytest.approx(swapped.p_value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)), min_size=2, max_size=12))
def test_pairs_p_bounds_and_symmetry(pairs: list[tuple[float, float]]) -> None:
    b, c = [p[0] for p in pairs], [p[1] for p in pairs]
    r = stats.compare_pairs(b, c)
    assert r.min_p - 1e-12 <= r.p_value <= 1
    assert r.p_value == pytest.approx(stats.compare_pairs(c, b).p_value)




def test_runs_as_the_unit_4_vs_4() -> None:
    r = stats.compare_groups([112.2, 115.2, 72.0, 166.3], [0.32, 0.117, 0.119, 0.146],
                             unit="ms", replicate="run")
    assert r.p_value == pytest.approx(2 / 70, rel=1e-12)
    assert "4 vs 4 runs" in note(r) and "Unit: the service run" in note(r)
    assert "not independent replicates" not in note(r)
    ranks = stats.compare_groups([1.0, 2.0], [3.0, 4.0])
    assert "2 vs 2 ranks" in note(ranks) and "every rank, in this run pair" in note(ranks)
    with pytest.raises(ValueError, match="`replicate`"):
        stats.compare_groups([1.0], [2.0], replicate="call")


def test_power_estimate_uses_a_robust_spread_one_outlier_cannot_pull() -> None:
    base = [10.0] * 6
    cand = [9.0, 9.1, 8.9, 9.05, 8.95, 1.0]  # one outlier
    r = stats.compare_pairs(base, cand)
    d = [c - b for b, c in zip(base, cand, strict=True)]
    assert stats.robust_spread(d) == pytest.approx(
        1.4826 * float(np.median(np.abs(np.array(d) - np.median(d)))))
    assert "1.4826 x MAD" in note(r) and "median delta" in note(r)
    assert r.pairs_needed == 6  # the SD (3.3 s, pulled by the outlier) would ask for more
    assert "Median of the paired deltas" in note(r) and "not the delta of the medians" in note(r)


def test_power_estimate_of_a_vanishing_median_delta_is_none() -> None:
    # found by hypothesis: median delta 9e-161 against a spread of about 1
    r = stats.compare_pairs([0.0, 0.0, 1.0], [1.0, 9.45647775056107e-161, 0.0])
    assert r.pairs_needed is None and "Estimate" not in note(r)


def test_analysis_modules_do_not_import_torch() -> None:
    code = ("import sys, residency.analysis.stats, residency.rundir.run, residency.reports.tables; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ----------------------------------------------------------------------------- equivalence
@dataclass(frozen=True)
class TostCase:
    name: str
    deltas: list[float]
    margin: float
    p_lower: float | None
    p_upper: float | None
    equivalent: bool
    note_has: tuple[str, ...] = field(default=())


# Hand-computed: with every shifted delta on one side, the one-sided exact signed-rank p is
# 1/2^n. Deltas 1..5 with margin 3.5: d - 3.5 = -2.5, -1.5, -0.5, 0.5, 1.5; |.| midranks
# 5, 3.5, 1.5, 1.5, 3.5; W+ = 1.5 + 3.5 = 5; of the 32 sign patterns, 11 have W+ <= 5
# ({}, {1.5} x2, {3.5} x2, {5}, {1.5, 1.5}, {1.5, 3.5} x4), so p_upper = 11/32.
TOST_CASES = [
    TostCase("six pairs inside the margin", [0.1, -0.2, 0.3, 0.05, -0.1, 0.2], 0.5,
             1 / 64, 1 / 64, True, ("Equivalent within", "TOST p = 0.0156")),
    TostCase("upper bound not excluded", [1, 2, 3, 4, 5], 3.5, 1 / 32, 11 / 32, False,
             ("Cannot tell: neither equivalence nor non-equivalence",
              "pairs would show equivalence")),
    TostCase("four pairs cannot reach 0.05", [0.0, 0.01, -0.01, 0.02], 1.0, 1 / 16, 1 / 16,
             False, ("unreachable", "2^-4 = 0.0625")),
    # every d - 1 > 0: the reverse one-sided test (H0 delta <= +margin) rejects with 1/64
    TostCase("deltas beyond the margin: not equivalent", [2, 3, 2.5, 3.5, 2.2, 2.8], 1.0,
             1 / 64, 1.0, False, ("Not equivalent: the deltas lie above +margin",
                                  "p = 0.01562 < 0.05")),
    # d - 1 = -1, 1, 9, 19: |.| midranks 1.5, 1.5, 3, 4, W+ = 8.5; of the 16 sign patterns
    # W+ >= 8.5 for {1.5, 3, 4} (twice) and {1.5, 1.5, 3, 4}: p_above = 3/16, p_upper = 15/16
    # (only W+ = 10 exceeds 8.5); d + 1 > 0 everywhere: p_lower = 1/16. Neither equivalence
    # nor non-equivalence at 4 pairs.
    TostCase("mean delta outside the margin, too few pairs", [0.0, 2.0, 10.0, 20.0], 1.0,
             1 / 16, 15 / 16, False, ("Cannot tell", "outside the margin")),
    TostCase("one pair", [0.1], 1.0, None, None, False, ("cannot tell from one pair",)),
]


TOST_OUTCOMES = {"six pairs inside the margin": "equivalent",
                 "deltas beyond the margin: not equivalent": "not equivalent",
                 "mean delta outside the margin, too few pairs": "cannot tell"}


@pytest.mark.parametrize("case", TOST_CASES, ids=lambda c: c.name)
def test_tost_known_answers(case: TostCase) -> None:
    baseline = [10.0] * len(case.deltas)
    candidate = [10.0 + d for d in case.deltas]
    r = stats.equivalence_pairs(baseline, candidate, margin=case.margin)
    for got, want in ((r.p_lower, case.p_lower), (r.p_upper, case.p_upper)):
        assert (got is None and want is None) or got == pytest.approx(want, abs=1e-12)
    assert r.equivalent is case.equivalent
    if case.p_lower is not None:
        assert r.p_value == pytest.approx(max(case.p_lower, case.p_upper), abs=1e-12)
    for text in case.note_has:
        assert text in note(r)
    if case.name in TOST_OUTCOMES:
        assert r.outcome == TOST_OUTCOMES[case.name]
    if case.name == "mean delta outside the margin, too few pairs":
        assert (r.p_below, r.p_above) == (pytest.approx(1.0), pytest.approx(3 / 16))


def test_tost_margin_label_and_bad_input() -> None:
    r = stats.equivalence_pairs([10] * 6, [10.1] * 6, margin=0.2,
                                margin_label="2 % of the baseline median E2E")
    assert "2 % of the baseline median E2E (+-0.2 s)" in note(r) and r.equivalent
    assert "p(delta" not in note(r)  # one-sided p against a stated H0, not a probability
    with pytest.raises(ValueError, match="`margin`"):
        stats.equivalence_pairs([1, 2], [1, 2], margin=0)
    with pytest.raises(ValueError, match="`candidate`"):
        stats.equivalence_pairs([1, 2], [1], margin=1)


def test_aa_noise_and_the_e2e_verdict() -> None:
    noise = stats.aa_noise([10.0, 10.2, 9.9], [10.1, 10.0, 10.0])
    assert noise.deltas == pytest.approx((0.1, -0.2, 0.1))
    assert noise.spread == pytest.approx(0.1) and noise.max_abs == pytest.approx(0.2)
    base = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3]
    faster = [b - 0.4 for b in base]
    diff = stats.compare_pairs(base, faster)
    eq = stats.equivalence_pairs(base, faster, margin=0.2)
    assert e2e_verdict(diff, eq).startswith("Verdict: the candidate is faster")
    assert "AGAINST" in e2e_verdict(stats.compare_pairs(faster, base),
                                          stats.equivalence_pairs(faster, base, margin=0.2))
    same = [b + d for b, d in zip(base, [0.01, -0.02, 0.015, -0.01, 0.02, -0.005],
                                  strict=True)]
    verdict = e2e_verdict(stats.compare_pairs(base, same),
                                stats.equivalence_pairs(base, same, margin=0.2))
    assert verdict.startswith("Verdict: E2E equivalent within")
    three = stats.compare_pairs(base[:3], same[:3])
    assert e2e_verdict(three, stats.equivalence_pairs(base[:3], same[:3], margin=0.2)
                             ).startswith("No verdict")


# ----------------------------------------------------------------------------- issue 25
# Hand-computed known answers for the two exact paired tests and the interval coverage.
@dataclass(frozen=True)
class PairedTestCase:
    name: str
    deltas: list[float]
    wilcoxon: float
    sign_flip: float


PAIRED_TEST_CASES = [
    # ranks 1, 2, 3, 4; W+ = 1 + 3 + 4 = 8, mean 5: |W+ - 5| >= 3 for W+ in {0, 1, 2, 8, 9,
    # 10}: 6 of 16 sign patterns. Sign flip: sum 6 of 10; flipping a subset of sum S gives
    # |10 - 2S| >= 6 for S <= 2 or S >= 8: {}, {1}, {2}, {1,3,4}, {2,3,4}, {1,2,3,4}: 6/16.
    PairedTestCase("four pairs, one reversed", [1, -2, 3, 4], 6 / 16, 6 / 16),
    # ranks 1..6, W+ = 6 (the positive delta has rank 6), mean 10.5: W+ <= 6 for 14 subsets,
    # W+ >= 15 for 14: 28/64. The deltas equal their ranks, so the sign flip counts alike.
    PairedTestCase("six pairs, largest reversed", [-1, -2, -3, -4, -5, 6], 28 / 64, 28 / 64),
    # all positive: only the all-plus and all-minus patterns reach W+ = 6 or |sum| = 33
    PairedTestCase("three pairs one direction", [1, 2, 30], 2 / 8, 2 / 8),
    # W+ = 3 = its mean: p = 1; sign flip: every pattern of +-1 +-2 +-30 has |sum| >= 27
    PairedTestCase("the large delta reversed", [1, 2, -30], 1.0, 1.0),
    # midranks 2, 2, 2, 4: W+ = 10 (the maximum) for 2 of 16 patterns; |sum| = 8 likewise
    PairedTestCase("ties", [1, 1, 1, 5], 2 / 16, 2 / 16),
    # W+ = 6, mean 5: no subset of {2, 2, 2, 4} sums to 5, so every pattern has |W+ - 5| >= 1;
    # sign flip: |+-1 +-1 +-1 +-5| >= 2 always: p = 1 for both
    PairedTestCase("ties, one large reversed", [1, 1, 1, -5], 1.0, 1.0),
]


@pytest.mark.parametrize("case", PAIRED_TEST_CASES, ids=lambda c: c.name)
def test_exact_paired_tests_known_answers(case: PairedTestCase) -> None:
    assert stats.wilcoxon_signed_rank(case.deltas) == pytest.approx(case.wilcoxon, abs=1e-12)
    assert stats.sign_flip_test(case.deltas) == pytest.approx(case.sign_flip, abs=1e-12)


def test_the_two_paired_tests_differ_where_magnitudes_matter() -> None:
    # 1, 2, 3, 4, 5, -100: Wilcoxon ranks the reversed delta 6th: W+ = 15 of 21, mean 10.5,
    # |W+ - 10.5| >= 4.5 for 28 of 64 patterns. The sign flip's observed |sum| is 85 and
    # every pattern has |+-100 + s| >= 85 for s in [-15, 15]: p = 1 (the outlier dominates).
    d = [1, 2, 3, 4, 5, -100]
    assert stats.wilcoxon_signed_rank(d) == pytest.approx(28 / 64)
    assert stats.sign_flip_test(d) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="`deltas`"):
        stats.sign_flip_test([])
    with pytest.raises(ValueError, match="at most 24"):
        stats.sign_flip_test([1.0] * 25)


@pytest.mark.parametrize(("n", "k", "coverage"), [
    # 1 - 2 P(X <= k-1), X ~ Binomial(n, 1/2), the largest k with coverage >= 95 %:
    (10, 2, 1 - 2 * 11 / 1024),  # P(X <= 1) = 11/1024 -> 97.85 %; k = 3 gives 89.06 %
    (6, 1, 1 - 2 / 64),          # 96.88 %; k = 2 gives 1 - 2 * 7/64 = 78.1 %
    (12, 3, 1 - 2 * 79 / 4096),  # P(X <= 2) = (1 + 12 + 66)/4096 -> 96.14 %
    (20, 6, 1 - 2 * 21700 / 2**20),  # P(X <= 5) = 21700/2^20 -> 95.86 %
])
def test_median_interval_coverage_known_answers(n: int, k: int, coverage: float) -> None:
    lo, hi, cov, k_lo, k_hi = stats.median_interval(list(range(1, n + 1)))
    assert (k_lo, k_hi) == (k, n + 1 - k) and (lo, hi) == (k, n + 1 - k)
    assert cov == pytest.approx(coverage, abs=1e-12)
    assert stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 1 - 2/32 = 93.75 %


def test_pair_note_names_the_test_once_with_its_coverage_reversed_pairs_and_outliers() -> None:
    base = [10.0 + i for i in range(10)]
    deltas = [-0.25, -0.3, -0.2, 0.333, -0.28, -0.22, -1.352, -0.26, -0.24, -0.27]
    r = stats.compare_pairs(base, [b + d for b, d in zip(base, deltas, strict=True)],
                            labels=[f"p{i}" for i in range(10)])
    assert note(r).count("Wilcoxon") == 1 and "sign-flip" not in note(r)
    assert r.test == "exact Wilcoxon signed-rank test (two-sided)"
    assert r.ci_coverage == pytest.approx(1 - 22 / 1024) and r.ci_order == (2, 9)
    assert "97.85 % distribution-free interval" in note(r) and "95 %" not in note(r)
    assert r.reversed_pairs == (3,) and r.outlier_pairs == (3, 6)
    assert "Reversed (against the median's direction): pair 4 (p3) +0.3330 s" in note(r)
    assert "pair 7 (p6) -1.352 s" in note(r)
    assert too_many_digits(note(r).replace("1.4826 x MAD", "")) == []  # a constant's name


def too_many_digits(text: str) -> list[str]:
    import re

    return [t for t in re.findall(r"\d+\.\d+", text)
            if len(t.replace(".", "").lstrip("0")) > 4]


@pytest.mark.parametrize("result", [
    stats.compare_groups([1.0, 2.0, 3.0], [0.1, 0.2, 0.3]),
    stats.compare_pairs([10.0, 11.0, 12.0], [9.0, 10.5, 11.0], labels=["a", "b", "c"]),
    stats.equivalence_pairs([10.0] * 6, [10.1] * 6, margin=0.2),
    stats.aa_noise([10.0, 10.2], [10.1, 10.0]),
    stats.proportion(3, 8),
    stats.single(2.0, 1.0),
], ids=lambda r: type(r).__name__)
def test_a_record_holds_the_notes_sentence_in_its_place(result: object) -> None:
    """stats computes, `evidence.notes` words: the record keeps `note` where results.json
    always had it, and holds none of the fields only the note reads."""
    rec = record(result)
    assert list(rec) == [*type(result).RECORD, "kind"] and rec["note"] == note(result)
    assert "note" not in result.to_dict() and not hasattr(result, "note")
    assert "labels" not in rec and "replicate" not in rec and "margin_declared" not in rec


def test_a_zero_noise_is_named_not_divided_by() -> None:
    r = stats.compare_pairs([1.0, 2.0, 3.0], [2.0, 3.0, 4.5], noise=0.0)
    assert r.within_noise is False and r.noise_multiple is None
    assert "|median delta| 1 s is beyond a zero noise." in note(r)
