"""Fuzzing run directories and service files (issue 14, deliverable 6).

Property: whatever a run directory holds -- a manifest, decisions JSONL or client.json with any
field swapped for any JSON value (huge and non-finite numbers, wrong types, deep nesting,
missing keys) or with bytes mutated, and whatever a service TOML says -- the commands that read
it (`verify`, `tables`, `whatif`; `load_service_file` for TOML) end with exit code 0, 1 or 2,
print no traceback, write at most one line on stderr when they fail on input (exit 2), and
return (each case runs in a thread joined with a generous timeout: a hang detector, not a
timing assertion).

The commands run in-process through `residency.cli.main.main` so that thousands of cases stay cheap;
an exception escaping `main` is exactly the traceback a user would see. ``tests/data/
rundir-fuzz/`` keeps the cases fuzzing found (replayed first). Reproducible: hypothesis
derandomized, no example database.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residency.cli.main import main
from residency.records.client import CLIENT
from residency.records.manifest import MANIFEST
from tests.helpers import ROOT, reseal, sealed_copy

FIXTURE = ROOT / "tests" / "data" / "rundir" / "fixture-run"
CORPUS = ROOT / "tests" / "data" / "rundir-fuzz"
HANG_S = 60.0
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=250,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMMANDS = (("verify",), ("tables", "--no-verify"), ("whatif", "--no-verify"),
            ("tables",), ("tables", "--allow-incomplete", "--no-verify"))


# -- one command, classified ------------------------------------------------------------------

def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `residency ARGV` in-process; fails the test on an escaping
    exception (a traceback) or a hang."""
    out: dict[str, Any] = {}

    def target() -> None:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    out["code"] = main(argv)
                except SystemExit as exc:  # argparse
                    out["code"] = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # noqa: BLE001 - this is what the test looks for
            out["exc"] = exc
        out["stderr"] = err.getvalue()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"residency {' '.join(argv)} hung"
    if "exc" in out:
        raise AssertionError(f"residency {' '.join(argv)} raised "
                             f"{type(out['exc']).__name__}: {out['exc']}"[:2000]) from out["exc"]
    return out["code"], out["stderr"]


def check_all(run: Path) -> None:
    for cmd in COMMANDS:
        argv = [cmd[0], str(run), *cmd[1:]]
        code, stderr = run_cli(argv)
        assert code in (0, 1, 2), (argv, code, stderr)
        if code == 2:
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1, (argv, stderr[:2000])


# -- inputs -------------------------------------------------------------------------------------

ODD_NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "5e-324", "-0.0",
               str(2**63), str(2**64), str(-(2**63) - 1), "1" * 5000, "0", "-1", "1.5"]

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["runs/00-baseline", "../..", "/etc", "runs/../..", MANIFEST,
                     "baseline", "candidate", "complete", "incomplete", "npu", "cuda",
                     "emulated-npu", "warmup-0001", "r0001", "normal", "forced", "released",
                     "retained"]),
)
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _encode(value: Any) -> str:
    return json.dumps(value)


@st.composite
def raw_value(draw: Callable[..., Any]) -> str:
    """The JSON text of a replacement value: any JSON value, an odd number token, or deep
    nesting."""
    kind = draw(st.sampled_from(["json", "number", "deep"]))
    if kind == "number":
        return draw(st.sampled_from(ODD_NUMBERS))
    if kind == "deep":
        depth = draw(st.sampled_from([100, 5000, 200_000]))
        return "[" * depth + "]" * depth
    return _encode(draw(json_value))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


_MARK = "\x00FUZZ\x00"


def _replace_at(doc: Any, path: tuple, raw: str | None) -> str:
    """The JSON text of `doc` with the value at `path` replaced by raw JSON text (or the key
    removed when `raw` is None)."""
    if not path:
        return raw if raw is not None else ""
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if raw is None:
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
        return json.dumps(doc)
    parent[path[-1]] = _MARK
    return json.dumps(doc).replace(json.dumps(_MARK), raw, 1)


@st.composite
def mutated_json(draw: Callable[..., Any], text: str) -> str:
    """`text` (one JSON document) with one value replaced or removed, or bytes mutated."""
    how = draw(st.sampled_from(["replace", "replace", "remove", "truncate", "flip"]))
    if how == "truncate":
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "flip":
        i = draw(st.integers(0, max(0, len(text) - 1)))
        return text[:i] + draw(st.sampled_from(['"', "{", "]", "\\", ",", "9", "\x00", "é"])) \
            + text[i + 1:]
    doc = json.loads(text)
    path = draw(st.sampled_from(_paths(doc)))
    if how == "remove" and path:
        return _replace_at(doc, path, None)
    return _replace_at(doc, path, draw(raw_value()))


def _case(mutate: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = sealed_copy(FIXTURE, Path(tmp) / "run")
        mutate(run)
        check_all(run)


# -- properties ---------------------------------------------------------------------------------

@FUZZ
@given(st.data())
@pytest.mark.slow
def test_fuzzed_manifest(data: st.DataObject) -> None:
    def mutate(run: Path) -> None:
        path = run / MANIFEST
        path.write_text(data.draw(mutated_json(path.read_text())))

    _case(mutate)


@FUZZ
@given(st.data(), st.sampled_from(["00-baseline", "01-candidate"]), st.sampled_from([0, 1]))
@pytest.mark.slow
def test_fuzzed_decisions(data: st.DataObject, run_name: str, rank: int) -> None:
    def mutate(run: Path) -> None:
        path = run / "runs" / run_name / f"decisions-rank{rank}.jsonl"
        lines = path.read_text().splitlines()
        i = data.draw(st.integers(0, len(lines)))
        if i == len(lines) or data.draw(st.booleans()):
            lines.insert(i, data.draw(raw_value()))
        else:
            lines[i] = data.draw(mutated_json(lines[i])).replace("\n", " ")
        path.write_text("\n".join(lines) + "\n")
        reseal(run)

    _case(mutate)


@FUZZ
@given(st.data(), st.sampled_from(["00-baseline", "01-candidate"]))
@pytest.mark.slow
def test_fuzzed_client(data: st.DataObject, run_name: str) -> None:
    def mutate(run: Path) -> None:
        path = run / "runs" / run_name / CLIENT
        path.write_text(data.draw(mutated_json(path.read_text())))
        reseal(run)

    _case(mutate)


TOML_BASE = """\
name = "fuzz"
device_kind = "cuda"
ranks = 1
[serve]
command = ["true"]
env = {A = "1"}
[health]
url = "http://127.0.0.1:1/health"
timeout_s = 5
[request]
url = "http://127.0.0.1:1/v1/generate"
timeout_s = 10
json = {steps = "{steps}"}
[profile]
start_url = "http://127.0.0.1:1/start_profile"
stop_timeout_s = 30
"""
TOML_KEYS = ["name", "device_kind", "ranks", "serve", "serve.command", "serve.env", "serve.cwd",
             "health", "health.url", "health.timeout_s", "request", "request.url",
             "request.timeout_s", "request.method", "request.json", "request.files", "profile",
             "profile.stop_timeout_s", "profile.traces"]
TOML_VALUES = ['"X"', "nan", "inf", "-inf", "-1", "0", "1e400", str(2**63), "[1, 2]", "{}",
               "true", '"../../etc"', '["/nonexistent/bin"]', "{a = {b = 1}}", "1.5", '""']


@FUZZ
@given(st.sampled_from(TOML_KEYS), st.sampled_from(TOML_VALUES), st.booleans())
@pytest.mark.slow
def test_fuzzed_service_toml(key: str, value: str, drop: bool) -> None:
    from residency.experiments.errors import ExperimentError
    from residency.experiments.servicefile import load_service_file

    table, _, leaf = key.rpartition(".")
    lines, current, out, done = TOML_BASE.splitlines(), "", [], False
    for line in lines:
        if line.startswith("["):
            if current == table and not done and not drop:
                out.append(f"{leaf} = {value}")
                done = True
            current = line.strip("[]")
            out.append(line)
            continue
        name = line.split("=", 1)[0].strip()
        if current == table and name == leaf:
            done = True
            if not drop:
                out.append(f"{leaf} = {value}")
            continue
        out.append(line)
    if not done and not drop:
        out.append(f"{leaf} = {value}" if current == table else f"[{table}]\n{leaf} = {value}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "svc.toml"
        path.write_text("\n".join(out) + "\n")
        try:
            spec = load_service_file(path)
        except (ExperimentError, ValueError) as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
            return
    for number in (spec.health_timeout_s, spec.request_timeout_s, spec.profile_stop_timeout_s):
        assert math.isfinite(number) and number > 0, spec
    assert isinstance(spec.ranks, int) and spec.ranks >= 1


# -- the corpus ---------------------------------------------------------------------------------

def _corpus() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_dir()) if CORPUS.is_dir() else []


@pytest.mark.parametrize("case", _corpus(), ids=lambda p: p.name)
def test_corpus_case(case: Path, tmp_path: Path) -> None:
    """Each saved case: files under it replace the fixture's (then re-sealed unless the case
    holds its own manifest.json)."""
    run = sealed_copy(FIXTURE, tmp_path / "run")
    own_manifest = (case / MANIFEST).exists()
    for src in case.rglob("*"):
        if src.is_file() and src.name != "README.md":
            dst = run / src.relative_to(case)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    if not own_manifest:
        reseal(run)
    check_all(run)
