"""What a notebook cell shows for the reviewer, in one call each: the banner, tables for
people (no index, at most `MAX_ROWS` rows, 4 significant digits), and the new figures saved
beside `results.json` and displayed (`residency.report_figures`).

Figures are written as `<name>.png` into the output folder; full-precision data stays in CSV
and JSON. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from residency import humanize

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from residency.rundir import Run, RunEntry
    from residency.timeline import ArmTimeline

MAX_ROWS = 40  # an HTML table in a report never has more rows
FIGURE_DPI = 120

__all__ = ["MAX_ROWS", "decisions_frame", "show_banner", "show_figure", "show_table",
           "timeline_pair", "write_e2e", "write_memory", "write_timeline", "write_whatif"]


def _display(*objs: Any) -> None:
    from IPython.display import display

    display(*objs)


def _manifest(run_or_manifest: Any) -> Mapping[str, Any]:
    m = getattr(run_or_manifest, "manifest", run_or_manifest)
    m = m.to_dict() if hasattr(m, "to_dict") else m
    out = dict(m)
    path = getattr(run_or_manifest, "path", None)
    if path is not None:
        out.setdefault("run_dir", str(path))
    return out


def show_banner(run_or_manifest: Any, *, title: str | None = None) -> None:
    """Display the banner (`residency.banner`) of a loaded run or a manifest dict."""
    from residency.banner import display_banner

    display_banner(_manifest(run_or_manifest), title=title)


def show_table(df: pd.DataFrame, *, caption: str | None = None, max_rows: int = MAX_ROWS,
               full: str | None = None, **kwargs: Any) -> None:
    """Display `df` for people (`humanize.html_table`): no index column, readable headers,
    numbers with 4 significant digits; a longer table shows its first `max_rows` rows and
    says where all of them are (`full`, e.g. a CSV file name)."""
    from IPython.display import HTML

    shown = df
    if len(df) > max_rows:
        shown = df.iloc[:max_rows]
        where = f"; all rows in `{full}`" if full else ""
        caption = f"{caption + ' — ' if caption else ''}first {max_rows} of {len(df)} rows{where}"
    _display(HTML(humanize.html_table(shown, caption=caption, **kwargs)))


def show_figure(fig: Figure, output_dir: str | os.PathLike[str], name: str) -> Path:
    """Save `fig` as `<name>.png` into `output_dir`, display it, and return the path."""
    path = Path(output_dir) / f"{name}.png"
    fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight")
    _display(fig)
    return path


# ----------------------------------------------------------------------------- paired profile
def timeline_pair(run: Run, pair: Sequence[RunEntry] | None
                  ) -> tuple[ArmTimeline, ArmTimeline] | None:
    """The timelines of the profiled pair (baseline, candidate) from its traces; None when
    the pair or a trace directory is missing."""
    from residency.timeline import arm_timeline
    from residency.traces import load_traces

    if not pair or len(pair) != 2 or any(e.trace_dir is None for e in pair):
        return None
    b, c = (arm_timeline(load_traces(e.trace_dir), arm=e.arm, device_kind=run.device_kind)
            for e in pair)
    return b, c


def write_timeline(run: Run, pair: Sequence[RunEntry] | None,
                   output_dir: str | os.PathLike[str], *, name: str = "timeline"
                   ) -> Path | None:
    """The timeline figure of the profiled pair, saved and displayed; None (and a line
    saying why) without traces."""
    from residency.report_figures import timeline_figure

    pair_tl = timeline_pair(run, pair)
    if pair_tl is None:
        print("No timeline: the profiled pair recorded no traces.")
        return None
    return show_figure(timeline_figure(*pair_tl), output_dir, name)


def decisions_frame(run: Run, *, warmup: bool = False) -> pd.DataFrame:
    """Every recorded policy call of the run's measured runs (warm-up requests only with
    `warmup`), one row each, with the run's name in `run`."""
    frames = [run.decisions(e, warmup=warmup).assign(run=e.name, arm=e.arm) for e in run.runs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "arm", "rank", "kind", "outcome", "start_ns", "reserved", "allocated",
                 "free", "total"])


def write_memory(run: Run, output_dir: str | os.PathLike[str], *, name: str = "memory"
                 ) -> Path:
    """The memory figure (reserved/allocated bytes at each policy call of the measured
    requests against the bounds the calls recorded), saved and displayed."""
    from residency.report_figures import memory_figure

    fig = memory_figure(decisions_frame(run), device_kind=run.device_kind)
    return show_figure(fig, output_dir, name)


def write_e2e(profiled: Mapping[str, Sequence[float]],
              unprofiled: Mapping[str, Sequence[float]], *, device_kind: str,
              output_dir: str | os.PathLike[str], name: str = "e2e") -> Path:
    """The E2E slopegraph (profiled and unprofiled pairs, paired deltas), saved and
    displayed."""
    from residency.report_figures import e2e_slopegraph

    return show_figure(e2e_slopegraph(profiled, unprofiled, device_kind=device_kind),
                       output_dir, name)


# ----------------------------------------------------------------------------- what-if
def write_whatif(totals: pd.DataFrame, *, own: tuple[float, float] | None, device_kind: str,
                 output_dir: str | os.PathLike[str], grid: pd.DataFrame | None = None,
                 policy: str = "bounded", name: str = "whatif",
                 calls: str = "measured_calls", retained: str = "measured_retained",
                 scope: str = "measured requests") -> dict[str, Path]:
    """The what-if view: the heatmap (saved as `<name>_heatmap.png`, displayed), the run's
    own setting and its neighbours as a small table (displayed), and the full grid saved as
    `<name>_grid.csv` (`grid`, default `totals`: every setting, full precision). Returns
    the written paths by kind."""
    from residency.report_figures import neighbour_table, whatif_heatmap

    out = Path(output_dir)
    paths: dict[str, Path] = {}
    full = grid if grid is not None else totals
    csv = out / f"{name}_grid.csv"
    full.drop(columns=[c for c in full.columns if full[c].map(
        lambda v: isinstance(v, (list, tuple, dict))).any()]).to_csv(
        csv, index=False, lineterminator="\n")
    paths["grid"] = csv
    fig = whatif_heatmap(totals, own=own, device_kind=device_kind, policy=policy, calls=calls,
                         retained=retained, scope=scope)
    paths["heatmap"] = show_figure(fig, out, f"{name}_heatmap")
    if own is not None:
        show_table(neighbour_table(totals, own, calls=calls, retained=retained),
                   caption=f"{policy} policy: the run's own setting and its neighbours "
                   f"({scope}); every setting in {csv.name}", formats={
                       "retention rate": humanize.percent})
    return paths
