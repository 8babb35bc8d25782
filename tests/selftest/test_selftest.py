"""`residency selftest`: every step passes on the emulated NPU; each step's failure path,
reached by injecting a fault (tests/faultsite/sitecustomize.py), is a failed step with the
exception's type and message and a hint, exit 1, never a traceback; bad input exits 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from residency.records.decisions import decisions_file
from residency.records.manifest import MANIFEST
from residency.selftest import (
    STEP_NAMES,
    CheckFailed,
    Context,
    Report,
    StepResult,
    check_trace_dir,
    run_step,
)
from tests.helpers import ROOT
from tests.servicekit import alive, wait_for

FAULTSITE = Path(__file__).resolve().parent.parent / "faultsite"


def _selftest(tmp_path: Path, *args: str, faults: tuple[str, ...] = (),
              device: str = "emulated-npu", timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RESIDENCY_") and k not in ("RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(FAULTSITE), str(ROOT)] if faults else [str(ROOT)])
    if faults:
        env["RESIDENCY_TEST_FAULTS"] = ",".join(faults)
    return subprocess.run([sys.executable, "-m", "residency", "selftest", "--device", device,
                           *args], capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=env)


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    """The selftest itself printed no traceback (a quoted service log may hold a rank's;
    stdout is checked by parsing it: one JSON object, or the text report)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _report(proc: subprocess.CompletedProcess) -> dict:
    report = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert [s["name"] for s in report["steps"]] == list(STEP_NAMES)
    return report


def _steps(report: dict) -> dict[str, dict]:
    return {s["name"]: s for s in report["steps"]}


def _assert_failed(step: dict, error_type: str, text: str) -> None:
    assert step["status"] == "failed", step
    assert step["error_type"] == error_type, step
    assert text in step["error"], step
    assert step["hint"] and step["detail"], step


def _vllm_omni_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-omni")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
def test_every_step_passes_on_the_emulated_npu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _selftest(tmp_path, "--json", "--out", str(out))
    _no_traceback(proc)
    report = _report(proc)
    steps = _steps(report)
    assert proc.returncode == 0, json.dumps(report["steps"], indent=1)
    assert report["device_kind"] == "emulated-npu" and report["ranks"] == 2
    assert report["status"] == "passed" and report["out"] == str(out)
    adapter_applies = _vllm_omni_installed() or os.environ.get("CI")  # CI installs it
    for name, step in steps.items():
        expected = "skipped" if name == "adapter" and not adapter_applies else "passed"
        assert step["status"] == expected, step
        assert set(step) >= {"name", "status", "seconds", "detail"} and step["seconds"] >= 0
    env = report["environment"]
    assert env["device_count"] == 2 and env["torch"] and env["python"]
    assert steps["probe"]["data"]["bug_present"] is True
    assert steps["profiler"]["data"]["format"] == "kineto"
    assert all(n > 0 for n in steps["profiler"]["data"]["device_tasks"].values())
    # --out keeps everything the steps wrote
    assert json.loads((out / "selftest.json").read_text())["status"] == "passed"
    run = out / "service" / "runs" / "00-candidate"
    assert sorted(p.name for p in (run / "trace").iterdir()) == ["rank0.trace.json",
                                                                 "rank1.trace.json"]
    assert (run / decisions_file(1)).is_file() and (out / "pair" / MANIFEST).is_file()
    assert (out / "policy" / "decisions.jsonl").read_text().count("\n") == 6  # 3 arms x 2 calls


@pytest.mark.slow
def test_faults_in_the_selftest_process_fail_their_steps(tmp_path: Path) -> None:
    proc = _selftest(tmp_path, "--json", faults=("environment", "probe", "adapter",
                                                 "profiler-empty", "verify"))
    _no_traceback(proc)
    steps = _steps(_report(proc))
    assert proc.returncode == 1
    _assert_failed(steps["environment"], "PermissionError", "injected fault")
    _assert_failed(steps["probe"], "CheckFailed", "injected fault: the driver refuses")
    _assert_failed(steps["policy"], "RuntimeError", "injected fault: the driver refuses")
    if _vllm_omni_installed():
        _assert_failed(steps["adapter"], "UnsupportedUpstream", "_should_release")
    assert steps["service"]["status"] == "passed"           # the ranks are not faulted
    _assert_failed(steps["profiler"], "CheckFailed", "the profiler wrote nothing")
    _assert_failed(steps["paired"], "CheckFailed", "residency verify")
    assert "1 changed" in steps["paired"]["error"]


@pytest.mark.slow
def test_a_failing_rank_fails_the_service_step(tmp_path: Path) -> None:
    proc = _selftest(tmp_path, "--json", faults=("rank-fail",))
    _no_traceback(proc)
    steps = _steps(_report(proc))
    assert proc.returncode == 1
    _assert_failed(steps["service"], "ExperimentError", "rank 1 exited with code 3")
    assert steps["profiler"]["status"] == "skipped"
    assert "service step" in steps["profiler"]["detail"]
    _assert_failed(steps["paired"], "ExperimentError", "rank 1 exited with code 3")
    for name in ("environment", "probe", "policy"):
        assert steps[name]["status"] == "passed", steps[name]


@pytest.mark.slow
def test_a_cache_not_released_and_an_unparseable_trace_fail_in_text_output(
        tmp_path: Path) -> None:
    proc = _selftest(tmp_path, faults=("policy", "profiler-garbled"))
    _no_traceback(proc)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    failed = [line.split()[1] for line in lines if line.strip().startswith("FAILED")]
    assert failed == ["policy", "profiler"], proc.stdout
    # empty_cache() that returns nothing: the released decision did not free the cache
    assert any("CheckFailed: arm candidate, forced call: released, but memory_reserved went"
               in line for line in lines), proc.stdout
    assert any("TraceError" in line for line in lines)
    assert any(line.strip().startswith("hint: The trace written by") for line in lines)
    assert lines[-1] == "failed: policy, profiler"


def _process_tree(marker: str) -> set[int]:
    """Processes whose command line holds `marker`, and all their descendants."""
    parents: dict[int, int] = {}
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if marker.encode() in (proc / "cmdline").read_bytes():
                found.add(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found


@pytest.mark.slow
def test_sigterm_stops_the_services_and_prints_the_partial_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESIDENCY_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "residency", "selftest", "--device",
                             "emulated-npu", "--json", "--out", str(out)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "service" / "runs" / "00-candidate" / "service.log"
    service: set[int] = set()

    def service_started() -> bool:  # the service and its ranks exist (no sleep for it)
        service.update(_process_tree(str(out)) if log.is_file() else ())
        return len(service) >= 4  # selftest, service, two ranks

    wait_for(service_started, what="the service step's service and its ranks", proc=proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    report = json.loads(stdout)
    steps = {s["name"]: s for s in report["steps"]}
    assert report["interrupted"] is True and report["status"] == "failed"
    assert steps["service"]["status"] == "failed"
    assert steps["service"]["error_type"] == "KeyboardInterrupt" and steps["service"]["hint"]
    assert [steps[n]["status"] for n in ("profiler", "paired")] == ["skipped", "skipped"]
    assert json.loads((out / "selftest.json").read_text())["interrupted"] is True
    left = [pid for pid in service if alive(pid)]
    assert not left, f"processes of the service still running: {left}"


def test_cuda_without_cuda_exits_2_with_one_line(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _selftest(tmp_path, "--json", device="cuda", timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("residency selftest: error: --device cuda: ")
    assert proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--ranks", "0"), "argument --ranks: must be an integer from 1 to 64"),
    (("--out", "taken"), "--out taken: exists and is not an empty folder"),
    (("--inject-failure", "generic-telemetry"),
     "--inject-failure applies to cuda only: the emulated NPU's generic"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: tuple[str, ...],
                                         message: str) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    proc = _selftest(tmp_path, *args, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"residency selftest: error: {message}")
    assert proc.stderr.count("\n") == 1


def test_an_injected_failure_reaches_the_services_the_selftest_starts(tmp_path: Path) -> None:
    """`selftest --device cuda --inject-failure generic-telemetry`: the paired step's
    services (both arms' `serve`, which injects into the baseline only) carry it."""
    from residency.selftest.core import Context

    ctx = Context(kind="cuda", ranks=1, out=tmp_path, device_count=1,
                  inject_failure="generic-telemetry")
    command = ctx.service_spec().command
    assert command[command.index("--inject-failure") + 1] == "generic-telemetry"
    plain = Context(kind="cuda", ranks=1, out=tmp_path, device_count=1).service_spec()
    assert "--inject-failure" not in plain.command


# --- the profiler step's checks, in-process on written trace folders -------------------------

def _kineto(rank: int, *, markers: bool = True, kernels: bool = True) -> dict:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10 + i, "dur": 1, "pid": 0,
               "tid": 7} for i in range(3 if kernels else 0)]
    if markers:
        events += [{"ph": "X", "cat": "user_annotation", "name": name, "ts": 5, "dur": 20,
                    "pid": 1, "tid": 1} for name in ("residency.request",
                                                     "residency.release[normal]",
                                                     "residency.release[forced]")]
    if not kernels:
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 5, "dur": 20,
                       "pid": 1, "tid": 1})
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


def _write(trace: Path, docs: dict[str, object]) -> Path:
    for name, doc in docs.items():
        path = trace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return trace


def test_trace_check_passes_on_every_rank(tmp_path: Path) -> None:
    trace = _write(tmp_path / "trace", {"rank0.trace.json": _kineto(0),
                                        "rank1.trace.json": _kineto(1)})
    detail, data = check_trace_dir(trace, kind="emulated-npu", ranks=2)
    assert data["device_tasks"] == {"0": 3, "1": 3} and "on every rank" in detail


TRACE_FAULTS = [
    ("nothing", {}, "cuda", 1, "the profiler wrote nothing"),
    ("db-only", {"w_1_20260101_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db":
                 "SQLite", "w_1_20260101_ascend_pt/profiler_info_0.json": {}}, "npu", 1,
     "DB-only output"),
    ("truncated", {"rank0.trace.json": json.dumps(_kineto(0))[:50]}, "cuda", 1,
     "truncated JSON"),
    ("rank missing", {"rank0.trace.json": _kineto(0)}, "cuda", 2, "expected 0..1"),
    ("no device tasks", {"rank0.trace.json": _kineto(0, kernels=False)}, "cuda", 1,
     "has no device tasks"),
    ("no markers", {"rank0.trace.json": _kineto(0, markers=False)}, "cuda", 1,
     "markers ['residency.request'"),
    ("wrong format", {"rank0.trace.json": _kineto(0)}, "npu", 1, "expected ascend traces"),
]


@pytest.mark.parametrize(("case", "files", "kind", "ranks", "message"), TRACE_FAULTS,
                         ids=[c[0] for c in TRACE_FAULTS])
def test_trace_check_fails_with_a_hint(tmp_path: Path, case: str, files: dict, kind: str,
                                       ranks: int, message: str) -> None:
    trace = _write(tmp_path / "trace", files)
    trace.mkdir(exist_ok=True)
    with pytest.raises(CheckFailed) as info:
        check_trace_dir(trace, kind=kind, ranks=ranks)
    assert message in str(info.value) and info.value.hint


def test_a_step_that_raises_is_a_failed_result_with_the_step_hint(tmp_path: Path) -> None:
    ctx = Context(kind="cuda", ranks=1, out=tmp_path, device_count=1,
                  service_run=tmp_path / "missing-run")
    result = run_step("profiler", ctx)
    assert (result.status, result.error_type) == ("failed", "CheckFailed")
    assert "wrote nothing" in result.error and result.hint
    skipped = run_step("profiler", Context(kind="cuda", ranks=1, out=tmp_path, device_count=1))
    assert skipped.status == "skipped" and "service step" in skipped.detail


def test_report_json_and_lines() -> None:
    log = "\n".join(["[http] GET /health 503"] * 30 + [f"log line {i}" for i in range(20)])
    steps = (StepResult("environment", "passed", 0.5, "python 3"),
             StepResult("service", "failed", 1.0, "ExperimentError: boom",
                        error_type="ExperimentError", error="boom\n" + log, hint="look"),
             StepResult("profiler", "skipped", 0.0, "needs the service step"))
    report = Report("emulated-npu", 2, {"python": "3"}, steps)
    data = report.to_dict()
    assert data["status"] == "failed" and not report.ok
    assert set(data) >= {"device_kind", "environment", "steps"}
    assert data["steps"][0] == {"name": "environment", "status": "passed", "seconds": 0.5,
                                "detail": "python 3"}
    assert data["steps"][1]["hint"] == "look" and "hint" not in data["steps"][2]
    lines = report.lines()
    assert "emulated NPU — not an NPU measurement" in lines[0]  # devices.label, spelled once
    assert any(line.strip() == "hint: look" for line in lines)
    assert any(line.strip() == "ExperimentError: boom" for line in lines)
    # a log tail: its last lines without the access log, and how many were left out
    assert not any("[http]" in line for line in lines)
    assert [x.strip() for x in lines if x.strip().startswith("log line")] == [
        f"log line {i}" for i in range(8, 20)]
    assert any("(8 lines more in --json and the log)" in line for line in lines)
    assert lines[-1] == "failed: service"


# --- environment: versions from the toolkit's and the driver's own files --------------------

@pytest.mark.parametrize(("files", "version", "source"), [
    ({"x86_64-linux/ascend_toolkit_install.info":
      "package_name=Ascend-cann-toolkit\nversion=8.0.RC3\ninnerversion=V100R001C19\n"},
     "8.0.RC3", "x86_64-linux/ascend_toolkit_install.info"),
    ({"version.cfg": "# comment\nruntime_running_version=[8.0.0.0.1:8.0.RC3]\n"},
     "8.0.0.0.1:8.0.RC3", "version.cfg"),
    ({"compiler/version.info": "Version=7.0.0\n"}, "7.0.0", "compiler/version.info"),
    ({"version.cfg": "nothing here\n"}, None, None),
], ids=["install-info", "version-cfg", "compiler", "no-version"])
def test_cann_version_from_the_toolkit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            files: dict, version: str | None,
                                            source: str | None) -> None:
    from residency.selftest import environment

    _write(tmp_path / "toolkit", files)
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "toolkit"))
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.setattr(environment, "ASCEND_TOOLKIT_ROOTS", ())
    found = environment.cann_version()
    assert found == {"version": version,
                     "source": None if source is None else str(tmp_path / "toolkit" / source)}


def test_driver_versions_from_their_files(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from residency.selftest import environment

    npu, nvidia = tmp_path / "version.info", tmp_path / "nvidia-version"
    npu.write_text("Version=24.1.rc2\nascendhal_version=7.35.19\n")
    nvidia.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.03  Release "
                      "Build\nGCC version:  gcc version 12\n")
    monkeypatch.setattr(environment, "ASCEND_DRIVER_VERSION_FILE", npu)
    monkeypatch.setattr(environment, "NVIDIA_VERSION_FILE", nvidia)
    assert environment.driver_version("npu") == {"version": "24.1.rc2", "source": str(npu)}
    assert environment.driver_version("cuda") == {"version": "580.159.03",
                                                  "source": str(nvidia)}
    assert environment.driver_version("emulated-npu") == {"version": None, "source": None}
    # the open kernel module's line, as on the H200 that recorded data/runs/cuda-* (its
    # version was read as "for")
    nvidia.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
                      "Release Build  (dvs-builder@U22-I3-AF03-09-1)  Tue Oct 14 2025\n")
    assert environment.driver_version("cuda") == {"version": "580.159.04",
                                                  "source": str(nvidia)}
