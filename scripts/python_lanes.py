#!/usr/bin/env python3
"""The smoke lane on every declared Python other than the one running the suite.

The package declares a range of Pythons (pyproject's `requires-python` and its
`Programming Language :: Python :: 3.X` classifiers, which must agree); the full suite runs on
the main interpreter, and this script proves every other declared version works where users
meet the tool: for each one present on this machine (`python3.X` on PATH, or pyenv's
versions), a fresh virtual environment with the project installed from its own files (not
editable), then

1. the command line: `residency --help` and every subcommand's `--help`;
2. one built-in `pair` (emulated NPU, 1 rank, 2 steps), verified against its seal and
   tabulated (`verify`, `tables --format md`);
3. every notebook's parameters cell and the cell that checks them, run in that Python.

The lanes install at once (downloads and unpacking wait on the network and the disk) and run
their checks one after another (a built-in pair takes the machine's cores); each lane's lines
print together when its checks end.

A declared version that is not on the machine is named on standard output ("not tested
here"); `--require-all` makes that a failure. Exit status: 0 when every present lane passed,
1 when one failed, 2 on bad usage or an unreadable pyproject.

Usage: python scripts/python_lanes.py [--only 3.10] [--keep DIR] [--require-all]
Stdlib only: it runs before anything else is known to work.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # as .ci/run and the README: a CPU build on Python 3.11 here, else PyPI's
LANE_TIMEOUT_S = 1800
CLASSIFIER = re.compile(r"Programming Language :: Python :: 3\.(\d+)$")


def declared_minors(pyproject: Path = ROOT / "pyproject.toml") -> list[int]:
    """The 3.X minor versions pyproject declares (classifiers), checked against requires-python."""
    text = pyproject.read_text(encoding="utf-8")
    minors = sorted({int(m.group(1)) for line in text.splitlines()
                     if (m := CLASSIFIER.search(line.strip().strip('",')))})
    spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not minors or spec is None:
        raise SystemExit(f"{pyproject}: no Python classifiers or no requires-python")
    low = re.search(r">=\s*3\.(\d+)", spec.group(1))
    high = re.search(r"<\s*3\.(\d+)", spec.group(1))
    if low is None or high is None:
        raise SystemExit(f"{pyproject}: requires-python {spec.group(1)!r} must be a closed "
                         f"range >=3.A,<3.B (the declared range is the tested range)")
    if minors != list(range(int(low.group(1)), int(high.group(1)))):
        raise SystemExit(f"{pyproject}: requires-python {spec.group(1)!r} and the classifiers "
                         f"(3.{', 3.'.join(map(str, minors))}) disagree")
    return minors


def find_python(minor: int) -> str | None:
    """An interpreter of Python 3.`minor` on this machine (pyenv's newest, else on PATH) that
    runs and says it is 3.`minor` (a pyenv shim of a version not selected does not)."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"3.{minor}.*", "bin",
                                               "python")),
                        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])],
                        reverse=True)
    candidates += [p for p in (shutil.which(f"python3.{minor}"),) if p]
    for candidate in candidates:
        try:
            out = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[1])"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out == str(minor):
            return candidate
    return None


def _notebook_check_script(notebooks: list[Path], source: Path, out: Path) -> str:
    """Python source running each notebook's parameters cell and the cell after it."""
    parts = ["import json, pathlib"]
    for path in notebooks:
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                 if c["cell_type"] == "code"]
        index = next(i for i, c in enumerate(cells)
                     if "parameters" in c.get("metadata", {}).get("tags", []))
        params = "".join(cells[index]["source"])
        check = "".join(cells[index + 1]["source"])
        target = out / path.stem
        parts.append(
            f"ns = {{}}\nexec({params!r}, ns)\n"
            f"ns['output_dir'] = {str(target)!r}\n"
            f"if ns.get('source') not in (None, 'run'): ns['source'] = {str(source)!r}\n"
            f"exec({check!r}, ns)\n"
            f"print('notebook {path.name}: parameters checked')")
    return "\n".join(parts)


class Lane:
    """One declared Python's smoke lane: its folder, its steps and what they printed."""

    def __init__(self, minor: int, python: str, keep: Path | None) -> None:
        self.minor, self.python, self.keep = minor, python, keep
        self.work = (Path(keep) / f"py3{minor}" if keep
                     else Path(tempfile.mkdtemp(prefix=f"lane3{minor}-")))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cwd = self.work / "cwd"  # outside the checkout: the installed package is what runs
        self.cwd.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.lines: list[str] = [f"== python 3.{minor} ({python}) in {self.work}"]
        self.ok = True
        self.started = time.monotonic()

    def install_steps(self) -> list[tuple[str, list[str]]]:
        """A fresh venv with torch and the project from its own files (not editable)."""
        venv = self.work / "venv"
        py = venv / "bin" / "python"
        return [
            ("venv", [self.python, "-m", "venv", str(venv)]),
            ("install torch", [str(py), "-m", "pip", "install", "-q", TORCH]),
            ("install residency", [str(py), "-m", "pip", "install", "-q",
                                   f"{ROOT}[notebooks]"]),
        ]

    def check_steps(self) -> list[tuple[str, list[str]]]:
        """The command line, one built-in pair verified and tabulated, the notebooks' cells."""
        py = self.work / "venv" / "bin" / "python"
        cli = self.work / "venv" / "bin" / "residency"
        run_dir = self.work / "pair"
        shutil.rmtree(run_dir, ignore_errors=True)
        notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
        return [
            ("cli help", [str(cli), "--help"]),
            ("subcommand help", [str(py), "-c", (
                "import subprocess, sys\n"
                "from residency.cli.main import COMMANDS\n"
                "names = list(COMMANDS)\n"
                f"for n in names: subprocess.run([{str(cli)!r}, n, '--help'], check=True, "
                "stdout=subprocess.DEVNULL)\n"
                "print(len(names), 'subcommands:', ' '.join(names))")]),
            ("built-in pair", [str(cli), "pair", "--design", "profiled-pair", "--device",
                               "emulated-npu", "--ranks", "1", "--steps", "2", "--out",
                               str(run_dir)]),
            ("verify", [str(cli), "verify", str(run_dir)]),
            ("tables", [str(cli), "tables", str(run_dir), "--format", "md"]),
            ("notebook parameters", [str(py), "-c", _notebook_check_script(
                notebooks, run_dir, self.work / "notebooks")]),
        ]

    def run(self, steps: list[tuple[str, list[str]]]) -> bool:
        """Run steps in order until one fails; True when all passed (or none ran)."""
        for name, argv in steps:
            if not self.ok:
                return False
            t0 = time.monotonic()
            try:
                proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True,
                                      text=True, timeout=LANE_TIMEOUT_S)
                failed = proc.returncode != 0
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            except subprocess.TimeoutExpired:
                failed, tail = True, [f"timed out after {LANE_TIMEOUT_S} s"]
            self.lines.append(f"   {'FAILED' if failed else 'ok    '} {name} "
                              f"({time.monotonic() - t0:.0f} s)")
            if failed:
                self.lines += ["      " + line for line in tail]
                self.ok = False
        return self.ok

    def finish(self) -> bool:
        """Print the lane's lines and its result, remove its folder unless kept."""
        self.lines.append(f"== python 3.{self.minor}: {'passed' if self.ok else 'FAILED'} in "
                          f"{time.monotonic() - self.started:.0f} s")
        print("\n".join(self.lines), flush=True)
        if self.keep is None:
            shutil.rmtree(self.work, ignore_errors=True)
        return self.ok


def run_lanes(found: dict[int, str], keep: Path | None) -> dict[int, bool]:
    """Install every lane at once (downloads and unpacking wait on the network and the disk),
    then run their checks one lane at a time (a built-in pair takes the machine's cores)."""
    lanes = [Lane(minor, python, keep) for minor, python in found.items()]
    if not lanes:
        return {}
    print(f"installing {len(lanes)} lane(s) at once: "
          + ", ".join(f"3.{lane.minor}" for lane in lanes), flush=True)
    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        list(pool.map(lambda lane: lane.run(lane.install_steps()), lanes))
    results = {}
    for lane in lanes:
        lane.run(lane.check_steps())
        results[lane.minor] = lane.finish()
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the lanes; the exit status says whether every present one passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="3.X",
                        help="run only these declared versions (repeatable)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="build the lanes' environments in DIR and keep them")
    parser.add_argument("--require-all", action="store_true",
                        help="fail when a declared version is not on this machine")
    args = parser.parse_args(argv)
    minors = declared_minors()
    current = sys.version_info.minor
    wanted = minors
    if args.only:
        bad = [v for v in args.only if not re.fullmatch(r"3\.\d+", v)
               or int(v.split(".")[1]) not in minors]
        if bad:
            parser.error(f"--only {bad[0]!r}: not a declared version "
                         f"(3.{', 3.'.join(map(str, minors))})")
        wanted = [int(v.split(".")[1]) for v in args.only]
    print(f"declared: Python 3.{', 3.'.join(map(str, minors))}; the suite ran on 3.{current}",
          flush=True)
    results: dict[int, str] = {}
    found: dict[int, str] = {}
    for minor in wanted:
        if minor == current and not args.only:
            continue
        python = find_python(minor)
        if python is None:
            results[minor] = "not on this machine: not tested here"
            print(f"== python 3.{minor}: {results[minor]}", flush=True)
        else:
            found[minor] = python
    for minor, ok in run_lanes(found, args.keep).items():
        results[minor] = "passed" if ok else "FAILED"
    print("lanes: " + "; ".join(f"3.{m} {r}" for m, r in results.items()), flush=True)
    if any(r == "FAILED" for r in results.values()):
        return 1
    if args.require_all and any(r.startswith("not") for r in results.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
