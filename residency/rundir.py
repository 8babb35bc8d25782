"""The run-directory format (docs/contracts.md), both ways, without torch.

Writing: `Manifest` is the one type of `manifest.json` (schema, fields, atomic write,
sha256 list with its derived-file exclusions); `write_json_atomic` writes any JSON file of
the suite. Reading: one entry point, `load_run`, goes: read manifest -> check fields
(`Manifest.from_dict`) -> check status -> verify artifacts -> build `Run`. Decisions and
client records are read on demand from a `Run`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from residency.devices import RECORDED_KINDS

SCHEMA = "residency.run/1"
STATUSES = ("complete", "incomplete")
DECISION_COLUMNS = (
    "rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason", "start_ns",
    "end_ns", "wall_ns", "reserved", "allocated", "free", "total", "error",
    "max_cached_fraction", "min_free_fraction", "duration_ns", "warmup", "file",
)

__all__ = ["DECISION_COLUMNS", "DERIVED_DIRS", "MANIFEST", "SCHEMA", "Manifest", "Run",
           "RunDirError", "RunEntry", "Verification", "artifact_hashes", "load_run",
           "verify_run", "write_json_atomic", "write_text_atomic"]
MANIFEST = "manifest.json"
# derived files that may appear beside the evidence after it was recorded (never hashed):
# the manifest itself, hidden (temporary) files, and these directories
DERIVED_DIRS = ("residency.parquet.cache",)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """The suite's one atomic write: `text` to a hidden temp file beside `path`, fsync, then
    rename over `path` (readers see the old file or the new one, never a part); returns the
    path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, allow_nan: bool = True
                      ) -> Path:
    """Write `data` as indented JSON to `path` atomically (`write_text_atomic`); returns the
    path. With `allow_nan=False`, NaN or infinity raises ValueError before anything is
    written."""
    text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=allow_nan) + "\n"
    return write_text_atomic(path, text)


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
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("schema", "status", "design", "device_kind", "service", "service_name",
               "params", "versions", "host", "started_at", "ended_at", "order", "runs",
               "artifacts", "error")

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
        known = {k: data[k] for k in cls._FIELDS if k in data}
        extra = {k: v for k, v in data.items() if k not in cls._FIELDS}
        return cls(**{k: v for k, v in known.items() if v is not None or k in (
            "design", "service", "service_name", "started_at", "ended_at", "error")},
            extra=extra)

    @classmethod
    def read(cls, root: str | os.PathLike[str]) -> Manifest:
        """The manifest of the run directory `root`."""
        path = Path(root) / MANIFEST
        return cls.from_dict(_read_json(path), path=path)

    def write(self, root: str | os.PathLike[str]) -> Path:
        """Write `root/manifest.json` atomically."""
        return write_json_atomic(Path(root) / MANIFEST, self.to_dict())

    def fail(self, root: str | os.PathLike[str], error: str) -> None:
        """Record `error` and the end time, status staying `incomplete`, and write."""
        self.error, self.ended_at = error, _now()
        self.write(root)

    def complete(self, root: str | os.PathLike[str]) -> None:
        """Hash every artifact, mark the run `complete` with its end time, and write."""
        self.artifacts = artifact_hashes(root)
        self.ended_at, self.status = _now(), "complete"
        self.write(root)


class RunDirError(ValueError):
    """A run directory that cannot be read as the contract says; names the file and field."""

    def __init__(self, path: Path | str, message: str, *, field: str | None = None) -> None:
        self.path = Path(path)
        self.field = field
        where = f"{self.path}" + (f": field `{field}`" if field else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class RunEntry:
    """One measured service run listed in the manifest."""

    arm: str
    index: int
    dir: Path  # absolute
    e2e_s: float | None
    profiled: bool
    request_id: str | None

    @property
    def name(self) -> str:
        """The run's directory name, e.g. `00-baseline`."""
        return self.dir.name

    @property
    def trace_dir(self) -> Path | None:
        """`trace/` of this run when it exists."""
        t = self.dir / "trace"
        return t if t.is_dir() else None


@dataclass(frozen=True)
class Run:
    """A loaded run directory: its manifest (read-only) and its measured runs."""

    path: Path
    manifest: MappingProxyType = field(repr=False)
    runs: tuple[RunEntry, ...] = ()

    @property
    def device_kind(self) -> str:
        """`npu`, `cuda`, `emulated-npu` (or `cpu`)."""
        return str(self.manifest["device_kind"])

    @property
    def status(self) -> str:
        """`complete` or `incomplete`."""
        return str(self.manifest["status"])

    @property
    def design(self) -> str | None:
        """`profiled-pair` or `alternating`, when recorded."""
        return self.manifest.get("design")

    def arm(self, arm: str) -> tuple[RunEntry, ...]:
        """Runs of one arm, in index order."""
        return tuple(r for r in self.runs if r.arm == arm)

    def client(self, run: RunEntry) -> dict[str, Any]:
        """The run's `client.json`."""
        return _read_json(run.dir / "client.json")

    def decisions(self, run: RunEntry, *, warmup: bool = False) -> pd.DataFrame:
        """Policy decisions of all ranks of one run, one row per call (warm-up excluded
        unless `warmup`), snapshot fields flattened; empty frame with the columns if none."""
        rows = []
        for f in sorted(run.dir.glob("decisions-rank*.jsonl")):
            rows.extend(_read_decisions(f))
        df = pd.DataFrame(rows, columns=list(DECISION_COLUMNS))
        if not warmup:
            df = df[~df["warmup"].astype(bool)].reset_index(drop=True)
        return df


def load_run(path: str | Path, *, allow_incomplete: bool = False, verify: bool = True) -> Run:
    """Load the run directory at `path`.

    Raises:
        RunDirError: missing directory, missing or invalid `manifest.json`, a missing or
            wrong field, a listed run directory that is absent, or `status` other than
            `complete` (unless `allow_incomplete`; then runs never written are left out),
            or a complete run whose artifacts differ from their recorded sha256 (unless
            `verify` is False).
    """
    root = Path(path)
    if not root.is_dir():
        raise RunDirError(root, "run directory does not exist")
    manifest = _read_json(root / MANIFEST)
    Manifest.from_dict(manifest, path=root / MANIFEST)
    if manifest["status"] != "complete" and not allow_incomplete:
        raise RunDirError(root / "manifest.json", f"status is {manifest['status']!r}, not "
                          "'complete' (pass allow_incomplete=True / --allow-incomplete to read "
                          "it anyway)", field="status")
    if verify:
        _verify_artifacts(root, manifest)
    complete = manifest["status"] == "complete"
    entries = (_entry(root, i, r, required=complete) for i, r in enumerate(manifest["runs"]))
    runs = tuple(sorted((e for e in entries if e is not None), key=lambda r: r.index))
    return Run(path=root.resolve(), manifest=MappingProxyType(manifest), runs=runs)


# ----------------------------------------------------------------------------- steps
def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise RunDirError(path, "file is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(path, f"invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RunDirError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def _verify_artifacts(root: Path, manifest: dict[str, Any]) -> None:
    """Refuse a complete run whose files differ from the sha256 recorded in its manifest
    (a run recorded without a sha256 list is read unverified; `residency verify` says so)."""
    if manifest["status"] != "complete" or not manifest.get("artifacts"):
        return
    result = verify_run(root)
    if not result.ok:
        raise RunDirError(root / "manifest.json", "failed verification: " + result.summary()
                          + " (run `residency verify` for the list; pass verify=False / "
                          "--no-verify to read it anyway)", field="artifacts")


@dataclass(frozen=True)
class Verification:
    """Outcome of checking a run directory against its manifest's sha256 list."""

    path: Path
    checked: int
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing is missing, extra or changed."""
        return not (self.missing or self.extra or self.changed)

    def summary(self) -> str:
        """One line: counts of each finding."""
        if self.ok:
            return f"{self.checked} artifacts verified"
        return (f"{len(self.missing)} missing, {len(self.extra)} extra, {len(self.changed)} "
                f"changed of {self.checked} recorded artifacts")

    def lines(self) -> list[str]:
        """The summary, then one line per finding."""
        out = [f"{self.path}: {self.summary()}"]
        for what, names in (("missing", self.missing), ("extra", self.extra),
                            ("changed", self.changed)):
            out += [f"  {what:<8} {name}" for name in names]
        return out

    def __repr__(self) -> str:
        return f"Verification({self.path.name}: {self.summary()})"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_hashes(root: str | Path) -> dict[str, str]:
    """sha256 of every evidence file under `root` by POSIX relative path (the manifest,
    hidden temporary files and derived caches excluded)."""
    root = Path(root)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.as_posix() == MANIFEST or any(
                part.startswith(".") or part in DERIVED_DIRS for part in rel.parts):
            continue
        out[rel.as_posix()] = sha256_file(path)
    return out


def verify_run(path: str | Path) -> Verification:
    """Recompute the sha256 of every artifact and compare with `manifest.json`."""
    root = Path(path)
    manifest = _read_json(root / "manifest.json")
    recorded = manifest.get("artifacts")
    if not isinstance(recorded, dict) or not recorded:
        raise RunDirError(root / "manifest.json", "no sha256 list recorded (the run never "
                          "completed, or predates verification)", field="artifacts")
    actual = artifact_hashes(root)
    return Verification(
        path=root, checked=len(recorded),
        missing=tuple(sorted(set(recorded) - set(actual))),
        extra=tuple(sorted(set(actual) - set(recorded))),
        changed=tuple(sorted(k for k in set(recorded) & set(actual) if recorded[k] != actual[k])),
    )


def _entry(root: Path, i: int, r: Any, *, required: bool) -> RunEntry | None:
    mpath = root / "manifest.json"
    if not isinstance(r, dict):
        raise RunDirError(mpath, "must be an object", field=f"runs[{i}]")
    for key in ("arm", "index", "dir"):
        if key not in r:
            raise RunDirError(mpath, "missing", field=f"runs[{i}].{key}")
    run_dir = root / str(r["dir"])
    if not run_dir.is_dir():
        if not required:  # an incomplete run may list a run it never wrote
            return None
        raise RunDirError(run_dir, f"run directory listed in manifest.json runs[{i}] is missing")
    e2e = r.get("e2e_s")
    return RunEntry(arm=str(r["arm"]), index=int(r["index"]), dir=run_dir.resolve(),
                    e2e_s=None if e2e is None else float(e2e), profiled=bool(r.get("profiled")),
                    request_id=r.get("request_id"))


def _read_decisions(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunDirError(path, f"line {lineno}: invalid JSON ({exc.msg})") from None
            snap = rec.pop("snapshot", None) or {}
            rec.update({k: snap.get(k) for k in ("reserved", "allocated", "free", "total")})
            try:
                rec["duration_ns"] = int(rec["end_ns"]) - int(rec["start_ns"])
            except (KeyError, TypeError, ValueError):
                raise RunDirError(path, f"line {lineno}: needs integer start_ns and end_ns",
                                  field="start_ns/end_ns") from None
            rec["warmup"] = str(rec.get("request_id", "")).startswith("warmup-")
            rec["file"] = path.name
            rows.append(rec)
    return rows
