"""The orchestrator's HTTP client: `{name}` templates filled in (`fill`), the measured or
warm-up request sent and timed (`send_request` -> `Reply`), the profiler's control routes
(`post_control`) and the service's version route (`reported_versions`)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from residency.experiments.errors import ExperimentError
from residency.experiments.servicefile import ServiceSpec


def fill(value: Any, values: dict[str, Any]) -> Any:
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
        return {k: fill(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [fill(v, values) for v in value]
    return value


def multipart(form: dict[str, Any], files: dict[str, str]) -> tuple[bytes, str]:
    """(body, content type) of a `multipart/form-data` request with `form` and `files`."""
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


def http_request(method: str, url: str, *, body: bytes | None = None,
                 content_type: str | None = None, timeout: float) -> tuple[int, bytes]:
    """(status, body) of one request; an HTTP error status is returned, not raised."""
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def json_or_none(payload: bytes) -> Any:
    """`payload` parsed as JSON, or None when it is not JSON."""
    try:
        return json.loads(payload)
    except ValueError:
        return None


def reported_versions(url: str) -> dict[str, Any]:
    """What the service answers at its version route (JSON object, else the text)."""
    try:
        status, payload = http_request("GET", url, timeout=30)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return {"error": f"{url}: {exc}"}
    if status != 200:
        return {"error": f"{url} answered {status}"}
    data = json_or_none(payload)
    return data if isinstance(data, dict) else {"text": payload[:500].decode(errors="replace")}


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
    url = fill(spec.url, values)
    body: bytes | None = None
    content_type = None
    template = spec.warmup_json if warmup and spec.warmup_json else spec.json_body
    if template is not None:
        body, content_type = json.dumps(fill(template, values)).encode(), "application/json"
    elif spec.form is not None or spec.files:
        body, content_type = multipart(fill(spec.form or {}, values), spec.files or {})
    start_wall_ns = time.time_ns()
    start = time.perf_counter_ns()
    try:
        status, payload = http_request(spec.method, url, body=body, content_type=content_type,
                                timeout=spec.request_timeout_s)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ExperimentError(f"request to {url} failed: {exc}") from exc
    e2e_ns = time.perf_counter_ns() - start
    return Reply(status, payload, e2e_ns, start_wall_ns, time.time_ns())


def post_control(url: str, values: dict[str, Any], timeout: float) -> None:
    """POST to a control route (the profiler's start/stop); `ExperimentError` unless 2xx/3xx."""
    target = fill(url, values)
    try:
        status, payload = http_request("POST", target, body=b"", timeout=timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ExperimentError(f"{target} failed: {exc}") from exc
    if status >= 400:
        raise ExperimentError(f"{target} answered {status}: {payload[:300]!r}")
