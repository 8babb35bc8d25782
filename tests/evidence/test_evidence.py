"""The evidence model: known answers on the recorded runs, every view agreeing with it, the
scope rule, and immutability."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from residency import evidence
from residency import notebook as nb
from residency.analysis import whatif
from residency.evidence import whatif as whatif_effect
from residency.records.manifest import read_manifest, write_manifest
from residency.rundir.run import load_run
from tests.helpers import PAIRED, ROOT, run_cli

CONSECUTIVE = ROOT / "data" / "runs" / "emulated-consecutive-2r2s"


# ----------------------------------------------------------------------------- known answers
def test_per_run_normal_calls_are_judged_on_the_run(paired_evidence: evidence.Evidence) -> None:
    a = paired_evidence["normal_call_per_run"]
    # issue 25: profiled and unprofiled runs are never pooled; the value is per call
    assert a.n == {"baseline": 3, "candidate": 3} and a.judged_on.startswith("run")
    # 3 baseline runs vs 3 candidate runs, completely separated: exact p = 2/C(6,3) = 2/20
    assert a.p_value == pytest.approx(2 / 20, rel=1e-12)
    assert "3 vs 3 runs" in a.note and "Unit: the service run" in a.note
    assert a.detail["profiled"] == {"baseline": (False, False, False),
                                    "candidate": (False, False, False)}
    assert "per call" in a.metric and "not pooled" in a.note
    for arm in ("baseline", "candidate"):
        for v, (lo, hi) in zip(a.values[arm], a.detail["per_call_range_ms"][arm], strict=True):
            assert lo <= v <= hi


def test_per_rank_view_is_a_description_without_p(paired_evidence: evidence.Evidence) -> None:
    a = paired_evidence["normal_call_per_rank"]
    assert a.kind == "description" and a.p_value is None and a.result is None
    assert a.scope.runs == ("00-baseline", "01-candidate") and "every rank" in a.judged_on
    assert "p=" not in a.note and "p = " not in a.note


def test_learned_budget_on_measured_requests_releases_0_of_8() -> None:
    grid = whatif.replay_run(PAIRED, cached="0.25", free="0.05", policy="learned-budget")
    assert int(grid["calls"].sum()) == 8 and int(grid["released"].sum()) == 0
    assert int(grid["warmup_released"].sum()) > 0  # warm-up calls replayed, never counted


def test_scope_rule_warm_up_excluded_except_where_said(paired_evidence: evidence.Evidence) -> None:
    for a in paired_evidence:
        assert a.scope.warmup is (a.key == "replay_gate"), a.key
        assert ("warm-up included" in a.scope.describe()) is a.scope.warmup
    # 4 runs x 2 ranks x one measured request, of 3 requests per rank recorded
    assert paired_evidence["normal_released"].n == {"baseline": 8, "candidate": 8}
    assert paired_evidence["replay_gate"].n["all"] == 24


def test_counts_say_what_a_clopper_pearson_interval_supports(paired_evidence) -> None:
    note = paired_evidence["normal_released"].note
    assert "deterministic rule" in note and "clustered" in note and "4 runs x 2 ranks" in note


def test_e2e_labels_median_of_deltas_and_uses_a_robust_spread(paired_evidence) -> None:
    a = paired_evidence["e2e_unprofiled"]
    assert "Median of the paired deltas" in a.note and "not the delta of the medians" in a.note
    assert "1.4826 x MAD" in a.note and "SD of the deltas" not in a.note
    d = np.array(a.detail["deltas_s"])
    assert a.detail["median_of_deltas_s"] == pytest.approx(float(np.median(d)))


# ----------------------------------------------------------------------------- all views agree
def _tables_json(run_dir: Path) -> dict:
    rc, out, err = run_cli("tables", str(run_dir), "--format", "json")
    assert (rc, err) == (0, "")
    return json.loads(out)


def test_paired_report_tables_json_and_whatif_effect_give_identical_numbers(
        tmp_path: Path) -> None:
    run = load_run(PAIRED)
    ev = nb.paired_profile(run)
    results = json.loads(nb.write_results(tmp_path, nb.paired_results(ev)).read_text())
    report = results["evidence"]["attributions"]
    table = {r["attribution"]["key"]: r["attribution"] for r in _tables_json(PAIRED)["rows"]
             if "key" in r.get("attribution", {})}
    shared = set(report) & set(table)
    assert {"normal_call_per_rank", "normal_call_per_run", "normal_released",
            "forced_released", "telemetry_errors", "idle_intersection", "all_rank_idle",
            "preparation_window", "e2e_profiled", "e2e_unprofiled"} <= shared
    for key in sorted(shared):
        for field in ("values", "n", "p_value", "unit", "judged_on", "scope", "note"):
            assert report[key][field] == table[key][field], (key, field)
    # the notebook's own keys are the same numbers
    assert results["normal_call_ms"] == report["normal_call_per_rank"]["values"]
    assert results["e2e_s"] == report["e2e_unprofiled"]["values"]
    assert results["normal_calls"]["candidate"] == {
        "total": report["normal_released"]["n"]["candidate"],
        "released": report["normal_released"]["values"]["candidate"][0]}

    grid = whatif.replay_run(run, cached="0.25", free="0.05")
    effect = whatif_effect.estimated_effect(run, grid).to_dict()
    own = next(r for r in effect["rows"] if r["own"])
    assert (own["calls"], own["released"]) == (
        report["normal_released"]["n"]["candidate"],
        report["normal_released"]["values"]["candidate"][0])
    samples = report["normal_call_durations"]
    outcome = samples["detail"]["outcome"]
    release = [v for v, o in zip(samples["values"]["baseline"], outcome["baseline"],
                                 strict=True) if o == "released"]
    retain = [v for v, o in zip(samples["values"]["candidate"], outcome["candidate"],
                                strict=True) if o == "retained"]
    assert effect["release_cost_ms"] == pytest.approx(float(np.median(release)), abs=0)
    assert effect["retain_cost_ms"] == pytest.approx(float(np.median(retain)), abs=0)
    assert (effect["release_samples"], effect["retain_samples"]) == (8, 8)
    assert effect["recorded_ms"] == pytest.approx(sum(samples["values"]["candidate"]), abs=0)
    # the cost comparison is judged on the run (each run's median call): 4 vs 4 runs, the
    # profiled pair included (the what-if model prices calls of every measured run), while
    # the per-run attribution compares the 3 vs 3 unprofiled runs only (issue 25: never
    # pooled); both are exact Mann-Whitney on completely separated runs
    assert effect["cost_p_value"] == pytest.approx(2 / 70, rel=1e-12)
    assert report["normal_call_per_run"]["p_value"] == pytest.approx(2 / 20, rel=1e-12)
    assert "p=0.000155" not in effect["note"] and "4 vs 4 runs" in effect["note"]


def test_consecutive_views_render_the_evidence() -> None:
    run = load_run(CONSECUTIVE)
    ev = evidence.build(run, traces=False)
    summary = nb.consecutive_summary(run)
    totals = ev["requests"].detail["totals"]
    assert (summary["normal_total"], summary["normal_retained"], summary["forced_total"],
            summary["forced_released"], summary["telemetry_errors"], summary["oom"]) == (
        totals["normal_checks"], totals["normal_retained"], totals["forced"],
        totals["forced_released"], totals["telemetry_errors"], totals["oom"])
    assert nb.gate_failures(run) == [] and ev["replay_gate"].detail["passed"] is True


# ----------------------------------------------------------------------------- the model
def test_evidence_is_immutable(paired_evidence: evidence.Evidence) -> None:
    a = paired_evidence["normal_released"]
    with pytest.raises(TypeError):
        a.values["baseline"] = (0,)  # type: ignore[index]
    with pytest.raises(AttributeError):
        a.note = "changed"  # type: ignore[misc]
    assert isinstance(a.values["baseline"], tuple)


def test_a_new_attribution_is_one_function() -> None:
    @evidence.attributor("test_run_count")
    def _count(data: evidence.RunData) -> evidence.Attribution:
        return evidence.Attribution(
            key="test_run_count", metric="runs", kind="tally", unit="runs",
            values={a: [len(data.entries(a))] for a in evidence.PAIRED_ARMS},
            n={a: len(data.entries(a)) for a in evidence.PAIRED_ARMS}, judged_on="run",
            scope=evidence.Scope(runs=tuple(e.name for e in data.run.runs)),
            note=f"Runs; compared with {data.inputs.get('reference', 'nothing')}.")

    try:
        ev = evidence.build(load_run(PAIRED), traces=False, keys=("test_run_count",),
                            reference="another run")  # extra inputs reach the attributors
        assert ev.keys() == ("test_run_count",)
        assert ev["test_run_count"].note == "Runs; compared with another run."
        assert ev["test_run_count"].values == {"baseline": (4,), "candidate": (4,)}
    finally:
        del evidence.ATTRIBUTORS["test_run_count"]


def test_missing_attribution_names_what_is_present() -> None:
    ev = evidence.build(load_run(CONSECUTIVE), traces=False)
    assert ev.get("normal_call_per_rank") is None
    with pytest.raises(KeyError, match="present: .*requests"):
        ev["normal_call_per_rank"]


def test_unprofiled_e2e_carries_the_equivalence_test_and_a_verdict() -> None:
    """Issue 16: the E2E claim is a significant delta, equivalence within a declared margin
    (TOST), or an honest 'no verdict' -- stated under the attribution in every view."""
    ev = evidence.build(load_run(PAIRED), keys=("e2e_unprofiled",))
    a = ev["e2e_unprofiled"]
    margin = 0.02 * float(np.median(a.values["baseline"]))  # issue 25: the median shown
    assert a.detail["equivalence_margin_s"] == pytest.approx(margin, rel=1e-15)
    assert "TOST" in a.note and "2 % of the baseline median E2E" in a.note
    assert a.detail["equivalence"] in ("equivalent", "not equivalent", "cannot tell")
    verdict = a.detail["verdict"]  # said once on a page: the first screen's E2E line
    assert ("Verdict:" in verdict) != ("No verdict:" in verdict) and verdict not in a.note
    assert a.detail["equivalent"] is (a.detail["equivalence_p"] is not None
                                      and a.detail["equivalence_p"] < 0.05)


def test_tost_margin_is_two_percent_of_numpy_median_with_an_even_number_of_pairs(
        tmp_path: Path) -> None:
    """Issue 25: with an even number of pairs the median shown (numpy.median, the mean of the
    two middle values) is not the upper median sorted(base)[n // 2] the margin once used."""
    import shutil

    copy = tmp_path / "two-pairs"
    shutil.copytree(PAIRED, copy)
    manifest = read_manifest(copy)
    manifest["runs"] = manifest["runs"][:-2]  # the profiled pair and 2 unprofiled pairs
    write_manifest(copy, manifest)
    a = evidence.build(load_run(copy, verify=False), keys=("e2e_unprofiled",))[
        "e2e_unprofiled"]
    base = list(a.values["baseline"])
    assert len(base) == 2 and base[0] != base[1]
    assert a.detail["baseline_median_s"] == pytest.approx(float(np.median(base)), rel=1e-15)
    assert a.detail["equivalence_margin_s"] == pytest.approx(0.02 * float(np.median(base)),
                                                             rel=1e-15)
    assert a.detail["equivalence_margin_s"] != pytest.approx(0.02 * sorted(base)[1],
                                                             rel=1e-9)
