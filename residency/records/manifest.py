"""`manifest.json`: the one record of a run directory, both ways.

`Manifest` is its type (fields, checks, atomic write, completion with the sha256 list and
the seal); `read_manifest` is the one read of the raw object a command verifies and analyses
(through a `RunReading`); `artifact_hashes` lists the evidence a seal covers (every file of
the run but the manifest and its atomic writer's temporary file).

Format history: `schema` `residency.run/1` throughout; fields added over time (`seal`,
`service_info`, `cost`, `sequential`, `host_load`, `neighbours`, ...) are optional, and
unknown ones are kept in `Manifest.extra`.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from residency.devices import RECORDED_KINDS
from residency.jsonio import write_json_atomic
from residency.records.files import (
    RunDirError,
    RunReading,
    read_json,
    sha256_file,
    walk_files,
)
from residency.records.seal import SEAL_FIELD
from residency.records.seal import seal as seal_manifest

__all__ = ["MANIFEST", "MANIFEST_TMP", "SCHEMA", "STATUSES", "Manifest", "artifact_hashes",
           "is_derived", "read_manifest", "write_manifest"]

SCHEMA = "residency.run/1"
MANIFEST = "manifest.json"
STATUSES = ("complete", "incomplete")
# the manifest's atomic writer's temporary file: never evidence. Hidden files are evidence like
# any other: sealed, and listed by `verify` when they appear later (trace discovery never
# reads them either).
MANIFEST_TMP = f".{MANIFEST}.tmp"


def read_manifest(root: str | os.PathLike[str], *,
                  reading: RunReading | None = None) -> dict[str, Any]:
    """The raw object of `root/manifest.json` (strict JSON, unchecked: `Manifest.from_dict`
    checks it), read through `reading` when given (the one read a command makes)."""
    return read_json(Path(root) / MANIFEST, reading=reading)


def write_manifest(root: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write the object `data` as `root/manifest.json`, atomically and unchecked (`Manifest`
    writes a checked one; this writes what a caller built, e.g. an edited copy)."""
    return write_json_atomic(Path(root) / MANIFEST, data)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Manifest:
    """`manifest.json`: written after every run (status `incomplete` until the very end) and
    read back by `load_run`. Unknown fields of a recorded manifest are kept in `extra`."""

    device_kind: str
    design: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    status: str = "incomplete"
    service: str | None = None
    service_name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    host: str = field(default_factory=platform.node)
    started_at: str | None = field(default_factory=_now)
    ended_at: str | None = None
    order: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    schema: str = SCHEMA
    seal: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("schema", "status", "design", "device_kind", "service", "service_name",
               "params", "versions", "host", "started_at", "ended_at", "order", "runs",
               "artifacts", "error", SEAL_FIELD)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, fields in the documented order."""
        return {**{k: getattr(self, k) for k in self._FIELDS}, **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, path: str | os.PathLike[str] = MANIFEST
                  ) -> Manifest:
        """Check and read a manifest object.

        Raises:
            RunDirError: a required field is missing or has the wrong value (naming it).
        """
        path = Path(path)
        for key in ("schema", "status", "device_kind", "runs"):
            if key not in data:
                raise RunDirError(path, "missing", field=key)
        if data["schema"] != SCHEMA:
            raise RunDirError(path, f"expected {SCHEMA!r}, got {data['schema']!r}",
                              field="schema")
        if data["status"] not in STATUSES:
            raise RunDirError(path, f"must be one of {list(STATUSES)}, got "
                              f"{data['status']!r}", field="status")
        if data["device_kind"] not in RECORDED_KINDS:
            raise RunDirError(path, f"must be one of {list(RECORDED_KINDS)}, got "
                              f"{data['device_kind']!r}", field="device_kind")
        if not isinstance(data["runs"], list):
            raise RunDirError(path, "must be a list", field="runs")
        for key, types, what in _FIELD_TYPES:
            if key in data and data[key] is not None and not isinstance(data[key], types):
                raise RunDirError(path, f"must be {what} or null, got "
                                  f"{type(data[key]).__name__}", field=key)
        if isinstance(data.get("params"), dict):
            _check_params(path, data["params"])
        if isinstance(data.get("order"), list) and not all(
                isinstance(a, str) for a in data["order"]):
            raise RunDirError(path, "must be a list of arm names", field="order")
        known = {k: data[k] for k in cls._FIELDS if k in data}
        extra = {k: v for k, v in data.items() if k not in cls._FIELDS}
        return cls(**{k: v for k, v in known.items() if v is not None or k in (
            "design", "service", "service_name", "started_at", "ended_at", "error",
            SEAL_FIELD)},
            extra=extra)

    @classmethod
    def read(cls, root: str | os.PathLike[str]) -> Manifest:
        """The manifest of the run directory `root`."""
        path = Path(root) / MANIFEST
        return cls.from_dict(read_json(path), path=path)

    def write(self, root: str | os.PathLike[str]) -> Path:
        """Write `root/manifest.json` atomically."""
        return write_json_atomic(Path(root) / MANIFEST, self.to_dict())

    def fail(self, root: str | os.PathLike[str], error: str) -> None:
        """Record `error` and the end time, status staying `incomplete`, and write."""
        self.error, self.ended_at = error, _now()
        self.write(root)

    def complete(self, root: str | os.PathLike[str]) -> str:
        """Hash every artifact, mark the run `complete` with its end time, seal the manifest
        (`residency.records.seal`) and write; returns the run's digest (`sha256:...`)."""
        self.artifacts = artifact_hashes(root)
        self.ended_at, self.status, self.seal = _now(), "complete", None
        self.seal = seal_manifest(self.to_dict())
        self.write(root)
        return str(self.seal["digest"])


# fields of manifest.json other than the required four: the JSON type each must have
_FIELD_TYPES = (
    ("design", str, "a string"), ("service", str, "a string"),
    ("service_name", str, "a string"), ("params", dict, "an object"),
    ("versions", dict, "an object"), ("host", str, "a string"),
    ("started_at", str, "a string"), ("ended_at", str, "a string"),
    ("order", list, "a list"), ("artifacts", dict, "an object"), ("error", str, "a string"),
    ("seal", dict, "an object"), ("service_info", dict, "an object"),
)


_INT_PARAMS = ("ranks", "steps", "seed", "pairs", "requests", "capacity_bytes")


def _check_params(path: Path, params: dict[str, Any]) -> None:
    """Integer parameters are int64 integers >= 0; every other number is finite."""
    for key, value in params.items():
        where = f"params.{key}"
        if key in _INT_PARAMS and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise RunDirError(path, f"must be an integer >= 0, got {value!r}"[:200],
                                  field=where)
        elif isinstance(value, float) and not math.isfinite(value):
            raise RunDirError(path, f"must be a finite number, got {value!r}", field=where)



def is_derived(rel: str) -> bool:
    """The manifest (and its temporary copy) is the one file a seal does not list: every other
    file of a run, a cache folder a sender planted included, is evidence or extra."""
    return rel in (MANIFEST, MANIFEST_TMP)


def artifact_hashes(root: str | Path) -> dict[str, str]:
    """sha256 of every evidence file under `root` by POSIX relative path (the manifest and
    derived caches excluded; hidden files included).

    Raises:
        RunDirError: an entry that is not a regular file (FIFO, socket, device, link).
    """
    root = Path(root)
    out = {}
    for rel, path, other in walk_files(root):
        if is_derived(rel):
            continue
        if other is not None:
            raise RunDirError(path, f"is {other}; a run directory holds regular files only")
        out[rel] = sha256_file(path)
    return out
