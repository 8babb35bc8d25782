"""JSON in and out, once for the suite: `plain` turns analysis values into plain JSON data
(numpy scalars to Python numbers, paths to strings, non-finite floats to null), and the
suite's one atomic write (`write_bytes_atomic`, with `write_text_atomic` and
`write_json_atomic` over it) replaces a file whole: readers see the old file or the new one,
never a part."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["frame_records", "plain", "write_bytes_atomic", "write_json_atomic",
           "write_text_atomic"]


def plain(value: Any, *, finite: bool = False) -> Any:
    """`value` as plain JSON-ready data: mappings to dicts with string keys, sequences to
    lists, numpy scalars to Python numbers, paths to strings; with `finite=True` NaN and
    infinities become None."""
    if isinstance(value, Mapping):
        return {str(k): plain(v, finite=finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, finite=finite) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":  # a numpy scalar
        value = value.item()
    if finite and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


_CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
           | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes | Iterable[Any], *,
                       tmp: str | os.PathLike[str] | None = None, mode: int = 0o666,
                       fsync: bool = True) -> Path:
    """The suite's one atomic write: `data` (bytes, or an iterable of bytes-like chunks
    written in order) to a temporary file beside `path`, then renamed over `path` (readers
    see the old file or the new one, never a part); returns the path.

    The temporary file is `tmp` (default: the hidden `.<name>.tmp` beside `path`); one left
    there by a writer that died is removed first (a link itself, never what it points to),
    then the file is created exclusively and never through a link (O_EXCL, O_NOFOLLOW) with
    `mode` (less the umask). `fsync` flushes it to disk before the rename. On any failure
    or interruption the temporary file is removed and the exception raised; `path` is then
    as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp") if tmp is None else Path(tmp)
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, _CREATE, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # (Ctrl-C included: no temporary file left behind)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def frame_records(frame: Any) -> list[dict[str, Any]]:
    """A pandas DataFrame's rows as JSON objects (floats to 15 significant digits, NaN as
    null), as `DataFrame.to_json(orient="records")` writes them."""
    return json.loads(frame.to_json(orient="records", double_precision=15))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """`text` (UTF-8) to `path` atomically, fsynced (`write_bytes_atomic`); returns the
    path."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, allow_nan: bool = True
                      ) -> Path:
    """Write `data` as indented JSON to `path` atomically (`write_text_atomic`); returns the
    path. With `allow_nan=False`, NaN or infinity raises ValueError before anything is
    written."""
    text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=allow_nan) + "\n"
    return write_text_atomic(path, text)
