"""Paired designs: isolated baseline/candidate arms, warmed, measured and stopped one at a time,
for the built-in service or an external one described by a TOML service file.

Data flow: service -> run directory (`docs/contracts.md`): manifest.json, and per measured run
`client.json`, `service.log`, decisions JSONL per rank and traces per rank when profiled.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport the standard module came from (same API)
    import tomli as tomllib

from residency.devices import KINDS
from residency.errors import BadInput, RunFailed
from residency.jsonio import write_json_atomic
from residency.policy.cache import BASELINE, CANDIDATE, PAIRED_ARMS
from residency.processes import (
    PARENT_PID_ENV,
    SCRATCH_ENV,
    free_port,
    interruption,
    pdeathsig_preexec,
)
from residency.rundir import hostload, neighbours
from residency.rundir.layout import (
    CLIENT,
    DECISIONS_GLOB,
    DESIGNS,
    SERVICE_LOG,
    TRACE,
    TRACE_RAW,
)
from residency.rundir.layout import run_dir as run_dir_name
from residency.rundir.run import CLIENT_LAYOUT, Manifest, versions

STOP_GRACE_S = 30.0
SERVICE_TMP = "tmp"  # the built-in service's TMPDIR inside its run directory, while it runs
BUILTIN_EXPECT = {"normal_per_request": 1, "forced_per_request": 2}
"""Policy calls per rank per measured request of the built-in service (and H3 Ref2VA)."""


class ExperimentError(RunFailed):
    """A paired run could not finish; the run directory is left marked `incomplete`."""


class ExperimentInputError(ExperimentError, BadInput):
    """Bad input found before anything ran: an output directory that cannot be used, or a
    service file that cannot be read (`ServiceFileError`); the CLI exits 2."""


@dataclass(frozen=True)
class ServiceSpec:
    """How to start one arm's service and measure one request on it (strings are templates
    with `{port}`, `{arm}`, `{profile_dir}`, `{profiler_config}`, `{decisions_dir}`,
    `{python}` (this interpreter), `{steps}`, `{seed}`)."""

    name: str
    device_kind: str
    ranks: int
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "."
    health_url: str = "http://127.0.0.1:{port}/health"
    health_timeout_s: float = 600.0
    method: str = "POST"
    url: str = "http://127.0.0.1:{port}/v1/generate"
    json_body: dict[str, Any] | None = None
    form: dict[str, str] | None = None
    files: dict[str, str] | None = None
    request_timeout_s: float = 3600.0
    profile_start_url: str | None = None
    profile_stop_url: str | None = None
    profile_stop_timeout_s: float = 1800.0
    traces: str = "{profile_dir}"
    decisions: str = "{decisions_dir}"
    builtin: bool = False
    warmup_json: dict[str, Any] | None = None
    version_url: str | None = None
    source: str | None = None  # the service file this spec was read from
    expect: dict[str, int] | None = None  # policy calls per rank per measured request


def builtin_service(*, device_kind: str, ranks: int, scale: float = 1.0,
                    capacity_bytes: int | None = None, resident_mib: float = 1024,
                    health_timeout_s: float = 600.0,
                    emulator: dict[str, Any] | None = None, inject_failure: str = "none",
                    accelerator_patch: str = "none",
                    resident_on_device: bool = False) -> ServiceSpec:
    """The spec of `residency serve` for these parameters. `emulator` (the emulated NPU's
    `DeviceModel.to_params()`) reaches the service's ranks in the environment;
    `inject_failure` (with `accelerator_patch`) is passed to every arm's service, which
    injects it into the baseline arm only."""
    command = [sys.executable, "-m", "residency", "serve", "--arm", "{arm}", "--device",
               device_kind, "--ranks", str(ranks), "--port", "{port}", "--decisions-dir",
               "{decisions_dir}", "--scale", repr(scale), "--resident-mib", repr(resident_mib),
               "{profile_flag}"]
    if capacity_bytes is not None:
        command += ["--capacity", str(capacity_bytes)]
    if resident_on_device:
        command += ["--resident-on-device"]
    if inject_failure != "none":
        command += ["--inject-failure", inject_failure, "--accelerator-patch",
                    accelerator_patch]
    env = {}
    if emulator is not None:
        env["RESIDENCY_EMULATED_NPU"] = json.dumps(emulator, sort_keys=True)
    return ServiceSpec(
        name="residency-builtin", device_kind=device_kind, ranks=ranks, command=tuple(command),
        env=env, json_body={"steps": "{steps}", "seed": "{seed}"},
        warmup_json={"steps": "{steps}", "seed": "{seed}", "warmup": True},
        health_timeout_s=health_timeout_s, builtin=True, expect=dict(BUILTIN_EXPECT))


class ServiceFileError(ExperimentInputError):
    """A service TOML file is unreadable or invalid (bad input: `residency pair` exits 2)."""


def load_service_file(path: str | os.PathLike[str]) -> ServiceSpec:
    """A `ServiceSpec` from a TOML service file; errors name the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServiceFileError(f"{path}: service file not found") from None
    except IsADirectoryError:
        raise ServiceFileError(f"{path}: is a directory, not a service file") from None
    except OSError as exc:
        raise ServiceFileError(f"{path}: cannot read the service file: "
                               f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ServiceFileError(f"{path}: not UTF-8 text: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ServiceFileError(f"{path}: invalid TOML: {exc}") from None

    def need(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if key not in table:
            raise ServiceFileError(f"{path}: missing field `{where}{key}`")
        return check(table, key, kind, where)

    def check(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
              default: Any = None) -> Any:
        value = table.get(key, default)
        if value is None:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            names = kind if isinstance(kind, tuple) else (kind,)
            raise ServiceFileError(f"{path}: field `{where}{key}` must be "
                                   f"{' or '.join(_TOML_TYPES[k] for k in names)}, "
                                   f"not {_TOML_TYPES.get(type(value), type(value).__name__)}")
        return value

    def seconds(table: dict[str, Any], key: str, where: str, default: float) -> float:
        value = float(check(table, key, (int, float), where, default))
        if not math.isfinite(value) or value <= 0:
            raise ServiceFileError(f"{path}: field `{where}{key}` must be a positive finite "
                                   f"number of seconds, not {value}")
        return value

    def strings(table: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
        value = check(table, key, dict, where)
        for k, v in (value or {}).items():
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise ServiceFileError(f"{path}: field `{where}{key}.{k}` must be a string "
                                       "or a number")
            if isinstance(v, float) and not math.isfinite(v):
                raise ServiceFileError(f"{path}: field `{where}{key}.{k}` must be finite, "
                                       f"not {v}")
        return value

    serve = need(data, "serve", dict, "")
    health = need(data, "health", dict, "")
    request = need(data, "request", dict, "")
    profile = check(data, "profile", dict, "", {})
    kind = need(data, "device_kind", str, "")
    if kind not in KINDS:
        raise ServiceFileError(f"{path}: field `device_kind` must be npu, cuda or "
                               f"emulated-npu, not {kind!r}")
    ranks = need(data, "ranks", int, "")
    if ranks < 1:
        raise ServiceFileError(f"{path}: field `ranks` must be >= 1, not {ranks}")
    command = need(serve, "command", list, "serve.")
    if not command or not all(isinstance(c, (str, int)) for c in command):
        raise ServiceFileError(f"{path}: field `serve.command` must be a non-empty list of "
                               "strings")
    json_body = check(request, "json", dict, "request.")
    if json_body is not None:
        _check_finite(json_body, f"{path}: field `request.json")
    expect = data.get("expect", {})
    if not isinstance(expect, dict) or not all(
            k in BUILTIN_EXPECT and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in expect.items()):
        raise ServiceFileError(f"{path}: field `expect` must be a table of "
                               f"{' and '.join(BUILTIN_EXPECT)} (integers >= 0)")
    version_url = health.get("version_url")
    if version_url is not None and not isinstance(version_url, str):
        raise ServiceFileError(f"{path}: field `health.version_url` must be a string")
    base = path.parent
    files = {k: str((base / v).resolve())
             for k, v in (strings(request, "files", "request.") or {}).items()}
    return ServiceSpec(
        name=str(check(data, "name", str, "", path.stem)), device_kind=kind, ranks=ranks,
        command=tuple(str(c) for c in command),
        env={str(k): str(v) for k, v in (strings(serve, "env", "serve.") or {}).items()},
        cwd=str((base / check(serve, "cwd", str, "serve.", ".")).resolve()),
        health_url=need(health, "url", str, "health."),
        health_timeout_s=seconds(health, "timeout_s", "health.", 600),
        method=str(check(request, "method", str, "request.", "POST")).upper(),
        url=need(request, "url", str, "request."),
        json_body=json_body, form=strings(request, "form", "request."), files=files or None,
        request_timeout_s=seconds(request, "timeout_s", "request.", 3600),
        profile_start_url=check(profile, "start_url", str, "profile."),
        profile_stop_url=check(profile, "stop_url", str, "profile."),
        profile_stop_timeout_s=seconds(profile, "stop_timeout_s", "profile.", 1800),
        traces=str(check(profile, "traces", str, "profile.", "{profile_dir}")),
        decisions=str(check(profile, "decisions", str, "profile.", "{decisions_dir}")),
        version_url=version_url, source=str(path), expect=expect or None,
    )


_TOML_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "an array", dict: "a table"}


def _check_finite(value: Any, where: str) -> None:
    """Non-finite floats (nan, inf) anywhere in a TOML value are refused, naming the field."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ServiceFileError(f"{where}` must be finite, not {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")


# --- template filling and HTTP ----------------------------------------------------------------

def _fill(value: Any, values: dict[str, Any]) -> Any:
    """Fill `{name}` placeholders; a string that is exactly one placeholder keeps its type."""
    if isinstance(value, str):
        for key, v in values.items():
            if value == "{" + key + "}":
                return v
        out = value
        for key, v in values.items():
            out = out.replace("{" + key + "}", str(v))
        return out
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, values) for v in value]
    return value


def _multipart(form: dict[str, Any], files: dict[str, str]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts: list[bytes] = []
    for name, value in form.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                     f"{value}\r\n".encode())
    for name, file in files.items():
        p = Path(file)
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                     f'filename="{p.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                     .encode() + p.read_bytes() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _http(method: str, url: str, *, body: bytes | None = None, content_type: str | None = None,
          timeout: float) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# --- one arm ----------------------------------------------------------------------------------

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
    command = [str(c) for c in _fill(list(spec.command), values)]
    if spec.builtin:
        command = [c for c in command if c != "{profile_flag}"]
        if profiled:
            command += ["--profile", str(profile_dir)]
    env = {**os.environ, **{k: str(v) for k, v in _fill(spec.env, values).items()},
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
            service.versions = _reported_versions(_fill(spec.version_url, values))
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


def _reported_versions(url: str) -> dict[str, Any]:
    """What the service answers at its version route (JSON object, else the text)."""
    try:
        status, payload = _http("GET", url, timeout=30)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return {"error": f"{url}: {exc}"}
    if status != 200:
        return {"error": f"{url} answered {status}"}
    data = _json_or_none(payload)
    return data if isinstance(data, dict) else {"text": payload[:500].decode(errors="replace")}


def _wait_healthy(spec: ServiceSpec, service: RunningService) -> None:
    url = _fill(spec.health_url, service.values)
    deadline = time.monotonic() + spec.health_timeout_s
    while True:
        code = service.proc.poll()
        if code is not None:
            raise ExperimentError(f"service exited with code {code} before it was healthy; "
                                  f"log tail:\n{service.log_tail()}")
        try:
            status, _ = _http("GET", url, timeout=5)
            if status == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ExperimentError(f"service not healthy at {url} after "
                                  f"{spec.health_timeout_s:g} s; log tail:\n{service.log_tail()}")
        time.sleep(0.25)


@dataclass(frozen=True)
class Reply:
    """One request as the client saw it: status, body, E2E on the monotonic clock, and the
    wall-clock window `[start_wall_ns, end_wall_ns)` (`time.time_ns()`, the clock of the
    decisions' `wall_ns`) that analysis attributes decisions by."""

    status: int
    payload: bytes
    e2e_ns: int
    start_wall_ns: int
    end_wall_ns: int


def send_request(spec: ServiceSpec, values: dict[str, Any], *, warmup: bool = False) -> Reply:
    """Send the measured (or warm-up) request and time it."""
    url = _fill(spec.url, values)
    body: bytes | None = None
    content_type = None
    template = spec.warmup_json if warmup and spec.warmup_json else spec.json_body
    if template is not None:
        body, content_type = json.dumps(_fill(template, values)).encode(), "application/json"
    elif spec.form is not None or spec.files:
        body, content_type = _multipart(_fill(spec.form or {}, values), spec.files or {})
    start_wall_ns = time.time_ns()
    start = time.perf_counter_ns()
    try:
        status, payload = _http(spec.method, url, body=body, content_type=content_type,
                                timeout=spec.request_timeout_s)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ExperimentError(f"request to {url} failed: {exc}") from exc
    e2e_ns = time.perf_counter_ns() - start
    return Reply(status, payload, e2e_ns, start_wall_ns, time.time_ns())


def _post_control(url: str, values: dict[str, Any], timeout: float) -> None:
    target = _fill(url, values)
    try:
        status, payload = _http("POST", target, body=b"", timeout=timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ExperimentError(f"{target} failed: {exc}") from exc
    if status >= 400:
        raise ExperimentError(f"{target} answered {status}: {payload[:300]!r}")


def run_arm(spec: ServiceSpec, arm: str, index: int, out: Path, *, steps: int, seed: int,
            profiled: bool, requests: int = 1, lister: neighbours.Lister | None = None,
            require_exclusive: bool = False) -> dict[str, Any]:
    """Start, warm, measure `requests` consecutive requests and stop one arm; returns its
    manifest entry. An arm that fails leaves no raw profiles (`trace-raw/`) behind.

    The entry's `neighbours` records the devices' processes (`lister`, default the device
    kind's: `residency.rundir.neighbours`) once the service is healthy and after the last
    measured request; with `require_exclusive`, a foreign one is an `ExperimentError`."""
    try:
        return _run_arm(spec, arm, index, out, steps=steps, seed=seed, profiled=profiled,
                        requests=requests, lister=lister, require_exclusive=require_exclusive)
    except BaseException:
        if spec.builtin:  # nobody will collect them; tmp/ already went with the service
            shutil.rmtree(out / run_dir_name(index, arm) / TRACE_RAW, ignore_errors=True)
        raise


def _look(lister: neighbours.Lister, service: RunningService, arm: str, when: str,
          require_exclusive: bool) -> tuple[dict[str, Any], set[int]]:
    """The devices' processes now, ours being this process and the service's tree."""
    own = {os.getpid(), *neighbours.own_pids([service.proc.pid])}  # not our other children
    found = neighbours.sample(lister, own)
    if require_exclusive:
        try:
            neighbours.check(found)
        except neighbours.NotExclusive as exc:
            raise ExperimentError(f"{arm}: at the {when} of its measured run, {exc}") from None
    return found, own


def _run_arm(spec: ServiceSpec, arm: str, index: int, out: Path, *, steps: int, seed: int,
             profiled: bool, requests: int = 1, lister: neighbours.Lister | None = None,
             require_exclusive: bool = False) -> dict[str, Any]:
    rel = run_dir_name(index, arm)
    run_dir = out / rel
    run_dir.mkdir(parents=True, exist_ok=False)
    began = time.perf_counter_ns()
    lister = lister or neighbours.lister_for(spec.device_kind)
    service = start_service(spec, arm, run_dir, profiled=profiled)
    started = time.perf_counter_ns()
    values = {**service.values, "steps": steps, "seed": seed}
    measured: list[dict[str, Any]] = []
    try:
        host_before = neighbours.host_cpu()
        first_look, _ = _look(lister, service, arm, "start", require_exclusive)
        warm = send_request(spec, values, warmup=True)
        if warm.status != 200:
            raise ExperimentError(f"{arm} warm-up answered {warm.status}: {warm.payload[:300]!r};"
                                  f" log tail:\n{service.log_tail()}")
        if profiled and spec.profile_start_url:
            _post_control(spec.profile_start_url, values, timeout=60)
        for _ in range(requests):
            reply = send_request(spec, values)
            if reply.status != 200:
                raise ExperimentError(f"{arm} request answered {reply.status}: "
                                      f"{reply.payload[:300]!r}; log tail:\n"
                                      f"{service.log_tail()}")
            response = _json_or_none(reply.payload)
            measured.append({"request_id": (response or {}).get("request_id"),
                             "e2e_ns": reply.e2e_ns, "e2e_s": reply.e2e_ns / 1e9,
                             "start_wall_ns": reply.start_wall_ns,
                             "end_wall_ns": reply.end_wall_ns,
                             "response": response if response is not None
                             else {"bytes": len(reply.payload)}})
        if profiled and spec.profile_stop_url:
            _post_control(spec.profile_stop_url, values, timeout=spec.profile_stop_timeout_s)
        last_look, own = _look(lister, service, arm, "end", require_exclusive)
        seen = neighbours.record(first_look, last_look, host_before=host_before,
                                 host_after=neighbours.host_cpu(), own=own)
    except ExperimentError as exc:
        if service.proc.poll() is not None:
            raise ExperimentError(f"{exc}\nservice exited with code {service.proc.returncode};"
                                  f" log tail:\n{service.log_tail()}") from exc
        raise
    finally:
        service.stop()
    ended = time.perf_counter_ns()
    _check_decisions_written(spec, Path(_fill(spec.decisions, values)), arm, requests + 1)
    first = measured[0]
    # the unit of the E2E claim is the run: with R requests, the median of its R E2Es
    median_ns = int(round(statistics.median(m["e2e_ns"] for m in measured)))
    median_s = median_ns / 1e9
    if spec.builtin and profiled:
        _collect_builtin_traces(run_dir, first["request_id"])
    # layout 2 (`rundir.run.CLIENT_LAYOUT`): each field describes one thing: the run's
    # median E2E, and one record per measured request (id, E2E, window, response)
    client = {"layout": CLIENT_LAYOUT, "arm": arm, "index": index,
              "request": {"steps": steps, "seed": seed},
              "median_e2e_ns": median_ns, "median_e2e_s": median_s,
              "warmup": {"request_id": (_json_or_none(warm.payload) or {}).get("request_id"),
                         "e2e_ns": warm.e2e_ns, "start_wall_ns": warm.start_wall_ns,
                         "end_wall_ns": warm.end_wall_ns},
              "requests": measured}
    if service.versions is not None:
        client["service_versions"] = service.versions
    write_json_atomic(run_dir / CLIENT, client)
    # `request_id` and `e2e_s` describe the same thing: one measured request and its E2E, or,
    # with R > 1, the R requests (`request_ids`) and their median (issue 25)
    entry = {"arm": arm, "index": index, "dir": rel, "e2e_s": median_s, "profiled": profiled,
             "cost": run_cost(start_ns=started - began, warmup_ns=warm.e2e_ns,
                              measured_ns=sum(m["e2e_ns"] for m in measured),
                              total_ns=ended - began),
             "neighbours": seen}
    if requests > 1:
        entry["request_ids"] = [m["request_id"] for m in measured]
        entry["e2e_s_requests"] = [m["e2e_s"] for m in measured]
    else:
        entry["request_id"] = first["request_id"]
    return entry


COST_FIELDS = ("start_s", "warmup_s", "measured_s", "other_s", "total_s")
"""`runs[].cost` of a service run (seconds of wall time on the device's host): `start_s`
spawn to healthy, `warmup_s` the warm-up request, `measured_s` the measured requests' E2E
summed, `other_s` the rest (profiler control, stopping the service, gaps), `total_s` spawn to
stopped. The manifest's `cost` sums them over the runs (with `runs`)."""


def run_cost(*, start_ns: int, warmup_ns: int, measured_ns: int, total_ns: int
             ) -> dict[str, float]:
    """A run's `cost` record (`COST_FIELDS`) from its measured times in ns."""
    other = max(0, total_ns - start_ns - warmup_ns - measured_ns)
    return {"start_s": start_ns / 1e9, "warmup_s": warmup_ns / 1e9,
            "measured_s": measured_ns / 1e9, "other_s": other / 1e9,
            "total_s": total_ns / 1e9}


def cost_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's `cost`: every `runs[].cost` field summed, with `runs` (how many runs
    recorded one)."""
    costs = [r["cost"] for r in runs if isinstance(r.get("cost"), dict)]
    return {"runs": len(costs), **{k: sum(float(c.get(k) or 0.0) for c in costs)
                                   for k in COST_FIELDS}}


def _check_decisions_written(spec: ServiceSpec, directory: Path, arm: str, sent: int) -> None:
    """Refuse a run whose decisions directory stayed empty: nothing could be attributed."""
    files = sorted(directory.glob(DECISIONS_GLOB)) if directory.is_dir() else []
    if any(f.stat().st_size for f in files):
        return
    if spec.builtin:
        raise ExperimentError(f"{directory}: the built-in {arm} service answered {sent} "
                              "requests but wrote no decisions-rank<r>.jsonl")
    raise ExperimentError(
        f"{directory}: the decisions directory (field `profile.decisions` of "
        f"{spec.source or spec.name}) stayed empty after the {arm} service answered {sent} "
        "requests; likely cause: the residency adapter did not load in the service's workers "
        "(residency not installed in the service's environment so its "
        "`vllm_omni.general_plugins` entry point is missing, VLLM_PLUGINS set without "
        "`residency`, or RESIDENCY_ARM / RESIDENCY_DECISIONS_DIR missing from `serve.env`)")


def _json_or_none(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


def _collect_builtin_traces(run_dir: Path, request_id: str | None) -> None:
    raw = run_dir / TRACE_RAW
    src = raw / str(request_id)
    if request_id is None or not src.is_dir():
        raise ExperimentError(f"{run_dir}: no traces for request {request_id} under {raw}")
    src.rename(run_dir / "trace")
    shutil.rmtree(raw, ignore_errors=True)


# --- designs and the run directory ------------------------------------------------------------

def plan(design: str, pairs: int = 1, *, aa_arm: str = CANDIDATE
         ) -> list[tuple[str, bool]]:
    """(arm, profiled) in run order.

    `profiled-pair`: one profiled baseline/candidate pair. `alternating`: `pairs` unprofiled
    pairs in ABBA order. `paired-profile`: the profiled pair, then `pairs` alternating pairs
    (0 allowed). `consecutive`: one candidate service (its requests are `requests`). `aa`:
    `pairs` unprofiled pairs of `aa_arm` in both slots, slots in ABBA order (`aa_slots`).
    """
    if design == "consecutive":
        return [(CANDIDATE, False)]
    if design == "aa":
        if aa_arm not in PAIRED_ARMS:
            raise ValueError(f"The value for `aa_arm` must be one of {list(PAIRED_ARMS)}, but "
                             f"{aa_arm!r} was passed.")
        return [(aa_arm, False) for _ in aa_slots(pairs)]
    if design not in DESIGNS:
        raise ValueError(f"The value for `design` must be one of {list(DESIGNS)}, but "
                         f"{design!r} was passed.")
    minimum = 0 if design == "paired-profile" else 1
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < minimum:
        raise ValueError(f"The value for `pairs` must be an integer >= {minimum}, but "
                         f"{pairs!r} was passed.")
    order: list[tuple[str, bool]] = []
    if design in ("profiled-pair", "paired-profile"):
        order += [(BASELINE, True), (CANDIDATE, True)]
    if design in ("alternating", "paired-profile"):
        for i in range(pairs):
            arms = PAIRED_ARMS if i % 2 == 0 else PAIRED_ARMS[::-1]
            order += [(arm, False) for arm in arms]
    return order


def aa_slots(pairs: int) -> list[str]:
    """Slot labels of an A/A design in run order: A B, B A, A B, ... (ABBA)."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"The value for `pairs` must be an integer >= 1, but {pairs!r} was "
                         "passed.")
    return [s for i in range(pairs) for s in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def _builtin_versions() -> dict[str, Any]:
    """What the built-in service runs on: this interpreter's residency, torch and python."""
    v = versions()
    return {k: v[k] for k in ("residency", "torch", "torch_npu", "python")}


def run_design(design: str, out: str | os.PathLike[str], *, spec: ServiceSpec, steps: int = 50,
               seed: int = 2101, pairs: int = 1, requests: int = 1,
               params: dict[str, Any] | None = None, aa_arm: str = CANDIDATE,
               progress: bool | Callable[[Iterator[Any]], Iterator[Any]] = True,
               sequential: Any = None, on_start: Callable[[], None] | None = None,
               require_exclusive: bool = False,
               lister: neighbours.Lister | None = None) -> Path:
    """Run a design into a new run directory; returns it. On any failure the directory stays
    with `status: incomplete` and the error, every service is stopped, and
    `ExperimentError` is raised.

    Each unprofiled service run measures `requests` requests after its warm-up (every one
    recorded in client.json; the run's `e2e_s` is their median); profiled runs measure one.
    Every run's cost (service start, warm-up, measured, the rest) is recorded in its
    `runs[].cost` and summed in the manifest's `cost`.

    `sequential` (paired-profile only; `residency.analysis.sequential.SequentialRule`, or
    any object with `to_dict()`, `look(baseline, candidate)` and `result(baseline,
    candidate, looks)`) stops adding unprofiled pairs once a look decides; `pairs` is then
    the maximum. The manifest's `sequential` records the rule (before the first pair), every
    look, where and why it stopped, and the adjusted figures. `on_start` is called once the
    run directory is usable, before the first service starts.

    Every service run records the devices' processes at its start and end (`lister`, default
    the device kind's, `residency.rundir.neighbours`). `require_exclusive`: a foreign process
    on the devices before anything runs is an `ExperimentInputError` (nothing is written);
    one seen at the start or end of a service run stops the run, `incomplete`
    (`ExperimentError`).
    """
    if sequential is not None and design != "paired-profile":
        raise ValueError(f"stopping when decided applies to design paired-profile only, not "
                         f"{design!r}")
    for name, value in (("steps", steps), ("requests", requests)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"The value for `{name}` must be an integer >= 1, but {value!r} "
                             "was passed.")
    order = plan(design, pairs, aa_arm=aa_arm)
    slots = aa_slots(pairs) if design == "aa" else None
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExperimentInputError(f"{out}: run directory exists and is not empty; choose a "
                                   "new one")
    lister = lister or neighbours.lister_for(spec.device_kind)
    if require_exclusive:  # before anything runs or is written
        try:
            neighbours.exclusive(lister, {os.getpid()})
        except neighbours.NotExclusive as exc:
            raise ExperimentInputError(f"device {spec.device_kind}: {exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ExperimentInputError(f"{out}: cannot write the run directory: "
                              f"{exc.strerror or exc}") from None
    manifest = Manifest(
        design=design, device_kind=spec.device_kind,
        service="builtin" if spec.builtin else "external", service_name=spec.name,
        params={"ranks": spec.ranks, "steps": steps, "seed": seed,
                "pairs": pairs if design in ("alternating", "paired-profile", "aa") else 1,
                "requests": requests, **({"aa_arm": aa_arm} if design == "aa" else {}),
                "require_exclusive": require_exclusive, **(params or {})},
        versions=versions(), order=[arm for arm, _ in order],
        extra={"service_info": {"name": spec.name, "file": spec.source,
                                "command": list(spec.command),
                                "versions": _builtin_versions() if spec.builtin else None,
                                "expect": spec.expect}})
    info = manifest.extra["service_info"]
    if sequential is not None:  # the rule is fixed (and recorded) before the first pair
        manifest.params["max_pairs"] = pairs
        manifest.extra["sequential"] = {"rule": sequential.to_dict(), "looks": []}
    try:
        manifest.write(out)
    except OSError as exc:
        raise ExperimentError(f"{out}: cannot write manifest.json: {exc.strerror or exc}"
                              ) from None
    if on_start is not None:
        on_start()
    bar = _progress(progress, len(order), f"{design} ({spec.device_kind})")
    try:
        for index, (arm, profiled) in enumerate(order):
            bar.set_postfix_str(f"{arm} #{index}")
            before = hostload.sample()
            entry = run_arm(spec, arm, index, out, steps=steps, seed=seed, profiled=profiled,
                            requests=1 if profiled else requests, lister=lister,
                            require_exclusive=require_exclusive)
            entry["host_load"] = hostload.record(before, hostload.sample())
            if slots is not None:
                entry["slot"] = slots[index]
            manifest.runs.append(entry)
            manifest.extra["host_load"] = hostload.summarize(
                [r.get("host_load") for r in manifest.runs])
            manifest.extra["cost"] = cost_summary(manifest.runs)
            manifest.extra["neighbours"] = neighbours.summarize(
                [(r.get("dir"), r.get("neighbours")) for r in manifest.runs])
            if info["versions"] is None:  # what the first external service reported
                client = json.loads((out / manifest.runs[-1]["dir"] / CLIENT)
                                    .read_text(encoding="utf-8"))
                info["versions"] = client.get("service_versions")
            stop = sequential is not None and _sequential_look(sequential, manifest)
            manifest.write(out)
            bar.update(1)
            if stop:
                with contextlib.suppress(AttributeError, TypeError):
                    bar.total = index + 1
                break
    except BaseException as exc:
        unsaved = ""
        try:  # best effort: the directory may be what failed
            manifest.fail(out, interruption(exc))
        except OSError as werr:
            unsaved = f" (manifest.json could not be updated either: {werr.strerror or werr})"
        if isinstance(exc, ExperimentError):
            if not unsaved:
                raise
            raise type(exc)(f"{exc}{unsaved}") from exc
        if isinstance(exc, OSError):
            raise ExperimentError(f"{out}: run incomplete: {exc.strerror or exc}: "
                                  f"{exc.filename or ''}{unsaved}") from exc
        if isinstance(exc, Exception):
            raise ExperimentError(f"{out}: run incomplete: {exc}{unsaved}") from exc
        raise
    finally:
        bar.close()
    manifest.complete(out)
    return out


def _sequential_look(rule: Any, manifest: Manifest) -> bool:
    """After a run: when it completes an unprofiled pair, the rule's look (recorded in the
    manifest's `sequential`); True when the rule stops there (its figures recorded, `order`
    and `params.pairs` cut to the pairs run)."""
    e2e = {arm: [float(r["e2e_s"]) for r in manifest.runs
                 if r["arm"] == arm and not r["profiled"]] for arm in PAIRED_ARMS}
    base, cand = e2e[PAIRED_ARMS[0]], e2e[PAIRED_ARMS[1]]
    if not base or len(base) != len(cand):
        return False
    record = manifest.extra["sequential"]
    look = rule.look(base, cand)
    if look is None:
        return False
    record["looks"].append(look.to_dict())
    if look.decision == "continue":
        return False
    result = rule.result(base, cand, record["looks"]).to_dict()
    record.update({k: v for k, v in result.items() if k not in ("rule", "looks")})
    manifest.params["pairs"] = len(base)
    manifest.order = manifest.order[:len(manifest.runs)]
    return True


def _progress(progress: Any, total: int, desc: str) -> Any:
    if callable(progress):
        return progress(total=total, desc=desc)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="arm", disable=not progress, file=sys.stderr)


def run_pair(design: str = "profiled-pair", *, out: str | os.PathLike[str], device: str = "auto",
             ranks: int = 2, steps: int = 50, seed: int = 2101, pairs: int = 1,
             requests: int = 1,
             scale: float | str = 1.0, capacity_bytes: int | None = None,
             resident_mib: float = 1024,
             service_file: str | os.PathLike[str] | None = None, progress: bool = True,
             emulator: Any = None, aa_arm: str = CANDIDATE, fill: float | None = None,
             inject_failure: str = "none", sequential: Any = None,
             on_start: Callable[[], None] | None = None,
             require_exclusive: bool = False) -> Path:
    """`residency pair` as a function: the built-in service unless `service_file` is given.

    `emulator` is the emulated NPU's `DeviceModel` (default `DeviceModel()`: modelled device
    time); it is recorded in the manifest's params as `emulated_npu`. `scale="auto"` sizes
    the workload from the device's capacity (`residency.sizing.auto_size`, `fill` of it held;
    recorded as `params.sizing`). `inject_failure="generic-telemetry"` (cuda only) makes the
    baseline's generic telemetry raise as torch-npu <= 2.12 does, with the emulator's
    `accelerator_patch` on top (recorded as `params.inject_failure`). `sequential`: see
    `run_design` (`pairs` is then the maximum). `require_exclusive`: see `run_design`.
    """
    if service_file is not None:
        if scale == "auto" or inject_failure != "none":
            raise ValueError("--scale auto and --inject-failure apply to the built-in service "
                             "only, not with --service")
        spec = load_service_file(service_file)
        params: dict[str, Any] = {"service_file": str(service_file)}
    else:
        from residency import devices
        from residency.protocol import MAX_SEED, MAX_STEPS

        if ranks < 1:
            raise ValueError(f"The value for `ranks` must be >= 1, but {ranks!r} was passed.")
        # the built-in service's documented bounds, checked before any service starts
        for name, value, low, high in (("steps", steps, 1, MAX_STEPS),
                                       ("seed", seed, 0, MAX_SEED)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"The value for `{name}` must be an integer in [{low}, {high}],"
                                 f" but {value!r} was passed.")
        for name, number in (("scale", 1.0 if scale == "auto" else scale),
                             ("resident_mib", resident_mib)):
            if (isinstance(number, bool) or not isinstance(number, (int, float))
                    or not math.isfinite(number) or number <= 0):
                raise ValueError(f"The value for `{name}` must be a positive finite number"
                                 f"{' or auto' if name == 'scale' else ''}, but {number!r} "
                                 "was passed.")
        if fill is not None and scale != "auto":
            raise ValueError("--fill applies with --scale auto only")
        import dataclasses

        from residency import protocol as sizing
        from residency.devicemodel import DeviceModel

        kind = devices.resolve(device)
        devices.check_injection(kind, inject_failure)  # ValueError saying why not
        patch = "none"
        if emulator is not None and inject_failure != "none":  # the patch goes with it
            patch = emulator.accelerator_patch
            emulator = dataclasses.replace(emulator, accelerator_patch="none")
        model = None
        if devices.emulated(kind):
            model = (emulator or DeviceModel()).to_params()
        elif emulator is not None and emulator != DeviceModel():
            raise ValueError(f"the emulated NPU's model options apply to device emulated-npu "
                             f"only, not {kind} (--accelerator-patch also with "
                             "--inject-failure on cuda)")
        sized = None
        if scale == "auto":
            sized = sizing.auto_size(
                sizing.device_total_bytes(kind, capacity_bytes=capacity_bytes),
                fill=sizing.AUTO_FILL if fill is None else fill)
            scale, resident_mib = sized.scale, sized.resident_mib
        spec = builtin_service(device_kind=kind, ranks=ranks, scale=scale,
                               capacity_bytes=capacity_bytes, resident_mib=resident_mib,
                               emulator=model, inject_failure=inject_failure,
                               accelerator_patch=patch, resident_on_device=sized is not None)
        params = {"scale": scale, "capacity_bytes": capacity_bytes,
                  "resident_mib": resident_mib}
        if sized is not None:
            params["sizing"] = sized.to_params()
        injected = devices.injection_record(kind, inject_failure, patch)
        if injected is not None:
            params["inject_failure"] = injected
        if model is not None:  # the device model and the capacity it emulates
            from residency.devicemodel import DEFAULT_CAPACITY_BYTES

            params["emulated_npu"] = {**model,
                                      "capacity_bytes": capacity_bytes or DEFAULT_CAPACITY_BYTES}
    return run_design(design, out, spec=spec, steps=steps, seed=seed, pairs=pairs,
                      requests=requests, params=params, aa_arm=aa_arm, progress=progress,
                      sequential=sequential, on_start=on_start,
                      require_exclusive=require_exclusive)


__all__ = ["BUILTIN_EXPECT", "COST_FIELDS", "ExperimentError", "ExperimentInputError", "Reply",
           "ServiceFileError", "ServiceSpec", "aa_slots", "builtin_service", "load_service_file",
           "cost_summary", "plan", "run_cost", "run_design", "run_pair", "send_request"]
