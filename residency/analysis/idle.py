"""All-rank no-device-task time and marker attribution over a loaded `TraceSet`.

Definitions (``shared/BRIEF.md``), all inside one *window*, intervals half-open, int64 ns:

* window: by default the earliest device-task start to the latest device-task end over all
  ranks; with `window_marker`, the union over ranks of the host ranges whose name matches it
  (possibly several intervals; `window_ns` reports their hull).
* busy: the device tasks that count as work under a busy definition (`residency.traces.busy`:
  ``ascend`` by default for torch-npu, waits and records excluded; ``msprof``; ``kineto`` by
  default for Kineto; ``all``); every figure below uses only those tasks.
* per rank: ``busy_ns`` = union of the rank's busy device tasks within the window; ``idle_ns``
  = window minus that; ``excluded_tasks``: counts by type of the tasks the definition leaves
  out; ``reported_free_ns``: the trace's own ``Overlap Analysis`` ``Free`` time in the window
  (torch-npu text exports; None elsewhere). ``span_idle_ns`` is HolisticTraceAnalysis's
  per-rank idle (the rank's own busy span minus its busy union, whole trace), for comparison.
* all-rank idle: window minus the union over ranks of device busy.
* markers: the union over ranks of host ranges whose name matches `marker` (``re.search``),
  clipped to the window, so every figure of a summary lies inside the same window;
  ``marker_idle_intersection_ns`` is its measure intersected with all-rank idle.

Analyses return values and never print; `residency.cli.main` is the ``residency idle`` front end.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from residency.traces import busy as busydef
from residency.traces import intervals as iv

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import RankTimeline, TraceSet

__all__ = ["IdleSummary", "RankIdle", "all_rank_idle_intervals", "busy_intervals",
           "format_summary", "idle_summary", "per_rank_idle"]


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
    excluded_tasks: dict[str, int] = dataclasses.field(default_factory=dict)
    reported_free_ns: int | None = None
    unknown_tasks: dict[str, int] = dataclasses.field(default_factory=dict)
    steps: tuple[Any, ...] = ()  # residency.traces.ascend.StepCheck: torch-npu's per-step figures


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
    busy_definition: str = "all"

    def to_dict(self) -> dict[str, Any]:
        """The ``residency idle --json`` object."""
        return {
            "format": self.format, "busy_definition": self.busy_definition,
            "ranks": list(self.ranks), "window_ns": list(self.window_ns),
            "window_measure_ns": self.window_measure_ns,
            "window_marker": self.window_marker, "marker": self.marker,
            "all_rank_idle_ns": self.all_rank_idle_ns, "marker_ns": self.marker_ns,
            "marker_idle_intersection_ns": self.marker_idle_intersection_ns,
            "rejected_events": self.rejected_events,
            "per_rank": {str(r.rank): {"busy_ns": r.busy_ns, "idle_ns": r.idle_ns,
                                       "device_tasks": r.device_tasks, "markers": r.markers,
                                       "span_idle_ns": r.span_idle_ns,
                                       "excluded_tasks": r.excluded_tasks,
                                       "unknown_tasks": r.unknown_tasks,
                                       "reported_free_ns": r.reported_free_ns,
                                       "torch_npu_steps": [c.to_dict() for c in r.steps]}
                         for r in self.per_rank},
        }


def _compile(pattern: str, option: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise busydef.OptionError(option, "The value for {option} must be a regular "
                                  "expression, but {0!r} was passed ({1}).", pattern,
                                  exc) from None


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


def _window(traces: TraceSet, window_marker: str | None,
            busy: dict[int, iv.Intervals]) -> iv.Intervals:
    if window_marker is not None:
        rx = _compile(window_marker, "window_marker")
        w = iv.union(*(_matching(t, rx) for t in traces.ranks.values()))
        if not len(w):
            raise busydef.OptionError("window_marker", "no host range matches {option} "
                                      "{0!r} in any rank, so there is no window.",
                                      window_marker)
        return w
    spans = [b for b in busy.values() if len(b)]  # the busy tasks as recorded (not merged)
    if not spans:
        raise busydef.OptionError("window_marker", "no rank has device tasks that count as "
                                  "busy, so there is no default window; pass {option} to "
                                  "choose one (or another busy definition).")
    return iv.as_intervals([[min(int(b[:, 0].min()) for b in spans),
                             max(int(b[:, 1].max()) for b in spans)]])


def busy_intervals(traces: TraceSet, *, busy: str | None = None,
                   warn: bool = True) -> tuple[busydef.BusyDefinition, dict[int, iv.Intervals],
                                               dict[int, iv.Intervals],
                                               dict[int, dict[str, int]]]:
    """The busy definition `busy` resolves to (`residency.traces.busy.resolve`), each rank's busy
    tasks as recorded and merged, and each rank's excluded task counts by type. With `warn`,
    tasks of unknown types (counted busy) are reported in one warning with their counts.

    Raises:
        ValueError: an unknown `busy` name.
    """
    definition, raw, merged, excluded, _ = _busy_details(traces, busy, warn)
    return definition, raw, merged, excluded


def _busy_details(traces: TraceSet, busy: str | None, warn: bool
                  ) -> tuple[busydef.BusyDefinition, dict[int, iv.Intervals],
                             dict[int, iv.Intervals], dict[int, dict[str, int]],
                             dict[int, dict[str, int]]]:
    """`busy_intervals`, and each rank's counts of tasks of unknown types (counted busy).
    A type the trace's own Overlap Analysis counts busy on every rank that has it is not
    warned about (`residency.traces.busy.BusyTasks.confirmed`)."""
    definition = busydef.resolve(busy, traces.format)
    raw, merged, excluded, unknown_by_rank = {}, {}, {}, {}
    unknown, unconfirmed = Counter(), set()
    for rank, t in traces.ranks.items():
        chosen = busydef.busy_tasks(t, definition, traces.format)
        raw[rank] = chosen.rows
        merged[rank] = iv.merge(raw[rank])
        excluded[rank] = chosen.excluded
        unknown_by_rank[rank] = chosen.unknown
        unknown.update(chosen.unknown)
        unconfirmed |= set(chosen.unknown) - chosen.confirmed
    unknown = Counter({ty: n for ty, n in unknown.items() if ty in unconfirmed})
    if warn and unknown and definition.name != "all":
        listed = ", ".join(f"{_type_label(ty)} x {n}" for ty, n in sorted(unknown.items()))
        warnings.warn(f"device tasks of types not in residency.traces.busy's lists were counted "
                      f"busy ({definition.name}): {listed}", UserWarning, stacklevel=3)
    return definition, raw, merged, excluded, unknown_by_rank



def _type_label(task_type: str) -> str:
    return repr(task_type) if task_type else "(no Task Type)"


def all_rank_idle_intervals(traces: TraceSet, *, busy: str | None = None,
                            window_marker: str | None = None) -> iv.Intervals:
    """The all-rank no-device-task time as normalised intervals (window as in `idle_summary`).

    Raises:
        ValueError: as `idle_summary`.
    """
    _, raw, merged, _ = busy_intervals(traces, busy=busy, warn=False)
    window = _window(traces, window_marker, raw)
    return iv.complement(iv.union(*merged.values()), window)


def idle_summary(traces: TraceSet, *, marker: str | None = None,
                 window_marker: str | None = None, busy: str | None = None,
                 allow_no_device_tasks: bool = False) -> IdleSummary:
    """All-rank idle, marker time and their intersection, per rank busy/idle (module doc),
    under the busy definition `busy` (default: the format's).

    Raises:
        ValueError (`residency.traces.busy.OptionError`, naming the parameter): a pattern that is
            not a regular expression, a `window_marker` that matches nothing, no busy device
            task in any rank when no `window_marker` is given, an unknown `busy` name or one
            that does not apply to the traces' format; no recognised device task in any rank
            at all (a trace of host activity only: the window would be 100 % idle), unless
            `allow_no_device_tasks`.

    Warns:
        UserWarning: device tasks of unknown types (counted busy) that the trace's own Overlap
            Analysis does not count busy; under ``msprof``, a rank whose idle time differs by
            more than 1 % from its ``Overlap Analysis`` Free time; a step whose Computing or
            Free time in torch-npu's ``step_trace_time.csv`` differs from ours by more than
            1 % (`residency.traces.ascend.step_checks`).
    """
    definition, raw, merged, excluded, unknown = _busy_details(traces, busy, True)
    if not allow_no_device_tasks and not any(t.device_tasks for t in traces.ranks.values()):
        hosts = sum(len(t.ranges) for t in traces.ranks.values())
        raise busydef.OptionError("allow_no_device_tasks", _NO_DEVICE_TASKS[traces.format],
                                  len(traces.ranks), hosts)
    window = _window(traces, window_marker, raw)
    length = iv.measure(window)
    rx = _compile(marker, "marker") if marker is not None else None
    busy_sets, marker_sets, rows = [], [], []
    for rank, t in traces.ranks.items():
        busy_set = merged[rank]
        busy_sets.append(busy_set)
        mine = _matching(t, rx) if rx is not None else np.empty((0, 2), np.int64)
        marker_sets.append(mine)
        busy_in = iv.measure(iv.intersection(busy_set, window))
        span = int(busy_set[-1, 1] - busy_set[0, 0]) if len(busy_set) else 0
        free = _reported_free(t, window)
        if free is not None and definition.name == "msprof":
            _check_free(t, busy_set, window, free)
        steps = _step_checks(t) if traces.format == "ascend" else ()
        rows.append(RankIdle(rank, busy_in, length - busy_in, t.device_tasks,
                             _overlapping(mine, window), span - iv.measure(busy_set),
                             excluded[rank], free, unknown[rank], steps))
    idle = iv.complement(iv.union(*busy_sets), window)
    markers = iv.intersection(iv.union(*marker_sets), window)
    return IdleSummary(
        format=traces.format, ranks=tuple(traces.ranks), window_ns=(int(window[0, 0]),
                                                                   int(window[-1, 1])),
        window_measure_ns=length, all_rank_idle_ns=iv.measure(idle),
        marker_ns=iv.measure(markers),
        marker_idle_intersection_ns=iv.measure(iv.intersection(markers, idle)),
        rejected_events=traces.rejected_events, per_rank=tuple(rows), marker=marker,
        window_marker=window_marker, busy_definition=definition.name)


_NO_DEVICE_TASKS = {
    "kineto": "no device task recognised in any of the {0} rank(s) ({1} host ranges "
              "read): the trace records host activity only (a CPU-only profile, or an "
              "accelerator whose device work Kineto records under no category residency "
              "reads: kernel, gpu_memcpy, gpu_memset, mtia_ccp_events; HPU traces have "
              "none), so every window would be 100 % idle; pass {option} to report it anyway",
    "ascend": "no device task in any of the {0} rank(s) ({1} host ranges read): no "
              "'Ascend Hardware' tasks (was the profile taken with NPU activities?), so every "
              "window would be 100 % idle; pass {option} to report it anyway",
}


def _step_checks(t: RankTimeline) -> tuple[Any, ...]:
    """torch-npu's per-step Computing/Free beside ours (`residency.traces.ascend.step_checks`), each
    disagreement over 1 % warned about, quoting both."""
    from residency.traces import ascend

    if not (t.source.parent / ascend.STEP_TRACE).is_file():
        return ()
    computing = iv.merge(busydef.class_rows(t, frozenset({"compute", "unknown"})))
    work = iv.merge(busydef.class_rows(t, frozenset({"compute", "unknown", "communication"})))
    free = (iv.complement(work, [[int(work[0, 0]), int(work[-1, 1])]]) if len(work)
            else np.empty((0, 2), np.int64))
    checks = tuple(ascend.step_checks(t.source.parent, computing, free))
    off = []
    for c in checks:
        for what, theirs, ours in (("Computing", c.reported_computing_ns, c.computing_ns),
                                   ("Free", c.reported_free_ns, c.free_ns)):
            if ours is not None and abs(ours - theirs) > 0.01 * max(ours, theirs):
                off.append(f"step {c.step or '(none)'} {what} {theirs / 1e6:.6f} ms in "
                           f"step_trace_time.csv vs {ours / 1e6:.6f} ms here")
    if off:
        warnings.warn(f"rank {t.rank}: torch-npu's own figures differ by more than 1 %: "
                      + "; ".join(off[:6]) + ("; ..." if len(off) > 6 else ""),
                      UserWarning, stacklevel=3)
    return checks


def _reported_free(t: RankTimeline, window: iv.Intervals) -> int | None:
    """The ``Free`` slices of the rank's ``Overlap Analysis`` lane inside the window."""
    if not len(t.overlap):
        return None
    free = t.overlap[t.overlap_names == "Free"]
    return iv.measure(iv.intersection(iv.merge(free), window))


def _check_free(t: RankTimeline, busy: iv.Intervals, window: iv.Intervals, free: int) -> None:
    """Warn when our idle time, over the span of the Overlap Analysis lane (its slices tile
    it), differs from its Free time by more than 1 %."""
    span = [[int(t.overlap[:, 0].min()), int(t.overlap[:, 1].max())]]
    covered = iv.intersection(span, window)
    ours = iv.measure(iv.complement(busy, covered)) if len(covered) else 0
    if abs(ours - free) > 0.01 * max(ours, free):
        warnings.warn(f"rank {t.rank}: idle time under the msprof definition ({ours / 1e6:.6f} "
                      f"ms over the Overlap Analysis span) differs from the trace's own Free "
                      f"time ({free / 1e6:.6f} ms) by more than 1 %; the trace's Task Types or "
                      "Communication lane may not match residency.traces.busy's lists",
                      UserWarning, stacklevel=3)


def per_rank_idle(traces: TraceSet, *, marker: str | None = None,
                  window_marker: str | None = None, busy: str | None = None) -> pd.DataFrame:
    """One row per rank: ``rank, busy_ns, idle_ns, device_tasks, markers, span_idle_ns,
    excluded_tasks, reported_free_ns, source`` (window, markers and busy definition as in
    `idle_summary`)."""
    import pandas as pd

    summary = idle_summary(traces, marker=marker, window_marker=window_marker, busy=busy)
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
           else "earliest to latest busy device task")
    rows = [("window", s.window_measure_ns, f"{how}; [{s.window_ns[0]}, {s.window_ns[1]}) ns"),
            ("all-rank no-device-task time", s.all_rank_idle_ns,
             f"{pct(s.all_rank_idle_ns, s.window_measure_ns)} of the window")]
    if s.marker is not None:
        rows += [("markers", s.marker_ns, f"/{s.marker}/, union over ranks, in the window"),
                 ("markers in that time", s.marker_idle_intersection_ns,
                  f"{pct(s.marker_idle_intersection_ns, s.marker_ns)} of marker time")]
    definition = busydef.DEFINITIONS.get(s.busy_definition)
    lines = [f"{s.format} traces, {len(s.ranks)} ranks ({', '.join(map(str, s.ranks))}); "
             f"busy: {definition or s.busy_definition}"]
    lines += [f"  {label:<30}{ms(ns)} ms  ({note})" for label, ns, note in rows]
    lines += [f"  {'rejected events':<30}{s.rejected_events:12d}", "",
              f"{'rank':>6} {'busy_ms':>12} {'idle_ms':>12} {'device_tasks':>13} "
              f"{'excluded':>9} {'markers':>8} {'span_idle_ms':>13} {'reported_free_ms':>17}"]
    lines += [f"{r.rank:>6} {ms(r.busy_ns)} {ms(r.idle_ns)} {r.device_tasks:>13} "
              f"{sum(r.excluded_tasks.values()):>9} {r.markers:>8} {ms(r.span_idle_ns, 13)} "
              f"{'n/a' if r.reported_free_ns is None else ms(r.reported_free_ns, 17):>17}"
              for r in s.per_rank]
    excluded = Counter()
    for r in s.per_rank:
        excluded.update(r.excluded_tasks)
    if excluded:
        lines += ["", "excluded from busy (all ranks): " + ", ".join(
            f"{_type_label(ty)} x {n}" for ty, n in sorted(excluded.items()))]
    for r in s.per_rank:
        if r.steps:
            lines += ["", f"torch-npu's own figures, rank {r.rank} (step_trace_time.csv vs "
                      "here, ms):", f"{'step':>8} {'computing':>12} {'here':>12} "
                      f"{'free':>12} {'here':>12}"]
            lines += [f"{c.step or '-':>8} {ms(c.reported_computing_ns)} "
                      f"{'n/a' if c.computing_ns is None else ms(c.computing_ns):>12} "
                      f"{ms(c.reported_free_ns)} "
                      f"{'n/a' if c.free_ns is None else ms(c.free_ns):>12}" for c in r.steps]
    unknown = Counter()
    for r in s.per_rank:
        unknown.update(r.unknown_tasks)
    if unknown:
        lines += ["", "counted busy, of types not in residency.traces.busy's lists (all ranks): "
                  + ", ".join(f"{_type_label(ty)} x {n}" for ty, n in sorted(unknown.items()))]
    lines += ["", f"Unit: milliseconds; n = {len(s.ranks)} ranks. busy/idle: inside the window, "
              "busy tasks only; all-rank no-device-task time: no rank runs a busy device task;",
              "excluded: device tasks the busy definition leaves out; span_idle: the rank's own "
              "busy span minus its busy time (HolisticTraceAnalysis's idle);",
              "reported_free: the trace's own Overlap Analysis Free time in the window "
              "(torch-npu text exports only)."]
    return lines
