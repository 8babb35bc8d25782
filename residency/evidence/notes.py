"""Notes: the plain-words sentence each result of `residency.analysis.stats` carries for
people, written from the result's fields (the statistics are computed there; the words are
written here, once).

`note(result)` is the sentence of any result; `record(result)` is the result's
`results.json` record with its note in place. Wording follows pyperf ("Not significant",
"1.23x faster") and Google Benchmark's compare.py (names the test, warns below 9
repetitions). Numbers shown have 4 significant digits (`humanize.sig`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from residency import humanize
from residency.analysis import stats
from residency.humanize import p_text, quantity

__all__ = ["aa_note", "equivalence_note", "group_note", "note", "pair_note",
           "pairs_floor_note", "proportion_note", "record", "single_note"]

SINGLE = "Single observation per arm: no interval or test possible."

_REPLICATE_TEXT = {
    "rank": ("The ranks of one run are not independent replicates: the claim is \"every rank, "
             "in this run pair\", not a cross-run generalisation; no interval."),
    "run": ("Unit: the service run (one value per run, e.g. its median per call); separate "
            "service starts of this design on this host, so the claim is across runs of this "
            "design, not across hosts or workloads; no interval."),
}


def _verdict(p: float) -> str:
    if p < stats.ALPHA:
        return f"significant at the 5 % level (p={p_text(p)} < 0.05)"
    return f"Not significant (p={p_text(p)} >= 0.05)"


def group_note(r: stats.GroupComparison) -> str:
    """The Mann-Whitney comparison: test, group sizes, what p can reach, the verdict, what one
    value is, and a warning below `stats.MIN_REPETITIONS` values per group."""
    nb, nc = r.n
    sep = ""
    if r.min_p >= stats.ALPHA:
        sep = (f"p < 0.05 is unreachable with {nb} vs {nc} values whatever the data "
               f"(smallest two-sided p = {p_text(r.min_p)}); ")
    elif r.separated:
        sep = f"complete separation (p = 2/C({nb + nc},{nb}), the smallest reachable); "
    text = (f"{r.test}, {nb} vs {nc} {r.replicate}s: {sep}{_verdict(r.p_value)}. "
            f"{_REPLICATE_TEXT[r.replicate]}")
    if min(nb, nc) < stats.MIN_REPETITIONS:
        text += (f" Warning: results unreliable, {stats.MIN_REPETITIONS}+ repetitions "
                 f"recommended (have {nb} vs {nc}).")
    return text


def pairs_floor_note(n: int) -> str:
    """What an exact two-sided paired test (sign-flip or Wilcoxon signed-rank) can reach
    with `n` pairs."""
    if n <= 1:
        return "Single observation: one pair, no interval or test possible."
    floor = 2.0 ** (1 - n)
    if floor >= stats.ALPHA:
        return (f"With {n} pairs p < 0.05 is unreachable whatever the data (smallest two-sided "
                f"p = 2^(1-{n}) = {p_text(floor)}): at least 6 pairs needed, all in one "
                f"direction.")
    return f"Smallest two-sided p reachable with {n} pairs: 2^(1-{n}) = {p_text(floor)}."


def _name_pairs(idx: Sequence[int], r: stats.PairComparison) -> str:
    return ", ".join(f"pair {i + 1}{f' ({r.labels[i]})' if r.labels else ''} "
                     f"{quantity(r.deltas[i], r.unit, sign=True)}" for i in idx)


def pair_note(r: stats.PairComparison) -> str:
    """The paired comparison: what p can reach, the test's verdict, the median delta and its
    interval, reversed and outlying pairs (named), the A/A noise, and the pairs needed."""
    n, unit, md = r.n, r.unit, r.delta
    parts = [pairs_floor_note(n)]
    if n >= 2:
        assert r.p_value is not None
        dropped = (f" ({n - r.tested_pairs} zero deltas dropped)" if r.tested_pairs < n
                   else "")
        parts.append(f"{r.test[0].upper()}{r.test[1:]}, {n} pairs{dropped}: "
                     f"{_verdict(r.p_value)}.")
        ci, order = r.ci, r.ci_order
        parts.append(f"Median of the paired deltas {quantity(md, unit, sign=True)} (not the "
                     f"delta of the medians, {quantity(r.median_difference, unit, sign=True)}); "
                     + (f"{humanize.percent(r.ci_coverage)} distribution-free interval "
                        f"{humanize.span_text(ci[0], ci[1], unit)}"
                        f" (deltas {order[0]} and {order[1]} of {n} in order; exact coverage "
                        f"from the binomial distribution)." if ci and order else
                        f"no interval below {stats.MIN_CI_PAIRS} pairs."))
        if r.reversed_pairs:
            parts.append(f"Reversed (against the median's direction): "
                         f"{_name_pairs(r.reversed_pairs, r)}.")
        if r.outlier_pairs:
            parts.append(f"Outlier (more than {stats.OUTLIER_SPREADS:g} robust spreads, 1.4826 "
                         f"x MAD, from the median delta): {_name_pairs(r.outlier_pairs, r)}.")
    if r.noise is not None:
        verdict = ("within the noise: not distinguishable from A/A variation"
                   if r.within_noise else "beyond a zero noise" if r.noise_multiple is None
                   else f"{humanize.sig(r.noise_multiple)}x the noise")
        parts.append(f"A/A noise {quantity(r.noise, unit)}: |median delta| "
                     f"{quantity(abs(md), unit)} is {verdict}.")
    if r.pairs_needed is not None and r.spread is not None:
        src = ("spread 1.4826 x MAD of the deltas (robust to one outlier)" if n >= 2 else
               "A/A noise as the spread")
        parts.append(f"Estimate: about {r.pairs_needed} pairs would resolve a median delta of "
                     f"{quantity(md, unit, sign=True)} at {src} {quantity(r.spread, unit)} "
                     f"(normal approximation, 80 % power, 5 % two-sided; at least 6 for the "
                     f"exact test).")
    elif n == 1:
        parts.append("Spread unknown from one pair: at least 6 pairs needed.")
    return " ".join(parts)


def equivalence_note(r: stats.Equivalence) -> str:
    """The TOST: both one-sided p, the outcome, and when it cannot tell, what would."""
    unit, label = r.unit, r.margin_label
    if r.n < 2:
        return (f"Equivalence within {label}: cannot tell from one pair (no test possible; "
                "at least 5 pairs needed).")
    assert r.p_lower is not None and r.p_upper is not None and r.p_value is not None
    assert r.p_below is not None and r.p_above is not None and r.min_p is not None
    assert r.mean is not None and r.sd is not None
    given = f" (+-{quantity(r.margin, unit)})" if r.margin_declared else ""
    head = (f"{r.test}, {r.n} pairs, margin {label}{given}: median delta "
            f"{quantity(r.delta, unit, sign=True)}; against H0 delta <= -margin one-sided p = "
            f"{p_text(r.p_lower)}, against H0 delta >= +margin p = {p_text(r.p_upper)}: TOST "
            f"p = {p_text(r.p_value)}.")
    if r.outcome == "equivalent":
        return head + f" Equivalent within {label} at the 5 % level."
    if r.outcome == "not equivalent":
        side, pp = (("below -margin", r.p_below) if r.p_below <= r.p_above else
                    ("above +margin", r.p_above))
        return head + (f" Not equivalent: the deltas lie {side} (one-sided exact Wilcoxon "
                       f"signed-rank p = {p_text(pp)} < 0.05).")
    reach = ("" if r.min_p < stats.ALPHA else f" With {r.n} pairs p < 0.05 is unreachable "
             f"(smallest one-sided p = 2^-{r.n} = {p_text(r.min_p)}).")
    more = (f" About {r.pairs_needed} pairs would show equivalence if the mean delta stays "
            f"{quantity(r.mean, unit, sign=True)} at SD {quantity(r.sd, unit)} (normal "
            "approximation, 80 % power)." if r.pairs_needed is not None else
            f" The mean delta {quantity(r.mean, unit, sign=True)} is outside the margin: more "
            "pairs would not show equivalence at this margin.")
    return head + (f" Cannot tell: neither equivalence nor non-equivalence within {label} is "
                   f"shown.{reach}{more}")


def aa_note(r: stats.AANoise) -> str:
    """The A/A spread: median and largest |delta|, the runs' coefficient of variation."""
    return (f"A/A: the same arm in both slots, {r.n} pair(s): median |delta| "
            f"{quantity(r.spread, r.unit)}, largest {quantity(r.max_abs, r.unit)}"
            + ("" if r.cv is None else f", coefficient of variation of the runs "
                                       f"{humanize.percent(r.cv)}")
            + ". An A/B delta within this spread is not distinguishable from noise.")


def proportion_note(r: stats.Proportion) -> str:
    """k of n, its share and its Clopper-Pearson 95 % interval."""
    return (f"{r.successes} of {r.n} ({humanize.percent(r.fraction)}); Clopper-Pearson 95 % "
            f"interval {humanize.percent_span(*r.ci)}: what this count supports.")


def single_note(r: stats.Single) -> str:
    """One value per arm: no test."""
    return SINGLE


_NOTES: dict[type, Callable[[Any], str]] = {
    stats.GroupComparison: group_note, stats.PairComparison: pair_note,
    stats.Equivalence: equivalence_note, stats.AANoise: aa_note,
    stats.Proportion: proportion_note, stats.Single: single_note,
}


def note(result: Any) -> str:
    """The plain-words note of a `residency.analysis.stats` result.

    Raises:
        TypeError: `result` is not one of the results of `residency.analysis.stats`.
    """
    try:
        return _NOTES[type(result)](result)
    except KeyError:
        raise TypeError(f"no note for a {type(result).__name__}: expected one of "
                        f"{sorted(t.__name__ for t in _NOTES)}") from None


def record(result: Any) -> dict[str, Any]:
    """The result's `results.json` record (`to_dict`) with its note in place."""
    return result.to_dict(note=note(result))
