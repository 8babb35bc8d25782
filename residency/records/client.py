"""`client.json`: what the client saw of one service run, both ways.

Schema: `ClientRecord` (msgspec structs down to a rank's part of the service's answer,
`RankResponse`). Written once per service run by the experiment (`write_client`, the current
layout, refused before writing when it does not validate), read by analysis and `verify`
(`read_client`: strict JSON, validated against `ClientRecord`, then upgraded to the current
layout). Older layouts are upgraded here, in one place, on reading
(`upgrade_client`); a recorded file is never rewritten.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from residency.jsonio import write_json_atomic
from residency.records.files import RunReading, read_json
from residency.records.schema import Count, FiniteCount, Int64, validate

__all__ = ["CLIENT", "CLIENT_LAYOUT", "ClientRecord", "ForcedCalls", "NormalCalls",
           "RankResponse", "RequestRecord", "Response", "Warmup", "check_client",
           "read_client", "read_raw", "upgrade_client", "write_client", "write_raw"]

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


# --------------------------------------------------------------------------------- schema
class NormalCalls(msgspec.Struct):
    """A rank's normal policy calls of one request, as the service counted them."""

    count: Count | UnsetType = UNSET
    retained: Count | UnsetType = UNSET
    released: Count | UnsetType = UNSET
    duration_ns: Count | list[Count] | None = None  # one per call, or their sum


class ForcedCalls(msgspec.Struct):
    """A rank's forced policy calls of one request."""

    count: Count | UnsetType = UNSET
    released: Count | UnsetType = UNSET


class RankResponse(msgspec.Struct):
    """One rank's part of the service's answer (`response.per_rank[i]`)."""

    rank: Count | UnsetType = UNSET
    prepare_ns: Count | UnsetType = UNSET
    denoise_ns: Count | UnsetType = UNSET
    decode_ns: Count | UnsetType = UNSET
    total_ns: Count | UnsetType = UNSET
    telemetry_errors: Count | UnsetType = UNSET
    oom: Count | UnsetType = UNSET
    normal: NormalCalls | None = None
    forced: ForcedCalls | None = None


class Response(msgspec.Struct):
    """The service's JSON answer to a request (open: only what analysis reads is typed)."""

    per_rank: list[RankResponse] | None = None


class Warmup(msgspec.Struct):
    """The warm-up request before the measured ones."""

    request_id: Any = None  # as the service answered it
    e2e_ns: Count | None = None
    start_wall_ns: Int64 | None = None
    end_wall_ns: Int64 | None = None


class RequestRecord(msgspec.Struct):
    """One measured request (`requests[i]`): its id, E2E, wall-clock window and answer."""

    request_id: str | None = None
    e2e_ns: Count | None = None
    e2e_s: FiniteCount | None = None
    start_wall_ns: Int64 | None = None
    end_wall_ns: Int64 | None = None
    response: Response | None = None


class ClientRecord(msgspec.Struct):
    """`client.json`, layout 2 (`CLIENT_LAYOUT`) and layout 1 (no `layout`; its top-level
    request fields typed as a request's). Open: a field beyond these is kept as recorded."""

    layout: Literal[2] | None = None  # (CLIENT_LAYOUT)
    arm: str | None = None
    index: Count | None = None
    request: dict[str, Any] | None = None
    median_e2e_ns: Count | None = None
    median_e2e_s: FiniteCount | None = None
    warmup: Warmup | None = None
    requests: list[RequestRecord] | None = None
    service_versions: Any = None
    # layout 1: the first measured request at the top level, `e2e_*` the run's median
    request_id: str | None = None
    e2e_ns: Count | None = None
    e2e_s: FiniteCount | None = None
    start_wall_ns: Int64 | None = None
    end_wall_ns: Int64 | None = None
    response: Response | None = None


def check_client(path: Path, c: dict[str, Any]) -> dict[str, Any]:
    """`c` (a `client.json`) when it validates against `ClientRecord`; `RunDirError` naming
    the file and field otherwise."""
    validate(path, c, ClientRecord)
    return c


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
    them.

    Raises:
        RunDirError: the record does not validate against `ClientRecord` (naming the field;
            e.g. a service whose answer types a per-rank count otherwise); nothing is written.
    """
    client: dict[str, Any] = {
        "layout": CLIENT_LAYOUT, "arm": arm, "index": index, "request": request,
        "median_e2e_ns": median_e2e_ns, "median_e2e_s": median_e2e_ns / 1e9,
        "warmup": warmup, "requests": requests}
    if service_versions is not None:
        client["service_versions"] = service_versions
    path = Path(run_dir) / CLIENT
    check_client(path, client)
    return write_json_atomic(path, client)
