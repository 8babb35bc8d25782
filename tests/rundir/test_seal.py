"""Sealed evidence (issue 14): every edit of the manifest or of a file is reported by `verify`
and refused by analysis; manifest paths stay inside the run; only regular files are read.

Each case reproduces a finding of the issue on a copy of the recorded paired run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from residency.records import client as client_record
from residency.records.client import CLIENT
from residency.records.decisions import decisions_file
from residency.records.manifest import MANIFEST, read_manifest
from residency.records.seal import parse_digest, run_digest, seal, seal_findings
from residency.rundir.run import RunDirError, load_run, verify_run
from tests.helpers import ROOT, edit_manifest, residency

RECORDED = ROOT / "data" / "runs" / "emulated-paired-profile-2r50s"
HANG_S = 60  # a hang detector for FIFOs, not a timing assertion


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(RECORDED, dst, ignore=shutil.ignore_patterns("residency.parquet.cache"))
    return dst


def cli(*args: str) -> subprocess.CompletedProcess:
    return residency(*args, timeout=HANG_S)


def one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_recorded_run_is_sealed_and_verifies(run: Path) -> None:
    m = read_manifest(run)
    assert m["seal"]["digest"] == run_digest(m)
    assert seal_findings(m) == []
    proc = cli("verify", str(run))
    assert proc.returncode == 0, proc.stdout
    assert f"digest   {m['seal']['digest']}" in proc.stdout


def test_edited_e2e_in_the_manifest_is_reported_and_refused(run: Path) -> None:
    # the first finding: candidate e2e_s / 10 passed verify and changed the table
    def tenth(m: dict[str, Any]) -> None:
        m["runs"][1]["e2e_s"] /= 10

    edit_manifest(run, tenth)
    edited = read_manifest(run)["runs"][1]["e2e_s"]
    result = verify_run(run)
    assert not result.ok
    assert result.manifest == ("manifest.json field `runs[1]` changed since the run was "
                               "sealed",)
    assert any(m.startswith(f"runs[1].e2e_s is {edited!r}") and CLIENT in m
               for m in result.mismatched)
    proc = cli("verify", str(run))
    assert proc.returncode == 1 and "runs[1]" in proc.stdout
    err = one_line_error(cli("tables", str(run)))
    assert "failed verification" in err and "runs[1]" in err
    assert cli("tables", str(run), "--no-verify").returncode == 0


@pytest.mark.parametrize(("field", "change"), [
    ("device_kind", lambda m: m.update(device_kind="npu")),
    ("order", lambda m: m["order"].reverse()),
    ("params", lambda m: m["params"].update(steps=5)),
    ("design", lambda m: m.update(design="alternating")),
    ("runs[0]", lambda m: m["runs"][0].update(arm="candidate")),
    ("runs", lambda m: m["runs"].pop()),
    ("artifacts", lambda m: m["artifacts"].pop("runs/00-baseline/service.log")),
])
def test_every_manifest_field_is_covered(run: Path, field: str,
                                         change: Callable[[dict[str, Any]], None]) -> None:
    edit_manifest(run, change)
    findings = verify_run(run).manifest
    assert any(f"field `{field}`" in f for f in findings), findings
    with pytest.raises(RunDirError, match="failed verification"):
        load_run(run)


def test_a_resealed_run_is_caught_by_the_quoted_digest(run: Path) -> None:
    quoted = read_manifest(run)["seal"]["digest"]

    def forge(m: dict[str, Any]) -> None:  # an attacker who recomputes the seal
        m["runs"][1]["e2e_s"] = m["runs"][0]["e2e_s"]
        m["seal"] = seal(m)

    edit_manifest(run, forge)
    client = run / "runs" / "01-candidate" / CLIENT
    c = client_record.read_raw(client)
    c["e2e_s"] = read_manifest(run)["runs"][1]["e2e_s"]
    client_record.write_raw(client, c)

    def rehash(m: dict[str, Any]) -> None:
        from residency.records.manifest import artifact_hashes

        m["artifacts"] = artifact_hashes(run)
        m["seal"] = seal(m)

    edit_manifest(run, rehash)
    assert verify_run(run).ok  # the seal inside the run cannot see a careful forgery ...
    proc = cli("verify", str(run), "--digest", quoted)  # ... the quoted digest does
    assert proc.returncode == 1 and "is not the quoted" in proc.stdout
    now = verify_run(run).digest
    assert cli("verify", str(run), "--digest", now.upper()).returncode == 0
    assert "--digest" in one_line_error(cli("verify", str(run), "--digest", "sha256:abc"))
    with pytest.raises(ValueError, match="--digest"):
        parse_digest("md5:00")


@pytest.mark.parametrize("where", ["/tmp", "../..", "runs/../../x", "", 7])
def test_run_dirs_may_not_leave_the_run(run: Path, where: Any) -> None:
    edit_manifest(run, lambda m: m["runs"][0].update(dir=where))
    with pytest.raises(RunDirError, match=r"runs\[0\]\.dir"):
        load_run(run, verify=False)
    err = one_line_error(cli("tables", str(run), "--no-verify"))
    assert "runs[0].dir" in err


def test_run_dir_through_a_symlink_is_refused(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(run / "runs" / "00-baseline", outside)
    shutil.rmtree(run / "runs" / "00-baseline")
    (run / "runs" / "00-baseline").symlink_to(outside)
    with pytest.raises(RunDirError, match="symbolic link"):
        load_run(run, verify=False)
    result = verify_run(run)
    assert "runs/00-baseline: a symbolic link" in result.unsafe


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("make", [_fifo, _dev_zero], ids=["fifo", "link-to-dev-zero"])
def test_non_regular_evidence_is_an_error_never_a_hang(run: Path, make: Any) -> None:
    target = run / "runs" / "02-baseline" / decisions_file(2)
    make(target)
    result = verify_run(run)
    assert not result.ok and any(u.startswith("runs/02-baseline/decisions-rank2.jsonl")
                                 for u in result.unsafe)
    assert cli("verify", str(run)).returncode == 1
    for cmd in (("tables", str(run), "--no-verify"), ("whatif", str(run), "--no-verify")):
        err = one_line_error(cli(*cmd))
        assert decisions_file(2) in err and "not a regular file" in err or \
            "symbolic link" in err


def _deep(m: dict[str, Any]) -> str:
    text = json.dumps(m)
    return text[:-1] + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}"


@pytest.mark.parametrize(("name", "mutate", "words"), [
    ("index 1e400", lambda t: t.replace('"index": 0', '"index": 1e400', 1), "runs[0].index"),
    ("e2e_s list", lambda t: re.sub(r'"e2e_s": ([0-9.]+)', r'"e2e_s": [1], "x": \1', t,
                                    count=1), "runs[0].e2e_s"),
    ("nested 200000 deep", lambda t: _deep(json.loads(t)), "nested too deeply"),
])
def test_malformed_manifest_is_one_line(run: Path, name: str, mutate: Any, words: str) -> None:
    path = run / MANIFEST
    path.write_text(mutate(path.read_text()))
    for cmd in ("tables", "whatif"):
        assert words in one_line_error(cli(cmd, str(run), "--no-verify"))
    proc = cli("verify", str(run))
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("line", "words"), [
    ('"hello"', "expected a JSON object"),
    ('{"start_ns": 1, "end_ns": Infinity}', "end_ns"),
    ('{"start_ns": 1, "end_ns": 2, "snapshot": {"reserved": 10000000000000000000000000000000'
     '000000000}}', "snapshot.reserved"),
    ('[' * 100_000 + ']' * 100_000, "nested too deeply"),
])
def test_malformed_decisions_are_one_line(run: Path, line: str, words: str) -> None:
    path = run / "runs" / "00-baseline" / decisions_file(0)
    path.write_text(path.read_text() + line + "\n")
    for cmd in ("tables", "whatif"):
        err = one_line_error(cli(cmd, str(run), "--no-verify"))
        assert words in err and decisions_file(0) in err


def test_the_evidence_table_footer_quotes_the_digest(run: Path) -> None:
    digest = read_manifest(run)["seal"]["digest"]
    proc = cli("tables", str(run))
    assert proc.returncode == 0 and f"Run digest: {digest}." in proc.stdout
