"""What the timeline figure of a profiled run shows, as data (`ArmTimeline`), from a loaded
`TraceSet`: per rank the merged device-busy intervals, the all-rank no-device-task time, the
release markers (normal, forced) per rank and the phases (prepare, denoise, decode).

The window is the one `residency.analysis.idle` measures in by default (earliest device-task start
to
latest device-task end over all ranks), so the shaded time is exactly the time the idle
figures count; times stay int64 ns (half-open ``[start, end)``), the figure makes them
relative to `origin_ns`. No torch, no plotting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from residency import markers
from residency.traces import intervals as iv

if TYPE_CHECKING:
    from residency.traces.load import TraceSet

RELEASE_MARKERS = markers.RELEASES
PHASE_MARKERS = markers.PHASES
REQUEST_MARKER = markers.REQUEST

__all__ = ["ArmTimeline", "PHASE_MARKERS", "RELEASE_MARKERS", "arm_timeline"]


@dataclass(frozen=True, eq=False)
class ArmTimeline:
    """One arm's profiled run on one time axis (int64 ns, half-open intervals).

    `busy`: rank -> merged device-busy intervals inside the window; `idle`: all-rank
    no-device-task time (window minus the union of `busy`); `releases`: "normal"/"forced"
    -> rank -> that rank's release marker ranges; `phases`: phase -> union over ranks of its
    marker ranges; `origin_ns`: time zero of the figure (the earliest request marker start,
    else the window start); `intersection_ns`: measure of the normal-release markers (union
    over ranks, inside the window) intersected with `idle`.
    """

    arm: str
    device_kind: str
    window_ns: tuple[int, int]
    origin_ns: int
    busy: dict[int, iv.Intervals]
    idle: iv.Intervals
    releases: dict[str, dict[int, iv.Intervals]]
    phases: dict[str, iv.Intervals]
    intersection_ns: int

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks, in order."""
        return tuple(sorted(self.busy))

    @property
    def idle_ns(self) -> int:
        """All-rank no-device-task time inside the window."""
        return iv.measure(self.idle)

    def first_release(self, kind: str = "normal") -> tuple[int, int] | None:
        """The union over ranks of the first `kind` release of each rank, as (start, end)
        ns: the span the zoomed panel centres on; None without one."""
        firsts = [r[0] for r in self.releases.get(kind, {}).values() if len(r)]
        if not firsts:
            return None
        return int(min(f[0] for f in firsts)), int(max(f[1] for f in firsts))


def _named(names: np.ndarray, ranges: np.ndarray, name: str) -> iv.Intervals:
    hit = np.fromiter((n == name for n in names.tolist()), bool, len(names))
    return iv.as_intervals(ranges[hit])


def arm_timeline(traces: TraceSet, *, arm: str, device_kind: str) -> ArmTimeline:
    """The timeline of one profiled run (`traces`, all ranks) of `arm`.

    Raises:
        ValueError: no rank has device tasks (there is no window).
    """
    busy_raw = {r: iv.merge(t.device) for r, t in traces.ranks.items()}
    nonempty = [b for b in busy_raw.values() if len(b)]
    if not nonempty:
        raise ValueError("no rank has device tasks, so the timeline has no window.")
    window = iv.as_intervals([[min(int(b[0, 0]) for b in nonempty),
                               max(int(b[-1, 1]) for b in nonempty)]])
    busy = {r: iv.intersection(b, window) for r, b in busy_raw.items()}
    idle = iv.complement(iv.union(*busy.values()), window)
    releases: dict[str, dict[int, iv.Intervals]] = {k: {} for k in RELEASE_MARKERS}
    phases: dict[str, list[iv.Intervals]] = {k: [] for k in PHASE_MARKERS}
    requests = []
    for r, t in traces.ranks.items():
        for kind, name in RELEASE_MARKERS.items():
            releases[kind][r] = _named(t.range_names, t.ranges, name)
        for phase, name in PHASE_MARKERS.items():
            phases[phase].append(_named(t.range_names, t.ranges, name))
        requests.append(_named(t.range_names, t.ranges, REQUEST_MARKER))
    normal = iv.intersection(iv.union(*releases["normal"].values()), window)
    req = iv.union(*requests)
    origin = int(min(req[0, 0], window[0, 0])) if len(req) else int(window[0, 0])
    return ArmTimeline(
        arm=arm, device_kind=device_kind, window_ns=(int(window[0, 0]), int(window[0, 1])),
        origin_ns=origin, busy=dict(sorted(busy.items())), idle=idle, releases=releases,
        phases={k: iv.union(*v) for k, v in phases.items()},
        intersection_ns=iv.measure(iv.intersection(normal, idle)))
