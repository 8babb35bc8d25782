"""Every figure of the suite, drawn from data the analyses return (they never plot): the
consecutive-requests fractions, the paired-profile normal calls, idle and E2E, and the
what-if retention heatmap. Each title names the device kind and its label and the n."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from residency import devices
from residency.evidence import PAIRED_ARMS, Evidence
from residency.humanize import count_text, sig
from residency.policy.cache import (
    BASELINE,
    CANDIDATE,
    DEFAULT_MAX_CACHED_FRACTION,
    DEFAULT_MIN_FREE_FRACTION,
)
from residency.reports.figure_text import plain_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure


__all__ = ["plot_fractions", "plot_idle", "plot_normal_calls", "whatif_figure"]


def _title(what: str, device_kind: str, n: str, injection: str = "none") -> str:
    return f"{what}\n{device_kind} ({devices.label(device_kind, injection)}); {n}"


def _bar_labels(values: Any) -> list[str]:
    """Bar labels as the tables print the same values (`residency.humanize.sig`)."""
    return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else sig(v)
            for v in values]


def _figure(ncols: int, *, width: float = 11.0, height: float = 4.2) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False,
                             layout="constrained")
    plt.close(fig)  # shown by display(fig), never twice by the inline backend
    return fig, axes[0]


@plain_text
def plot_fractions(frame: pd.DataFrame) -> Figure:
    """Cached and free fractions of each normal check against their bounds (retain while
    cached <= 0.25 and free >= 0.05 of total), by measured request and rank."""
    kind = frame.attrs.get("device_kind", "?")
    fig, (ax_c, ax_f) = _figure(2)
    ranks = sorted(frame["rank"].unique())
    width = 0.6 / max(1, len(ranks))
    for i, rank in enumerate(ranks):
        d = frame[frame["rank"] == rank]
        x = d["request"].astype(float) - 0.3 + (i + 0.5) * width
        for outcome, marker in (("retained", "o"), ("released", "x")):
            m = d["outcome"] == outcome
            if m.any():
                label = f"rank {rank}, {outcome}"
                ax_c.scatter(x[m], d["cached_fraction"][m], marker=marker, label=label)
                ax_f.scatter(x[m], d["free_fraction"][m], marker=marker, label=label)
    cached, free = DEFAULT_MAX_CACHED_FRACTION, DEFAULT_MIN_FREE_FRACTION
    if len(frame):
        cached = float(frame["max_cached_fraction"].iloc[0])
        free = float(frame["min_free_fraction"].iloc[0])
    ax_c.axhline(cached, color="red", ls="--", label=f"bound: retain while <= {cached:g}")
    ax_f.axhline(free, color="red", ls="--", label=f"bound: retain while >= {free:g}")
    for ax, what in ((ax_c, "cached / total (reserved - allocated)"),
                     (ax_f, "free / total")):
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("measured request (in order)")
        ax.set_ylabel(f"{what}, fraction of capacity")
        requests = sorted(frame["request"].dropna().unique())
        ax.set_xticks(requests)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    ax_c.set_title("cached-but-unallocated")
    ax_f.set_title("physically free")
    n = f"n = {count_text(len(frame), 'normal check')}, {count_text(len(ranks), 'rank')}"
    fig.suptitle(_title("Memory state at each normal check vs the two bounds", kind, n))
    return fig


@plain_text
def plot_normal_calls(ev: Evidence) -> Figure:
    """Per-rank normal-call duration (ms, log scale) of both arms of the profiled pair (the
    evidence's `normal_call_per_rank`)."""
    fig, (ax,) = _figure(1, width=9.0)
    att = ev.get("normal_call_per_rank")
    by_rank = {a: dict(zip(att.detail["ranks"][a], att.values[a], strict=True)) if att else {}
               for a in PAIRED_ARMS}
    ranks = sorted(set(by_rank[BASELINE]) | set(by_rank[CANDIDATE]))
    x = np.arange(len(ranks))
    for i, a in enumerate(PAIRED_ARMS):
        vals = [by_rank[a].get(r, np.nan) for r in ranks]
        bars = ax.bar(x + (i - 0.5) * 0.4, vals, width=0.4, label=a)
        ax.bar_label(bars, labels=_bar_labels(vals), fontsize=8)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(x, [f"rank {r}" for r in ranks])
    ax.set_ylabel("normal-call duration per rank (ms, log scale)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    nb, nc = (len(by_rank[a]) for a in PAIRED_ARMS)
    pair = (f"profiled pair {ev.reference_pair[0]} / {ev.reference_pair[1]}"
            if ev.reference_pair else "no pair")
    ax.set_title(_title("Normal policy calls: time per rank (every rank, in this run pair)",
                        ev.device_kind, f"n = {nb} vs {count_text(nc, 'rank')}, {pair}",
                        ev.injection))
    return fig


IDLE_COLUMNS = (("idle_intersection",
                  "normal-release markers ∩ all-rank no-device-task time (ms)"),
                 ("all_rank_idle", "all-rank no-device-task time (s)"),
                 ("preparation_window", "preparation window (s)"))


def idle_frame(ev: Evidence) -> pd.DataFrame:
    """Per arm (profiled pair): normal-release markers ∩ all-rank no-device-task time (ms),
    all-rank no-device-task time (s), preparation window (s); empty values where no traces
    were recorded."""
    rows = []
    for arm in PAIRED_ARMS:
        row: dict[str, Any] = {"arm": arm}
        for key, col in IDLE_COLUMNS:
            a = ev.get(key)
            row[col] = None if a is None else a.values[arm][0]
        rows.append(row)
    return pd.DataFrame(rows, columns=["arm", *(c for _, c in IDLE_COLUMNS)]).set_index("arm")


@plain_text
def plot_idle(ev: Evidence) -> Figure:
    """Per arm: normal-release markers ∩ all-rank no-device-task time (ms), that time (s), the
    preparation window (s) of the profiled pair, one panel per unit."""
    fig, axes = _figure(3, width=12.0)
    frame = idle_frame(ev)
    for ax, col in zip(axes, frame.columns, strict=True):
        vals = frame[col].astype(float).tolist()
        bars = ax.bar(list(PAIRED_ARMS), vals, color=["tab:blue", "tab:orange"])
        ax.bar_label(bars, labels=_bar_labels(vals), fontsize=8)
        ax.set_title(col, fontsize=10)
        ax.set_ylabel(col.rsplit("(", 1)[-1].rstrip(")"))
        ax.grid(axis="y", alpha=0.3)
        if all(math.isnan(v) for v in vals):
            ax.text(0.5, 0.5, "no traces recorded", ha="center", transform=ax.transAxes)
    fig.suptitle(_title("Idle attribution of the profiled pair", ev.device_kind,
                        "n = 1 profiled run per arm (single observations)", ev.injection))
    return fig


@plain_text
def whatif_figure(bounded: pd.DataFrame, learned: pd.DataFrame, *, heatmap: str = "bounded"
                  ) -> Any:
    """A matplotlib figure: the retention rate of `heatmap`'s grid over the two bounds (the
    run's own bounds outlined) beside the retention rate against the cached bound at the run's
    own free floor for both policies (frames from `replay_run`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Rectangle

    from residency.analysis.whatif import POLICIES, WhatIfError, totals

    if heatmap not in POLICIES:
        raise WhatIfError(f"The value for `heatmap` must be one of {list(POLICIES)}, but "
                         f"{heatmap!r} was passed.")
    tb, tl = totals(bounded), totals(learned)
    th = tb if heatmap == "bounded" else tl
    heat = th.pivot(index="max_cached_fraction", columns="min_free_fraction",
                    values="retention_rate").sort_index(ascending=False)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.5),
                                  gridspec_kw={"width_ratios": [1.6, 1]})
    sns.heatmap(heat, ax=ax, vmin=0, vmax=1, cmap="viridis",
                cbar_kws={"label": "retention rate (retained / replayed normal calls)"},
                xticklabels=[f"{v:g}" for v in heat.columns],
                yticklabels=[f"{v:g}" for v in heat.index])
    ax.set_xlabel("min_free_fraction (free floor, fraction of total)")
    ax.set_ylabel("max_cached_fraction (cached bound, fraction of total)")
    kind = bounded.attrs.get("device_kind", "?")
    label = f" ({devices.label(kind)})"
    n_calls = int(th["calls"].iloc[0]) if len(th) else 0
    ax.set_title(f"{heatmap} policy on recorded snapshots, n = {n_calls} normal calls of "
                 f"measured requests (warm-up excluded)\n"
                 f"device kind {kind}{label}; red outline: the run's own bounds")
    own = bounded.attrs.get("own_settings", [])
    rows, cols = list(heat.index), list(heat.columns)
    for c, f in own:
        if c in rows and f in cols:
            ax.add_patch(Rectangle((cols.index(f), rows.index(c)), 1, 1, fill=False,
                                   edgecolor="red", lw=2.5))
    floors = set(tb["min_free_fraction"])
    floor = next((f for _, f in own if f in floors), float(tb["min_free_fraction"].iloc[0]))
    for frame, label, style in ((tb, "bounded", "-o"), (tl, "learned-budget", "--s")):
        sel = frame[frame["min_free_fraction"] == floor].sort_values("max_cached_fraction")
        ax2.plot(sel["max_cached_fraction"], sel["retention_rate"], style, label=label)
    for c in sorted({c for c, _ in own}):
        ax2.axvline(c, color="red", lw=1, ls=":", label="run's own cached bound")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("max_cached_fraction (learned budget: its cap)")
    ax2.set_ylabel("retention rate")
    ax2.set_title(f"both policies at min_free_fraction = {floor:g}")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    return fig
