"""Baseline-vs-candidate trace diff: per phase and device-task name group, count and total time.

In the spirit of HolisticTraceAnalysis's ``compare_traces`` (per-kernel counts and durations of
two traces), but per *phase* of the request, so a reviewer sees whether anything other than the
release changed between the arms of a profiled pair.

* phase of a device task: the host range named ``residency.phase[<phase>]`` on the task's own
  rank in which the task starts (the latest-starting one when phases nest); ``(no phase)``
  otherwise.
* name group (`name_group`): the task name without trailing ``_<n>`` counters, template
  arguments or parameter lists (``MatMul_12`` -> ``MatMul``; ``void gemm<float>(...)`` ->
  ``gemm``), so repeated launches of one operator fall together.
* tasks: the device tasks and the torch-npu Communication lane's ranges; count and total
  time are summed over ranks (durations, not their union), in ns and ms.

Analysis only: no torch, no plotting.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from residency.markers import PHASE_PATTERN
from residency.policy.cache import BASELINE, CANDIDATE
from residency.traces.load import ASCEND_COMM_PROCESSES

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import RankTimeline, TraceSet

__all__ = ["NO_PHASE", "PHASE_PATTERN", "name_group", "task_groups", "trace_diff"]

NO_PHASE = "(no phase)"
_COUNTER = re.compile(r"(?:_\d+)+$")


def name_group(name: str) -> str:
    """The group of a device-task name (module doc)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    for stop in ("<", "("):
        if stop in text:
            text = text.split(stop, 1)[0]
    text = _COUNTER.sub("", text.strip())
    return text or name


def _phases(t: RankTimeline, rx: re.Pattern[str]) -> tuple[np.ndarray, np.ndarray]:
    """The rank's phase ranges (sorted by start) and their phase names."""
    names = t.range_names.tolist()
    found = [(i, m.group("phase")) for i, n in enumerate(names) if (m := rx.search(n))]
    if not found:
        return np.empty((0, 2), np.int64), np.empty(0, object)
    idx = np.array([i for i, _ in found])
    ranges = t.ranges[idx]
    order = np.argsort(ranges[:, 0], kind="stable")
    return ranges[order], np.array([p for _, p in found], object)[order]


def task_groups(traces: TraceSet, *, phase_pattern: str = PHASE_PATTERN) -> pd.DataFrame:
    """Every rank's device tasks by phase and name group: ``rank``, ``phase``, ``group``,
    ``count``, ``total_ns``."""
    import pandas as pd

    rx = re.compile(phase_pattern)
    frames = []
    for rank, t in traces.ranks.items():
        comm = t.lane_mask(ASCEND_COMM_PROCESSES)  # communication operations are device work
        rows = np.concatenate((t.device, t.ranges[comm]))
        task_names = [*t.device_names.tolist(), *t.range_names[comm].tolist()]
        if not len(rows):
            continue
        ranges, phase_names = _phases(t, rx)
        starts = rows[:, 0]
        phase = np.full(len(starts), NO_PHASE, dtype=object)
        if len(ranges):
            # the latest-starting phase that began at or before the task and still runs
            i = np.searchsorted(ranges[:, 0], starts, side="right") - 1
            for _ in range(len(ranges)):  # step back over phases that ended before the task
                ended = (i >= 0) & (ranges[np.maximum(i, 0), 1] <= starts)
                if not ended.any():
                    break
                i = np.where(ended, i - 1, i)
            inside = i >= 0
            phase[inside] = phase_names[i[inside]]
        groups = {n: name_group(n) for n in set(task_names)}
        frames.append(pd.DataFrame({
            "rank": rank, "phase": phase, "group": [groups[n] for n in task_names],
            "duration_ns": rows[:, 1] - rows[:, 0]}))
    if not frames:
        return pd.DataFrame(columns=["rank", "phase", "group", "count", "total_ns"])
    tasks = pd.concat(frames, ignore_index=True)
    out = (tasks.groupby(["rank", "phase", "group"], sort=True)["duration_ns"]
           .agg(count="size", total_ns="sum").reset_index())
    return out


def trace_diff(baseline: TraceSet, candidate: TraceSet, *,
               phase_pattern: str = PHASE_PATTERN) -> pd.DataFrame:
    """Per phase and name group, baseline vs candidate, largest change in total time first.

    Columns: ``phase``, ``group``, ``count_baseline``, ``count_candidate``, ``count_delta``,
    ``total_ms_baseline``, ``total_ms_candidate``, ``delta_ms`` (candidate minus baseline),
    ``ranks_baseline``, ``ranks_candidate``; a group absent from one arm has count 0 there.
    """
    import pandas as pd

    sides = []
    for label, traces in ((BASELINE, baseline), (CANDIDATE, candidate)):
        g = task_groups(traces, phase_pattern=phase_pattern)
        agg = (g.groupby(["phase", "group"], sort=True)
               .agg(count=("count", "sum"), total_ns=("total_ns", "sum"),
                    ranks=("rank", "nunique")))
        sides.append(agg.add_suffix(f"_{label}"))
    both = pd.concat(sides, axis=1).fillna(0)
    out = pd.DataFrame({
        "count_baseline": both["count_baseline"].astype("int64"),
        "count_candidate": both["count_candidate"].astype("int64"),
        "total_ms_baseline": both["total_ns_baseline"] / 1e6,
        "total_ms_candidate": both["total_ns_candidate"] / 1e6,
        "ranks_baseline": both["ranks_baseline"].astype("int64"),
        "ranks_candidate": both["ranks_candidate"].astype("int64"),
    })
    out["count_delta"] = out["count_candidate"] - out["count_baseline"]
    out["delta_ms"] = out["total_ms_candidate"] - out["total_ms_baseline"]
    out = out.reset_index()
    out = out.iloc[np.argsort(-out["delta_ms"].abs().to_numpy(), kind="stable")]
    return out[["phase", "group", "count_baseline", "count_candidate", "count_delta",
                "total_ms_baseline", "total_ms_candidate", "delta_ms", "ranks_baseline",
                "ranks_candidate"]].reset_index(drop=True)
