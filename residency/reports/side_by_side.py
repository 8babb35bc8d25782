"""The run's evidence beside the published NPU figures, quantity by quantity, with honest
effect sizes: for each side the value (baseline -> candidate), the change, and the change
relative to E2E (release cost / E2E, idle intersection / E2E, E2E delta %).

This run's numbers show 4 significant digits; published figures keep their published
precision (2248.795837 -> 2244.482967 s, -4.312870 s, -0.19 %), so a 4.313 s change never
reads as 5 s. Rows the published run measured on the full stack (this change with five
others) are marked and sit apart, below the rows of this change alone: a full-stack figure is
never set beside a this-change-only one as if comparable. Input: the run's
`residency.evidence.Evidence` and the published figures (`residency.reports.summary.
published_figures`). No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from residency.evidence import Evidence, derived
from residency.evidence import published as published_row
from residency.humanize import (
    MISSING,
    change_percent,
    published_percent,
    quantity,
    ratio_text,
    sig,
    signed,
    span_text,
)
from residency.policy.cache import BASELINE, CANDIDATE

__all__ = ["FULL_STACK", "QUANTITIES", "Quantity", "side_by_side"]

FULL_STACK = "FULL STACK (this change with #8129, #8229, #8577, #8579 and a resident VAE)"


@dataclass(frozen=True)
class Quantity:
    """One row: the name people read, its scope words, the evidence key of this run's side
    (None: this run never has it) and the metric prefix of the published side (None: not
    published for this change alone), and whether the published figure is full-stack."""

    name: str
    scope: str
    run: str | None
    published: str | None
    full_stack: bool = False


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("normal-call duration per rank, per call", "profiled / isolated pair",
             "normal_call_per_rank", "normal-call duration per rank"),
    Quantity("normal-call duration per call, one value per run", "unprofiled runs",
             "normal_call_per_run", None),
    Quantity("normal calls that released cache", "all measured requests", "normal_released",
             "normal calls that released"),
    Quantity("forced releases that released", "all measured requests", "forced_released",
             "forced releases that released"),
    Quantity("normal-release markers ∩ all-rank no-device-task time",
             "profiled / isolated pair", "idle_intersection",
             "normal-release markers ∩ all-rank no-device-task time"),
    Quantity("client E2E", "profiled / isolated pair", "e2e_profiled",
             "client E2E, one isolated pair"),
    Quantity("client E2E, median of the pairs", "unprofiled pairs", "e2e_unprofiled", None),
    Quantity("all-rank no-device-task time", "profiled pair", "all_rank_idle", None),
    Quantity("preparation window", "profiled pair", "preparation_window", None),
    Quantity("consecutive requests, candidate", "3 requests of 2 steps", None,
             "three consecutive 2-step requests"),
    Quantity("client E2E, median of 3 alternating unprofiled pairs", FULL_STACK, None,
             "full stack, 3 alternating unprofiled pairs", full_stack=True),
    Quantity("all-rank no-device-task time", FULL_STACK + ", profiled pair", None,
             "full stack, profiled pair, all-rank no-device-task time", full_stack=True),
    Quantity("preparation window", FULL_STACK + ", profiled pair", None,
             "full stack, profiled pair, preparation window", full_stack=True),
)


def _label(kind: str) -> str:
    from residency.reports.banner import device_heading

    return device_heading(kind).split(": ", 1)[-1] if kind else "unknown device kind"


# ----------------------------------------------------------------------------- this run
_s, _signed, _pct, _ratio = quantity, signed, change_percent, ratio_text  # the one owner
_pct_of_e2e = derived.percent_of_e2e_ms  # computed in evidence


def _run_cells(ev: Evidence, key: str) -> tuple[str, str, str] | None:
    a = ev.get(key)
    if a is None:
        return None
    e2e_prof = derived.e2e_baseline_s(ev, True) or derived.e2e_baseline_s(ev, False)
    if key == "normal_call_per_rank":
        b, c = a.values[BASELINE], a.values[CANDIDATE]
        med = a.detail["medians"]
        rel = (f"baseline per call {sig(_pct_of_e2e(min(b), e2e_prof))}–"
               f"{sig(_pct_of_e2e(max(b), e2e_prof))} % of E2E" if e2e_prof else MISSING)
        return (f"{span_text(min(b), max(b), 'ms')} → {span_text(min(c), max(c), 'ms')}",
                f"{_ratio(med[BASELINE], med[CANDIDATE])} (medians over ranks)", rel)
    if key == "normal_call_per_run":
        r = a.result
        e2e = derived.e2e_baseline_s(ev, False) or e2e_prof
        rel = (f"baseline per call {sig(_pct_of_e2e(r.baseline_median, e2e))} % of E2E"
               if e2e else MISSING)
        return (f"median {_s(r.baseline_median, 'ms')} → {_s(r.candidate_median, 'ms')} "
                f"({r.n[0]} vs {r.n[1]} runs)", _ratio(r.baseline_median, r.candidate_median),
                rel)
    if a.kind == "counts":
        k = {arm: int(a.values[arm][0]) for arm in (BASELINE, CANDIDATE)}
        n = dict(a.n)
        if not all(n.values()):
            return f"{k[BASELINE]}/{n[BASELINE]} → {k[CANDIDATE]}/{n[CANDIDATE]}", \
                MISSING, MISSING
        pp = a.share_change_pp()
        return (f"{k[BASELINE]}/{n[BASELINE]} → {k[CANDIDATE]}/{n[CANDIDATE]}",
                "unchanged" if pp == 0 else f"{'+' if pp > 0 else ''}{sig(pp)} pp", MISSING)
    if a.kind == "single":
        r = a.result
        rel = (f"{_pct(derived.fraction_of_e2e(r.delta, a.unit, e2e_prof))} of E2E"
               if e2e_prof else MISSING)
        return (f"{_s(r.baseline)} → {_s(r.candidate, a.unit)}",
                f"{_signed(r.delta, a.unit)} ({_pct(r.relative)})", rel)
    if a.kind == "pairs":
        r = a.result
        med = "median " if r.n > 1 else ""
        delta = "median paired delta " if r.n > 1 else ""
        return (f"{med}{_s(r.baseline_median)} → {_s(r.candidate_median, 's')}"
                + (f" ({r.n} pairs)" if r.n > 1 else ""),
                f"{delta}{_signed(r.delta, 's')}", f"{_pct(r.relative)} of E2E")
    return None


# ----------------------------------------------------------------------------- published
def _fixed(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def _published_cells(row: Mapping[str, Any], e2e_s: float | None) -> tuple[str, str, str]:
    b, c, unit, d = row[BASELINE], row[CANDIDATE], row.get("unit", ""), row["decimals"]
    kind = row["kind"]
    if kind == "range":
        speedup = published_row.speedup_range(row)
        rel = (f"baseline per call {sig(_pct_of_e2e(b[0], e2e_s))}–"
               f"{sig(_pct_of_e2e(b[1], e2e_s))} % of E2E" if e2e_s and unit == "ms"
               else MISSING)
        return (f"{_fixed(b[0], d)}–{_fixed(b[1], d)} {unit} → {_fixed(c[0], d)}–"
                f"{_fixed(c[1], d)} {unit}", f"{sig(speedup[0])}x–{sig(speedup[1])}x faster "
                "(any rank vs any rank)", rel)
    if kind == "count":
        pp = published_row.share_change_pp(row)
        return (f"{b['k']}/{b['n']} → {c['k']}/{c['n']}",
                "unchanged" if pp == 0 else f"{'+' if pp > 0 else ''}{sig(pp)} pp", MISSING)
    if kind == "tally":
        parts = [f"{v['k']}/{v['n']} {k}" if isinstance(v, Mapping) else f"{v} {k}"
                 for k, v in c.items()]
        return f"candidate: {', '.join(parts)}", MISSING, MISSING
    delta = published_row.change(row)
    change = published_row.change_percent(row)
    pct = published_percent(change) if change is not None else MISSING
    rel = (f"{published_percent(published_row.change_percent_of_e2e(row, e2e_s))} of E2E"
           if e2e_s and unit in ("ms", "s") else MISSING)
    if row["metric"].startswith(("client E2E", "full stack, 3 alternating")):
        rel = f"{pct} of E2E"
    return (f"{_fixed(b, d)} → {_fixed(c, d)} {unit}",
            f"{'+' if delta > 0 else ''}{_fixed(delta, d)} {unit} ({pct})", rel)


def _published_rows() -> dict[str, Mapping[str, Any]]:
    from residency.reports.summary import published_figures

    return published_figures()["rows"]


def _find(rows: Mapping[str, Mapping[str, Any]], prefix: str | None
          ) -> Mapping[str, Any] | None:
    if prefix is None:
        return None
    return next((r for m, r in rows.items() if m.startswith(prefix)), None)


def side_by_side(run: Evidence | pd.DataFrame, published: Any = None, *,
                 evidence: Evidence | None = None,
                 rows: Callable[[], Mapping[str, Mapping[str, Any]]] = _published_rows,
                 quantities: tuple[Quantity, ...] = QUANTITIES) -> pd.DataFrame:
    """One row per quantity either side has, in `quantities` order (full-stack published
    rows last, marked): scope, then for this run and for the published figures the value
    (baseline → candidate), the change and the change relative to E2E. Column headers carry
    each side's device label; `attrs` keep both device kinds.

    `run` is the run's `Evidence` (or its evidence table, with the Evidence as `evidence`);
    `published` is accepted for symmetry with the tables and ignored: the published figures
    come from `rows()` at their own precision.

    Raises:
        ValueError: no `Evidence` was given.
    """
    ev = evidence if evidence is not None else run
    if not isinstance(ev, Evidence):
        raise ValueError("The value for `evidence` must be the run's residency.evidence."
                         "Evidence, but it was not passed.")
    pub = rows()
    pub_kind = "npu"
    run_label, pub_label = _label(ev.device_kind), _label(pub_kind)
    cols = ["quantity", "scope", f"this run ({run_label}): baseline → candidate",
            "this run: change", "this run: change relative to E2E",
            f"published ({pub_label}): baseline → candidate", "published: change",
            "published: change relative to E2E"]
    iso_e2e = _find(pub, "client E2E, one isolated pair")
    full_e2e = _find(pub, "full stack, 3 alternating")
    out, full = [], []
    for q in quantities:
        mine = _run_cells(ev, q.run) if q.run else None
        theirs = _find(pub, q.published)
        if mine is None and theirs is None:
            continue
        e2e = (full_e2e if q.full_stack else iso_e2e) or {}
        if theirs is not None:
            pcells = _published_cells(theirs, e2e.get(BASELINE))
        elif q.run in ("e2e_unprofiled", "all_rank_idle", "preparation_window"):
            pcells = (f"{MISSING} (published for the full stack only: marked below)",
                      MISSING, MISSING)
        else:
            pcells = (MISSING, MISSING, MISSING)
        if mine is None:
            mine = ((f"{MISSING} (no figure of this change alone to set beside it)",
                     MISSING, MISSING) if q.full_stack else (MISSING, MISSING, MISSING))
        if q.full_stack:
            full.append(len(out))
        out.append([q.name, q.scope, *mine, *pcells])
    table = pd.DataFrame(out, columns=cols)
    table.attrs.update(run_device_kind=ev.device_kind, published_device_kind=pub_kind,
                       full_stack_rows=full)
    return table
