"""What a notebook cell shows for the reviewer, in one call each: the banner, tables for
people (no index, at most `MAX_ROWS` rows, 4 significant digits), and the new figures saved
beside `results.json` and displayed (`residency.reports.plots`).

Figures are written as `<name>.png` into the output folder; full-precision data stays in CSV
and JSON. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from residency import devices, humanize
from residency.policy.cache import BASELINE, CANDIDATE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from residency.analysis.timeline import ArmTimeline
    from residency.rundir.run import Run, RunEntry

MAX_ROWS = 40  # an HTML table in a report never has more rows
FIGURE_DPI = 120

__all__ = ["MAX_ROWS", "aa_spread", "bytes_or_text", "decisions_frame", "e2e_pairs",
           "show_banner", "show_figure", "show_note", "show_probe_banner", "show_table",
           "show_text", "timeline_pair", "write_causes", "write_e2e", "write_effect",
           "write_memory", "write_memory_timeline", "write_timeline", "write_trace_diff",
           "write_whatif"]


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
    """Display the banner (`residency.reports.banner`) of a loaded run or a manifest dict."""
    from residency.reports.banner import display_banner

    display_banner(_manifest(run_or_manifest), title=title)


def show_table(df: pd.DataFrame, *, caption: str | None = None, max_rows: int = MAX_ROWS,
               full: str | None = None, sort: str | None = None, **kwargs: Any) -> None:
    """Display `df` for people (`humanize.html_table`): no index column, readable headers,
    numbers with 4 significant digits. A longer table shows its first `max_rows` rows and
    says so in its caption: "top N of M by `sort`" (the order `df` is in: largest first),
    or "first N of M rows" without `sort`, and where all of them are (`full`, a file name)."""
    from IPython.display import HTML

    shown = df
    if len(df) > max_rows:
        shown = df.iloc[:max_rows]
        caption = _with_cut(caption, max_rows, len(df), sort, full)
    _display(HTML(humanize.html_table(shown, caption=caption, **kwargs)))


def _with_cut(caption: str | None, shown: int, total: int, sort: str | None,
              full: str | None, what: str = "rows") -> str:
    """`caption` with what a cut table leaves out: "top 8 of 10 causes by |change|; all in
    `x.csv`"."""
    cut = (f"top {shown} of {total} {what} by {sort}" if sort else
           f"first {shown} of {total} {what}")
    where = f"; all {total} in `{full}`" if full else ""
    return f"{caption + ' — ' if caption else ''}{cut}{where}"


def show_figure(fig: Figure, output_dir: str | os.PathLike[str], name: str) -> Path:
    """Save `fig` as `<name>.png` into `output_dir`, display it, and return the path."""
    import matplotlib.pyplot as plt

    path = Path(output_dir) / f"{name}.png"
    fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight")
    _display(fig)
    plt.close(fig)  # shown once, here, not again by the inline backend at the cell's end
    return path


# ----------------------------------------------------------------------------- paired profile
def timeline_pair(run: Run, pair: Sequence[RunEntry] | None
                  ) -> tuple[ArmTimeline, ArmTimeline] | None:
    """The timelines of the profiled pair (baseline, candidate) from its traces; None when
    the pair or a trace directory is missing."""
    from residency.analysis.timeline import arm_timeline
    from residency.evidence.runs import load_run_traces

    if not pair or len(pair) != 2 or any(e.trace_dir is None for e in pair):
        return None
    b, c = (arm_timeline(load_run_traces(run, e), arm=e.arm, device_kind=run.device_kind)
            for e in pair)
    return b, c


def write_timeline(run: Run, pair: Sequence[RunEntry] | None,
                   output_dir: str | os.PathLike[str], *, name: str = "timeline"
                   ) -> Path | None:
    """The timeline figure of the profiled pair, saved and displayed; None (and a line
    saying why) without traces."""
    from residency.reports.plots import timeline_figure

    pair_tl = timeline_pair(run, pair)
    if pair_tl is None:
        print("No timeline: the profiled pair recorded no traces.")
        return None
    return show_figure(timeline_figure(*pair_tl, injection=run.injection), output_dir, name)


def _pair_traces(run: Run, pair: Sequence[RunEntry] | None) -> tuple[Any, Any] | None:
    from residency.evidence.runs import load_run_traces

    if not pair or len(pair) != 2 or any(e.trace_dir is None for e in pair):
        return None
    return load_run_traces(run, pair[0]), load_run_traces(run, pair[1])


def write_causes(run: Run, pair: Sequence[RunEntry] | None,
                 output_dir: str | os.PathLike[str], *, rows: int = 8,
                 name: str = "idle_by_cause") -> Path | None:
    """All-rank no-device-task time of each arm of the profiled pair by the host range
    running during it (`residency.analysis.causes.idle_by_cause`, innermost range): per cause,
    baseline, candidate and their difference (`residency.analysis.causes.cause_diff`). The
    table shows the `rows` largest changes by size (either direction) first; when it is cut,
    the caption says "top N of M causes" and one row sums the causes left out, and a last
    row gives each arm's total (its all-rank no-device-task time), so the shown rows add up
    to it. Every cause of both arms is saved as `<name>.csv` and the difference as
    `<name>_diff.csv`; None without traces."""
    from residency.analysis.causes import cause_diff, idle_by_cause
    from residency.evidence.derived import cause_sums, ranked_causes

    traces = _pair_traces(run, pair)
    if traces is None or pair is None:
        print("No idle-by-cause table: the profiled pair recorded no traces.")
        return None
    frames = [idle_by_cause(t).assign(arm=e.arm) for e, t in zip(pair, traces, strict=True)]
    full = pd.concat(frames, ignore_index=True)
    path = Path(output_dir) / f"{name}.csv"
    humanize.write_csv(full, path)
    diff = cause_diff(*frames)
    humanize.write_csv(diff, Path(output_dir) / f"{name}_diff.csv")
    columns = {"baseline_idle_ms": "baseline (ms)", "candidate_idle_ms": "candidate (ms)",
               "delta_idle_ms": "candidate − baseline (ms)"}
    shown, rest = ranked_causes(diff, rows)
    extra = []
    if len(rest):
        extra.append({"cause": f"({len(rest)} other causes)", "kind": "",
                      **cause_sums(rest, columns)})
    extra.append({"cause": "total (all-rank no-device-task time)", "kind": "",
                  **cause_sums(diff, columns)})
    table = pd.concat([shown[["cause", "kind", *columns]], pd.DataFrame(extra)],
                      ignore_index=True).rename(columns=columns)
    label = devices.label(run.device_kind, run.injection)
    head = (f"{run.device_kind} ({label}): all-rank no-device-task "
            "time by cause (innermost host range, ms), profiled pair, n = 1 run per arm, the "
            "largest changes by size first")
    if len(rest):
        head = _with_cut(head, len(shown), len(diff), "|candidate − baseline|", None,
                         "causes") + f", the other {len(rest)} summed in one row"
    show_table(table, max_rows=len(table),
               caption=f"{head}; per arm in `{path.name}`, the difference in `{name}_diff.csv`")
    return path


def write_trace_diff(run: Run, pair: Sequence[RunEntry] | None,
                     output_dir: str | os.PathLike[str], *, rows: int = 12,
                     name: str = "trace_diff") -> Path | None:
    """Baseline vs candidate device tasks of the profiled pair per phase and task-name group
    (`residency.analysis.tracediff.trace_diff`), largest change first: `rows` displayed, all saved
    as
    `<name>.csv`; None without traces."""
    from residency.analysis.tracediff import trace_diff

    traces = _pair_traces(run, pair)
    if traces is None:
        print("No trace diff: the profiled pair recorded no traces.")
        return None
    diff = trace_diff(*traces)
    path = Path(output_dir) / f"{name}.csv"
    humanize.write_csv(diff, path)
    label = devices.label(run.device_kind, run.injection)
    show_table(diff, max_rows=rows, sort="|delta (ms)|", full=path.name,
               caption=f"{run.device_kind} ({label}):"
               " device tasks, baseline vs candidate (ms), per phase and task-name group, "
               "profiled pair, n = 1 run per arm, largest change first")
    return path


def _origin_ns(traces: Any, memory: pd.DataFrame) -> int:
    """Time zero of an arm's memory panels: its earliest request marker, else its first
    memory record."""
    from residency.analysis.timeline import REQUEST_MARKER

    starts = [int(t.ranges[t.range_names == REQUEST_MARKER, 0].min())
              for t in traces.ranks.values() if (t.range_names == REQUEST_MARKER).any()]
    return min(starts) if starts else int(memory["ts_ns"].min()) if len(memory) else 0


def write_memory_timeline(run: Run, pair: Sequence[RunEntry] | None,
                          output_dir: str | os.PathLike[str], *,
                          name: str = "memory_timeline") -> Path | None:
    """Device memory over time in the profiled pair's traces (`residency.traces.memory`): per arm
    and
    rank the caching allocator's reserved and allocated bytes with the release markers, saved
    as `<name>.png` and displayed, every record as `<name>.csv`, and what each release handed
    back as `<name>_releases.csv` with a small table per arm and release kind. None, with a
    line saying why, when the pair has no traces or its traces hold no memory records."""
    from residency.reports.plots import memory_timeline_figure
    from residency.traces.memory import (
        allocator_memory,
        memory_timeline,
        release_drops,
        release_markers,
    )

    head = f"{run.device_kind} ({devices.label(run.device_kind, run.injection)})"
    traces = _pair_traces(run, pair)
    if traces is None or pair is None:
        print("No memory timeline: the profiled pair recorded no traces.")
        return None
    memory, releases, origins, drops = {}, {}, {}, []
    for entry, t in zip(pair, traces, strict=True):
        memory[entry.arm] = allocator_memory(memory_timeline(t))
        releases[entry.arm] = release_markers(t)
        origins[entry.arm] = _origin_ns(t, memory[entry.arm])
        drops.append(release_drops(memory[entry.arm], releases[entry.arm])
                     .assign(arm=entry.arm))
    if all(m.empty for m in memory.values()):
        print(f"No memory timeline: the profiled pair's traces ({head}) hold no device-memory "
              "records. torch.profiler writes them with profile_memory=True ([memory] events), "
              "torch-npu as ASCEND_PROFILER_OUTPUT/memory_record.csv (MEMORY_RECORD in its "
              "database export), the emulated NPU's export from its allocator; traces "
              "recorded before the profilers did so have none.")
        return None
    out = Path(output_dir)
    humanize.write_csv(pd.concat([m.assign(arm=a) for a, m in memory.items()],
                                 ignore_index=True), out / f"{name}.csv")
    released = pd.concat(drops, ignore_index=True)
    humanize.write_csv(released, out / f"{name}_releases.csv")
    files = {str(f) for m in memory.values() for f in m["source"].unique()}
    table = ("the database's MEMORY_RECORD" if any(f.endswith(".db") for f in files)
             else "memory_record.csv")
    source = ("Kineto [memory] events" if traces[0].format == "kineto"
              else f"torch-npu {table}, component PTA")
    path = show_figure(memory_timeline_figure(memory, releases, origins,
                                              device_kind=run.device_kind, source=source,
                                              injection=run.injection),
                       out, name)
    if len(released):
        kind = released["name"].str.extract(r"\[(\w+)\]", expand=False).fillna("other")
        summary = (released.assign(kind=kind)
                   .groupby(["arm", "kind"], sort=True)
                   .agg(releases=("name", "size"),
                        with_records=("released_bytes", "count"),
                        released=("released_bytes", "sum"))
                   .reset_index())
        summary["released"] = [bytes_or_text(int(v)) if v >= 0 else
                               f"-{bytes_or_text(int(-v))}" for v in summary["released"]]
        show_table(summary.rename(columns={"with_records": "with a record before",
                                           "released": "reserved memory handed back"}),
                   caption=f"{head}: reserved memory the caching allocator handed back during "
                   f"the release markers, summed over ranks, profiled pair, n = 1 run per "
                   f"arm; per marker in `{name}_releases.csv`")
    return path


def decisions_frame(run: Run, *, warmup: bool = False) -> pd.DataFrame:
    """Every recorded policy call of the run's measured runs (warm-up requests only with
    `warmup`), one row each, with the run's name in `run`."""
    from residency.rundir.assignment import assigned_decisions

    frames = [assigned_decisions(run, e, warmup=warmup).assign(run=e.name, arm=e.arm)
              for e in run.runs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "arm", "rank", "kind", "outcome", "start_ns", "reserved", "allocated",
                 "free", "total"])


def write_memory(run: Run, output_dir: str | os.PathLike[str], *, name: str = "memory"
                 ) -> Path:
    """The memory figure (reserved/allocated bytes at each policy call of the measured
    requests against the bounds the calls recorded), saved and displayed."""
    from residency.reports.plots import memory_figure

    fig = memory_figure(decisions_frame(run), device_kind=run.device_kind,
                        injection=run.injection)
    return show_figure(fig, output_dir, name)


def e2e_pairs(ev: Any) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(profiled, unprofiled) client E2E lists per arm of an `Evidence` (empty without)."""
    def lists(key: str) -> dict[str, list[float]]:
        a = ev.get(key)
        return {arm: list(a.values[arm]) if a else [] for arm in (BASELINE, CANDIDATE)}

    return lists("e2e_profiled"), lists("e2e_unprofiled")


def write_e2e(profiled: Mapping[str, Sequence[float]],
              unprofiled: Mapping[str, Sequence[float]], *, device_kind: str,
              output_dir: str | os.PathLike[str], name: str = "e2e",
              aa_spread: float | None = None, injection: str | None = None) -> Path:
    """The E2E slopegraph (profiled and unprofiled pairs, paired deltas; with `aa_spread`,
    the A/A noise band on the deltas), saved and displayed."""
    from residency.reports.plots import e2e_slopegraph

    return show_figure(e2e_slopegraph(profiled, unprofiled, device_kind=device_kind,
                                      aa_spread=aa_spread, injection=injection),
                       output_dir, name)


def aa_spread(ev: Any) -> float | None:
    """The A/A noise (median |delta|, s) of an `Evidence`, None without an A/A run."""
    a = ev.get("e2e_aa")
    return None if a is None else float(a.detail["spread_s"])


# ----------------------------------------------------------------------------- what-if
def _own_setting(frame: pd.DataFrame, own: tuple[float, float] | None
                 ) -> tuple[float, float] | None:
    if own is not None:
        return own
    settings = frame.attrs.get("own_settings") or []
    return tuple(settings[0]) if settings else None  # type: ignore[return-value]


def write_whatif(grids: Sequence[pd.DataFrame], *, output_dir: str | os.PathLike[str],
                 policy: str = "bounded", own: tuple[float, float] | None = None,
                 name: str = "whatif") -> Path:
    """Every setting of `grids` (`residency.analysis.whatif.replay_run` frames, one per policy)
    saved
    at full precision as `<name>_grid.csv`, and for people only the run's own setting (`own`,
    default: the grid's recorded bounds) and its neighbours: retention of `policy`. Returns
    the CSV path."""
    from residency.analysis.whatif import totals
    from residency.reports.plots import neighbour_table

    path = Path(output_dir) / f"{name}_grid.csv"
    humanize.write_csv(pd.concat(list(grids), ignore_index=True), path)
    chosen = next((g for g in grids if len(g) and g["policy"].iloc[0] == policy), None)
    own = _own_setting(chosen, own) if chosen is not None else own
    if own is not None and chosen is not None:
        show_table(neighbour_table(totals(chosen), own),
                   caption=f"{policy} policy: retention at the run's own bounds and their "
                   f"neighbours (measured requests); every setting, both policies, per rank: "
                   f"{path.name}", formats={"retention rate": humanize.percent})
    return path


def write_effect(effect: pd.DataFrame, *, output_dir: str | os.PathLike[str],
                 own: tuple[float, float] | None = None, name: str = "whatif_effect") -> Path:
    """The estimated effect per setting (`residency.evidence.whatif.EffectEstimate.table`) saved at
    full precision as `<name>.csv`, and for people the run's own setting (default: the one
    marked `own`) and its neighbours. Returns the CSV path."""
    from residency.reports.plots import neighbour_rows

    path = Path(output_dir) / f"{name}.csv"
    humanize.write_csv(effect, path)
    if own is None and effect["own"].any():
        row = effect[effect["own"].astype(bool)].iloc[0]
        own = (float(row["max_cached_fraction"]), float(row["min_free_fraction"]))
    if own is None:
        return path
    near = neighbour_rows(effect, own)
    show_table(pd.DataFrame({
        "max cached fraction": near["max_cached_fraction"],
        "min free fraction": near["min_free_fraction"],
        "measured released / calls": [f"{int(r)}/{int(c)}" for r, c in
                                      zip(near["released"], near["calls"], strict=True)],
        "estimated normal-call time (ms)": near["estimated_ms"],
        "range (ms)": [humanize.span_text(lo, hi, "") for lo, hi in
                       zip(near["estimated_low_ms"], near["estimated_high_ms"], strict=True)],
        "vs own setting (ms)": near["delta_vs_own_ms"],
        "own setting": ["yes" if o else "" for o in near["own"]]}),
        caption=f"estimated normal-call time at the run's own bounds and their neighbours "
        f"(a model, summed over ranks); every setting: {path.name}")
    return path


# ----------------------------------------------------------------------------- text
def show_note(text: str) -> None:
    """Display a Markdown note as its owner wrote it (a notebook's statistical notes:
    `residency.notebook.outputs.statistical_note`)."""
    from IPython.display import Markdown

    _display(Markdown(text))


def show_text(text: str) -> None:
    """Display `text` as a plain paragraph (no Markdown: `*` and `_` stay characters), as its
    owner wrote it."""
    from html import escape

    from IPython.display import HTML

    _display(HTML(f"<p>{escape(text)}</p>"))


def bytes_or_text(value: Any) -> str:
    """A cell that holds a byte count (digits) as binary units, anything else as is."""
    text = str(value)
    return humanize.bytes_text(int(text)) if text.isdigit() else text


def show_probe_banner(probes: Mapping[str, Mapping[str, Any]], source: str) -> None:
    """The API notebook's banner: the recorded run's, or for a live probe the probed device
    kind with this process's versions."""
    from residency.reports.banner import live_manifest
    from residency.rundir.run import load_run

    if str(source) != "run":
        show_banner(load_run(source))
        return
    from residency.rundir.run import versions  # no torch at import

    label, first = next(iter(probes.items()))
    show_banner(live_manifest(str(first.get("device_kind", label)), versions=versions()))
