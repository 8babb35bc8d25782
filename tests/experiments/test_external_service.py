"""The external-service flow end to end on the stand-in (`tests/standin/`): start, health,
warm-up, measured requests, profile start/stop, stop, assignment by time, gates, tables;
and the bad inputs of the external mode (slow: real service processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from residency.evidence import build as build_evidence
from residency.experiments.designs import run_pair
from residency.experiments.errors import ExperimentError, ServiceFileError
from residency.records.decisions import decisions_file
from residency.records.manifest import read_manifest
from residency.reports.tables import evidence_table
from residency.rundir import assignment as at
from residency.rundir.assignment import assign_run, assigned_decisions
from residency.rundir.run import load_run
from tests.helpers import ROOT

pytestmark = pytest.mark.slow
STANDIN = ROOT / "tests" / "data" / "services" / "standin_2r.toml"
RANKS = 2


def variant(tmp: Path, old: str, new: str) -> Path:
    """The stand-in's service file with one text replaced, beside the original's paths."""
    text = STANDIN.read_text()
    assert old in text
    path = tmp / "variant.toml"
    path.write_text(text.replace(old, new).replace('cwd = "../../.."', f'cwd = "{ROOT}"'))
    return path


@pytest.fixture(scope="module")
def consecutive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ext") / "consecutive"
    return run_pair("consecutive", out=out, service_file=STANDIN, steps=2, requests=3,
                    progress=False)


def test_consecutive_external_run_is_assigned_by_time(consecutive: Path) -> None:
    run = load_run(consecutive)
    m = run.manifest
    assert m["status"] == "complete" and m["service"] == "external"
    info = m["service_info"]
    assert info["name"] == "standin-vllm-omni-2r" and info["file"] == str(STANDIN)
    assert info["versions"]["vllm_omni"] == "0.0.0+standin" and info["versions"]["torch"]
    assert info["expect"] == {"normal_per_request": 1, "forced_per_request": 2}
    (entry,) = run.runs
    raw = assigned_decisions(run, entry, warmup=True)
    assert len(raw) and raw["request_id"].isna().all()  # the adapter never sees an id
    attr = assign_run(run, entry)
    assert attr.method == "time"
    # each worker's start-up dummy run (1 normal + 2 forced) precedes every client request:
    # the service's own start-up warm-up, counted per kind, never "outside" (issue 25)
    assert (attr.outside_count, attr.startup_count) == (0, RANKS * 3)
    assert dict(attr.startup_by_kind) == {"normal": RANKS, "forced": 2 * RANKS}
    # the warm-up request (the first after start-up: 3 normal calls per rank) is excluded
    warm = attr.warmup
    assert sorted(warm.groupby("rank")["kind"].apply(lambda k: (k == "normal").sum())) == [3, 3]
    counts = at.request_counts(attr, range(RANKS))
    assert len(counts) == 3 * RANKS
    assert (counts["normal_checks"] == 1).all() and (counts["forced"] == 2).all()
    assert (counts["normal_retained"] == 1).all() and (counts["forced_released"] == 2).all()
    assert at.consecutive_gates(run) == []
    table = evidence_table(run)
    rows = dict(zip(table["metric"], table["candidate"], strict=True))
    assert rows["normal calls that released cache"].split()[0] == "0/6"
    assert rows["forced releases that released"].split()[0] == "12/12"


def test_a_rank_without_decisions_fails_the_gate_with_the_cause(consecutive: Path,
                                                                 tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "silent"
    shutil.copytree(consecutive, copy)
    (next(copy.glob("runs/*")) / decisions_file(1)).write_text("")
    failures = at.consecutive_gates(load_run(copy, verify=False))
    assert failures == [
        "00-candidate: rank 1 wrote an empty decisions-rank1.jsonl; likely cause: the residency "
        "adapter did not load in that worker (the `vllm_omni.general_plugins` entry point "
        "`residency` is missing from the service's environment, or VLLM_PLUGINS is set "
        "without `residency`)."]


def test_a_service_without_declared_counts_must_make_the_same_calls_everywhere(
        tmp_path: Path) -> None:
    """No `[expect]` in the service file, and rank 1 makes two normal calls in the second
    measured request: the gate fails naming that rank and request (before: it passed, since
    only one normal check per rank and request was asked for)."""
    text = STANDIN.read_text()
    expect = "[expect]\nnormal_per_request = 1\nforced_per_request = 2\n"
    assert expect in text
    spec = tmp_path / "undeclared.toml"
    spec.write_text(text.replace(expect, "").replace('cwd = "../../.."', f'cwd = "{ROOT}"')
                    .replace('RESIDENCY_DECISIONS_DIR = "{decisions_dir}" }',
                             'RESIDENCY_DECISIONS_DIR = "{decisions_dir}", '
                             'STANDIN_EXTRA_NORMAL = "1:2" }'))
    out = run_pair("consecutive", out=tmp_path / "run", service_file=spec, steps=2,
                   requests=3, progress=False)
    run = load_run(out)
    assert run.manifest["service_info"].get("expect") in (None, {})
    assert at.consecutive_gates(run) == [
        "00-candidate: expected the same counts on every rank and measured request (most "
        "common: 1 normal + 2 forced, at least 1 normal check), but request 2 rank 1: "
        "2 normal, 2 forced."]


def test_paired_profile_external_run_has_traces_idle_and_counts(tmp_path: Path) -> None:
    out = run_pair("paired-profile", out=tmp_path / "pp", service_file=STANDIN, steps=2,
                   pairs=0, progress=False)
    run = load_run(out)
    assert [(e.arm, e.profiled, e.trace_dir is not None) for e in run.runs] == [
        ("baseline", True, True), ("candidate", True, True)]
    for entry in run.runs:
        attr = assign_run(run, entry)
        assert attr.method == "time" and (attr.outside_count, attr.startup_count) == (
            0, RANKS * 3)
        assert len(attr.measured) == RANKS * 3
    ev = build_evidence(run)
    assert ev.idle_error is None and ev.get("idle_intersection") is not None
    assert [(r["outside_count"], r["startup_count"]) for r in ev.request_assignment] == [
        (0, RANKS * 3)] * 2
    table = evidence_table(ev)
    rows = dict(zip(table["metric"], zip(table["baseline"], table["candidate"], strict=True),
                    strict=True))
    assert rows["normal calls that released cache"][0].startswith("2/2 ")  # generic: raises
    assert rows["normal calls that released cache"][1].startswith("0/2 ")
    assert rows["forced releases that released"] == ("4/4 released (100 %)",
                                                     "4/4 released (100 %)")


# ----------------------------------------------------------------------------- bad input
def test_service_file_that_does_not_parse_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[serve\ncommand = []\n')
    proc = subprocess.run([sys.executable, "-m", "residency", "pair", "--service", str(bad),
                           "--out", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"residency pair: error: {bad}: invalid TOML: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before any run directory


def test_missing_command_leaves_the_run_incomplete_naming_the_field(tmp_path: Path) -> None:
    service = variant(tmp_path, '"{python}", "-m"', '"no-such-vllm-binary", "-m"')
    with pytest.raises(ServiceFileError) as err:
        run_pair("consecutive", out=tmp_path / "run", service_file=service, steps=1,
                 progress=False)
    assert str(err.value).startswith(f"{service}: field `serve.command` names "
                                     "'no-such-vllm-binary', which is not an executable")
    m = read_manifest(tmp_path / "run")
    assert m["status"] == "incomplete" and "serve.command" in m["error"]


def test_decisions_directory_that_stays_empty_names_the_likely_cause(tmp_path: Path) -> None:
    service = variant(tmp_path, 'env = { RESIDENCY_ARM = "{arm}",',
                      'env = { VLLM_PLUGINS = "some-other-plugin", RESIDENCY_ARM = "{arm}",')
    with pytest.raises(ExperimentError) as err:
        run_pair("consecutive", out=tmp_path / "run", service_file=service, steps=1,
                 progress=False)
    message = str(err.value)
    assert "the decisions directory (field `profile.decisions` of" in message
    assert "stayed empty after the candidate service answered 2 requests" in message
    assert "VLLM_PLUGINS set without `residency`" in message and "\n" not in message
    m = read_manifest(tmp_path / "run")
    assert m["status"] == "incomplete" and "stayed empty" in m["error"]
    log = (tmp_path / "run" / "runs" / "00-candidate" / "service.log").read_text()
    assert "plugins [[], []]" in log  # the workers really loaded no plugin


# ----------------------------------------------------------------------------- notebooks
@pytest.fixture(scope="module")
def notebooks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both notebooks run with `-p service <the stand-in's file>`, started at once."""
    from tests.helpers import Papermill

    folders = {name: tmp_path_factory.mktemp(name) for name in ("consecutive", "paired")}
    runs = {
        "consecutive": Papermill("consecutive_requests", folders["consecutive"] / "c.ipynb",
                                 "-p", "service", str(STANDIN), "-p", "requests", "3",
                                 "-p", "steps", "2", "-r", "output_dir",
                                 str(folders["consecutive"]), cwd=folders["consecutive"]),
        "paired": Papermill("paired_profile", folders["paired"] / "p.ipynb",
                            "-p", "service", str(STANDIN), "-p", "pairs", "0", "-p", "steps",
                            "2", "-r", "output_dir", str(folders["paired"]),
                            cwd=folders["paired"]),
    }
    try:
        for run in runs.values():
            run.ok()
    finally:
        for run in runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()
    return folders


def _outputs(path: Path) -> str:
    import nbformat

    book = nbformat.read(path, as_version=4)
    return "\n".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("text", ""))
                     for c in book.cells for o in c.get("outputs", []))


def test_consecutive_notebook_with_an_external_service(notebooks: dict[str, Path]) -> None:
    folder = notebooks["consecutive"]
    results = json.loads((folder / "results.json").read_text())
    assert results["parameters"]["service"] == str(STANDIN)
    assert results["gate_failures"] == []
    assert (results["ranks"], results["requests"]) == (RANKS, 3)
    assert (results["normal_total"], results["forced_total"]) == (6, 12)  # warm-up excluded
    assert results["oom"] is None  # the service does not report OOMs
    assert results["service"]["name"] == "standin-vllm-omni-2r"
    assert results["service"]["versions"]["vllm_omni"] == "0.0.0+standin"
    (attributed,) = results["request_attribution"]
    assert (attributed["method"], attributed["outside_count"], attributed["startup_count"]
            ) == ("time", 0, RANKS * 3)
    shown = _outputs(folder / "c.ipynb")
    assert "**Service** `standin-vllm-omni-2r`" in shown
    assert "vllm\\_omni 0.0.0+standin" in shown  # Markdown-escaped (md_text, issue 28)
    from residency.humanize import md_text

    assert md_text("decisions attributed to requests by time (client wall-clock windows); "
                   "warm-up decisions excluded: service start-up 6 (4 forced, 2 normal)") in shown
    run = load_run(folder / "run")
    assert run.manifest["service"] == "external"


def test_paired_profile_notebook_with_an_external_service(notebooks: dict[str, Path]) -> None:
    folder = notebooks["paired"]
    results = json.loads((folder / "results.json").read_text())
    assert results["parameters"]["service"] == str(STANDIN)
    assert results["normal_calls"] == {"baseline": {"total": 2, "released": 2},
                                       "candidate": {"total": 2, "released": 0}}
    assert results["forced_calls"] == {"baseline": {"total": 4, "released": 4},
                                       "candidate": {"total": 4, "released": 4}}
    assert all(v is not None for v in results["idle_intersection_ms"].values())
    assert results["evidence"]["service"]["file"] == str(STANDIN)
    assert [(r["outside_count"], r["startup_count"])
            for r in results["evidence"]["request_attribution"]] == [(0, RANKS * 3)] * 2
    shown = _outputs(folder / "p.ipynb")
    assert "**Service** `standin-vllm-omni-2r`" in shown
    # issue 25: said once for all runs, the start-up warm-ups counted as warm-ups
    assert "lay outside every request" not in shown
    # once on the page (issue 40: no sentence twice; the evidence footer no longer repeats it)
    assert shown.count("2 service runs, each after its own warm-up; decisions attributed to "
                       "requests by time") == 1
    from residency.humanize import md_text

    assert md_text("service start-up 12 (8 forced, 4 normal)") in shown  # Markdown-escaped
    assert "no decision outside every request" in shown
