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
import os
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from residency.traces import busy as busydef
from residency.traces import intervals as iv

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import RankTimeline, TraceSet

__all__ = ["IdleSummary", "RankIdle", "RankReduction", "all_rank_idle_intervals", "busy_union",
           "busy_intervals", "format_summary", "idle_summary", "idle_summary_at",
           "per_rank_idle", "rank_reduction", "reduce_rank", "reductions_at", "summarize"]


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
    # how the window was chosen: "busy tasks" (earliest to latest), "window marker" (the
    # union of its ranges), "recorded span" (no busy task: earliest to latest event recorded)
    window_basis: str = "busy tasks"

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
    except (re.error, OverflowError, RecursionError, MemoryError, ValueError) as exc:
        # (a repeat count past the C limit, 'x{4294967296}', is an OverflowError)
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
    found: list[tuple[dict[str, int], frozenset[str]]] = []
    for rank, t in traces.ranks.items():
        chosen = busydef.busy_tasks(t, definition, traces.format)
        raw[rank] = chosen.rows
        merged[rank] = iv.merge(raw[rank])
        excluded[rank] = chosen.excluded
        unknown_by_rank[rank] = chosen.unknown
        found.append((chosen.unknown, chosen.confirmed))
    if warn:
        _warn_unknown(definition, found)
    return definition, raw, merged, excluded, unknown_by_rank


def _warn_unknown(definition: busydef.BusyDefinition,
                  ranks: Sequence[tuple[dict[str, int], frozenset[str]]]) -> None:
    """One warning for the device tasks of unknown types (counted busy) over all ranks, per
    rank (its unknown counts, the types its own Overlap Analysis counts busy); a type that
    every rank having it confirms is not warned about."""
    unknown: Counter[str] = Counter()
    unconfirmed: set[str] = set()
    for counts, confirmed in ranks:
        unknown.update(counts)
        unconfirmed |= set(counts) - confirmed
    unknown = Counter({ty: n for ty, n in unknown.items() if ty in unconfirmed})
    if unknown and definition.name != "all":
        listed = ", ".join(f"{_type_label(ty)} x {n}" for ty, n in sorted(unknown.items()))
        warnings.warn(f"device tasks of types not in residency.traces.busy's lists were counted "
                      f"busy ({definition.name}): {listed}", UserWarning, stacklevel=4)



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
    wrx = _compile(window_marker, "window_marker") if window_marker is not None else None
    rx = _compile(marker, "marker") if marker is not None else None
    reductions = [reduce_rank(t, definition, traces.format, rx, wrx)
                  for t in traces.ranks.values()]
    from residency.traces.files import sealed_reads

    with sealed_reads(getattr(traces, "seal", None)):  # torch-npu's CSVs: as sealed, too
        return summarize(traces.format, reductions, definition, marker=marker,
                         window_marker=window_marker,
                         allow_no_device_tasks=allow_no_device_tasks)


@dataclasses.dataclass(frozen=True, eq=False)
class RankReduction:
    """What one rank contributes to an `IdleSummary`: its busy union and its marker ranges,
    never its columns. `busy`: the merged busy intervals; `busy_bounds`: earliest start and
    latest end of its busy tasks as recorded (None: none); `markers` / `window_ranges`: its
    host ranges matching the marker / window marker (as recorded, not merged); `free`: its
    merged Overlap Analysis ``Free`` slices (None: no such lane) and `overlap_span` that
    lane's span; `span`: earliest start and latest end over device tasks and host ranges
    (`residency.traces.load.check_spans`); `end_abs`: the largest absolute end time over every row
    (relative torch-npu times, `residency.traces.ascend.align_clocks`). `rank` is None when it
    cannot be told; `content_rank` is the rank the trace's content names."""

    rank: int | None
    source: Path
    device_tasks: int
    rejected_events: int
    busy: iv.Intervals
    busy_bounds: tuple[int, int] | None
    excluded: dict[str, int]
    unknown: dict[str, int]
    markers: iv.Intervals
    window_ranges: iv.Intervals
    free: iv.Intervals | None
    overlap_span: tuple[int, int] | None
    span: tuple[int, int] | None
    end_abs: int | None
    content_rank: int | None = None
    confirmed: frozenset[str] = frozenset()  # unknown types its Overlap Analysis counts busy
    host_ranges: int = 0
    computing: iv.Intervals | None = None  # torch-npu: merged compute tasks, for step checks
    work: iv.Intervals | None = None  # torch-npu: merged compute + communication tasks
    world_size: int | None = None  # the ranks its content says the job had


_NONE = np.empty((0, 2), np.int64)


def reduce_rank(t: RankTimeline, definition: busydef.BusyDefinition, fmt: str,
                marker: re.Pattern[str] | None, window_marker: re.Pattern[str] | None,
                *, content_rank: int | None = None, consume: bool = False) -> RankReduction:
    """One rank's `RankReduction` under `definition` and the compiled patterns. With
    `consume`, the caller gives `t` up: its busy union may be written over its device rows
    (no second copy of a device-dense rank)."""
    from residency.traces.load import timeline_span

    chosen = busydef.busy_tasks(t, definition, fmt)
    rows = chosen.rows
    bounds = (int(rows[:, 0].min()), int(rows[:, 1].max())) if len(rows) else None
    span = timeline_span(t)
    free = None
    overlap_span = None
    if len(t.overlap):
        free = iv.merge(t.overlap[t.overlap_names == "Free"])
        overlap_span = (int(t.overlap[:, 0].min()), int(t.overlap[:, 1].max()))
    ends = [max(-int(a[:, 1].min()), int(a[:, 1].max()))  # largest |end|, no copy
            for a in (t.device, t.ranges, t.overlap) if len(a)]
    computing = work = None
    if fmt == "ascend":
        computing = iv.merge(busydef.class_rows(t, frozenset({"compute", "unknown"})))
        work = iv.merge(busydef.class_rows(t, frozenset({"compute", "unknown",
                                                         "communication"})))
    if consume and rows is t.device and rows.base is None:  # (ours alone: parsed for this)
        rows.setflags(write=True)
        busy = iv.merge_in_place(rows)
    else:
        busy = iv.merge(rows)
    return RankReduction(
        t.rank, t.source, t.device_tasks, t.rejected_events, busy, bounds,
        dict(chosen.excluded), dict(chosen.unknown),
        np.ascontiguousarray(_matching(t, marker)) if marker is not None else _NONE,
        np.ascontiguousarray(_matching(t, window_marker)) if window_marker is not None
        else _NONE, free, overlap_span, span,
        int(max(ends)) if ends else None, content_rank, frozenset(chosen.confirmed),
        len(t.ranges), computing, work)


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
        _warn_unknown(definition, [(r.unknown, r.confirmed) for r in reductions])
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
        span = int(r.busy[-1, 1] - r.busy[0, 0]) if len(r.busy) else 0
        free = (None if r.free is None else iv.measure(iv.intersection(r.free, window)))
        if free is not None and definition.name == "msprof":
            _check_free(r, window, free)
        steps = _step_checks(r) if fmt == "ascend" else ()
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


def _step_checks(r: RankReduction) -> tuple[Any, ...]:
    """torch-npu's per-step Computing/Free beside ours (`residency.traces.ascend.step_checks`),
    each disagreement over 1 % warned about, quoting both."""
    from residency.traces import ascend

    if r.computing is None or r.work is None or not (
            r.source.parent / ascend.STEP_TRACE).is_file():
        return ()
    work = r.work
    free = (iv.complement(work, [[int(work[0, 0]), int(work[-1, 1])]]) if len(work)
            else np.empty((0, 2), np.int64))
    checks = tuple(ascend.step_checks(r.source.parent, r.computing, free))
    off = []
    for c in checks:
        for what, theirs, ours in (("Computing", c.reported_computing_ns, c.computing_ns),
                                   ("Free", c.reported_free_ns, c.free_ns)):
            if ours is not None and abs(ours - theirs) > 0.01 * max(ours, theirs):
                off.append(f"step {c.step or '(none)'} {what} {theirs / 1e6:.6f} ms in "
                           f"step_trace_time.csv vs {ours / 1e6:.6f} ms here")
    if off:
        warnings.warn(f"rank {r.rank}: torch-npu's own figures differ by more than 1 %: "
                      + "; ".join(off[:6]) + ("; ..." if len(off) > 6 else ""),
                      UserWarning, stacklevel=4)
    return checks


def _check_free(r: RankReduction, window: iv.Intervals, free: int) -> None:
    """Warn when our idle time, over the span of the Overlap Analysis lane (its slices tile
    it), differs from its Free time by more than 1 %."""
    assert r.overlap_span is not None
    covered = iv.intersection([list(r.overlap_span)], window)
    ours = iv.measure(iv.complement(r.busy, covered)) if len(covered) else 0
    if abs(ours - free) > 0.01 * max(ours, free):
        warnings.warn(f"rank {r.rank}: idle time under the msprof definition ({ours / 1e6:.6f} "
                      f"ms over the Overlap Analysis span) differs from the trace's own Free "
                      f"time ({free / 1e6:.6f} ms) by more than 1 %; the trace's Task Types or "
                      "Communication lane may not match residency.traces.busy's lists",
                      UserWarning, stacklevel=4)


# -- from paths: per-rank parse and reduction in workers, on Dask past one machine ------------

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
    digest, size, mtime, these options and the parser version).

    Raises:
        TraceError: as `residency.traces.load.load_traces`.
        ValueError: as `idle_summary`, or `scheduler` given without ``dask[distributed]``.
    """
    from residency.traces import load as tr

    plan = tr.plan_traces(path, session=session, group=group)
    definition = busydef.resolve(busy, plan.format)
    if window_marker is not None:
        _compile(window_marker, "window_marker")
    if marker is not None:
        _compile(marker, "marker")
    job = {"busy": definition.name, "marker": marker, "window_marker": window_marker,
           "cache": cache, "chunk_bytes": chunk_bytes or tr.CHUNK_BYTES,
           "max_trace_bytes": max_trace_bytes or tr.MAX_TRACE_BYTES}
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


def rank_reduction(plan: Any, i: int, *, busy: str, marker: str | None,
                   window_marker: str | None, cache: bool, chunk_bytes: int,
                   max_trace_bytes: int, parsed: Any = None) -> RankReduction:
    """The reduction of `plan`'s item `i` (a `residency.traces.load.TracePlan`): from the user's
    cache when an entry matches, else parsed (or from `parsed`, its parse) and recorded."""
    job = {"busy": busy, "marker": marker, "window_marker": window_marker, "cache": cache,
           "chunk_bytes": chunk_bytes, "max_trace_bytes": max_trace_bytes}
    hit = _cached(plan, i, job) if parsed is None else None
    return hit if hit is not None else _computed(plan, i, job, parsed)


def _options(plan: Any, job: dict[str, Any]) -> dict[str, Any]:
    """What an ``idle`` cache entry was computed under (besides the trace and parser)."""
    return {"format": plan.format, "busy": busydef.resolve(job["busy"], plan.format).name,
            "marker": job["marker"], "window_marker": job["window_marker"],
            "reduction": 2}  # 2: unknown types confirmed, host ranges, step intervals


def _cached(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result | None = None
            ) -> RankReduction | None:
    """Item `i`'s reduction from its cache entry, if one matches (`stat`: the trace's status
    from `residency.traces.load.open_stat`, taken now when not given)."""
    from residency.traces import cache as tracecache
    from residency.traces import load as tr

    source = plan.sources[i]
    if not (job["cache"] and tracecache.enabled(plan.parse_root, source)):
        return None
    if stat is None:
        stat = tr.open_stat(source, plan.parse_root, job["max_trace_bytes"])
    got = tracecache.get("idle", source, stat, _options(plan, job), root=plan.parse_root,
                         max_trace_bytes=job["max_trace_bytes"])
    return _from_entry(plan, i, got) if got is not None else None


def _computed(plan: Any, i: int, job: dict[str, Any], parsed: Any) -> RankReduction:
    from residency.traces import cache as tracecache
    from residency.traces import load as tr

    source, root, limit = plan.sources[i], plan.parse_root, job["max_trace_bytes"]
    stat = tr.open_stat(source, root, limit)
    cache = job["cache"] and tracecache.enabled(root, source)
    own = parsed is None  # parsed here for this reduction alone: its arrays can be reused
    if parsed is None:
        parsed = tr.parse_source(plan.format, source, root=root,
                                 chunk_bytes=job["chunk_bytes"], max_bytes=limit,
                                 digest=cache, device_names=False)
    content_rank, digest, parsed_world = parsed.rank, parsed.digest, parsed.world_size
    rank = tr.rank_of(plan, i, content_rank, warn=False)  # warned once, where gathered
    t = tr.timeline_of(parsed, -1 if rank is None else rank, source, plan.sessions[i])
    del parsed
    wrx = None if job["window_marker"] is None else _compile(job["window_marker"],
                                                             "window_marker")
    rx = None if job["marker"] is None else _compile(job["marker"], "marker")
    definition = busydef.resolve(job["busy"], plan.format)
    r = dataclasses.replace(reduce_rank(t, definition, plan.format, rx, wrx, consume=own),
                            rank=rank, content_rank=content_rank, world_size=parsed_world)
    del t
    if cache:  # (digest: of exactly the bytes parsed; none, nothing is recorded)
        arrays = {"busy": r.busy, "markers": r.markers, "window_ranges": r.window_ranges}
        if r.free is not None:
            arrays["free"] = r.free
        if r.computing is not None and r.work is not None:
            arrays["computing"], arrays["work"] = r.computing, r.work
        tracecache.put("idle", source, stat, _options(plan, job), digest, _entry_meta(r),
                       arrays, root=root)
    return r


def _entry_meta(r: RankReduction) -> dict[str, Any]:
    return {"content_rank": r.content_rank, "device_tasks": r.device_tasks,
            "rejected_events": r.rejected_events, "busy_bounds": r.busy_bounds,
            "excluded": r.excluded, "unknown": r.unknown, "overlap_span": r.overlap_span,
            "span": r.span, "end_abs": r.end_abs, "free": r.free is not None,
            "confirmed": sorted(r.confirmed), "host_ranges": r.host_ranges,
            "steps": r.computing is not None, "world_size": r.world_size}


def _pair(v: Any) -> tuple[int, int] | None:
    if v is None:
        return None
    a, b = v
    if type(a) is not int or type(b) is not int:
        raise TypeError("not a pair of ints")
    return a, b


def _counts(v: Any) -> dict[str, int]:
    if not isinstance(v, dict) or not all(type(k) is str and type(n) is int
                                          for k, n in v.items()):
        raise TypeError("not a dict of counts")
    return dict(v)


def _from_entry(plan: Any, i: int, got: tuple[dict[str, Any], dict[str, np.ndarray]]
                ) -> RankReduction | None:
    """A reduction from a cache entry; None when the entry is not well formed."""
    from residency.traces import load as tr

    meta, arrays = got
    try:
        content = meta["content_rank"]
        if content is not None and type(content) is not int:
            return None
        rows = {}
        steps = ("computing", "work") if meta["steps"] else ()
        for k in ("busy", "markers", "window_ranges", *steps) + (
                ("free",) if meta["free"] else ()):
            a = arrays[k]
            if a.dtype != np.int64 or a.ndim != 2 or a.shape[1] != 2:
                return None
            rows[k] = a
        end_abs = meta["end_abs"]
        if end_abs is not None and type(end_abs) is not int:
            return None
        n, rejected, hosts = meta["device_tasks"], meta["rejected_events"], meta["host_ranges"]
        if type(n) is not int or type(rejected) is not int or type(hosts) is not int:
            return None
        confirmed, world = meta["confirmed"], meta["world_size"]
        if not isinstance(confirmed, list) or not all(type(c) is str for c in confirmed):
            return None
        if world is not None and type(world) is not int:
            return None
        rank = tr.rank_of(plan, i, content, warn=False)
        return RankReduction(rank, plan.sources[i], n, rejected, rows["busy"],
                             _pair(meta["busy_bounds"]), _counts(meta["excluded"]),
                             _counts(meta["unknown"]), rows["markers"], rows["window_ranges"],
                             rows.get("free"), _pair(meta["overlap_span"]),
                             _pair(meta["span"]), end_abs, content, frozenset(confirmed),
                             hosts, rows.get("computing"), rows.get("work"), world)
    except (KeyError, TypeError, ValueError):
        return None


def _here(plan: Any, job: dict[str, Any], workers: int | None
          ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """Every rank's reduction on this machine. With at least as many files as workers, not
    all of them recorded in the cache, each file is one job of a worker process: its cache
    entry looked up there, else parsed and reduced there (`rank_reduction`). Else cache
    entries are looked up here first (in threads), then the rest parsed here, one file per
    worker process while there are enough of them, or each large file in parts in the workers
    (`residency.traces.load.parse_files`) and reduced here, one rank at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from residency.traces import load as tr

    n_items = len(plan.sources)
    stats = {i: tr.open_stat(plan.sources[i], plan.parse_root, job["max_trace_bytes"])
             for i in range(n_items)}
    from residency.traces.parallel import PARALLEL_MIN_BYTES, usable_cpus

    n = workers if workers is not None else usable_cpus()
    small = sum(st.st_size for st in stats.values()) < PARALLEL_MIN_BYTES
    if n > 1 and n_items >= n and not (workers is None and small) and not (
            job["cache"] and all(_recorded(plan, i, job, stats[i]) for i in range(n_items))):
        return _pool(plan, job, n, stats)  # (lookups in the workers: no start-up cost here)
    found: list[RankReduction | None] = [None] * n_items
    if job["cache"] and n_items:
        with ThreadPoolExecutor(min(8, n_items)) as threads:
            found = list(threads.map(lambda i: _cached(plan, i, job, stats[i]),
                                     range(n_items)))
    todo = [i for i, r in enumerate(found) if r is None]
    done: dict[int, RankReduction] = {}
    if n <= 1 or (workers is None and small):
        done = {i: _computed(plan, i, job, None) for i in todo}
    elif len(todo) >= n:  # (recorded, but entries refused: stale or damaged)
        done = dict(zip(todo, _pool(plan, job, n, {i: stats[i] for i in todo})[0],
                        strict=True))
    else:  # fewer files than workers: each file's parts in the workers
        for i in todo:
            (p,) = tr.parse_files(plan.format, [plan.sources[i]], workers=workers,
                                  root=plan.parse_root, chunk_bytes=job["chunk_bytes"],
                                  max_bytes=job["max_trace_bytes"], digest=job["cache"],
                                  device_names=False)
            done[i] = _computed(plan, i, job, p)
            del p
    return [found[i] if found[i] is not None else done[i] for i in range(n_items)], None


def _recorded(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result) -> bool:
    """Whether item `i` has a cache entry (not yet checked): with every rank recorded, the
    lookups run here in threads, with no worker processes to start."""
    from residency.traces import cache as tracecache

    return tracecache.has_entry("idle", plan.sources[i], stat, _options(plan, job),
                                root=plan.parse_root)


def busy_union(reductions: Sequence[RankReduction]) -> iv.Intervals:
    """The union of the ranks' busy intervals (a leaf of the all-rank reduction tree)."""
    return iv.union(*(r.busy for r in reductions))


def reductions_at(plan: Any, job: dict[str, Any], *, scheduler: str | None = None,
                  workers: int | None = None
                  ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """Every rank's reduction of `plan` (a `residency.traces.load.TracePlan`) under `job`
    (`rank_reduction`'s keywords), in plan order, here (`workers` processes) or on a Dask
    cluster (`scheduler`, `residency.traces.parallel.map_dask`), and the union of every rank's
    busy intervals where the workers reduced it (a tree: each task's ranks, then the partial
    unions pairwise, on the workers); None where the ranks were reduced here."""
    from residency.traces import parallel

    if scheduler is None:
        return _here(plan, job, workers)
    return parallel.map_dask(rank_reduction, plan, [_size(s) for s in plan.sources],
                             scheduler=scheduler, workers=workers, kwargs=job,
                             root=plan.root, leaf=busy_union, combine=iv.union)


def _pool(plan: Any, job: dict[str, Any], n: int, stats: dict[int, os.stat_result]
          ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """The reductions of the items of `stats`, in their order, by `n` worker processes in jobs
    of a few ranks (`residency.traces.parallel.task_groups`, largest first), and the union of
    their busy intervals, reduced on the workers."""
    from residency.traces import parallel

    items = list(stats)
    groups = [tuple(items[k] for k in g) for g in
              parallel.task_groups([stats[i].st_size for i in items], n)]
    got, union = parallel.map_local(rank_reduction, groups, workers=n, args=(plan,),
                                    kwargs=job, leaf=busy_union, combine=iv.union)
    return [got[i] for i in items], union


def _size(source: Path) -> int:
    """`source`'s size here in bytes (0 where it cannot be read here: it is checked where it
    is read)."""
    try:
        return os.stat(source).st_size
    except OSError:
        return 0


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

    how = {"window marker": f"union of host ranges matching /{s.window_marker}/",
           "recorded span": "no busy device task: earliest to latest event recorded"}.get(
               s.window_basis, "earliest to latest busy device task")
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
