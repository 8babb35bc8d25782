"""Service integrity and process lifecycle (issue 14, service half): every response carries
its own request's results, a timed-out or abandoned request is cancelled on every rank, idle
ranks never time out, listeners stay on loopback, bad input is refused in one line, and no
process outlives a killed `residency pair`."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from residency.experiments.errors import ServiceFileError
from residency.experiments.servicefile import load_service_file
from residency.protocol import MAX_SEED, MAX_STEPS
from residency.records.manifest import read_manifest
from residency.workload.admission import MAX_HANDLERS
from residency.workload.config import ServeConfig
from residency.workload.front import Service
from tests.servicekit import SMALL, alive, http, post_when_free, service

SERVE = [sys.executable, "-m", "residency", "serve"]


def _wait_for(predicate, what: str, limit_s: float = 120.0) -> None:
    """Poll `predicate` until true; a limit only so that a broken build cannot hang CI."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def _running(markers: Path, request_id: str, ranks: int = 2) -> bool:
    """True once every rank recorded a decision of `request_id` (it is past its prepare)."""
    files = [markers / f"decisions-rank{r}.jsonl" for r in range(ranks)]
    return all(p.exists() and f'"request_id":"{request_id}"' in p.read_text() for p in files)


def _tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# --- a live 2-rank service with --request-timeout 3 ---------------------------------------------

@pytest.mark.slow
def test_timeout_cancel_idle_and_own_results(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", "--request-timeout", "3",
                 *SMALL) as (proc, url, markers):
        # a request that cannot finish in 3 s: 504, cancelled on every rank
        code, body = http("POST", url + "/v1/generate", {"steps": MAX_STEPS, "seed": 1})
        assert code == 504 and body["request_id"] == "r0001", body
        # the next request gets its own results, never the late ones of r0001
        code, body = http("POST", url + "/v1/generate", {"steps": 1, "seed": 7})
        assert code == 200, body
        assert body["request_id"] == "r0002"
        assert [r["request_id"] for r in body["per_rank"]] == ["r0002", "r0002"]
        log = (tmp_path / "service.log").read_text()
        assert "discarded the late result of request r0001" in log
        assert "on every rank" in log  # it stopped at a step boundary, not after 10000 steps
        # idle for longer than the request timeout: ranks wait locally, not in a collective
        time.sleep(10)
        code, health = http("GET", url + "/health")
        assert code == 200 and health["status"] == "ok", health
        code, body = http("POST", url + "/v1/generate", {"steps": 2, "seed": 8})
        assert code == 200 and {r["request_id"] for r in body["per_rank"]} == {"r0003"}
        # every listener of the service and its ranks is on loopback (no TCPStore on *:PORT)
        listeners = []
        for pid in _tree(proc.pid):
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listeners.append((pid, conn.laddr.ip, conn.laddr.port))
        assert listeners and all(ip in ("127.0.0.1", "::1") for _, ip, _ in listeners), listeners
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_socket_limits_and_disconnect_cancels(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", *SMALL) as (proc, url, markers):
        host, port = url.removeprefix("http://").split(":")
        address = (host, int(port))

        def raw(request: bytes) -> bytes:
            with socket.create_connection(address, timeout=120) as s:
                s.sendall(request)
                return s.recv(65536)

        # Content-Length larger than the body: answered (408) once the read times out
        reply = raw(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                    b'{"steps":')
        assert reply.startswith(b"HTTP/1.1 408"), reply
        reply = raw(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
        assert reply.startswith(b"HTTP/1.1 400") and b"Content-Length" in reply, reply
        # a bounded handler pool: connections beyond MAX_HANDLERS are refused with 503
        idle = [socket.create_connection(address, timeout=60) for _ in range(MAX_HANDLERS)]
        try:
            reply = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 503") and b"too many connections" in reply
        finally:
            for s in idle:
                s.close()
        _wait_for(lambda: http("GET", url + "/health")[0] == 200, "free handler slots")
        # a client that disconnects: its request is cancelled, the next one runs at once
        body = json.dumps({"steps": MAX_STEPS, "seed": 1}).encode()
        s = socket.create_connection(address, timeout=60)
        s.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait_for(lambda: _running(markers, "r0001"), "r0001 to start")
        s.close()
        log = tmp_path / "service.log"
        _wait_for(lambda: "request r0001 client disconnected" in log.read_text(),
                  "the service to notice the disconnect")
        code, reply_body = post_when_free(url + "/v1/generate", {"steps": 1, "seed": 2},
                                          proc=proc)
        assert code == 200 and reply_body["request_id"] == "r0002", reply_body
        assert [r["request_id"] for r in reply_body["per_rank"]] == ["r0002", "r0002"]
        assert "discarded the late result of request r0001" in log.read_text()


KERNEL = """
import sys
from residency.experiments.designs import run_pair
run_pair("profiled-pair", out=sys.argv[1], device="emulated-npu", ranks=2, steps=3000,
         scale=0.02, resident_mib=256, progress=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["cli", "kernel"])
def test_kill_9_of_pair_leaves_no_process(tmp_path, launcher) -> None:
    """`residency pair`, or a Python process running a design as a notebook kernel would."""
    out = tmp_path / "run"
    argv = ([sys.executable, "-m", "residency", "pair", "--design", "profiled-pair",
             "--device", "emulated-npu", "--ranks", "2", "--steps", "3000", "--scale", "0.02",
             "--resident-mib", "256", "--out", str(out), "--no-progress"]
            if launcher == "cli" else [sys.executable, "-c", KERNEL, str(out)])
    pair = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        run = out / "runs" / "00-baseline"
        # the service is serving the arm's warm-up request (3000 steps) on both ranks
        _wait_for(lambda: _running(run, "warmup-0001"), "the warm-up request", limit_s=300)
        pids = _tree(pair.pid)
        assert len(pids) >= 4  # pair, the service, two ranks
        pair.kill()
        pair.wait(timeout=30)
        # nothing here kills them: they must go on their own (parent-death signal and the
        # parent watchdog). How fast is no test's business (a hang guard only): under load a
        # torch process takes its time to exit.
        _wait_for(lambda: not any(alive(p) for p in pids), "every process of the run to exit",
                  limit_s=300)
        manifest = read_manifest(out)
        assert manifest["status"] == "incomplete"
        # the orphaned service removed its TMPDIR and raw profiles (nobody else could)
        assert not (run / "tmp").exists() and not (run / "trace-raw").exists()
    finally:  # whatever happened, leave nothing behind
        for pid in [pair.pid, *pids]:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        pair.wait(timeout=30)


# --- the diagnosis of a killed rank, without timing luck -----------------------------------------

@dataclass
class _FakeProc:
    """A rank process whose exit status shows up only after `hidden` polls (the kernel's
    window between closing a killed rank's sockets and making it a zombie)."""

    code: int | None
    hidden: int = 0

    @property
    def exitcode(self) -> int | None:
        if self.hidden > 0:
            self.hidden -= 1
            return None
        return self.code

    def is_alive(self) -> bool:
        return self.exitcode is None


def test_killed_rank_is_named_even_when_the_survivor_reports_first(tmp_path) -> None:
    svc = Service(ServeConfig(arm="candidate", device_kind="emulated-npu", ranks=2,
                              decisions_dir=str(tmp_path)))
    svc.status = queue.Queue()
    svc.status.put({"rank": 0, "event": "error",
                    "error": "RuntimeError: [../gloo/transport/tcp/pair.cc] Read error"})
    svc.procs = [_FakeProc(1), _FakeProc(-signal.SIGKILL, hidden=5)]
    failure = svc.check_ranks()
    assert failure.startswith("rank 1 was killed by SIGKILL"), failure
    assert "rank 0 failed: RuntimeError" in failure


def test_a_survivor_error_alone_is_reported_after_the_grace(tmp_path) -> None:
    svc = Service(ServeConfig(arm="candidate", device_kind="emulated-npu", ranks=2,
                              decisions_dir=str(tmp_path)))
    svc.status = queue.Queue()
    svc.status.put({"rank": 0, "event": "error", "error": "ValueError: boom"})
    svc.procs = [_FakeProc(1), _FakeProc(None)]
    assert svc.check_ranks() == "rank 0 failed: ValueError: boom"


# --- bad input: one line, the right status -------------------------------------------------------

@pytest.mark.parametrize(("body", "field"), [
    ({"steps": 10**12}, "steps"), ({"steps": MAX_STEPS + 1}, "steps"), ({"steps": 1.0}, "steps"),
    ({"steps": 1, "seed": 2**64}, "seed"), ({"steps": 1, "seed": MAX_SEED + 1}, "seed"),
    ({"steps": 1, "seed": -1}, "seed"), ({"steps": True}, "steps"),
])
def test_request_bounds_are_400(tmp_path, body, field) -> None:
    svc = Service(ServeConfig(arm="candidate", device_kind="emulated-npu", ranks=1,
                              decisions_dir=str(tmp_path)))
    code, reply = svc.generate(body)
    assert code == 400 and f"`{field}`" in reply["error"]


@pytest.mark.parametrize(("option", "value"), [
    ("--scale", "nan"), ("--scale", "inf"), ("--resident-mib", "nan"),
    ("--request-timeout", "nan"), ("--request-timeout", "0"),
])
def test_serve_rejects_non_finite_options(tmp_path, option, value) -> None:
    proc = subprocess.run([*SERVE, "--arm", "candidate", "--device", "emulated-npu",
                           "--decisions-dir", str(tmp_path / "m"), option, value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"residency serve: error: {option}")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()


SERVICE_TOML = """
device_kind = "emulated-npu"
ranks = 1
[serve]
command = ["true"]
{serve_extra}
[health]
url = "http://127.0.0.1:{{port}}/health"
{health_extra}
[request]
url = "http://127.0.0.1:{{port}}/v1/generate"
{request_extra}
"""


@pytest.mark.parametrize(("where", "line", "field"), [
    ("request", "timeout_s = nan", "request.timeout_s"),
    ("request", "timeout_s = inf", "request.timeout_s"),
    ("request", "timeout_s = -1", "request.timeout_s"),
    ("request", 'timeout_s = "10"', "request.timeout_s"),
    ("health", "timeout_s = nan", "health.timeout_s"),
    ("serve", 'env = "X"', "serve.env"),
    ("serve", "env = { A = [1] }", "serve.env.A"),
    ("request", "json = { steps = nan }", "request.json.steps"),
    ("request", "form = { a = { b = 1 } }", "request.form.a"),
    ("request", "method = 1", "request.method"),
])
def test_service_file_fields_are_checked(tmp_path, where, line, field) -> None:
    extra = {"serve_extra": "", "health_extra": "", "request_extra": ""}
    extra[f"{where}_extra"] = line
    path = tmp_path / "svc.toml"
    path.write_text(SERVICE_TOML.format(**extra))
    with pytest.raises(ServiceFileError, match=f"`{field}`") as info:
        load_service_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"steps": MAX_STEPS + 1}, "steps"), ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"),
    ({"scale": float("nan")}, "scale"), ({"resident_mib": float("inf")}, "resident_mib"),
])
def test_pair_checks_builtin_bounds_before_starting(tmp_path, kwargs, name) -> None:
    from residency.experiments.designs import run_pair

    with pytest.raises(ValueError, match=f"`{name}`"):
        run_pair(out=tmp_path / "run", device="emulated-npu", progress=False, **kwargs)
    assert not (tmp_path / "run").exists()


def test_pair_with_a_directory_as_service_file_is_exit_2(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "residency", "pair", "--service",
                           str(tmp_path), "--out", str(tmp_path / "run"), "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"residency pair: error: {tmp_path}: is a directory, not a service " \
                          "file\n"
