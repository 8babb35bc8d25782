"""All-rank no-device-task time and marker attribution over a loaded `TraceSet`.

Definitions (``shared/BRIEF.md``), all inside one *window*, intervals half-open, int64 ns:

* window: by default the earliest device-task start to the latest device-task end over all
  ranks; with `window_marker`, the union over ranks of the host ranges whose name matches it
  (possibly several intervals; `window_ns` reports their hull).
* per rank: ``busy_ns`` = union of the rank's device tasks within the window; ``idle_ns`` =
  window minus that. ``span_idle_ns`` is HolisticTraceAnalysis's per-rank idle (the rank's
  own device-task span minus their union, whole trace), for comparison.
* all-rank idle: window minus the union over ranks of device busy.
* markers: the union over ranks of host ranges whose name matches `marker` (``re.search``),
  clipped to the window, so every figure of a summary lies inside the same window;
  ``marker_idle_intersection_ns`` is its measure intersected with all-rank idle.

Analyses return values and never print; `residency.cli` is the ``residency idle`` front end.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from residency import intervals as iv

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces import RankTimeline, TraceSet

__all__ = ["IdleSummary", "RankIdle", "format_summary", "idle_summary",
           "per_rank_idle"]


@dataclasses.dataclass(frozen=True)
class RankIdle:
    """One rank's figures inside the window (ns); `markers` counts its matching host ranges
    that overlap the window."""

    rank: int
    busy_ns: int
    idle_ns: int
    device_tasks: int
    markers: int
    span_idle_ns: int


@dataclasses.dataclass(frozen=True)
class IdleSummary:
    """All-rank idle and marker attribution of one trace set; `to_dict` is the CLI's JSON."""

    format: str
    ranks: tuple[int, ...]
    window_ns: tuple[int, int]
    window_measure_ns: int
    all_rank_idle_ns: int
    marker_ns: int
    marker_idle_intersection_ns: int
    rejected_events: int
    per_rank: tuple[RankIdle, ...]
    marker: str | None = None
    window_marker: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``residency idle --json`` object."""
        return {
            "format": self.format, "ranks": list(self.ranks), "window_ns": list(self.window_ns),
            "all_rank_idle_ns": self.all_rank_idle_ns, "marker_ns": self.marker_ns,
            "marker_idle_intersection_ns": self.marker_idle_intersection_ns,
            "rejected_events": self.rejected_events,
            "per_rank": {str(r.rank): {"busy_ns": r.busy_ns, "idle_ns": r.idle_ns,
                                       "device_tasks": r.device_tasks, "markers": r.markers}
                         for r in self.per_rank},
        }


def _compile(pattern: str, option: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"The value for `{option}` must be a regular expression, but "
                         f"{pattern!r} was passed ({exc}).") from None


def _matching(t: RankTimeline, rx: re.Pattern[str]) -> iv.Intervals:
    """The host ranges of `t` whose name matches `rx`, as an interval array (not merged)."""
    names = t.range_names.tolist()
    hit = {n: rx.search(n) is not None for n in set(names)}  # each distinct name once
    return t.ranges[np.fromiter(map(hit.__getitem__, names), bool, len(names))]


def _overlapping(ranges: iv.Intervals, window: iv.Intervals) -> int:
    """How many of `ranges` overlap the normalised `window` (or lie inside it)."""
    if not len(ranges) or not len(window):
        return 0
    i = np.searchsorted(window[:, 1], ranges[:, 0], side="right")
    ok = i < len(window)
    ok[ok] = window[i[ok], 0] < ranges[ok, 1]
    return int(ok.sum())


def _window(traces: TraceSet, window_marker: str | None) -> iv.Intervals:
    if window_marker is not None:
        rx = _compile(window_marker, "window_marker")
        w = iv.union(*(_matching(t, rx) for t in traces.ranks.values()))
        if not len(w):
            raise ValueError(f"no host range matches window_marker {window_marker!r} in any "
                             "rank, so there is no window.")
        return w
    busy = [t.device for t in traces.ranks.values() if len(t.device)]
    if not busy:
        raise ValueError("no rank has device tasks, so there is no default window; pass "
                         "window_marker to choose one.")
    return iv.as_intervals([[min(int(b[:, 0].min()) for b in busy),
                             max(int(b[:, 1].max()) for b in busy)]])


def idle_summary(traces: TraceSet, *, marker: str | None = None,
                 window_marker: str | None = None) -> IdleSummary:
    """All-rank idle, marker time and their intersection, per rank busy/idle (module doc).

    Raises:
        ValueError: a pattern that is not a regular expression, a `window_marker` that matches
            nothing, or no device task in any rank when no `window_marker` is given.
    """
    window = _window(traces, window_marker)
    length = iv.measure(window)
    rx = _compile(marker, "marker") if marker is not None else None
    busy_sets, marker_sets, rows = [], [], []
    for rank, t in traces.ranks.items():
        busy = iv.merge(t.device)
        busy_sets.append(busy)
        mine = _matching(t, rx) if rx is not None else np.empty((0, 2), np.int64)
        marker_sets.append(mine)
        busy_in = iv.measure(iv.intersection(busy, window))
        span = int(busy[-1, 1] - busy[0, 0]) if len(busy) else 0
        rows.append(RankIdle(rank, busy_in, length - busy_in, t.device_tasks,
                             _overlapping(mine, window), span - iv.measure(busy)))
    idle = iv.complement(iv.union(*busy_sets), window)
    markers = iv.intersection(iv.union(*marker_sets), window)
    return IdleSummary(
        format=traces.format, ranks=tuple(traces.ranks), window_ns=(int(window[0, 0]),
                                                                   int(window[-1, 1])),
        window_measure_ns=length, all_rank_idle_ns=iv.measure(idle),
        marker_ns=iv.measure(markers),
        marker_idle_intersection_ns=iv.measure(iv.intersection(markers, idle)),
        rejected_events=traces.rejected_events, per_rank=tuple(rows), marker=marker,
        window_marker=window_marker)


def per_rank_idle(traces: TraceSet, *, marker: str | None = None,
                  window_marker: str | None = None) -> pd.DataFrame:
    """One row per rank: ``rank, busy_ns, idle_ns, device_tasks, markers, span_idle_ns,
    source`` (window and markers as in `idle_summary`)."""
    import pandas as pd

    summary = idle_summary(traces, marker=marker, window_marker=window_marker)
    frame = pd.DataFrame([dataclasses.asdict(r) for r in summary.per_rank])
    frame["source"] = [str(traces.ranks[r].source) for r in frame["rank"]]
    return frame


def format_summary(s: IdleSummary) -> list[str]:
    """A readable table in milliseconds, as lines."""
    def ms(ns: int, width: int = 12) -> str:
        return f"{ns / 1e6:{width}.3f}"

    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.1f} %" if whole else "n/a"

    how = (f"union of host ranges matching /{s.window_marker}/" if s.window_marker is not None
           else "earliest to latest device task")
    rows = [("window", s.window_measure_ns, f"{how}; [{s.window_ns[0]}, {s.window_ns[1]}) ns"),
            ("all-rank idle", s.all_rank_idle_ns,
             f"{pct(s.all_rank_idle_ns, s.window_measure_ns)} of the window")]
    if s.marker is not None:
        rows += [("markers", s.marker_ns, f"/{s.marker}/, union over ranks, in the window"),
                 ("markers in all-rank idle", s.marker_idle_intersection_ns,
                  f"{pct(s.marker_idle_intersection_ns, s.marker_ns)} of marker time")]
    lines = [f"{s.format} traces, {len(s.ranks)} ranks ({', '.join(map(str, s.ranks))})"]
    lines += [f"  {label:<26}{ms(ns)} ms  ({note})" for label, ns, note in rows]
    lines += [f"  {'rejected events':<26}{s.rejected_events:12d}", "",
              f"{'rank':>6} {'busy_ms':>12} {'idle_ms':>12} {'device_tasks':>13} "
              f"{'markers':>8} {'span_idle_ms':>13}"]
    lines += [f"{r.rank:>6} {ms(r.busy_ns)} {ms(r.idle_ns)} {r.device_tasks:>13} "
              f"{r.markers:>8} {ms(r.span_idle_ns, 13)}" for r in s.per_rank]
    lines += ["", f"Unit: milliseconds; n = {len(s.ranks)} ranks. busy/idle: inside the window; "
              "all-rank idle: no rank runs a device task;", "span_idle: the rank's own "
              "device-task span minus its busy time (HolisticTraceAnalysis's idle)."]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m residency.idle PATH ...``, the same as ``residency idle PATH ...``."""
    from residency.cli import main as cli_main

    return cli_main(["idle", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
