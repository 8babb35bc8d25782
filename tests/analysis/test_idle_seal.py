"""`idle` inside a sealed run checks the run's seal; provenance names the project's own commit
or none (issue 40, item 4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from residency.records.manifest import read_manifest, write_manifest
from tests.helpers import ENV, ROOT, copy_run
from tests.helpers import PAIRED as RUN
from tests.helpers import idle_cli as idle

ENTRY = "runs/01-candidate"


@pytest.fixture
def run(tmp_path) -> Path:
    return copy_run(RUN, tmp_path / "run")  # a sealed run (read-only original)


def test_idle_in_a_verified_run_reads_it_under_its_seal(run):
    out = idle(str(run / ENTRY), "--json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    unverified = idle(str(run / ENTRY), "--json", "--no-verify")
    got, plain = json.loads(out.stdout), json.loads(unverified.stdout)
    assert got["all_rank_idle_ns"] == plain["all_rank_idle_ns"] > 0
    assert got["warnings"] == []


@pytest.mark.parametrize("where", [ENTRY, f"{ENTRY}/trace", f"{ENTRY}/trace/rank0.trace.json"])
def test_a_deleted_rank_trace_fails_as_verify_does(run, where):
    """Before: a warning (world_size 2 but 1 rank read) and exit 0, where `verify` exits 1
    and `tables` refuses the run."""
    (run / ENTRY / "trace" / "rank1.trace.json").unlink()
    assert subprocess.run([sys.executable, "-m", "residency", "verify", str(run)], env=ENV,
                          capture_output=True, text=True, timeout=300).returncode == 1
    out = idle(str(run / where))
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("residency idle: error: ")
    assert "failed verification" in lines[0] and "rank1.trace.json" in lines[0]
    assert "--no-verify" in lines[0]


def test_a_changed_trace_fails(run):
    trace = run / ENTRY / "trace" / "rank0.trace.json"
    trace.write_bytes(trace.read_bytes() + b"\n")
    out = idle(str(run / ENTRY))
    assert out.returncode == 2 and "failed verification" in out.stderr
    assert "0 missing, 0 extra, 1 changed" in out.stderr


def test_no_verify_reads_it_and_says_so_loudly(run):
    (run / ENTRY / "trace" / "rank1.trace.json").unlink()
    out = idle(str(run / ENTRY), "--no-verify")
    assert out.returncode == 0
    assert f"lies in the run {run.resolve()}, NOT checked against its seal (--no-verify)" \
        in out.stderr


def test_a_scheduler_is_refused_for_a_sealed_run(run):
    out = idle(str(run / ENTRY), "--scheduler", "local")
    assert out.returncode == 2 and "drop --scheduler" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_an_unsealed_run_is_read_with_a_warning(run):
    manifest = read_manifest(run)
    manifest["status"] = "incomplete"
    write_manifest(run, manifest)
    out = idle(str(run / ENTRY))
    assert out.returncode == 0 and "which has no seal" in out.stderr


# -- provenance ---------------------------------------------------------------------------

COMMIT = """
import json
from residency.rundir.run import versions
print(json.dumps({"commit": versions()["git_commit"]}))
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                           "-c", "init.defaultBranch=main", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def _commit_of(project: Path) -> str | None:
    env = {**os.environ, "PYTHONPATH": str(project)}
    out = subprocess.run([sys.executable, "-c", COMMIT], capture_output=True, text=True,
                         env=env, cwd=project.parent, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["commit"]


def test_a_vendored_copy_records_no_commit_its_own_repository_does(tmp_path):
    """Before: the commit of whatever repository encloses the installed tree (here the
    outer project's), as if it were residency's."""
    outer = tmp_path / "outer"
    project = outer / "third_party" / "residency"
    shutil.copytree(ROOT / "residency", project / "residency",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    _git(outer, "init", "-q")
    _git(outer, "add", "-A")
    _git(outer, "commit", "-q", "-m", "outer")
    assert _commit_of(project) is None
    _git(project, "init", "-q")  # the project's own checkout: its top level holds pyproject
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "own")
    assert _commit_of(project) == _git(project, "rev-parse", "HEAD")
    assert _commit_of(project) != _git(outer, "rev-parse", "HEAD")
