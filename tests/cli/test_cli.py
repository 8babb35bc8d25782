"""The one CLI wiring point: every parser in `residency.cli.main`, one error policy (bad input exit
2 with `residency <cmd>: error: ...`, a failed gate or verification exit 1), fast start."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from residency.cli import main as cli
from residency.records.decisions import decisions_file
from residency.records.manifest import read_manifest
from tests.helpers import PAIRED, ROOT
from tests.helpers import run_cli as run


@dataclass(frozen=True)
class Bad:
    argv: tuple[str, ...]
    words: str


BAD = [
    Bad(("tables",), "give RUN_DIR, --published, or both"),
    Bad(("tables", "/nonexistent/run"), "run directory does not exist"),
    Bad(("verify", "/nonexistent/run"), "manifest.json: file is missing"),
    Bad(("whatif", str(PAIRED), "--cached", "2:3:1"), "`cached`"),
    Bad(("idle", "/nonexistent/traces"), "/nonexistent/traces"),
    Bad(("serve", "--arm", "candidate", "--device", "emulated-npu"), "--decisions-dir"),
    Bad(("serve", "--arm", "candidate", "--device", "tpu", "--decisions-dir", "x"), "'tpu'"),
    Bad(("pair", "--device", "tpu", "--out", "/tmp/never-written"), "'tpu'"),
    Bad(("report", "/nonexistent/notebook.ipynb"), "/nonexistent"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: " ".join(c.argv[:2]))
def test_bad_input_is_one_line_exit_2(case: Bad) -> None:
    rc, out, err = run(*case.argv)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith(f"residency {case.argv[0]}: error: ") and err.count("\n") == 1, err
    assert case.words in err and "Traceback" not in err


def test_pair_with_an_unwritable_out_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    rc, out, err = run("pair", "--device", "emulated-npu", "--out", str(blocker / "run"),
                       "--no-progress")
    # README: an output directory that cannot be used is bad input, exit 2 (was 1)
    assert (rc, out) == (2, "")
    assert err.startswith("residency pair: error: ") and "cannot write the run directory" in err
    assert not (blocker / "run").exists()


def test_failed_verification_exits_1(tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(ROOT / "tests" / "data" / "rundir" / "whatif-run",
                                tmp_path / "run"))
    changed = copy / "runs" / "01-candidate" / decisions_file(1)
    changed.write_text(changed.read_text() + "\n")
    rc, out, err = run("verify", str(copy))
    assert rc == 1 and "changed" in out and err == ""


def test_the_removed_markers_alias_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.create_parser().parse_args(["serve", "--arm", "candidate", "--markers", "d"])
    assert exit_.value.code == 2 and "unrecognized arguments: --markers" in capsys.readouterr().err
    args = cli.create_parser().parse_args(["serve", "--arm", "candidate", "--decisions-dir",
                                           "e"])
    assert args.decisions_dir == "e" and capsys.readouterr().err == ""


def test_every_subcommand_is_wired_here() -> None:
    assert set(cli.COMMANDS) == {"probe", "serve", "pair", "plan", "idle", "tables", "report",
                                 "verify", "whatif", "selftest"}
    text = cli.create_parser().format_help()
    assert all(name in text for name in cli.COMMANDS)


def test_building_the_parser_imports_no_concern() -> None:
    code = ("import sys, residency.cli.main as c; c.create_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', "
            "'numpy', 'scipy') or m in ('residency.reports.tables', 'residency.workload.service', "
            "'residency.workload.front', 'residency.workload.ranks', "
            "'residency.experiments.designs', 'residency.experiments.arms', "
            "'residency.experiments.lifecycle', 'residency.experiments.servicefile', "
            "'residency.analysis.whatif', "
            "'residency.traces.load')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_tables_json_carries_each_rows_attribution() -> None:
    rc, out, err = run("tables", str(PAIRED), "--format", "json")
    assert (rc, err) == (0, "")
    rows = json.loads(out)["rows"]
    per_run = next(r for r in rows if r["attribution"].get("key") == "normal_call_per_run")
    # issue 25: the unprofiled runs only, never pooled with the profiled pair
    assert per_run["n"] == "3 vs 3 runs" and per_run["attribution"]["n"] == {
        "baseline": 3, "candidate": 3}


def test_tables_format_pr_prints_the_test_result_block() -> None:
    """Issue 25: the pull request's evidence is regenerated, not retyped: one bullet per
    attribution with both arms, the change, n and the verdict; device kind and digest."""
    rc, out, err = run("tables", str(PAIRED), "--format", "pr")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "#### Test Result (emulated-npu: emulated NPU — not an NPU measurement)"
    bullets = [x for x in lines if x.startswith("* ")]
    assert [b.split(":")[0] for b in bullets] == [
        "* Normal-call duration, per call", "* Normal calls that released cache",
        "* Forced releases that released", "* Telemetry errors (a failed read releases)",
        "* Normal-release markers ∩ all-rank no-device-task time, profiled pair",
        "* Client E2E, unprofiled pairs"]
    for b in bullets:
        assert "baseline " in b and "candidate " in b and "change " in b and "n = " in b
    assert "baseline 8/8, candidate 0/8" in out
    digest = read_manifest(PAIRED)["seal"]["digest"]
    assert f"`{digest}`" in out and "Device kind: `emulated-npu`" in out
    assert "<code>" not in out
    assert "does not transfer to the NPU" in out
    rc, out, err = run("tables", "--published", "--format", "pr")
    assert rc == 2 and "--format pr needs RUN_DIR" in err


@pytest.mark.parametrize("entry", ["python -m residency", "console script"])
def test_the_process_ends_without_the_collector_tracing_the_heap(entry: str) -> None:
    """Both ways in (`python -m residency`, the `residency` console script) end with the
    objects left frozen (`gc.freeze`), so that the interpreter's exit does not trace them
    (~0.25 s with Dask's modules loaded); the atexit handlers and flushes still run."""
    from residency.experiments.servicefile import tomllib  # tomli on Python 3.10

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["residency"] == "residency.cli.main:console_main"
    start = ("import runpy; runpy.run_module('residency', run_name='__main__')"
             if entry == "python -m residency" else
             "from residency.cli.main import console_main; sys.exit(console_main())")
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
            "sys.argv = ['residency', 'tables', '--published', '--format', 'csv']\n" + start)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("frozen True")  # after the command's own output
    assert out.stdout.count("\n") > 2  # which was printed and flushed in full
