"""Verdicts: the sentences that judge a comparison as a whole for people, written from the
results of `residency.analysis.stats` (its tests and estimates)."""

from __future__ import annotations

from residency import humanize
from residency.analysis import stats

__all__ = ["e2e_verdict"]


def e2e_verdict(difference: stats.PairComparison,
                equivalence: stats.Equivalence, *,
                expected: str = "faster") -> str:
    """One sentence beginning "Verdict:" (or "No verdict:"): a significant delta in the
    `expected` direction ("faster": candidate below baseline) or against it, with its size
    relative to the baseline median; equivalence within the margin; or "no verdict" with
    what would give one. The equivalence outcome is added so the two never disagree."""
    if expected not in ("faster", "slower"):
        raise ValueError(f"The value for `expected` must be one of ['faster', 'slower'], but "
                         f"{expected!r} was passed.")
    u = difference.unit
    p = difference.p_value
    rel = ("" if difference.relative is None else
           f" ({humanize.change_percent(difference.relative)} of the baseline median)")
    if p is not None and p < stats.ALPHA and difference.delta != 0:
        direction = "faster" if difference.delta < 0 else "slower"
        where = ("in the expected direction" if direction == expected
                 else "AGAINST the expected direction")
        eq = {"equivalent": f"; yet equivalent within {equivalence.margin_label}",
              "not equivalent": f"; not equivalent within {equivalence.margin_label}",
              }.get(equivalence.outcome, "")
        return (f"Verdict: the candidate is {direction} in E2E, {where}: median paired delta "
                f"{humanize.quantity(difference.delta, u, sign=True)}{rel} over "
                f"{difference.n} pairs, "
                f"{difference.test} p = {humanize.p_text(p)}{eq}.")
    if equivalence.equivalent:
        return (f"Verdict: E2E equivalent within {equivalence.margin_label}: median paired "
                f"delta {humanize.quantity(equivalence.delta, u, sign=True)}{rel} over "
                f"{equivalence.n} pairs, TOST p = {humanize.p_text(equivalence.p_value or 1.0)}.")
    needs = [f"about {x} pairs for the difference" for x in [difference.pairs_needed] if x]
    needs += [f"about {x} for equivalence" for x in [equivalence.pairs_needed] if x]
    beyond = (f" (the deltas lie beyond the {equivalence.margin_label} margin, yet the "
              "two-sided difference is not significant)"
              if equivalence.outcome == "not equivalent" else "")
    return ("No verdict: neither a significant E2E delta nor equivalence within "
            f"{equivalence.margin_label} with {difference.n} pairs{beyond}: median paired delta "
            f"{humanize.quantity(difference.delta, u, sign=True)}{rel}"
            + (f" ({'; '.join(needs)})." if needs else "."))
