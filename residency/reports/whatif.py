"""What-if, told: the notebook's `results.json` document and the text `residency whatif
RUN_DIR` prints. The replay itself is `residency.analysis.whatif`, the effect model (predicted
releases x per-call costs measured in the same run's evidence) `residency.evidence.whatif`.
No torch here."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from residency import devices, humanize
from residency.analysis.whatif import (
    Policy,
    consistency,
    replay_run,
    totals,
)
from residency.evidence.whatif import EffectEstimate, estimated_effect
from residency.humanize import csv_comment, csv_text
from residency.jsonio import frame_records
from residency.policy.cache import CANDIDATE
from residency.rundir.run import Run

__all__ = ["effect_lines", "gate_lines", "report", "results", "totals_lines"]

# ----------------------------------------------------------------------------- notebook
def _own(grid: pd.DataFrame) -> list[dict[str, float]]:
    return [{"max_cached_fraction": c, "min_free_fraction": f}
            for c, f in grid.attrs.get("own_settings", [])]


def results(gate: pd.DataFrame, bounded: pd.DataFrame, learned: pd.DataFrame,
            effect: EffectEstimate, *, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The `results.json` document of the notebook: device kind, gate, both grids' totals,
    the estimated effect, and `files` (name -> path) written beside it."""
    tb, tl = totals(bounded), totals(learned)
    return {
        "device_kind": bounded.attrs.get("device_kind"),
        "run": bounded.attrs.get("path"),
        "arm": bounded.attrs.get("arm"),
        "own_setting": _own(bounded),
        "consistency": {"checked": int(gate.attrs.get("checked", 0)),
                        "mismatches": frame_records(gate), "passed": gate.empty},
        "bounded": frame_records(tb.drop(columns=["released_per_rank"])),
        "learned_budget": frame_records(tl.drop(columns=["released_per_rank"])),
        "estimated_effect": effect.to_dict(),
        "skipped": bounded.attrs.get("skipped", {}),
        "note": _replay_note(bounded),
        "files": dict(files or {}),
    }


# ----------------------------------------------------------------------------- formatters
def _replay_note(grid: pd.DataFrame) -> str:
    a = grid.attrs
    skipped = a.get("skipped") or {}
    skip = ("; not replayable (no snapshot): " + ", ".join(
        f"{n} {r}" for r, n in sorted(skipped.items()))) if skipped else ""
    warm = ("warm-up requests excluded from the counts (replayed first only to carry the "
            "learned budget's peak: warmup_* columns)" if a.get("warmup", True) else
            "warm-up requests excluded (not replayed either)")
    return (f"calls: normal decisions with a memory snapshot of the {a.get('arm')} arm's "
            f"measured requests, runs {', '.join(a.get('runs', []))}; {warm}"
            f"{skip}. The replay re-evaluates the recorded snapshots; it does not model how a "
            f"different decision would have changed later memory states. "
            f"{devices.note(str(a.get('device_kind')))}")


def gate_lines(gate: pd.DataFrame) -> list[str]:
    """The consistency gate's verdict, and one line per mismatch."""
    a = gate.attrs
    own = ", ".join(f"max_cached_fraction {c:g}, min_free_fraction {f:g}"
                    for c, f in a.get("own_settings", []))
    what = (f"{a.get('checked')} recorded normal decisions (runs {', '.join(a.get('runs', []))};"
            f" ranks {', '.join(map(str, a.get('ranks', [])))}) replayed with their own bounds "
            f"({own}); warm-up decisions included, unlike the counts below, which are of the "
            "measured requests only")
    if gate.empty:
        return [f"Consistency gate: PASS: all {what} reproduced their recorded outcome and "
                "reason."]
    lines = [f"Consistency gate: FAIL: {len(gate)} of {what} differ:"]
    for r in gate.itertuples(index=False):
        lines.append(f"  run {r.run} rank {r.rank} request {r.request_id} start_ns {r.start_ns}:"
                     f" recorded {r.recorded_outcome} ({r.recorded_reason}), replayed "
                     f"{r.replayed_outcome} ({r.replayed_reason}); cached {r.cached} free "
                     f"{r.free} total {r.total}")
    return lines


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    from residency.humanize import write_markdown_table

    return write_markdown_table(header, rows).rstrip("\n").split("\n")


def _pct(x: float) -> str:
    return humanize.percent(x)


def totals_lines(grid: pd.DataFrame) -> list[str]:
    """Markdown lines: per setting retained/released totals, the own setting marked `*`."""
    a = grid.attrs
    t = totals(grid)
    ranks = sorted(int(r) for r in grid["rank"].unique())
    rows = [(f"{r.max_cached_fraction:g}{' *' if r.own else ''}", f"{r.min_free_fraction:g}",
             r.calls, r.retained, r.released, _pct(r.retention_rate),
             ", ".join(f"r{k} {v}" for k, v in zip(ranks, r.released_per_rank, strict=True)),
             f"{r.warmup_released}/{r.warmup_calls}")
            for r in t.itertuples(index=False)]
    head = ("max_cached_fraction", "min_free_fraction", "calls", "retained", "released",
            "retention", "released per rank", "warm-up released/calls (not counted)")
    return ([f"### What-if: {a.get('policy')} policy on {Path(str(a.get('path'))).name} "
             f"(device kind {a.get('device_kind')})", ""] + _md_table(head, rows)
            + ["", f"*`*` marks the run's own bounds. {_replay_note(grid)}*"])


def effect_lines(effect: EffectEstimate) -> list[str]:
    """Markdown lines: the estimated normal-call time per setting, and the model's note."""
    def ms(x: float) -> str:
        return "n/a" if not math.isfinite(x) else humanize.sig(x)

    rows = [(f"{r.max_cached_fraction:g}{' *' if r.own else ''}", f"{r.min_free_fraction:g}",
             f"{r.released}/{r.calls}", ms(r.estimated_ms),
             "n/a" if not (math.isfinite(r.estimated_low_ms)
                           and math.isfinite(r.estimated_high_ms))
             else humanize.span_text(r.estimated_low_ms, r.estimated_high_ms, ""),
             "n/a" if not math.isfinite(r.delta_vs_own_ms) else humanize.signed(r.delta_vs_own_ms))
            for r in effect.table.itertuples(index=False)]
    head = ("max_cached_fraction", "min_free_fraction", "measured released/calls",
            "estimated ms", "low-high ms", "vs own ms")
    return (["### Estimated effect on normal-call time (a model, not a measurement)", ""]
            + _md_table(head, rows) + ["", f"*Units: ms, summed over ranks. {effect.note}*"])


# ----------------------------------------------------------------------------- report
def report(run: Run, *, cached: str = "0.05:0.5:0.05", free: str = "0.01:0.2:0.01",
           policy: Policy = "bounded", arm: str = CANDIDATE, fmt: str = "md"
           ) -> tuple[str, bool]:
    """What `residency whatif` prints: the gate, then (only when it passes) the totals and
    the effect, as `fmt` (md, csv or json); returns (text, gate passed).

    Raises:
        WhatIfError: a bad range or policy, or nothing to replay.
    """
    gate = consistency(run)
    grid = effect = None
    if gate.empty:
        grid = replay_run(run, cached=cached, free=free, policy=policy, arm=arm)
        effect = estimated_effect(run, grid)
    if fmt == "json":
        doc: dict[str, Any] = {"consistency": {
            "passed": gate.empty, "checked": gate.attrs["checked"],
            "mismatches": frame_records(gate)}}
        if grid is not None and effect is not None:
            doc["whatif"] = {"policy": policy, "device_kind": run.device_kind,
                             "own_settings": _own(grid),
                             "note": _replay_note(grid), "rows": frame_records(grid),
                             "totals": frame_records(totals(grid))}
            doc["estimated_effect"] = effect.to_dict()
        text = json.dumps(doc, indent=2, ensure_ascii=False)
    elif fmt == "csv":
        parts = [csv_comment(line) for line in gate_lines(gate)]
        if not gate.empty:
            parts.append(csv_text(gate).rstrip("\n"))
        if grid is not None and effect is not None:
            parts += ["", csv_comment(_replay_note(grid)), csv_text(grid).rstrip("\n"),
                      "", csv_comment(effect.note), csv_text(effect.table).rstrip("\n")]
        text = "\n".join(parts)
    else:
        lines = gate_lines(gate)
        if grid is not None and effect is not None:
            lines += ["", *totals_lines(grid), "", *effect_lines(effect)]
        else:
            lines.append("What-if not computed: the replay does not reproduce the recorded "
                         "decisions, so its counts for other bounds would not be trustworthy.")
        text = "\n".join(lines)
    return text, gate.empty
