"""Run-supplied text in written cells stays inert: no CSV cell a spreadsheet runs as a formula
(`humanize.csv_text`, every CSV writer), no link or autolink in Markdown prose (`md_text`) or
Markdown table cells (`write_markdown_table`), as nbconvert's renderer (mistune) reads them."""

from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from residency import humanize
from residency.notebook.outputs import write_tables
from residency.reports import tables, views
from tests.helpers import PAIRED, reseal

FORMULA = '=HYPERLINK("http://evil.example/c","x")'
HOSTILE_CELLS = [FORMULA, "+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|x",
                 "\t=1+1", "\r=1+1", "-inf", "- note"]
HOSTILE_MD = ["see http://evil.example/x now", "https://evil.example", "www.evil.example",
              "mail a@evil.example", "mailto:a@evil.example", "<http://evil.example>",
              "[j](javascript:alert(1))", "![i](http://evil.example/i.png)",
              "[j][r]", "\\[j\\](javascript:alert(1))", "<img src=x onerror=alert(1)>",
              "ftp://evil.example/f"]


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


@dataclass(frozen=True)
class CellCase:
    value: object
    expected: object


CELL_CASES = [
    *(CellCase(v, "'" + v) for v in HOSTILE_CELLS),
    CellCase("-0.18", "-0.18"),  # a number as text is not a formula
    CellCase("+1e-05", "+1e-05"),
    CellCase("kernel=x", "kernel=x"),
    CellCase("'already", "'already"),
    CellCase(-0.18, -0.18),
    CellCase(-3, -3),
    CellCase(None, None),
]


@pytest.mark.parametrize("case", CELL_CASES, ids=lambda c: repr(c.value))
def test_csv_cell_neutralises_formula_text_only(case: CellCase) -> None:
    assert humanize.csv_cell(case.value) == case.expected


def test_csv_text_quotes_text_cells_and_keeps_numbers_exact() -> None:
    frame = pd.DataFrame({"cause": HOSTILE_CELLS, "delta_ms": [-0.18, -1.734383532999999, 2.5,
                                                              float("nan"), -7.0, 0.1, -1e-9, 3],
                          "n": [-1, 2, 3, 4, 5, 6, 7, 8]})
    frame[FORMULA] = "ok"
    before = frame.copy()
    rows = _cells(humanize.csv_text(frame))
    assert rows[0] == ["cause", "delta_ms", "n", "'" + FORMULA]
    assert [r[0] for r in rows[1:]] == ["'" + v for v in HOSTILE_CELLS]
    back = pd.read_csv(io.StringIO(humanize.csv_text(frame)))
    assert back["delta_ms"].equals(frame["delta_ms"])  # -0.18 stays a number, exactly
    assert back["n"].tolist() == frame["n"].tolist()
    assert frame.equals(before)  # the caller's frame is not changed


def test_evidence_tables_as_csv_quote_formula_cells() -> None:
    table = pd.DataFrame({"metric": [FORMULA], "baseline": ["1 ms"]})
    table.attrs["title"] = "Evidence"
    text = tables.render([table], "csv")
    assert _cells(text)[1][0] == "'" + FORMULA


def test_notebook_tables_write_neutralised_csv(tmp_path: Path) -> None:
    plain = pd.DataFrame({"name": [FORMULA, "@cmd"], "delta_ms": [-0.18, 1.0]})
    evidence = pd.DataFrame({"metric": ["+cmd|x"], "note": ["fine"]})
    evidence.attrs["title"] = "Evidence"
    write_tables(tmp_path, {"plain": plain, "evidence": evidence})
    rows = _cells((tmp_path / "plain.csv").read_text(encoding="utf-8"))
    assert rows[1] == ["'" + FORMULA, "-0.18"] and rows[2][0] == "'@cmd"
    assert _cells((tmp_path / "evidence.csv").read_text(encoding="utf-8"))[1][0] == "'+cmd|x"


def test_a_carriage_return_inside_a_cell_starts_no_row() -> None:
    frame = pd.DataFrame({"name": ["ok\r=HYPERLINK(1)", "a\r\nb", 'q"\r'], "v": [1, 2, 3]})
    text = humanize.csv_text(frame)
    assert text.startswith("name,v\n") and text.endswith("3\n") and "\r\n3" not in text
    assert pd.read_csv(io.StringIO(text, newline=""))["name"].tolist() == frame["name"].tolist()


def test_csv_comment_keeps_run_text_on_its_line() -> None:
    assert humanize.csv_comment("runs 00-a\n=HYPERLINK(1)\r\n@x") == "# runs 00-a =HYPERLINK(1) @x"


@pytest.fixture(scope="module")
def hostile_trace_run(tmp_path_factory) -> Path:
    """The paired-profile run with a kernel and an innermost host range named as formulas."""
    run = tmp_path_factory.mktemp("csv") / "run"
    shutil.copytree(PAIRED, run)
    for path in sorted(run.glob("runs/*/trace/rank*.trace.json")):
        t = json.loads(path.read_text())
        prepare = next(e for e in t["traceEvents"] if e.get("name") == "residency.phase[prepare]")
        for e in t["traceEvents"]:
            if e.get("name") == "text_encoder":
                e["name"] = '=HYPERLINK("http://evil.example/k","kernel")'
        t["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": FORMULA,
                                 "pid": prepare["pid"], "tid": prepare["tid"],
                                 "ts": prepare["ts"] + 1, "dur": 400000})
        path.write_text(json.dumps(t))
    reseal(run)
    return run


def _formula_cells(path: Path) -> list[str]:
    return [c for r in _cells(path.read_text(encoding="utf-8")) for c in r
            if humanize.csv_cell(c) != c]


def test_trace_csvs_quote_kernel_and_range_names(hostile_trace_run: Path, tmp_path: Path,
                                                 monkeypatch) -> None:
    from residency.evidence.runs import reference_pair
    from residency.rundir.run import load_run

    monkeypatch.setattr(views, "show_table", lambda *a, **k: None)
    run = load_run(hostile_trace_run)
    pair = reference_pair(run)
    causes = views.write_causes(run, pair, tmp_path)
    diff = views.write_trace_diff(run, pair, tmp_path)
    assert causes is not None and diff is not None
    for path in (causes, tmp_path / "idle_by_cause_diff.csv", diff):
        assert _formula_cells(path) == [], path.name
    assert "'" + FORMULA in [c for r in _cells(causes.read_text()) for c in r]
    assert "'=HYPERLINK" in [c for r in _cells(diff.read_text()) for c in r]
    numbers = pd.read_csv(tmp_path / "idle_by_cause_diff.csv")["delta_idle_ms"]
    assert pd.api.types.is_float_dtype(numbers) and (numbers < 0).any()  # negatives stay numbers


def _html(markdown: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(markdown)


@pytest.mark.parametrize("text", HOSTILE_MD)
def test_md_text_renders_no_link(text: str) -> None:
    html = _html(f"Host {humanize.md_text(text)} and {humanize.md_code(text)}.")
    assert "<a" not in html and "<img" not in html


@pytest.mark.parametrize("text", HOSTILE_MD)
def test_markdown_table_cells_render_no_link(text: str) -> None:
    md = humanize.write_markdown_table(["name", "value"], [[text, "1"], ["x\\|y", "2"]])
    html = _html(md)
    assert "<a" not in html and "<img" not in html
    assert html.count("<td") == 4  # an escaped pipe in a cell splits no row


def test_evidence_markdown_renders_no_link() -> None:
    table = pd.DataFrame({"metric": HOSTILE_MD, "note": HOSTILE_MD})
    table.attrs["title"] = "Evidence"
    html = _html(tables.to_markdown(table)).replace('<a class="anchor-link"', "")
    assert "<a" not in html and "<img" not in html
