"""Run text (run folder names, which the evidence's notes quote) reaches reports and terminals
inert: no tag, link or mathtext of it is rendered, no control character printed."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from residency import evidence
from residency.notebook import paired
from residency.records.manifest import read_manifest, write_manifest
from residency.rundir.run import load_run
from tests.helpers import PAIRED, reseal

TAG = '<img src=x onerror="alert(1)">[j](javascript:alert(1))'


def _renamed(tmp_path: Path, names: dict[int, str]) -> Path:
    """The paired-profile run with the service runs of `names` (index -> new folder name)
    renamed, its manifest and seal rewritten to match."""
    run = tmp_path / "run"
    shutil.copytree(PAIRED, run)
    m = read_manifest(run)
    for i, name in names.items():
        entry = m["runs"][i]
        os.rename(run / entry["dir"], run / "runs" / name)
        entry["dir"] = f"runs/{name}"
    write_manifest(run, m)
    reseal(run)
    return run


@pytest.fixture(scope="module")
def hostile_evidence(tmp_path_factory) -> evidence.Evidence:
    run = _renamed(tmp_path_factory.mktemp("h"), {
        i: f"{i:02d}-{TAG}{i}" for i in range(len(read_manifest(PAIRED)["runs"]))})
    return evidence.build(load_run(run))


def test_the_notes_quote_run_names_as_inert_text(hostile_evidence):
    notes = [paired.note(hostile_evidence, k) for k in paired.NOTE_KEYS]
    notes += paired.notes(hostile_evidence, list(paired.NOTE_KEYS))
    quoted = [n for n in notes if "onerror" in n]
    assert quoted, "the notes no longer quote run names: the test needs another carrier"
    for n in quoted:
        assert "<img" not in n and "](javascript" not in n, n
        assert "&lt;img" in n and r"\[j\]" in n


@pytest.fixture(scope="module")
def dollar_evidence(tmp_path_factory) -> evidence.Evidence:
    n = len(read_manifest(PAIRED)["runs"])
    run = _renamed(tmp_path_factory.mktemp("d"), {i: f"{i:02d}-b$^^${i}" for i in range(n)})
    return evidence.build(load_run(run))


def test_figures_draw_run_names_with_dollars_as_written(dollar_evidence, tmp_path):
    """A `$` pair is matplotlib mathtext: `00-b$^^$` in a run folder's name stopped the
    report with a mathtext ValueError when the figure was saved."""
    from matplotlib.text import Text

    from residency.notebook.outputs import save_figure
    from residency.reports import figures, views
    from residency.reports.plots import e2e_slopegraph

    built = [figures.plot_normal_calls(dollar_evidence), figures.plot_idle(dollar_evidence),
             e2e_slopegraph(*views.e2e_pairs(dollar_evidence),
                            device_kind=dollar_evidence.device_kind)]
    texts = [t.get_text() for fig in built for t in fig.findobj(Text)]
    assert any("$^^$" in t for t in texts), "no figure shows a run name: needs another carrier"
    for k, fig in enumerate(built):
        assert save_figure(fig, tmp_path, f"f{k}").stat().st_size > 0


def test_idle_prints_trace_names_without_their_control_characters(tmp_path):
    """Host range names (a trace's text) went to the terminal raw: an ESC [2J cleared it and
    an OSC set its title."""
    import subprocess
    import sys

    evil = "residency.release[normal]\x1b[2J\x1b]0;TITLE\x07\u202eevil"
    doc = json.loads((PAIRED.parent.parent.parent / "tests" / "data" / "traces"
                      / "kineto_basic" / "rank0.trace.json").read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation":
            e["name"] = evil
    d = tmp_path / "t"
    d.mkdir()
    (d / "rank0.trace.json").write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "residency", "idle", str(d), "--by-cause",
                          "--marker", "nothing", "--no-cache"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "\\x1b[2J" in out.stdout  # the name is shown, escaped
    for stream in (out.stdout, out.stderr):
        assert not [c for c in stream if not c.isprintable() and c != "\n"], stream


def test_every_notebook_gets_its_own_report_name():
    """`x-y.ipynb` beside `x/y.ipynb` and `z/y.ipynb`: two reports were written to x-y.html,
    the second over the first."""
    from residency.reports.html import output_names

    names = output_names([Path("nb/x-y.ipynb"), Path("nb/x/y.ipynb"), Path("nb/z/y.ipynb"),
                          Path("nb/x-y-2.ipynb")])
    assert len(set(names)) == 4 and names[:3] == ["x-y", "x-y-2", "z-y"]


def test_the_index_links_pages_as_paths_under_a_policy(tmp_path):
    """A report named `javascript:alert(document.title).html` was linked as that URL."""
    from html import escape

    from residency.reports.html import INDEX_CSP, write_index

    (tmp_path / "javascript:alert(document.title).html").write_text("<html></html>")
    (tmp_path / "a b#c.html").write_text("<html></html>")
    page = write_index(tmp_path).read_text()
    assert 'href="javascript%3Aalert%28document.title%29.html"' in page
    assert 'href="a%20b%23c.html"' in page and 'href="javascript:' not in page
    assert f'<meta http-equiv="Content-Security-Policy" content="{escape(INDEX_CSP)}">' in page


def test_a_notebook_nested_past_the_stack_is_a_clear_error(tmp_path):
    from residency.reports.html import ReportError, render_html

    nb = tmp_path / "deep.ipynb"
    nb.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReportError, match=r"deep.ipynb: cannot read notebook \(RecursionError"):
        render_html(nb, tmp_path / "out")


def test_the_markdown_tables_title_names_the_run_inertly(tmp_path):
    """`residency tables RUN --format md` printed the run folder's name raw in its title."""
    from residency.reports import tables

    run = tmp_path / f"{TAG}"
    shutil.copytree(PAIRED, run)
    md = tables.to_markdown(tables.evidence_table(load_run(run)))
    title = md.splitlines()[0]
    assert title.startswith("### Evidence: ") and "&lt;img" in title
    assert "<img" not in title and not re.search(r"(?<!\\)\]\(javascript", title)
    assert "(device kind emulated-npu" in title  # its own words as they were
