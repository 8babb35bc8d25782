"""Fixtures every test module can ask for: Python snippets in a fresh interpreter (for
process-global torch state), a per-test trace cache, copies of the recorded paired run and its
evidence, a sealed copy of the small fixture run. Plain helpers live in `tests/helpers.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FIXTURE_RUN, PAIRED, copy_run, run_python, sealed_copy


@pytest.fixture(params=["compiled", "pure"])
def trace_reader(request):
    """Each test twice: with the compiled trace reader (skipped where it is not built), and
    with msgspec reading every run (`residency.traces.kineto_scan.msgspec_only`)."""
    from residency.traces import kineto_scan

    if request.param == "pure":
        with kineto_scan.msgspec_only():
            yield request.param
        return
    if not kineto_scan.available():
        pytest.skip("the compiled reader is not built")
    yield request.param


@pytest.fixture
def subprocess_python():
    """`run_python` as a fixture."""
    return run_python


@pytest.fixture(autouse=True)
def _trace_cache_in_tmp(tmp_path_factory, monkeypatch):
    """A trace cache (`residency.traces.cache`) of its own for every test, in pytest's temporary
    folder, never the user's cache directory (subprocesses inherit it)."""
    monkeypatch.setenv("RESIDENCY_CACHE_DIR", str(tmp_path_factory.mktemp("residency-cache")))
    monkeypatch.delenv("RESIDENCY_NO_CACHE", raising=False)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)


@pytest.fixture
def paired(tmp_path: Path) -> Path:
    """A writable copy of the recorded paired-profile run (`helpers.PAIRED`), still sealed."""
    return copy_run(PAIRED, tmp_path / "run")


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    """A copy of the small fixture run (`helpers.FIXTURE_RUN`) with its sha256 list and seal
    recorded."""
    return sealed_copy(FIXTURE_RUN, tmp_path / "run")


@pytest.fixture(scope="module")
def paired_evidence():
    """The evidence of the recorded paired-profile run, built once per test module."""
    from residency import evidence
    from residency.rundir.run import load_run

    return evidence.build(load_run(PAIRED))
