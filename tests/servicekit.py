"""Start `residency serve` as a real subprocess for tests, and talk to it over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from residency.records import decisions as decisions_format

SMALL = ["--scale", "0.02", "--resident-mib", "256"]


def http(method: str, url: str, body: object | bytes | None = None, timeout: float = 120
         ) -> tuple[int, dict]:
    """(status, JSON body) of one request; HTTP errors are returned, not raised."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@contextmanager
def service(tmp: Path, *args: str, ready_timeout: float = 240):
    """Yield (process, base_url, markers_dir); always stops the process group."""
    markers = tmp / "markers"
    cmd = [sys.executable, "-m", "residency", "serve", "--device", "emulated-npu",
           "--port", "0", "--decisions-dir", str(markers), *args]
    log = open(tmp / "service.log", "w")  # noqa: SIM115
    service_tmp = tmp / "service-tmp"  # its rendezvous directory outlives a SIGKILL
    service_tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True,
                            env={**os.environ, "TMPDIR": str(service_tmp)})
    try:
        deadline = time.monotonic() + ready_timeout
        url = None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        if url is None:
            raise AssertionError(f"service did not start:\n{(tmp / 'service.log').read_text()}")
        yield proc, url, markers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


def wait_for(condition: Callable[[], bool], *, what: str,
             proc: subprocess.Popen | None = None, thread: threading.Thread | None = None,
             hang_guard_s: float = 300.0) -> None:
    """Return once `condition()` holds. Fail naming `what` as soon as `proc` exits or
    `thread` ends without it; `hang_guard_s` only stops a hung test, it is no speed check."""
    give_up = time.monotonic() + hang_guard_s
    while not condition():
        if thread is not None and not thread.is_alive() and not condition():
            raise AssertionError(f"{what}: never happened; the request ended first")
        if proc is None:
            time.sleep(0.05)
        else:
            try:
                code = proc.wait(timeout=0.05)  # wakes at once when the process exits
            except subprocess.TimeoutExpired:
                pass
            else:
                if not condition():
                    raise AssertionError(f"{what}: never happened; the process exited with "
                                         f"code {code} first")
        if time.monotonic() > give_up:
            raise AssertionError(f"{what}: still not seen after {hang_guard_s:g} s while "
                                 "everything kept running (hung: a guard, not a speed check)")


def post_when_free(url: str, body: object, *, proc: subprocess.Popen | None = None
                   ) -> tuple[int, dict]:
    """POST `body` to `url`, again while the service answers 429 (a cancelled request is
    still releasing the service: no sleep that hopes it is done). A 429 never counts as a
    request, so the answer is the first request the service ran after the busy one."""
    reply: list[tuple[int, dict]] = []

    def answered() -> bool:
        reply[:] = [http("POST", url, body)]
        return reply[0][0] != 429

    wait_for(answered, what=f"POST {url} answered with something else than 429", proc=proc)
    return reply[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def decisions(markers: Path) -> dict[int, list[dict]]:
    out = {}
    for path in sorted(markers.glob(decisions_format.DECISIONS_GLOB)):
        (rank,) = {r for r in range(1024) if path.name == decisions_format.decisions_file(r)}
        out[rank] = decisions_format.read_records(path)
    return out
