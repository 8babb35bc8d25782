"""Integrity of a run directory: the seal over its manifest, confined paths, safe reads.

A run is *sealed* when it completes: `seal(manifest)` records, inside `manifest.json`, one
sha256 per manifest field (each `runs[i]` entry on its own) and one digest over the canonical
manifest, which includes the sha256 of every artifact. So the digest covers every byte of
evidence and every field analysis reads. A digest kept inside the run only catches careless
edits; authors quote it (`sha256:...`) in the pull request, and `residency verify RUN --digest
sha256:...` checks a run against the quoted value.

Everything here is analysis-side (no torch). Paths that come from a manifest are confined to
the run directory, and evidence files are opened only when they are regular files of bounded
size, so a FIFO, a device, a socket or a link leaving the run is an error, never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from residency.errors import CHANGED_SINCE_VERIFIED, BadInput
from residency.rundir.layout import MANIFEST, RUNS

__all__ = ["SEAL_FIELD", "MAX_EVIDENCE_BYTES", "UnsafePathError", "canonical_json",
           "enclosing_run",
           "run_digest", "seal", "seal_findings", "confined", "open_regular", "read_regular",
           "walk_files", "sha256_regular", "parse_digest", "CHANGED_SINCE_VERIFIED",
           "printable"]

SEAL_FIELD = "seal"
SEAL_ALGORITHM = "sha256"
# the largest evidence file analysis opens (JSON/JSONL records, logs); traces have their own
MAX_EVIDENCE_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 20


class UnsafePathError(BadInput):
    """A path that is not a confined, regular, bounded file; names the path and what it is."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: {message}")


def printable(text: str) -> str:
    """`text` for a terminal: every character it would act on or hide (control characters
    and escapes, line and paragraph separators, undecodable bytes of a file name) written as
    a Python escape (``\\x1b``); printable text unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else
                   c.encode("unicode_escape", "backslashreplace").decode("ascii") for c in text)


# ---------------------------------------------------------------------------------- the seal
def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON value (sorted keys, no spaces, ASCII, no NaN)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _sha(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def run_digest(manifest: dict[str, Any]) -> str:
    """`sha256:<hex>` over the canonical manifest without its seal (artifact digests
    included, so it covers every file of the run)."""
    body = {k: v for k, v in manifest.items() if k != SEAL_FIELD}
    return f"{SEAL_ALGORITHM}:{_sha(body)}"


def _field_digests(manifest: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in manifest.items():
        if key == SEAL_FIELD:
            continue
        if key == "runs" and isinstance(value, list):
            out["runs"] = _sha(len(value))
            out.update({f"runs[{i}]": _sha(entry) for i, entry in enumerate(value)})
        else:
            out[key] = _sha(value)
    return out


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """The seal to store under `manifest["seal"]` once the run is complete."""
    return {"algorithm": SEAL_ALGORITHM, "digest": run_digest(manifest),
            "fields": _field_digests(manifest)}


def parse_digest(text: str) -> str:
    """A quoted digest normalised to `sha256:<hex>`; `ValueError` naming it otherwise."""
    value = text.strip().lower()
    if value.startswith(f"{SEAL_ALGORITHM}:"):
        value = value[len(SEAL_ALGORITHM) + 1:]
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"The value for `--digest` must be 'sha256:' and 64 hex digits, but "
                         f"{text!r} was passed.")
    return f"{SEAL_ALGORITHM}:{value}"


def seal_findings(manifest: dict[str, Any]) -> list[str]:
    """What changed in the manifest since it was sealed, one line per field (empty when the
    seal holds). A run without a seal yields one finding saying so."""
    recorded = manifest.get(SEAL_FIELD)
    if recorded is None:
        return ["manifest.json carries no seal (the run never completed, or predates sealing)"]
    if (not isinstance(recorded, dict) or not isinstance(recorded.get("fields"), dict)
            or not isinstance(recorded.get("digest"), str)):
        return ["manifest.json field `seal` is malformed"]
    try:
        actual = _field_digests(manifest)
    except ValueError as exc:  # a non-finite number cannot have been sealed
        return [f"manifest.json holds a value that was never sealed ({exc})"]
    sealed = recorded["fields"]
    out = [f"manifest.json field `{k}` changed since the run was sealed"
           for k in sealed if k in actual and actual[k] != sealed[k]]
    out += [f"manifest.json field `{k}` removed since the run was sealed"
            for k in sealed if k not in actual]
    out += [f"manifest.json field `{k}` added since the run was sealed"
            for k in actual if k not in sealed]
    if not out and run_digest(manifest) != recorded["digest"]:
        out.append("manifest.json field `seal.digest` does not match the manifest")
    return out


# ------------------------------------------------------------------------- confined, regular
def confined(root: Path, rel: Any, *, what: str) -> Path:
    """`root / rel` for a manifest path `rel` that stays inside `root`: relative, POSIX, no
    `..`, no symlink on the way. Raises `UnsafePathError` naming `what` otherwise."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise UnsafePathError(root, f"{what} must be a relative POSIX path inside the run, "
                              f"got {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts):
        raise UnsafePathError(root, f"{what} {rel!r} leaves the run directory (absolute paths "
                              "and '..' are refused)")
    path = root
    for part in pure.parts:
        if part == ".":
            continue
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return root.joinpath(*pure.parts)
        except OSError as exc:
            raise UnsafePathError(path, f"{what}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(path, f"{what} {rel!r} goes through a symbolic link "
                                  "(links are refused inside a run directory)")
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: Path, limit_bytes: int) -> int:
    """An fd of a regular file of at most `limit_bytes`, opened without following a final
    link and without blocking on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(path, "is a symbolic link (refused; copy the file "
                                  "instead)") from None
        if exc.errno in (errno.ENXIO, errno.EWOULDBLOCK):  # socket / FIFO without writer
            raise UnsafePathError(path, f"is {_kind(os.lstat(path).st_mode)}, not a regular "
                                  "file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit_bytes:
            raise UnsafePathError(path, f"is {st.st_size} bytes, over the {limit_bytes}-byte "
                                  "limit for this kind of file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path, *, limit_bytes: int = MAX_EVIDENCE_BYTES) -> BinaryIO:
    """A binary file object of a regular file of at most `limit_bytes` (a final link not
    followed, a FIFO never waited on); `UnsafePathError` for anything else."""
    return os.fdopen(_open_regular(path, limit_bytes), "rb")


def read_regular(path: Path, *, limit_bytes: int = MAX_EVIDENCE_BYTES,
                 sha256: str | None = None) -> bytes:
    """The bytes of a regular file of at most `limit_bytes`; `UnsafePathError` for anything
    else (FIFO, device, socket, link, too large), `FileNotFoundError` when absent. With
    `sha256`, the bytes read must have that digest (the file is read once: what is checked
    is what the caller parses), else `UnsafePathError` saying it changed."""
    fd = _open_regular(path, limit_bytes)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit_bytes + 1)
    if len(data) > limit_bytes:  # grew while reading
        raise UnsafePathError(path, f"grew over the {limit_bytes}-byte limit while read")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise UnsafePathError(path, CHANGED_SINCE_VERIFIED)
    return data


def sha256_regular(path: Path, *, limit_bytes: int | None = None) -> str:
    """Hex sha256 of a regular file (streamed); `UnsafePathError` for anything else."""
    fd = _open_regular(path, limit_bytes if limit_bytes is not None else 1 << 62)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def walk_files(root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """Every non-directory entry under `root` (links not followed), as (POSIX relative
    path, path, None for a regular file or what else it is)."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        names = list(filenames)
        for d in list(dirnames):  # a link to a directory is listed, never entered
            if (here / d).is_symlink():
                dirnames.remove(d)
                names.append(d)
        dirnames.sort()
        for name in sorted(names):
            path = here / name
            mode = os.lstat(path).st_mode
            rel = path.relative_to(root).as_posix()
            yield rel, path, None if stat.S_ISREG(mode) else _kind(mode)


def enclosing_run(path: str | Path) -> Path | None:
    """The run directory `path` lies in (or is): the nearest folder at or above it, its
    links resolved, that holds both ``manifest.json`` and ``runs/``; None outside any run."""
    here = Path(os.path.abspath(path))
    with contextlib.suppress(OSError, RuntimeError):  # a link loop: the path as given
        here = here.resolve()
    for folder in (here, *here.parents):
        if (folder / MANIFEST).is_file() and (folder / RUNS).is_dir():
            return folder
    return None
