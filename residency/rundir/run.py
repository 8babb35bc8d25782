"""The run-directory format (docs/contracts.md), both ways, without torch.

Writing: `Manifest` is the one type of `manifest.json` (schema, fields, atomic write,
sha256 list with its derived-file exclusions); `write_json_atomic` writes any JSON file of
the suite. Reading: one entry point, `load_run`, goes: read manifest -> check fields
(`Manifest.from_dict`) -> check status -> verify artifacts -> build `Run`. Decisions and
client records are read on demand from a `Run`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, get_args

import pandas as pd

from residency.devices import RECORDED_KINDS, REGISTRY
from residency.errors import BadInput
from residency.jsonio import write_json_atomic
from residency.policy.cache import Kind, Outcome, Reason
from residency.rundir.layout import (
    CLIENT,
    DECISIONS_GLOB,
    MANIFEST,
    SCHEMA,
    STATUSES,
    decisions_file,
)
from residency.rundir.seal import (
    CHANGED_SINCE_VERIFIED,
    SEAL_FIELD,
    UnsafePathError,
    confined,
    open_regular,
    printable,
    read_regular,
    run_digest,
    seal_findings,
    sha256_regular,
    walk_files,
)
from residency.rundir.seal import seal as seal_manifest

DECISION_COLUMNS = (
    "rank", "request_id", "arm", "device_kind", "kind", "outcome", "reason", "start_ns",
    "end_ns", "wall_ns", "reserved", "allocated", "free", "total", "error",
    "max_cached_fraction", "min_free_fraction", "duration_ns", "warmup", "file",
)

__all__ = ["DECISION_COLUMNS", "MANIFEST", "SCHEMA", "Manifest", "Run",
           "RunDirError", "RunEntry", "RunReading", "Verification", "artifact_hashes",
           "load_run", "load_decisions", "project_commit", "run_entries", "verify_run",
           "versions"]
# the manifest's atomic writer's temporary file: never evidence. Hidden files are evidence like
# any other: sealed, and listed by `verify` when they appear later (trace discovery never
# reads them either).
_MANIFEST_TMP = f".{MANIFEST}.tmp"
# all decisions files of one service run together (a real 8-rank run of a thousand requests
# writes about 10 MB); parsed records take about ten times their bytes in memory
MAX_DECISIONS_BYTES = 32 * 1024 * 1024
MAX_DECISION_LINE_BYTES = 1024 * 1024
# a file of a run at most this large is kept in memory once read (its bytes hashed as read):
# every later use of it in the same command takes those bytes, never the disk again
KEEP_BYTES = 16 * 1024 * 1024
KEEP_TOTAL_BYTES = 256 * 1024 * 1024


class RunReading:
    """One command's reading of a run directory: each file read once, hashed as it is read,
    its bytes kept (up to `KEEP_BYTES` a file, `KEEP_TOTAL_BYTES` in all), and what was
    parsed from them memoised (`parsed`), so that verifying the run and analysing it use the
    same bytes, and every analysis of the command (tables, whatif, notebooks, verify) the
    same reading. Larger files (traces) are hashed in a stream and read again by their own
    sealed readers."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[bytes, str]] = {}
        self._kept_bytes = 0
        self.parsed: dict[tuple[str, str], Any] = {}

    @staticmethod
    def _key(path: Path) -> str:
        return os.path.abspath(path)

    def read(self, path: Path, sha256: str | None = None) -> bytes:
        """The bytes of `path` (read once, then kept); with `sha256`, they must have it."""
        key = self._key(path)
        got = self._kept.get(key)
        if got is None:
            data = _read_bytes(path)
            got = (data, hashlib.sha256(data).hexdigest())
            if len(data) <= KEEP_BYTES and self._kept_bytes + len(data) <= KEEP_TOTAL_BYTES:
                self._kept[key] = got
                self._kept_bytes += len(data)
        if sha256 is not None and got[1] != sha256:
            raise RunDirError(path, CHANGED_SINCE_VERIFIED)
        return got[0]

    def sha256(self, path: Path) -> str:
        """Hex sha256 of `path`: of the bytes kept (read now when small enough), else of a
        stream of it."""
        key = self._key(path)
        if key not in self._kept:
            try:
                size = os.lstat(path).st_size
            except OSError:
                size = KEEP_BYTES + 1  # (the streamed read names the problem)
            if size > KEEP_BYTES or self._kept_bytes + size > KEEP_TOTAL_BYTES:
                return sha256_file(path)
            with _reading(path):
                self.read(path)
            if key not in self._kept:  # (grew past the bound while read)
                return sha256_file(path)
        return self._kept[key][1]

    def kept(self, path: Path) -> bool:
        """Whether the bytes of `path` are held."""
        return self._key(path) in self._kept


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
        return cls.from_dict(_read_json(path), path=path)

    def write(self, root: str | os.PathLike[str]) -> Path:
        """Write `root/manifest.json` atomically."""
        return write_json_atomic(Path(root) / MANIFEST, self.to_dict())

    def fail(self, root: str | os.PathLike[str], error: str) -> None:
        """Record `error` and the end time, status staying `incomplete`, and write."""
        self.error, self.ended_at = error, _now()
        self.write(root)

    def complete(self, root: str | os.PathLike[str]) -> str:
        """Hash every artifact, mark the run `complete` with its end time, seal the manifest
        (`residency.rundir.seal`) and write; returns the run's digest (`sha256:...`)."""
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


class RunDirError(BadInput):
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
        budget = [MAX_DECISIONS_BYTES]
        kind = self.device_kind
        kinds = (kind, REGISTRY[kind].torch_type) if kind in REGISTRY else (kind,)
        memo = self.reading.parsed
        if ("decisions", str(run.dir)) in memo:  # parsed once a command
            return [dict(r) for r in memo[("decisions", str(run.dir))]]
        for rank, f in _decisions_files(run, self.manifest):
            expect = _Expected(rank=rank, arm=run.arm, device_kinds=kinds)
            rows.extend(_read_decisions(f, sha256=self._sealed(f), budget=budget,
                                        expect=expect, reading=self.reading))
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
        """The run's `client.json`, its fields checked (see `check_client`), in the current
        layout whatever layout it was recorded in (`upgrade_client`; the file is never
        rewritten)."""
        path = run.dir / CLIENT
        memo = self.reading.parsed
        key = ("client", str(path))
        if key not in memo:  # read, checked and parsed once a command
            memo[key] = upgrade_client(check_client(
                path, _read_json(path, sha256=self._sealed(path), reading=self.reading)))
        return copy.deepcopy(memo[key])

    def decisions(self, run: RunEntry, *, warmup: bool = False) -> pd.DataFrame:
        """Policy decisions of all ranks of one run, one row per call, snapshot fields
        flattened; empty frame with the columns if none.

        Without `warmup`: only the decisions attributed to a measured request
        (`residency.rundir.attribution`: by the client's wall-clock windows when recorded, else by
        request id), each with `request` (1.. in order) and `request_id` of that request;
        the warm-up and decisions outside every request are left out (`attribution`
        counts them). With `warmup`: every decision as recorded, with `request` (<NA>
        outside every request) and `warmup` True for each one not attributed to a measured
        request (the warm-up's and those outside every request)."""
        df = pd.DataFrame(self._read_decisions(run), columns=list(DECISION_COLUMNS))
        attr = self.attribution(run, decisions=df)
        number = attr.numbers
        keep = (number.notna() & (number != 0)).fillna(False).astype(bool)
        if warmup:
            return df.assign(request=number, warmup=~keep)
        out = df[keep].assign(request=number[keep].astype("int64"))
        out["request_id"] = [attr.request_id_of(int(n)) for n in out["request"]]
        return out.reset_index(drop=True)

    def attribution(self, run: RunEntry, *, method: str = "auto",
                    decisions: pd.DataFrame | None = None) -> Any:
        """`residency.rundir.attribution.RequestAttribution` of one run: which request each decision
        belongs to (by time when the client recorded wall-clock windows, else by id), and
        the decisions outside every request.

        Raises:
            RunDirError: the run cannot be attributed (e.g. decisions without request ids
                and a client record without wall-clock windows).
        """
        from residency.rundir import attribution as at

        if decisions is None:
            decisions = pd.DataFrame(self._read_decisions(run), columns=list(DECISION_COLUMNS))
        path = run.dir / CLIENT
        try:
            return at.attribute(decisions, self.client(run), method=method, source=str(path))
        except at.AttributionError as exc:
            raise RunDirError(path, str(exc).removeprefix(f"{path}: ")) from None


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
    manifest = _read_json(root / MANIFEST, reading=reading)  # the one read of the manifest:
    Manifest.from_dict(manifest, path=root / MANIFEST)  # the figures and the seal check alike
    if manifest["status"] != "complete" and not allow_incomplete:
        raise RunDirError(root / MANIFEST, f"status is {manifest['status']!r}, not "
                          "'complete' (pass allow_incomplete=True / --allow-incomplete to read "
                          "it anyway)", field="status")
    verified = verify and _verify_artifacts(root, manifest, reading)
    runs = run_entries(root, manifest["runs"], required=manifest["status"] == "complete")
    return Run(path=root.resolve(), manifest=MappingProxyType(manifest), runs=runs,
               verified=verified, reading=reading)


# ----------------------------------------------------------------------------- steps
@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Reading `path`: a missing, unsafe or unreadable file is one `RunDirError` naming it."""
    try:
        yield
    except FileNotFoundError:
        raise RunDirError(path, "file is missing") from None
    except UnsafePathError as exc:
        raise RunDirError(path, str(exc).removeprefix(f"{path}: ")) from None
    except OSError as exc:
        raise RunDirError(path, f"cannot read: {exc.strerror or exc}") from None


def _read_bytes(path: Path, sha256: str | None = None) -> bytes:
    with _reading(path):
        return read_regular(path, sha256=sha256)


class _DuplicateKey(ValueError):
    """A JSON object that names one key twice (readers disagree on which value counts)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(key)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook`: the object, or `_DuplicateKey` naming the first
    key given twice (one pass over the object's own keys: bounded by the text's size)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _loads(path: Path, text: str | bytes, where: str = "") -> Any:
    """`json.loads` with every failure as a RunDirError naming the file (and line); an object
    naming a key twice is refused naming the key (the seal covers the parsed value, and a
    first-wins reader would see another one than this last-wins parser)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise RunDirError(path, f"{where}duplicate key {printable(repr(exc.key))[:200]} in a "
                          "JSON object (readers disagree on which value counts; refused)"
                          ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(path, f"{where}invalid JSON ({exc})") from None
    except RecursionError:
        raise RunDirError(path, f"{where}JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with too many digits
        raise RunDirError(path, f"{where}invalid JSON ({exc})") from None


def _read_json(path: Path, sha256: str | None = None, *,
               reading: RunReading | None = None) -> dict[str, Any]:
    data = _loads(path, _read_bytes(path, sha256) if reading is None
                  else reading.read(path, sha256))
    if not isinstance(data, dict):
        raise RunDirError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


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


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file's bytes (anything else is refused)."""
    return sha256_regular(path)


def _is_derived(rel: str) -> bool:
    """The manifest (and its temporary copy) is the one file a seal does not list: every other
    file of a run, a cache folder a sender planted included, is evidence or extra."""
    return rel in (MANIFEST, _MANIFEST_TMP)


def artifact_hashes(root: str | Path) -> dict[str, str]:
    """sha256 of every evidence file under `root` by POSIX relative path (the manifest and
    derived caches excluded; hidden files included).

    Raises:
        RunDirError: an entry that is not a regular file (FIFO, socket, device, link).
    """
    root = Path(root)
    out = {}
    for rel, path, other in walk_files(root):
        if _is_derived(rel):
            continue
        if other is not None:
            raise RunDirError(path, f"is {other}; a run directory holds regular files only")
        out[rel] = sha256_file(path)
    return out


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
            raw = _read_json(run_dir / CLIENT, reading=reading)
        except (UnsafePathError, RunDirError):
            continue  # reported as a manifest or artifact finding
        client = upgrade_client(raw)
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
    return _verify(root, _read_json(root / MANIFEST, reading=reading), reading,
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
        if _is_derived(rel):
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


_INT64 = 2**63


def _int_field(mpath: Path, value: Any, field: str, *, lo: int = 0, hi: int = _INT64) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise RunDirError(mpath, f"must be an integer in [{lo}, {hi}), got {value!r}"[:200],
                          field=field)
    return value


def _finite_field(mpath: Path, value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunDirError(mpath, f"must be a number or null, got {type(value).__name__}",
                          field=field)
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out) or out < 0:
        raise RunDirError(mpath, f"must be a finite number >= 0, got {value!r}"[:200],
                          field=field)
    return out


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
    index = _int_field(mpath, r["index"], f"runs[{i}].index", hi=10**6)
    try:
        run_dir = confined(root, r["dir"], what=f"runs[{i}].dir")
    except UnsafePathError as exc:
        raise RunDirError(mpath, str(exc), field=f"runs[{i}].dir") from None
    if not run_dir.is_dir():
        if not required:  # an incomplete run may list a run it never wrote
            return None
        raise RunDirError(run_dir, f"run directory listed in manifest.json runs[{i}] is missing")
    e2e = _finite_field(mpath, r.get("e2e_s"), f"runs[{i}].e2e_s")
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


_SNAPSHOT_KEYS = ("reserved", "allocated", "free", "total")
# the values a decision's string fields may take (`residency.policy.cache`, the one writer)
_DECISION_VALUES: dict[str, tuple[str, ...]] = {
    "kind": get_args(Kind), "outcome": get_args(Outcome), "reason": get_args(Reason)}
_DECISIONS_NAME = re.compile(r"decisions-rank(0|[1-9][0-9]{0,5})\.jsonl")


@dataclass(frozen=True)
class _Expected:
    """What a decisions file's lines must say of themselves: its rank (from the file name),
    the arm of its service run, the run's device kind (or that kind's torch device type,
    which the vLLM-Omni adapter records)."""

    rank: int
    arm: str
    device_kinds: tuple[str, ...]


def _decisions_files(run: RunEntry, manifest: Any) -> list[tuple[int, Path]]:
    """(rank, path) of each decisions file of one service run, by rank.

    Raises:
        RunDirError: a file whose name is not `decisions-rank<r>.jsonl` for a rank of the run
            (0..`params.ranks`-1), or, for the built-in service (which creates every rank's
            file when it starts), some ranks' files without the others'. Warns (UserWarning)
            instead for an external service's missing file (its rank may never have loaded
            the adapter; the consecutive gate names the likely cause) and for a service run
            without any decisions file (recorded without decision logs: the evidence falls
            back to the service's per-rank response).
    """
    ranks = (manifest.get("params") or {}).get("ranks")
    found: dict[int, Path] = {}
    for f in sorted(run.dir.glob(DECISIONS_GLOB)):
        m = _DECISIONS_NAME.fullmatch(f.name)
        if m is None:
            raise RunDirError(f, "is not a decisions file name: expected "
                              "decisions-rank<r>.jsonl with r a rank number")
        rank = int(m.group(1))
        if isinstance(ranks, int) and rank >= ranks:
            with _reading(f), open_regular(f):
                pass  # a file that is no regular one is named as such first
            raise RunDirError(f, f"rank {rank} is not a rank of the run (params.ranks = "
                              f"{ranks}: ranks 0..{ranks - 1})")
        found[rank] = f
    if not isinstance(ranks, int) or len(found) == ranks:
        return sorted(found.items())
    # every found rank is < ranks, so the first missing ones lie below len(found) + 3
    missing = [r for r in range(min(ranks, len(found) + 3)) if r not in found]
    names = ", ".join(decisions_file(r) for r in missing) + (
        f" and {ranks - len(found) - len(missing)} more" if ranks - len(found) > len(missing)
        else "")
    if not found:
        warnings.warn(f"{run.dir}: no decisions file (params.ranks = {ranks}; the run was "
                      "recorded without decision logs?): per-rank figures come from the "
                      "service's response in client.json only", UserWarning, stacklevel=4)
    elif manifest.get("service") != "external":
        raise RunDirError(run.dir, f"{names} missing: the built-in service writes one "
                          f"decisions file per rank (params.ranks = {ranks}), so a rank's "
                          "decisions were lost")
    else:
        warnings.warn(f"{run.dir}: {names} missing (params.ranks = {ranks}): the external "
                      "service's rank wrote no decisions file (did its adapter load?); its "
                      "calls are not counted", UserWarning, stacklevel=4)
    return sorted(found.items())


def _decision(path: Path, lineno: int, rec: Any, expect: _Expected | None = None
              ) -> dict[str, Any]:
    """One decisions line checked field by field (ints in int64, finite fractions, `kind`,
    `outcome` and `reason` among the policy's values and agreeing with each other) and, with
    `expect`, against its file (rank, arm, device kind)."""
    where = f"line {lineno}"
    if not isinstance(rec, dict):
        raise RunDirError(path, f"{where}: expected a JSON object, got "
                          f"{type(rec).__name__}")

    def bad(field: str, what: str) -> RunDirError:
        return RunDirError(path, f"{where}: {what}", field=field)

    for key in ("start_ns", "end_ns"):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not -_INT64 <= v < _INT64:
            raise bad(key, "needs integer start_ns and end_ns (int64 nanoseconds), got "
                      f"{v!r}"[:200])
    if rec["end_ns"] < rec["start_ns"]:
        raise bad("end_ns", "end_ns is before start_ns")
    for key in ("rank", "wall_ns"):
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not 0 <= v < _INT64):
            raise bad(key, f"must be an integer in [0, 2**63), got {v!r}"[:200])
    for key in ("max_cached_fraction", "min_free_fraction"):
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v)):
            raise bad(key, f"must be a finite number, got {v!r}"[:200])
    for key in ("request_id", "arm", "device_kind", "kind", "outcome", "reason"):
        v = rec.get(key)
        if v is not None and not isinstance(v, str):
            raise bad(key, f"must be a string, got {type(v).__name__}")
    snap = rec.pop("snapshot", None) or {}
    if not isinstance(snap, dict):
        raise bad("snapshot", f"must be an object or null, got {type(snap).__name__}")
    for key in _SNAPSHOT_KEYS:
        v = snap.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not 0 <= v < _INT64):
            raise bad(f"snapshot.{key}", f"must be bytes as an integer in [0, 2**63), got "
                      f"{v!r}"[:200])
        rec[key] = v
    for key, allowed in _DECISION_VALUES.items():
        if rec.get(key) not in allowed:
            raise bad(key, f"must be one of {list(allowed)}, got "
                      f"{printable(repr(rec.get(key)))}"[:300])
    if (rec["kind"] == "forced") != (rec["reason"] == "forced"):
        raise bad("reason", f"kind {rec['kind']!r} with reason {rec['reason']!r} (a forced "
                  "call has reason 'forced', and only a forced call has it)")
    if (rec["outcome"] == "retained") != (rec["reason"] == "within-bounds"):
        raise bad("outcome", f"outcome {rec['outcome']!r} with reason {rec['reason']!r} (a call "
                  "retains exactly when its reason is 'within-bounds')")
    if expect is not None:
        if rec.get("rank") != expect.rank:
            raise bad("rank", f"rank {rec.get('rank')!r} in the file of rank {expect.rank}")
        if rec.get("arm") is not None and rec["arm"] != expect.arm:
            raise bad("arm", f"{printable(repr(rec['arm']))[:100]} in a run of arm "
                      f"{printable(repr(expect.arm))[:100]} (manifest runs[].arm)")
        if rec.get("device_kind") is not None and rec["device_kind"] not in expect.device_kinds:
            raise bad("device_kind", f"{printable(repr(rec['device_kind']))[:100]} in a run of "
                      f"device kind {expect.device_kinds[0]!r} (manifest device_kind; "
                      f"allowed: {list(expect.device_kinds)})")
    rec["duration_ns"] = rec["end_ns"] - rec["start_ns"]
    rec["warmup"] = str(rec.get("request_id") or "").startswith("warmup-")
    rec["file"] = path.name
    return rec


def _read_decisions(path: Path, *, sha256: str | None = None,
                    budget: list[int] | None = None, expect: _Expected | None = None,
                    reading: RunReading | None = None) -> list[dict[str, Any]]:
    """The records of one decisions file, streamed: lines split on "\\n" only (JSON text may
    hold U+2028), at most `MAX_DECISION_LINE_BYTES` a line, `budget[0]` bytes left for the
    whole service run (decremented), hashed while read and checked against `sha256`, each
    line checked against `expect` (`_decision`)."""
    digest = hashlib.sha256()
    rows: list[dict[str, Any]] = []
    pending = bytearray()
    lineno = 0

    def parse(raw: bytes) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RunDirError(path, f"line {lineno}: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start} of the line)") from None
        if line.strip():
            rows.append(_decision(path, lineno, _loads(path, line, f"line {lineno}: "),
                                  expect))

    with contextlib.ExitStack() as stack:
        if reading is not None and (reading.kept(path) or _small(path)):
            data = reading.read(path, sha256)  # the bytes verified, hashed when read
            sha256 = None
            chunks: Iterator[bytes] = (data[i:i + (1 << 20)]
                                       for i in range(0, len(data), 1 << 20))
        else:
            stack.enter_context(_reading(path))
            fh = stack.enter_context(open_regular(path))
            chunks = iter(lambda: fh.read(1 << 20), b"")
        for chunk in chunks:
            digest.update(chunk)
            if budget is not None:
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise RunDirError(path, "the decisions files of this service run "
                                      f"exceed {MAX_DECISIONS_BYTES} bytes together")
            pending += chunk
            start = 0
            while (end := pending.find(b"\n", start)) >= 0:
                lineno += 1
                parse(bytes(pending[start:end]))
                start = end + 1
            del pending[:start]
            if len(pending) > MAX_DECISION_LINE_BYTES:
                raise RunDirError(path, f"line {lineno + 1}: longer than "
                                  f"{MAX_DECISION_LINE_BYTES} bytes")
    if pending:
        lineno += 1
        parse(bytes(pending))
    if sha256 is not None and digest.hexdigest() != sha256:
        raise RunDirError(path, CHANGED_SINCE_VERIFIED)
    return rows


# ------------------------------------------------------------------------------- client.json
def _small(path: Path) -> bool:
    """Whether `path` is small enough to be kept by a `RunReading`."""
    try:
        return os.lstat(path).st_size <= KEEP_BYTES
    except OSError:
        return False


def _is_int(v: Any, lo: int = 0) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and lo <= v < _INT64


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
            if key in pr and not _is_int(pr[key]):
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
                if key in g and not _is_int(g[key]):
                    raise bad(f"{at}.{group}.{key}", f"must be an integer >= 0, got "
                              f"{g[key]!r}"[:200])
        durations = (pr.get("normal") or {}).get("duration_ns")
        if durations is not None and not _is_int(durations) and (
                not isinstance(durations, list) or not all(_is_int(d) for d in durations)):
            raise bad(f"{at}.normal.duration_ns", "must be integer nanoseconds or a list of "
                      "them (one per call)")


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
        if c.get(key) is not None and not _is_int(c[key]):
            raise bad(key, f"must be an integer in [0, 2**63), got {c[key]!r}")
    for key in ("request_id", "arm"):
        if c.get(key) is not None and not isinstance(c[key], str):
            raise bad(key, f"must be a string, got {type(c[key]).__name__}")
    _finite_field(path, c.get("e2e_s"), "e2e_s")
    _finite_field(path, c.get("median_e2e_s"), "median_e2e_s")
    warm = c.get("warmup")
    if warm is not None:
        if not isinstance(warm, dict):
            raise bad("warmup", f"must be an object or null, got {type(warm).__name__}")
        if warm.get("e2e_ns") is not None and not _is_int(warm["e2e_ns"]):
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
            if r.get("e2e_ns") is not None and not _is_int(r["e2e_ns"]):
                raise bad(f"requests[{i}].e2e_ns", f"must be an integer, got {r['e2e_ns']!r}")
            if r.get("request_id") is not None and not isinstance(r["request_id"], str):
                raise bad(f"requests[{i}].request_id", "must be a string")
            _finite_field(path, r.get("e2e_s"), f"requests[{i}].e2e_s")
            _check_response(path, r.get("response"), f"requests[{i}].response.")
    return c


def load_decisions(run: Run) -> pd.DataFrame:
    """Every decision of every run entry, warm-up included, one row per policy call.

    The decisions columns plus `run` (entry name), `run_arm` (the entry's arm), `profiled`,
    `run_index`, `warmup` (True unless the decision belongs to a measured request) and
    `request` (1-based order of the measured request within its run; 0 for the warm-up and
    for decisions outside every request). Which request a decision belongs to comes from
    `Run.attribution` (`residency.rundir.attribution`: by the client's wall-clock windows when
    recorded, so for any service, else by request id); this is the one place evidence reads
    it.
    """
    frames = []
    for entry in run.runs:
        df = run.decisions(entry, warmup=True)
        snap = ["reserved", "allocated", "free", "total"]
        df = df.astype({k: object for k in snap})  # ints stay ints across runs (no float64)
        frames.append(df.assign(run=entry.name, run_arm=entry.arm, profiled=entry.profiled,
                                run_index=entry.index,
                                request=df["request"].fillna(0).astype("int64")))
    cols = [*DECISION_COLUMNS, "run", "run_arm", "profiled", "run_index", "request"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]


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
