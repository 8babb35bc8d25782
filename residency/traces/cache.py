"""The cache of parsed traces, in the user's cache directory: never beside the traces.

Where: `cache_dir()`, ``RESIDENCY_CACHE_DIR`` when set, else the user cache directory of
``residency`` (`platformdirs`: ``$XDG_CACHE_HOME/residency``, by default ``~/.cache/residency``
on Linux), folder ``traces-v1/``. Nothing is read from or written to a trace or run directory
(a ``residency.parquet.cache/`` folder there, or anything else, is never read), and a cache
directory that lies inside the folder the traces were found in is not used at all.

Key: an entry's file name is a digest of what it stands for: its kind (``columns``: one
file's parsed columns, for `residency.traces.load.load_traces`; ``idle``: one rank's
reduction, for `residency.analysis.idle`; ``idle-summary``: a trace set's summary, `put_set`),
`PARSER_VERSION`, the options it was computed under, and the trace's real path, size and
mtime_ns (a set's: each trace's). Its header repeats that key and records the trace's status
and the content digest of its bytes as they were parsed (`residency.traces.files.content_hash`);
the payload (arrays) carries its own digest. An entry is used only when the key matches, the
trace read now has the recorded digest (a change that keeps size and mtime is caught) and the
payload matches its digest; an edited, truncated, foreign or unreadable entry is ignored, and
rewritten after the parse. Entries are read as regular files of bounded size; arrays are
rebuilt from raw bytes of a whitelisted dtype (no pickle). The trace is not hashed again where
its status vouches for it (`_vouched`: the same device, inode, size, mtime and ctime as
recorded, at least `RACY_NS` before the entry was written or last used, on POSIX, outside a
sealed read), as git's index skips unchanged files: any write through the file system moves
ctime, which no user can set back. So a trace that last changed `RACY_NS` before it is read
(`settled`) needs no digest at all: its ``idle`` entry records its status alone (taken before
the read, and recorded only if the trace still has it after), used only where that status
vouches for it, else the trace is read again; a set's summary is always such an entry. The
payload digest covers the trace's digest and status as well as the arrays (a set's entry: its
figures, which are its payload).

Bounded: at most `max_bytes()` in all (``RESIDENCY_CACHE_MAX_BYTES``, default 4 GiB); after a
write the least recently used entries are removed (a hit refreshes an entry's mtime).
Off: ``cache=False`` (``residency idle --no-cache``) or ``RESIDENCY_NO_CACHE=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as stat_
import struct
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from residency.jsonio import write_bytes_atomic
from residency.traces.columns import Parsed, object_array
from residency.traces.files import (
    CONTENT_DIGEST,
    MAX_TRACE_BYTES,
    PARTS_DIGEST,
    TraceError,
    active_seal,
    content_hash,
    digest_like,
    open_regular,
)

__all__ = ["PARSER_VERSION", "cache_dir", "enabled", "get", "get_parsed", "get_set",
           "max_bytes", "payload_digest", "put", "put_parsed", "put_set", "settled"]

# 9: BLAKE3 trace digests (was SHA-256); 8: SHA-256 trace digests of the bytes parsed (was
# xxh3-128); 7: distributedInfo.world_size
# kept; 6: the payload digest covers the trace digest and status; 5: user cache
PARSER_VERSION = 9
_MAGIC = b"RESIDENCY-TRACE-CACHE/1\n"
_DTYPES = frozenset({"<i8", "<i4", "<i2", "|i1", "|b1", "|u1", "<u2", "<u4"})
_DEFAULT_MAX = 4 << 30
_ENTRY_SUFFIX = ".entry"
_DIGESTS = frozenset({CONTENT_DIGEST, PARTS_DIGEST})  # the trace digests an entry may record


def cache_dir() -> Path:
    """The folder entries live in (module doc)."""
    env = os.environ.get("RESIDENCY_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "traces-v1"
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        return Path(base) / "residency" / "traces-v1"
    return Path(user_cache_dir("residency", appauthor=False)) / "traces-v1"


def max_bytes() -> int:
    """The size bound of the whole cache (``RESIDENCY_CACHE_MAX_BYTES``, default 4 GiB)."""
    raw = os.environ.get("RESIDENCY_CACHE_MAX_BYTES", "")
    try:
        return max(0, int(raw)) if raw else _DEFAULT_MAX
    except ValueError:
        return _DEFAULT_MAX


def enabled(root: Path | None = None, source: Path | None = None) -> bool:
    """Whether the cache may be used for a trace `source` found in folder `root`: not turned
    off by ``RESIDENCY_NO_CACHE``, and the cache folder is not inside `root` nor `source`'s
    own folder."""
    if os.environ.get("RESIDENCY_NO_CACHE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    where = _real(cache_dir())
    for folder in (root, None if source is None else source.parent):
        if folder is not None and folder.is_dir():
            top = _real(folder)
            if where == top or top in where.parents:
                return False
    return _trusted(cache_dir())


_WARNED: set[str] = set()


def _trusted(folder: Path) -> bool:
    """Whether `folder` may hold our entries: created (mode 0700) when absent; else a real
    folder, not a link, owned by this user, with no access for group or others, that this user
    can read and write. Otherwise the cache is not used, and one warning says why (once per
    folder and process): another user's or a shared folder could hold forged entries or
    plant links (issue 41)."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(folder)
    except OSError as exc:
        return _bypass(folder, f"cannot be created or read ({exc.strerror or exc})")
    if stat_.S_ISLNK(st.st_mode):
        return _bypass(folder, "is a symbolic link")
    if not stat_.S_ISDIR(st.st_mode):
        return _bypass(folder, "is not a folder")
    if os.name == "posix":
        if st.st_uid != os.geteuid():
            return _bypass(folder, f"is owned by uid {st.st_uid}, not by this user "
                           f"({os.geteuid()})")
        if st.st_mode & 0o077:
            return _bypass(folder, f"has mode {stat_.S_IMODE(st.st_mode):04o}, not 0700 (other "
                           f"users could plant or read entries; chmod 700 it to use it)")
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
        return _bypass(folder, "cannot be read and written by this user")
    return True


def _bypass(folder: Path, why: str) -> bool:
    if str(folder) not in _WARNED:
        _WARNED.add(str(folder))
        warnings.warn(f"the trace cache folder {folder} {why}: running without the cache",
                      UserWarning, stacklevel=4)
    return False


def _real(p: Path) -> Path:
    try:
        return p.resolve()
    except OSError:
        return p.absolute()


def _key(kind: str, source: Path, stat: os.stat_result, options: dict[str, Any]
         ) -> dict[str, Any]:
    return {"kind": kind, "parser": PARSER_VERSION, "options": options,
            "path": str(_real(source)), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _entry(key: dict[str, Any]) -> Path:
    h = content_hash()
    h.update(json.dumps(key, sort_keys=True).encode())
    return cache_dir() / (h.hexdigest().split(":", 1)[1] + _ENTRY_SUFFIX)


def has_entry(kind: str, source: Path, stat: os.stat_result, options: dict[str, Any], *,
              root: Path | None = None) -> bool:
    """Whether an entry is recorded under `source`'s key (nothing read or hashed: `get` still
    decides whether it is used)."""
    try:
        return enabled(root, source) and _entry(_key(kind, source, stat, options)).is_file()
    except OSError:  # an unreadable folder: no entry (the parse goes on without the cache)
        return False


def get(kind: str, source: Path, stat: os.stat_result, options: dict[str, Any], *,
        root: Path | None = None, max_trace_bytes: int = MAX_TRACE_BYTES
        ) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The entry's metadata and arrays when it matches `source` as it is now (module doc).

    Raises:
        TraceError: `source` itself cannot be read (as `residency.traces.files.open_regular`).
    """
    if not enabled(root, source):
        return None
    key = _key(kind, source, stat, options)
    path = _entry(key)
    got = _read(path, key, max_bytes() or _DEFAULT_MAX)
    if got is None:
        return None
    header, payload, st = got
    try:
        if header.get("payload_digest") != payload_digest(header, [payload]):
            return None  # edited or truncated: never trusted
        recorded = header.get("trace_digest")
        vouched = _vouched(header.get("trace_stat"), stat, st)
        if recorded is None:  # an entry of the status alone: used where it vouches
            if not vouched:
                return None
        elif not isinstance(recorded, str) or recorded.split(":", 1)[0] not in _DIGESTS:
            return None
        elif not vouched and digest_like(recorded, source, root=root,
                                         max_bytes=max_trace_bytes) != recorded:
            return None  # the trace changed (size and mtime kept)
        arrays = _arrays(header, payload)
        meta = header.get("meta")
        if not isinstance(meta, dict):
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return None  # an unusable entry is ignored; the parse rewrites it
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used
    return {**meta, "trace_digest": recorded}, arrays


def _read(path: Path, key: dict[str, Any], limit: int
          ) -> tuple[dict[str, Any], memoryview, os.stat_result] | None:
    """The header, payload and status of the entry at `path` when it is a regular file of at
    most `limit` bytes whose header repeats `key`; None otherwise (absent, unreadable, not an
    entry, another key)."""
    try:
        fd, st = open_regular(path, max_bytes=limit)
    except TraceError:  # absent, not a regular file, too large: no entry
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            # (a numpy buffer: large ones are backed by huge pages where the kernel allows,
            # 3 ms to fault in 15 MB here against 9 ms for a bytearray)
            data = np.empty(st.st_size, np.uint8)
            if f.readinto(data) != st.st_size:
                return None
        header, payload = _split(data)
    except (OSError, ValueError, TypeError, struct.error):
        return None
    return (header, payload, st) if header.get("key") == key else None


RACY_NS = 2 * 10**9  # a status recorded this close to the entry's writing vouches for nothing


def settled(stat: os.stat_result) -> bool:
    """Whether a trace of status `stat` (taken now) last changed long enough ago that an
    entry written after it is read will be vouched for by that status (`_vouched`): then its
    digest is not needed (`put` without one), and it need not be hashed as it is read."""
    return _status_may_vouch() and stat.st_ctime_ns < time.time_ns() - RACY_NS


def _status_may_vouch() -> bool:
    """Whether a trace's status may stand for its bytes at all: on POSIX (Windows' ctime is the
    creation's), outside a sealed read (which checks every byte)."""
    return os.name == "posix" and active_seal() is None


def _fingerprint(stat: os.stat_result) -> list[int]:
    """What changes whenever the file's bytes change through the file system: its identity
    (device, inode), size, mtime and ctime (which no user can set back)."""
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def _vouched(recorded: Any, stat: os.stat_result, entry: os.stat_result) -> bool:
    """Whether the trace's status `stat` alone shows it is the file the entry's digest was
    taken of (its fingerprint `recorded` then),
    so it need not be hashed again (git's index does the same): the same fingerprint, recorded
    at least `RACY_NS` before the entry was last written or used (its mtime: a change within
    the clock's granularity of the recording could keep ctime, git's racy-clean case; a use
    verified the bytes or was itself vouched for), and no seal in force (a sealed read checks
    every byte)."""
    return (_status_may_vouch() and recorded == _fingerprint(stat)
            and stat.st_ctime_ns < entry.st_mtime_ns - RACY_NS)


def payload_digest(header: dict[str, Any], blobs: list[Any]) -> str:
    """The digest of what the entry asserts: the trace's digest and status, and the arrays."""
    h = content_hash()
    h.update(json.dumps([header.get("trace_digest"), header.get("trace_stat")]).encode())
    for b in blobs:
        h.update(b)
    return h.hexdigest()


def _split(data: Any) -> tuple[dict[str, Any], memoryview]:
    """An entry's header and its payload (a view of `data`, a buffer of its bytes)."""
    view = memoryview(data).cast("B")
    if bytes(view[:len(_MAGIC)]) != _MAGIC:
        raise ValueError("not a residency cache entry")
    at = len(_MAGIC)
    if len(view) < at + 8:
        raise ValueError("truncated header")
    (n,) = struct.unpack_from("<Q", view, at)
    at += 8
    if n > len(view) - at:
        raise ValueError("truncated header")
    header = json.loads(bytes(view[at:at + n]))
    if not isinstance(header, dict):
        raise ValueError("bad header")
    return header, view[at + n:]


def _arrays(header: dict[str, Any], payload: memoryview) -> dict[str, np.ndarray]:
    out = {}
    for name, dtype, shape, offset, nbytes in header["arrays"]:
        if dtype not in _DTYPES or not isinstance(name, str):
            raise ValueError(f"array {name!r} of dtype {dtype!r}")
        shape = tuple(int(s) for s in shape)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if (min(shape, default=0) < 0 or int(offset) < 0
                or count * np.dtype(dtype).itemsize != int(nbytes)
                or int(offset) + int(nbytes) > len(payload)):
            raise ValueError(f"array {name!r} does not fit its entry")
        out[name] = np.frombuffer(payload, dtype, count, int(offset)).reshape(shape)
    return out


def put(kind: str, source: Path, stat: os.stat_result, options: dict[str, Any],
        trace_digest: str | None, meta: dict[str, Any], arrays: dict[str, np.ndarray], *,
        root: Path | None = None) -> None:
    """Record an entry (module doc); a failure (read-only or full disk, ...) is ignored.
    Without the trace's digest (`trace_digest` None), an entry of its status alone, used only
    where that vouches for the trace (`_vouched`), and recorded only where the trace's status
    is still `stat` (not changed while it was read). The entry is written to a temporary file
    created exclusively (never through a link), mode 0600, then renamed into place; removed
    when the write is interrupted."""
    if not enabled(root, source):
        return
    if trace_digest is None:
        try:
            if _fingerprint(os.stat(source)) != _fingerprint(stat):
                return
        except OSError:
            return
    key = _key(kind, source, stat, options)
    path = _entry(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")
    try:
        specs, blobs, offset = [], [], 0
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            if a.dtype.str not in _DTYPES:
                raise TypeError(f"array {name} of dtype {a.dtype.str}")
            specs.append([name, a.dtype.str, list(a.shape), offset, a.nbytes])
            blobs.append(a.reshape(-1).view(np.uint8))
            offset += a.nbytes
        asserted = {"trace_digest": trace_digest, "trace_stat": _fingerprint(stat)}
        _write(path, tmp, {"key": key, **asserted, "payload_digest":
                           payload_digest(asserted, blobs), "meta": meta, "arrays": specs},
               blobs, offset)
    except (OSError, ValueError, TypeError):
        pass


def _write(path: Path, tmp: Path, header: dict[str, Any], blobs: list[Any], size: int) -> None:
    """Write an entry: `header`, then the `blobs` (`size` bytes in all)."""
    head = json.dumps(header).encode()
    write_bytes_atomic(path, [_MAGIC + struct.pack("<Q", len(head)) + head, *blobs],
                       tmp=tmp, mode=0o600, fsync=False)
    _written(path.parent, path, len(_MAGIC) + 8 + len(head) + size)


# -- a trace set's figures (`residency.analysis.idle`: the all-rank summary) -----------------

def _set_key(kind: str, sources: list[Path], stats: list[os.stat_result],
             options: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "parser": PARSER_VERSION, "options": options,
            "paths": [str(_real(s)) for s in sources], "sizes": [st.st_size for st in stats],
            "mtimes_ns": [st.st_mtime_ns for st in stats]}


SET_MAX_BYTES = 1 << 24  # a set's entry holds figures (JSON), never columns


def get_set(kind: str, sources: list[Path], stats: list[os.stat_result],
            options: dict[str, Any], *, root: Path | None = None) -> dict[str, Any] | None:
    """The figures recorded (`put_set`) for the trace set `sources` (in this order; `stats`:
    their status, taken now) under `options`, when every trace's status vouches that it is
    the file they were computed from (`_vouched`). No trace is hashed: where one's status
    does not vouch for it (changed, or written within `RACY_NS` of the entry), None, and the
    ranks' own entries decide, each checking its trace's digest."""
    if not sources or not all(enabled(root, s) for s in sources):
        return None
    key = _set_key(kind, sources, stats, options)
    path = _entry(key)
    got = _read(path, key, SET_MAX_BYTES)
    if got is None:
        return None
    header, payload, st = got
    try:
        recorded, meta = header.get("trace_stat"), header.get("meta")
        if (len(payload) or header.get("arrays") != []
                or not isinstance(meta, dict)
                or header.get("payload_digest") != payload_digest(header, [_canonical(meta)])
                or not isinstance(recorded, list) or len(recorded) != len(stats)
                or not all(_vouched(r, s, st) for r, s in zip(recorded, stats, strict=True))):
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return None  # an unusable entry is ignored; the next computation rewrites it
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used
    return meta


def _canonical(meta: dict[str, Any]) -> bytes:
    """A set entry's figures as its digest covers them (they are its payload)."""
    return json.dumps(meta, sort_keys=True).encode()


def put_set(kind: str, sources: list[Path], stats: list[os.stat_result],
            options: dict[str, Any], meta: dict[str, Any], *, root: Path | None = None
            ) -> None:
    """Record `meta` (JSON: the figures of the trace set `sources`, computed under `options`
    from the files whose status was `stats`; covered by the entry's digest) for `get_set`; a
    failure is ignored, as `put`'s."""
    if not sources or not all(enabled(root, s) for s in sources):
        return
    key = _set_key(kind, sources, stats, options)
    path = _entry(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")
    try:
        asserted = {"trace_stat": [_fingerprint(st) for st in stats]}
        _write(path, tmp, {"key": key, **asserted,
                           "payload_digest": payload_digest(asserted, [_canonical(meta)]),
                           "meta": meta, "arrays": []}, [], 0)
    except (OSError, ValueError, TypeError):
        pass


_TMP_SUFFIX = ".tmp"
STALE_TMP_S = 24 * 3600  # a temporary file this old is removed whatever its pid


class _Index:
    """What this process knows of a cache folder's entries: (mtime_ns, size, path), least
    recently used first, as of its last scan plus what it wrote since."""

    def __init__(self, entries: list[tuple[int, int, Path]]) -> None:
        self.entries = deque(sorted(entries))
        self.total = sum(size for _, size, _ in entries)
        self.written = 0  # bytes written by this process since the scan


_INDEX: dict[str, _Index] = {}


def _written(folder: Path, path: Path, size: int) -> None:
    """After `path` (`size` bytes) was written: remove the least recently used entries until
    the cache fits `max_bytes()`. The folder is scanned at this process's first write and
    after each tenth of the bound written since (other processes' writes and uses show
    then), so the work is linear in the entries written, not quadratic (issue 41: one scan
    per write took 155.6 s over 4,000 small traces)."""
    limit = max_bytes()
    index = _INDEX.get(str(folder))
    if index is None or index.written + size > limit // 10:
        index = _INDEX[str(folder)] = _scan(folder)
    else:
        index.entries.append((time.time_ns(), size, path))
        index.total += size
        index.written += size
    while index.total > limit and index.entries:
        _, old, p = index.entries.popleft()
        index.total -= old
        with contextlib.suppress(OSError):
            p.unlink()


def _scan(folder: Path) -> _Index:
    """The folder's entries; temporary files of processes that died while writing (or older
    than `STALE_TMP_S`) are removed on the way."""
    entries = []
    now = time.time()
    with os.scandir(folder) as it:
        for e in it:
            if not e.is_file(follow_symlinks=False):
                continue
            st = e.stat(follow_symlinks=False)
            if e.name.endswith(_ENTRY_SUFFIX):
                entries.append((st.st_mtime_ns, st.st_size, Path(e.path)))
            elif (e.name.startswith(".") and e.name.endswith(_TMP_SUFFIX)
                  and (_dead(e.name) or now - st.st_mtime > STALE_TMP_S)):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
    return _Index(entries)


def _dead(name: str) -> bool:
    """Whether the process that named a temporary file ``.<entry>.<pid>.tmp`` is gone."""
    pid = name[:-len(_TMP_SUFFIX)].rpartition(".")[2]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False  # alive under another user, or not ours to tell
    return False


# -- one file's parsed columns (`residency.traces.load.load_traces`) -------------------------------

def _strings(items: list[str]) -> np.ndarray:
    return np.frombuffer(json.dumps(items, ensure_ascii=False).encode(), np.uint8)


def _codes(names: np.ndarray) -> tuple[np.ndarray, list[str]]:
    table: dict[str, int] = {}
    values = names.tolist()
    codes = np.fromiter((table.setdefault(n, len(table)) for n in values), np.int32,
                        len(values))
    return codes, list(table)


def put_parsed(source: Path, stat: os.stat_result, p: Parsed, *,
               root: Path | None = None) -> None:
    """Record the parse of `source` (kind ``columns``); needs `p.digest` (else nothing is
    recorded)."""
    if p.digest is None:
        return
    device_names = (p.device_names if p.device_names is not None
                    else object_array([""] * len(p.device)))
    codes, table = _codes(np.concatenate((p.names, device_names)))
    arrays = {"device": p.device, "ranges": p.ranges, "device_task_type": p.device_task_type,
              "range_task_type": p.range_task_type, "range_lane": p.range_lane,
              "name_codes": codes, "names": _strings(table)}
    meta = {"rank": p.rank, "rejected": p.rejected, "task_types": list(p.task_types),
            "lanes": list(p.lanes), "ranges": len(p.ranges), "world_size": p.world_size}
    put("columns", source, stat, {}, p.digest, meta, arrays, root=root)


def get_parsed(source: Path, stat: os.stat_result, *, root: Path | None = None,
               max_trace_bytes: int = MAX_TRACE_BYTES) -> Parsed | None:
    """The recorded parse of `source` when it matches the file as it is now (module doc)."""
    got = get("columns", source, stat, {}, root=root, max_trace_bytes=max_trace_bytes)
    if got is None:
        return None
    meta, a = got
    try:
        table = object_array(msgspec.json.decode(a["names"].tobytes(), type=list[str]))
        n, m = len(a["device"]), int(meta["ranges"])
        codes = a["name_codes"]
        if (a["device"].ndim != 2 or a["ranges"].shape != (m, 2) or len(codes) != n + m
                or (len(codes) and not 0 <= int(codes.min()) <= int(codes.max()) < len(table))
                or len(a["device_task_type"]) != n
                or not len(a["range_task_type"]) == len(a["range_lane"]) == m):
            return None
        names = table[codes]
        rank, world = meta.get("rank"), meta["world_size"]
        if world is not None and type(world) is not int:
            return None
        task_types = tuple(str(t) for t in meta["task_types"])
        lanes = tuple(str(t) for t in meta["lanes"])
        for c, k in ((a["device_task_type"], task_types), (a["range_task_type"], task_types),
                     (a["range_lane"], lanes)):
            if len(c) and not -1 <= int(c.min()) <= int(c.max()) < len(k):
                return None
        p = Parsed(rank if type(rank) is int else None, a["device"], a["ranges"], names[:m],
                   int(meta["rejected"]), a["device_task_type"], a["range_task_type"],
                   a["range_lane"], task_types, lanes, device_names=names[m:],
                   world_size=world)
    except (KeyError, TypeError, ValueError, msgspec.DecodeError):
        return None
    p.digest = meta["trace_digest"]
    return p
