"""The run model: a run directory as the files hold it, without torch.

One entry point, `load_run`, goes: read manifest -> check fields (`Manifest.from_dict`) ->
check status -> verify artifacts -> build `Run`. Decisions and client records are read on
demand from a `Run`, each file once a command (`RunReading`), through its format's own module
(`residency.records`). `Run.decisions` returns the records as the files hold them; which
request each belongs to is a separate step (`residency.rundir.assignment.assigned_decisions`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, get_args

import pandas as pd

from residency.devices import REGISTRY
from residency.policy.cache import Kind, Outcome, Reason
from residency.records import decisions as decisions_format
from residency.records.client import CLIENT, read_client
from residency.records.files import (
    RunDirError,
    RunReading,
    UnsafePathError,
    confined,
    finite_field,
    int_field,
    printable,
    walk_files,
)
from residency.records.manifest import (
    MANIFEST,
    Manifest,
    is_derived,
    read_manifest,
)
from residency.records.seal import SEAL_FIELD, run_digest, seal_findings

DECISION_COLUMNS = (
    "rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason", "start_ns",
    "end_ns", "wall_ns", "reserved", "allocated", "free", "total", "error",
    "max_cached_fraction", "min_free_fraction", "duration_ns", "warmup", "file",
)

__all__ = ["DECISION_COLUMNS", "Run", "RunDirError", "RunEntry", "RunReading", "Verification",
           "load_run", "project_commit", "run_entries", "verify_run",
           "versions"]
# (`RunDirError` and `RunReading` are `residency.records.files`'s, named here for the readers
# of a run; the formats' own names live in their modules under `residency.records`)


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
    verified: bool = False  # every read must then match the sealed sha256 of its file
    reading: RunReading = field(default_factory=RunReading, repr=False, compare=False)

    def _sealed(self, path: Path) -> str | None:
        """The sealed sha256 of `path` when the run was verified (every read is checked
        against it: the bytes parsed are the bytes verified), else None."""
        if not self.verified:
            return None
        try:
            rel = path.relative_to(self.path).as_posix()
        except ValueError:
            return None
        sha = (self.manifest.get("artifacts") or {}).get(rel)
        if sha is None:
            raise RunDirError(path, "is not in the run's sha256 list (never sealed)")
        return str(sha)

    @property
    def sealed_artifacts(self) -> dict[str, str] | None:
        """The sealed sha256 (hex) of every artifact, by POSIX path relative to `path`, when
        the run was verified (every read must then match it), else None."""
        if not self.verified:
            return None
        return {str(k): str(v) for k, v in (self.manifest.get("artifacts") or {}).items()}

    def _read_decisions(self, run: RunEntry) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        budget = [decisions_format.MAX_DECISIONS_BYTES]
        kind = self.device_kind
        kinds = (kind, REGISTRY[kind].torch_type) if kind in REGISTRY else (kind,)
        memo = self.reading.parsed
        if ("decisions", str(run.dir)) in memo:  # parsed once a command
            return [dict(r) for r in memo[("decisions", str(run.dir))]]
        files = decisions_format.files_of(
            run.dir, ranks=(self.manifest.get("params") or {}).get("ranks"),
            builtin=self.manifest.get("service") != "external")
        for rank, f in files:
            expect = decisions_format.Expected(rank=rank, arm=run.arm, device_kinds=kinds,
                                               values=_DECISION_VALUES)
            rows.extend(decisions_format.read_decisions(
                f, expect=expect, sha256=self._sealed(f), budget=budget, reading=self.reading))
        memo[("decisions", str(run.dir))] = rows
        return [dict(r) for r in rows]

    @property
    def device_kind(self) -> str:
        """`npu`, `cuda`, `emulated-npu` (or `cpu`)."""
        return str(self.manifest["device_kind"])

    @property
    def status(self) -> str:
        """`complete` or `incomplete`."""
        return str(self.manifest["status"])

    @property
    def injection(self) -> str:
        """The failure injected into the run's baseline (`params.inject_failure`), or
        "none" (`residency.devices.injection_of`)."""
        from residency import devices

        return devices.injection_of(self.manifest.get("params"))

    @property
    def design(self) -> str | None:
        """`profiled-pair` or `alternating`, when recorded."""
        return self.manifest.get("design")

    def arm(self, arm: str) -> tuple[RunEntry, ...]:
        """Runs of one arm, in index order."""
        return tuple(r for r in self.runs if r.arm == arm)

    def client(self, run: RunEntry) -> dict[str, Any]:
        """The run's `client.json`, its fields checked, in the current layout whatever
        layout it was recorded in (`residency.records.client.read_client`; the file is never
        rewritten)."""
        path = run.dir / CLIENT
        memo = self.reading.parsed
        key = ("client", str(path))
        if key not in memo:  # read, checked and parsed once a command
            memo[key] = read_client(path, sha256=self._sealed(path), reading=self.reading)
        return copy.deepcopy(memo[key])

    def decisions(self, run: RunEntry) -> pd.DataFrame:
        """The policy decisions of all ranks of one service run as the files hold them: every
        call (warm-up included), one row per call, snapshot fields flattened, with
        `duration_ns`, `warmup` (its recorded request id starts `warmup-`) and `file`; an
        empty frame with the columns if none. Which request each belongs to is a step of its
        own: `residency.rundir.assignment.assigned_decisions`."""
        return pd.DataFrame(self._read_decisions(run), columns=list(DECISION_COLUMNS))


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
    reading = RunReading()  # every file of the run read once for this load
    manifest = read_manifest(root, reading=reading)  # the one read of the manifest:
    Manifest.from_dict(manifest, path=root / MANIFEST)  # the figures and the seal check alike
    if manifest["status"] != "complete" and not allow_incomplete:
        raise RunDirError(root / MANIFEST, f"status is {manifest['status']!r}, not "
                          "'complete' (pass allow_incomplete=True / --allow-incomplete to read "
                          "it anyway)", field="status")
    verified = verify and _verify_artifacts(root, manifest, reading)
    runs = run_entries(root, manifest["runs"], required=manifest["status"] == "complete")
    return Run(path=root.resolve(), manifest=MappingProxyType(manifest), runs=runs,
               verified=verified, reading=reading)


def _verify_artifacts(root: Path, manifest: dict[str, Any], reading: RunReading) -> bool:
    """Refuse a complete run whose files or manifest differ from what was recorded when it
    completed (a run recorded without a sha256 list is read unverified; `residency verify`
    says so). True when verified (later reads are then checked against the sealed sha256)."""
    if manifest["status"] != "complete" or not manifest.get("artifacts"):
        return False
    result = _verify(root, manifest, reading)  # the manifest read, not a second reading
    if not result.ok:
        first = result.findings()[0] if result.findings() else ""
        raise RunDirError(root / MANIFEST, "failed verification: " + result.summary()
                          + (f"; first: {first}" if first else "")
                          + " (run `residency verify` for the list; pass verify=False / "
                          "--no-verify to read it anyway)", field="artifacts")
    return True


@dataclass(frozen=True)
class Verification:
    """Outcome of checking a run directory against its seal: the manifest's own fields, the
    sha256 of every artifact, client records against the manifest, and (when given) the
    digest an author quoted."""

    path: Path
    checked: int
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unsafe: tuple[str, ...] = ()      # "rel: what it is" (FIFO, link, device, ...)
    manifest: tuple[str, ...] = ()    # seal findings: manifest fields edited since sealing
    mismatched: tuple[str, ...] = ()  # manifest fields that disagree with the run's files
    invalid: tuple[str, ...] = ()     # manifest fields the analysis refuses (`run_entries`)
    digest: str | None = None         # sha256:... of the run as it is now
    expected_digest: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing is missing, extra, changed, unsafe, edited, mismatched or
        invalid, and the digest equals the quoted one (when quoted)."""
        return not (self.missing or self.extra or self.changed or self.unsafe or self.manifest
                    or self.mismatched or self.invalid or self.digest_differs)

    @property
    def digest_differs(self) -> bool:
        """A quoted digest was given and the run's digest is another."""
        return self.expected_digest is not None and self.digest != self.expected_digest

    def findings(self) -> list[str]:
        """Every finding, one line each."""
        out = [f"digest   {self.digest} is not the quoted {self.expected_digest}"
               ] if self.digest_differs else []
        out += [f"manifest {m}" for m in self.manifest]
        out += [f"mismatch {m}" for m in self.mismatched]
        out += [f"invalid  {m}" for m in self.invalid]
        for what, names in (("unsafe", self.unsafe), ("missing", self.missing),
                            ("extra", self.extra), ("changed", self.changed)):
            out += [f"{what:<8} {name}" for name in names]
        return [printable(line) for line in out]  # names come from the run: never raw

    def summary(self) -> str:
        """One line: counts of each finding."""
        if self.ok:
            quoted = " and the quoted digest" if self.expected_digest else ""
            return f"{self.checked} artifacts and the manifest verified{quoted}"
        parts = [f"{len(self.missing)} missing, {len(self.extra)} extra, {len(self.changed)} "
                 f"changed of {self.checked} recorded artifacts"]
        if self.unsafe:
            parts.append(f"{len(self.unsafe)} not regular files")
        if self.manifest:
            parts.append(f"{len(self.manifest)} manifest fields edited")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} manifest fields disagree with the files")
        if self.invalid:
            parts.append(f"{len(self.invalid)} manifest fields invalid")
        if self.digest_differs:
            parts.append("digest differs from the quoted one")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """The summary, the run's digest, then one line per finding."""
        out = [printable(f"{self.path}: {self.summary()}")]
        if self.digest:
            out.append(f"  digest   {self.digest}")
        return out + [f"  {line}" for line in self.findings()]

    def __repr__(self) -> str:
        return f"Verification({self.path.name}: {self.summary()})"


def _client_mismatches(root: Path, manifest: dict[str, Any], reading: RunReading
                       ) -> list[str]:
    """Manifest run fields that disagree with the run's own `client.json`."""
    out = []
    runs = manifest.get("runs")
    for i, r in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(r, dict):
            continue
        try:
            run_dir = confined(root, r.get("dir"), what=f"runs[{i}].dir")
            client = read_client(run_dir / CLIENT, reading=reading, check=False)
        except (UnsafePathError, RunDirError):
            continue  # reported as a manifest or artifact finding
        said = {"e2e_s": ("median_e2e_s", client.get("median_e2e_s")),
                "arm": ("arm", client.get("arm")), "index": ("index", client.get("index"))}
        if len(client["requests"]) == 1:
            said["request_id"] = ("requests[0].request_id",
                                  client["requests"][0].get("request_id"))
        for key, (field_name, value) in said.items():
            if key in r and value is not None and value != r[key]:
                out.append(f"runs[{i}].{key} is {r[key]!r} but {r.get('dir')}/client.json "
                           f"says {value!r} ({field_name})")
    return out


def verify_run(path: str | Path, *, expected_digest: str | None = None) -> Verification:
    """Check a run directory against its seal: every artifact's sha256, every manifest
    field, each `runs[].e2e_s` against its `client.json`, the `runs` entries as the analysis
    reads them (`run_entries`: paths, types, duplicates), and the quoted digest if given."""
    root = Path(path)
    reading = RunReading()
    return _verify(root, read_manifest(root, reading=reading), reading,
                   expected_digest=expected_digest)


def _verify(root: Path, manifest: dict[str, Any], reading: RunReading, *,
            expected_digest: str | None = None) -> Verification:
    """`verify_run` of the manifest as read (by `reading`, which reads every other file)."""
    recorded = manifest.get("artifacts")
    if not isinstance(recorded, dict) or not recorded:
        raise RunDirError(root / MANIFEST, "no sha256 list recorded (the run never "
                          "completed, or predates verification)", field="artifacts")
    actual: dict[str, str] = {}
    unsafe = []
    for rel, p, other in walk_files(root):
        if is_derived(rel):
            continue
        if other is not None:
            unsafe.append(f"{rel}: {other}")
            continue
        actual[rel] = reading.sha256(p)
    manifest_findings = seal_findings(manifest) if SEAL_FIELD in manifest or manifest.get(
        "status") == "complete" else []
    if manifest.get(SEAL_FIELD) is None and manifest_findings:
        # sealed runs are the norm from this version on; older runs say so once
        manifest_findings = [f + " (edits to the manifest cannot be detected)"
                             for f in manifest_findings]
    try:
        digest = run_digest(manifest)
    except ValueError:
        digest = None
    return Verification(
        path=root, checked=len(recorded),
        missing=tuple(sorted(set(recorded) - set(actual))),
        extra=tuple(sorted(set(actual) - set(recorded))),
        changed=tuple(sorted(k for k in set(recorded) & set(actual) if recorded[k] != actual[k])),
        unsafe=tuple(unsafe), manifest=tuple(manifest_findings),
        mismatched=tuple(_client_mismatches(root, manifest, reading)),
        invalid=tuple(_entry_findings(root, manifest)),
        digest=digest, expected_digest=expected_digest,
    )


def _entry(root: Path, i: int, r: Any, *, required: bool) -> RunEntry | None:
    mpath = root / MANIFEST
    if not isinstance(r, dict):
        raise RunDirError(mpath, "must be an object", field=f"runs[{i}]")
    for key in ("arm", "index", "dir"):
        if key not in r:
            raise RunDirError(mpath, "missing", field=f"runs[{i}].{key}")
    if not isinstance(r["arm"], str):
        raise RunDirError(mpath, f"must be a string, got {type(r['arm']).__name__}",
                          field=f"runs[{i}].arm")
    index = int_field(mpath, r["index"], f"runs[{i}].index", hi=10**6)
    try:
        run_dir = confined(root, r["dir"], what=f"runs[{i}].dir")
    except UnsafePathError as exc:
        raise RunDirError(mpath, str(exc), field=f"runs[{i}].dir") from None
    if not run_dir.is_dir():
        if not required:  # an incomplete run may list a run it never wrote
            return None
        raise RunDirError(run_dir, f"run directory listed in manifest.json runs[{i}] is missing")
    e2e = finite_field(mpath, r.get("e2e_s"), f"runs[{i}].e2e_s")
    request_id = r.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise RunDirError(mpath, f"must be a string or null, got {type(request_id).__name__}",
                          field=f"runs[{i}].request_id")
    return RunEntry(arm=r["arm"], index=index, dir=run_dir.resolve(), e2e_s=e2e,
                    profiled=bool(r.get("profiled")), request_id=request_id)


def run_entries(root: Path, runs: Sequence[Any], *, required: bool = True
                ) -> tuple[RunEntry, ...]:
    """The manifest's `runs` as `RunEntry`s in index order: the one check of every entry
    (`load_run` and `verify_run` both apply it). With `required`, every listed run directory
    must exist; otherwise one never written is left out.

    Raises:
        RunDirError: an entry with a missing or wrong field (its `dir` a relative POSIX path
            inside the run), or two entries with the same `index` or `dir` (naming them).
    """
    mpath = root / MANIFEST
    entries = [_entry(root, i, r, required=required) for i, r in enumerate(runs)]
    for key, norm in (("index", int), ("dir", lambda d: PurePosixPath(d).as_posix())):
        first: dict[Any, int] = {}
        for i, r in enumerate(runs):
            value = norm(r[key])
            if value in first:
                raise RunDirError(mpath, f"runs[{first[value]}] and runs[{i}] both have "
                                  f"{key} {printable(repr(r[key]))[:200]} (each service run "
                                  "is listed once)", field=f"runs[{i}].{key}")
            first[value] = i
    return tuple(sorted((e for e in entries if e is not None), key=lambda r: r.index))


def _entry_findings(root: Path, manifest: dict[str, Any]) -> list[str]:
    """What `run_entries` refuses in the manifest's `runs`, as verify findings."""
    runs = manifest.get("runs")
    if not isinstance(runs, list):
        return []  # a seal finding, or refused by `Manifest.from_dict`
    try:
        run_entries(root, runs, required=False)
    except RunDirError as exc:
        return [f"{MANIFEST}{str(exc).removeprefix(str(exc.path))}"]
    return []


# the values a decision's string fields may take (`residency.policy.cache`, the one writer)
_DECISION_VALUES: dict[str, tuple[str, ...]] = {
    "kind": get_args(Kind), "outcome": get_args(Outcome), "reason": get_args(Reason)}


def project_commit(root: Path | None = None) -> str | None:
    """The git commit of the project's own checkout: HEAD of the repository whose top level
    is `root` (default: the folder holding this package and residency's pyproject.toml);
    None when that folder is not a repository's top level (an installed copy, or a copy
    vendored inside another project's repository, whose commit says nothing about this
    code) or git cannot tell."""
    if root is None:
        root = Path(__file__).resolve().parent.parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not re.search(r'(?m)^name\s*=\s*"residency"\s*$', text):
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, cwd=root, timeout=10,
                             check=True).stdout.split("\n")
        if len(out) >= 2 and out[0] and os.path.samefile(out[0], root):
            return out[1].strip() or None
    return None


def versions() -> dict[str, Any]:
    """python, torch, torch-npu, residency and the git commit of its own checkout
    (`project_commit`: None for an installed or vendored copy)."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    commit = project_commit()
    return {"python": platform.python_version(), "torch": ver("torch"),
            "torch_npu": ver("torch-npu") or ver("torch_npu"), "residency": ver("residency"),
            "git_commit": commit}
