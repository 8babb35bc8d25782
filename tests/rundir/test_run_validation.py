"""Run-directory input validation: decision records checked against the schema and their file,
each rank's decisions file present, `runs[]` entries unique, JSON objects without duplicate keys,
and `verify` applying the path rule the analysis applies. Each case copies a recorded run,
changes it as an author or a sender could, and seals it again with the project's own code, so
that only the check stands between the change and the analysis."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from residency.records.client import CLIENT
from residency.records.decisions import DECISIONS_GLOB, decisions_file
from residency.records.manifest import MANIFEST
from residency.rundir.assignment import assigned_decisions, decisions_by_request
from residency.rundir.run import (
    RunDirError,
    load_run,
    verify_run,
)
from tests.helpers import edit_manifest, reseal
from tests.helpers import residency as cli

BASELINE = Path("runs") / "00-baseline"
RANK0 = BASELINE / decisions_file(0)


def edit_line(path: Path, lineno: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Change line `lineno` (1-based) of a decisions file."""
    lines = path.read_text().splitlines()
    rec = json.loads(lines[lineno - 1])
    change(rec)
    lines[lineno - 1] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def baseline(run_dir: Path) -> Any:
    run = load_run(run_dir)
    (entry,) = [e for e in run.runs if e.name == BASELINE.name]
    return run, entry


# ------------------------------------------------------------------ 1. decision records
@dataclass(frozen=True)
class BadLine:
    name: str
    lineno: int  # line 1: normal, released, telemetry-unavailable; line 2: forced
    change: dict[str, Any]
    field: str


BAD_LINES = [
    BadLine("unknown kind (before: the line was dropped)", 1, {"kind": "sometimes"}, "kind"),
    BadLine("outcome maybe (before: counted as not released)", 1, {"outcome": "maybe"},
            "outcome"),
    BadLine("unknown reason", 1, {"reason": "because"}, "reason"),
    BadLine("no kind", 1, {"kind": None}, "kind"),
    BadLine("rank 7 in the file of rank 0", 1, {"rank": 7}, "rank"),
    BadLine("no rank", 1, {"rank": None}, "rank"),
    BadLine("the candidate's arm in the baseline's file", 2, {"arm": "candidate"}, "arm"),
    BadLine("cuda in an emulated-npu run", 2, {"device_kind": "cuda"}, "device_kind"),
    BadLine("a forced call with a bounds reason", 2, {"reason": "within-bounds"}, "reason"),
    BadLine("retained although a bound was crossed", 1,
            {"outcome": "retained", "reason": "cached-bound"}, "outcome"),
]


@pytest.mark.parametrize("case", BAD_LINES, ids=[c.name for c in BAD_LINES])
def test_a_decision_contradicting_the_schema_or_its_file_is_refused(paired: Path,
                                                                    case: BadLine) -> None:
    edit_line(paired / RANK0, case.lineno, lambda rec: rec.update(case.change))
    reseal(paired)
    run, entry = baseline(paired)  # sealed: verification alone cannot catch it
    for read in (lambda: assigned_decisions(run, entry),
                 lambda: assigned_decisions(run, entry, warmup=True),
                 lambda: decisions_by_request(run)):
        with pytest.raises(RunDirError) as err:
            read()
        assert err.value.field == case.field
        assert err.value.path.name == decisions_file(0)
        assert f"line {case.lineno}:" in str(err.value)


def test_the_recorded_decisions_pass_and_the_adapters_device_type_is_accepted(
        paired: Path) -> None:
    """The vLLM-Omni adapter records torch's device type (`npu` for the emulated NPU)."""
    edit_line(paired / RANK0, 2, lambda rec: rec.update(device_kind="npu"))
    reseal(paired)
    run, entry = baseline(paired)
    assert len(assigned_decisions(run, entry, warmup=True)) == 18  # 9 per rank
    assert len(decisions_by_request(run)) > 0


def test_the_tables_command_names_file_line_and_field(paired: Path) -> None:
    edit_line(paired / RANK0, 1, lambda rec: rec.update(outcome="maybe"))
    reseal(paired)
    proc = cli("tables", str(paired))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "decisions-rank0.jsonl: field `outcome`: line 1:" in proc.stderr


# ------------------------------------------------------------------ 1b. one file per rank
def test_a_missing_rank_file_of_the_builtin_service_is_an_error(paired: Path) -> None:
    """Before: deleting decisions-rank0.jsonl and resealing verified, and rank 0's calls were
    silently left out."""
    (paired / RANK0).unlink()
    reseal(paired)
    assert verify_run(paired).ok
    run, entry = baseline(paired)
    with pytest.raises(RunDirError, match=r"decisions-rank0\.jsonl missing.*params\.ranks = 2"):
        assigned_decisions(run, entry)


def test_a_missing_rank_file_of_an_external_service_warns(paired: Path) -> None:
    """An external service's rank that never loaded the adapter writes no file: the
    consecutive gate names the likely cause, and every read warns."""
    (paired / RANK0).unlink()
    edit_manifest(paired, lambda m: m.update(service="external"))
    reseal(paired)
    run, entry = baseline(paired)
    with pytest.warns(UserWarning, match=r"decisions-rank0\.jsonl missing"):
        df = assigned_decisions(run, entry, warmup=True)
    assert set(df["rank"]) == {1}


def test_a_service_run_without_any_decisions_file_warns(paired: Path) -> None:
    """Recorded without decision logs: the evidence falls back to the service's response."""
    for f in (paired / BASELINE).glob(DECISIONS_GLOB):
        f.unlink()
    reseal(paired)
    run, entry = baseline(paired)
    with pytest.warns(UserWarning, match="no decisions file"):
        assert assigned_decisions(run, entry, warmup=True).empty


@pytest.mark.parametrize(("name", "words"), [
    (decisions_file(2), r"rank 2 is not a rank of the run \(params\.ranks = 2"),
    ("decisions-rank01.jsonl", "is not a decisions file name"),
    ("decisions-rankx.jsonl", "is not a decisions file name"),
])
def test_a_decisions_file_of_no_rank_of_the_run_is_an_error(paired: Path, name: str,
                                                            words: str) -> None:
    text = (paired / RANK0).read_text()
    (paired / BASELINE / name).write_text(text.replace('"rank": 0', '"rank": 2'))
    reseal(paired)
    run, entry = baseline(paired)
    with pytest.raises(RunDirError, match=words) as err:
        assigned_decisions(run, entry)
    assert err.value.path.name == name


def test_all_ranks_present_reads_without_warnings(paired: Path) -> None:
    run, entry = baseline(paired)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(set(assigned_decisions(run, entry, warmup=True)["rank"])) == [0, 1]


# ------------------------------------------------------------------ 2. unique runs[] entries
@pytest.mark.parametrize(("name", "change", "field"), [
    ("the same entry twice", lambda runs: runs.append(dict(runs[0])), "index"),
    ("another index, the same dir", lambda runs: runs.append({**runs[0], "index": 99}), "dir"),
    ("the same dir spelled with a trailing slash",
     lambda runs: runs.append({**runs[0], "index": 99, "dir": runs[0]["dir"] + "/"}), "dir"),
    ("the same index, another dir",
     lambda runs: runs.__setitem__(1, {**runs[1], "index": runs[0]["index"]}), "index"),
])
def test_a_duplicated_runs_entry_is_refused_naming_it(paired: Path, name: str,
                                                      change: Callable[[list[Any]], None],
                                                      field: str) -> None:
    """Before: a duplicated entry was read twice (its E2E and decisions counted twice)."""
    edit_manifest(paired, lambda m: change(m["runs"]))
    reseal(paired)
    result = verify_run(paired)
    assert not result.ok and len(result.invalid) == 1
    assert f".{field}`" in result.invalid[0] and "both have" in result.invalid[0]
    with pytest.raises(RunDirError, match=r"runs\[\d+\] and runs\[\d+\] both have") as err:
        load_run(paired, verify=False)
    assert err.value.field is not None and err.value.field.endswith(f".{field}")
    with pytest.raises(RunDirError, match="failed verification"):
        load_run(paired)


# ------------------------------------------------------------------ 3. duplicate JSON keys
def test_a_manifest_with_a_duplicate_key_is_refused(paired: Path) -> None:
    """Before: the seal covers the parsed manifest, so `{"device_kind": "npu", ...,
    "device_kind": "emulated-npu"}` verified although a first-wins reader sees `npu`."""
    path = paired / MANIFEST
    text = path.read_text()
    assert text.startswith("{\n")
    path.write_text('{\n  "device_kind": "npu",\n' + text[2:])
    assert json.loads(path.read_text())["device_kind"] == "emulated-npu"  # last wins
    for call in (lambda: verify_run(paired), lambda: load_run(paired),
                 lambda: load_run(paired, verify=False)):
        with pytest.raises(RunDirError, match="duplicate key 'device_kind'") as err:
            call()
        assert err.value.path.name == MANIFEST
    proc = cli("verify", str(paired))
    assert proc.returncode == 2 and "duplicate key 'device_kind'" in proc.stderr


def test_a_client_record_with_a_duplicate_key_is_refused(paired: Path) -> None:
    path = paired / BASELINE / CLIENT
    text = path.read_text()
    path.write_text(text.replace("{", '{"e2e_s": 0.001, ', 1))
    reseal(paired)
    run, entry = baseline(paired)
    with pytest.raises(RunDirError, match="duplicate key 'e2e_s'") as err:
        run.client(entry)
    assert err.value.path.name == CLIENT


def test_a_decision_line_with_a_duplicate_key_is_refused(paired: Path) -> None:
    path = paired / RANK0
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace("{", '{"outcome": "retained", ', 1)
    path.write_text("\n".join(lines) + "\n")
    reseal(paired)
    run, entry = baseline(paired)
    with pytest.raises(RunDirError, match="line 4: duplicate key 'outcome'"):
        assigned_decisions(run, entry)


def test_a_duplicate_key_in_a_nested_object_is_refused(paired: Path) -> None:
    path = paired / MANIFEST
    text = path.read_text()
    assert '"params": {' in text
    path.write_text(text.replace('"params": {', '"params": {"ranks": 1, ', 1))
    with pytest.raises(RunDirError, match="duplicate key 'ranks'"):
        verify_run(paired)


# ------------------------------------------------------------------ 4. one path rule
@pytest.mark.parametrize("bad_dir", ["runs\\00-baseline", "/tmp/elsewhere", "runs/../runs/x"])
def test_verify_applies_the_path_rule_of_the_analysis(paired: Path, bad_dir: str) -> None:
    """Before: `verify` reported a run fine whose `runs[0].dir` had a backslash, while
    `tables` refused it."""
    edit_manifest(paired, lambda m: m["runs"][0].update(dir=bad_dir))
    reseal(paired)
    result = verify_run(paired)
    assert not result.ok
    (finding,) = result.invalid
    assert "runs[0].dir" in finding
    with pytest.raises(RunDirError) as err:
        load_run(paired, verify=False)
    assert err.value.field == "runs[0].dir"
    assert str(err.value).split("runs[0].dir", 2)[-1] in finding  # the same words
    proc = cli("verify", str(paired))
    assert proc.returncode == 1 and "runs[0].dir" in proc.stdout + proc.stderr


def test_a_sound_run_has_no_invalid_findings(paired: Path) -> None:
    result = verify_run(paired)
    assert result.ok and result.invalid == ()
