"""`client.json`: what the client saw of one service run, both ways.

Written once per service run by the experiment (`write_client`, the current layout), read by
analysis and `verify` (`read_client`: strict JSON, every field analysis reads checked, then
upgraded to the current layout). Older layouts are upgraded here, in one place, on reading
(`upgrade_client`); a recorded file is never rewritten.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from residency.jsonio import write_json_atomic
from residency.records.files import (
    RunDirError,
    RunReading,
    finite_field,
    is_int,
    read_json,
)

__all__ = ["CLIENT", "CLIENT_LAYOUT", "check_client", "read_client", "read_raw",
           "upgrade_client", "write_client", "write_raw"]

CLIENT = "client.json"


CLIENT_LAYOUT = 2
"""`client.json` layouts. 1 (no `layout` field): top-level `request_id`, `start_wall_ns`,
`end_wall_ns` and `response` of the first measured request beside `e2e_ns`/`e2e_s` of the
run (the median of its requests), `requests` only with more than one. 2: every field
describes one thing: `median_e2e_ns`/`median_e2e_s` (the run's E2E, the median over its
measured requests) and `requests` (always, one record per measured request: `request_id`,
`e2e_ns`, `e2e_s`, `start_wall_ns`, `end_wall_ns`, `response`)."""
_REQUEST_FIELDS = ("request_id", "e2e_ns", "e2e_s", "start_wall_ns", "end_wall_ns", "response")


def upgrade_client(c: dict[str, Any]) -> dict[str, Any]:
    """A `client.json` in the current layout (`CLIENT_LAYOUT`): layout 1 read as layout 2
    (its lone top-level request a one-record `requests`, its `e2e_ns`/`e2e_s` the median);
    `c` itself is not changed."""
    if c.get("layout") == CLIENT_LAYOUT:
        return dict(c)
    out = {k: v for k, v in c.items() if k not in (*_REQUEST_FIELDS, "requests")}
    requests = c.get("requests")
    if not (isinstance(requests, list) and requests):
        requests = [{k: c[k] for k in _REQUEST_FIELDS if k in c}]
    out.update(layout=CLIENT_LAYOUT, median_e2e_ns=c.get("e2e_ns"),
               median_e2e_s=c.get("e2e_s"), requests=list(requests))
    return out


def check_client(path: Path, c: dict[str, Any]) -> dict[str, Any]:
    """`c` (a `client.json`) when every field analysis reads has its contract type (ints in
    int64, finite non-negative seconds, objects and lists where the contract says);
    `RunDirError` naming the file and field otherwise."""
    def bad(field: str, what: str) -> RunDirError:
        return RunDirError(path, what[:300], field=field)

    layout = c.get("layout")
    if layout is not None and layout != CLIENT_LAYOUT:
        raise bad("layout", f"must be {CLIENT_LAYOUT} or absent (layout 1), got {layout!r}")
    for key in ("e2e_ns", "median_e2e_ns", "index"):
        if c.get(key) is not None and not is_int(c[key]):
            raise bad(key, f"must be an integer in [0, 2**63), got {c[key]!r}")
    for key in ("request_id", "arm"):
        if c.get(key) is not None and not isinstance(c[key], str):
            raise bad(key, f"must be a string, got {type(c[key]).__name__}")
    finite_field(path, c.get("e2e_s"), "e2e_s")
    finite_field(path, c.get("median_e2e_s"), "median_e2e_s")
    warm = c.get("warmup")
    if warm is not None:
        if not isinstance(warm, dict):
            raise bad("warmup", f"must be an object or null, got {type(warm).__name__}")
        if warm.get("e2e_ns") is not None and not is_int(warm["e2e_ns"]):
            raise bad("warmup.e2e_ns", f"must be an integer in [0, 2**63), got "
                      f"{warm['e2e_ns']!r}")
    _check_response(path, c.get("response"), "response.")
    requests = c.get("requests")
    if requests is not None:
        if not isinstance(requests, list):
            raise bad("requests", f"must be a list, got {type(requests).__name__}")
        for i, r in enumerate(requests):
            if not isinstance(r, dict):
                raise bad(f"requests[{i}]", f"must be an object, got {type(r).__name__}")
            if r.get("e2e_ns") is not None and not is_int(r["e2e_ns"]):
                raise bad(f"requests[{i}].e2e_ns", f"must be an integer, got {r['e2e_ns']!r}")
            if r.get("request_id") is not None and not isinstance(r["request_id"], str):
                raise bad(f"requests[{i}].request_id", "must be a string")
            finite_field(path, r.get("e2e_s"), f"requests[{i}].e2e_s")
            _check_response(path, r.get("response"), f"requests[{i}].response.")
    return c


def _check_response(path: Path, resp: Any, where: str) -> None:
    def bad(field: str, what: str) -> RunDirError:
        return RunDirError(path, what, field=f"{where}{field}")

    if resp is None:
        return
    if not isinstance(resp, dict):
        raise bad("", f"must be an object or null, got {type(resp).__name__}")
    per_rank = resp.get("per_rank")
    if per_rank is None:
        return
    if not isinstance(per_rank, list):
        raise bad("per_rank", f"must be a list, got {type(per_rank).__name__}")
    for i, pr in enumerate(per_rank):
        at = f"per_rank[{i}]"
        if not isinstance(pr, dict):
            raise bad(at, f"must be an object, got {type(pr).__name__}")
        for key in ("rank", "prepare_ns", "denoise_ns", "decode_ns", "total_ns",
                    "telemetry_errors", "oom"):
            if key in pr and not is_int(pr[key]):
                raise bad(f"{at}.{key}", f"must be an integer in [0, 2**63), got "
                          f"{pr[key]!r}"[:200])
        for group, keys in (("normal", ("count", "retained", "released")),
                            ("forced", ("count", "released"))):
            g = pr.get(group)
            if g is None:
                continue
            if not isinstance(g, dict):
                raise bad(f"{at}.{group}", f"must be an object, got {type(g).__name__}")
            for key in keys:
                if key in g and not is_int(g[key]):
                    raise bad(f"{at}.{group}.{key}", f"must be an integer >= 0, got "
                              f"{g[key]!r}"[:200])
        durations = (pr.get("normal") or {}).get("duration_ns")
        if durations is not None and not is_int(durations) and (
                not isinstance(durations, list) or not all(is_int(d) for d in durations)):
            raise bad(f"{at}.normal.duration_ns", "must be integer nanoseconds or a list of "
                      "them (one per call)")



def read_client(path: Path, *, sha256: str | None = None, reading: RunReading | None = None,
                check: bool = True) -> dict[str, Any]:
    """The `client.json` at `path` in the current layout: read (through `reading` when
    given, which parses it once a command; with `sha256`, the bytes must have it), its
    fields checked (`check_client`, unless `check` is False) and upgraded
    (`upgrade_client`).

    Raises:
        RunDirError: the file is missing, unsafe, not strict JSON, or a field has the wrong
            type (naming the file and field).
    """
    key = (CLIENT, os.path.abspath(path))
    raw = None if reading is None else reading.parsed.get(key)
    if raw is None:
        raw = read_json(path, sha256, reading=reading)
        if reading is not None:
            reading.parsed[key] = raw
    elif sha256 is not None:
        reading.read(path, sha256)  # the bytes parsed must have the sealed digest
    return upgrade_client(check_client(path, raw) if check else raw)


def read_raw(path: Path) -> dict[str, Any]:
    """The object in the `client.json` at `path` as recorded (strict JSON; not checked, not
    upgraded)."""
    return read_json(Path(path))


def write_raw(path: Path, data: dict[str, Any]) -> Path:
    """Write the object `data` as the `client.json` at `path`, atomically and unchecked (e.g.
    an edited or an older layout's record)."""
    return write_json_atomic(Path(path), data)


def write_client(run_dir: str | os.PathLike[str], *, arm: str, index: int,
                 request: dict[str, Any], median_e2e_ns: int, warmup: dict[str, Any],
                 requests: list[dict[str, Any]],
                 service_versions: Any = None) -> Path:
    """Write `run_dir/client.json` atomically in the current layout (`CLIENT_LAYOUT`): the
    run's median E2E over its measured requests and one record per measured request (id,
    E2E, wall-clock window, response); `service_versions` only when the service reported
    them."""
    client: dict[str, Any] = {
        "layout": CLIENT_LAYOUT, "arm": arm, "index": index, "request": request,
        "median_e2e_ns": median_e2e_ns, "median_e2e_s": median_e2e_ns / 1e9,
        "warmup": warmup, "requests": requests}
    if service_versions is not None:
        client["service_versions"] = service_versions
    return write_json_atomic(Path(run_dir) / CLIENT, client)
