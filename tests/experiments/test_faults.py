"""Fault injection across service and orchestration: each fault ends with a clear message,
no orphan process, and the run marked `incomplete`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from residency.experiments.designs import run_pair
from residency.experiments.errors import ExperimentError
from residency.protocol import MAX_STEPS
from residency.records.decisions import decisions_file, last_request_id
from tests.helpers import read_manifest
from tests.servicekit import SMALL, alive, http, service, wait_for

pytestmark = pytest.mark.slow
HANGING_SERVER = r"""
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def do_POST(self):
        time.sleep(600)          # answers /health, never finishes a request
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _pids_with(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return [p for p in pids if alive(p)]


def test_rank_killed_mid_request(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", *SMALL) as (proc, url,
                                                                          markers):
        pids = http("GET", url + "/health")[1]["rank_pids"]
        result = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "r", http("POST", url + "/v1/generate", {"steps": MAX_STEPS, "seed": 1})))
        t.start()
        # mid-request: both ranks have recorded a decision of r0001 (no sleep to hope for it)
        wait_for(lambda: all('"request_id":"r0001"' in (p.read_text() if p.exists() else "")
                             for p in (markers / f"decisions-rank{r}.jsonl" for r in (0, 1))),
                 what="both ranks recording a decision of request r0001", proc=proc, thread=t)
        os.kill(pids[1], signal.SIGKILL)
        t.join(timeout=60)
        code, body = result["r"]
        # the dead rank is the cause named first, whatever error the survivor reported
        assert code == 503 and body["error"].startswith("rank 1 was killed by SIGKILL"), body
        assert proc.wait(timeout=60) != 0
        assert not any(alive(p) for p in pids)


def test_port_already_taken(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "residency", "serve", "--arm",
                               "candidate", "--device", "emulated-npu", "--ranks", "1",
                               "--port", str(port), "--decisions-dir", str(tmp_path / "m")],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unwritable_output_directory(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    with pytest.raises(ExperimentError, match="cannot write the run directory"):
        run_pair("profiled-pair", out=blocker / "run", device="emulated-npu", progress=False)
    proc = subprocess.run([sys.executable, "-m", "residency", "pair", "--device",
                           "emulated-npu", "--out", str(blocker / "run"), "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    # bad input (README: an unusable output directory): exit 2, one line, no traceback
    assert proc.returncode == 2 and "cannot write the run directory" in proc.stderr
    assert proc.stderr.startswith("residency pair: error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_full_output_directory(tmp_path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tiny tmpfs here (needs root and mount rights)")
    try:
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        (mnt / "filler").write_bytes(b"\0" * (free - 8192))  # leave room for the manifest
        with pytest.raises(ExperimentError, match="No space left on device"):
            run_pair("profiled-pair", out=mnt / "run", device="emulated-npu", ranks=1,
                     steps=2, progress=False, **{"scale": 0.02, "resident_mib": 256})
        assert read_manifest(mnt / "run")["status"] == "incomplete"
        assert not _pids_with(str(mnt / "run"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_service_that_never_finishes_a_request(tmp_path) -> None:
    server = tmp_path / "hang.py"
    server.write_text(HANGING_SERVER)
    spec = tmp_path / "hang.toml"
    spec.write_text(f"""
device_kind = "emulated-npu"
ranks = 1
[serve]
command = ["{sys.executable}", "{server}", "{{port}}"]
[health]
url = "http://127.0.0.1:{{port}}/health"
timeout_s = 30
[request]
url = "http://127.0.0.1:{{port}}/v1/generate"
json = {{ steps = 1 }}
timeout_s = 2
""")
    with pytest.raises(ExperimentError, match="timed out"):
        run_pair("profiled-pair", out=tmp_path / "run", service_file=spec, progress=False)
    assert read_manifest(tmp_path / "run")["status"] == "incomplete"
    assert not _pids_with(str(server))


def test_sigterm_during_profiling(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "residency", "pair", "--design", "profiled-pair",
         "--device", "emulated-npu", "--ranks", "2", "--steps", "3000", "--scale", "0.02",
         "--resident-mib", "256", "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    decisions = out / "runs" / "00-baseline" / decisions_file(0)

    def measured_request_running() -> bool:  # past warm-up: a measured request's decision
        rid = last_request_id(decisions)  # (whole lines only)
        return bool(rid) and not rid.startswith("warmup-")

    wait_for(measured_request_running, what="the baseline's measured, profiled request",
             proc=proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err
    m = read_manifest(out)
    # recorded as the signal it was (before: "KeyboardInterrupt: ")
    assert m["status"] == "incomplete" and m["error"] == "SIGTERM received", m["error"]
    assert not list(out.glob("runs/*/tmp")) and not list(out.glob("runs/*/trace-raw"))
    assert not _pids_with(str(out))
