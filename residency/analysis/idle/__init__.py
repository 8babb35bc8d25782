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

The package: `model` (the value objects), `reduce` (one rank's reduction where it is read, every
rank's here or on Dask through `residency.traces.parallel`, the all-rank busy union reduced on
the workers), `entries` (their cache entries), `checks` (the cross-checks against torch-npu's
own figures); this module is the front. Text for people: `residency.reports.idletext`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from residency.analysis.idle import entries
from residency.analysis.idle.checks import check_free, step_checks, warn_unknown
from residency.analysis.idle.model import IdleSummary, RankIdle, RankReduction
from residency.analysis.idle.reduce import (
    busy_union,
    compile_pattern,
    matching,
    rank_reduction,
    reduce_rank,
    reductions_at,
)
from residency.traces import busy as busydef
from residency.traces import intervals as iv

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import TraceSet

__all__ = ["IdleSummary", "RankIdle", "RankReduction", "all_rank_idle_intervals", "busy_intervals",
           "busy_union", "idle_summary", "idle_summary_at", "per_rank_idle", "rank_reduction",
           "reduce_rank", "reductions_at", "summarize"]


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
        rx = compile_pattern(window_marker, "window_marker")
        w = iv.union(*(matching(t, rx) for t in traces.ranks.values()))
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
    found: list[tuple[dict[str, int], frozenset[str]]] = []
    for rank, t in traces.ranks.items():
        chosen = busydef.busy_tasks(t, definition, traces.format)
        raw[rank] = chosen.rows
        merged[rank] = iv.merge(raw[rank])
        excluded[rank] = chosen.excluded
        unknown_by_rank[rank] = chosen.unknown
        found.append((chosen.unknown, chosen.confirmed))
    if warn:
        warn_unknown(definition, found)
    return definition, raw, merged, excluded, unknown_by_rank


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
            `allow_no_device_tasks` (the default window is then the ranks' recorded span:
            earliest to latest host range or device task).

    Warns:
        UserWarning: device tasks of unknown types (counted busy) that the trace's own Overlap
            Analysis does not count busy; under ``msprof``, a rank whose idle time differs by
            more than 1 % from its ``Overlap Analysis`` Free time; a step whose Computing or
            Free time in torch-npu's ``step_trace_time.csv`` differs from ours by more than
            1 % (`residency.traces.ascend.step_checks`).
    """
    definition = busydef.resolve(busy, traces.format)
    wrx = compile_pattern(window_marker, "window_marker") if window_marker is not None else None
    rx = compile_pattern(marker, "marker") if marker is not None else None
    reductions = [reduce_rank(t, definition, traces.format, rx, wrx)
                  for t in traces.ranks.values()]
    from residency.traces.files import sealed_reads

    with sealed_reads(getattr(traces, "seal", None)):  # torch-npu's CSVs: as sealed, too
        return summarize(traces.format, reductions, definition, marker=marker,
                         window_marker=window_marker,
                         allow_no_device_tasks=allow_no_device_tasks)


def summarize(fmt: str, reductions: Sequence[RankReduction],
              definition: busydef.BusyDefinition, *, marker: str | None = None,
              window_marker: str | None = None, warn: bool = True,
              allow_no_device_tasks: bool = False,
              busy_union: iv.Intervals | None = None) -> IdleSummary:
    """The `IdleSummary` of ranks' reductions (in rank order), as `idle_summary` computes it;
    `busy_union`: the union of every rank's busy intervals where it was reduced already (on
    the workers, `reductions_at`), else it is measured here from the ranks'.

    Raises:
        ValueError: as `idle_summary`.
    """
    if warn:
        warn_unknown(definition, [(r.unknown, r.confirmed) for r in reductions])
    if not allow_no_device_tasks and not any(r.device_tasks for r in reductions):
        hosts = sum(r.host_ranges for r in reductions)
        raise busydef.OptionError("allow_no_device_tasks", _NO_DEVICE_TASKS[fmt],
                                  len(reductions), hosts)
    basis = "busy tasks"
    if window_marker is not None:
        basis = "window marker"
        window = iv.union(*(r.window_ranges for r in reductions))
        if not len(window):
            raise busydef.OptionError("window_marker", "no host range matches {option} "
                                      "{0!r} in any rank, so there is no window.",
                                      window_marker)
    else:
        spans = [r.busy_bounds for r in reductions if r.busy_bounds is not None]
        if not spans and allow_no_device_tasks:  # what the ranks recorded, all of it idle
            spans, basis = [r.span for r in reductions if r.span is not None], "recorded span"
        if not spans:
            raise busydef.OptionError("window_marker", "no rank has device tasks that count "
                                      "as busy, so there is no default window; pass {option} "
                                      "to choose one (or another busy definition).")
        window = iv.as_intervals([[min(s for s, _ in spans), max(e for _, e in spans)]])
    length = iv.measure(window)
    rows = []
    for r in reductions:
        busy_in = iv.measure_union(r.busy, within=window)
        first_last = iv.bounds(r.busy)
        span = first_last[1] - first_last[0] if first_last is not None else 0
        free = (None if r.free is None else iv.measure(iv.intersection(r.free, window)))
        if free is not None and definition.name == "msprof":
            check_free(r, window, free)
        steps = step_checks(r) if fmt == "ascend" else ()
        rows.append(RankIdle(r.rank, busy_in, length - busy_in, r.device_tasks,
                             _overlapping(r.markers, window), span - iv.measure(r.busy),
                             r.excluded, free, r.unknown, steps))
    # all-rank idle = window - union of busy; markers (inside the window) & idle = markers -
    # (markers & union of busy): measured in a sweep, the union of every rank never built
    busy = [r.busy for r in reductions] if busy_union is None else [busy_union]
    markers = iv.intersection(iv.union(*(r.markers for r in reductions)), window)
    marker_ns = iv.measure(markers)
    return IdleSummary(
        format=fmt, ranks=tuple(r.rank for r in reductions),
        window_ns=(int(window[0, 0]), int(window[-1, 1])),
        window_measure_ns=length,
        all_rank_idle_ns=length - iv.measure_union(*busy, within=window),
        marker_ns=marker_ns,
        marker_idle_intersection_ns=marker_ns - iv.measure_union(*busy, within=markers),
        rejected_events=sum(r.rejected_events for r in reductions), per_rank=tuple(rows),
        marker=marker, window_marker=window_marker, busy_definition=definition.name,
        window_basis=basis)


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


def idle_summary_at(path: str | os.PathLike[str], *, marker: str | None = None,
                    window_marker: str | None = None, busy: str | None = None,
                    session: str | None = None, group: str | None = None, cache: bool = True,
                    scheduler: str | None = None, workers: int | None = None,
                    chunk_bytes: int | None = None, max_trace_bytes: int | None = None,
                    allow_no_device_tasks: bool = False) -> IdleSummary:
    """`idle_summary(load_traces(path, ...))`, computed rank by rank: each rank is parsed and
    reduced (`reduce_rank`) where it is read, and only its reduction (busy union, marker
    ranges) comes back, so memory does not grow with the ranks' columns. The same figures to
    the nanosecond, the same errors and warnings.

    Ranks are read in worker processes here (as `load_traces` parses), or, with `scheduler`,
    as tasks of a Dask cluster (``"local"``: a `distributed.LocalCluster` of `workers`
    processes; else the scheduler's address, ``tcp://host:8786``); every worker must read the
    traces at the same paths (a shared file system) and import this version of residency.
    With `cache`, each rank's reduction is taken from (and recorded in) the user's cache
    directory of the machine that reads it (`residency.traces.cache`; key: the trace's content
    digest, size, mtime, these options and the parser version); without `scheduler`, a Kineto
    set's summary and its warnings are recorded there too, and given back (the warnings raised
    again) while every trace's status vouches that it is unchanged
    (`residency.analysis.idle.entries.summary_cached`); while such a set is computed, the
    process's warnings are recorded (`warnings.catch_warnings`, which is not thread-safe) and
    raised again when it ends.

    Raises:
        TraceError: as `residency.traces.load.load_traces`.
        ValueError: as `idle_summary`, or `scheduler` given without ``dask[distributed]``.
    """
    from residency.traces import load as tr

    plan = tr.plan_traces(path, session=session, group=group)
    definition = busydef.resolve(busy, plan.format)
    if window_marker is not None:
        compile_pattern(window_marker, "window_marker")
    if marker is not None:
        compile_pattern(marker, "marker")
    job = {"busy": definition.name, "marker": marker, "window_marker": window_marker,
           "cache": cache, "chunk_bytes": chunk_bytes or tr.CHUNK_BYTES,
           "max_trace_bytes": max_trace_bytes or tr.MAX_TRACE_BYTES}
    if not (cache and scheduler is None and plan.format in entries.SUMMARY_FORMATS):
        return _summary_at(plan, job, definition, scheduler, workers, allow_no_device_tasks)
    # the set's summary, recorded on this machine (ranks' status only: nothing hashed)
    stats = [tr.open_stat(s, plan.parse_root, job["max_trace_bytes"]) for s in plan.sources]
    key = entries.summary_options(plan, job, session=session, group=group,
                                  allow_no_device_tasks=allow_no_device_tasks)
    hit = entries.summary_cached(plan, key, stats)
    if hit is not None:
        for w in hit[1]:
            warnings.warn(w, stacklevel=2)
        return hit[0]
    caught: list[warnings.WarningMessage] = []
    try:  # its warnings, recorded with it (raised again here, whatever happens)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = _summary_at(plan, job, definition, scheduler, workers,
                                  allow_no_device_tasks)
    finally:
        for w in caught:
            warnings.warn(w.message, stacklevel=2)
    entries.record_summary(plan, key, stats, summary, [w.message for w in caught])
    return summary


def _summary_at(plan: Any, job: dict[str, Any], definition: busydef.BusyDefinition,
                scheduler: str | None, workers: int | None, allow_no_device_tasks: bool
                ) -> IdleSummary:
    """`idle_summary_at`'s figures, computed from the ranks' reductions."""
    from residency.traces import load as tr

    marker, window_marker = job["marker"], job["window_marker"]
    n = len(plan.sources)
    reductions, union = reductions_at(plan, job, scheduler=scheduler, workers=workers)
    if plan.format == "ascend":
        from residency.traces import ascend

        ascend.align_clocks(list(plan.sources), [_Ends(r.end_abs) for r in reductions])
    # ranks told here, so that their warnings (a lone trace read as rank 0, a recorded rank
    # that contradicts its folder) reach the caller whatever process parsed them
    reductions = [dataclasses.replace(r, rank=tr.rank_of(plan, i, r.content_rank))
                  for i, r in enumerate(reductions)]
    tr.settle_ranks(plan, [r.rank for r in reductions])
    tr.check_spans(plan.root, {r.rank: (r.source, r.span) for r in reductions})
    tr.check_world(plan.root, {r.rank: r.world_size for r in reductions})
    for r in reductions:
        if not r.device_tasks:
            warnings.warn(tr.no_device_tasks(r.rank, r.source), UserWarning, stacklevel=2)
    assert len(reductions) == n
    return summarize(plan.format, sorted(reductions, key=lambda r: r.rank), definition,
                     marker=marker, window_marker=window_marker,
                     allow_no_device_tasks=allow_no_device_tasks, busy_union=union)


class _Ends:
    """What `residency.traces.ascend.align_clocks` reads of a parse: its end times (the largest
    absolute one stands for all)."""

    def __init__(self, end_abs: int | None) -> None:
        self.device = (np.empty((0, 2), np.int64) if end_abs is None
                       else np.array([[0, end_abs]], np.int64))
        self.ranges = np.empty((0, 2), np.int64)


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
