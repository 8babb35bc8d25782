"""The run's evidence beside the published NPU figures, aligned row by row on the same
quantities: a quantity one side lacks shows "—", the device labels (emulated NPU or NPU) sit
in the column headers, numbers have 4 significant digits.

Input: two evidence tables as `residency.reports.tables` renders them (columns `metric`,
`baseline`, `candidate`, ...; `attrs["device_kind"]`); a row of either side belongs to the
quantity in `QUANTITIES` whose metric prefix it starts with. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from residency.humanize import MISSING, round_numbers

__all__ = ["QUANTITIES", "Quantity", "side_by_side"]


@dataclass(frozen=True)
class Quantity:
    """One aligned row: the name people read, the metric prefixes that identify it in the
    run's table and in the published table (None: that side never has it), and what the
    published figure measured (its scope)."""

    name: str
    run: str | None
    published: str | None
    published_scope: str = MISSING


_FULL = "full stack, complete combination (not this change alone)"
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("normal-call duration per rank, profiled pair", "normal-call duration per rank",
             "normal-call duration per rank", "isolated 50-step pair"),
    Quantity("normal-call duration per run (median over ranks)",
             "normal-call duration per run", None),
    Quantity("normal calls that released cache", "normal calls that released",
             "normal calls that released", "isolated pair"),
    Quantity("forced releases that released", "forced releases that released",
             "forced releases that released", "isolated pair"),
    Quantity("telemetry errors, OOM", "telemetry errors", None),
    Quantity("normal-release markers ∩ all-rank no-device-task time",
             "normal-release markers ∩ all-rank no-device-task time",
             "normal-release markers ∩ all-rank no-device-task time", "isolated pair"),
    Quantity("all-rank no-device-task time, profiled pair", "all-rank no-device-task time",
             "full stack, profiled pair, all-rank no-device-task time", _FULL),
    Quantity("preparation window, profiled pair", "preparation window",
             "full stack, profiled pair, preparation window", _FULL),
    Quantity("client E2E, profiled pair", "client E2E, profiled pair",
             "client E2E, one isolated pair", "isolated pair"),
    Quantity("client E2E, unprofiled pairs (median)", "client E2E per unprofiled pair",
             "full stack, 3 alternating unprofiled pairs", f"3 pairs; {_FULL}"),
    Quantity("consecutive requests, candidate", "consecutive requests",
             "three consecutive 2-step requests", "3 requests of 2 steps x 8 ranks"),
)


def _label(kind: str) -> str:
    from residency.reports.banner import device_heading

    return device_heading(kind).split(": ", 1)[-1] if kind else "unknown device kind"


def _find(table: pd.DataFrame, prefix: str | None, used: set[int]) -> pd.Series | None:
    if prefix is None or table.empty:
        return None
    for i, metric in enumerate(table["metric"].astype(str)):
        if i not in used and metric.startswith(prefix):
            used.add(i)
            return table.iloc[i]
    return None


def side_by_side(run_table: pd.DataFrame, published: pd.DataFrame, *,
                 quantities: Sequence[Quantity] = QUANTITIES) -> pd.DataFrame:
    """One row per quantity either side has, in `quantities` order, then rows of either
    table no quantity claims (under their own metric name): baseline and candidate of the
    run and of the published figures, and the published row's scope. Column headers carry
    each side's device label; `attrs` keep both device kinds."""
    run_kind = str(run_table.attrs.get("device_kind", ""))
    pub_kind = str(published.attrs.get("device_kind", ""))
    cols = ["quantity", f"baseline: this run ({_label(run_kind)})",
            f"candidate: this run ({_label(run_kind)})",
            f"baseline: published ({_label(pub_kind)})",
            f"candidate: published ({_label(pub_kind)})", "published scope"]
    used_run: set[int] = set()
    used_pub: set[int] = set()
    rows = []

    def cells(row: pd.Series | None) -> list[str]:
        if row is None:
            return [MISSING, MISSING]
        return [round_numbers(str(row[a])) if str(row[a]).strip() else MISSING
                for a in ("baseline", "candidate")]

    for q in quantities:
        r = _find(run_table, q.run, used_run)
        p = _find(published, q.published, used_pub)
        if r is None and p is None:
            continue
        rows.append([q.name, *cells(r), *cells(p), MISSING if p is None else q.published_scope])
    for i, r in run_table.reset_index(drop=True).iterrows():
        if i not in used_run:
            rows.append([str(r["metric"]), *cells(r), MISSING, MISSING, MISSING])
    for i, p in published.reset_index(drop=True).iterrows():
        if i not in used_pub:
            rows.append([str(p["metric"]), MISSING, MISSING, *cells(p), "as named"])
    out = pd.DataFrame(rows, columns=cols)
    out.attrs.update(run_device_kind=run_kind, published_device_kind=pub_kind)
    return out
