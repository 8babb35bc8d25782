"""A received notebook on the report page (issue 41 F6, F16, F18): its outputs' classes take no
style of the page's JupyterLab stylesheet, its styles load nothing, its page cannot make the
screenshot run away, and a notebook that is no notebook is one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from residency.cli.main import main
from residency.records.manifest import read_manifest
from residency.reports import banner
from residency.reports import html as reports
from residency.reports.sanitize import clean_html
from tests.reading import BodyTags

ROOT = Path(__file__).resolve().parent.parent.parent
RECORDED = ROOT / "data" / "runs" / "emulated-paired-profile-2r50s"
FAKE = "npu: Ascend NPU (8 x 910B) — measured"
# what a received notebook's output held (F6): JupyterLab's command palette is absolute with
# z-index 10000 and drew the fake banner over the real one; its dialog greys the whole page
HOSTILE = (f'<div class="jp-ModalCommandPalette lm-Widget">{FAKE}</div>'
           '<div class="jp-Dialog"><div class="jp-Dialog-content">OK</div></div>'
           '<p class="residency-note jp-mod-hidden" style="color:red;'
           "background:url(data:image/png;base64,iVBORw0KGgo=) no-repeat;"
           "background-color:rgb(1,2,3)\">kept</p>"
           '<span style="background:image-set(\'https://evil.example/x.png\' 1x)">s</span>'
           '<span style="background:URL(https://evil.example/y.png)">t</span>'
           '<span style="background:\\75 rl(https://evil.example/z.png)">u</span>')


def _received(path: Path, html: str) -> Path:
    """An executed notebook with the package's banner, a table of its own, a Markdown
    heading, and `html` as one more output."""
    from residency import humanize

    manifest = read_manifest(RECORDED)
    shown = nbformat.v4.new_output(
        "display_data", data={"text/html": banner.banner_html(manifest),
                              "text/plain": banner.banner_line(manifest)},
        metadata={banner.BANNER_METADATA: True})
    import pandas as pd

    book = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Paired profile"),
        nbformat.v4.new_code_cell("x", execution_count=1, outputs=[shown]),
        nbformat.v4.new_code_cell("y", execution_count=2, outputs=[
            nbformat.v4.new_output("display_data", data={
                "text/html": humanize.html_table(pd.DataFrame({"a": [1.5]}))}),
            nbformat.v4.new_output("display_data", data={"text/html": html})])])
    nbformat.write(book, path)
    return path


def test_a_received_outputs_classes_take_no_style_of_the_page(tmp_path: Path) -> None:
    """The palette and dialog classes are dropped (the elements and their text stay, in
    their place); the package's own classes and the headings' anchors are kept (F6)."""
    page = reports.render_html(_received(tmp_path / "r.ipynb", HOSTILE), tmp_path / "out")
    parser = BodyTags()
    parser.feed(page.read_text())
    classes = {c for _, a in parser.tags for c in a.get("class", "").split()}
    for name in ("jp-ModalCommandPalette", "jp-Dialog", "jp-Dialog-content", "lm-Widget",
                 "jp-mod-hidden"):
        assert name not in classes, name
    for name in (banner.BANNER_CLASS, "residency-table", "residency-note", "anchor-link",
                 "jp-OutputArea-output"):  # (the last one is the template's own wrapper)
        assert name in classes, name
    assert FAKE in page.read_text()  # shown where it was, as a plain block


def test_kept_styles_load_nothing() -> None:
    """``url()`` in any spelling and image functions are dropped with their declaration; the
    colours beside them stay (F18)."""
    out = clean_html(HOSTILE)
    parser = BodyTags()
    parser.feed(f"<body>{out}")
    styles = " ".join(a["style"] for _, a in parser.tags if "style" in a).lower()
    for needle in ("url", "image-set", "evil", "base64", "\\75"):
        assert needle not in styles, (needle, styles)
    assert "color:red" in styles.replace(" ", "")
    assert "rgb(1,2,3)" in styles.replace(" ", "")


needs_chromium = pytest.mark.skipif(reports.find_chromium() is None,
                                    reason="no Chromium (apt-get install chromium)")


@needs_chromium
def test_a_page_taller_than_the_cap_is_captured_to_the_cap(tmp_path: Path, capsys) -> None:
    """One output with ``padding-top:99999999px``: at most `MAX_PAGE_HEIGHT_PX` captured (4
    images, not 2,048), and one warning line saying so (F18)."""
    src = _received(tmp_path / "tall.ipynb", '<div style="padding-top:99999999px">x</div>')
    out = tmp_path / "out"
    assert main(["report", str(src), "--out", str(out), "--screenshot"]) == 0
    captured = capsys.readouterr()
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == reports.MAX_PAGE_HEIGHT_PX // reports.MAX_PNG_HEIGHT_PX == 4
    assert sum(reports.png_size(p)[1] for p in pngs) == reports.MAX_PAGE_HEIGHT_PX
    assert [str(p) for p in pngs] == sorted(captured.out.splitlines()[1:])
    warning = captured.err.strip()
    assert "\n" not in warning and warning.startswith("residency report: warning: ")
    assert "65,536 px" in warning


def _fail_at_second_slice(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    calls = []
    real = reports.DevToolsSession.call

    def call(self, method, params=None, *, session=None):
        if method == "Page.captureScreenshot":
            calls.append(1)
            if len(calls) == 2:
                raise exc
        return real(self, method, params, session=session)

    monkeypatch.setattr(reports.DevToolsSession, "call", call)


@needs_chromium
@pytest.mark.parametrize("exc", [reports.ReportError("Chromium did not finish"),
                                 KeyboardInterrupt()], ids=["failure", "interrupt"])
def test_a_failed_screenshot_leaves_no_image(tmp_path: Path, monkeypatch, exc) -> None:
    """The slices written before a failure (or Ctrl-C) are removed with it (F18)."""
    page = tmp_path / "tall.html"
    page.write_text('<html><body style="margin:0"><div style="height:5000px">a</div>'
                    '</body></html>')
    _fail_at_second_slice(monkeypatch, exc)
    with pytest.raises(type(exc)):
        reports.capture(page, tmp_path / "tall.png", max_height_px=2000, timeout_s=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tall.html"]


def test_chromiums_log_is_one_line_of_the_error(tmp_path: Path) -> None:
    """A Chromium that fails after writing a many-line log: the error is one line, quoting
    the log's last line only (F18)."""
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nfor i in 1 2 3 4 5 6 7; do echo \"[$i:ERROR] noise $i\" >&2; "
                    "done\necho 'last words' >&2\nexit 3\n")
    fake.chmod(0o755)
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    with pytest.raises(reports.ReportError) as caught:
        reports.capture(page, tmp_path / "p.png", chromium=str(fake), timeout_s=20)
    text = str(caught.value)
    assert "\n" not in text and "last words" in text and "noise" not in text, text
    assert not (tmp_path / "p.png").exists()


# -- F16: a notebook that fails validation ----------------------------------------------------

@pytest.mark.parametrize("content", [
    "{}",
    '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}',
    '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": "x"}',
    '{"nbformat": 99, "nbformat_minor": 0, "cells": []}',
    "[]",
], ids=["empty", "cell-without-fields", "cells-not-a-list", "future-format", "a-list"])
def test_a_notebook_that_fails_validation_is_one_line(tmp_path: Path, capsys,
                                                      content: str) -> None:
    src = tmp_path / "bad.ipynb"
    src.write_text(content)
    assert main(["report", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"residency report: error: {src}: ") and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out" / "bad.html")
