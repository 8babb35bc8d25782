"""All-rank idle time by cause: which host ranges were running while no rank was busy.

For the all-rank no-device-task time ``I`` (`residency.analysis.idle.all_rank_idle_intervals`,
under a
busy definition of `residency.traces.busy`), each instant of ``I`` is attributed to the *innermost*
host range running then on any rank: the one that started last (ties: the shorter, then the
name). Enclosing ranges (``residency.request``, phases) thus keep only the idle time no finer
range explains, and the rows partition ``I``: ``idle_ns`` sums to the all-rank idle time, with
``(no host range)`` for the instants when no host range of any rank ran. ``inclusive_idle_ns``
is, per name, the measure of (union over ranks of its ranges) intersected with ``I`` (for a
marker, its idle intersection); those overlap and may sum past ``I``. Names are markers such
as ``residency.release[normal]``, phases, operators and Python functions.
HolisticTraceAnalysis breaks idle time down per rank (host wait / kernel wait / other); this
attributes the time no rank worked to what the hosts were doing.

Analysis only: no torch, no plotting; `format_causes` returns lines for the CLI.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import numpy as np

from residency import markers
from residency.analysis.idle import all_rank_idle_intervals
from residency.policy.cache import BASELINE, CANDIDATE
from residency.traces import intervals as iv
from residency.traces.load import ASCEND_COMM_PROCESSES

if TYPE_CHECKING:
    import pandas as pd

    from residency.traces.load import TraceSet

__all__ = ["NO_HOST_RANGE", "cause_diff", "cause_kind", "format_causes", "idle_by_cause",
           "top_cause"]

NO_HOST_RANGE = "(no host range)"


def cause_kind(name: str) -> str:
    """``phase`` for ``residency.phase[...]``, ``marker`` for other ``residency.*`` ranges,
    ``none`` for `NO_HOST_RANGE`, else ``host range`` (operators, Python functions...)."""
    if name == NO_HOST_RANGE:
        return "none"
    if name.startswith(markers.PHASE_PREFIX):
        return "phase"
    return "marker" if name.startswith("residency.") else "host range"


def _idle_before(idle: iv.Intervals) -> tuple[np.ndarray, np.ndarray]:
    """Starts and cumulative lengths of normalised `idle`, for `_measure_in`."""
    lengths = idle[:, 1] - idle[:, 0]
    return idle[:, 0], np.concatenate(([0], np.cumsum(lengths)))


def _idle_in(rows: np.ndarray, idle: iv.Intervals, starts: np.ndarray,
             cum: np.ndarray) -> np.ndarray:
    """Idle time inside each ``[start, end)`` row of `rows` (normalised `idle`), vectorised."""
    if not len(rows) or not len(idle):
        return np.zeros(len(rows), np.int64)

    def before(x: np.ndarray) -> np.ndarray:  # idle time in (-inf, x)
        i = np.searchsorted(starts, x, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.clip(x - idle[j, 0], 0, idle[j, 1] - idle[j, 0])
        return np.where(i >= 0, cum[j] + inside, 0)

    return before(rows[:, 1]) - before(rows[:, 0])


def _measure_in(merged: iv.Intervals, idle: iv.Intervals, starts: np.ndarray,
                cum: np.ndarray) -> int:
    """Measure of normalised `merged` within normalised `idle`, in O(k log m)."""
    return int(_idle_in(merged, idle, starts, cum).sum())


def _innermost(ranges: np.ndarray, codes: np.ndarray, idle: iv.Intervals, starts: np.ndarray,
               cum: np.ndarray, n_names: int) -> tuple[np.ndarray, int]:
    """Idle time attributed to each name code by the innermost running range, and the idle
    time with no range running. `ranges` must each overlap `idle` (others change nothing)."""
    order = np.lexsort((codes, ranges[:, 1], ranges[:, 0]))
    ranges, codes = ranges[order], codes[order]
    bounds = np.unique(np.concatenate((ranges.ravel(), idle.ravel())))
    seg_cause = np.full(max(len(bounds) - 1, 0), -1, np.int64)
    heap: list[tuple[int, int, int]] = []  # (-start, end, code): innermost on top
    k = 0
    lo = ranges[:, 0].tolist()
    hi = ranges[:, 1].tolist()
    cs = codes.tolist()
    for s_i, point in enumerate(bounds[:-1].tolist()):
        while k < len(lo) and lo[k] <= point:
            heapq.heappush(heap, (-lo[k], hi[k], cs[k]))
            k += 1
        while heap and heap[0][1] <= point:  # ended: no longer running
            heapq.heappop(heap)
        if heap:
            seg_cause[s_i] = heap[0][2]
    segments = np.column_stack((bounds[:-1], bounds[1:])) if len(bounds) > 1 else \
        np.empty((0, 2), np.int64)
    amount = _idle_in(segments, idle, starts, cum)
    named = seg_cause >= 0
    per_name = np.bincount(seg_cause[named], weights=amount[named], minlength=n_names)
    return per_name.astype(np.int64), int(amount[~named].sum())


def idle_by_cause(traces: TraceSet, *, busy: str | None = None,
                  window_marker: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """A ranked table of the host ranges running during all-rank idle time (module doc).

    Columns: ``cause`` (range name, or `NO_HOST_RANGE`), ``kind`` (`cause_kind`), ``idle_ns``
    and ``idle_ms`` (innermost attribution: the rows partition the all-rank idle time),
    ``share_of_idle`` (fraction of all-rank idle), ``inclusive_idle_ns`` (the name's ranges
    intersected with all-rank idle, nested time included), ``ranks`` (ranks that recorded the
    range); largest ``idle_ns`` first, names with no idle time left out, `limit` rows when
    given (``(no host range)`` always kept).

    Raises:
        ValueError: as `residency.analysis.idle.idle_summary`.
    """
    import pandas as pd

    idle = all_rank_idle_intervals(traces, busy=busy, window_marker=window_marker)
    total = iv.measure(idle)
    starts, cum = _idle_before(idle)
    code_of: dict[str, int] = {}
    ranks_of: dict[int, set[int]] = {}
    all_ranges, all_codes = [], []
    for rank, t in traces.ranks.items():
        host = ~t.lane_mask(ASCEND_COMM_PROCESSES)  # communication is device work
        if not host.any():
            continue
        names = t.range_names[host].tolist()
        codes = np.fromiter((code_of.setdefault(n, len(code_of)) for n in names), np.int64,
                            len(names))
        for c in set(codes.tolist()):
            ranks_of.setdefault(c, set()).add(rank)
        mine = t.ranges[host]
        useful = _idle_in(mine, idle, starts, cum) > 0  # others explain no idle time
        all_ranges.append(mine[useful])
        all_codes.append(codes[useful])
    names = list(code_of)
    ranges = np.concatenate(all_ranges) if all_ranges else np.empty((0, 2), np.int64)
    codes = np.concatenate(all_codes) if all_codes else np.empty(0, np.int64)
    exclusive, unexplained = _innermost(ranges, codes, idle, starts, cum, len(names))
    inclusive = [_measure_in(iv.merge(ranges[codes == c]), idle, starts, cum)
                 if (codes == c).any() else 0 for c in range(len(names))]
    rows = [(names[c], int(exclusive[c]), inclusive[c], len(ranks_of[c]))
            for c in range(len(names)) if exclusive[c] > 0 or inclusive[c] > 0]
    rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
    if limit is not None:
        rows = rows[:limit]
    rows.append((NO_HOST_RANGE, unexplained, unexplained, 0))
    frame = pd.DataFrame(rows, columns=["cause", "idle_ns", "inclusive_idle_ns", "ranks"])
    frame.insert(1, "kind", [cause_kind(c) for c in frame["cause"]])
    frame["idle_ms"] = frame["idle_ns"] / 1e6
    frame["share_of_idle"] = frame["idle_ns"] / total if total else 0.0
    frame = frame.sort_values(["idle_ns", "inclusive_idle_ns"], ascending=False,
                              kind="stable").reset_index(drop=True)
    return frame[["cause", "kind", "idle_ns", "idle_ms", "share_of_idle", "inclusive_idle_ns",
                  "ranks"]]


def top_cause(frame: pd.DataFrame, *, kinds: tuple[str, ...] = ("marker", "host range")
              ) -> Any:
    """The row of `idle_by_cause`'s table with the most (innermost) idle time among `kinds`
    (by default markers and other host ranges, not the enclosing request and phases), or None
    when none has any."""
    rows = frame[frame["kind"].isin(kinds) & (frame["idle_ns"] > 0)]
    return next(rows.itertuples(index=False), None)


def cause_diff(baseline: pd.DataFrame, candidate: pd.DataFrame) -> pd.DataFrame:
    """What changed between two `idle_by_cause` tables: per cause, baseline and candidate
    innermost idle and candidate − baseline, in ns and ms; the largest reduction first
    (causes only one arm has count 0 in the other).

    Columns: ``cause``, ``kind``, ``baseline_idle_ns``, ``candidate_idle_ns``,
    ``delta_idle_ns``, ``baseline_idle_ms``, ``candidate_idle_ms``, ``delta_idle_ms``.
    """
    import pandas as pd

    b = baseline.set_index("cause")["idle_ns"]
    c = candidate.set_index("cause")["idle_ns"]
    causes = list(dict.fromkeys([*b.index, *c.index]))
    frame = pd.DataFrame({"cause": causes, "kind": [cause_kind(x) for x in causes],
                          "baseline_idle_ns": [int(b.get(x, 0)) for x in causes],
                          "candidate_idle_ns": [int(c.get(x, 0)) for x in causes]})
    frame["delta_idle_ns"] = frame["candidate_idle_ns"] - frame["baseline_idle_ns"]
    for arm in (BASELINE, CANDIDATE, "delta"):
        frame[f"{arm}_idle_ms"] = frame[f"{arm}_idle_ns"] / 1e6
    return frame.sort_values(["delta_idle_ns", "cause"], kind="stable").reset_index(drop=True)


def format_causes(frame: pd.DataFrame, *, rows: int = 15) -> list[str]:
    """The table of `idle_by_cause` as lines, in milliseconds, with its legend."""
    lines = ["all-rank idle by cause (the innermost host range running while no rank was busy)",
             f"{'idle_ms':>12} {'share':>7} {'inclusive_ms':>13} {'ranks':>5}  "
             f"{'kind':<10} cause"]
    for r in frame.head(rows).itertuples(index=False):
        lines.append(f"{r.idle_ms:12.3f} {100 * r.share_of_idle:6.1f}% "
                     f"{r.inclusive_idle_ns / 1e6:13.3f} {r.ranks:>5}  {r.kind:<10} {r.cause}")
    if len(frame) > rows:
        lines.append(f"... {len(frame) - rows} more")
    lines.append("Unit: milliseconds. idle: attributed to the innermost range (the rows add up "
                 "to the all-rank idle time); inclusive: every idle instant inside the name's "
                 "ranges, nested ones included; '(no host range)': no host range on any rank.")
    return lines
