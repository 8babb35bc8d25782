"""A service's process lifecycle: started in its own process group with its TMPDIR and log,
waited for until healthy (`start_service`), stopped with its whole group (`RunningService`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from residency.experiments.errors import ExperimentError, ServiceFileError
from residency.experiments.httpclient import fill, http_request, reported_versions
from residency.experiments.servicefile import ServiceSpec
from residency.processes import PARENT_PID_ENV, SCRATCH_ENV, free_port, pdeathsig_preexec
from residency.rundir.layout import SERVICE_LOG, TRACE, TRACE_RAW

STOP_GRACE_S = 30.0
SERVICE_TMP = "tmp"  # the built-in service's TMPDIR inside its run directory, while it runs


@dataclass
class RunningService:
    """A started service process group and its filled-in values."""

    proc: subprocess.Popen[bytes]
    values: dict[str, Any]
    log_path: Path
    versions: dict[str, Any] | None = None  # what the service reported at `version_url`
    tmp_dir: Path | None = None  # the service's TMPDIR, removed by `stop`

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the whole group, SIGKILL after `grace_s`; returns the exit code."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.tmp_dir is not None:  # what a killed service could not remove itself
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return self.proc.returncode


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start_service(spec: ServiceSpec, arm: str, run_dir: Path, *, profiled: bool
                  ) -> RunningService:
    """Start the arm's service in its own process group and wait until it is healthy."""
    port = free_port()
    profile_dir = run_dir / (TRACE_RAW if spec.builtin else TRACE)
    values: dict[str, Any] = {
        "port": port, "arm": arm, "decisions_dir": str(run_dir), "python": sys.executable,
        "profile_dir": str(profile_dir) if profiled else "",
        "profiler_config": json.dumps({"profiler": "torch",
                                       "torch_profiler_dir": str(profile_dir)}),
    }
    command = [str(c) for c in fill(list(spec.command), values)]
    if spec.builtin:
        command = [c for c in command if c != "{profile_flag}"]
        if profiled:
            command += ["--profile", str(profile_dir)]
    env = {**os.environ, **{k: str(v) for k, v in fill(spec.env, values).items()},
           PARENT_PID_ENV: str(os.getpid())}
    _check_command(spec, command[0], env)
    log_path = run_dir / SERVICE_LOG
    tmp_dir = None
    if spec.builtin:  # its temporary files (the rendezvous) go where `stop` removes them
        tmp_dir = run_dir / SERVICE_TMP
        tmp_dir.mkdir()
        env["TMPDIR"] = str(tmp_dir)
        # what the service removes itself when we are gone (killed: we cannot)
        env[SCRATCH_ENV] = os.pathsep.join([str(tmp_dir), *([str(profile_dir)] if profiled
                                                           else [])])
    try:
        with open(log_path, "wb") as log:
            # the service dies with us (SIGTERM from the kernel when this process is killed,
            # even by SIGKILL), and the built-in one also watches our pid: no orphans
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=spec.cwd, start_new_session=True,
                                    preexec_fn=pdeathsig_preexec(signal.SIGTERM))
    except BaseException:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    service = RunningService(proc, values, log_path, tmp_dir=tmp_dir)
    try:
        _wait_healthy(spec, service)
        if spec.version_url:
            service.versions = reported_versions(fill(spec.version_url, values))
    except BaseException:
        service.stop(grace_s=5)
        raise
    return service


def _check_command(spec: ServiceSpec, executable: str, env: dict[str, str]) -> None:
    """Refuse a `serve.command` whose program cannot be found (before anything starts)."""
    if os.sep in executable:
        path = Path(spec.cwd) / executable
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(executable, path=env.get("PATH")) is not None
    if not found:
        where = spec.source or spec.name
        raise ServiceFileError(f"{where}: field `serve.command` names {executable!r}, which is "
                               "not an executable file on the service's PATH (or relative to "
                               f"its cwd {spec.cwd}); install it or give its absolute path")


def _wait_healthy(spec: ServiceSpec, service: RunningService) -> None:
    url = fill(spec.health_url, service.values)
    deadline = time.monotonic() + spec.health_timeout_s
    while True:
        code = service.proc.poll()
        if code is not None:
            raise ExperimentError(f"service exited with code {code} before it was healthy; "
                                  f"log tail:\n{service.log_tail()}")
        try:
            status, _ = http_request("GET", url, timeout=5)
            if status == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ExperimentError(f"service not healthy at {url} after "
                                  f"{spec.health_timeout_s:g} s; log tail:\n{service.log_tail()}")
        time.sleep(0.25)
