#!/usr/bin/env python3
"""Render every report of every recorded run in `data/runs/` into one folder, and list the
SHA-256 of each file: two listings made before and after a refactor say whether every report
still renders byte-identical (`diff before/SHA256SUMS after/SHA256SUMS`).

What is rendered, with the code of the tree this script lies in (its `residency`, first on
`PYTHONPATH` for every process it starts):

* `cli/`: the standard output (``.out``), standard error (``.err``) and exit status
  (``.rc``) of every reporting command on each run: `tables` (md, csv, json, pr; with
  `--published`; with `--aa` on the A/A run of the same device kind), the cross-device
  `tables` of all runs (md, csv, json, with and without `--published`), `tables --published`
  alone, `whatif` (each format, each policy; the baseline arm too), `verify`, and `idle`
  (text and `--json`, `--no-cache`);
* `notebooks/<notebook>--<run>[--variant]/`: each notebook executed by papermill on each run
  it accepts (`output_dir` = that folder: its tables, figures and results.json), the
  executed notebook's cell outputs (``outputs.json``: the cells' outputs and execution
  counts, without papermill's timestamps and durations, which are the clock's), and
  `html/`: `residency report` of every executed notebook (one HTML each, and index.html).

Everything is made in one fixed folder, `WORK` (`--work`, default
/tmp/residency-render-all-reports, which must not exist: one rendering at a time), with the
runs copied to `WORK/runs/` and relative paths, then moved to OUT: error messages that name a
run's resolved path name the same path whichever tree or OUT made them. Left out of the
listing: the executed notebooks themselves (``*.ipynb``: papermill's start/end times and
durations) and papermill's logs (``.papermill.log``).

Two fields differ from one rendering to the next whatever the code, and the listing hashes
each file with them masked (the files themselves are kept as written):

* ``"written_at"`` in each notebook's ``results.json`` (`residency.notebook.outputs.finish`:
  the clock when the document was written), masked as ``"written_at": "<clock>"``;
* ``id="cell-id=XXXXXXXX"`` in the HTML reports: two cells of each executed notebook get a
  random id when they are made (papermill's injected-parameters cell, and the banner cell
  `residency.notebook.outputs` moves the banner into), masked as ``cell-id=<random>``.

`--relist OUT` writes the listing of an existing OUT again (e.g. one made by an older version
of this script).

Usage: python scripts/render_all_reports.py OUT [--jobs N] [--only SUBSTRING] [--relist]
then: diff OUT_BEFORE/SHA256SUMS OUT_AFTER/SHA256SUMS  (exit 0: byte-identical)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs"
NOTEBOOKS = ROOT / "notebooks"
LISTING = "SHA256SUMS"
EXCLUDED_SUFFIXES = (".ipynb",)
EXCLUDED_NAMES = (".papermill.log", LISTING)


def _design(run: Path) -> str:
    return json.loads((run / "manifest.json").read_text())["design"]


def _device_kind(run: Path) -> str:
    manifest = json.loads((run / "manifest.json").read_text())
    return str(manifest.get("device_kind"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["RESIDENCY_NO_CACHE"] = "1"  # nothing read from or written to the user's trace cache
    env["PYTHONHASHSEED"] = "0"
    env["MPLBACKEND"] = "Agg"
    env["SOURCE_DATE_EPOCH"] = "0"  # matplotlib's PNG/SVG/PDF metadata date
    env["TZ"] = "UTC"
    env["LC_ALL"] = "C.UTF-8"
    return env


def cli_commands(runs: list[str]) -> dict[str, list[str]]:
    """Output name -> `residency` arguments, run paths relative to OUT."""
    cmds: dict[str, list[str]] = {}
    kinds = {r: _device_kind(RUNS / r) for r in runs}
    designs = {r: _design(RUNS / r) for r in runs}
    for fmt in ("md", "csv", "json"):
        cmds[f"tables--published--{fmt}"] = ["tables", "--published", "--format", fmt]
        paths = [f"runs/{r}" for r in runs]
        cmds[f"tables--cross-device--{fmt}"] = ["tables", *paths, "--format", fmt]
        cmds[f"tables--cross-device--published--{fmt}"] = ["tables", *paths, "--published",
                                                          "--format", fmt]
    for r in runs:
        p = f"runs/{r}"
        for fmt in ("md", "csv", "json", "pr"):
            cmds[f"tables--{r}--{fmt}"] = ["tables", p, "--format", fmt]
        cmds[f"tables--{r}--published--md"] = ["tables", p, "--published"]
        aa = [a for a in runs if designs[a] == "aa" and kinds[a] == kinds[r] and a != r]
        for a in aa:
            for fmt in ("md", "pr"):
                cmds[f"tables--{r}--aa-{a}--{fmt}"] = ["tables", p, "--aa", f"runs/{a}",
                                                      "--format", fmt]
        cmds[f"verify--{r}"] = ["verify", p]
        for fmt in ("md", "csv", "json"):
            for policy in ("bounded", "learned-budget"):
                cmds[f"whatif--{r}--{policy}--{fmt}"] = ["whatif", p, "--policy", policy,
                                                         "--format", fmt]
        cmds[f"whatif--{r}--baseline--md"] = ["whatif", p, "--arm", "baseline"]
        for arm in sorted(x.name for x in (RUNS / r / "runs").iterdir()
                          if (x / "trace").is_dir()):
            a = f"{p}/runs/{arm}"
            cmds[f"idle--{r}--{arm}--text"] = ["idle", a, "--no-cache", "--workers", "1"]
            cmds[f"idle--{r}--{arm}--json"] = ["idle", a, "--no-cache", "--workers", "1",
                                               "--json"]
    return cmds


def notebook_jobs(runs: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Output folder name -> (notebook, papermill parameter arguments)."""
    jobs: dict[str, tuple[str, list[str]]] = {}
    designs = {r: _design(RUNS / r) for r in runs}
    kinds = {r: _device_kind(RUNS / r) for r in runs}
    for r in runs:
        src = ["-p", "source", f"runs/{r}"]
        jobs[f"api_reproduction--{r}"] = ("api_reproduction", src)
        if designs[r] == "consecutive":
            jobs[f"consecutive_requests--{r}"] = ("consecutive_requests", src)
        if designs[r] in ("paired-profile", "profiled-pair", "alternating"):
            jobs[f"paired_profile--{r}"] = ("paired_profile", src)
            for a in runs:
                if designs[a] == "aa" and kinds[a] == kinds[r]:
                    jobs[f"paired_profile--{r}--aa-{a}"] = (
                        "paired_profile", [*src, "-p", "aa_source", f"runs/{a}"])
        if designs[r] in ("paired-profile", "profiled-pair"):
            jobs[f"policy_whatif--{r}"] = ("policy_whatif", src)
    paired = [r for r in runs if designs[r] == "paired-profile"]
    if paired:  # the cross-device section: every other run beside the first paired one
        others = [f"runs/{r}" for r in runs if r != paired[0]]
        jobs[f"paired_profile--{paired[0]}--compare-all"] = (
            "paired_profile", ["-p", "source", f"runs/{paired[0]}",
                               "-y", json.dumps({"compare": others})])
    return jobs


def run_cli(out: Path, name: str, args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "residency", *args], cwd=out, env=_env(),
                          capture_output=True, stdin=subprocess.DEVNULL, check=False)
    d = out / "cli"
    (d / f"{name}.out").write_bytes(proc.stdout)
    (d / f"{name}.err").write_bytes(proc.stderr)
    (d / f"{name}.rc").write_text(f"{proc.returncode}\n")


def run_notebook(out: Path, name: str, book: str, params: list[str]) -> None:
    rel = Path("notebooks") / name
    (out / rel).mkdir(parents=True)
    with open(out / rel / ".papermill.log", "w") as log:
        code = subprocess.call(
            [sys.executable, "-m", "papermill", str(NOTEBOOKS / f"{book}.ipynb"),
             str(rel / f"{name}.ipynb"), "-k", "python3", "--start-timeout", "600",
             "-p", "output_dir", str(rel), *params],
            cwd=out, env=_env(), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    (out / rel / "papermill.rc").write_text(f"{code}\n")
    executed = out / rel / f"{name}.ipynb"
    if executed.exists():
        nb = json.loads(executed.read_text(encoding="utf-8"))
        cells = [{"execution_count": c.get("execution_count"), "outputs": c.get("outputs")}
                 for c in nb["cells"] if c["cell_type"] == "code"]
        (out / rel / "outputs.json").write_text(json.dumps(cells, indent=1, sort_keys=True))


_CLOCK = re.compile(rb'"written_at": "[^"]*"')
_CELL_ID = re.compile(rb'id="cell-id=[^"]*"')


def masked(path: Path) -> bytes:
    """The file's bytes with the fields that differ from one rendering to the next masked
    (the module docstring)."""
    data = path.read_bytes()
    if path.name == "results.json":
        return _CLOCK.sub(b'"written_at": "<clock>"', data)
    if path.suffix == ".html":
        return _CELL_ID.sub(b'id="cell-id=<random>"', data)
    return data


def listing(out: Path) -> list[str]:
    lines = []
    for p in sorted(out.rglob("*")):
        if (p.is_dir() or p.suffix in EXCLUDED_SUFFIXES or p.name in EXCLUDED_NAMES
                or p.name.startswith(LISTING)):
            continue
        rel = p.relative_to(out)
        if rel.parts[0] == "runs":
            continue
        lines.append(f"{hashlib.sha256(masked(p)).hexdigest()}  {rel.as_posix()}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a new or empty folder")
    ap.add_argument("--jobs", type=int, default=2, help="processes at once (default 2)")
    ap.add_argument("--only", default="", help="only outputs whose name contains this")
    ap.add_argument("--no-notebooks", action="store_true")
    ap.add_argument("--relist", action="store_true",
                    help="only write the listing of the existing folder OUT again")
    ap.add_argument("--work", type=Path, default=Path("/tmp/residency-render-all-reports"),
                    help="the fixed folder everything is made in (must not exist; made 0700)")
    args = ap.parse_args()
    if args.relist:
        lines = listing(args.out)
        (args.out / LISTING).write_text("\n".join(lines) + "\n")
        print(f"{len(lines)} files listed in {args.out / LISTING}")
        return 0
    final = args.out.resolve()
    if final.exists() and any(final.iterdir()):
        ap.error(f"{final} is not empty")
    out = args.work
    try:
        out.mkdir(mode=0o700)  # (this user's only; an entry planted at the fixed name: refused)
    except FileExistsError:
        ap.error(f"{out} exists: another rendering running, or one that was stopped (remove it)")
    runs = sorted(p.name for p in RUNS.iterdir() if (p / "manifest.json").is_file())
    shutil.copytree(RUNS, out / "runs", symlinks=True)
    (out / "cli").mkdir()
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_cli, out, name, cmd)
                       for name, cmd in cli_commands(runs).items() if args.only in name]
            if not args.no_notebooks:
                futures += [pool.submit(run_notebook, out, name, book, params)
                            for name, (book, params) in notebook_jobs(runs).items()
                            if args.only in name]
            for f in futures:
                f.result()
        if not args.no_notebooks:
            # `residency report` of every executed notebook: one HTML each and index.html
            run_cli(out, "report", ["report", "notebooks", "--out", "html"])
    finally:
        shutil.rmtree(out / "runs")
    lines = listing(out)
    (out / LISTING).write_text("\n".join(lines) + "\n")
    final.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        shutil.move(str(p), str(final / p.name))
    out.rmdir()
    out = final
    failed = [p.parent.name for p in out.glob("notebooks/*/papermill.rc")
              if p.read_text().strip() != "0"]
    print(f"{len(lines)} files listed in {out / LISTING}"
          + (f"; papermill failed for: {', '.join(sorted(failed))}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
