"""The one architecture test, driven by the layer table of docs/contracts.md: forbidden
imports per layer (static, over each module's whole source), modules that must not be loaded
when a layer is imported (a fresh interpreter), and no use of another module's `_private`
names."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "residency"
CONTRACTS = ROOT / "docs" / "contracts.md"


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # relative to residency
    never: tuple[str, ...]
    not_loaded: tuple[str, ...]


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def layers() -> list[Layer]:
    """The rows of the table under `## Layers` in docs/contracts.md."""
    text = CONTRACTS.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.append(Layer(cells[0], _names(cells[1]), _names(cells[2]), _names(cells[3])))
    return out


LAYERS = layers()


def test_the_contract_table_covers_every_module() -> None:
    assert len(LAYERS) >= 7, "docs/contracts.md lost its layer table"
    listed = {m for layer in LAYERS for m in layer.modules}
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} - {
        "adapters", "data"}
    assert present <= listed, f"modules missing from docs/contracts.md: {present - listed}"


def _sources(module: str) -> list[Path]:
    path = PACKAGE / module
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    return [PACKAGE / f"{module}.py"]


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every imported module name in `path` (anywhere: module level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return out


def _forbidden(name: str, never: tuple[str, ...]) -> bool:
    return any(name == n or name.startswith(n + ".") for n in never)


@pytest.mark.parametrize("layer", [la for la in LAYERS if la.never], ids=lambda la: la.name)
def test_layer_never_imports_what_the_contract_forbids(layer: Layer) -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for module in layer.modules for path in _sources(module)
           for name, line in _imports(path) if _forbidden(name, layer.never)]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("layer", [la for la in LAYERS if la.not_loaded],
                         ids=lambda la: la.name)
def test_layer_loads_nothing_forbidden_at_import(layer: Layer) -> None:
    modules = ", ".join(f"residency.{m}" for m in layer.modules)
    code = (f"import sys, json, {modules}\n"
            f"print(json.dumps([b for b in {list(layer.not_loaded)!r} if b in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], f"{layer.name}: {modules}"


def test_the_trace_path_runs_without_pandas(tmp_path: Path) -> None:
    """`residency idle` on traces (parse, then from the Parquet cache) loads neither torch,
    pandas nor the workload: the fast start the contract promises."""
    fixture = ROOT / "tests" / "data" / "traces" / "kineto_basic"
    d = Path(shutil.copytree(fixture, tmp_path / "kineto_basic"))
    subprocess.run([sys.executable, "-m", "residency", "idle", str(d)], check=True,
                   capture_output=True, cwd=ROOT, timeout=120)  # writes the cache
    code = ("import sys\nfrom residency.cli.main import main\n"
            f"main(['idle', {str(d)!r}, '--no-cache', '--json'])\n"
            f"main(['idle', {str(d)!r}, '--json', '--marker', 'release'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', "
            "'scipy') or m.startswith(('residency.workload.pipeline', 'residency.emulated'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    this = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    aliases: dict[str, str] = {}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("residency"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("residency"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__"):
                    bad.append(f"line {node.lineno}: from {node.module} import {a.name}")
                elif (PACKAGE.parent / (full.replace(".", "/") + ".py")).is_file() or (
                        PACKAGE.parent / full.replace(".", "/")).is_dir():
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and aliases[node.value.id] != this
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_nothing_uses_another_modules_private_names() -> None:
    bad = {str(p.relative_to(ROOT)): _private_uses(p) for p in sorted(PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_private_name_check_can_fail(tmp_path: Path) -> None:
    probe = PACKAGE / "_architecture_probe_tmp.py"
    probe.write_text("from residency.evidence import _get\nfrom residency import tables\n"
                     "tables._row\n")
    try:
        assert len(_private_uses(probe)) == 2
    finally:
        probe.unlink()
