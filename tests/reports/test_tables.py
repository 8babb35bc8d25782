"""Evidence tables of a fixture run directory, the published figures, and the CLI."""

from __future__ import annotations

import io
import json
import shutil
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from residency import evidence
from residency.records.decisions import decisions_file
from residency.records.manifest import MANIFEST, read_manifest, write_manifest
from residency.reports import tables
from residency.rundir.assignment import assigned_decisions
from residency.rundir.run import RunDirError, load_run
from tests.helpers import run_cli

DATA = Path(__file__).parent.parent / "data" / "rundir"
FIXTURE = DATA / "fixture-run"
EXPECTED_MD = DATA / "fixture-run.expected.md"
IDLE = {
    "baseline": {"marker_idle_intersection_ns": 180_250_000, "all_rank_idle_ns": 1_250_500_000,
                 "prepare_ns": 850_000_000},
    "candidate": {"marker_idle_intersection_ns": 2_125_000, "all_rank_idle_ns": 640_000_000,
                  "prepare_ns": 125_000_000},
}


def _cli(*argv: str) -> tuple[int, str, str]:
    return run_cli("tables", *argv)


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "fixture-run"
    shutil.copytree(FIXTURE, dst)
    return dst


def _edit_manifest(root: Path, **changes: object) -> None:
    manifest = read_manifest(root)
    manifest.update(changes)
    write_manifest(root, manifest)


def test_markdown_matches_expected_file() -> None:
    table = tables.evidence_table(load_run(FIXTURE), idle=IDLE)
    assert tables.to_markdown(table) == EXPECTED_MD.read_text(encoding="utf-8")


def test_rows_units_and_emulated_label() -> None:
    table = tables.evidence_table(load_run(FIXTURE), idle=IDLE)
    assert list(table.columns) == list(tables.COLUMNS)
    assert "emulated NPU — not an NPU measurement" in table.attrs["title"]
    row = table.set_index("metric")
    normal = row.loc["normal-call duration per rank, profiled pair 00-baseline / 01-candidate"]
    assert normal["baseline"].startswith("99.12–102.1 ms")  # for people: 4 digits, one dash
    full = pd.DataFrame(table.attrs["full_rows"]).set_index("metric")  # CSV and JSON
    assert full.loc[normal.name, "baseline"].startswith("99.123456–102.1 ms")
    assert normal["n"] == "2 vs 2 ranks (no test)" and "p=" not in normal["note"]
    assert row.loc["normal calls that released cache", "baseline"].startswith("2/2 released")
    assert row.loc["normal calls that released cache", "candidate"].startswith("0/2 released")
    assert row.loc["forced releases that released", "n"] == "4 vs 4 calls"  # warm-up excluded
    assert row.loc["preparation window", "baseline"] == "0.85 s"
    assert row.loc["client E2E per pair", "delta"] == "-1.146 s (-9.280 %)"
    assert full.loc["client E2E per pair", "delta"].startswith("-1.145678 s (-9.27999")
    assert "Single observation" in row.loc["client E2E per pair", "note"]


def test_preparation_falls_back_to_service_response() -> None:
    row = tables.evidence_table(load_run(FIXTURE)).set_index("metric").loc["preparation window"]
    assert (row["baseline"], row["candidate"]) == ("0.8455 s", "0.1313 s")
    assert "max over ranks" in row["note"]


def test_idle_error_is_noted_in_the_table() -> None:
    table = tables.evidence_table(load_run(FIXTURE), idle_error="ImportError: no idle module")
    assert table["note"].str.contains("Trace analysis unavailable: ImportError").sum() == 1


def test_alternating_pairs_use_sign_flip_test(run_copy: Path) -> None:
    runs = [{"arm": arm, "index": 2 * i + j, "dir": f"runs/{2 * i + j:02d}-{arm}",
             "e2e_s": e2e, "profiled": False}
            for i, (b, c) in enumerate([(10.0, 9.0), (11.0, 10.5), (12.0, 11.0)])
            for j, (arm, e2e) in enumerate((("baseline", b), ("candidate", c)))]
    for r in runs[2:]:  # each entry its own service run (an entry twice is refused)
        shutil.copytree(run_copy / runs[r["index"] % 2]["dir"], run_copy / r["dir"])
    _edit_manifest(run_copy, design="alternating", runs=runs)
    row = tables.evidence_table(load_run(run_copy)).set_index("metric").loc[
        "client E2E per pair"]
    assert row["n"] == "3 pairs" and "p=0.25" in row["note"]
    assert "unreachable whatever the data" in row["note"]


def test_csv_and_json_round_trip() -> None:
    table = tables.evidence_table(load_run(FIXTURE), idle=IDLE)
    full = pd.DataFrame(table.attrs["full_rows"], columns=list(table.columns))
    assert pd.read_csv(io.StringIO(tables.to_csv(table))).fillna("").equals(full)
    assert "0.13125 s" in tables.to_csv(tables.evidence_table(load_run(FIXTURE)))
    doc = json.loads(tables.to_json(table))
    assert doc["device_kind"] == "emulated-npu" and len(doc["rows"]) == len(table)


def test_published_table_holds_every_brief_figure() -> None:
    """The CSV and the Markdown keep every published figure at its published precision, as
    the reports' side-by-side table shows it (one text per figure in every view)."""
    table = tables.published_table()
    csv, md = tables.to_csv(table), tables.to_markdown(table)
    assert table.attrs["device_kind"] == "npu" and "emulated" not in table.attrs["title"]
    for figure in ("216.822–251.161 ms", "1.334–1.579 ms", "8/8 released", "0/8 released",
                   "16/16 released", "221.296680 ms", "3.164550 ms", "-218.132130 ms",
                   "2248.795837 s", "2244.482967 s", "24/24 normal checks retained",
                   "48/48 forced releases released", "0 telemetry errors", "0 OOM",
                   "2253.664743 s", "2239.304066 s", "-14.360677 s", "6.631556 s",
                   "3.039535 s", "3.670694 s", "0.941927 s", "every rank, in this run pair"):
        assert figure in csv, figure
    for figure in ("216.822–251.161 ms", "1.334–1.579 ms", "8/8 released", "221.296680 ms",
                   "3.164550 ms", "-218.132130 ms", "2248.795837 s", "2244.482967 s",
                   "24/24 normal checks retained", "-14.360677 s", "0.941927 s",
                   "every rank, in this run pair"):
        assert figure in md, figure
    assert "221.3 ms" not in md and "2249 s" not in md  # never re-rounded
    assert "2/C(16,8)" not in md  # ranks of one run: a description, no p-value


def test_cli_prints_table_with_empty_stderr() -> None:
    rc, out, err = _cli(str(FIXTURE), "--format", "md")
    assert (rc, err) == (0, "")
    assert out == tables.to_markdown(tables.evidence_table(load_run(FIXTURE)))
    rc, out, _ = _cli(str(FIXTURE), "--format", "json", "--published")
    assert rc == 0 and [d["device_kind"] for d in json.loads(out)] == ["emulated-npu", "npu"]


def test_cli_uses_trace_analysis_and_survives_its_failure(run_copy: Path, monkeypatch) -> None:
    for name in ("00-baseline", "01-candidate"):
        (run_copy / "runs" / name / "trace").mkdir()
    ranks = int(read_manifest(run_copy)["params"]["ranks"])
    monkeypatch.setitem(__import__("sys").modules, "residency.traces.load",
                        types.SimpleNamespace(load_traces=lambda path, **kw: types.SimpleNamespace(
                            path=path, ranks=dict.fromkeys(range(ranks)))))

    def summary(traces: Any, *, marker: str, window_marker: str | None = None) -> dict:
        arm = IDLE["baseline" if "baseline" in str(traces.path) else "candidate"]
        start = 0 if window_marker is None else 10
        return {**arm, "window_ns": [start, start + arm["prepare_ns"]]}

    monkeypatch.setitem(__import__("sys").modules, "residency.analysis.idle",
                        types.SimpleNamespace(idle_summary=summary))
    rc, out, err = _cli(str(run_copy))
    assert (rc, err) == (0, "") and "| 180.2 ms | 2.125 ms |" in out  # 4 significant digits

    def broken(*args: object, **kwargs: object) -> dict:
        raise ValueError("ranks do not overlap")

    monkeypatch.setitem(__import__("sys").modules, "residency.analysis.idle",
                        types.SimpleNamespace(idle_summary=broken))
    rc, out, err = _cli(str(run_copy))
    assert (rc, err) == (0, "")
    assert "Trace analysis unavailable: ValueError: ranks do not overlap" in out


@pytest.mark.parametrize("argv", [("/nonexistent/run",), ()])
def test_cli_errors_are_one_line_exit_2(argv: tuple[str, ...]) -> None:
    rc, out, err = _cli(*argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "error:" in err


def test_incomplete_manifest_is_refused_unless_allowed(run_copy: Path) -> None:
    _edit_manifest(run_copy, status="incomplete")
    with pytest.raises(RunDirError, match="field `status`: status is 'incomplete'") as info:
        load_run(run_copy)
    assert info.value.field == "status" and info.value.path.name == MANIFEST
    run = load_run(run_copy, allow_incomplete=True)
    assert "INCOMPLETE" in tables.evidence_table(run).attrs["title"]
    assert _cli(str(run_copy))[0] == 2
    assert _cli(str(run_copy), "--allow-incomplete")[0] == 0


@pytest.mark.parametrize(("change", "message"), [
    ("missing-manifest", "manifest.json: file is missing"),
    ("invalid-json", "manifest.json: invalid JSON"),
    ("wrong-schema", "field `schema`"),
    ("no-runs", "field `runs`: missing"),
    ("bad-device", "field `device_kind`"),
    ("missing-run-dir", "run directory listed in manifest.json runs[0] is missing"),
])
def test_bad_run_directory_names_file_and_field(run_copy: Path, change: str,
                                                message: str) -> None:
    manifest = run_copy / MANIFEST
    if change == "missing-manifest":
        manifest.unlink()
    elif change == "invalid-json":
        manifest.write_text("{not json")
    elif change == "wrong-schema":
        _edit_manifest(run_copy, schema="other/9")
    elif change == "no-runs":
        data = read_manifest(run_copy)
        del data["runs"]
        write_manifest(run_copy, data)
    elif change == "bad-device":
        _edit_manifest(run_copy, device_kind="tpu")
    else:
        shutil.rmtree(run_copy / "runs" / "00-baseline")
    with pytest.raises(RunDirError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_run(run_copy)


def test_invalid_decisions_line_names_file_and_line(run_copy: Path) -> None:
    path = run_copy / "runs" / "01-candidate" / decisions_file(1)
    path.write_text(path.read_text() + "{truncated\n")
    run = load_run(run_copy)
    with pytest.raises(RunDirError, match=r"decisions-rank1\.jsonl: line 6: invalid JSON"):
        assigned_decisions(run, run.runs[1])


def test_decisions_frame_excludes_warmup_unless_asked() -> None:
    run = load_run(FIXTURE)
    assert len(assigned_decisions(run, run.runs[0])) == 6
    full = assigned_decisions(run, run.runs[0], warmup=True)
    assert len(full) == 10 and full["warmup"].sum() == 4
    assert full.loc[full["kind"] == "normal", "duration_ns"].tolist()[1] == 99_123_456


def test_normal_durations_fall_back_to_service_lists(run_copy: Path) -> None:
    """Without decision logs the per-rank durations come from the service response, which
    reports each rank's normal-call durations as a list (one entry per call)."""
    for client in run_copy.glob("runs/*/client.json"):
        data = json.loads(client.read_text())
        for pr in data["response"]["per_rank"]:
            pr["normal"]["duration_ns"] = [pr["normal"]["duration_ns"]]
        client.write_text(json.dumps(data))
    for log in run_copy.glob("runs/*/decisions-rank*.jsonl"):
        log.unlink()
    ev = evidence.build(load_run(run_copy), traces=False)
    assert list(ev["normal_call_per_rank"].values["baseline"]) == [99.123456, 102.1]
