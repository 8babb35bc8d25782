"""Assignment of decisions to requests by wall-clock time (and by id), and its gates."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from residency.records import decisions as decisions_format
from residency.rundir import assignment as at
from residency.rundir.assignment import assign_run, assigned_decisions
from residency.rundir.run import RunDirError, load_run
from tests.helpers import ROOT

RECORDED = sorted((ROOT / "data" / "runs").iterdir())


def frame(rows: list[tuple[int, str, int, str | None]]) -> pd.DataFrame:
    """Decisions: (rank, kind, wall_ns, request_id)."""
    return pd.DataFrame([{"rank": r, "kind": k, "outcome": "released", "reason": "forced",
                          "wall_ns": w, "request_id": rid, "start_ns": 0, "end_ns": 5,
                          "duration_ns": 5, "file": f"decisions-rank{r}.jsonl"}
                         for r, k, w, rid in rows])


CLIENT = {"warmup": {"request_id": None, "start_wall_ns": 100, "end_wall_ns": 200},
          "requests": [{"request_id": None, "start_wall_ns": 200, "end_wall_ns": 300},
                       {"request_id": None, "start_wall_ns": 310, "end_wall_ns": 400}]}


@dataclass(frozen=True)
class Case:
    wall_ns: int
    request: int | None  # None: outside every window
    startup: bool = False  # before the client's first request: the service's start-up


CASES = [  # windows are half-open [start, end)
    Case(99, None, True), Case(100, 0), Case(199, 0), Case(200, 1), Case(299, 1),
    Case(300, None), Case(305, None), Case(310, 2), Case(399, 2), Case(400, None),
    Case(10**18, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c.wall_ns))
def test_time_windows_are_half_open(case: Case) -> None:
    attr = at.assign(frame([(0, "normal", case.wall_ns, None)]), CLIENT)
    assert attr.method == "time"
    got = attr.numbers.iloc[0]
    assert (None if pd.isna(got) else int(got)) == case.request
    assert attr.startup_count == case.startup
    assert attr.outside_count == (case.request is None and not case.startup)


def test_outside_decisions_are_counted_with_first_and_last_time() -> None:
    dec = frame([(0, "normal", 50, None), (1, "forced", 60, None), (0, "normal", 150, None),
                 (0, "normal", 250, None), (1, "forced", 260, None), (1, "forced", 305, None)])
    attr = at.assign(dec, CLIENT)
    # issue 25: what precedes the client's first request is the service's start-up warm-up,
    # counted per kind as a warm-up; only the call between two requests lies outside
    assert (attr.outside_count, attr.outside_first_wall_ns, attr.outside_last_wall_ns) == (
        1, 305, 305)
    assert dict(attr.outside_by_kind) == {"forced": 1}
    assert (attr.startup_count, dict(attr.startup_by_kind)) == (2, {"normal": 1, "forced": 1})
    assert attr.warmup_by_kind == {"service start-up": {"normal": 1, "forced": 1},
                                   "client warm-up": {"normal": 1}}
    assert list(attr.measured["wall_ns"]) == [250, 260]
    assert list(attr.warmup["wall_ns"]) == [150]
    assert list(attr.measured["offset_ns"]) == [50, 60]
    assert set(attr.decisions.columns) == set(at.ASSIGNED_COLUMNS)
    note = attr.outside_note()
    assert note.startswith("Attributed by time") and "1 decision(s) (1 forced) lay outside" in note
    assert "warm-ups excluded: service start-up 2 (1 forced, 1 normal), client warm-up 1" in note
    counts = at.request_counts(attr, [0, 1, 2])
    assert list(counts["rank"]) == [0, 1, 2, 0, 1, 2]  # every rank of every measured request
    assert list(counts["normal_checks"]) == [1, 0, 0, 0, 0, 0]
    assert list(counts["forced"]) == [0, 1, 0, 0, 0, 0]


def test_a_decision_inside_a_window_with_another_requests_id_is_flagged() -> None:
    """By time, a decision whose recorded id names another request (or none of them) than
    the window holding it: counted and named in both notes, never silently re-labelled."""
    client = {"warmup": {"request_id": "warmup-1", "start_wall_ns": 100, "end_wall_ns": 200},
              "requests": [{"request_id": "r1", "start_wall_ns": 200, "end_wall_ns": 300},
                           {"request_id": "r2", "start_wall_ns": 310, "end_wall_ns": 400}]}
    dec = frame([(0, "normal", 150, "warmup-1"), (0, "normal", 250, "r1"),
                 (1, "normal", 260, "r2"), (0, "normal", 320, "r9"), (1, "normal", 330, None),
                 (0, "forced", 340, "r2")])
    attr = at.assign(dec, client)
    assert attr.method == "time" and attr.outside_count == 0
    off = attr.id_mismatches
    # (a missing id is not a mismatch: the vLLM-Omni adapter records none)
    assert off[["rank", "recorded_request_id", "request"]].values.tolist() == [
        [1, "r2", 1], [0, "r9", 2]]
    assert list(attr.measured["request_id"]) == ["r1", "r1", "r2", "r2", "r2"]  # the client's
    note = attr.outside_note()
    assert "2 decision(s) inside a request's window carry another request id" in note
    assert "rank 1 recorded 'r2' inside request 1, 'r1'" in note
    assert "2 decision(s) inside a request's window carry another request id" in \
        at.scope_note([attr])
    long = at.assign(frame([(0, "normal", 250, "x" * 10**5 + "\x1b[2J")]), client)
    assert len(long.outside_note()) < 600 and "\x1b" not in long.outside_note()
    clean = at.assign(frame([(0, "normal", 250, "r1")]), client)
    assert clean.id_mismatches.empty and "another request id" not in clean.outside_note()
    assert "another request id" not in at.scope_note([clean])


@pytest.mark.parametrize(("client", "words"), [
    ({"warmup": {"request_id": "w"}, "request_id": "r", "e2e_ns": 5},
     "field `warmup.start_wall_ns` is missing or not an integer"),
    ({**CLIENT, "requests": [{"start_wall_ns": 150, "end_wall_ns": 300}]},
     "field `requests[0].start_wall_ns` (150) lies inside the previous request's window"),
    ({**CLIENT, "requests": [{"start_wall_ns": 300, "end_wall_ns": 300}]},
     "field `requests[0].end_wall_ns` (300) is not after"),
])
def test_unassignable_client_records_name_the_field(client: dict, words: str) -> None:
    with pytest.raises(at.AssignmentError) as err:
        at.assign(frame([(0, "normal", 150, None)]), client, source="x/client.json")
    assert str(err.value).startswith("x/client.json: ") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_without_windows_ids_assign_and_unknown_ids_lie_outside() -> None:
    client = {"warmup": {"request_id": "warmup-1"}, "request_id": "r2"}
    dec = frame([(0, "normal", 1, "warmup-service"), (0, "normal", 2, "warmup-1"),
                 (0, "normal", 3, "r2"), (0, "forced", 4, "r2"), (0, "forced", 5, "r9")])
    attr = at.assign(dec, client)
    # the service's start-up request is a warm-up, never "outside every request"
    assert attr.method == "id" and attr.outside_count == 1 and attr.startup_count == 1
    assert attr.startup_ids == ("warmup-service",)
    assert list(attr.numbers.fillna(-1)) == [-1, 0, 1, 1, -1]
    note = attr.outside_note()
    assert "their ids match no client request" in note
    assert "service start-up (warmup-service) 1 (1 normal)" in note


def test_client_without_ids_falls_back_to_the_warmup_prefix() -> None:
    dec = frame([(0, "normal", 1, "warmup-service"), (0, "normal", 2, "warmup-0001"),
                 (0, "normal", 3, "r0002"), (1, "forced", 4, "r0003")])
    attr = at.assign(dec, {"arm": "candidate", "index": 0})
    assert attr.method == "id"
    assert list(attr.numbers.fillna(-1)) == [-1, 0, 1, 2]
    assert list(attr.measured["request_id"]) == ["r0002", "r0003"]


def test_silent_rank_names_the_likely_cause() -> None:
    counts = at.request_counts(at.assign(frame([(0, "normal", 250, None)]), CLIENT), [0, 1])
    failures = at.count_failures(counts, run_name="00-candidate", ranks=[0, 1],
                                 silent_ranks={1: False}, expected_normal=1, expected_forced=2)
    assert failures[0] == (
        "00-candidate: rank 1 wrote no decisions-rank1.jsonl; likely cause: the residency "
        "adapter did not load in that worker (the `vllm_omni.general_plugins` entry point "
        "`residency` is missing from the service's environment, or VLLM_PLUGINS is set "
        "without `residency`).")
    assert failures[1].startswith("00-candidate: expected 1 normal + 2 forced per rank per "
                                  "measured request, but request 1 rank 0: 1 normal, 0 forced; "
                                  "request 2 rank 0: 0 normal, 0 forced")


def _counts(cells: dict[tuple[int, int], tuple[int, int]]) -> pd.DataFrame:
    """A `request_counts` frame from {(request, rank): (normal, forced)}."""
    return pd.DataFrame([{"request": q, "request_id": None, "rank": r, "normal_checks": n,
                          "normal_retained": n, "normal_released": 0, "forced": f,
                          "forced_released": f, "telemetry_errors": 0}
                         for (q, r), (n, f) in cells.items()], columns=list(at.COUNT_COLUMNS))


def test_without_declared_counts_every_rank_and_request_must_agree() -> None:
    """A service that declares no counts: rank 1 making two normal calls in the second
    measured request fails the gate, naming that rank and request (before: passed, since
    only one normal check was asked for)."""
    cells = {(q, r): (1, 2) for q in (1, 2, 3) for r in (0, 1)}
    assert at.count_failures(_counts(cells), run_name="00-candidate", ranks=[0, 1]) == []
    cells[(2, 1)] = (2, 2)
    failures = at.count_failures(_counts(cells), run_name="00-candidate", ranks=[0, 1])
    assert failures == [
        "00-candidate: expected the same counts on every rank and measured request (most "
        "common: 1 normal + 2 forced, at least 1 normal check), but request 2 rank 1: "
        "2 normal, 2 forced."]
    cells[(2, 1)] = (1, 1)  # a forced release missing is named too
    assert "request 2 rank 1: 1 normal, 1 forced" in at.count_failures(
        _counts(cells), run_name="00-candidate", ranks=[0, 1])[0]
    uniform_zero = {(q, r): (0, 2) for q in (1, 2) for r in (0, 1)}
    assert at.count_failures(_counts(uniform_zero), run_name="x", ranks=[0, 1])  # no check


def test_declared_counts_stay_exact() -> None:
    cells = {(q, r): (2, 2) for q in (1, 2) for r in (0, 1)}  # uniform, but not as declared
    failures = at.count_failures(_counts(cells), run_name="00-candidate", ranks=[0, 1],
                                 expected_normal=1, expected_forced=2)
    assert failures[0].startswith("00-candidate: expected 1 normal + 2 forced per rank per "
                                  "measured request, but request 1 rank 0: 2 normal, 2 forced")


# ----------------------------------------------------------------------------- recorded runs
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_builtin_runs_assign_identically_by_id_and_by_time(path: Path) -> None:
    run = load_run(path)
    assert run.manifest["service"] == "builtin"
    for entry in run.runs:
        client = run.client(entry)
        assert at.has_wall_times(client), f"{entry.name}: recorded without wall-clock windows"
        decisions = assigned_decisions(run, entry, warmup=True)
        by_time = assign_run(run, entry, method="time")
        by_id = assign_run(run, entry, method="id")
        assert by_time.method == "time" and by_id.method == "id"
        pd.testing.assert_series_equal(by_time.numbers, by_id.numbers)
        cols = [c for c in at.ASSIGNED_COLUMNS if c != "offset_ns"]
        pd.testing.assert_frame_equal(by_time.decisions[cols], by_id.decisions[cols])
        # the service's own start-up request (warmup-service) is a warm-up, issue 25
        assert by_time.outside_count == by_id.outside_count == 0
        assert by_time.startup_count == by_id.startup_count > 0
        assert by_time.startup_ids == by_id.startup_ids == ("warmup-service",)
        assert set(decisions[by_time.numbers.isna().to_numpy()]["request_id"]) == {
            "warmup-service"}
        assert "no decision lay outside every request" in by_time.outside_note()
        # every decision inside a window carries the id of the request owning the window
        inside = by_time.decisions
        assert (inside["recorded_request_id"] == inside["request_id"]).all()
        n_requests = len(client.get("requests") or [client])
        counts = at.request_counts(by_time, range(run.manifest["params"]["ranks"]))
        assert len(counts) == n_requests * run.manifest["params"]["ranks"]
        assert (counts["normal_checks"] == 1).all() and (counts["forced"] == 2).all()


def test_run_decisions_keep_only_measured_requests_by_time(tmp_path: Path) -> None:
    """A built-in run with its ids erased (as the vLLM-Omni adapter writes them) still gives
    the same measured decisions, assigned by time."""
    src = ROOT / "data" / "runs" / "emulated-consecutive-2r2s"
    run = load_run(src)
    (entry,) = run.runs
    expected = assigned_decisions(run, entry)
    copy = tmp_path / "erased"
    shutil.copytree(src, copy)
    for f in (copy / "runs" / entry.name).glob(decisions_format.DECISIONS_GLOB):
        decisions_format.write_records(f, [{**x, "request_id": None}
                                           for x in decisions_format.read_records(f)])
    erased = load_run(copy, verify=False)
    got = assigned_decisions(erased, erased.runs[0])
    assert len(got) == len(expected) == 18  # 3 requests x 2 ranks x (1 normal + 2 forced)
    pd.testing.assert_frame_equal(got.drop(columns=["file"]), expected.drop(columns=["file"]),
                                  check_dtype=False)
    assert at.consecutive_gates(erased) == []


def test_ids_erased_without_windows_is_refused_naming_the_field(tmp_path: Path) -> None:
    src = ROOT / "tests" / "data" / "notebooks" / "consecutive"
    copy = tmp_path / "old"
    shutil.copytree(src, copy)
    for f in copy.glob("runs/*/decisions-rank*.jsonl"):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        f.write_text("".join(json.dumps({**x, "request_id": None}) + "\n" for x in lines))
    run = load_run(copy, verify=False)
    with pytest.raises(RunDirError, match=r"client\.json: field `warmup\.start_wall_ns` is "
                                          r"missing or not an integer"):
        assigned_decisions(run, run.runs[0])


def test_the_run_model_returns_the_decisions_as_the_files_hold_them() -> None:
    """`Run.decisions` is the files' records, every line (warm-up and calls outside every
    request included), in file order, with no request assigned; assigning them is its own
    step (`assigned_decisions`). Before: `Run.decisions` assigned and dropped the
    warm-up's decisions itself."""
    run = load_run(ROOT / "data" / "runs" / "emulated-consecutive-2r2s")
    (entry,) = run.runs
    held = [r for rank in (0, 1)
            for r in decisions_format.read_records(
                entry.dir / decisions_format.decisions_file(rank))]
    raw = run.decisions(entry)
    assert "request" not in raw.columns
    assert list(raw["request_id"]) == [r.get("request_id") for r in held]
    assert list(raw["wall_ns"]) == [r["wall_ns"] for r in held]
    measured = assigned_decisions(run, entry)
    assert len(measured) == 18 < len(raw)  # the warm-up's decisions are in the files
    assert set(measured["request"]) == {1, 2, 3}
