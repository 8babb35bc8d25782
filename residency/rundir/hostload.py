"""How loaded the host was while a run recorded (as pyperf records and warns about): the load
average and CPU count at the start and end of each service run, and the share of the host's
CPU time that processes other than this one and the services it started used meanwhile.

`sample()` reads the host now; `record(start, end)` is what a manifest entry carries as
`host_load`; `loaded(record)` says whether to warn, and `describe(record)` words it. Linux
reads `/proc/stat`; elsewhere the CPU share is None. No torch, no pandas.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OTHER_CPU_WARN = 0.10
"""Warn when other processes used at least this share of all CPUs during the run."""
LOAD_WARN_PER_CPU = 0.5
"""...or when the 1-minute load average before the run was at least this per CPU."""
_PROC_STAT = "/proc/stat"

__all__ = ["LOAD_WARN_PER_CPU", "OTHER_CPU_WARN", "Sample", "describe", "loaded", "record",
           "sample", "summarize"]


@dataclass(frozen=True)
class Sample:
    """The host at one instant: load averages (1, 5, 15 min), CPU count, busy CPU time of
    the whole host (s, None off Linux), CPU time of this process and its reaped children
    (s), and the monotonic clock (ns)."""

    loadavg: tuple[float, float, float] | None
    cpu_count: int | None
    host_busy_s: float | None
    own_cpu_s: float
    monotonic_ns: int


def _host_busy_s() -> float | None:
    """Busy CPU time of all CPUs since boot (user, nice, system, irq, softirq, steal), s."""
    try:
        with open(_PROC_STAT, encoding="ascii") as f:
            first = f.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not first or first[0] != "cpu" or len(first) < 8:
        return None
    try:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in first[1:8])
        steal = int(first[8]) if len(first) > 8 else 0
    except ValueError:
        return None
    return (user + nice + system + irq + softirq + steal) / ticks


def sample() -> Sample:
    """The host now."""
    try:
        load = tuple(float(x) for x in os.getloadavg())
    except (OSError, AttributeError):
        load = None
    t = os.times()
    return Sample(loadavg=load, cpu_count=os.cpu_count(), host_busy_s=_host_busy_s(),  # type: ignore[arg-type]
                  own_cpu_s=t.user + t.system + t.children_user + t.children_system,
                  monotonic_ns=time.monotonic_ns())


def _point(s: Sample) -> dict[str, Any]:
    return {"loadavg": None if s.loadavg is None else [round(x, 2) for x in s.loadavg],
            "cpu_count": s.cpu_count}


def record(start: Sample, end: Sample) -> dict[str, Any]:
    """The manifest's `host_load` of one interval: `start` and `end` ({loadavg: [1, 5, 15
    min], cpu_count}), `seconds`, and `other_cpu_share`: the host's busy CPU time minus this
    process's and its reaped children's (the services it started), over the interval's wall
    time x CPU count, in [0, 1]; None where `/proc/stat` cannot be read."""
    wall = (end.monotonic_ns - start.monotonic_ns) / 1e9
    share = None
    cpus = end.cpu_count or start.cpu_count
    if start.host_busy_s is not None and end.host_busy_s is not None and wall > 0 and cpus:
        other = (end.host_busy_s - start.host_busy_s) - (end.own_cpu_s - start.own_cpu_s)
        share = round(min(1.0, max(0.0, other / (wall * cpus))), 4)
    return {"start": _point(start), "end": _point(end), "seconds": round(wall, 3),
            "other_cpu_share": share}


def _valid(rec: Any) -> bool:
    return isinstance(rec, Mapping) and isinstance(rec.get("start"), Mapping)


def summarize(records: Sequence[Any]) -> dict[str, Any] | None:
    """The run as a whole from its runs' records: the first start, the last end, the largest
    `other_cpu_share` (`other_cpu_share_max`) and the time-weighted mean
    (`other_cpu_share`); None when no run recorded its host load (runs recorded before
    this field existed)."""
    recs = [r for r in records if _valid(r)]
    if not recs:
        return None
    shares = [(r.get("other_cpu_share"), r.get("seconds") or 0) for r in recs]
    known = [(s, w) for s, w in shares if isinstance(s, (int, float)) and math.isfinite(s)]
    weight = sum(w for _, w in known)
    mean = (sum(s * w for s, w in known) / weight if weight else
            (max(s for s, _ in known) if known else None))
    return {"start": recs[0]["start"], "end": recs[-1].get("end"),
            "other_cpu_share": None if mean is None else round(mean, 4),
            "other_cpu_share_max": max((s for s, _ in known), default=None),
            "runs": len(recs)}


def _load1(point: Any) -> float | None:
    if isinstance(point, Mapping) and isinstance(point.get("loadavg"), Sequence) and \
            point["loadavg"] and isinstance(point["loadavg"][0], (int, float)):
        return float(point["loadavg"][0])
    return None


def loaded(rec: Mapping[str, Any] | None) -> bool:
    """True when the record shows a loaded host: other processes used at least
    `OTHER_CPU_WARN` of all CPUs, or the 1-minute load average before the run was at least
    `LOAD_WARN_PER_CPU` per CPU."""
    if not rec:
        return False
    share = rec.get("other_cpu_share_max", rec.get("other_cpu_share"))
    if isinstance(share, (int, float)) and share >= OTHER_CPU_WARN:
        return True
    start = rec.get("start") or {}
    load, cpus = _load1(start), start.get("cpu_count") if isinstance(start, Mapping) else None
    return bool(load is not None and isinstance(cpus, int) and cpus > 0
                and load >= LOAD_WARN_PER_CPU * cpus)


def describe(rec: Mapping[str, Any] | None) -> str:
    """One sentence for people: the load at start and end, the CPU count and the share
    other processes used; what to do when loaded."""
    if not rec:
        return ("Host load not recorded (the run predates the manifest field host_load): "
                "rerun to know whether other processes competed for the CPUs.")
    start, end = rec.get("start") or {}, rec.get("end") or {}
    l0, l1 = _load1(start), _load1(end)
    cpus = start.get("cpu_count") if isinstance(start, Mapping) else None
    share = rec.get("other_cpu_share")
    peak = rec.get("other_cpu_share_max")
    parts = [f"load average {'?' if l0 is None else f'{l0:.2f}'} at the start and "
             f"{'?' if l1 is None else f'{l1:.2f}'} at the end on {cpus or '?'} CPUs"]
    if isinstance(share, (int, float)):
        most = (f" (at most {peak:.1%} in one service run)".replace("%", " %")
                if isinstance(peak, (int, float)) and peak != share else "")
        parts.append(f"other processes used {share:.1%} of the CPUs".replace("%", " %") + most)
    else:
        parts.append("the CPU share of other processes was not measured (no /proc/stat)")
    text = "Host: " + "; ".join(parts) + "."
    if loaded(rec):
        text += (" The host was loaded: timings are noisier and may be biased; rerun on a "
                 "quiet machine (or compare with an A/A run recorded under the same load).")
    return text
