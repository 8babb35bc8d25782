"""A/A noise in the evidence: the spread of same-arm pairs from an A/A run, as its own
attribution and as what the unprofiled A/B E2E delta is read against (issue 16, item 3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from residency import evidence, humanize
from residency import notebook as nb
from residency.notebook.params import ParameterError
from residency.records.manifest import read_manifest, write_manifest
from residency.reports import tables
from residency.rundir.run import load_run
from tests.helpers import PAIRED, ROOT, run_cli

AA = ROOT / "data" / "runs" / "emulated-aa-2r50s"


def _slots(run_dir: Path) -> tuple[list[float], list[float]]:
    """Slot A and slot B E2E values (s) in run order, read straight from manifest.json."""
    runs = read_manifest(run_dir)["runs"]
    return ([r["e2e_s"] for r in runs if r["slot"] == "A"],
            [r["e2e_s"] for r in runs if r["slot"] == "B"])


@pytest.fixture(scope="module")
def with_aa() -> evidence.Evidence:
    return evidence.build(load_run(PAIRED), aa=load_run(AA), traces=False)


def test_aa_run_alone_gives_its_noise_with_known_answers() -> None:
    a, b = _slots(AA)
    assert len(a) == len(b) >= 3
    deltas = [y - x for x, y in zip(a, b, strict=True)]
    every = a + b
    ev = evidence.build(load_run(AA), traces=False)
    noise = ev["e2e_aa"]
    assert noise.kind == "aa" and noise.n == {"A": len(a), "B": len(b)}
    assert noise.detail["spread_s"] == pytest.approx(float(np.median(np.abs(deltas))))
    assert noise.detail["max_abs_s"] == pytest.approx(max(abs(d) for d in deltas))
    assert noise.detail["cv"] == pytest.approx(np.std(every, ddof=1) / np.mean(every))
    assert noise.scope.what == "this run" and "no test" in noise.judged_on
    assert "e2e_unprofiled" not in ev  # no A/B pairs in an A/A run


def test_ab_note_reads_the_delta_against_the_aa_spread(with_aa) -> None:
    ab = with_aa["e2e_unprofiled"]
    spread = with_aa["e2e_aa"].detail["spread_s"]
    assert ab.detail["aa_spread_s"] == pytest.approx(spread)
    assert ab.detail["aa_run"] == AA.name
    assert "A/A noise" in ab.note and AA.name in ab.note
    md = abs(ab.detail["median_of_deltas_s"])
    assert ("within the noise" in ab.note) is (md <= spread)
    without = evidence.build(load_run(PAIRED), traces=False)
    assert "e2e_aa" not in without and "A/A noise" not in without["e2e_unprofiled"].note


def test_evidence_table_has_the_aa_row_and_says_its_test(with_aa) -> None:
    t = tables.evidence_table(with_aa)
    row = t[t["metric"].str.startswith("client E2E noise, A/A")]
    assert len(row) == 1
    a, _ = _slots(AA)
    assert row.iloc[0]["n"] == f"{len(a)} A/A pairs"
    assert "A/A noise: median |delta| of same-arm pairs" in t.attrs["footer"]


def test_cli_tables_aa_adds_the_row() -> None:
    rc, out, err = run_cli("tables", str(PAIRED), "--aa", str(AA), "--format", "json")
    assert rc == 0, err
    assert "client E2E noise, A/A" in out


def test_an_ab_run_given_as_aa_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="not an A/A run"):
        evidence.build(load_run(PAIRED), aa=load_run(PAIRED), traces=False)
    rc, _, err = run_cli("tables", str(PAIRED), "--aa", str(PAIRED))
    assert rc == 2 and "not an A/A run" in err


def test_aa_of_another_device_kind_is_refused(tmp_path) -> None:
    other = tmp_path / "aa"
    shutil.copytree(AA, other)
    m = read_manifest(other)
    m["device_kind"] = "cuda"
    write_manifest(other, m)
    aa = load_run(other, verify=False)
    with pytest.raises(ValueError, match="device kind cuda differs"):
        evidence.build(load_run(PAIRED), aa=aa, traces=False)


def test_notebook_parameter_aa_source_is_checked() -> None:
    ok = nb.check_parameters(aa_source=str(AA))
    assert ok["aa_source"] == str(AA.resolve())
    assert nb.check_parameters(aa_source=None)["aa_source"] is None
    with pytest.raises(ParameterError, match="`aa_source` must be a run of design 'aa'"):
        nb.check_parameters(aa_source=str(PAIRED))
    with pytest.raises(ParameterError, match="`aa_source` must be None or a recorded run"):
        nb.check_parameters(aa_source="run")


def test_first_screen_states_the_verdict_and_the_aa_spread_without_project_targets(
        with_aa) -> None:
    """Issue 25 (replacing issue 16's headline): the first screen carries the E2E verdict,
    once, and the A/A noise in the E2E note; our own 10-minute target is no user report's
    business (the recording time stays in the banner)."""
    run = load_run(PAIRED)
    text = nb.first_screen(with_aa, run)
    verdict = with_aa["e2e_unprofiled"].detail["verdict"]
    assert verdict.startswith(("Verdict:", "No verdict:")) and verdict in text
    assert text.count("erdict:") == 1 and nb.headline(with_aa, run) == text
    assert "target" not in text and "met" not in text.split() and "emulated NPU" in text
    notes = nb.first_screen_notes(with_aa, run)
    assert f"median \\|delta\\| {humanize.quantity(with_aa['e2e_aa'].detail['spread_s'], 's')}" \
        in notes


@pytest.mark.slow
def test_pair_design_aa_prints_its_noise(tmp_path) -> None:
    out_dir = tmp_path / "aa"
    rc, out, err = run_cli("pair", "--design", "aa", "--pairs", "1", "--requests", "2",
                           "--device", "emulated-npu", "--ranks", "2", "--steps", "2",
                           "--scale", "0.02", "--resident-mib", "256", "--out", str(out_dir),
                           "--no-progress")
    assert rc == 0, err
    a, b = _slots(out_dir)
    spread = abs(b[0] - a[0])
    assert "A/A: the same arm in both slots, 1 pair(s)" in out
    assert f"`residency tables RUN_DIR --aa {out_dir}`" in out
    assert evidence.build(load_run(out_dir), traces=False)["e2e_aa"].detail[
        "spread_s"] == pytest.approx(spread)


def test_an_aa_runs_table_says_its_other_column_is_empty_by_design() -> None:
    t = tables.evidence_table(evidence.build(load_run(AA), traces=False))
    assert "A/A run: the candidate arm in both slots" in t.attrs["footer"]
    assert "A/A run" not in tables.evidence_table(
        evidence.build(load_run(PAIRED), traces=False)).attrs["footer"]


def test_e2e_figure_draws_the_aa_band(with_aa) -> None:
    from residency.reports import views as rv
    from residency.reports.plots import e2e_slopegraph

    spread = rv.aa_spread(with_aa)
    assert spread == pytest.approx(with_aa["e2e_aa"].detail["spread_s"])
    fig = e2e_slopegraph(*rv.e2e_pairs(with_aa), device_kind=with_aa.device_kind,
                         aa_spread=spread)
    deltas = fig.axes[2]
    band = [p for p in deltas.patches if "A/A noise" in str(p.get_label())]
    assert len(band) == 1
    rect = band[0]  # axhspan: y and height in data units
    assert rect.get_y() == pytest.approx(-spread)
    assert rect.get_y() + rect.get_height() == pytest.approx(spread)
    plain = e2e_slopegraph(*rv.e2e_pairs(with_aa), device_kind=with_aa.device_kind)
    assert not [p for p in plain.axes[2].patches if "A/A" in str(p.get_label())]
    assert rv.aa_spread(evidence.build(load_run(PAIRED), traces=False)) is None
