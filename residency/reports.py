"""Reports: executed notebooks rendered to HTML with the code hidden (`residency report`), and
a screenshot of a rendered report taken with headless Chromium.

Steps: find notebooks -> check each was executed -> export to HTML without inputs (nbconvert's
`HTMLExporter(exclude_input=True)`, what `jupyter nbconvert --to html --no-input` does) ->
write -> optionally screenshot. No torch here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")

__all__ = ["ReportError", "add_cli", "find_chromium", "find_notebooks", "render_html",
           "run_cli", "screenshot"]


class ReportError(RuntimeError):
    """A notebook that cannot be rendered, or a screenshot that could not be taken."""


def find_notebooks(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The `.ipynb` files named by `paths`: files as given, folders searched recursively
    (checkpoints skipped), in sorted order per folder.

    Raises:
        ReportError: a path does not exist or is not a notebook, or a folder holds none.
    """
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            nbs = sorted(f for f in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)
            if not nbs:
                raise ReportError(f"{p}: folder holds no .ipynb notebook")
            found += nbs
        elif p.is_file() and p.suffix == ".ipynb":
            found.append(p)
        elif p.exists():
            raise ReportError(f"{p}: not a .ipynb notebook")
        else:
            raise ReportError(f"{p}: no such file or folder")
    return found


def _executed(nb: object) -> bool:
    cells = getattr(nb, "cells", [])
    return any(c.get("cell_type") == "code" and (c.get("outputs")
                                                  or c.get("execution_count") is not None)
               for c in cells)


def render_html(notebook: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                name: str | None = None) -> Path:
    """Render an executed notebook to `out_dir/<name or stem>.html` with inputs and prompts
    hidden; returns the HTML path.

    Raises:
        ReportError: the notebook cannot be read or was never executed.
    """
    import nbformat
    from nbconvert import HTMLExporter

    src = Path(notebook)
    try:
        nb = nbformat.read(src, as_version=4)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{src}: cannot read notebook ({exc})") from None
    if not _executed(nb):
        raise ReportError(f"{src}: has no outputs: execute it first "
                          f"(papermill {src} OUT.ipynb)")
    from traitlets.config import Config

    # merged streams keep only what a terminal would show last (progress bars redraw with \r)
    config = Config({"CoalesceStreamsPreprocessor": {"enabled": True}})
    exporter = HTMLExporter(config=config, exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    title = nb.metadata.get("title") or src.stem.replace("_", " ")
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out.resolve() / f"{name or src.stem}.html"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, path)
    return path


def find_chromium() -> str | None:
    """Path of a Chromium or Chrome executable (`$CHROMIUM` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def screenshot(html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *,
               width: int = 1280, height: int = 2400, chromium: str | None = None,
               timeout_s: float = 120) -> Path:
    """A PNG of the page `html_path` as headless Chromium shows it in a `width` x `height`
    window (the top of the page when it is longer); returns `png_path`.

    Raises:
        ReportError: no Chromium found, or it failed or wrote no image.
    """
    exe = chromium or find_chromium()
    if exe is None:
        raise ReportError("no Chromium found (install chromium, or set CHROMIUM to its path)")
    html, png = Path(html_path).resolve(), Path(png_path).resolve()
    if not html.is_file():
        raise ReportError(f"{html}: no such file")
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="residency-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
               f"--window-size={width},{height}", html.as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise ReportError(f"Chromium did not finish within {timeout_s:g} s") from None
    if not png.is_file() or png.stat().st_size == 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise ReportError(f"Chromium wrote no screenshot (exit {proc.returncode}): {tail}")
    return png


def _names(notebooks: Sequence[Path]) -> list[str]:
    """Output names: the stem, prefixed with the parent folder's name where stems repeat."""
    stems = [p.stem for p in notebooks]
    return [f"{p.parent.name}-{p.stem}" if stems.count(p.stem) > 1 else p.stem
            for p in notebooks]


# ----------------------------------------------------------------------------- CLI
def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `report`."""
    p = subparsers.add_parser(
        "report", help="render executed notebooks to HTML with the code hidden",
        description="Render each executed notebook (files, or folders searched recursively) "
        "to OUT/<name>.html with inputs hidden, as `jupyter nbconvert --to html --no-input`; "
        "with --screenshot also OUT/<name>.png from headless Chromium.")
    p.add_argument("paths", nargs="+", metavar="NOTEBOOK_OR_DIR")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="folder for the HTML files (default: reports/)")
    p.add_argument("--screenshot", action="store_true",
                   help="also save a PNG of each page (needs Chromium)")


def run_cli(args: argparse.Namespace) -> int:
    """Run `report`: one line per written file; errors on stderr, exit 1 if any failed."""
    try:
        notebooks = find_notebooks(args.paths)
    except ReportError as exc:
        print(f"residency report: error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for nb, name in zip(notebooks, _names(notebooks), strict=True):
        try:
            html = render_html(nb, args.out, name=name)
            print(html)
            if args.screenshot:
                print(screenshot(html, html.with_suffix(".png")))
        except ReportError as exc:
            print(f"residency report: error: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0
