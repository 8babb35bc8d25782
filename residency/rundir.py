"""Read a run directory (see docs/contracts.md) without torch.

One entry point, `load_run`, goes: read manifest -> check fields -> check status -> verify
artifacts -> build `Run`. Decisions and client records are read on demand from a `Run`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

SCHEMA = "residency.run/1"
DEVICE_KINDS = ("npu", "cuda", "emulated-npu", "cpu")
STATUSES = ("complete", "incomplete")
DECISION_COLUMNS = (
    "rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason", "start_ns",
    "end_ns", "wall_ns", "reserved", "allocated", "free", "total", "error",
    "max_cached_fraction", "min_free_fraction", "duration_ns", "warmup", "file",
)

__all__ = ["RunDirError", "RunEntry", "Run", "load_run", "DECISION_COLUMNS"]


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


def load_run(path: str | Path, *, allow_incomplete: bool = False) -> Run:
    """Load the run directory at `path`.

    Raises:
        RunDirError: missing directory, missing or invalid `manifest.json`, a missing or
            wrong field, a listed run directory that is absent, or `status` other than
            `complete` (unless `allow_incomplete`; then runs never written are left out).
    """
    root = Path(path)
    if not root.is_dir():
        raise RunDirError(root, "run directory does not exist")
    manifest = _read_json(root / "manifest.json")
    _check_manifest(root / "manifest.json", manifest)
    if manifest["status"] != "complete" and not allow_incomplete:
        raise RunDirError(root / "manifest.json", f"status is {manifest['status']!r}, not "
                          "'complete' (pass allow_incomplete=True / --allow-incomplete to read "
                          "it anyway)", field="status")
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


def _check_manifest(path: Path, m: dict[str, Any]) -> None:
    for key in ("schema", "status", "device_kind", "runs"):
        if key not in m:
            raise RunDirError(path, "missing", field=key)
    if m["schema"] != SCHEMA:
        raise RunDirError(path, f"expected {SCHEMA!r}, got {m['schema']!r}", field="schema")
    if m["status"] not in STATUSES:
        raise RunDirError(path, f"must be one of {list(STATUSES)}, got {m['status']!r}",
                          field="status")
    if m["device_kind"] not in DEVICE_KINDS:
        raise RunDirError(path, f"must be one of {list(DEVICE_KINDS)}, got "
                          f"{m['device_kind']!r}", field="device_kind")
    if not isinstance(m["runs"], list):
        raise RunDirError(path, "must be a list", field="runs")


def _verify_artifacts(root: Path, manifest: dict[str, Any]) -> None:
    """Check listed artifacts against their sha256 (placeholder: another issue adds it)."""
    return None


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
