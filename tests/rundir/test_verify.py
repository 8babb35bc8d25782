"""Evidence integrity: sha256 of every artifact, `residency verify`, refusal by tables."""

from __future__ import annotations

import shutil

import pytest

from residency.rundir.run import RunDirError, load_run, verify_run
from tests.helpers import FIXTURE_RUN as FIXTURE
from tests.helpers import residency as cli


def test_intact_run_verifies(sealed) -> None:
    result = verify_run(sealed)
    assert result.ok and result.checked >= 5
    proc = cli("verify", str(sealed))
    assert proc.returncode == 0 and "verified" in proc.stdout and proc.stderr == ""


def test_missing_extra_and_changed_files_are_reported(sealed) -> None:
    client = next(sealed.glob("runs/*/client.json"))
    decisions = next(sealed.glob("runs/*/decisions-rank0.jsonl"))
    client.unlink()
    decisions.write_text(decisions.read_text().replace("retained", "released", 1))
    (sealed / "runs" / "stray.txt").write_text("not evidence")
    # no cache ever lives in a run (issue 26): one a sender planted there is an extra file
    (sealed / "runs" / "residency.parquet.cache").mkdir()
    (sealed / "runs" / "residency.parquet.cache" / "x.parquet").write_bytes(b"cache")
    result = verify_run(sealed)
    rel = lambda p: p.relative_to(sealed).as_posix()  # noqa: E731
    assert result.missing == (rel(client),)
    assert result.extra == ("runs/residency.parquet.cache/x.parquet", "runs/stray.txt")
    assert result.changed == (rel(decisions),)
    proc = cli("verify", str(sealed))
    assert proc.returncode == 1
    assert "1 missing, 2 extra, 1 changed" in proc.stdout and "runs/stray.txt" in proc.stdout


def test_analysis_refuses_a_tampered_run_unless_told(sealed) -> None:
    decisions = next(sealed.glob("runs/*/decisions-rank1.jsonl"))
    decisions.write_text(decisions.read_text() + "\n")
    with pytest.raises(RunDirError, match="failed verification"):
        load_run(sealed)
    assert load_run(sealed, verify=False).runs
    proc = cli("tables", str(sealed))
    assert proc.returncode == 2 and "failed verification" in proc.stderr
    assert cli("tables", str(sealed), "--no-verify").returncode == 0


def test_verify_without_recorded_hashes_is_an_error(tmp_path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "run")
    proc = cli("verify", str(tmp_path / "run"))
    assert proc.returncode == 2 and "no sha256 list" in proc.stderr
