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
    modules: tuple[str, ...]  # subpackages or modules, relative to residency
    imports_from: tuple[str, ...]  # other layers this one may import
    never: tuple[str, ...]  # top-level packages it never imports
    not_loaded: tuple[str, ...]


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def layers(contracts: Path = CONTRACTS) -> list[Layer]:
    """The rows of the table under `## Layers` in docs/contracts.md, bottom layer first."""
    text = contracts.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.append(Layer(cells[0], _names(cells[1]), _names(cells[2]), _names(cells[3]),
                         _names(cells[4])))
    return out


LAYERS = layers()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, table: list[Layer]) -> str | None:
    """The layer of a dotted module name (`residency.traces.load` -> the row listing
    `traces`), or None when no row lists it."""
    rest = module.split(".")[1:] or ["__init__"]
    for layer in table:
        if rest[0] in layer.modules:
            return layer.name
    return None


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source (lazy imports
    included, `if TYPE_CHECKING:` blocks left out)."""
    root = package.parent
    modules = {module_name(p, root): p for p in package.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = {id(n) for block in ast.walk(tree) if _type_checking(block)
                  for n in ast.walk(block)}
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                deps |= {r for a in node.names if (r := resolve(a.name))}
            elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                  and node.module.split(".")[0] == package.name):
                deps |= {r for a in node.names if (r := resolve(f"{node.module}.{a.name}"))}
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, set[str]], table: list[Layer]) -> list[str]:
    """Every import of a layer the importing module's row does not name."""
    allowed = {la.name: {la.name, *la.imports_from} for la in table}
    bad = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module, table)
        for dep in sorted(deps):
            theirs = layer_of(dep, table)
            if mine is not None and theirs is not None and theirs not in allowed[mine]:
                bad.append(f"{module} ({mine}) imports {dep} ({theirs})")
    return bad


GRAPH = import_graph(PACKAGE)


def test_the_contract_table_covers_every_module() -> None:
    assert len(LAYERS) >= 10, "docs/contracts.md lost its layer table"
    unplaced = sorted(m for m in GRAPH if layer_of(m, LAYERS) is None)
    assert unplaced == [], f"modules no row of docs/contracts.md places: {unplaced}"
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} - {
        "data"}
    rows = {la.name for la in LAYERS}
    assert subpackages - {"adapters"} <= rows, "one row per subpackage"
    shared = [p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert len(shared) <= 8, f"at most 8 shared modules directly in residency/: {shared}"


def test_each_row_imports_only_rows_below_it() -> None:
    seen: set[str] = set()
    for layer in LAYERS:
        assert set(layer.imports_from) <= seen, (layer.name, set(layer.imports_from) - seen)
        seen.add(layer.name)


def test_no_import_cycle() -> None:
    assert cycles(GRAPH) == []


def test_no_import_from_a_higher_layer() -> None:
    assert upward_imports(GRAPH, LAYERS) == []


def test_the_graph_checks_can_fail(tmp_path: Path) -> None:
    """A cycle through a lazy import and an upward import are both found (the flat tree of
    before issue 24 had `idle` -> `cli` -> `idle`); a TYPE_CHECKING import is not one."""
    pkg = tmp_path / "residency"
    (pkg / "traces").mkdir(parents=True)
    (pkg / "cli").mkdir()
    for init in (pkg, pkg / "traces", pkg / "cli"):
        (init / "__init__.py").write_text("")
    (pkg / "traces" / "idle.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import residency.devices\n"
        "def main():\n    from residency.cli.main import run\n")
    (pkg / "cli" / "main.py").write_text("from residency.traces import idle\n")
    (pkg / "devices.py").write_text("def run(): pass\n")
    graph = import_graph(pkg)
    assert graph["residency.traces.idle"] == {"residency.cli.main"}
    assert cycles(graph) == [["residency.cli.main", "residency.traces.idle"]]
    assert upward_imports(graph, LAYERS) == [
        "residency.traces.idle (traces) imports residency.cli.main (cli)"]


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
    names = sorted({m for module in layer.modules for path in _sources(module)
                    if (m := module_name(path, ROOT)) != "residency.__main__"})
    code = (f"import sys, json, importlib\nfor m in {names!r}: importlib.import_module(m)\n"
            f"print(json.dumps([b for b in {list(layer.not_loaded)!r} if b in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], f"{layer.name}: {names}"


def test_the_trace_path_runs_without_pandas(tmp_path: Path) -> None:
    """`residency idle` on traces (parse, then from the user's trace cache) loads neither torch,
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
                own = f"{node.module}.{a.name}" == this.rpartition(".")[0] + "._" + (
                    this.rpartition(".")[2])  # a module's own compiled half (json, _json)
                if a.name.startswith("_") and not a.name.startswith("__") and not own:
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
    probe.write_text("from residency.evidence import _get\nfrom residency.reports import tables\n"
                     "tables._row\nfrom residency.traces import _kineto_scan\n")
    try:  # (another module's compiled half is as private as any of its names)
        assert len(_private_uses(probe)) == 3
    finally:
        probe.unlink()
