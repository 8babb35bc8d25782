"""Read a run directory (see docs/contracts.md) without torch.

One entry point, `load_run`, goes: read manifest -> check fields -> check status -> verify
artifacts -> build `Run`. Decisions and client records are read on demand from a `Run`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
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

__all__ = ["RunDirError", "RunEntry", "Run", "Verification", "artifact_hashes", "load_run",
           "verify_run", "DECISION_COLUMNS"]
# derived files that may appear beside the evidence after it was recorded (never hashed)
DERIVED_DIRS = ("residency.parquet.cache",)


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
    manifest = _read_json(root / "manifest.json")
    _check_manifest(root / "manifest.json", manifest)
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


def add_cli(subparsers: Any) -> None:
    """Register `verify`."""
    p = subparsers.add_parser("verify", help="check a run directory against its sha256 list",
                              description="Recompute the sha256 of every artifact of RUN_DIR "
                              "and report missing, extra and changed files (exit 1 if any).")
    p.add_argument("run_dir", metavar="RUN_DIR")


def run_cli(args: Any) -> int:
    """Run `verify`."""
    import sys

    try:
        result = verify_run(args.run_dir)
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    return 0 if result.ok else 1


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
    if m["device_kind"] not in RECORDED_KINDS:
        raise RunDirError(path, f"must be one of {list(RECORDED_KINDS)}, got "
                          f"{m['device_kind']!r}", field="device_kind")
    if not isinstance(m["runs"], list):
        raise RunDirError(path, "must be a list", field="runs")


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
        if rel.as_posix() == "manifest.json" or any(
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
