"""The cross-device table and its figure, rendered from `residency.evidence.crossdevice`
columns (nothing is computed here): one column per run, headed by its name and device label
(the emulated NPU's says it is not an NPU measurement), the rows that set the runs apart
(device, failure injected, scale, reserved bytes), then the mechanism's cost, each cell
"baseline → candidate". `cross_device_table` returns a DataFrame with title and footer in
`attrs` (`residency.reports.tables.to_markdown`/`to_csv` print it); `to_json` keeps every
column's numbers; `normal_call_figure` plots the normal-call cost per run, log scale. Run
figures keep full precision here (Markdown shows 4 significant digits), published ones
their published precision. No torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from residency import humanize
from residency.evidence.crossdevice import GIB, DeviceColumn, Spread
from residency.humanize import MISSING
from residency.jsonio import plain
from residency.policy.cache import BASELINE, CANDIDATE, PAIRED_ARMS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROWS = ("device", "failure injected into the baseline", "scale", "reserved bytes at normal calls",
        "per-call figures from", "normal-call cost per call", "normal calls that released",
        "normal-call cost per GiB released", "forced-call cost per call",
        "normal-release markers ∩ all-rank no-device-task time",
        "E2E delta (candidate − baseline), share of the baseline's E2E")

__all__ = ["ROWS", "cross_device_table", "header", "normal_call_figure", "to_json"]


def header(col: DeviceColumn) -> str:
    """A column's header: its name and device label."""
    return f"{col.name} ({col.label})"


def _num(col: DeviceColumn, key: str, x: float) -> str:
    d = col.decimals.get(key)
    return f"{x:.{d}f}" if d is not None else humanize.full_number(x)


def _why(col: DeviceColumn, key: str) -> str:
    return f"{MISSING} ({col.missing[key]})" if key in col.missing else MISSING


def _spread(col: DeviceColumn, key: str, s: Spread | None) -> str:
    if s is None:
        return _why(col, key)
    rng = f"{_num(col, key, s.low)}–{_num(col, key, s.high)} ms"
    if s.median is None:
        return f"{rng} ({s.n} {s.what}s)"
    return f"{_num(col, key, s.median)} ms ({rng}, {s.n} {s.what}s)"


def _arms(col: DeviceColumn, key: str, cells: Mapping[str, str]) -> str:
    b, c = cells[BASELINE], cells[CANDIDATE]
    if b == c == _why(col, key):
        return b
    return f"{b} → {c}"


def _per_gib(col: DeviceColumn, arm: str) -> str:
    v = col.normal_ms_per_gib.get(arm)
    if v is None:
        return _why(col, f"normal_ms_per_gib.{arm}")
    gib = col.released_gib_per_call[arm]
    est = "; estimated" if f"released_gib_per_call.{arm}" in col.missing else ""
    return f"{humanize.full_number(v)} ms/GiB ({humanize.full_number(gib)} GiB per call{est})"


def _reserved(col: DeviceColumn) -> str:
    if col.reserved_bytes is None:
        return _why(col, "reserved_bytes")
    of = (f" of {humanize.full_number(col.total_bytes / GIB)} GiB "
          f"({humanize.full_number(100 * col.reserved_bytes / col.total_bytes)} %)"
          if col.total_bytes else "")
    return f"{humanize.full_number(col.reserved_bytes / GIB)} GiB{of}"


def _e2e(col: DeviceColumn) -> str:
    if col.e2e_delta_s is None:
        return _why(col, "e2e_delta_s")
    share = col.e2e_share
    pct = ("" if share is None else
           f", {'+' if share > 0 else ''}{humanize.full_number(100 * share)} %")
    sign = "+" if col.e2e_delta_s > 0 else ""
    return (f"{sign}{_num(col, 'e2e_delta_s', col.e2e_delta_s)} s{pct} of "
            f"{_num(col, 'e2e_delta_s', col.e2e_baseline_s)} s ({col.e2e_scope})")


def _cells(col: DeviceColumn) -> list[str]:
    released = {a: (f"{col.normal_released[a][0]}/{col.normal_released[a][1]}"
                    if col.normal_released.get(a) else MISSING) for a in PAIRED_ARMS}
    idle = col.idle_intersection_ms
    return [
        col.label, col.injected, col.scale or MISSING, _reserved(col), col.scope,
        _arms(col, "normal_ms", {a: _spread(col, "normal_ms", col.normal_ms[a])
                                 for a in PAIRED_ARMS}),
        _arms(col, "normal_released", released),
        _arms(col, "normal_ms_per_gib", {a: _per_gib(col, a) for a in PAIRED_ARMS}),
        _arms(col, "forced_ms", {a: _spread(col, "forced_ms", col.forced_ms[a])
                                 for a in PAIRED_ARMS}),
        (_why(col, "idle_intersection_ms") if idle is None else
         f"{_num(col, 'idle_intersection_ms', idle[BASELINE])} ms → "
         f"{_num(col, 'idle_intersection_ms', idle[CANDIDATE])} ms"),
        _e2e(col)]


def cross_device_table(columns: Sequence[DeviceColumn]) -> pd.DataFrame:
    """One row per quantity of `ROWS`, one column per run (and the published one), each cell
    "baseline → candidate"; title, footer and the columns (JSON-ready) in `attrs`."""
    table = pd.DataFrame({"quantity": list(ROWS),
                          **{header(c): _cells(c) for c in columns}})
    emulated = [c.name for c in columns if not c.measurement]
    footer = ("Each cell: baseline → candidate. Per-call figures: median (lowest–highest, "
              "how many calls) over the measured requests (warm-up excluded) of a run's "
              "unprofiled runs, else of its profiled pair (never pooled); published: per-rank "
              "range of the isolated pair. Cost per GiB released: the median released normal "
              "call over the median cached bytes (reserved − allocated) at those calls "
              "(estimated from the other arm's snapshots where the arm's own telemetry "
              "failed). E2E delta: median paired delta, share of the baseline's median E2E. "
              "Published figures at their published precision in CSV and JSON (Markdown: 4 "
              "significant digits, as every number here).")
    if emulated:
        footer += (f" {', '.join(emulated)}: emulated NPU, host memory standing in for an "
                   "NPU: these are not NPU figures.")
    table.attrs.update(
        title="Cross-device: " + ", ".join(header(c) for c in columns),
        device_kind=",".join(c.device_kind for c in columns), footer=footer,
        columns=[c.to_dict() for c in columns])
    return table


def to_json(table: pd.DataFrame) -> str:
    """One JSON object: title, footer, rows (as in the table) and `columns`, each run's
    numbers (`DeviceColumn.to_dict`)."""
    doc = {"title": table.attrs.get("title"), "footer": table.attrs.get("footer"),
           "rows": table.to_dict(orient="records"), "columns": table.attrs.get("columns")}
    return json.dumps(plain(doc), indent=2, ensure_ascii=False)


def normal_call_figure(columns: Sequence[DeviceColumn]) -> Figure:
    """Normal-call cost per call of each run/device and arm on a log axis: the median as a
    dot (none where only a range is published) and the lowest–highest as a bar."""
    import matplotlib.pyplot as plt

    from residency.reports.plots import ARM_COLOURS

    fig, ax = plt.subplots(figsize=(max(8.0, 3.2 * len(columns)), 4.6),
                           layout="constrained")
    for i, col in enumerate(columns):
        for j, arm in enumerate(PAIRED_ARMS):
            s = col.normal_ms.get(arm)
            if s is None:
                continue
            x = i + (j - 0.5) * 0.25
            ax.vlines(x, s.low, s.high, color=ARM_COLOURS[arm], lw=6, alpha=0.45,
                      label=f"{arm}: lowest–highest" if i == 0 else None)
            if s.median is not None:
                ax.plot([x], [s.median], "o", color=ARM_COLOURS[arm],
                        label=f"{arm}: median" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([f"{c.name}\n{c.label.replace(' — ', ' —' + chr(10))}"
                        + ("" if c.injected.startswith("no") else f"\ninjected: {c.injected}")
                        for c in columns], fontsize=8)
    ax.set_ylabel("normal-call duration per call (ms, log scale)")
    ax.set_title("Normal-call cost per call, run by run and device by device\n"
                 "(emulated NPU figures are host-memory costs, not NPU figures)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
