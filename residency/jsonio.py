"""JSON in and out, once for the suite: `plain` turns analysis values into plain JSON data
(numpy scalars to Python numbers, paths to strings, non-finite floats to null), and the
atomic writers replace a file whole (readers see the old file or the new one, never a part)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["plain", "write_json_atomic", "write_text_atomic"]


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
