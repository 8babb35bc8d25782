"""Cross-checks of the idle figures against what the traces say of themselves: device tasks of
types the busy definitions do not list, torch-npu's own Overlap Analysis Free time and its
per-step ``step_trace_time.csv``. Each disagreement is one warning quoting both figures."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from residency.analysis.idle.model import RankReduction
from residency.traces import busy as busydef
from residency.traces import intervals as iv

__all__ = ["check_free", "step_checks", "type_label", "warn_unknown"]


def warn_unknown(definition: busydef.BusyDefinition,
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
        listed = ", ".join(f"{type_label(ty)} x {n}" for ty, n in sorted(unknown.items()))
        warnings.warn(f"device tasks of types not in residency.traces.busy's lists were counted "
                      f"busy ({definition.name}): {listed}", UserWarning, stacklevel=4)


def type_label(task_type: str) -> str:
    return repr(task_type) if task_type else "(no Task Type)"


def step_checks(r: RankReduction) -> tuple[Any, ...]:
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


def check_free(r: RankReduction, window: iv.Intervals, free: int) -> None:
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
