"""``residency idle``'s text: an `residency.analysis.idle.IdleSummary` laid out as a table in
milliseconds, with its legend (the model computes; this only lays out)."""

from __future__ import annotations

from collections import Counter

from residency.analysis.idle.checks import type_label
from residency.analysis.idle.model import IdleSummary
from residency.traces import busy as busydef

__all__ = ["format_summary"]


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
            f"{type_label(ty)} x {n}" for ty, n in sorted(excluded.items()))]
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
                  + ", ".join(f"{type_label(ty)} x {n}" for ty, n in sorted(unknown.items()))]
    lines += ["", f"Unit: milliseconds; n = {len(s.ranks)} ranks. busy/idle: inside the window, "
              "busy tasks only; all-rank no-device-task time: no rank runs a busy device task;",
              "excluded: device tasks the busy definition leaves out; span_idle: the rank's own "
              "busy span minus its busy time (HolisticTraceAnalysis's idle);",
              "reported_free: the trace's own Overlap Analysis Free time in the window "
              "(torch-npu text exports only)."]
    return lines
