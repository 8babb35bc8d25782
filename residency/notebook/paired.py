"""The paired-profile notebook: frames, notes and `results.json` rendered from the run's
`residency.evidence.Evidence` (nothing is computed here that the evidence does not hold)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from residency import devices, evidence
from residency.evidence import PAIRED_ARMS, Evidence
from residency.notebook.outputs import statistical_note
from residency.rundir.run import Run

ATTRIBUTIONS = {  # evidence key -> words (also the consecutive notebook's count notes)
    "normal_call_per_rank": "normal-call duration per rank, profiled pair",
    "normal_call_per_run": "normal-call duration per run",
    "normal_released": "normal calls that released",
    "forced_released": "forced releases that released",
    "idle_intersection": "normal-release markers ∩ all-rank no-device-task time",
    "all_rank_idle": "all-rank no-device-task time",
    "preparation_window": "preparation window",
    "e2e_profiled": "client E2E, profiled pair",
    "e2e_unprofiled": "client E2E, unprofiled pairs",
    "e2e_aa": "client E2E noise, A/A run",
    "normal_retained": "normal checks retained",
}
NOTE_KEYS = ("normal_call_per_rank", "normal_call_per_run", "normal_released",
             "forced_released", "idle_intersection", "all_rank_idle", "preparation_window",
             "e2e_profiled", "e2e_unprofiled", "e2e_aa")

__all__ = ["ATTRIBUTIONS", "e2e_frame", "evidence_tables", "headline",
           "normal_call_frame",
           "note", "paired_profile", "paired_results", "per_run_frame", "releases_frame"]


def paired_profile(run: Run, aa: Run | str | None = None) -> Evidence:
    """The evidence of a paired-profile run (`residency.evidence.build`, traces analysed);
    with `aa` (an A/A run or its directory) also its E2E noise, which the unprofiled E2E
    delta is read against."""
    return evidence.build(run) if aa is None else evidence.build(run, aa=aa)


MAIN_JOB_TARGET_S = 600  # issue 16: the default main job on the emulated NPU, 2 cores


def headline(ev: Evidence, run: Run) -> str:
    """Markdown, two lines for the top of the report: the E2E verdict of the unprofiled
    pairs (or why there is none) and how long recording the run took, with the 10-minute
    target of the default main job when the device is the emulated NPU."""
    from residency.humanize import duration_text
    from residency.reports.banner import elapsed_s

    a = ev.get("e2e_unprofiled")
    verdict = (a.detail.get("verdict") if a is not None else None) or (
        "No verdict: this run has no unprofiled pairs." if a is None else
        "No verdict: E2E of the unprofiled pairs is not positive.")
    aa = ev.get("e2e_aa")
    if aa is not None and a is not None:
        verdict += (f" A/A noise (median |delta| of {aa.n['A']} same-arm pairs): "
                    f"{aa.detail['spread_s']:.3g} s.")
    secs = elapsed_s(run.manifest)
    line = ("recording time not in the manifest" if secs is None else
            f"recording the run took {duration_text(secs)}")
    if secs is not None and devices.emulated(run.device_kind):
        line += (f" (the default main job's target on the emulated NPU with 2 cores: at most "
                 f"{MAIN_JOB_TARGET_S // 60} min, "
                 f"{'met' if secs <= MAIN_JOB_TARGET_S else 'NOT met'}; the notebook's own "
                 f"analysis adds to it)")
    return f"**E2E verdict** (unprofiled pairs, {ev.label}): {verdict}\n\n**Time**: {line}."


def note(ev: Evidence, key: str) -> str:
    """The Markdown statistical note of one attribution (or why there is none), with the
    statistical unit it was judged on and its scope."""
    a = ev.get(key)
    what = ATTRIBUTIONS.get(key, key)
    if a is None:
        return statistical_note("No data for this attribution in this run: nothing to test.",
                                what=what)
    return statistical_note(f"{a.note} *Judged on: {a.judged_on}. Scope: "
                            f"{a.scope.describe()}.*", what=what)


def normal_call_frame(ev: Evidence) -> pd.DataFrame:
    """Rank x arm table of normal-call durations (ms, summed per rank) of the profiled pair."""
    a = ev.get("normal_call_per_rank")
    ranks = {arm: list(a.detail["ranks"][arm]) if a else [] for arm in PAIRED_ARMS}
    values = {arm: dict(zip(ranks[arm], a.values[arm], strict=True)) if a else {}
              for arm in PAIRED_ARMS}
    rows = [{"rank": r, **{f"{arm} (ms)": values[arm].get(r) for arm in PAIRED_ARMS}}
            for r in sorted(set(ranks["baseline"]) | set(ranks["candidate"]))]
    df = pd.DataFrame(rows, columns=["rank", "baseline (ms)", "candidate (ms)"])
    with np.errstate(divide="ignore", invalid="ignore"):
        df["baseline / candidate"] = (df["baseline (ms)"].astype(float)
                                      / df["candidate (ms)"].astype(float)).round(2)
    return df.set_index("rank")


def per_run_frame(ev: Evidence) -> pd.DataFrame:
    """One row per measured run: arm, profiled or not, its per-rank normal-call durations and
    their median (ms): the values of the per-run (cross-run) comparison."""
    a = ev.get("normal_call_per_run")
    rows = []
    if a is not None:
        for arm in PAIRED_ARMS:
            for name, prof, med, ranks in zip(a.labels[arm], a.detail["profiled"][arm],
                                              a.values[arm], a.detail["per_rank_ms"][arm],
                                              strict=True):
                rows.append({"run": name, "arm": arm,
                             "profiled": "profiled" if prof else "unprofiled",
                             "per rank (ms)": ", ".join(f"{v:.6g}" for v in ranks),
                             "median over ranks (ms)": med})
    return pd.DataFrame(rows, columns=["run", "arm", "profiled", "per rank (ms)",
                                       "median over ranks (ms)"]).set_index("run")


def releases_frame(ev: Evidence) -> pd.DataFrame:
    """Per arm: normal calls released of total and forced calls released of total, over all
    measured runs (warm-ups excluded)."""
    def cell(key: str, arm: str) -> str:
        a = ev.get(key)
        return "0/0" if a is None else f"{a.values[arm][0]}/{a.n[arm]}"

    return pd.DataFrame([{"arm": arm, "normal calls released": cell("normal_released", arm),
                          "forced calls released": cell("forced_released", arm)}
                         for arm in PAIRED_ARMS]).set_index("arm")


def e2e_frame(ev: Evidence) -> pd.DataFrame:
    """One row per pair: design (profiled / unprofiled), pair number (numbered once across
    both, profiled first, as in the E2E figure), E2E of each arm (s) and the delta
    candidate - baseline (s)."""
    rows = []
    for key, word in (("e2e_profiled", "profiled"), ("e2e_unprofiled", "unprofiled")):
        a = ev.get(key)
        if a is None:
            continue
        for b, c in zip(a.values["baseline"], a.values["candidate"], strict=True):
            rows.append({"pairs": word, "pair": len(rows) + 1, "baseline (s)": b,
                         "candidate (s)": c, "delta (s)": c - b})
    return pd.DataFrame(rows, columns=["pairs", "pair", "baseline (s)", "candidate (s)",
                                       "delta (s)"]).set_index(["pairs", "pair"])


def _e2e_lists(ev: Evidence, key: str) -> dict[str, list[float]]:
    a = ev.get(key)
    return {arm: list(a.values[arm]) if a else [] for arm in PAIRED_ARMS}


def paired_results(ev: Evidence, **extra: Any) -> dict[str, Any]:
    """The `results.json` of paired_profile, rendered from the evidence: `device_kind`,
    `normal_call_ms` (per-rank lists by rank, profiled pair), `normal_call_per_run_ms`,
    `idle_intersection_ms`, `e2e_s` (the unprofiled pairs when there are any, else the
    profiled pair; `e2e_s_source` says which), `notes`, counts, the other idle figures, both
    E2E lists, `e2e_verdict` (one sentence, unprofiled pairs), `e2e_aa_s` (the A/A noise when
    given), `evidence` (every attribution with values, n, unit, statistical unit, scope,
    p-value and note) and `extra`."""
    def per_arm(key: str) -> dict[str, Any]:
        a = ev.get(key)
        return {arm: (a.values[arm][0] if a else None) for arm in PAIRED_ARMS}

    def counts(key: str) -> dict[str, dict[str, int]]:
        a = ev.get(key)
        return {arm: {"total": a.n[arm] if a else 0, "released": a.values[arm][0] if a else 0}
                for arm in PAIRED_ARMS}

    rank = ev.get("normal_call_per_rank")
    per_run = ev.get("normal_call_per_run")
    unprofiled = _e2e_lists(ev, "e2e_unprofiled")
    source = "unprofiled" if unprofiled["baseline"] else "profiled"
    prep = ev.get("preparation_window")
    return {
        "device_kind": ev.device_kind, "device_label": ev.label,
        "normal_call_ms": {arm: list(rank.values[arm]) if rank else [] for arm in PAIRED_ARMS},
        "normal_call_per_run_ms": {arm: list(per_run.values[arm]) if per_run else []
                                   for arm in PAIRED_ARMS},
        "idle_intersection_ms": per_arm("idle_intersection"),
        "e2e_s": _e2e_lists(ev, f"e2e_{source}"),
        "notes": {k: ev[k].note for k in NOTE_KEYS if k in ev},
        "e2e_s_source": f"{source} pairs",
        "e2e_s_profiled": _e2e_lists(ev, "e2e_profiled"),
        "e2e_s_unprofiled": unprofiled,
        "e2e_verdict": (ev["e2e_unprofiled"].detail.get("verdict")
                        if "e2e_unprofiled" in ev else None),
        "e2e_aa_s": ({"slot_a": list(aa.values["A"]), "slot_b": list(aa.values["B"]),
                      "spread": aa.detail["spread_s"], "cv": aa.detail["cv"],
                      "run": aa.source} if (aa := ev.get("e2e_aa")) else None),
        "normal_calls": counts("normal_released"), "forced_calls": counts("forced_released"),
        "all_rank_idle_s": per_arm("all_rank_idle"),
        "preparation_window_s": per_arm("preparation_window"),
        "preparation_window_source": prep.source if prep else "none recorded",
        "idle_error": ev.idle_error,
        "profiled_pair": list(ev.reference_pair) if ev.reference_pair else None,
        "run_dir": str(ev.run_dir), "evidence": ev.to_dict(), **extra}


def evidence_tables(ev: Evidence) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's evidence table and the published NPU figures, in the same columns."""
    from residency.reports import tables as tb

    return tb.evidence_table(ev), tb.published_table()
