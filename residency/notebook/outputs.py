"""Where a notebook's results go: the output folder, `results.json`, tables, figures, and the
Markdown a notebook prints about its run."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from residency import devices, humanize
from residency.humanize import md_code, md_text
from residency.jsonio import plain, write_json_atomic
from residency.notebook.params import ParameterError, check_output_dir
from residency.rundir.run import Run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESULTS_FILE = "results.json"

__all__ = ["RESULTS_FILE", "describe_run", "finish",
           "prepare_output_dir", "save_figure", "statistical_note",
           "write_results", "write_tables"]


def _announce(line: str, *, notebook: bool = True) -> None:
    """Print `line` in the notebook (unless `notebook` is false: then, inside a Jupyter
    kernel, only) on the terminal that started it (papermill's stderr), which sees nothing
    of the notebook's own output. Outside a kernel the line is printed."""
    kernel = type(sys.stderr).__module__.startswith("ipykernel")
    if notebook or not kernel:
        print(line, flush=True)
    if kernel:
        from residency.notebook.progress import to_terminal

        to_terminal(line)


def prepare_output_dir(output_dir: str | os.PathLike[str] | None, name: str) -> Path:
    """The folder for this notebook's results, tables and figures, created and announced.

    `None` gives a new `reports/<name>/<UTC timestamp>/` under the current working directory
    (a suffix `-1`, `-2`, ... when that name is taken).

    Raises:
        ParameterError: `output_dir` is a file or cannot be created.
    """
    check_output_dir(output_dir)
    if output_dir is not None:
        path = Path(output_dir).resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ParameterError(f"The value for `output_dir` must be a folder that can be "
                                 f"created, but {exc}.") from None
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = Path.cwd() / "reports" / name
        for i in range(1000):
            path = base / (stamp if i == 0 else f"{stamp}-{i}")
            try:
                path.mkdir(parents=True)
                break
            except FileExistsError:
                continue
        else:
            raise ParameterError(f"The output folder {base} has no free name for {stamp}.")
    # on the terminal only: in the report nothing stands between the title and the verdict
    # (the appendix's last line says where everything went)
    _announce(f"{name}: results.json, tables and figures go to {path}", notebook=False)
    return path


def write_results(output_dir: str | os.PathLike[str], results: Mapping[str, Any]) -> Path:
    """Write `results.json` into `output_dir` atomically; returns its path. NaN and
    infinities become null; numpy values and paths become plain JSON."""
    return write_json_atomic(Path(output_dir) / RESULTS_FILE, plain(results, finite=True),
                             allow_nan=False)


def write_tables(output_dir: str | os.PathLike[str], tables: Mapping[str, pd.DataFrame]
                 ) -> list[Path]:
    """Write each table as `<name>.md` (for people: readable headers, 4 significant digits)
    and `<name>.csv` (full precision) into `output_dir`; returns the paths. Evidence tables
    (with a title in `attrs`) use `residency.reports.tables` formatting."""
    from residency.reports import tables as tb

    paths = []
    for name, table in tables.items():
        if any(n is not None for n in table.index.names):
            table = table.reset_index()
        md = Path(output_dir) / f"{name}.md"
        csv = Path(output_dir) / f"{name}.csv"
        if "title" in table.attrs:  # for people: 4 significant digits; the CSV keeps all
            md.write_text(tb.to_markdown(table), encoding="utf-8")
            csv.write_text(tb.to_csv(table), encoding="utf-8")
        else:
            md.write_text(humanize.markdown_table(table), encoding="utf-8")
            humanize.write_csv(table, csv)
        paths += [md, csv]
    return paths


def save_figure(fig: Figure, output_dir: str | os.PathLike[str], name: str) -> Path:
    """Save `fig` as `<name>.png` (120 dpi) into `output_dir`; returns the path."""
    path = Path(output_dir) / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def describe_run(run: Run, *, assignment: bool = True) -> str:
    """A Markdown paragraph: which run is analysed, on what device kind, with which
    parameters and runs; `assignment=False` leaves out how decisions were assigned to
    requests (`residency.rundir.assignment`; for a report that says it elsewhere: no sentence
    twice)."""
    m = run.manifest
    params = ", ".join(f"{k}={v}" for k, v in (m.get("params") or {}).items()
                       if v is not None and k != "emulated_npu")
    model = (m.get("params") or {}).get("emulated_npu")
    if isinstance(model, Mapping):
        from residency.devicemodel import DeviceModel
        from residency.humanize import bytes_text

        fields = {k: v for k, v in model.items() if k != "capacity_bytes"}
        try:
            params += f"; emulated device model: {DeviceModel.from_params(fields).describe()}"
        except (TypeError, ValueError):
            params += f"; emulated device model: {fields}"
        if model.get("capacity_bytes") is not None:
            params += f", capacity {bytes_text(model['capacity_bytes'])}"
    order = ", ".join(f"{md_text(r.name)}{' (profiled)' if r.profiled else ''}"
                      for r in run.runs)
    text = (f"**Run** {md_code(run.path)}: design {md_code(run.design)}, device kind "
            f"**{md_text(run.device_kind)}** "
            f"({md_text(devices.label(run.device_kind, run.injection))}), "
            f"{md_text(m.get('service', '?'))} service; parameters {md_text(params)}; measured "
            f"runs in order: {order}. Recorded {md_text(m.get('started_at'))} to "
            f"{md_text(m.get('ended_at'))} on host {md_code(m.get('host'))}.")
    text += " " + describe_service(run, assignment=assignment)
    if devices.emulated(run.device_kind):
        text += (" The emulated NPU keeps real host buffers and does its own accounting: its "
                 "durations describe this host, never an NPU.")
    return text


def describe_service(run: Run, *, assignment: bool = True) -> str:
    """Markdown: which service ran (name, service file, command, the versions it reported)
    and, unless `assignment` is False, how its decisions were assigned to requests, said
    once for all runs (warm-ups per kind, decisions truly outside every request counted)."""
    from residency.evidence import service_of

    info = service_of(run.manifest)
    name = info["name"] or info["kind"] or "?"
    where = f" from {md_code(info['file'])}" if info["file"] else ""
    command = " ".join(str(c) for c in info["command"] or []) or "not recorded"
    versions = info["versions"]
    reported = (", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)
                if isinstance(versions, Mapping) and versions else "none reported")
    from residency.rundir.assignment import assign_run, scope_note

    text = (f"**Service** {md_code(name)}{where} ({md_text(info['kind'] or '?')}): command "
            f"{md_code(command)}; versions: {md_text(reported)}.")
    if not assignment:
        return text
    summary = scope_note([assign_run(run, e) for e in run.runs]) if run.runs else "no runs"
    return f"{text} **Attribution of decisions to requests**: {md_text(summary)}"


def statistical_note(text: str, *, what: str | None = None) -> str:
    """`text` as the Markdown line a notebook prints under an attribution (`what`), every
    decimal number at 4 significant digits (`humanize.round_numbers`: the evidence's notes
    name the robust spread's constant, 1.4826, in full; the notebook has always shown it
    at 4 digits)."""
    return humanize.round_numbers(f"**Statistical note{f' ({what})' if what else ''}.** {text}")


def finish(output_dir: str | os.PathLike[str], results: Mapping[str, Any]) -> Path:
    """Write `results.json` (with `files`: what `output_dir` holds besides it, unless
    `results` names its files itself) and announce where everything went; returns the
    results path."""
    out = Path(output_dir)
    files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [f for f in files if f != RESULTS_FILE]
    path = write_results(out, {"files": files, **results, "output_dir": str(out.resolve()),
                               "written_at": datetime.now(timezone.utc).isoformat(
                                   timespec="seconds")})
    tables = len({f.rsplit(".", 1)[0] for f in files if f.endswith((".md", ".csv"))})
    figures = sum(f.endswith(".png") for f in files)
    _announce(f"done: results.json, {tables} table(s) (.md/.csv) and {figures} figure(s) "
              f"(.png) in {out.resolve()}")
    return path


