"""What-if replay: consistency gate, policy boundaries, learned-budget order, effect, CLI, notebook.

Fixture `tests/data/rundir/whatif-run/` (emulated-npu, 2 ranks, total 64 GiB, own bounds
0.25/0.05): the candidate arm's normal calls carry snapshots, the baseline's failed telemetry.
Rank 0: warm-up cached 4 GiB and 6 GiB; r0001 cached = int(total*0.25) exactly (retained),
one byte over (released, cached-bound), free = int(total*0.05) exactly (retained), one byte
under (released, free-bound). Rank 1: warm-up 1 GiB; r0001 1.2 GiB, 3 GiB, reserved <
allocated (cached 0). All retained but the two rank-0 releases.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from residency.analysis import whatif
from residency.evidence import whatif as whatif_effect
from residency.policy.cache import retains
from residency.policy.telemetry import MemorySnapshot
from residency.records.client import CLIENT
from residency.records.decisions import decisions_file
from residency.records.manifest import MANIFEST, read_manifest, write_manifest
from residency.records.seal import seal
from residency.reports import whatif as whatif_report
from residency.rundir.run import RunDirError, load_run
from tests.helpers import ROOT, residency, run_cli

FIXTURE = Path(__file__).parent.parent / "data" / "rundir" / "whatif-run"
OLD_FIXTURE = Path(__file__).parent.parent / "data" / "rundir" / "fixture-run"
GIB = 1 << 30
TOTAL = 64 * GIB
L25, F05 = int(TOTAL * 0.25), int(TOTAL * 0.05)


# ----------------------------------------------------------------------------- helpers
def _call(rank: int, request_id: str, start_ns: int, cached: int | None, free: int = 40 * GIB,
          *, total: int = TOTAL, arm: str = "candidate", cached_f: float = 0.25,
          free_f: float = 0.05, duration_ns: int = 1_000_000) -> dict:
    """A normal-decision record; cached None: telemetry failed (no snapshot)."""
    if cached is None:
        snap, reason, error = None, "telemetry-unavailable", "RuntimeError: not a DeviceAllocator"
    else:
        allocated = 8 * GIB
        snap = {"reserved": allocated + cached, "allocated": allocated, "free": free,
                "total": total}
        reason, error = retains(MemorySnapshot(**snap), cached_f, free_f), None
    return {"rank": rank, "request_id": request_id, "arm": arm, "device_kind": "emulated-npu",
            "kind": "normal", "outcome": "retained" if reason == "within-bounds" else "released",
            "reason": reason, "start_ns": start_ns, "end_ns": start_ns + duration_ns,
            "wall_ns": 1_767_600_000_000_000_000 + start_ns, "snapshot": snap, "error": error,
            "max_cached_fraction": cached_f, "min_free_fraction": free_f}


def _rehash(root: Path) -> None:
    """Record the sha256 of every file but the manifest, as a complete run's manifest does."""
    manifest = read_manifest(root)
    manifest["artifacts"] = {
        f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*")) if f.is_file() and f.name != MANIFEST}
    manifest["seal"] = seal(manifest)
    write_manifest(root, manifest)


def _edit(root: Path, rel: str, edit: Callable[[str], str]) -> None:
    """Rewrite one artifact with `edit(text)` and keep the manifest's sha256 list in step."""
    path = root / rel
    path.write_text(edit(path.read_text()))
    _rehash(root)


def _write_run(root: Path, arms: dict[str, dict[int, list[dict]]], *,
               device_kind: str = "emulated-npu") -> Path:
    """A complete run directory with one run per arm; `arms`: arm -> rank -> records (lines
    written in the given order)."""
    runs = []
    for index, (arm, ranks) in enumerate(arms.items()):
        d = root / "runs" / f"{index:02d}-{arm}"
        d.mkdir(parents=True)
        for rank, records in ranks.items():
            (d / f"decisions-rank{rank}.jsonl").write_text(
                "".join(json.dumps({**r, "device_kind": device_kind}) + "\n" for r in records))
        (d / CLIENT).write_text(json.dumps({"arm": arm, "index": index}))
        runs.append({"arm": arm, "index": index, "dir": f"runs/{index:02d}-{arm}",
                     "e2e_s": 1.0, "profiled": False, "request_id": "r0001"})
    (root / MANIFEST).write_text(json.dumps({
        "schema": "residency.run/1", "status": "complete", "device_kind": device_kind,
        "runs": runs}))
    _rehash(root)
    return root


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return residency("whatif", *argv, cwd=ROOT)


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "whatif-run"
    shutil.copytree(FIXTURE, dst)
    return dst


# ----------------------------------------------------------------------------- ranges
@pytest.mark.parametrize(("text", "expected"), [
    ("0.05:0.5:0.05", (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)),
    ("0.25", (0.25,)),
    ((0.01, 0.05, 0.01), (0.01, 0.02, 0.03, 0.04, 0.05)),
    (0.05, (0.05,)),
    ("0:1:0.5", (0.0, 0.5, 1.0)),
    ("0.1:0.35:0.1", (0.1, 0.2, 0.3)),  # stop not on the grid: not exceeded
])
def test_range_is_inclusive_and_float_safe(text: object, expected: tuple) -> None:
    got = whatif.parse_range(text, name="cached")  # type: ignore[arg-type]
    assert got == expected  # exact equality: 0.15 is the literal 0.15, not 0.15000000000000002


def test_default_free_grid_holds_the_published_floor_exactly() -> None:
    grid = whatif.parse_range("0.01:0.2:0.01", name="free")
    assert len(grid) == 20 and 0.05 in grid and 0.07 in grid and grid[-1] == 0.2


@pytest.mark.parametrize("text", ["0.5:0.2:0.1", "a:b:c", "0.1:0.2", "0:2:0.5", "-0.1:0.2:0.1",
                                  "0.1:0.2:0", "0.1:0.2:-0.1", "0:1:0.0001", "0:1:5e-324", "nan",
                                  "", True, [0.1, 0.2], None])
def test_bad_range_names_the_parameter(text: object) -> None:
    with pytest.raises(ValueError, match="`free`"):
        whatif.parse_range(text, name="free")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`cached`"):
        whatif.replay_run(FIXTURE, cached=text)  # type: ignore[arg-type]


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="`policy` must be one of"):
        whatif.replay_run(FIXTURE, policy="greedy")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- gate
def test_own_bounds_reproduce_every_recorded_decision() -> None:
    gate = whatif.consistency(load_run(FIXTURE))
    assert gate.empty
    assert gate.attrs["checked"] == 10 and gate.attrs["ranks"] == [0, 1]
    assert gate.attrs["runs"] == ["01-candidate"]  # the baseline has no snapshot to replay
    d = whatif.replay_decisions(whatif.replayable(FIXTURE))
    assert (d["replayed_outcome"] == d["outcome"]).all()
    assert (d["replayed_reason"] == d["reason"]).all()
    assert sorted(d["reason"].unique()) == ["cached-bound", "free-bound", "within-bounds"]


def test_mismatch_is_reported_with_rank_and_request_id(run_copy: Path) -> None:
    rel = "runs/01-candidate/decisions-rank1.jsonl"
    lines = [json.loads(x) for x in (run_copy / rel).read_text().splitlines()]
    target = next(x for x in lines if x["request_id"] == "r0001" and x["kind"] == "normal")
    target.update(outcome="released", reason="cached-bound")
    _edit(run_copy, rel, lambda _: "".join(json.dumps(x) + "\n" for x in lines))
    gate = whatif.consistency(run_copy)
    assert len(gate) == 1
    row = gate.iloc[0]
    assert (row["rank"], row["request_id"], row["run"]) == (1, "r0001", "01-candidate")
    assert (row["recorded_outcome"], row["replayed_outcome"]) == ("released", "retained")
    assert row["start_ns"] == target["start_ns"]
    text = "\n".join(whatif_report.gate_lines(gate))
    assert text.startswith("Consistency gate: FAIL: 1 of 10") and "rank 1 request r0001" in text


# ----------------------------------------------------------------------------- boundaries
@dataclass(frozen=True)
class Case:
    name: str
    cached: int
    free: int
    reason: str


CASES = [
    Case("cached equal to the bound retains", L25, 40 * GIB, "within-bounds"),
    Case("cached one byte over releases", L25 + 1, 40 * GIB, "cached-bound"),
    Case("free equal to the floor retains", GIB, F05, "within-bounds"),
    Case("free one byte under releases", GIB, F05 - 1, "free-bound"),
    Case("both crossed: cached is checked first", L25 + 1, F05 - 1, "cached-bound"),
    Case("nothing cached retains", 0, 40 * GIB, "within-bounds"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_boundaries_behave_as_the_policy(tmp_path: Path, case: Case) -> None:
    run = _write_run(tmp_path, {"candidate": {0: [_call(0, "r0001", 10, case.cached,
                                                        case.free)]}})
    d = whatif.replay_decisions(whatif.replayable(run), max_cached_fraction=0.25,
                                min_free_fraction=0.05)
    assert d["replayed_reason"].tolist() == [case.reason]
    grid = whatif.replay_run(run, cached="0.25", free="0.05")
    assert int(grid["released"].iloc[0]) == (case.reason != "within-bounds")


def test_vectorised_replay_agrees_with_policy_retains_on_random_snapshots() -> None:
    rng = np.random.default_rng(2101)
    n = 20_000
    total = rng.integers(1, 1 << 50, n)
    # half the values sit exactly on, one below or one above the thresholds
    c_f, f_f = (np.array([round(x, int(k)) for x, k in zip(rng.uniform(0, 1, n),
                                                        rng.integers(1, 17, n), strict=True)])
                for _ in range(2))
    cached_at = np.trunc(total * c_f).astype(np.int64) + rng.integers(-1, 2, n)
    free_at = np.trunc(total * f_f).astype(np.int64) + rng.integers(-1, 2, n)
    edge = rng.random(n) < 0.5
    cached = np.where(edge, cached_at, rng.integers(0, total + 1))
    free = np.where(edge, free_at, rng.integers(0, total + 1))
    allocated = rng.integers(3, 1 << 40, n)
    reserved = np.maximum(0, allocated + cached)
    reserved[::7] = allocated[::7] - 3  # reserved < allocated: cached clamps to 0
    frame = pd.DataFrame({"reserved": reserved, "allocated": allocated, "free": free,
                          "total": total, "max_cached_fraction": c_f, "min_free_fraction": f_f})
    frame["cached"] = (frame["reserved"] - frame["allocated"]).clip(lower=0)
    frame["prev_peak"] = 0
    got = whatif.replay_decisions(frame)["replayed_reason"].tolist()
    want = [retains(MemorySnapshot(int(r.reserved), int(r.allocated), int(r.free),
                                   int(r.total)), float(r.max_cached_fraction),
                    float(r.min_free_fraction)) for r in frame.itertuples()]
    assert got == want
    assert len(set(want)) == 3


# ----------------------------------------------------------------------------- grid
def test_grid_counts_per_rank_and_totals() -> None:
    grid = whatif.replay_run(FIXTURE, cached="0.2:0.3:0.05", free="0.04:0.06:0.01")
    assert list(grid.columns) == list(whatif.GRID_COLUMNS)
    assert len(grid) == 3 * 3 * 2
    own = grid[grid["own"]].set_index("rank")
    # one scope rule: counts are of measured requests; warm-up calls are replayed (they carry
    # the learned budget's peak) and counted apart
    assert own[["calls", "retained", "released"]].to_dict("index") == {
        0: {"calls": 4, "retained": 2, "released": 2}, 1: {"calls": 3, "retained": 3,
                                                            "released": 0}}
    assert own["warmup_calls"].to_dict() == {0: 2, 1: 1}
    t = whatif.totals(grid).set_index(["max_cached_fraction", "min_free_fraction"])
    assert t.loc[(0.25, 0.05), "released"] == 2 and bool(t.loc[(0.25, 0.05), "own"])
    assert t.loc[(0.3, 0.04), "released"] == 0  # both rank-0 releases vanish
    assert t.loc[(0.2, 0.06), "released"] == 4
    assert t["calls"].eq(7).all() and t["warmup_calls"].eq(3).all() and t["own"].sum() == 1
    assert grid.attrs["skipped"] == {} and grid.attrs["runs"] == ["01-candidate"]


def test_warm_up_can_be_left_out() -> None:
    all_ = whatif.replay_run(FIXTURE, cached="0.25", free="0.05")
    measured = whatif.replay_run(FIXTURE, cached="0.25", free="0.05", warmup=False)
    assert all_["calls"].sum() == measured["calls"].sum() == 7
    assert all_["warmup_calls"].sum() == 3 and measured["warmup_calls"].sum() == 0
    assert all_["released"].tolist() == measured["released"].tolist()  # bounded: stateless


# ----------------------------------------------------------------------------- learned budget
def _learned(run: Path | object, cached_f: float = 0.25) -> pd.DataFrame:
    d = whatif.replayable(run)  # type: ignore[arg-type]
    return whatif.replay_decisions(d, max_cached_fraction=cached_f, min_free_fraction=0.05,
                                   policy="learned-budget")


def test_learned_budget_on_the_fixture() -> None:
    d = _learned(FIXTURE)
    by_rank = {r: g["replayed_outcome"].str[:3].tolist() for r, g in d.groupby("rank")}
    # rank 0: peak 0 -> 4 GiB -> 6 GiB -> L25 -> L25+1; the cap int(total*0.25) binds at call 4
    assert by_rank[0] == ["rel", "rel", "rel", "rel", "ret", "rel"]
    assert d.loc[d["rank"] == 0, "replayed_reason"].tolist()[-1] == "free-bound"
    # rank 1: its own peak from 0, not rank 0's: 1 GiB released, 1.2 <= 1.25, 3 > 1.5, 0
    assert by_rank[1] == ["rel", "ret", "rel", "ret"]
    grid = whatif.replay_run(FIXTURE, cached="0.25", free="0.05", policy="learned-budget")
    # counted: measured requests only (rank 0: calls 3-6, rank 1: calls 2-4)
    assert grid.set_index("rank")["released"].to_dict() == {0: 3, 1: 1}
    assert grid.set_index("rank")["warmup_released"].to_dict() == {0: 2, 1: 1}


def test_learned_budget_decides_before_the_peak_learns_the_call(tmp_path: Path) -> None:
    """Upstream `_should_release`: compare against the earlier peak, then record the call."""
    run = _write_run(tmp_path, {"candidate": {0: [_call(0, "r0001", 10, 4 * GIB),
                                                  _call(0, "r0001", 20, 4 * GIB),
                                                  _call(0, "r0001", 30, 5 * GIB),
                                                  _call(0, "r0001", 40, 5 * GIB + 1)]}})
    d = _learned(run)
    assert d["prev_peak"].tolist() == [0, 4 * GIB, 4 * GIB, 5 * GIB]
    # first call: budget 0 -> releases; 4 <= 5 (=4x1.25); 5 <= 5; 5+1 <= 6.25
    assert d["replayed_outcome"].tolist() == ["released", "retained", "retained", "retained"]
    # the capacity cap still binds: 0.05 of 64 GiB = 3.2 GiB < 4 GiB
    assert _learned(run, 0.05)["replayed_outcome"].eq("released").all()


def test_learned_budget_peak_is_per_rank(tmp_path: Path) -> None:
    big, small = 10 * GIB, 1 * GIB
    run = _write_run(tmp_path, {"candidate": {
        0: [_call(0, "r0001", 10, big), _call(0, "r0001", 30, small)],
        1: [_call(1, "r0001", 20, small), _call(1, "r0001", 40, small)]}})
    d = _learned(run).set_index(["rank", "start_ns"])
    assert d.loc[(1, 20), "prev_peak"] == 0  # rank 0's earlier 10 GiB does not count
    assert d.loc[(1, 20), "replayed_outcome"] == "released"
    assert d.loc[(1, 40), "replayed_outcome"] == "retained"
    assert d.loc[(0, 30), "prev_peak"] == big


def test_learned_budget_peak_follows_call_order_not_line_order(tmp_path: Path) -> None:
    calls = [_call(0, "warmup-r0000", 5, 2 * GIB), _call(0, "r0001", 30, 8 * GIB),
             _call(0, "r0001", 10, 2 * GIB), _call(0, "r0001", 20, 4 * GIB)]
    run = _write_run(tmp_path / "a", {"candidate": {0: calls}})
    d = _learned(run)
    assert d["start_ns"].tolist() == [5, 10, 20, 30]
    assert d["prev_peak"].tolist() == [0, 2 * GIB, 2 * GIB, 4 * GIB]
    assert d["replayed_outcome"].tolist() == ["released", "retained", "released", "released"]
    # requests keep their order of first appearance even when a later request's clock is
    # smaller (e.g. request ids interleaved in one file): warm-up stays first
    later = [_call(0, "warmup-r0000", 50, 2 * GIB), _call(0, "r0001", 10, 2 * GIB)]
    d2 = _learned(_write_run(tmp_path / "b", {"candidate": {0: later}}))
    assert d2["request_id"].tolist() == ["warmup-r0000", "r0001"]
    assert d2["replayed_outcome"].tolist() == ["released", "retained"]


# ----------------------------------------------------------------------------- nothing to replay
def test_npu_baseline_only_run_says_why_nothing_can_be_replayed(tmp_path: Path) -> None:
    run = _write_run(tmp_path, {"baseline": {r: [_call(r, "r0001", 10, None, arm="baseline"),
                                                 _call(r, "r0001", 20, None, arm="baseline")]
                                             for r in range(2)}}, device_kind="npu")
    with pytest.raises(ValueError, match=r"no run of that arm \(arms present: baseline\)"):
        whatif.replay_run(run)
    with pytest.raises(ValueError, match="none of its 4 normal decisions carries a memory "
                                         r"snapshot \(4 telemetry-unavailable\)") as exc:
        whatif.replay_run(run, arm="baseline")
    assert "device kind npu" in str(exc.value) and "telemetry could not be read" in str(exc.value)
    with pytest.raises(ValueError, match="Nothing can be replayed"):
        whatif.consistency(run)


def test_candidate_whose_telemetry_failed_cannot_be_replayed() -> None:
    with pytest.raises(ValueError, match="none of its 4 normal decisions carries"):
        whatif.replay_run(OLD_FIXTURE, arm="baseline")


def test_run_without_normal_calls(tmp_path: Path) -> None:
    forced = {**_call(0, "r0001", 10, None), "kind": "forced", "reason": "forced",
              "outcome": "released"}
    run = _write_run(tmp_path, {"candidate": {0: [forced]}})
    with pytest.raises(ValueError, match="recorded no normal policy calls"):
        whatif.replay_run(run)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("snapshot", {"reserved": "1", "allocated": 0, "free": 1, "total": 2},
     r"field `snapshot\.reserved`: line 1: expected `int \| null`, got `str`"),
    ("max_cached_fraction", None, "lacks a recorded fraction"),
    ("min_free_fraction", 1.5, "lacks a recorded fraction"),
])
def test_malformed_decision_is_refused_naming_the_field(tmp_path: Path, field: str,
                                                        value: object, match: str) -> None:
    run = _write_run(tmp_path, {"candidate": {0: [{**_call(0, "r0001", 10, GIB),
                                                   field: value}]}})
    with pytest.raises(RunDirError, match=match):
        whatif.replay_run(run)


# ----------------------------------------------------------------------------- effect
def test_estimated_effect_prices_predicted_releases_with_measured_costs() -> None:
    grid = whatif.replay_run(FIXTURE, cached="0.25:0.3:0.05", free="0.05")
    effect = whatif_effect.estimated_effect(FIXTURE, grid)
    release = [99.123456, 100.25, 101.5, 102.1, 99.8, 99.123456, 100.25]  # baseline measured
    retain = [1.334, 1.402, 1.579, 1.512, 1.455]  # candidate measured retained
    assert effect.release_cost_ms == pytest.approx(np.median(release))
    assert effect.retain_cost_ms == pytest.approx(np.median(retain))
    assert len(effect.release_samples) == 7 and len(effect.retain_samples) == 5
    t = effect.table.set_index("max_cached_fraction")
    assert t.loc[0.25, "estimated_ms"] == pytest.approx(2 * 100.25 + 5 * 1.455)
    assert t.loc[0.3, "estimated_ms"] == pytest.approx(1 * 100.25 + 6 * 1.455)
    assert t.loc[0.3, "delta_vs_own_ms"] == pytest.approx(-100.25 + 1.455)
    assert t.loc[0.25, "estimated_low_ms"] <= t.loc[0.25, "estimated_ms"] <= \
        t.loc[0.25, "estimated_high_ms"]
    assert effect.recorded_ms == pytest.approx(97.272)
    assert "A model, not a measurement" in effect.note
    assert "not NPU figures" in effect.note and "Mann-Whitney" in effect.note
    assert "97.27 ms" in effect.note  # the model is checked against the measured time
    json.dumps(effect.to_dict())


def test_effect_without_a_measured_release_says_so(tmp_path: Path) -> None:
    run = _write_run(tmp_path, {"candidate": {0: [_call(0, "r0001", 10, GIB)]}})
    effect = whatif_effect.estimated_effect(run, whatif.replay_run(run, cached="0.25", free="0.05"))
    assert effect.release_cost_ms is None and effect.table["estimated_ms"].isna().all()
    assert "No estimate" in effect.note and "no release" in effect.note


# ----------------------------------------------------------------------------- CLI
def test_cli_gate_then_totals_then_effect_with_empty_stderr() -> None:
    out = _cli(str(FIXTURE), "--cached", "0.2:0.3:0.05", "--free", "0.04:0.06:0.01")
    assert out.returncode == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Consistency gate: PASS: all 10 recorded normal decisions")
    text = out.stdout
    assert text.index("### What-if: bounded policy") < text.index("### Estimated effect")
    assert "| 0.25 * | 0.05 | 7 | 5 | 2 | 71.43 % | r0 2, r1 0 | 0/3 |" in lines
    assert "not NPU figures" in text and "A model, not a measurement" in text


def test_cli_json_and_csv() -> None:
    out = _cli(str(FIXTURE), "--cached", "0.25", "--free", "0.05", "--format", "json",
               "--policy", "learned-budget")
    assert out.returncode == 0 and out.stderr == ""
    doc = json.loads(out.stdout)
    assert doc["consistency"] == {"passed": True, "checked": 10, "mismatches": []}
    assert {r["rank"]: r["released"] for r in doc["whatif"]["rows"]} == {0: 3, 1: 1}
    assert doc["estimated_effect"]["note"].startswith("A model, not a measurement")
    csv = _cli(str(FIXTURE), "--cached", "0.25", "--free", "0.05", "--format", "csv")
    assert csv.returncode == 0 and csv.stderr == ""
    assert csv.stdout.startswith("# Consistency gate: PASS")
    assert "policy,max_cached_fraction,min_free_fraction,own,rank" in csv.stdout


def test_cli_exit_1_when_the_gate_fails(run_copy: Path) -> None:
    _edit(run_copy, "runs/01-candidate/decisions-rank0.jsonl",
          lambda text: text.replace('"cached-bound"', '"free-bound"', 1))
    out = _cli(str(run_copy))
    assert out.returncode == 1 and out.stderr == ""
    assert out.stdout.startswith("Consistency gate: FAIL: 1 of 10")
    assert "rank 0 request r0001" in out.stdout and "What-if not computed" in out.stdout


def _cli_in_process(*argv: str) -> tuple[int, str, str]:
    return run_cli("whatif", *argv)


@pytest.mark.parametrize("argv", [
    ("{fixture}", "--free", "x"),
    ("{missing}",),
    ("{old}", "--arm", "baseline"),
])
def test_cli_errors_are_one_line_exit_2(argv: tuple[str, ...], tmp_path: Path) -> None:
    args = [a.format(fixture=FIXTURE, missing=tmp_path / "nope", old=OLD_FIXTURE) for a in argv]
    rc, out, err = _cli_in_process(*args)
    assert rc == 2 and out == ""
    assert err.startswith("residency whatif: error: ") and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_tampered_run_unless_told(run_copy: Path) -> None:
    path = run_copy / "runs" / "01-candidate" / decisions_file(1)
    path.write_text(path.read_text() + "\n")  # sha256 no longer matches the manifest
    rc, out, err = _cli_in_process(str(run_copy), "--cached", "0.25", "--free", "0.05")
    assert rc == 2 and "failed verification" in err
    rc, out, err = _cli_in_process(str(run_copy), "--cached", "0.25", "--free", "0.05",
                                   "--no-verify")
    assert rc == 0 and err == "" and out.startswith("Consistency gate: PASS")


def test_cli_error_through_the_console_entry_point() -> None:
    out = _cli(str(FIXTURE), "--cached", "0.5:0.1:0.1")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("residency whatif: error: The value for `cached`")
    assert len(out.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- notebook
def test_results_document_is_json_ready() -> None:
    run = load_run(FIXTURE)
    bounded = whatif.replay_run(run, cached="0.25", free="0.05")
    learned = whatif.replay_run(run, cached="0.25", free="0.05", policy="learned-budget")
    doc = whatif_report.results(whatif.consistency(run), bounded, learned,
                         whatif_effect.estimated_effect(run, bounded), files={"figure": "x.png"})
    back = json.loads(json.dumps(doc))
    assert back["bounded"][0]["released"] == 2 and back["learned_budget"][0]["released"] == 4
    assert back["consistency"]["passed"] and back["files"] == {"figure": "x.png"}


@pytest.mark.slow
def test_notebook_executes_against_the_fixture(tmp_path: Path) -> None:
    pytest.importorskip("papermill")
    out_dir = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3", "notebooks/policy_whatif.ipynb",
         str(tmp_path / "executed.ipynb"), "-p", "source", str(FIXTURE), "-p", "output_dir",
         str(out_dir), "-p", "cached_range", "0.2:0.3:0.05", "-p", "free_range",
         "0.04:0.06:0.01"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out_dir / "results.json").read_text())
    assert {"device_kind", "run", "arm", "own_setting", "consistency", "bounded",
            "learned_budget", "estimated_effect", "skipped", "note", "files"} <= set(doc)
    assert doc["device_kind"] == "emulated-npu"
    assert doc["consistency"]["passed"] and doc["consistency"]["checked"] == 10
    assert doc["own_setting"] == [{"max_cached_fraction": 0.25, "min_free_fraction": 0.05}]
    assert len(doc["bounded"]) == 9 and len(doc["learned_budget"]) == 9
    assert "A model, not a measurement" in doc["estimated_effect"]["note"]
    assert Path(doc["files"]["figure"]).is_file()
    executed = (tmp_path / "executed.ipynb").read_text()
    assert "not NPU figures" in executed
