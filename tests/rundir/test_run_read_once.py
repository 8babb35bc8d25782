"""A run read once (issue 44, issue 41 F5): every file of a run is read once per command, the
seal checked on the bytes parsed; the manifest the figures come from is the manifest verified."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from residency.records import files as record_files
from residency.records.manifest import MANIFEST
from tests.helpers import run_cli


@pytest.mark.parametrize("argv", [("tables",), ("tables", "--format", "pr"), ("verify",),
                                  ("whatif",)])
def test_every_file_of_the_run_is_opened_once_per_command(sealed, monkeypatch, argv):
    opened: Counter[str] = Counter()
    real_open = os.open
    root = str(sealed)

    def counting(path, *args, **kwargs):
        p = os.path.abspath(os.fspath(path))
        if p.startswith(root + os.sep):
            opened[os.path.relpath(p, root)] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    rc, out, err = run_cli(argv[0], str(sealed), *argv[1:])
    assert rc == 0, err
    files = {p.relative_to(sealed).as_posix() for p in sealed.rglob("*") if p.is_file()}
    assert set(opened) <= files and MANIFEST in opened
    assert {f: n for f, n in opened.items() if n != 1} == {}, opened
    if argv[0] == "tables":  # every file is evidence the tables read or verify: all read
        assert set(opened) == files


def test_a_manifest_swapped_between_reads_never_gives_its_figures(sealed, monkeypatch):
    """The swap: the first read of manifest.json sees a forged manifest (an E2E figure
    changed, the honest seal kept), every later read the honest one. The figures may come
    only from a manifest that was verified: the forged E2E figure is never printed, let alone
    beside the honest digest."""
    honest = (sealed / MANIFEST).read_bytes()
    forged = json.loads(honest)
    forged["runs"][0]["e2e_s"] = 777.777
    forged_bytes = json.dumps(forged).encode()
    reads = Counter()
    real_read = record_files.read_regular

    def swapping(path, *args, **kwargs):
        if Path(path).name == MANIFEST:
            reads[MANIFEST] += 1
            if reads[MANIFEST] == 1:
                return forged_bytes
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(record_files, "read_regular", swapping)
    rc, out, err = run_cli("tables", str(sealed), "--format", "pr")
    assert "777.8 s" not in out  # (before: "baseline 777.8 s" beside the honest digest)
    assert rc == 2 and "failed verification" in err and "runs[0]" in err
    assert reads[MANIFEST] == 1
