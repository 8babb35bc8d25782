"""What a service is to the orchestrator: `ServiceSpec` (how to start one arm's service and
measure one request on it), the built-in service's spec (`builtin_service`) and an external
one read from a TOML service file (`load_service_file`)."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport the standard module came from (same API)
    import tomli as tomllib

from residency.devices import KINDS
from residency.experiments.errors import ServiceFileError

BUILTIN_EXPECT = {"normal_per_request": 1, "forced_per_request": 2}
"""Policy calls per rank per measured request of the built-in service (and H3 Ref2VA)."""


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
