"""The paired-profile notebook: frames, notes and `results.json` rendered from the run's
`residency.evidence.Evidence` (nothing is computed here that the evidence does not hold)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from residency import evidence
from residency.evidence import PAIRED_ARMS, Evidence
from residency.humanize import md_text, sig
from residency.notebook.outputs import statistical_note
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

ATTRIBUTIONS = {  # evidence key -> words (also the consecutive notebook's count notes)
    "normal_call_per_rank": "normal-call duration per rank, profiled pair",
    "normal_call_per_run": "normal-call duration per call, one value per run",
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

__all__ = ["ATTRIBUTIONS", "PER_RUN_COLUMNS", "cross_device", "e2e_frame", "evidence_tables",
           "release_reason",
           "first_screen", "first_screen_notes", "headline", "notes",
           "normal_call_frame",
           "note", "paired_profile", "paired_results", "per_run_frame", "releases_frame"]


def cross_device(run: Run, compare: list[str]) -> tuple[pd.DataFrame, Any, list[dict[str, Any]]]:
    """This run beside the `compare` runs and the published NPU figures: the cross-device
    table (`residency.reports.cross_device`), its normal-call figure (log scale) and the
    columns for `results.json`."""
    from residency.evidence.crossdevice import cross_device as columns_of
    from residency.notebook.params import loaded_run
    from residency.reports.cross_device import cross_device_table, normal_call_figure

    cols = columns_of([run, *(loaded_run(c) for c in compare)], published=True)
    return cross_device_table(cols), normal_call_figure(cols), [c.to_dict() for c in cols]


def paired_profile(run: Run, aa: Run | str | None = None) -> Evidence:
    """The evidence of a paired-profile run (`residency.evidence.build`, traces analysed);
    with `aa` (an A/A run or its directory) also its E2E noise, which the unprofiled E2E
    delta is read against; a directory is taken as this execution read it, `loaded_run`)."""
    from residency.notebook.params import loaded_run

    if aa is None:
        return evidence.build(run)
    return evidence.build(run, aa=aa if isinstance(aa, Run) else loaded_run(aa))


def first_screen(ev: Evidence, run: Run) -> str:
    """Markdown for the top of the report (`residency.summary`): the E2E verdict with its
    relative size, scope and n; one row per attribution (baseline, candidate, change, n and
    unit of analysis, verdict); what the run can and cannot say about an NPU; warnings
    (emulated shares of E2E far from the published ones, a loaded host)."""
    from residency.reports.summary import first_screen_markdown, summarize

    return first_screen_markdown(summarize(ev, manifest=run.manifest))


def first_screen_notes(ev: Evidence, run: Run) -> str:
    """Markdown: one short note per first-screen attribution, the runs' scope (attribution
    of decisions, warm-ups per kind) and the host load, each said once."""
    from residency.reports.summary import notes_markdown, summarize

    return notes_markdown(summarize(ev, manifest=run.manifest))


def headline(ev: Evidence, run: Run) -> str:
    """The first screen (`first_screen`), kept under its former name."""
    return first_screen(ev, run)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(])")


def notes(ev: Evidence, keys: tuple[str, ...] | list[str]) -> list[str]:
    """The notes of several attributions shown together (`note`), no sentence said twice: a
    sentence an earlier note of the group already said is left out of the later ones, and
    the statistical unit and the scope are said once, under the last note of the run of
    notes that share them ("Judged on (all 3): ...")."""
    found = [(k, ev.get(k)) for k in keys]
    present = [a for _, a in found if a is not None]
    judged = [a.judged_on for a in present]
    scopes = [a.scope.describe() for a in present]
    out, said, i = [], set(), 0
    for key, a in found:
        if a is None:
            out.append(note(ev, key))
            continue
        body = []
        for sentence in _SENTENCE_END.split(a.note.strip()):
            if sentence and sentence not in said:
                body.append(sentence)
                said.add(sentence)
        tail = []
        for label, values in (("Judged on", judged), ("Scope", scopes)):
            if i + 1 < len(values) and values[i + 1] == values[i]:
                continue  # said under a later note
            same = 1
            while i - same >= 0 and values[i - same] == values[i]:
                same += 1
            tail.append(f"{label}{f' (all {same})' if same > 1 else ''}: "
                        f"{md_text(values[i])}.")
        text = (md_text(" ".join(body)) if body else
                f"As for {md_text(ATTRIBUTIONS.get(present[i - 1].key, present[i - 1].key))}"
                " above.")
        if tail:
            text += " *" + " ".join(tail) + "*"
        out.append(statistical_note(text, what=ATTRIBUTIONS.get(a.key, a.key)))
        i += 1
    return out


def note(ev: Evidence, key: str) -> str:
    """The Markdown statistical note of one attribution (or why there is none), with the
    statistical unit it was judged on and its scope."""
    a = ev.get(key)
    what = ATTRIBUTIONS.get(key, key)
    if a is None:
        return statistical_note("No data for this attribution in this run: nothing to test.",
                                what=what)
    # (plain words holding run and rank names from the run: escaped, as every run text)
    return statistical_note(f"{md_text(a.note)} *Judged on: {md_text(a.judged_on)}. Scope: "
                            f"{md_text(a.scope.describe())}.*", what=what)


def release_reason(ev: Evidence) -> str:
    """One sentence on why the baseline's normal calls released in this run, from its own
    counts (never from the device's name): every normal call's telemetry read failed (the
    bug), some did, or none did (the generic query answers on this device, so both arms
    decide by the bounds)."""
    errors, released = ev.get("telemetry_errors"), ev.get("normal_released")
    if errors is None or released is None or not released.n.get(BASELINE):
        return "This run recorded no baseline normal calls to explain."
    k_err, k_rel = int(errors.values[BASELINE][0]), int(released.values[BASELINE][0])
    n = int(released.n[BASELINE])
    c_err = int(errors.values[CANDIDATE][0]) if errors.n.get(CANDIDATE) else 0
    if k_err == 0:
        return (f"Here the baseline's generic telemetry answered on every normal call (0 of {n} "
                f"failed reads; {k_rel} of {n} released by the bounds): on {ev.device_kind} "
                "the bug does not show, and both arms decide by the bounds.")
    return (f"Here the baseline's generic telemetry read failed on {k_err} of {n} normal "
            f"calls, and each such call released the cache ({k_rel} of {n} released); the "
            f"candidate's reads failed {c_err} times.")


def normal_call_frame(ev: Evidence) -> pd.DataFrame:
    """Rank x arm table of normal-call durations of the profiled pair (ms, each rank's median
    per call)."""
    a = ev.get("normal_call_per_rank")
    ranks = {arm: list(a.detail["ranks"][arm]) if a else [] for arm in PAIRED_ARMS}
    values = {arm: dict(zip(ranks[arm], a.values[arm], strict=True)) if a else {}
              for arm in PAIRED_ARMS}
    rows = [{"rank": r, **{f"{arm} (ms)": values[arm].get(r) for arm in PAIRED_ARMS}}
            for r in sorted(set(ranks[BASELINE]) | set(ranks[CANDIDATE]))]
    df = pd.DataFrame(rows, columns=["rank", "baseline (ms)", "candidate (ms)"])
    with np.errstate(divide="ignore", invalid="ignore"):
        df["baseline / candidate"] = (df["baseline (ms)"].astype(float)
                                      / df["candidate (ms)"].astype(float))
    return df.set_index("rank")


PER_RUN_COLUMNS = ["run", "arm", "profiled", "normal calls", "per-call range (ms)",
                   "per rank, median per call (ms)", "median per call (ms)"]


def per_run_frame(ev: Evidence) -> pd.DataFrame:
    """One row per run of the per-run comparison (unprofiled runs, or profiled ones when
    the design has no others; never both): arm, its number of normal calls, their range, each
    rank's median per call and the run's median per call (ms), the value compared."""
    a = ev.get("normal_call_per_run")
    rows = []
    if a is not None:
        for arm in PAIRED_ARMS:
            for name, prof, med, ranks, rng, calls in zip(
                    a.labels[arm], a.detail["profiled"][arm], a.values[arm],
                    a.detail["per_rank_ms"][arm], a.detail["per_call_range_ms"][arm],
                    a.detail["calls"][arm], strict=True):
                rows.append({"run": name, "arm": arm,
                             "profiled": "profiled" if prof else "unprofiled",
                             "normal calls": calls,
                             "per-call range (ms)": f"{sig(rng[0])}–{sig(rng[1])}",
                             "per rank, median per call (ms)": ", ".join(sig(v) for v in ranks),
                             "median per call (ms)": med})
    return pd.DataFrame(rows, columns=PER_RUN_COLUMNS).set_index("run")


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
    """One row per pair: the pair's name as every view gives it (`humanize.pair_names`: the
    profiled pair by name, the unprofiled pairs 1..K as the statistical notes number them),
    E2E of each arm (s) and the delta candidate - baseline (s)."""
    from residency.humanize import pair_names

    rows = []
    for key in ("e2e_profiled", "e2e_unprofiled"):
        a = ev.get(key)
        if a is None:
            continue
        values = list(zip(a.values[BASELINE], a.values[CANDIDATE], strict=True))
        names = pair_names(len(values), 0)[0] if key == "e2e_profiled" else \
            pair_names(0, len(values))[1]
        for name, (b, c) in zip(names, values, strict=True):
            rows.append({"pair": name, "baseline (s)": b, "candidate (s)": c,
                         "delta (s)": c - b})
    return pd.DataFrame(rows, columns=["pair", "baseline (s)", "candidate (s)", "delta (s)"])


def _e2e_lists(ev: Evidence, key: str) -> dict[str, list[float]]:
    a = ev.get(key)
    return {arm: list(a.values[arm]) if a else [] for arm in PAIRED_ARMS}


def paired_results(ev: Evidence, *, manifest: Any = None, **extra: Any) -> dict[str, Any]:
    """The `results.json` of paired_profile, rendered from the evidence: `device_kind`,
    `normal_call_ms` (per-rank lists by rank, profiled pair), `normal_call_per_run_ms`,
    `idle_intersection_ms`, `e2e_s` (the unprofiled pairs when there are any, else the
    profiled pair; `e2e_s_source` says which), `notes`, counts, the other idle figures, both
    E2E lists, `e2e_verdict` (one sentence, unprofiled pairs), `e2e_aa_s` (the A/A noise when
    given), `evidence` (every attribution with values, n, unit, statistical unit, scope,
    p-value and note), `summary` (the first screen, `residency.summary`; `manifest`, the
    run's, adds its scope and host load) and `extra`."""
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
    source = "unprofiled" if unprofiled[BASELINE] else "profiled"
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
        "run_dir": str(ev.run_dir), "evidence": ev.to_dict(),
        "summary": _summary_dict(ev, manifest), **extra}


def _summary_dict(ev: Evidence, manifest: Any) -> dict[str, Any]:
    from residency.reports.summary import summarize

    return summarize(ev, manifest=manifest).to_dict()


def evidence_tables(ev: Evidence) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's evidence table and the published NPU figures, in the same columns."""
    from residency.reports import tables as tb

    return tb.evidence_table(ev), tb.published_table()
