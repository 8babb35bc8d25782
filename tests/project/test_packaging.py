"""Packaging follows the tree: a wheel built from it holds every module and its package data,
and installed outside the checkout (not editable) it starts the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "residency"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a clean copy of the tree (what git would hand a builder: no
    leftover build/ folder can fill it in)."""
    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("tree")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True,
                   timeout=600)
    (built,) = out.glob("residency-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")}
    assert modules - names == set(), "modules missing from the wheel"
    data = {p.relative_to(ROOT).as_posix() for p in (PACKAGE / "data").iterdir()
            if p.suffix in (".json", ".md")} | {"residency/py.typed"}
    assert data - names == set(), "package data missing from the wheel"


@pytest.mark.slow
def test_the_installed_wheel_starts_the_command_line(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(target)}  # before the editable checkout's finder
    subpackages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    code = ("import importlib\nfor name in ['residency', " + ", ".join(
        f"'residency.{n}'" for n in subpackages) + "]:\n"
        "    print(importlib.import_module(name).__file__)")
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=120)
    assert where.returncode == 0, where.stderr
    outside = [f for f in where.stdout.split() if not Path(f).is_relative_to(target)]
    assert outside == [], "imported from outside the installed wheel"
    for cmd in ([str(target / "bin" / "residency"), "--help"],
                [sys.executable, "-m", "residency", "--help"],
                [sys.executable, "-m", "residency", "probe", "--help"]):
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env,
                             timeout=120)
        assert (out.returncode, out.stderr) == (0, ""), cmd
        assert out.stdout.startswith("usage: residency"), out.stdout[:200]


def test_the_declared_pythons_are_the_tested_lanes() -> None:
    """requires-python is a closed range and the classifiers list exactly its versions: the
    lanes script (`scripts/python_lanes.py`, run by the README's test command) smoke-tests
    each one the suite does not run on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("python_lanes",
                                                  ROOT / "scripts" / "python_lanes.py")
    assert spec is not None and spec.loader is not None
    lanes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lanes)
    minors = lanes.declared_minors()
    assert minors[0] == 10 and sys.version_info.minor in minors
    assert sys.version_info[:2] >= (3, minors[0])
