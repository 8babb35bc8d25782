"""Reports: executed notebooks rendered to HTML with the code hidden (`residency report`),
full-page screenshots taken with headless Chromium, and an `index.html` of a folder of reports.

Steps: find notebooks -> check each was executed -> move the banner (`residency.reports.banner`) to
the top -> export to HTML without inputs (nbconvert's `HTMLExporter(exclude_input=True)`, what
`jupyter nbconvert --to html --no-input` does), every HTML output and Markdown cleaned
(`residency.reports.sanitize`) -> write -> optionally screenshot the whole page
(Chromium's DevTools protocol over `--remote-debugging-pipe`: lay the page out, measure its
height, capture it; slices of `MAX_PNG_HEIGHT_PX` for taller pages, at most `MAX_PAGE_HEIGHT_PX` of
it) -> index. No torch here.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import glob
import json
import math
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from residency.errors import BadInput, RunFailed
from residency.jsonio import write_bytes_atomic
from residency.reports.banner import BANNER_CLASS

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--blink-settings=scriptEnabled=false", "--disable-extensions")
# A rendered report needs no script, frame, font or image but its own inline ones; run-supplied
# text is escaped at its source, and this policy holds wherever a view forgets (the written
# HTML carries it as a <meta>; the screenshot serves the page with it as a header).
REPORT_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
              "form-action 'none'; base-uri 'none'")
_PAGE_URL = "https://residency-report.invalid/report.html"  # served from memory, never fetched
INDEX = "index.html"
MAX_PNG_HEIGHT_PX = 16384  # taller pages are cut into slices of this height
# A screenshot covers at most this much of a page (4 slices): six times the tallest report of
# the package's notebooks (paired_profile, about 10,600 px); a taller page is a received
# notebook's doing (one output with ``padding-top:99999999px`` made 297 slices, 29 MB, 123 s)
MAX_PAGE_HEIGHT_PX = 4 * MAX_PNG_HEIGHT_PX

__all__ = ["INDEX", "MAX_PAGE_HEIGHT_PX", "MAX_PNG_HEIGHT_PX", "DevToolsSession",
           "NotebookError", "ReportError", "Screenshot",
           "banner_of", "capture", "find_chromium", "find_notebooks", "output_names",
           "png_size", "render_html", "screenshot", "write_index"]


class ReportError(RunFailed):
    """A notebook that cannot be rendered, or a screenshot that could not be taken."""


class NotebookError(BadInput, ReportError):
    """A path that names no notebook, or a notebook that cannot be read or was never
    executed: bad input (exit 2), and a `ReportError` for callers that catch those."""


def find_notebooks(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The `.ipynb` files named by `paths`: files as given, folders searched recursively
    (checkpoints skipped), in sorted order per folder.

    Raises:
        NotebookError: a path does not exist or is not a notebook, or a folder holds none.
    """
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            nbs = sorted(f for f in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)
            if not nbs:
                raise NotebookError(f"{p}: folder holds no .ipynb notebook")
            found += nbs
        elif p.is_file() and p.suffix == ".ipynb":
            found.append(p)
        elif p.exists():
            raise NotebookError(f"{p}: not a .ipynb notebook")
        else:
            raise NotebookError(f"{p}: no such file or folder")
    return found


def _executed(nb: object) -> bool:
    cells = getattr(nb, "cells", [])
    return any(c.get("cell_type") == "code" and (c.get("outputs")
                                                  or c.get("execution_count") is not None)
               for c in cells)


def _read_notebook(src: Path) -> Any:
    """The notebook at `src` as nbformat 4, valid against its schema.

    Raises:
        NotebookError: unreadable, not JSON, or not a valid notebook (one line: the
            schema's message, never its dump).
    """
    import nbformat
    from nbformat.reader import reads
    from nbformat.validator import ValidationError

    try:
        text = src.read_text(encoding="utf-8")
        # nbformat.read would log a failed validation (many lines) and go on
        nb = nbformat.convert(reads(text), 4)
        nbformat.validate(nb)
    except ValidationError as exc:
        why = " ".join(str(exc.message).split())[:300]
        raise NotebookError(f"{src}: not a valid notebook ({why})") from None
    # (JSON other than an object, and malformed fields met by the converters of old formats,
    # are AttributeError or TypeError; JSON nested past the stack is a RecursionError)
    except (OSError, ValueError, AttributeError, TypeError, KeyError, RecursionError) as exc:
        why = " ".join(str(exc).split())[:300]
        raise NotebookError(f"{src}: cannot read notebook ({type(exc).__name__}: {why})"
                            ) from None
    return nb


def render_html(notebook: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                name: str | None = None) -> Path:
    """Render an executed notebook to `out_dir/<name or stem>.html` with inputs and prompts
    hidden; returns the HTML path.

    Raises:
        NotebookError: the notebook cannot be read or was never executed.
    """
    from nbconvert import HTMLExporter

    src = Path(notebook)
    nb = _read_notebook(src)
    if not _executed(nb):
        raise NotebookError(f"{src}: has no outputs: execute it first "
                            f"(papermill {src} OUT.ipynb)")
    heading = _banner_first(nb)
    from traitlets.config import Config

    # merged streams keep only what a terminal would show last (progress bars redraw with \r)
    config = Config({"CoalesceStreamsPreprocessor": {"enabled": True}})
    # every Markdown cell, HTML or Markdown output through `clean_html` (nbconvert's
    # sanitize hook, its filter replaced): a received notebook's HTML draws nothing the views
    # would not, and moves nobody elsewhere
    from jinja2 import DictLoader

    from residency.reports.sanitize import clean_html

    exporter = HTMLExporter(config=config, exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True, sanitize_html=True,
                            filters={"clean_html": clean_html},
                            extra_loaders=[DictLoader({REPORT_TEMPLATE: _TEMPLATE_TEXT})],
                            template_file=REPORT_TEMPLATE)
    title = nb.metadata.get("title") or src.stem.replace("_", " ")
    if heading:  # the device kind in the window title too (issue 25); the template escapes it
        title = f"{title} — {heading}"
        nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = with_csp(body)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out.resolve() / f"{name or src.stem}.html"
    from residency.jsonio import write_text_atomic

    return write_text_atomic(path, body)


REPORT_TEMPLATE = "residency_report.html.j2"
# nbconvert's lab template without a script of its own: it loads require.js, MathJax and
# mermaid from a CDN (and a widget manager when widgets are saved); a report needs none
# (no math, no diagram, no widget) and runs no remote code.
_TEMPLATE_TEXT = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def with_csp(html: str) -> str:
    """`html` with `REPORT_CSP` as the first element of its `<head>` (no script of the page,
    or of a run's text, runs where a reviewer opens it)."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{escape(REPORT_CSP)}">'
    head = html.find("<head>")
    if head < 0:
        return meta + html
    return html[:head + 6] + meta + html[head + 6:]


def _is_banner(output: Any) -> bool:
    from residency.reports.banner import BANNER_METADATA

    return bool((output.get("metadata") or {}).get(BANNER_METADATA))


def _banner_first(nb: Any) -> str | None:
    """Move the first banner output (`residency.reports.banner.display_banner`) into a cell of its
    own at the top, so the page's first visible text is the banner; returns its heading (device
    kind and label, from the banner's one-line text), None without a banner."""
    import nbformat

    for cell in nb.cells:
        outputs = cell.get("outputs") or []
        for i, out in enumerate(outputs):
            if out.get("output_type") in ("display_data", "execute_result") and _is_banner(out):
                del outputs[i]
                top = nbformat.v4.new_code_cell("", outputs=[out])
                top.metadata["tags"] = ["residency-banner"]
                nb.cells.insert(0, top)
                line = str((out.get("data") or {}).get("text/plain") or "")
                return line.split(" · ", 1)[0].strip()[:200] or None
    return None


class _BannerText(HTMLParser):
    """The text of the first banner block of a rendered report: heading and provenance."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.parts: list[list[str]] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "title":
            self._in_title = True
        if self.depth:
            self.depth += tag == "div"
            if tag == "div":
                self.parts.append([])
        elif tag == "div" and BANNER_CLASS in classes and not self.parts:
            self.depth = 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if self.depth and tag == "div":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif self.depth and self.parts and data.strip():
            self.parts[-1].append(data.strip())


def banner_of(html_path: str | os.PathLike[str]) -> tuple[str, list[str]]:
    """(heading, provenance lines) of a rendered report's banner; ("", []) without one."""
    parser = _BannerText()
    parser.feed(Path(html_path).read_text(encoding="utf-8", errors="replace"))
    parts = [" ".join(p) for p in parser.parts]
    if not parts:
        return "", []
    return parts[0], parser.parts[1] if len(parser.parts) > 1 else []


# The index links local pages and screenshots only: no script, frame, form or remote load
INDEX_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"


def _href(rel: str) -> str:
    """A relative POSIX path as an inert link target: percent-encoded (a first segment such as
    ``javascript:x.html`` would otherwise read as a scheme, a ``#`` as a fragment)."""
    from urllib.parse import quote

    return escape(quote(rel))


def write_index(out_dir: str | os.PathLike[str]) -> Path:
    """Write `out_dir/index.html`: one entry per report (`*.html` in `out_dir` and its
    sub-folders, but index files) linking it, with its banner line and provenance, and its
    screenshot when there is one beside it; returns the path.

    Raises:
        ReportError: `out_dir` holds no report.
    """
    root = Path(out_dir).resolve()
    pages = sorted(p for p in root.rglob("*.html") if p.name != INDEX
                   and not p.name.startswith("."))
    if not pages:
        raise ReportError(f"{root}: holds no rendered report (.html) to index")
    rows = []
    for page in pages:
        rel = page.relative_to(root).as_posix()
        heading, prov = banner_of(page)
        shot = page.with_suffix(".png")
        link = (f' · <a href="{_href(shot.relative_to(root).as_posix())}">screenshot</a>'
                if shot.is_file() else "")
        rows.append(
            f'<li><a href="{_href(rel)}"><strong>{escape(page.stem.replace("_", " "))}'
            f"</strong></a>{link}<br>"
            f'<span class="banner">{escape(heading or "no banner: not a residency report")}'
            f"</span>"
            + "".join(f'<br><span class="prov">{escape(line)}</span>' for line in prov)
            + "</li>")
    body = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{escape(INDEX_CSP)}">'
            "<title>residency reports"
            "</title><style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
            "li{margin:0 0 1em 0}.banner{font-weight:bold}.prov{font-size:.85em;color:#374151}"
            f"</style></head><body><h1>Reports in {escape(root.name)}</h1>"
            f"<p>{len(pages)} report(s); each line is the report's banner: device kind first "
            "(emulated NPU runs are never NPU measurements), then the run's provenance.</p>"
            f"<ul>{''.join(rows)}</ul></body></html>\n")
    from residency.jsonio import write_text_atomic

    return write_text_atomic(root / INDEX, body)


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


def _sandbox_flags() -> tuple[str, ...]:
    """Chromium's sandbox stays on unless this process is root, where Chromium refuses to
    start with it (script, frames and every URL but the page are off either way)."""
    return ("--no-sandbox",) if os.geteuid() == 0 else ()


class DevToolsSession:
    """A Chrome DevTools Protocol session over `--remote-debugging-pipe` (Chromium reads
    NUL-terminated JSON commands on fd 3 and answers on fd 4): no websocket, no extra
    dependency."""

    def __init__(self, exe: str, profile: str, *, timeout_s: float) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._buf = b""
        self._next = 0

        def wire() -> None:  # in the child, before exec: the pipes become fds 3 and 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)  # dup2 onto another number: inheritable across exec
            os.dup2(high[1], 4)

        cmd = [exe, *CHROMIUM_FLAGS, *_sandbox_flags(), "--remote-debugging-pipe",
               f"--user-data-dir={profile}", "about:blank"]
        # Chromium's log goes to a file (a pipe nobody reads would fill and stall it); a
        # failure quotes its last line only
        self._log = Path(profile) / "chromium.log"
        try:
            with open(self._log, "wb") as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log,
                                             preexec_fn=wire, pass_fds=(3, 4))
        except OSError as exc:
            for fd in (self._to_chrome, self._from_chrome):
                os.close(fd)
            raise ReportError(f"Chromium {exe} cannot be started: {exc.strerror or exc}"
                              ) from None
        finally:
            with contextlib.suppress(OSError):
                os.close(to_chrome_r)
                os.close(from_chrome_w)

    def _fail(self, why: str) -> ReportError:
        return ReportError(f"Chromium {why}")

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"did not finish within {self._timeout_s:g} s")
            ready, _, _ = select.select([self._from_chrome], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise self._fail(f"closed the DevTools pipe (exit {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result (events before it are dropped, but a
        `Page.loadEventFired` is remembered for `wait_load`)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        except OSError as exc:
            raise self._fail(f"closed the DevTools pipe (exit {self.proc.poll()}: "
                             f"{exc.strerror})") from None
        want = self._next
        while True:
            reply = self._read_message()
            self._on_event(reply)
            if reply.get("id") == want:
                if "error" in reply:
                    raise self._fail(f"refused {method}: {reply['error'].get('message')}")
                return reply.get("result") or {}

    loaded = False
    page: bytes | None = None  # what `_PAGE_URL` serves; every other request fails

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> None:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        with contextlib.suppress(OSError):
            os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")

    def _on_event(self, msg: dict[str, Any]) -> None:
        """Answer what the page asks while a command waits: the page's own URL is served
        from memory with `REPORT_CSP`, every other request (file://, network) fails, and a
        dialog is dismissed at once."""
        method, params, session = msg.get("method"), msg.get("params") or {}, msg.get(
            "sessionId")
        if method == "Page.loadEventFired":
            self.loaded = True
        elif method == "Fetch.requestPaused":
            url = (params.get("request") or {}).get("url")
            if url == _PAGE_URL and self.page is not None:
                self._send("Fetch.fulfillRequest", {
                    "requestId": params["requestId"], "responseCode": 200,
                    "responseHeaders": [
                        {"name": "Content-Type", "value": "text/html; charset=utf-8"},
                        {"name": "Content-Security-Policy", "value": REPORT_CSP}],
                    "body": base64.b64encode(self.page).decode("ascii")}, session)
            else:
                self._send("Fetch.failRequest", {"requestId": params["requestId"],
                                                 "errorReason": "BlockedByClient"}, session)
        elif method == "Page.javascriptDialogOpening":
            self._send("Page.handleJavaScriptDialog", {"accept": False}, session)

    def wait_load(self) -> None:
        """Wait for the page's load event."""
        while not self.loaded:
            self._on_event(self._read_message())

    def close(self) -> None:
        """Ask Chromium to quit; kill it if it does not."""
        with contextlib.suppress(OSError, ReportError):
            self._next += 1
            os.write(self._to_chrome, json.dumps({"id": self._next,
                                                   "method": "Browser.close"}).encode() + b"\0")
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            with open(self._log, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
                lines = log.read().decode(errors="replace").strip().splitlines()
            from residency.records.files import printable

            self.stderr_tail = printable(lines[-1].strip())[:300] if lines else ""

    stderr_tail = ""  # the last line of Chromium's log, after `close`


@dataclass(frozen=True)
class Screenshot:
    """What `capture` wrote: the PNG files top to bottom (one unless the page is taller than
    `MAX_PNG_HEIGHT_PX`), the page's size in CSS pixels and the images' heights (together
    less than the page's where it is taller than `MAX_PAGE_HEIGHT_PX`: `truncated`)."""

    paths: tuple[Path, ...]
    page_width_px: int
    page_height_px: int
    heights_px: tuple[int, ...]

    @property
    def truncated(self) -> bool:
        """The page is taller than what the images show (`MAX_PAGE_HEIGHT_PX`)."""
        return self.page_height_px > sum(self.heights_px)


def _page_size(cdp: DevToolsSession, session: str) -> tuple[int, int]:
    """The laid-out page's (width, height) in CSS pixels, from the browser's layout (no
    script runs in the page)."""
    size = cdp.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
    return int(math.ceil(size["width"])), int(math.ceil(size["height"]))


def png_size(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header.

    Raises:
        ReportError: the file is not a PNG.
    """
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ReportError(f"{path}: not a PNG image")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def capture(html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *,
            width: int = 1280, chromium: str | None = None, timeout_s: float = 120,
            max_height_px: int | None = None) -> Screenshot:
    """Full-page PNG of `html_path` as headless Chromium lays it out `width` CSS pixels
    wide: the whole page height (its top `MAX_PAGE_HEIGHT_PX` where it is taller:
    `Screenshot.truncated`), in one image, or for a page taller than `max_height_px`
    (default `MAX_PNG_HEIGHT_PX`) one image per page-height slice: `png_path`, then
    `<stem>-2.png`, `<stem>-3.png`, ... Older slices of that name are removed, and so are
    this call's own where it fails.

    Raises:
        ReportError: no Chromium found, or it failed, timed out or wrote no image (one line).
    """
    exe = chromium or find_chromium()
    if exe is None:
        raise ReportError("no Chromium found (install chromium, or set CHROMIUM to its path)")
    html, png = Path(html_path).resolve(), Path(png_path).resolve()
    if not html.is_file():
        raise ReportError(f"{html}: no such file")
    limit = max_height_px or MAX_PNG_HEIGHT_PX
    png.parent.mkdir(parents=True, exist_ok=True)
    for old in [png, *png.parent.glob(f"{glob.escape(png.stem)}-[0-9]*.png")]:
        old.unlink(missing_ok=True)
    paths: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="residency-chromium-") as profile:
        cdp = DevToolsSession(exe, profile, timeout_s=timeout_s)
        cdp.page = html.read_bytes()
        try:
            target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.call("Target.attachToTarget", {"targetId": target,
                                                         "flatten": True})["sessionId"]
            cdp.call("Page.enable", session=session)
            cdp.call("Emulation.setScriptExecutionDisabled", {"value": True}, session=session)
            cdp.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session=session)
            metrics = {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False}
            cdp.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
            cdp.loaded = False
            cdp.call("Page.navigate", {"url": _PAGE_URL}, session=session)
            cdp.wait_load()
            _, height = _page_size(cdp, session)
            view = min(height, limit)
            cdp.call("Emulation.setDeviceMetricsOverride", {**metrics, "height": view},
                     session=session)
            page_w, height = _page_size(cdp, session)  # again: a taller view may reflow
            shown = min(height, MAX_PAGE_HEIGHT_PX)
            heights = []
            for i, top in enumerate(range(0, max(shown, 1), limit)):
                h = min(limit, shown - top) if shown else view
                clip = {"x": 0, "y": top, "width": width, "height": max(h, 1), "scale": 1}
                shot = cdp.call("Page.captureScreenshot",
                                {"format": "png", "clip": clip, "captureBeyondViewport": True,
                                 "fromSurface": True}, session=session)
                out = png if i == 0 else png.with_name(f"{png.stem}-{i + 1}.png")
                write_bytes_atomic(out, base64.b64decode(shot["data"]), fsync=False)
                paths.append(out)
                heights.append(png_size(out)[1])
        except BaseException as exc:  # (Ctrl-C too): no partial screenshot stays behind
            cdp.close()
            for written in paths:
                written.unlink(missing_ok=True)
            if not isinstance(exc, ReportError):
                raise
            tail = f" (Chromium's last log line: {cdp.stderr_tail})" if cdp.stderr_tail else ""
            raise ReportError(f"{exc}{tail}") from None
        cdp.close()
    return Screenshot(tuple(paths), page_w, height, tuple(heights))


def screenshot(html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *,
               width: int = 1280, chromium: str | None = None,
               timeout_s: float = 120) -> Path:
    """A full-page PNG of `html_path` (`capture`); returns the first image's path."""
    return capture(html_path, png_path, width=width, chromium=chromium,
                   timeout_s=timeout_s).paths[0]


def output_names(notebooks: Sequence[Path]) -> list[str]:
    """Output names, all different: the stem, prefixed with the parent folder's name where
    stems repeat, numbered where names still repeat (``x-y.ipynb`` beside ``x/y.ipynb``)."""
    stems = [p.stem for p in notebooks]
    taken: set[str] = set()
    out = []
    for p in notebooks:
        name = f"{p.parent.name}-{p.stem}" if stems.count(p.stem) > 1 else p.stem
        unique, k = name, 1
        while unique in taken:
            k += 1
            unique = f"{name}-{k}"
        taken.add(unique)
        out.append(unique)
    return out
