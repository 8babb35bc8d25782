"""Figures a report shows that are derived from a run's evidence and its tables rather than
held in them: shares of the baseline's E2E (this run's and the published run's), the retention
rate of a what-if grid, and the idle-by-cause ranking and its sums. Computed here once;
`residency.reports` formats them. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from residency.evidence.model import Evidence
from residency.policy.cache import BASELINE

__all__ = ["Share", "cause_sums", "e2e_baseline_s", "fraction_of_e2e", "percent_of_e2e_ms",
           "ranked_causes", "retention_rate", "shares"]


# ----------------------------------------------------------------------------- E2E shares
def e2e_baseline_s(ev: Evidence, profiled: bool) -> float | None:
    """The baseline's median client E2E in seconds, of the profiled or the unprofiled pairs
    (None when the run has no such pairs)."""
    a = ev.get("e2e_profiled" if profiled else "e2e_unprofiled")
    return None if a is None else float(a.result.baseline_median)


def percent_of_e2e_ms(value_ms: float, e2e_s: float) -> float:
    """A duration of `value_ms` milliseconds in % of an E2E of `e2e_s` seconds."""
    return 100 * value_ms / 1e3 / e2e_s


def fraction_of_e2e(value: float, unit: str, e2e_s: float) -> float:
    """A duration in `unit` (ms, else s) as a fraction of an E2E of `e2e_s` seconds."""
    scale = 1e3 if unit == "ms" else 1.0
    return value / scale / e2e_s


@dataclass(frozen=True)
class Share:
    """One quantity as a share of the baseline's E2E, here and in the published run."""

    name: str
    emulated: float  # fraction of E2E in this run
    published: float  # fraction of E2E in the published run
    published_scope: str  # e.g. "isolated pair", "full stack"

    @property
    def factor(self) -> float:
        """How many times larger (or smaller) this run's share is: >= 1."""
        a, b = self.emulated, self.published
        if a <= 0 or b <= 0:
            return math.inf
        return max(a / b, b / a)


def shares(ev: Evidence, published: Callable[[str], Mapping[str, Any] | None]
           ) -> tuple[Share, ...]:
    """This run's release cost and all-rank idle as shares of the profiled baseline's E2E,
    beside the published run's; `published(prefix)` is the published row whose metric starts
    with `prefix` (None: not published)."""
    e2e = ev.get("e2e_profiled") or ev.get("e2e_unprofiled")
    if e2e is None or not e2e.result.baseline_median:
        return ()
    base_e2e = e2e.result.baseline_median
    out = []
    idle = ev.get("idle_intersection")
    pub = published("normal-release markers")
    pub_e2e = published("client E2E, one isolated pair")
    if idle is not None and pub and pub_e2e:
        out.append(Share("normal releases' idle cost (markers ∩ all-rank idle)",
                         idle.result.baseline / 1e3 / base_e2e,
                         float(pub[BASELINE]) / 1e3 / float(pub_e2e[BASELINE]),
                         "isolated pair"))
    whole = ev.get("all_rank_idle")
    pub = published("full stack, profiled pair, all-rank")
    pub_e2e = published("full stack, 3 alternating")
    if whole is not None and pub and pub_e2e:
        out.append(Share("all-rank no-device-task time", whole.result.baseline / base_e2e,
                         float(pub[BASELINE]) / float(pub_e2e[BASELINE]),
                         "full stack, not this change alone"))
    return tuple(out)


# ----------------------------------------------------------------------------- what-if
def retention_rate(frame: pd.DataFrame, calls: str = "calls",
                   retained: str = "retained") -> pd.Series:
    """Per row of a what-if totals frame: retained calls / calls (NaN or inf where no
    calls)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return frame[retained].astype(float) / frame[calls].astype(float)


# ----------------------------------------------------------------------------- idle by cause
def ranked_causes(diff: pd.DataFrame, rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A `residency.analysis.causes.cause_diff` frame ranked by |candidate − baseline|,
    largest first (ties in the frame's order): the first `rows` and the rest."""
    ranked = diff.iloc[np.argsort(-diff["delta_idle_ns"].abs().to_numpy(), kind="stable")]
    return ranked.head(rows), ranked.iloc[rows:]


def cause_sums(frame: pd.DataFrame, columns: Iterable[str]) -> dict[str, float]:
    """Each of `columns` of `frame` summed."""
    return {c: float(frame[c].sum()) for c in columns}
