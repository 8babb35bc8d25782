"""The Parquet cache of parsed traces: one file per trace in a `CACHE_DIR` folder beside it.

A cache file holds the parsed columns (device rows, then named host-range rows: ``start_ns``,
``end_ns``, ``name``, ``task_type``, ``lane``) and, in its schema metadata, what it is worth:
the trace's size, mtime and SHA-256 (of its bytes as stored) and the SHA-256 of the cached
content itself. It is used only when all of them match: a trace changed in any way, or a cache
edited in any way (without recomputing its digest), is parsed anew and the cache rewritten. A
cache that cannot be read is ignored. Cache files are read as regular files only, with a size
limit. Version history: 1 (size and mtime only), 2 (digests, task types and lanes), 3 (the
torch-npu Overlap Analysis slices kept as rows of their lane; device rows named), 4 (the
SQLite export's task type is a compute task's ``COMPUTE_TASK_INFO.taskType``, as the text
export shows it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from residency.traces.files import MAX_TRACE_BYTES, TraceError, file_sha256, open_regular
from residency.traces.formats import Parsed, object_array

__all__ = ["CACHE_DIR", "cache_path", "read_cache", "write_cache"]

CACHE_DIR = "residency.parquet.cache"
_VERSION = 4
_NO_CODE = -1


def cache_path(source: Path) -> Path:
    """Where the cache of `source` lives."""
    return source.parent / CACHE_DIR / f"{source.name}.parquet"


def _key(stat: os.stat_result) -> dict[str, int]:
    return {"version": _VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def content_digest(p: Parsed, meta: dict[str, Any]) -> str:
    """SHA-256 of a parse's content and of its metadata (less this digest)."""
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "content_sha256"},
                                  sort_keys=True).encode())
    for a, dtype in ((p.device, np.int64), (p.ranges, np.int64), (p.device_task_type, np.int16),
                     (p.range_task_type, np.int16), (p.range_lane, np.int16)):
        h.update(np.ascontiguousarray(a, dtype).tobytes())
    h.update(json.dumps([p.names.tolist(), list(p.task_types), list(p.lanes),
                         [""] * len(p.device) if p.device_names is None
                         else p.device_names.tolist()]).encode())
    return h.hexdigest()


def read_cache(source: Path, stat: os.stat_result, *, root: Path | None = None,
               max_bytes: int = MAX_TRACE_BYTES) -> Parsed | None:
    """The cached parse of `source` if it matches the file as it is now (module doc)."""
    path = cache_path(source)
    if not path.is_file():
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        fd, _ = open_regular(path, max_bytes=max_bytes)
    except TraceError:  # not a regular file, too large: not a cache
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        file = pq.ParquetFile(pa.BufferReader(data))
        meta = json.loads(file.schema_arrow.metadata[b"residency"])
        if {k: meta.get(k) for k in _key(stat)} != _key(stat):
            return None
        table = file.read().combine_chunks()
        rows = np.column_stack([_ints(table[c].chunk(0)) if table[c].num_chunks else
                                np.empty(0, np.int64) for c in ("start_ns", "end_ns")])
        ndev = int(meta["device_rows"])
        names = object_array([])
        device_names = object_array([])
        tasks, task_table = _codes(table, "task_type", len(rows))
        lanes, lane_table = _codes(table, "lane", len(rows))
        if len(rows):  # every row has a name
            col = table["name"].chunk(0)
            every = object_array(col.dictionary.to_pylist())[_ints(col.indices)]
            device_names, names = every[:ndev], every[ndev:]
        rank = meta.get("rank")
        p = Parsed(rank if type(rank) is int else None, rows[:ndev], rows[ndev:], names,
                   int(meta["rejected"]), tasks[:ndev], tasks[ndev:], lanes[ndev:],
                   tuple(task_table), tuple(lane_table), device_names=device_names)
        if meta.get("content_sha256") != content_digest(p, meta):
            return None  # edited: never trusted
        if meta.get("trace_sha256") != file_sha256(source, root=root, max_bytes=max_bytes):
            return None
        p.sha256 = meta["trace_sha256"]
        return p
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            pa.ArrowException):
        return None  # an unusable cache is parsed anew and overwritten


def _codes(table: Any, column: str, n: int) -> tuple[np.ndarray, list[str]]:
    """A nullable dictionary column as int16 codes (-1: null) and its dictionary."""
    col = table[column]
    if not col.num_chunks:
        return np.full(n, _NO_CODE, np.int16), []
    col = col.chunk(0)
    if len(col) != n:
        raise ValueError(f"cached column {column} has {len(col)} rows, not {n}")
    idx = col.indices
    width = idx.type.bit_width // 8
    codes = np.frombuffer(idx.buffers()[1], dtype=f"<i{width}", count=len(idx),
                          offset=idx.offset * width).astype(np.int16)
    if idx.null_count:  # (pyarrow's fill_null would import pandas)
        bits = np.unpackbits(np.frombuffer(idx.buffers()[0], np.uint8), bitorder="little")
        codes[~bits[idx.offset:idx.offset + len(idx)].astype(bool)] = _NO_CODE
    return codes, col.dictionary.to_pylist()


def _ints(arr: Any) -> np.ndarray:
    """A null-free Arrow integer array as a numpy view (pyarrow's to_numpy imports pandas)."""
    if arr.null_count:
        raise ValueError("unexpected nulls in a cached column")
    width = arr.type.bit_width // 8
    return np.frombuffer(arr.buffers()[1], dtype=f"<i{width}", count=len(arr),
                         offset=arr.offset * width)


def _dictionary(codes: np.ndarray, table: list[str]) -> Any:
    import pyarrow as pa

    codes = codes.astype(np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0),
                                          pa.array(table, pa.string()))


def write_cache(source: Path, stat: os.stat_result, p: Parsed) -> None:
    """Write the parse of `source` beside it: device rows, then named range rows. A failure
    (read-only folder, full disk...) is ignored. Needs `p.sha256`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if p.sha256 is None:
        return
    path = cache_path(source)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        device_names = (p.device_names.tolist() if p.device_names is not None
                        else [""] * len(p.device))
        names = pa.array(device_names + p.names.tolist(), pa.string()).dictionary_encode()
        rows = np.concatenate((p.device, p.ranges)).reshape(-1, 2)
        none = np.full(len(p.device), _NO_CODE, np.int16)
        meta = {**_key(stat), "trace_sha256": p.sha256, "device_rows": len(p.device),
                "rank": p.rank, "rejected": p.rejected}
        meta["content_sha256"] = content_digest(p, meta)
        table = pa.table({
            "start_ns": rows[:, 0], "end_ns": rows[:, 1], "name": names,
            "task_type": _dictionary(np.concatenate((p.device_task_type, p.range_task_type)),
                                     list(p.task_types)),
            "lane": _dictionary(np.concatenate((none, p.range_lane)), list(p.lanes))})
        table = table.replace_schema_metadata({"residency": json.dumps(meta)})
        path.parent.mkdir(exist_ok=True)
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
