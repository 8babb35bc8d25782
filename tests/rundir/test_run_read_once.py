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


def _count_opens(monkeypatch, root: Path) -> Counter[str]:
    """Every `os.open` of a file below `root` from now on, by relative path."""
    opened: Counter[str] = Counter()
    real_open = os.open
    top = str(root)

    def counting(path, *args, **kwargs):
        p = os.path.abspath(os.fspath(path))
        if p.startswith(top + os.sep):
            opened[os.path.relpath(p, top)] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return opened


def _count_parses(monkeypatch) -> Counter[str]:
    """Every parse of a run's record files (decisions, client records, the manifest), by
    folder and file name, from now on: what each format's reader parses and validates."""
    from residency.records import client as client_format
    from residency.records import decisions as decisions_format
    from residency.records import manifest as manifest_format

    parsed: Counter[str] = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def parse(path, *args, **kwargs):
            parsed[f"{Path(path).parent.name}/{Path(path).name}"] += 1
            return real(path, *args, **kwargs)

        monkeypatch.setattr(module, name, parse)

    counted(decisions_format, "read_decisions")
    counted(client_format, "read_json")
    counted(manifest_format, "read_json")
    return parsed


@pytest.mark.parametrize("argv", [("tables",), ("tables", "--format", "pr"), ("verify",),
                                  ("whatif",)])
def test_every_file_of_the_run_is_opened_once_per_command(sealed, monkeypatch, argv):
    opened = _count_opens(monkeypatch, sealed)
    parsed = _count_parses(monkeypatch)
    rc, out, err = run_cli(argv[0], str(sealed), *argv[1:])
    assert rc == 0, err
    files = {p.relative_to(sealed).as_posix() for p in sealed.rglob("*") if p.is_file()}
    assert set(opened) <= files and MANIFEST in opened
    assert {f: n for f, n in opened.items() if n != 1} == {}, opened
    if argv[0] == "tables":  # every file is evidence the tables read or verify: all read
        assert set(opened) == files
    assert {f: n for f, n in parsed.items() if n != 1} == {}, parsed  # validated once
    if argv[0] != "verify":
        assert parsed, "the command parsed no decisions file or client record"


def test_a_notebook_execution_reads_each_run_file_once(paired, tmp_path, monkeypatch):
    """The paired-profile notebook's helpers, as one execution calls them: parameters
    checked (the run, its device kind, a compare run that is the same folder), the run
    opened, its evidence built with the traces, the first screen, the run's description and
    the cross-device columns: each record file of the run is opened once, each parsed once.
    Before: `check_parameters` loaded the run, the device check loaded it again and
    `open_source` a third time (each read verifying every file)."""
    from residency import notebook as nb

    opened = _count_opens(monkeypatch, paired)
    parsed = _count_parses(monkeypatch)
    params = nb.check_parameters(designs=("paired-profile", "profiled-pair", "alternating"),
                                 device="emulated-npu", source=str(paired),
                                 compare=[str(paired)])
    run = nb.open_source(params["source"], output_dir=tmp_path, design="paired-profile",
                         device=params["device"])
    ev = nb.paired_profile(run)
    nb.first_screen_notes(ev, run)
    nb.describe_run(run, assignment=False)
    nb.cross_device(run, params["compare"])
    assert opened[MANIFEST] == 1
    records = {f: n for f, n in opened.items() if "/trace/" not in f}  # (traces: see below)
    assert {f: n for f, n in records.items() if n != 1} == {}, opened
    assert parsed and {f: n for f, n in parsed.items() if n != 1} == {}, parsed
    # (the trace loader, `traces.load.load_traces`, opens each trace to sniff, to stat and to
    # parse under the seal: one load per trace folder, the next test)


def test_a_notebook_execution_loads_each_trace_folder_once(paired, tmp_path, monkeypatch):
    """The evidence (idle figures), the timeline, idle by cause and the trace diff of one
    paired-profile execution share one load of each trace folder (before: four loads of each
    of the pair's folders, every one parsing every rank again)."""
    from residency import notebook as nb
    from residency.evidence.runs import reference_pair
    from residency.reports import views
    from residency.traces import load as trace_load

    loads: Counter[str] = Counter()
    real = trace_load.load_traces

    def counting(path, *args, **kwargs):
        loads[str(path)] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(trace_load, "load_traces", counting)
    params = nb.check_parameters(designs=("paired-profile", "profiled-pair", "alternating"),
                                 device="emulated-npu", source=str(paired))
    run = nb.open_source(params["source"], output_dir=tmp_path, design="paired-profile",
                         device=params["device"])
    nb.paired_profile(run)  # its idle figures from the pair's traces
    pair = reference_pair(run)
    views.write_timeline(run, pair, tmp_path)
    views.write_causes(run, pair, tmp_path)
    views.write_trace_diff(run, pair, tmp_path)
    assert len(loads) == 2 and set(loads.values()) == {1}, loads


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
