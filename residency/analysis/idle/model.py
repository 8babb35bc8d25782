"""The figures of `residency.analysis.idle`: one rank's (`RankIdle`), a trace set's
(`IdleSummary`), and what one rank contributes to them, computed where the rank is read
(`RankReduction`). Frozen value objects; `IdleSummary.to_dict` is ``residency idle --json``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from residency.traces import intervals as iv

__all__ = ["IdleSummary", "RankIdle", "RankReduction"]


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


    @classmethod
    def from_dict(cls, d: Any) -> IdleSummary:
        """The summary `to_dict` wrote (as JSON read back: ranks as keys are strings), its
        `window_basis` (not in that JSON) the default.

        Raises:
            ValueError: `d` is not such an object (naming the first field that is not).
        """
        def get(obj: Any, field: str, kind: Any, where: str = "") -> Any:
            if not isinstance(obj, dict) or field not in obj:
                raise ValueError(f"{where}{field}: missing")
            v = obj[field]
            ok = ((type(v) is int) if kind is int else
                  (v is None or type(v) is int) if kind == "int?" else
                  (v is None or type(v) is str) if kind == "str?" else isinstance(v, kind))
            if not ok:
                raise ValueError(f"{where}{field}: {type(v).__name__}, not {kind}")
            return v

        def counts(obj: Any, field: str, where: str) -> dict[str, int]:
            v = get(obj, field, dict, where)
            if not all(type(k) is str and type(n) is int for k, n in v.items()):
                raise ValueError(f"{where}{field}: not counts by name")
            return dict(v)

        ranks = get(d, "ranks", list)
        window = get(d, "window_ns", list)
        per = get(d, "per_rank", dict)
        if (not all(type(r) is int for r in ranks) or len(window) != 2
                or not all(type(t) is int for t in window)
                or sorted(per) != sorted(str(r) for r in ranks)):
            raise ValueError("ranks, window_ns, per_rank: do not agree")
        rows = []
        for r in ranks:
            at = f"per_rank[{r}]."
            row = per[str(r)]
            steps = get(row, "torch_npu_steps", list, at)
            if steps:
                from residency.traces.ascend import StepCheck

                steps = [StepCheck(get(c, "step", str, at),
                                   get(c, "reported_computing_ns", int, at),
                                   get(c, "reported_free_ns", int, at),
                                   get(c, "computing_ns", "int?", at),
                                   get(c, "free_ns", "int?", at),
                                   _pair_or_none(get(c, "window_ns", (list, type(None)), at)))
                         for c in steps]
            rows.append(RankIdle(r, get(row, "busy_ns", int, at), get(row, "idle_ns", int, at),
                                 get(row, "device_tasks", int, at), get(row, "markers", int, at),
                                 get(row, "span_idle_ns", int, at),
                                 counts(row, "excluded_tasks", at),
                                 get(row, "reported_free_ns", "int?", at),
                                 counts(row, "unknown_tasks", at), tuple(steps)))
        return cls(get(d, "format", str), tuple(ranks), (window[0], window[1]),
                   get(d, "window_measure_ns", int), get(d, "all_rank_idle_ns", int),
                   get(d, "marker_ns", int), get(d, "marker_idle_intersection_ns", int),
                   get(d, "rejected_events", int), tuple(rows), get(d, "marker", "str?"),
                   get(d, "window_marker", "str?"), get(d, "busy_definition", str))


def _pair_or_none(v: list[Any] | None) -> tuple[int, int] | None:
    if v is None:
        return None
    if len(v) != 2 or not all(type(t) is int for t in v):
        raise ValueError(f"not a pair of ints: {v!r}")
    return v[0], v[1]


@dataclasses.dataclass(frozen=True, eq=False)
class RankReduction:
    """What one rank contributes to an `IdleSummary`: its busy union and its marker ranges,
    never its columns. `busy`: the merged busy intervals (an `iv.Packed` set where the
    reduction came from a worker process or a cache entry for `summarize`, which measures it
    packed; `iv.unpacked` gives the rows); `busy_bounds`: earliest start and
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
    busy: iv.Intervals | iv.Packed
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
