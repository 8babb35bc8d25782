"""The figures computed from a published row (`residency/data/h3_ref2va_910b1.json`): the
change, its share of the baseline, the speed-up range, the change of shares and the
Clopper-Pearson intervals of its counts. Computed here once; `residency.reports` formats
them. A row is the published JSON object (`baseline`, `candidate`, `kind`, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from residency.analysis import stats
from residency.policy.cache import BASELINE, CANDIDATE

__all__ = ["change", "change_percent", "change_percent_of_e2e", "proportions", "ranges_apart",
           "share_change_pp", "speedup_range"]


def change(row: Mapping[str, Any]) -> float:
    """A value row: candidate - baseline, in the row's unit."""
    return row[CANDIDATE] - row[BASELINE]


def change_percent(row: Mapping[str, Any]) -> float | None:
    """A value row: the change in % of the baseline (None when the baseline is 0)."""
    b = row[BASELINE]
    return 100 * change(row) / b if b else None


def change_percent_of_e2e(row: Mapping[str, Any], e2e_s: float) -> float:
    """A value row in ms or s: the change in % of an E2E of `e2e_s` seconds."""
    scale = 1e3 if row.get("unit", "") == "ms" else 1.0
    return 100 * change(row) / scale / e2e_s


def speedup_range(row: Mapping[str, Any]) -> tuple[float, float]:
    """A range row: how many times faster the candidate is, any rank against any rank: (the
    baseline's low / the candidate's high, the baseline's high / the candidate's low)."""
    b, c = row[BASELINE], row[CANDIDATE]
    return b[0] / c[1], b[1] / c[0]


def ranges_apart(row: Mapping[str, Any]) -> bool:
    """A range row: the two arms' ranges do not overlap."""
    b, c = row[BASELINE], row[CANDIDATE]
    return c[1] < b[0] or b[1] < c[0]


def share_change_pp(row: Mapping[str, Any]) -> float:
    """A count row: the candidate's share k/n minus the baseline's, in percentage points."""
    b, c = row[BASELINE], row[CANDIDATE]
    return 100 * (c["k"] / c["n"] - b["k"] / b["n"])


def proportions(row: Mapping[str, Any]) -> dict[str, stats.Proportion]:
    """A count row: arm -> k of n with its Clopper-Pearson 95 % interval; a tally row:
    name -> the same, for each of the candidate's entries that is a count of calls."""
    if row["kind"] == "count":
        return {a: stats.proportion(row[a]["k"], row[a]["n"]) for a in (BASELINE, CANDIDATE)}
    return {k: stats.proportion(v["k"], v["n"]) for k, v in row[CANDIDATE].items()
            if isinstance(v, Mapping)}
