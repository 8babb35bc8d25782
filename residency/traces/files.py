"""Reading one trace file as a stream of decompressed chunks, safely and with bounded memory.

* Only regular files are read: a FIFO, device, socket or directory is refused with a
  `TraceError` naming it (checked before and after opening, which never blocks), and so is a
  path that resolves outside the folder it was found in (a symbolic link leaving it).
* A file larger than `max_bytes` on disk, or whose decompressed stream (``*.gz``, possibly of
  several members) grows beyond `max_bytes`, is refused with one error; decompression runs in
  steps of at most one chunk, so a gzip bomb never holds more than a chunk in memory.
* `TraceStream.digest` is the content digest (`content_hash`) of the file's bytes as stored
  (compressed), computed as they are read when asked for (the trace cache keys entries by it).
* Within `sealed_reads(Sealed(...))` (a sealed run's traces), every file read below the
  sealed root must be in the seal, and the bytes read are the bytes checked: a stream hashes
  (sha256) what it hands out and fails at its end on another digest, before the caller's
  result is used; a whole-file reader (`open_regular`) gets a private copy made while
  hashing. A file swapped, edited or served differently after `verify` is a `TraceError`
  saying so, never analysed under the verified digest.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import shutil
import stat
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import blake3

from residency.errors import CHANGED_SINCE_VERIFIED, BadInput

__all__ = ["CHUNK_BYTES", "CONTENT_DIGEST", "MAX_TRACE_BYTES", "RANK_COMPONENT_RE", "Sealed",
           "TraceError", "TraceStream", "active_seal", "check_regular", "content_hash",
           "digest_like", "file_digest", "file_sha256", "hashed_copy", "open_regular",
           "parts_digest", "sealed_reads", "verified_copy"]

# a path component that names a rank, for both formats: "[<group>_]rank<N>" and nothing else
# (fullmatch); "_" never occurs in host names (RFC 1123), so "gpu-rank7" or "gpu-rank7-a_123"
# never match. vLLM-Omni's groups: diffusion_rank<N>, stage<K>_rank<N>.
RANK_COMPONENT_RE = re.compile(r"(?:(?P<group>\w+)_)?rank[_-]?(?P<rank>\d+)", re.IGNORECASE)
CHUNK_BYTES = 2 << 20  # decompressed bytes handed out per read (smaller decodes faster)
MAX_TRACE_BYTES = 64 << 30  # per trace file: on disk and decompressed
_RAW_READ_BYTES = 4 << 20
_HASH_READ_BYTES = 1 << 20  # hashing 596 MB: 106-113 ms, against 134-141 ms in fresh 4 MiB reads
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class TraceError(BadInput):
    """A trace that cannot be analysed: `path`, the byte `position` where known, `message`.

    The position counts bytes of the decompressed stream (for a ``.gz`` file: of the JSON)."""

    def __init__(self, path: str | os.PathLike[str], message: str,
                 position: int | None = None) -> None:
        self.path, self.message, self.position = Path(path), message, position
        where = f" (at byte {position})" if position is not None else ""
        super().__init__(f"{self.path}{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # survives the trip back from a worker process
        return (TraceError, (self.path, self.message, self.position))


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


# -- a sealed run's files: the bytes read are the bytes checked ---------------------------------

@dataclass(frozen=True)
class Sealed:
    """The files a sealed run lets the trace readers open: `sha256` (hex) by POSIX path
    relative to `root` (the run directory), as its manifest's ``artifacts`` lists them."""

    root: Path
    sha256: Mapping[str, str]

    def expected(self, path: Path) -> str:
        """The sealed sha256 of `path`.

        Raises:
            TraceError: `path` lies outside the run, or inside it but was never sealed
                (a file planted after the run, a hidden file).
        """
        real, top = Path(path).resolve(), self.root.resolve()
        if real != top and top not in real.parents:
            raise TraceError(path, f"lies outside the sealed run {self.root}: only the "
                             "run's sealed files are read")
        rel = PurePosixPath(*real.relative_to(top).parts).as_posix()
        sha = self.sha256.get(rel)
        if sha is None:
            raise TraceError(path, "is not in the run's sha256 list (never sealed): a sealed "
                             "run's traces are read only as sealed")
        return sha


_SEAL: contextvars.ContextVar[Sealed | None] = contextvars.ContextVar("residency_seal",
                                                                     default=None)


@contextlib.contextmanager
def sealed_reads(seal: Sealed | None) -> Iterator[None]:
    """Within: the reads of this thread follow `seal` (module doc); None: no seal (as
    outside). Worker processes and threads are handed the seal and enter it themselves."""
    token = _SEAL.set(seal)
    try:
        yield
    finally:
        _SEAL.reset(token)


def active_seal() -> Sealed | None:
    """The seal this thread reads under, if any (to hand to a worker)."""
    return _SEAL.get()


def _expected(path: Path) -> str | None:
    seal = _SEAL.get()
    return None if seal is None else seal.expected(path)


def _copy_checked(path: Path, fd: int, sha256: str | None, out: int, max_bytes: int,
                  digest: Any = None) -> None:
    """Copy what `fd` reads into `out` (both raw descriptors), hashing it (into `digest`
    too, when given); `TraceError` when it is not `sha256` (when given) or grows past
    `max_bytes`."""
    check, total = hashlib.sha256(), 0
    try:
        while block := os.read(fd, _RAW_READ_BYTES):
            total += len(block)
            if total > max_bytes:
                raise TraceError(path, f"grew past the limit of {max_bytes} bytes while read")
            check.update(block)
            if digest is not None:
                digest.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(out, view):]
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if sha256 is not None and check.hexdigest() != sha256:
        raise TraceError(path, CHANGED_SINCE_VERIFIED)


def verified_copy(path: Path, *, root: Path | None = None,
                  max_bytes: int = MAX_TRACE_BYTES) -> Path | None:
    """Under a seal: a private copy of `path` (in a new 0700 temporary folder; the caller
    removes the folder, `copy.parent`), made while checking its sha256, for readers that
    need a path (SQLite). Without a seal: None (read `path` itself)."""
    if _expected(path) is None:
        return None
    return hashed_copy(path, root=root, max_bytes=max_bytes)[0]


def hashed_copy(path: Path, *, root: Path | None = None,
                max_bytes: int = MAX_TRACE_BYTES) -> tuple[Path, str]:
    """A private copy of `path` (in a new 0700 temporary folder; the caller removes the
    folder, `copy.parent`) and the `content_hash` of exactly the bytes copied, for readers
    that need a path (SQLite): what they read is what was hashed. Under a seal the copy's
    sha256 must be the sealed one.

    Raises:
        TraceError: as `open_regular`.
    """
    sha256 = _expected(path)
    fd, _ = _open_checked(path, root, max_bytes)
    folder = Path(tempfile.mkdtemp(prefix="residency-copy-"))
    copy = folder / path.name
    digest = content_hash()
    try:
        out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _copy_checked(path, fd, sha256, out, max_bytes, digest)
        finally:
            os.close(out)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        os.close(fd)
    return copy, digest.hexdigest()


def open_regular(path: Path, *, root: Path | None = None,
                 max_bytes: int = MAX_TRACE_BYTES) -> tuple[int, os.stat_result]:
    """A read-only descriptor of `path` and its status, after the checks of the module doc.

    `root`: the folder `path` was found in; `path` must resolve inside it. Under a seal the
    descriptor (and status) is of a private copy made while checking the file's sha256
    (`verified_copy`), removed from its folder once open.

    Raises:
        TraceError: no such file, not a regular file, a link leaving `root`, larger than
            `max_bytes`, unreadable, or (under a seal) not sealed or changed since.
    """
    copy = verified_copy(path, root=root, max_bytes=max_bytes)
    if copy is None:
        return _open_checked(path, root, max_bytes)
    try:
        fd = os.open(copy, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    finally:  # the descriptor keeps the copy readable; its folder goes at once
        shutil.rmtree(copy.parent, ignore_errors=True)
    return fd, os.fstat(fd)  # the status of the bytes verified


def check_regular(path: Path, *, root: Path | None = None,
                  max_bytes: int = MAX_TRACE_BYTES) -> os.stat_result:
    """The status of `path` after `open_regular`'s checks (nothing read, no copy made).

    Raises:
        TraceError: as `open_regular`, but for a change since a seal (nothing is read).
    """
    fd, st = _open_checked(path, root, max_bytes)
    os.close(fd)
    return st


def _open_checked(path: Path, root: Path | None,
                  max_bytes: int) -> tuple[int, os.stat_result]:
    """`open_regular` without a seal's copy: the file's own descriptor."""
    real = path.resolve()
    if root is not None:
        top = root.resolve()
        if real != top and top not in real.parents:
            raise TraceError(path, f"a symbolic link to {real}, outside {root}: only files "
                             "inside the traces' folder are read")
    try:
        before = os.stat(real)
        if not stat.S_ISREG(before.st_mode):
            raise TraceError(path, f"{_kind(before.st_mode)}, not a regular file: only regular "
                             "files are read")
        # O_NONBLOCK: a FIFO swapped in after the check cannot block the open
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        raise TraceError(path, f"{_kind(st.st_mode)}, not a regular file: only regular files "
                         "are read" if not stat.S_ISREG(st.st_mode) else
                         f"{st.st_size} bytes, more than the limit of {max_bytes} bytes per "
                         "trace file")
    return fd, st


class _Named:
    """A hash object whose `hexdigest` names its algorithm (``xxh3_128:...``)."""

    def __init__(self, name: str, h: Any) -> None:
        self.name, self._h = name, h

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return f"{self.name}:{self._h.hexdigest()}"


CONTENT_DIGEST = "blake3"  # the prefix of `content_hash`'s digests


def content_hash() -> Any:
    """A new content hash: BLAKE3 (256 bits), a cryptographic digest (xxh3-128, used before
    SHA-256, is not: two traces sharing one were built, issue 41), at about 2.6x less CPU per
    byte than SHA-256 (4.5 against 1.7 GB/s here: a cold read of a trace parsed at over
    1 GB/s spent a third of its CPU hashing); `hexdigest()` is prefixed by the algorithm's
    name (``blake3:...``). A run's seal stays SHA-256 (`file_sha256`)."""
    return _Named(CONTENT_DIGEST, blake3.blake3())


PARTS_DIGEST = "sha256-parts"  # the prefix of `parts_digest`


def parts_digest(parts: list[tuple[int, int, str]]) -> str:
    """The content digest of a file read in byte ranges, from each range's `content_hash`
    (``(start, stop, "blake3:...")``, in file order): ``sha256-parts:<ranges>:<hex>``, the
    SHA-256 over the ranges and their digests. `digest_like` recomputes it from the file."""
    bounds = ",".join(f"{a}-{b}" for a, b, _ in parts)
    h = hashlib.sha256()
    for a, b, d in parts:
        h.update(f"{a}-{b}={d};".encode())
    return f"{PARTS_DIGEST}:{bounds}:{h.hexdigest()}"


def digest_like(recorded: str, path: Path, *, root: Path | None = None,
                max_bytes: int = MAX_TRACE_BYTES) -> str | None:
    """The digest of `path` as it is now, in the form of `recorded` (a `content_hash`
    ``blake3:...`` of the whole file, or a `parts_digest`); None for any other form.

    Raises:
        TraceError: as `file_digest`.
    """
    kind, _, rest = recorded.partition(":")
    if kind == CONTENT_DIGEST:
        return file_digest(path, root=root, max_bytes=max_bytes)
    if kind != PARTS_DIGEST:
        return None
    try:
        bounds = [tuple(int(x) for x in r.split("-", 1)) for r in rest.split(":", 1)[0].split(",")]
    except ValueError:
        return None
    if any(len(b) != 2 or not 0 <= b[0] <= b[1] for b in bounds):
        return None
    fd, _ = _open_checked(path, root, max_bytes)
    parts = []
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=True) as f:
            for a, b in bounds:
                h, left = content_hash(), b - a
                f.seek(a)
                while left and (block := f.read(min(left, _HASH_READ_BYTES))):
                    h.update(block)
                    left -= len(block)
                parts.append((a, b, h.hexdigest()))
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    return parts_digest(parts)


def file_digest(path: Path, *, root: Path | None = None,
                max_bytes: int = MAX_TRACE_BYTES) -> str:
    """`content_hash` (prefixed hex) of the bytes of the regular file `path` (checked as
    `open_regular`)."""
    return _file_hash(path, content_hash(), root, max_bytes)


def file_sha256(path: Path, *, root: Path | None = None,
                max_bytes: int = MAX_TRACE_BYTES) -> str:
    """SHA-256 (hex) of the bytes of the regular file `path` (checked as `open_regular`)."""
    return _file_hash(path, hashlib.sha256(), root, max_bytes)


def _file_hash(path: Path, digest: Any, root: Path | None, max_bytes: int) -> str:
    """The digest of the file's bytes; under a seal, the same bytes' sha256 must be the
    sealed one (one pass: what is hashed is what is checked)."""
    sealed = _expected(path)
    fd, _ = _open_checked(path, root, max_bytes)
    check = hashlib.sha256() if sealed is not None else None
    buf = bytearray(_HASH_READ_BYTES)  # one buffer, reused (the digests release the GIL)
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=True) as f, memoryview(buf) as view:
            while n := f.readinto(buf):
                block = view[:n]
                digest.update(block)
                if check is not None:
                    check.update(block)
                block.release()
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if check is not None and check.hexdigest() != sealed:
        raise TraceError(path, CHANGED_SINCE_VERIFIED)
    return digest.hexdigest()


class TraceStream:
    """The decompressed bytes of one trace file, handed out by `read` in chunks.

    `offset`: decompressed bytes handed out so far. Use as a context manager (closes the file).
    """

    def __init__(self, path: Path, *, root: Path | None = None,
                 chunk_bytes: int = CHUNK_BYTES, max_bytes: int = MAX_TRACE_BYTES,
                 digest: bool = False, start: int = 0, stop: int | None = None) -> None:
        self.path, self.chunk_bytes, self.max_bytes = path, max(1, chunk_bytes), max_bytes
        self._fd = -1
        self._sealed = _expected(path)
        if self._sealed is not None and (start or stop is not None):
            raise TraceError(path, "a sealed file is read whole, not in parts (its sha256 "
                             "covers every byte)")
        self._fd, self.stat = _open_checked(path, root, max_bytes)
        self._check = hashlib.sha256() if self._sealed is not None else None
        self._gz = path.name.endswith(".gz")
        # a byte range [start, stop) of a plain file (one part of a file parsed in parallel)
        self._left = None if stop is None else stop - start
        if start:
            os.lseek(self._fd, start, os.SEEK_SET)
        self._z = zlib.decompressobj(31) if self._gz else None
        self._pending = b""  # compressed input not yet given to the decompressor
        self._raw_eof = False
        self._digest = content_hash() if digest else None
        self.offset = start

    def __enter__(self) -> TraceStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def digest(self) -> str | None:
        """`content_hash` (prefixed hex) of the raw bytes read so far, if asked for."""
        return self._digest.hexdigest() if self._digest is not None else None

    def _raw(self, n: int) -> bytes:
        if self._left is not None:
            n = min(n, self._left)
        try:
            block = os.read(self._fd, n) if n else b""
        except OSError as exc:
            raise TraceError(self.path, f"cannot read: {exc.strerror or exc}") from None
        if self._digest is not None:
            self._digest.update(block)
        if self._check is not None:
            self._check.update(block)
            if not block and n:  # the end of the file: the bytes handed out were sealed?
                check, self._check = self._check, None
                if check.hexdigest() != self._sealed:
                    raise TraceError(self.path, CHANGED_SINCE_VERIFIED)
        if self._left is not None:
            self._left -= len(block)
        return block

    def finish(self) -> None:
        """Under a seal, read what is left, so that the whole file is checked (a no-op
        otherwise, and after the end)."""
        if self._check is not None:
            while self._check is not None and self._raw(_RAW_READ_BYTES):
                pass

    def read(self) -> bytes:
        """The next chunk of at most `chunk_bytes` decompressed bytes; ``b""`` at the end.

        Raises:
            TraceError: a broken or truncated gzip stream, or more than `max_bytes` in all.
        """
        out = self._raw(self.chunk_bytes) if self._z is None else self._inflate()
        self.offset += len(out)
        if self.offset > self.max_bytes:
            raise TraceError(self.path, f"decompresses to more than {self.max_bytes} bytes, "
                             "the limit per trace file (a gzip bomb?)")
        return out

    def _inflate(self) -> bytes:
        z = self._z
        assert z is not None
        try:
            while True:
                if z.eof:  # a member ended: another may follow (as gzip.decompress reads)
                    rest = z.unused_data + self._pending
                    self._pending = b""
                    if not rest and not self._raw_eof:
                        rest = self._raw(_RAW_READ_BYTES)
                        self._raw_eof = not rest
                    while rest[:1] == b"\x00":  # NUL padding after a member, as gzip reads
                        rest = rest.lstrip(b"\x00")
                        if not rest and not self._raw_eof:
                            rest = self._raw(_RAW_READ_BYTES)
                            self._raw_eof = not rest
                    if not rest:
                        return b""
                    if not rest.startswith(b"\x1f\x8b"):
                        raise TraceError(self.path, "cannot read: data after the end of the "
                                         "gzip stream is not another gzip member")
                    z = self._z = zlib.decompressobj(31)
                    self._pending = rest
                if not self._pending and not z.unconsumed_tail:
                    self._pending = b"" if self._raw_eof else self._raw(_RAW_READ_BYTES)
                    if not self._pending:
                        self._raw_eof = True
                        if self.stat.st_size == 0:  # an empty file, as gzip.decompress reads it
                            return b""
                        raise TraceError(self.path, "cannot read: Compressed file ended before "
                                         "the end-of-stream marker was reached")
                data = z.unconsumed_tail or self._pending
                if not z.unconsumed_tail:
                    self._pending = b""
                out = z.decompress(data, self.chunk_bytes)
                if out:
                    return out
        except zlib.error as exc:
            raise TraceError(self.path, f"cannot read: {exc}") from None
