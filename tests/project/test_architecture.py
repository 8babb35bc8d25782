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

from tests.helpers import ROOT

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


# test modules that still reach a private name of the package, each with why (every other test
# goes through public names: a test that needs a seam gets a public one, e.g.
# `ascend_db.read_db(reading=...)`)
TEST_PRIVATE_USES_ALLOWED: dict[str, str] = {}


def test_tests_use_no_private_names_but_the_listed() -> None:
    bad = {str(p.relative_to(ROOT)): _private_uses(p)
           for p in sorted((ROOT / "tests").rglob("*.py"))}
    assert {k: v for k, v in bad.items() if v and k not in TEST_PRIVATE_USES_ALLOWED} == {}
    assert sorted(k for k in TEST_PRIVATE_USES_ALLOWED if not bad.get(k)) == [], \
        "listed but no longer reaching a private name: remove it from the list"


def test_the_private_name_check_can_fail(tmp_path: Path) -> None:
    probe = PACKAGE / "_architecture_probe_tmp.py"
    probe.write_text("from residency.evidence import _get\nfrom residency.reports import tables\n"
                     "tables._row\nfrom residency.traces import _kineto_scan\n")
    try:  # (another module's compiled half is as private as any of its names)
        assert len(_private_uses(probe)) == 3
    finally:
        probe.unlink()


# -------------------------------------------------------------------------- one owner per concept
ARM_OWNER = "residency/policy/cache.py"
ARM_NAMES = frozenset({"baseline", "candidate", "always-release"})
ARM_LITERALS_ALLOWED = {  # module: why it spells an arm itself
    "residency/devices.py": "shared layer, below policy: cannot import the arm constants",
}


def _prose_ids(tree: ast.AST) -> set[int]:
    """ids of the string constants that are prose: docstrings and the text parts of
    f-strings (an arm named inside a sentence is a word, not an identifier)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            ids.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            ids.update(id(v) for v in node.values if isinstance(v, ast.Constant))
    return ids


def arm_literals(path: Path) -> list[str]:
    """Every string constant of `path` that is a whole arm name, prose aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _prose_ids(tree)
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in ARM_NAMES and id(n) not in prose]


def test_arm_names_are_spelled_only_by_their_owner() -> None:
    """`residency.policy.cache` owns the arm names (`CANDIDATE`, `BASELINE`, `ALWAYS_RELEASE`,
    `ARMS`, `PAIRED_ARMS`); any other module uses its constants."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != ARM_OWNER and rel not in ARM_LITERALS_ALLOWED:
            found[rel] = arm_literals(path)
    assert {k: v for k, v in found.items() if v} == {}


def test_the_arm_literal_check_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('"""The baseline arm."""\nARM = "baseline"\nx = {"candidate": 1}\n'
                     'y = f"the candidate {ARM}"\nz = "always-release arm"\n')
    assert arm_literals(probe) == ["line 2: 'baseline'", "line 3: 'candidate'"]


# The run-record formats (`residency.records`): each module owns its file's names, reader and
# writer. A module that locates decisions files (`decisions_file`, `DECISIONS_GLOB`, a name
# starting `decisions-rank`) must be listed here with what it does; for every format, only its
# owner parses (`json.load(s)`, `msgspec...decode`, `read_json`) or writes (`json.dump(s)`,
# `write_json_atomic`) what a function located by the format's names, in the package and in
# the tests alike.
@dataclass(frozen=True)
class Format:
    owner: str
    names: frozenset[str]  # the owner's names that locate the file
    prefix: str  # a string constant starting so names the file itself


FORMATS = {
    "decisions": Format("residency/records/decisions.py",
                        frozenset({"DECISIONS_GLOB", "decisions_file"}), "decisions-rank"),
    "client": Format("residency/records/client.py", frozenset({"CLIENT"}), "client.json"),
    "manifest": Format("residency/records/manifest.py", frozenset({"MANIFEST"}),
                       "manifest.json"),
}
DECISIONS_USERS = {
    "residency/records/decisions.py": "the owner: names, writes and reads the records",
    "residency/rundir/assignment.py": "notes a rank whose file exists but holds no decision",
    "residency/workload/service.py": "the service: creates each rank's file, refuses stale ones",
    "residency/workload/ranks.py": "a rank opens its file with `JsonlRecorder`",
    "residency/adapters/vllm_omni.py": "a patched process opens its file with `JsonlRecorder`",
    "residency/notebook/progress.py": "names the run's live file; `last_request_id` reads it",
    "residency/experiments/arms.py": "checks that a service run left its files",
    "residency/selftest/steps.py": "finds the files its steps wrote; reads them via the owner",
}
FORGERS = {  # test functions that write or parse bytes the owner never would, on purpose
    "tests/rundir/test_hostile_runs.py": {
        "test_decisions_lines_split_on_newline_only":
            "a raw U+2028 inside a line (the writer escapes it)"},
    "tests/rundir/test_run_read_once.py": {
        "test_a_manifest_swapped_between_reads_never_gives_its_figures":
            "forged manifest bytes handed to the reader"},
    "tests/rundir/test_run_validation.py": {
        "test_a_manifest_with_a_duplicate_key_is_refused":
            "shows a last-wins parser reading a duplicate key"},
}
_PARSE = {("json", "loads"), ("json", "load"), ("decode", None), ("read_json", None)}
_WRITE = {("json", "dump"), ("json", "dumps"), ("write_json_atomic", None)}


def _bound(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(target, source) pairs that bind names: assignments, loops, comprehensions, `with`."""
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [(t, node.value) for t in targets]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars]
    return []


def _call_kind(call: ast.Call) -> str | None:
    """"parse", "write" or None for a call: `json.loads(...)` and the like by their module
    and name, `read_json`, `write_json_atomic` and any `.decode` of msgspec by name."""
    f = call.func
    if isinstance(f, ast.Attribute):
        key = ((f.value.id, f.attr) if isinstance(f.value, ast.Name) else (f.attr, None))
        if f.attr == "decode" and "msgspec" in ast.unparse(f.value):
            key = ("decode", None)
    elif isinstance(f, ast.Name):
        key = (f.id, None)
    else:
        return None
    return "parse" if key in _PARSE else "write" if key in _WRITE else None


def format_uses(path: Path, fmt: Format) -> tuple[list[str], list[str]]:
    """(where `path` locates the format's files, where it parses or writes what a function
    located): the owner's names, and any string constant that starts with the file name; a
    name bound from a located path (or from a name bound so) carries it on."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)}

    def locates(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Name) and node.id in fmt.names)
                or (isinstance(node, ast.Attribute) and node.attr in fmt.names)
                or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith(fmt.prefix) and id(node) not in docstrings))

    where = [f"line {n}" for n in sorted({n.lineno for n in ast.walk(tree) if locates(n)})]
    uses = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        located: set[str] = set()

        def from_file(node: ast.AST, located: set[str] = located) -> bool:
            return any(locates(n) or (isinstance(n, ast.Name) and n.id in located)
                       for n in ast.walk(node))

        grew = True
        while grew:  # names bound from a located file, to a fixed point
            before = len(located)
            for node in ast.walk(fn):
                for target, source in _bound(node):
                    if from_file(source):
                        located |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            grew = len(located) > before
        uses += [f"{fn.name}, line {n.lineno} ({_call_kind(n)})" for n in ast.walk(fn)
                 if isinstance(n, ast.Call) and _call_kind(n) is not None
                 and any(from_file(a) for a in n.args)]
    return where, sorted(set(uses), key=lambda u: (int(u.split("line ")[1].split(" ")[0]), u))


def decisions_uses(path: Path) -> tuple[list[str], list[str]]:
    """`format_uses` of the decisions files."""
    return format_uses(path, FORMATS["decisions"])


def test_decisions_files_are_located_only_by_listed_modules() -> None:
    users = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        where, _ = decisions_uses(path)
        if where and rel not in DECISIONS_USERS:
            users[rel] = where
    assert users == {}, "a new module locates decisions files: go through the owner"
    unused = {rel for rel in DECISIONS_USERS if not decisions_uses(ROOT / rel)[0]}
    assert unused == set(), "an allow-listed module no longer locates decisions files"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_record_format_is_read_and_written_only_by_its_owner(name: str) -> None:
    """A second owner of a format (a module other than its own that parses or writes the
    file), in the package or in the tests, fails here."""
    fmt = FORMATS[name]
    found = {}
    tests = [p for p in (ROOT / "tests").rglob("*.py")
             if "data" not in p.relative_to(ROOT / "tests").parts]
    for path in sorted([*PACKAGE.rglob("*.py"), *tests]):
        rel = path.relative_to(ROOT).as_posix()
        if rel != fmt.owner and rel != "tests/project/test_architecture.py":
            forgers = FORGERS.get(rel, {})
            uses = [u for u in format_uses(path, fmt)[1] if u.split(",")[0] not in forgers]
            if uses:
                found[rel] = uses
    assert found == {}, f"{name} files parsed or written outside {fmt.owner}"


def test_the_format_check_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import json\nfrom residency.records.decisions import DECISIONS_GLOB\n"
                     "def rows(d):\n    return [json.loads(x) for f in d.glob(DECISIONS_GLOB)"
                     " for x in f.read_text().splitlines()]\n"
                     "def name(r):\n    return f'decisions-rank{r}.jsonl'\n"
                     "STALE = 'decisions-rank'\n"
                     "def tail(d, r, decisions_file):\n    path = d / decisions_file(r)\n"
                     "    with open(path) as f:\n        lines = f.read().splitlines()\n"
                     "    return [json.loads(x) for x in lines], json.loads(d.read_text())\n"
                     "def client(d, rec):\n    write_json_atomic(d / 'client.json', rec)\n"
                     "    return read_json(d / CLIENT), msgspec.json.decode((d / CLIENT)"
                     ".read_bytes())\n")
    where, parses = decisions_uses(probe)
    assert where == ["line 4", "line 6", "line 7", "line 9"]
    assert parses == ["rows, line 4 (parse)", "tail, line 12 (parse)"]  # not d's own JSON
    assert format_uses(probe, FORMATS["client"])[1] == [
        "client, line 14 (write)", "client, line 15 (parse)"]


def test_no_test_module_imports_another_test_module() -> None:
    """Shared test code lives in helper modules (`tests/helpers.py`, `tests/reading.py`,
    `tests/servicekit.py`, `tests/memorytraces.py`) and fixtures in `tests/conftest.py`."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "data" in path.relative_to(ROOT / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno}: {n}" for n in names
                    if re.match(r"(tests\.)?(\w+\.)?test_", n)]
    assert bad == []


def test_the_clis_copied_choices_agree_with_their_owners() -> None:
    """Two choice lists the CLI keeps (their owners load numpy and pandas): they must name
    what the owners define."""
    from residency.analysis.whatif import POLICIES
    from residency.cli import main as cli
    from residency.traces.busy import DEFINITIONS

    assert ("default", *DEFINITIONS) == cli.BUSY_CHOICES
    assert cli.WHATIF_POLICIES == POLICIES
