"""Paired designs against the built-in service (emulated NPU) and an external service file."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from residency.experiments.designs import aa_slots, plan, run_design, run_pair
from residency.experiments.errors import ExperimentError
from residency.experiments.lifecycle import start_service
from residency.experiments.servicefile import builtin_service, load_service_file
from residency.records import client as client_record
from residency.records import decisions as decisions_format
from residency.records.decisions import decisions_file
from tests.helpers import read_manifest
from tests.servicekit import alive

pytestmark = pytest.mark.slow
SMALL = {"scale": 0.02, "resident_mib": 256}


def test_plan_orders() -> None:
    assert plan("profiled-pair", 1) == [("baseline", True), ("candidate", True)]
    assert [a for a, _ in plan("alternating", 2)] == ["baseline", "candidate", "candidate",
                                                       "baseline"]
    assert [a for a, p in plan("paired-profile", 1)] == ["baseline", "candidate", "baseline",
                                                          "candidate"]
    assert [p for _, p in plan("paired-profile", 1)] == [True, True, False, False]
    assert plan("paired-profile", 0) == plan("profiled-pair", 1)
    assert plan("consecutive") == [("candidate", False)]
    with pytest.raises(ValueError, match="design"):
        plan("interleaved", 2)
    with pytest.raises(ValueError, match="pairs"):
        plan("alternating", 0)
    assert plan("aa", 2) == [("candidate", False)] * 4
    assert plan("aa", 1, aa_arm="baseline") == [("baseline", False)] * 2
    assert aa_slots(3) == ["A", "B", "B", "A", "A", "B"]
    with pytest.raises(ValueError, match="aa_arm"):
        plan("aa", 1, aa_arm="always-release")


def test_aa_design_with_requests_per_run_records_every_request(tmp_path) -> None:
    """A/A: the same arm in both slots (ABBA), R requests per service run after its warm-up,
    every request recorded, the run's E2E their median; the device model is in the params."""
    from residency.emulated import DeviceModel

    out = run_pair("aa", out=tmp_path / "aa", device="emulated-npu", ranks=2, steps=2,
                   pairs=2, requests=3, progress=False, **SMALL)
    m = read_manifest(out)
    assert m["status"] == "complete" and m["design"] == "aa"
    assert [(r["arm"], r["slot"]) for r in m["runs"]] == [
        ("candidate", "A"), ("candidate", "B"), ("candidate", "B"), ("candidate", "A")]
    assert m["params"]["emulated_npu"] == {**DeviceModel().to_params(),
                                           "capacity_bytes": 4 * 1024**3}
    assert m["params"]["emulated_npu"]["compute"] == "modelled"
    for entry in m["runs"]:
        client = client_record.read_raw(out / entry["dir"] / client_record.CLIENT)
        e2es = [r["e2e_s"] for r in client["requests"]]
        assert len(e2es) == 3 and entry["e2e_s_requests"] == e2es
        assert entry["e2e_s"] == sorted(e2es)[1] == client["median_e2e_s"]  # the run's median
        assert [r["request_id"] for r in client["requests"]] == entry["request_ids"]
        # issue 25: no single request_id beside the median of three requests
        assert "request_id" not in entry
        # issue 25: the host's load at the start and end of each service run
        load = entry["host_load"]
        assert load["start"]["cpu_count"] == load["end"]["cpu_count"] == os.cpu_count()
        assert len(load["start"]["loadavg"]) == 3 and load["seconds"] > 0
        assert load["other_cpu_share"] is None or 0 <= load["other_cpu_share"] <= 1
    assert m["host_load"]["runs"] == 4 and m["host_load"]["start"] == m["runs"][0][
        "host_load"]["start"]


def test_consecutive_requests_on_one_candidate_service(tmp_path) -> None:
    out = run_pair("consecutive", out=tmp_path / "c", device="emulated-npu", ranks=2, steps=2,
                   requests=3, progress=False, **SMALL)
    m = read_manifest(out)
    assert m["status"] == "complete" and m["params"]["requests"] == 3
    (entry,) = m["runs"]
    assert entry["arm"] == "candidate" and len(entry["request_ids"]) == 3
    client = client_record.read_raw(out / entry["dir"] / client_record.CLIENT)
    assert [r["request_id"] for r in client["requests"]] == entry["request_ids"]
    for rank in (0, 1):
        rows = decisions_format.read_records(
            out / entry["dir"] / decisions_format.decisions_file(rank))
        measured = [r for r in rows if r["request_id"] in entry["request_ids"]]
        assert sorted(r["kind"] for r in measured) == ["forced"] * 6 + ["normal"] * 3


def test_profiled_pair_and_alternating_complete(tmp_path) -> None:
    out = run_pair("profiled-pair", out=tmp_path / "pp", device="emulated-npu", ranks=2,
                   steps=2, progress=False, **SMALL)
    m = read_manifest(out)
    assert m["status"] == "complete" and m["device_kind"] == "emulated-npu"
    assert [(r["arm"], r["profiled"]) for r in m["runs"]] == [("baseline", True),
                                                              ("candidate", True)]
    for r in m["runs"]:
        d = out / r["dir"]
        assert sorted(p.name for p in (d / "trace").iterdir()) == ["rank0.trace.json",
                                                                  "rank1.trace.json"]
        assert (d / decisions_file(0)).exists() and (d / "service.log").exists()
        client = client_record.read_raw(d / client_record.CLIENT)
        (request,) = client["requests"]  # client.json layout 2: one record per request
        assert request["request_id"] == r["request_id"] and client["median_e2e_s"] > 0
        assert client["warmup"]["request_id"].startswith("warmup-")
    assert set(m["artifacts"]) >= {"runs/00-baseline/client.json"}
    alt = run_pair("alternating", out=tmp_path / "alt", device="emulated-npu", ranks=2,
                   steps=2, pairs=2, progress=False, **SMALL)
    m = read_manifest(alt)
    assert m["status"] == "complete" and m["order"] == ["baseline", "candidate", "candidate",
                                                        "baseline"]
    assert len(m["runs"]) == 4 and not any(r["profiled"] for r in m["runs"])


def test_pair_under_the_vllm_ascend_patch_records_the_second_querys_error(tmp_path) -> None:
    """`residency pair --accelerator-patch vllm-ascend`: the baseline's normal calls fail on
    memory_allocated after memory_reserved answered (as inside a real vLLM-Omni process on
    Ascend), the candidate still retains, and the API notebook reads that sequence back."""
    import subprocess

    from residency import notebook as nb
    from residency.rundir.run import load_run

    out = tmp_path / "patched"
    proc = subprocess.run(
        [sys.executable, "-m", "residency", "pair", "--design", "alternating",
         "--pairs", "1", "--device", "emulated-npu", "--ranks", "2", "--steps", "2",
         "--scale", "0.02", "--resident-mib", "256", "--no-progress", "--out", str(out),
         "--accelerator-patch", "vllm-ascend"], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent)})
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(out)
    assert m["params"]["emulated_npu"]["accelerator_patch"] == "vllm-ascend"
    normal = {}
    for entry in m["runs"]:
        rows = decisions_format.read_records(
            out / entry["dir"] / decisions_format.decisions_file(0))
        normal[entry["arm"]] = [r for r in rows if r["kind"] == "normal"]
    assert normal["baseline"] and all(
        r["reason"] == "telemetry-unavailable"
        and r["error"].endswith("not a DeviceAllocator. [query: "
                                "torch.accelerator.memory_allocated]")
        for r in normal["baseline"]), normal["baseline"][0]["error"]
    assert {r["outcome"] for r in normal["candidate"]} == {"retained"}
    entry = nb.api_from_run(load_run(out))
    assert entry["accelerator_patch"] == "vllm-ascend" and entry["bug_present"] is True
    assert entry["generic"]["reserved"]["ok"] is True
    assert entry["generic"]["allocated"]["ok"] is False


def test_a_sigkilled_builtin_service_leaves_no_temporary_directory(tmp_path,
                                                                   monkeypatch) -> None:
    """The service's rendezvous directory lives in its run directory's `tmp/` (its TMPDIR),
    which the launcher removes after the process group is gone, even after a SIGKILL that
    the service itself cannot clean up after."""
    system_tmp = tmp_path / "system-tmp"  # stands in for /tmp
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    spec = builtin_service(device_kind="emulated-npu", ranks=2, **SMALL)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    service = start_service(spec, "candidate", run_dir, profiled=False)
    try:
        rendezvous = list((run_dir / "tmp").glob("residency-rdzv-*"))
        assert len(rendezvous) == 1, sorted(p.name for p in run_dir.iterdir())
        os.killpg(service.proc.pid, signal.SIGKILL)
        service.proc.wait(timeout=60)
        assert rendezvous[0].is_dir()  # the killed service left it behind
    finally:
        service.stop()
    assert not (run_dir / "tmp").exists()
    assert list(system_tmp.iterdir()) == []


def test_external_service_file_runs_the_builtin_as_stand_in(tmp_path) -> None:
    service_file = tmp_path / "builtin.toml"
    service_file.write_text(f"""
name = "stand-in"
device_kind = "emulated-npu"
ranks = 2
[serve]
command = ["{sys.executable}", "-m", "residency", "serve", "--arm", "{{arm}}",
           "--device", "emulated-npu", "--ranks", "2", "--port", "{{port}}",
           "--decisions-dir", "{{decisions_dir}}", "--scale", "0.02", "--resident-mib", "256"]
env = {{ RESIDENCY_ARM = "{{arm}}" }}
[health]
url = "http://127.0.0.1:{{port}}/health"
timeout_s = 240
[request]
method = "POST"
url = "http://127.0.0.1:{{port}}/v1/generate"
json = {{ steps = "{{steps}}", seed = "{{seed}}" }}
timeout_s = 300
""")
    out = run_pair("alternating", out=tmp_path / "ext", service_file=service_file, steps=2,
                   pairs=1, progress=False)
    m = read_manifest(out)
    assert m["status"] == "complete" and m["service"] == "external"
    assert [r["arm"] for r in m["runs"]] == ["baseline", "candidate"]
    for r in m["runs"]:
        rows = decisions_format.read_records(out / r["dir"] / decisions_format.decisions_file(1))
        assert any(x["arm"] == r["arm"] for x in rows)


def test_service_never_healthy_fails_with_log_tail(tmp_path) -> None:
    service_file = tmp_path / "stuck.toml"
    service_file.write_text(f"""
device_kind = "emulated-npu"
ranks = 1
[serve]
command = ["{sys.executable}", "-c",
           "import time; print('booting forever', flush=True); time.sleep(600)"]
[health]
url = "http://127.0.0.1:{{port}}/health"
timeout_s = 2
[request]
url = "http://127.0.0.1:{{port}}/v1/generate"
json = {{ steps = 1 }}
""")
    with pytest.raises(ExperimentError, match="(?s)not healthy.*booting forever"):
        run_pair("profiled-pair", out=tmp_path / "stuck", service_file=service_file,
                 progress=False)
    m = read_manifest(tmp_path / "stuck")
    assert m["status"] == "incomplete" and "not healthy" in m["error"]


def test_killing_the_service_mid_run_marks_incomplete(tmp_path) -> None:
    spec = builtin_service(device_kind="emulated-npu", ranks=2, scale=0.02, resident_mib=256)
    out = tmp_path / "killed"
    killed: list[int] = []

    def killer() -> None:  # kill a service group once it has served a request (mid-run)
        deadline = time.monotonic() + 240  # only ends a hung test; not a speed check
        while time.monotonic() < deadline:
            for decisions in out.glob("runs/*/decisions-rank*.jsonl"):
                pids = _service_pids(decisions.parent)
                if pids:
                    os.killpg(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=killer)
    thread.start()
    with pytest.raises(ExperimentError):
        run_design("profiled-pair", out, spec=spec, steps=300, progress=False)
    thread.join()
    m = read_manifest(out)
    assert m["status"] == "incomplete" and m["error"]
    assert killed and not alive(killed[0])
    # a SIGKILLed service removes nothing: `residency pair` removed its scratch folders
    assert not list(out.glob("runs/*/tmp")) and not list(out.glob("runs/*/trace-raw"))


def _service_pids(run_dir: Path) -> list[int]:
    """pid of the service whose process group writes into `run_dir` (from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(run_dir).encode() in cmd:
            pids.append(int(proc.name))
    return pids


def test_service_file_errors_name_the_field(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('device_kind = "npu"\nranks = 8\n[serve]\n[health]\nurl = "x"\n[request]\n'
                   'url = "y"\n')
    with pytest.raises(ExperimentError, match="serve.command"):
        load_service_file(bad)
    with pytest.raises(ExperimentError, match="not found"):
        load_service_file(tmp_path / "missing.toml")


def test_existing_nonempty_out_is_refused(tmp_path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("evidence")
    spec = builtin_service(device_kind="emulated-npu", ranks=1)
    with pytest.raises(ExperimentError, match="not empty"):
        run_design("profiled-pair", tmp_path / "x", spec=spec, progress=False)
    assert (tmp_path / "x" / "keep.txt").read_text() == "evidence"
