"""The reports' new figures, as pure plotting functions: data in, a matplotlib `Figure` out
(never a path, never `show`; callers save or display them).

* `timeline_figure`: the profiled pair, baseline above candidate on one time axis: per-rank
  device-busy lanes, the all-rank no-device-task time shaded across every lane, release
  markers (normal, forced), phases, and a zoomed panel around each arm's first normal release;
* `memory_figure`: per rank, reserved and allocated bytes at each policy call with a snapshot
  against the 25 % / 5 % bounds;
* `memory_timeline_figure`: per arm and rank, the caching allocator's reserved and allocated
  bytes over time from the profiled pair's traces, with the release markers;
* `e2e_slopegraph`: client E2E per pair, profiled and unprofiled panels on one axis from zero,
  unprofiled pairs numbered 1..K as the notes number them (`humanize.pair_names`), and the
  paired deltas with their median;
* `neighbour_table`: the run's own what-if setting and its neighbours, a small table beside
  the heatmap of `residency.reports.figures.whatif_figure`.

Every title names the device kind (the emulated NPU as "emulated NPU — not an NPU
measurement") and n. Numbers on figures have 4 significant digits (`residency.humanize`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from residency.evidence.derived import retention_rate
from residency.humanize import (
    bytes_text,
    count_text,
    ms_from_ns,
    pair_names,
    percent,
    quantity,
    sig,
)
from residency.policy.cache import (
    BASELINE,
    CANDIDATE,
    DEFAULT_MAX_CACHED_FRACTION,
    DEFAULT_MIN_FREE_FRACTION,
    PAIRED_ARMS,
)
from residency.reports.banner import device_heading
from residency.reports.figure_text import plain_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from residency.analysis.timeline import ArmTimeline

ARM_COLOURS = {BASELINE: "tab:blue", CANDIDATE: "tab:orange"}
BUSY = "#4c72b0"
IDLE = "#f4a259"
RELEASE = {"normal": "#c0392b", "forced": "#7d3c98"}
PHASES = {"prepare": "#d5e8d4", "denoise": "#dae8fc", "decode": "#ffe6cc"}
GIB = float(1 << 30)

__all__ = ["e2e_slopegraph", "figure_title", "memory_figure", "memory_timeline_figure",
           "neighbour_table", "neighbour_rows", "timeline_figure"]


def figure_title(what: str, device_kind: str | None, n: str,
                 injection: str | None = None) -> str:
    """A figure title: what it shows, then the device heading and n on a second line."""
    return f"{what}\n{device_heading(device_kind, injection)}; {n}"


def _figure(**kwargs: Any) -> Figure:
    import matplotlib.pyplot as plt

    fig = plt.figure(layout="constrained", **kwargs)
    plt.close(fig)  # displayed by display(fig) or saved, never twice by the inline backend
    return fig


def _sig_axis(ax: Axes, axis: str = "y", digits: int = 4) -> None:
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: sig(v, digits))
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


def _legend(fig: Figure, axes: Sequence[Axes], **kw: Any) -> None:
    """One figure legend of every labelled artist of `axes`, each label once."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), fontsize=8, **kw)


# ----------------------------------------------------------------------------- timeline
PIXELS = 2000  # horizontal resolution the spans are simplified to (more than a panel has)


def _visible(spans: np.ndarray, lo: int, hi: int, *, min_gap_ns: int, gaps: bool = True
             ) -> np.ndarray:
    """`spans` clipped to [lo, hi), as drawn at `min_gap_ns` per pixel: with `gaps`, spans
    closer than a pixel join (the gap would not show); without, spans shorter than a quarter
    pixel are left out (they would not show). The figures' numbers come from the analysis,
    never from what is drawn."""
    if not len(spans):
        return spans
    s = np.clip(spans, lo, hi)
    s = s[s[:, 1] > s[:, 0]]
    if not len(s):
        return s
    if not gaps:
        return s[(s[:, 1] - s[:, 0]) * 4 >= min_gap_ns]
    keep = (s[1:, 0] - s[:-1, 1]) >= min_gap_ns
    return np.stack([s[np.r_[True, keep], 0], s[np.r_[keep, True], 1]], axis=1)


def _bars(ax: Axes, spans: np.ndarray, y: float, h: float, origin_ns: int, scale: float,
          **kw: Any) -> None:
    if len(spans):
        rel = (spans - origin_ns) / scale
        ax.broken_barh(list(zip(rel[:, 0], rel[:, 1] - rel[:, 0], strict=True)), (y, h), **kw)


def _draw_arm(ax: Axes, t: ArmTimeline, *, scale: float, origin_ns: int,
              span_ns: tuple[int, int]) -> None:
    ranks = t.ranks
    lanes = {r: len(ranks) - 1 - i for i, r in enumerate(ranks)}  # rank 0 on top of ranks
    top = len(ranks)  # the phases lane
    lo, hi = span_ns
    pixel = max(1, (hi - lo) // PIXELS)
    _bars(ax, _visible(t.idle, lo, hi, min_gap_ns=pixel, gaps=False), -0.5, top + 1.0,
          origin_ns, scale, facecolor=IDLE, alpha=0.45, edgecolor="none",
          label="all-rank no-device-task time", zorder=1)
    for phase, spans in t.phases.items():
        _bars(ax, spans, top - 0.35, 0.7, origin_ns, scale, facecolor=PHASES[phase],
              edgecolor="grey", lw=0.5, zorder=2)
        for s, e in spans:
            mid = ((s + e) / 2 - origin_ns) / scale
            ax.text(mid, top, phase, ha="center", va="center", fontsize=8, zorder=3,
                    clip_on=True)
    for r in ranks:
        y = lanes[r]
        _bars(ax, _visible(t.busy[r], lo, hi, min_gap_ns=pixel), y - 0.3, 0.6, origin_ns,
              scale, facecolor=BUSY, edgecolor="none",
              label="device busy" if r == ranks[0] else None, zorder=2)
        for kind, colour in RELEASE.items():
            spans = t.releases.get(kind, {}).get(r, np.empty((0, 2), np.int64))
            _bars(ax, spans, y + 0.3, 0.12, origin_ns, scale, facecolor=colour,
                  edgecolor=colour, lw=0.8, zorder=4)
            if len(spans):
                xs = (spans[:, 0] - origin_ns) / scale
                ax.scatter(xs, np.full(len(xs), y + 0.48), marker="v", s=28, color=colour,
                           zorder=5, clip_on=True,
                           label=f"{kind} release" if r == ranks[0] else None)
    ax.set_yticks([*lanes.values(), top], [*(f"rank {r}" for r in lanes), "phase"])
    ax.set_ylim(-0.6, top + 0.6)


@plain_text
def timeline_figure(baseline: ArmTimeline, candidate: ArmTimeline, *,
                    zoom_ms: float | None = None, injection: str | None = None) -> Figure:
    """The profiled pair on one time axis (s from each run's request start): baseline above
    candidate, one lane per rank of device-busy time, the all-rank no-device-task time shaded
    across all lanes, normal and forced release markers (bars and triangles), the phases; at
    the right a zoomed panel of the same width in both arms (`zoom_ms`, default three times the
    longer first normal release, at least 5 ms) around each arm's first normal release."""
    fig = _figure(figsize=(15, 7.5))
    grid = fig.add_gridspec(2, 2, width_ratios=[3.2, 1.3])
    arms = (baseline, candidate)
    firsts = [t.first_release("normal") for t in arms]
    widths = [e - s for s, e in (f for f in firsts if f)]
    zoom_ns = int(zoom_ms * 1e6) if zoom_ms else max([5_000_000, *(3 * w for w in widths)])
    full_axes: list[Axes] = []
    for row, t in enumerate(arms):
        ax = fig.add_subplot(grid[row, 0], sharex=full_axes[0] if full_axes else None)
        full_axes.append(ax)
        _draw_arm(ax, t, scale=1e9, origin_ns=t.origin_ns,
                  span_ns=(min(t.origin_ns, t.window_ns[0]), t.window_ns[1]))
        end = (t.window_ns[1] - t.origin_ns) / 1e9
        ax.set_xlim(0, max(end, ax.get_xlim()[1] if row else 0) * 1.01)
        ax.set_title(f"{t.arm}: all-rank no-device-task time {ms_from_ns(t.idle_ns)}; normal "
                     f"release ∩ that time {ms_from_ns(t.intersection_ns)}", fontsize=10,
                     loc="left")
        ax.grid(axis="x", alpha=0.3)
        _sig_axis(ax, "x")
        zax = fig.add_subplot(grid[row, 1])
        first = firsts[row]
        if first is None:
            zax.text(0.5, 0.5, "no normal release recorded", ha="center",
                     transform=zax.transAxes)
            zax.set_axis_off()
            continue
        start = first[0]
        _draw_arm(zax, t, scale=1e6, origin_ns=start,
                  span_ns=(start - zoom_ns // 3, start + 2 * zoom_ns // 3))
        zax.set_xlim(-zoom_ns / 3e6, 2 * zoom_ns / 3e6)
        zax.set_title(f"zoom: first normal release of each rank\n(first start to last end "
                      f"{ms_from_ns(first[1] - first[0])})", fontsize=9)
        zax.set_xlabel("ms from the first normal release")
        zax.grid(axis="x", alpha=0.3)
        _sig_axis(zax, "x")
        zax.set_yticklabels([])
        ax.axvspan((start - zoom_ns / 3 - t.origin_ns) / 1e9,
                   (start + 2 * zoom_ns / 3 - t.origin_ns) / 1e9, fill=False, ec="black",
                   lw=0.8, ls="--", zorder=6)
    full_axes[-1].set_xlabel("s from the request start (each arm's own run)")
    _legend(fig, full_axes, loc="outside lower center", ncol=4)
    ranks = max(len(t.ranks) for t in arms)
    fig.suptitle(figure_title("Timeline of the profiled pair: where the normal release sits",
                              baseline.device_kind,
                              f"n = 1 profiled run per arm, {count_text(ranks, 'rank')}; "
                              "dashed box: the zoomed span", injection))
    return fig


# ----------------------------------------------------------------------------- memory
def _recorded_bound(d: pd.DataFrame, column: str, default: float) -> float:
    values = d[column].dropna().unique() if column in d else []
    return float(values[0]) if len(values) == 1 else default


@plain_text
def memory_figure(decisions: pd.DataFrame, *, device_kind: str,
                  max_cached_fraction: float | None = None,
                  min_free_fraction: float | None = None,
                  scope: str = "measured requests", injection: str | None = None) -> Figure:
    """Per rank (columns) and arm (rows, arms with at least one call): reserved and
    allocated bytes at each policy call in call order, against the bounds: the reserved
    ceiling ``allocated + int(total * max_cached_fraction)`` and the free floor
    ``int(total * min_free_fraction)`` beside the free bytes. Calls without a snapshot
    (forced calls read no telemetry; a failed read sees none) are ticks on the axis.

    `decisions`: one row per call with `arm`, `rank`, `kind`, `outcome`, `reserved`,
    `allocated`, `free`, `total` (NaN without a snapshot) and `start_ns`; optional `run`
    (rows are ordered by run then `start_ns`). The bounds default to those the calls
    recorded (`max_cached_fraction`, `min_free_fraction` columns, when one value each), else
    0.25 and 0.05."""
    d = decisions.copy()
    if max_cached_fraction is None:
        max_cached_fraction = _recorded_bound(d, "max_cached_fraction", DEFAULT_MAX_CACHED_FRACTION)
    if min_free_fraction is None:
        min_free_fraction = _recorded_bound(d, "min_free_fraction", DEFAULT_MIN_FREE_FRACTION)
    if "run" not in d:
        d["run"] = ""
    arms = [a for a in PAIRED_ARMS if (d["arm"] == a).any()] or sorted(d["arm"].unique())
    ranks = sorted(int(r) for r in d["rank"].unique()) or [0]
    fig = _figure(figsize=(6.2 * len(ranks), 3.6 * max(1, len(arms))))
    axes = fig.subplots(max(1, len(arms)), len(ranks), squeeze=False)
    totals = d["total"].astype(float)
    ymax = (float(totals.max()) if totals.notna().any() else float(
        d[["reserved", "free"]].astype(float).max().max() if len(d) else GIB)) / GIB
    ymax = ymax if np.isfinite(ymax) and ymax > 0 else 1.0
    snaps = 0
    for i, arm in enumerate(arms):
        for j, rank in enumerate(ranks):
            ax = axes[i][j]
            mine = d[(d["arm"] == arm) & (d["rank"] == rank)].sort_values(["run", "start_ns"])
            x = np.arange(1, len(mine) + 1)
            has = mine["total"].notna().to_numpy()
            snaps += int(has.sum())
            if has.any():
                m = mine[has]
                xs = x[has]
                total = m["total"].astype(float).to_numpy()
                alloc = m["allocated"].astype(float).to_numpy()
                ceiling = alloc + np.floor(total * max_cached_fraction)
                ax.plot(xs, m["reserved"].astype(float) / GIB, "-", color="tab:blue",
                        label="reserved")
                ax.plot(xs, alloc / GIB, "--", color="tab:green", label="allocated")
                ax.plot(xs, ceiling / GIB, ":", color="red", lw=1.5,
                        label=f"reserved ceiling: allocated + {percent(max_cached_fraction)} "
                        "of total")
                ax.plot(xs, m["free"].astype(float) / GIB, "-", color="tab:gray", lw=1,
                        label="free")
                ax.plot(xs, np.floor(total * min_free_fraction) / GIB, ":", color="black",
                        lw=1.2, label=f"free floor: {percent(min_free_fraction)} of total")
                for outcome, marker in (("retained", "o"), ("released", "x")):
                    sel = (m["outcome"] == outcome).to_numpy()
                    if sel.any():
                        ax.scatter(xs[sel], m["reserved"].astype(float).to_numpy()[sel] / GIB,
                                   marker=marker, s=40, color="tab:blue", zorder=4,
                                   label=f"normal call {outcome}")
                ax.set_title(f"{arm}, rank {rank}: total {bytes_text(total.max())}",
                             fontsize=10)
            else:
                ax.set_title(f"{arm}, rank {rank}", fontsize=10)
                ax.text(0.5, 0.55, "no snapshot recorded", ha="center",
                        transform=ax.transAxes)
            if (~has).any():
                kinds = mine.loc[~has, "kind"].astype(str).to_numpy()
                for kind, colour in RELEASE.items():
                    sel = kinds == kind
                    if sel.any():
                        ax.plot(x[~has][sel], np.zeros(int(sel.sum())), "|", ms=14,
                                color=colour, label=f"{kind} call, no snapshot")
            runs = mine["run"].astype(str).to_numpy()
            for k in np.flatnonzero(runs[1:] != runs[:-1]):
                ax.axvline(x[k] + 0.5, color="grey", lw=0.6, ls="--")
            ax.set_xlabel("policy call (in order; dashed: next service run)")
            if j == 0:
                ax.set_ylabel("GiB")
            ax.set_ylim(-0.03 * ymax, ymax * 1.05)
            ax.grid(alpha=0.3)
            _sig_axis(ax)
    _legend(fig, [ax for row in axes for ax in row], loc="outside right center")
    fig.suptitle(figure_title(
        "Memory at each policy call against the bounds (retain while reserved <= ceiling "
        "and free >= floor)", device_kind,
        f"n = {count_text(snaps, 'call')} with a snapshot, {count_text(len(ranks), 'rank')}; "
        f"{scope}", injection))
    return fig


def _envelope(ts_ns: np.ndarray, *series: np.ndarray, bins: int = PIXELS) -> np.ndarray:
    """Indices of the points to draw of step series sampled at `ts_ns` (sorted): all of them
    when there are at most 4 * `bins`, else per time bin the first and last point and each
    series' minimum and maximum, so the drawn steps keep every peak and trough a pixel can
    show. The figures' numbers come from the full series, never from what is drawn."""
    n = len(ts_ns)
    if n <= 4 * bins:
        return np.arange(n)
    lo, hi = int(ts_ns[0]), int(ts_ns[-1])
    edges = np.searchsorted(ts_ns, np.linspace(lo, hi, bins + 1)[1:-1], side="left")
    starts = np.r_[0, edges]
    keep = [starts, np.r_[edges - 1, n - 1]]
    for values in series:
        order = np.lexsort((np.arange(n), values))  # by value; the bin is found by position
        ranks = np.empty(n, np.int64)
        ranks[order] = np.arange(n)
        bin_of = np.searchsorted(edges, np.arange(n), side="right")
        first_min = np.full(bins, n, np.int64)
        np.minimum.at(first_min, bin_of, ranks)
        last_max = np.full(bins, -1, np.int64)
        np.maximum.at(last_max, bin_of, ranks)
        keep += [order[first_min[first_min < n]], order[last_max[last_max >= 0]]]
    out = np.unique(np.concatenate(keep))
    return out[out >= 0]


def _release_kind(name: str) -> str:
    return next((k for k in RELEASE if f"[{k}]" in name), "normal")


@plain_text
def memory_timeline_figure(memory: Mapping[str, pd.DataFrame],
                           releases: Mapping[str, pd.DataFrame],
                           origins_ns: Mapping[str, int], *, device_kind: str,
                           source: str, injection: str | None = None) -> Figure:
    """Per arm (rows) and rank (columns): the caching allocator's reserved and allocated
    bytes after each change, as steps over time (s from the arm's `origins_ns`), with its
    normal and forced release markers shaded. `memory`: arm -> `residency.traces.memory.
    allocator_memory` rows; `releases`: arm -> `release_markers` rows; `source` names where the
    records come from (shown in the title). A panel without records says so."""
    arms = [a for a in PAIRED_ARMS if a in memory] + [a for a in memory if a not in PAIRED_ARMS]
    ranks = sorted({int(r) for m in memory.values() for r in m["rank"].unique()}
                   | {int(r) for m in releases.values() for r in m["rank"].unique()}) or [0]
    fig = _figure(figsize=(max(10.0, 6.2 * len(ranks)), 3.4 * max(1, len(arms))))
    axes = fig.subplots(max(1, len(arms)), len(ranks), squeeze=False, sharex=True,
                        sharey=True)
    peak = max([float(m["reserved_bytes"].max()) for m in memory.values() if len(m)] or [GIB])
    unit, scale = ("GiB", GIB) if peak >= GIB else ("MiB", float(1 << 20))
    records = 0
    for i, arm in enumerate(arms):
        origin = int(origins_ns.get(arm, 0))
        for j, rank in enumerate(ranks):
            ax = axes[i][j]
            mine = memory[arm][memory[arm]["rank"] == rank]
            records += len(mine)
            marks = releases.get(arm, pd.DataFrame(columns=["rank", "name", "start_ns",
                                                            "end_ns"]))
            marks = marks[marks["rank"] == rank]
            for name, start, end in zip(marks["name"], marks["start_ns"], marks["end_ns"],
                                        strict=True):
                kind = _release_kind(str(name))
                ax.axvspan((int(start) - origin) / 1e9, (int(end) - origin) / 1e9,
                           color=RELEASE[kind], alpha=0.25, lw=0,
                           label=f"{kind} release", zorder=1)
                ax.axvline((int(start) - origin) / 1e9, color=RELEASE[kind], lw=0.8, zorder=2)
            if len(mine):
                ts = mine["ts_ns"].to_numpy(np.int64)
                reserved = mine["reserved_bytes"].to_numpy(np.int64)
                allocated = mine["allocated_bytes"].to_numpy(np.int64)
                drawn = _envelope(ts, reserved, allocated)
                xs = (ts[drawn] - origin) / 1e9
                ax.step(xs, reserved[drawn] / scale, where="post",
                        color="tab:blue", lw=2.2, label="reserved", zorder=3)
                ax.step(xs, allocated[drawn] / scale, where="post",
                        color="tab:green", lw=1.2, ls="--", label="allocated", zorder=4)
                ax.set_title(f"{arm}, rank {rank}: peak reserved "
                             f"{bytes_text(mine['reserved_bytes'].max())}", fontsize=10)
            else:
                ax.set_title(f"{arm}, rank {rank}", fontsize=10)
                ax.text(0.5, 0.55, "no memory records", ha="center", transform=ax.transAxes)
            if i == len(arms) - 1:
                ax.set_xlabel("s from the request start (each arm's own run)")
            if j == 0:
                ax.set_ylabel(unit)
            ax.set_ylim(-0.03 * peak / scale, peak / scale * 1.08)
            ax.grid(alpha=0.3)
            _sig_axis(ax)
            _sig_axis(ax, "x")
    _legend(fig, [ax for row in axes for ax in row], loc="outside right center")
    fig.suptitle(figure_title(
        "Device memory in the profiled pair's traces: the caching allocator's reserved and "
        "allocated bytes after each change, with the releases", device_kind,
        f"n = 1 profiled run per arm, {count_text(len(ranks), 'rank')}, "
        f"{records} records; {source}", injection))
    return fig


# ----------------------------------------------------------------------------- E2E
def _pairs(lists: Mapping[str, Sequence[float]]) -> list[tuple[float, float]]:
    b, c = list(lists.get(BASELINE) or []), list(lists.get(CANDIDATE) or [])
    return [(float(x), float(y)) for x, y in zip(b, c, strict=False)]


def _spread_labels(ys: Sequence[float], gap: float) -> list[float]:
    """Label positions near `ys`, at least `gap` apart (same order), so that pair numbers of
    close values do not overlap; the group's centre stays where it was."""
    if not ys:
        return []
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = [float(ys[i]) for i in order]
    for j in range(1, len(out)):
        out[j] = max(out[j], out[j - 1] + gap)
    shift = (sum(ys) - sum(out)) / len(out)  # keep the mean position
    placed = [0.0] * len(ys)
    for j, i in enumerate(order):
        placed[i] = out[j] + shift
    return placed


@plain_text
def e2e_slopegraph(profiled: Mapping[str, Sequence[float]],
                   unprofiled: Mapping[str, Sequence[float]], *, device_kind: str,
                   unit: str = "s", aa_spread: float | None = None,
                   injection: str | None = None) -> Figure:
    """Client E2E per pair as a slopegraph (a line from baseline to candidate per pair):
    profiled and unprofiled pairs in separate panels on one axis starting at zero, the
    unprofiled pairs numbered 1..K as every note and table numbers them (`humanize.pair_names`;
    the profiled pair is named, not numbered), and a third panel of the paired deltas
    (candidate − baseline) with each panel's median delta marked and, given `aa_spread`
    (an A/A run's median |delta|, in `unit`), a band of ±that spread around 0. Inputs:
    arm -> values (pair i is the i-th value of each arm)."""
    groups = {"profiled": _pairs(profiled), "unprofiled": _pairs(unprofiled)}
    fig = _figure(figsize=(13, 4.6))
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.4, 1.2]})
    top = max([v for ps in groups.values() for p in ps for v in p] or [1.0])
    deltas: dict[str, list[tuple[str, float]]] = {}
    for ax, (name, pairs) in zip(axes[:2], groups.items(), strict=True):
        deltas[name] = []
        label_y = _spread_labels([c for _, c in pairs], 0.035 * top)
        names = _pair_labels(name, len(pairs))
        for (b, c), y, label in zip(pairs, label_y, names, strict=True):
            ax.plot([0, 1], [b, c], "-o", color="tab:gray", lw=1.2, ms=5)
            ax.text(1.06, y, label, va="center", fontsize=8)
            deltas[name].append((label, c - b))
        ax.set_xticks([0, 1], list(PAIRED_ARMS))
        ax.set_xlim(-0.25, 1.3)
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel(f"client E2E ({unit}), axis from 0")
        ax.grid(axis="y", alpha=0.3)
        _sig_axis(ax)
        ax.set_title(f"{name} {count_text(len(pairs), 'pair')}", fontsize=10)
        if not pairs:
            ax.text(0.5, 0.5, "none in this run", ha="center", transform=ax.transAxes)
    dax = axes[2]
    dax.axhline(0, color="black", lw=0.8)
    if aa_spread is not None:
        dax.axhspan(-aa_spread, aa_spread, color="tab:blue", alpha=0.15, lw=0,
                    label=f"A/A noise: ±median |delta| ({quantity(aa_spread, unit)})")
    every = [v for items in deltas.values() for _, v in items] + [0.0]
    span = (max(every) - min(every)) or 1.0
    labelled = False
    for k, items in enumerate(deltas.values()):
        if not items:
            continue
        vals = [v for _, v in items]
        xs = np.full(len(vals), k, float)
        dax.scatter(xs, vals, color="tab:gray", zorder=3)
        for (n, _), x, y in zip(items, xs, _spread_labels(vals, 0.045 * span), strict=True):
            dax.text(x - 0.08, y, f"{n}", va="center", ha="right", fontsize=8)
        if len(vals) < 2:  # one pair: its delta, no median to draw
            dax.text(k + 0.1, vals[0], f"n = 1: {quantity(vals[0], unit)}", fontsize=8,
                     va="center", ha="left")
            continue
        med = float(np.median(vals))
        dax.hlines(med, k - 0.25, k + 0.25, color="red", lw=2.5, zorder=4,
                   label=None if labelled else "median paired delta")
        labelled = True
        dax.text(k + 0.28, med, f"median {quantity(med, unit)}", color="red", fontsize=8,
                 va="center", ha="left")
    dax.set_xticks([0, 1], ["profiled", "unprofiled"])
    dax.set_xlim(-0.5, 2.1)
    dax.set_ylabel(f"candidate − baseline ({unit})")
    dax.set_title("paired deltas (below 0: candidate faster)", fontsize=10)
    dax.grid(axis="y", alpha=0.3)
    _sig_axis(dax)
    if labelled or aa_spread is not None:
        dax.legend(fontsize=8, loc="best")
    n_prof, n_unprof = (len(p) for p in groups.values())
    numbered = f" numbered 1–{n_unprof}" if n_unprof > 1 else ""
    fig.suptitle(figure_title("Client end-to-end time per pair (profiled and unprofiled never "
                              "pooled)", device_kind,
                              f"n = {count_text(n_prof, 'profiled pair')}, "
                              f"{count_text(n_unprof, 'unprofiled pair')}{numbered}", injection))
    return fig


def _pair_labels(group: str, n: int) -> list[str]:
    """A pair's label beside its line: the unprofiled pair's number, the profiled pair's
    number among several profiled pairs ("P2"), nothing for a lone profiled pair (its panel
    is titled so)."""
    if group == "unprofiled":
        return pair_names(0, n)[1]
    return [""] if n == 1 else [f"P{i}" for i in range(1, n + 1)]


# ----------------------------------------------------------------------------- what-if
def neighbour_rows(frame: pd.DataFrame, own: tuple[float, float], *, radius: int = 1
                   ) -> pd.DataFrame:
    """The rows of a per-setting `frame` (columns `max_cached_fraction`,
    `min_free_fraction`) within `radius` grid steps of the setting nearest `own`."""
    cs = np.sort(frame["max_cached_fraction"].unique())
    fs = np.sort(frame["min_free_fraction"].unique())
    ci = int(np.argmin(np.abs(cs - own[0])))
    fi = int(np.argmin(np.abs(fs - own[1])))
    keep_c = cs[max(0, ci - radius): ci + radius + 1]
    keep_f = fs[max(0, fi - radius): fi + radius + 1]
    return frame[frame["max_cached_fraction"].isin(keep_c)
                 & frame["min_free_fraction"].isin(keep_f)]


def neighbour_table(totals: pd.DataFrame, own: tuple[float, float], *, radius: int = 1,
                    calls: str = "calls",
                    retained: str = "retained") -> pd.DataFrame:
    """The run's own setting and its neighbours on the grid (`radius` steps along each
    bound): max cached fraction, min free fraction, retained of calls and the retention rate
    (a fraction), with `own` marking the run's setting; at most (2 * radius + 1)^2 rows."""
    cs = np.sort(totals["max_cached_fraction"].unique())
    fs = np.sort(totals["min_free_fraction"].unique())
    ci = int(np.argmin(np.abs(cs - own[0])))
    fi = int(np.argmin(np.abs(fs - own[1])))
    sel = neighbour_rows(totals, own, radius=radius)
    out = pd.DataFrame({
        "max cached fraction": sel["max_cached_fraction"].to_numpy(),
        "min free fraction": sel["min_free_fraction"].to_numpy(),
        "retained / calls": [f"{int(r)}/{int(c)}" for r, c in
                             zip(sel[retained], sel[calls], strict=True)],
        "retention rate": retention_rate(sel, calls, retained).to_numpy(),
        "own setting": ["yes" if (np.isclose(c, cs[ci]) and np.isclose(f, fs[fi])) else ""
                        for c, f in zip(sel["max_cached_fraction"], sel["min_free_fraction"],
                                        strict=True)],
    }).sort_values(["max cached fraction", "min free fraction"], ignore_index=True)
    out.attrs.update(totals.attrs)
    return out
