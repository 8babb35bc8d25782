"""No neighbours: the devices' other processes recorded per service run, warned about in the
reports, and refused with --require-exclusive (a stand-in lister lists a process the test
started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from residency import evidence
from residency.experiments.designs import run_design
from residency.experiments.errors import ExperimentError
from residency.experiments.servicefile import builtin_service
from residency.records.manifest import read_manifest
from residency.reports import summary
from residency.rundir import neighbours
from residency.rundir.run import load_run
from tests.helpers import run_cli

SMALL = ["--scale", "0.02", "--resident-mib", "256"]

# `npu-smi info`'s process table as Ascend's driver prints it (one NPU busy, one idle) and its
# container form (a trailing "Process id in container" column; an empty process name)
NPU_SMI = """\
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 48988         | python                   | 13330                   |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
"""
NPU_SMI_CONTAINER = """\
| NPU     Chip       | Process id    | Process name| Process memory(MB) |Process id in container|
+===========================+===============+===================================================+
| 2     0            | 907864        |             | 134                | 77                    |
"""


@pytest.fixture
def neighbour():
    """A foreign process started by the test (it holds no device: the stand-in lists it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def standin(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "device-processes.csv"
    path.write_text("# pid, name, used MiB, device\n" + "".join(f"{r}\n" for r in rows))
    return path


def test_npu_smi_process_table_is_parsed() -> None:
    assert neighbours.parse_npu_smi(NPU_SMI) == (
        neighbours.DeviceProcess(pid=48988, name="python", device="0:0", used_mib=13330.0),)
    assert neighbours.parse_npu_smi(NPU_SMI_CONTAINER) == (
        neighbours.DeviceProcess(pid=77, name="", device="2:0", used_mib=134.0),)
    assert neighbours.parse_npu_smi("| No running processes found in NPU 0 |") == ()


def test_nvidia_smi_csv_and_a_bad_row() -> None:
    assert neighbours.parse_smi_csv("123, python3, 1024\n456, [Not Found], [N/A]\n") == (
        neighbours.DeviceProcess(123, "python3", None, 1024.0),
        neighbours.DeviceProcess(456, "[Not Found]", None, None))
    with pytest.raises(ValueError, match="'x, y': the pid is not an integer"):
        neighbours.parse_smi_csv("x, y")


def test_listers_are_registered_per_device_kind(tmp_path) -> None:
    assert {"cuda", "npu", "emulated-npu"} <= set(neighbours.LISTERS)
    emulated = neighbours.sample(neighbours.lister_for("emulated-npu", env={}), {os.getpid()})
    assert emulated["applies"] is False and emulated["processes"] == []
    path = standin(tmp_path, "11, python, 10, 0", "22, other, 5, 0")
    s = neighbours.sample(neighbours.lister_for("emulated-npu",
                                                env={neighbours.STANDIN_ENV: str(path)}), {11})
    assert [(p["pid"], p["own"]) for p in s["processes"]] == [(11, True), (22, False)]
    assert s["foreign"] == 1 and s["source"] == f"stand-in {path}"


def test_own_pids_are_the_service_tree_only(neighbour) -> None:
    own = neighbours.own_pids([neighbour.pid])
    assert own == {neighbour.pid}
    assert neighbour.pid in neighbours.own_pids([os.getpid()])  # a child of ours


def test_describe_emulated_and_unrecorded() -> None:
    assert "not recorded" in neighbours.describe(None)
    rec = neighbours.summarize([("runs/00-baseline", neighbours.record(
        neighbours.sample(neighbours.lister_for("emulated-npu", env={}), ()),
        neighbours.sample(neighbours.lister_for("emulated-npu", env={}), ())))])
    assert not neighbours.seen(rec)
    assert "none possible (emulated NPU" in neighbours.describe(rec)


def test_require_exclusive_refuses_before_anything_runs(tmp_path, neighbour,
                                                        monkeypatch) -> None:
    monkeypatch.setenv(neighbours.STANDIN_ENV,
                       str(standin(tmp_path, f"{neighbour.pid}, intruder, 2048, 0")))
    out_dir = tmp_path / "run"
    for argv in (["pair", "--design", "profiled-pair", "--device", "emulated-npu", "--ranks",
                  "1", "--steps", "2", *SMALL, "--out", str(out_dir), "--no-progress",
                  "--require-exclusive"],
                 ["serve", "--arm", "candidate", "--device", "emulated-npu", "--ranks", "1",
                  "--decisions-dir", str(tmp_path / "d"), "--require-exclusive"]):
        rc, _, err = run_cli(*argv)
        assert rc == 2, err
        (line,) = err.splitlines()
        assert f"pid {neighbour.pid} (intruder, 2,048 MiB, device 0)" in line
        assert "--require-exclusive refuses to measure" in line
    assert not out_dir.exists() and not (tmp_path / "d").exists()


def test_require_exclusive_with_an_unreadable_listing_refuses(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(neighbours.STANDIN_ENV, str(tmp_path / "missing.csv"))
    rc, _, err = run_cli("serve", "--arm", "candidate", "--device", "emulated-npu",
                         "--decisions-dir", str(tmp_path / "d"), "--require-exclusive")
    assert rc == 2 and "cannot be checked" in err


@pytest.mark.slow
def test_a_foreign_process_is_recorded_and_the_reports_warn(tmp_path, neighbour,
                                                            monkeypatch) -> None:
    monkeypatch.setenv(neighbours.STANDIN_ENV,
                       str(standin(tmp_path, f"{neighbour.pid}, intruder, 2048, 0")))
    out_dir = tmp_path / "run"
    rc, _, err = run_cli("pair", "--design", "profiled-pair", "--device", "emulated-npu",
                         "--ranks", "1", "--steps", "2", *SMALL, "--out", str(out_dir),
                         "--no-progress")
    assert rc == 0, err
    manifest = read_manifest(out_dir)
    for entry in manifest["runs"]:
        for when in ("start", "end"):
            (p,) = entry["neighbours"][when]["processes"]
            assert (p["pid"], p["name"], p["own"]) == (neighbour.pid, "intruder", False)
        assert isinstance(entry["neighbours"]["host_top"], list)
    (found,) = manifest["neighbours"]["foreign"]
    assert found["seen"] == ["runs/00-baseline start", "runs/00-baseline end",
                             "runs/01-candidate start", "runs/01-candidate end"]
    run = load_run(out_dir)
    s = summary.summarize(evidence.build(run, traces=False), manifest=run.manifest)
    (warning,) = [w for w in s.warnings if w.startswith("**Not alone on the device**")]
    assert f"pid {neighbour.pid} \\(intruder, 2,048 MiB, device 0\\)" in warning
    assert "Not alone on the device" in summary.first_screen_markdown(s)
    assert f"pid {neighbour.pid}" in summary.notes_markdown(s)
    assert "Not alone on the device" in summary.pr_markdown(s)


@pytest.mark.slow
def test_a_neighbour_arriving_during_the_run_stops_it_incomplete(tmp_path) -> None:
    calls = []

    def lister() -> neighbours.Listing:  # clean before the run, a neighbour once it runs
        calls.append(1)
        procs = () if len(calls) == 1 else (neighbours.DeviceProcess(4242, "late", "0", 1.0),)
        return neighbours.Listing(procs, source="test")

    spec = builtin_service(device_kind="emulated-npu", ranks=1, scale=0.02, resident_mib=256)
    with pytest.raises(ExperimentError, match="baseline: at the start of its measured run, "
                                              "1 foreign process"):
        run_design("profiled-pair", tmp_path / "run", spec=spec, steps=2, progress=False,
                   require_exclusive=True, lister=lister)
    manifest = read_manifest(tmp_path / "run")
    assert manifest["status"] == "incomplete" and "pid 4242 (late" in manifest["error"]
    assert manifest["params"]["require_exclusive"] is True
