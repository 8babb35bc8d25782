"""Reports: executed notebooks rendered to HTML with the code hidden (`residency report`), and
a screenshot of a rendered report taken with headless Chromium.

Steps: find notebooks -> check each was executed -> export to HTML without inputs (nbconvert's
`HTMLExporter(exclude_input=True)`, what `jupyter nbconvert --to html --no-input` does) ->
write -> optionally screenshot. No torch here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")

__all__ = ["ReportError", "find_chromium", "find_notebooks", "output_names", "render_html",
           "screenshot"]


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
    from residency.rundir import write_text_atomic

    return write_text_atomic(path, body)


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


def output_names(notebooks: Sequence[Path]) -> list[str]:
    """Output names: the stem, prefixed with the parent folder's name where stems repeat."""
    stems = [p.stem for p in notebooks]
    return [f"{p.parent.name}-{p.stem}" if stems.count(p.stem) > 1 else p.stem
            for p in notebooks]


