"""Reading the files of a run safely, once: confined paths, regular files of bounded size,
strict JSON, and `RunReading` (each file read once a command, hashed as read).

Every format module of `residency.records` reads through here; none of them knows another's
schema. A path that comes from a manifest is confined to the run directory, and evidence
files are opened only when they are regular files of bounded size, so a FIFO, a device, a
socket or a link leaving the run is an error, never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from residency.errors import CHANGED_SINCE_VERIFIED, BadInput

__all__ = ["CHANGED_SINCE_VERIFIED", "INT64", "KEEP_BYTES", "KEEP_TOTAL_BYTES",
           "MAX_EVIDENCE_BYTES", "RunDirError", "RunReading", "UnsafePathError", "confined",
           "finite_field", "int_field", "is_int", "loads", "open_regular", "printable",
           "read_bytes", "read_errors", "read_json", "read_regular", "sha256_file",
           "sha256_regular", "small", "walk_files"]

# the largest evidence file analysis opens (JSON/JSONL records, logs); traces have their own
MAX_EVIDENCE_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 20
# a file of a run at most this large is kept in memory once read (its bytes hashed as read):
# every later use of it in the same command takes those bytes, never the disk again
KEEP_BYTES = 16 * 1024 * 1024
KEEP_TOTAL_BYTES = 256 * 1024 * 1024
INT64 = 2**63


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


class RunDirError(BadInput):
    """A run directory that cannot be read as the contract says; names the file and field."""

    def __init__(self, path: Path | str, message: str, *, field: str | None = None) -> None:
        self.path = Path(path)
        self.field = field
        where = f"{self.path}" + (f": field `{field}`" if field else "")
        super().__init__(f"{where}: {message}")


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



# ------------------------------------------------------------------------ read once, strictly
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
            data = read_bytes(path)
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
            with read_errors(path):
                self.read(path)
            if key not in self._kept:  # (grew past the bound while read)
                return sha256_file(path)
        return self._kept[key][1]

    def kept(self, path: Path) -> bool:
        """Whether the bytes of `path` are held."""
        return self._key(path) in self._kept


@contextlib.contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """Reading `path`: a missing, unsafe or unreadable file is one `RunDirError` naming it."""
    try:
        yield
    except FileNotFoundError:
        raise RunDirError(path, "file is missing") from None
    except UnsafePathError as exc:
        raise RunDirError(path, str(exc).removeprefix(f"{path}: ")) from None
    except OSError as exc:
        raise RunDirError(path, f"cannot read: {exc.strerror or exc}") from None


def read_bytes(path: Path, sha256: str | None = None) -> bytes:
    """The bytes of a regular evidence file (`read_regular`), every failure a `RunDirError`
    naming it."""
    with read_errors(path):
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


def loads(path: Path, text: str | bytes, where: str = "") -> Any:
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


def read_json(path: Path, sha256: str | None = None, *,
              reading: RunReading | None = None) -> dict[str, Any]:
    """The JSON object in `path` (strict: `loads`), read through `reading` when given."""
    data = loads(path, read_bytes(path, sha256) if reading is None
                 else reading.read(path, sha256))
    if not isinstance(data, dict):
        raise RunDirError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file's bytes (anything else is refused)."""
    return sha256_regular(path)


def small(path: Path) -> bool:
    """Whether `path` is small enough to be kept by a `RunReading`."""
    try:
        return os.lstat(path).st_size <= KEEP_BYTES
    except OSError:
        return False


def is_int(v: Any, lo: int = 0) -> bool:
    """`v` is an int (not a bool) in [lo, 2**63)."""
    return not isinstance(v, bool) and isinstance(v, int) and lo <= v < INT64


def int_field(mpath: Path, value: Any, field: str, *, lo: int = 0, hi: int = INT64) -> int:
    """`value` when it is an int in [lo, hi), else `RunDirError` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise RunDirError(mpath, f"must be an integer in [{lo}, {hi}), got {value!r}"[:200],
                          field=field)
    return value


def finite_field(mpath: Path, value: Any, field: str) -> float | None:
    """`value` as a finite float >= 0 (None stays None), else `RunDirError` naming the
    field."""
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
