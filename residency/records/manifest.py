"""`manifest.json`: the one record of a run directory, both ways.

`ManifestRecord` is its schema (msgspec; `Params` its `params`), which `Manifest.from_dict`
reads through and `Manifest.write` checks before writing; `Manifest` is the run's model
(fields, atomic write, completion with the sha256 list and the seal); `read_manifest` is
the one read of the raw object a command verifies and analyses (through a `RunReading`);
`artifact_hashes` lists the evidence a seal covers (every file of the run but the manifest
and its atomic writer's temporary file).

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
from typing import Any, Literal

import msgspec

from residency.devices import RECORDED_KINDS
from residency.jsonio import write_json_atomic
from residency.records.files import (
    RunDirError,
    RunReading,
    read_json,
    sha256_file,
    walk_files,
)
from residency.records.schema import Count, validate
from residency.records.seal import SEAL_FIELD
from residency.records.seal import seal as seal_manifest

__all__ = ["MANIFEST", "MANIFEST_TMP", "SCHEMA", "STATUSES", "Manifest", "ManifestRecord",
           "Params", "artifact_hashes", "is_derived", "read_manifest", "write_manifest"]

SCHEMA = "residency.run/1"
MANIFEST = "manifest.json"
STATUSES = ("complete", "incomplete")
# the manifest's atomic writer's temporary file: never evidence. Hidden files are evidence like
# any other: sealed, and listed by `verify` when they appear later (trace discovery never
# reads them either).
MANIFEST_TMP = f".{MANIFEST}.tmp"


class Params(msgspec.Struct):
    """`params`: what the run was asked for. Open: a parameter beyond these is kept (any
    number in it finite: checked by `Manifest.from_dict`, which msgspec cannot say)."""

    ranks: Count | None = None
    steps: Count | None = None
    seed: Count | None = None
    pairs: Count | None = None
    requests: Count | None = None
    capacity_bytes: Count | None = None


class ManifestRecord(msgspec.Struct):
    """`manifest.json` (docs/contracts.md). Open: a field beyond these (`cost`, `sequential`,
    `host_load`, `neighbours`, ...) is kept in `Manifest.extra`; `runs[]` entries are checked
    by `residency.rundir`, the seal's shape by `residency.records.seal`."""

    schema: Literal["residency.run/1"]  # (SCHEMA)
    status: Literal["complete", "incomplete"]  # (STATUSES)
    device_kind: Literal[RECORDED_KINDS]  # type: ignore[valid-type]
    runs: list[Any]
    design: str | None = None
    service: str | None = None
    service_name: str | None = None
    params: Params | None = None
    versions: dict[str, Any] | None = None
    host: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    order: list[str] | None = None
    artifacts: dict[str, Any] | None = None
    error: str | None = None
    seal: dict[str, Any] | None = None
    service_info: dict[str, Any] | None = None


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
            RunDirError: the object does not validate against `ManifestRecord`, or a number
                in `params` is not finite (naming the field).
        """
        path = Path(path)
        validate(path, data, ManifestRecord)
        if isinstance(data.get("params"), dict):
            _check_params(path, data["params"])
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
        """Write `root/manifest.json` atomically.

        Raises:
            RunDirError: the manifest does not validate against `ManifestRecord` (naming the
                field); nothing is written.
        """
        path = Path(root) / MANIFEST
        data = self.to_dict()
        validate(path, data, ManifestRecord)
        return write_json_atomic(path, data)

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


def _check_params(path: Path, params: dict[str, Any]) -> None:
    """A number among the parameters `Params` does not declare is finite (what msgspec
    cannot say of an open object's other values)."""
    for key, value in params.items():
        if (key not in Params.__struct_fields__ and isinstance(value, float)
                and not math.isfinite(value)):
            raise RunDirError(path, f"must be a finite number, got {value!r}",
                              field=f"params.{key}")


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
