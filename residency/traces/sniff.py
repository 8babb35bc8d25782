"""What a file found beside traces holds, decided from its first bytes (the path is a hint).

`sniff` tells apart, for each candidate file (``*.json``, ``*.json.gz``, ``*.db``):

* ``kineto``: a Kineto / Chrome trace: a JSON object with ``traceEvents`` (torch.profiler's
  ``export_chrome_trace``, ``tensorboard_trace_handler``; HolisticTraceAnalysis' test traces),
  or an event array with no ``Ascend Hardware`` process;
* ``ascend``: torch-npu's text export, an event array (``trace_view.json``) naming a process
  ``Ascend Hardware`` in its ``process_name`` metadata, wherever the file lies (a
  ``trace_view.json`` copied off the NPU host, ``rank0/trace_view.json``), or an object with
  ``traceEvents`` whose head names that process;
* ``ascend_db``: torch-npu's ``ExportType.Db`` output, a SQLite file (its 16-byte header)
  with the ``TASK`` and ``STRING_IDS`` tables;
* ``skip``, with the reason: torch.profiler's execution trace (``pytorch_et``:
  ``{"schema": ..., "nodes": [...]}``, ``ExecutionTraceObserver``), its memory timeline export
  (``export_memory_timeline``: ``[[times...], [[sizes...]...]]``), other JSON (torch-npu's
  ``profiler_info_<rank>.json``, ``communication.json``, ...), an empty file, text that is
  not JSON, a SQLite file of another tool.

Only the head of a file is read (`HEAD_BYTES`), except for an event array (read until an
``Ascend Hardware`` process name appears, or to its end) and an object whose head has no
``traceEvents`` key (read until it appears). Files are opened as `residency.traces.files`
opens traces: regular files only, inside the folder searched, within the size limits.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from residency.traces.files import MAX_TRACE_BYTES, TraceStream

__all__ = ["HEAD_BYTES", "SQLITE_HEADER", "Sniffed", "sniff"]

HEAD_BYTES = 1 << 16
SQLITE_HEADER = b"SQLite format 3\x00"
_ASCEND_PROCESS = b'"Ascend Hardware"'
_TRACE_EVENTS = b'"traceEvents"'
_BLANK = b" \t\r\n\xef\xbb\xbf"  # white space and a UTF-8 byte-order mark
_MEMORY_TIMELINE = re.compile(rb"\[\s*\[")


@dataclass(frozen=True)
class Sniffed:
    """A file's kind and, for ``skip``, why it is not read as a trace."""

    kind: Literal["kineto", "ascend", "ascend_db", "skip"]
    reason: str = ""


def sniff(path: Path, *, root: Path | None = None,
          max_bytes: int = MAX_TRACE_BYTES) -> Sniffed:
    """The kind of `path` (module doc).

    Raises:
        TraceError: the file cannot be opened as a trace is (not a regular file, a link
            leaving `root`, over `max_bytes`, unreadable, a broken gzip stream).
    """
    with TraceStream(path, root=root, chunk_bytes=HEAD_BYTES, max_bytes=max_bytes) as stream:
        raw = _read_head(stream)
        if raw.startswith(SQLITE_HEADER):
            stream.close()
            return _sniff_db(path)
        head = raw.lstrip(_BLANK)
        blank = bool(raw) and not head
        while not head and (block := stream.read()):  # white space before any value
            head = block.lstrip(_BLANK)
            raw = head
        if not head:
            return Sniffed("skip", "only white space: no JSON value (a truncated trace?)"
                           if blank else "an empty file")
        if head[:1] == b"[":
            if _MEMORY_TIMELINE.match(head):
                return Sniffed("skip", "a memory timeline export (torch.profiler "
                                       "export_memory_timeline), not a trace")
            found = _scan(stream, raw, _ASCEND_PROCESS)
            return Sniffed("ascend") if found else Sniffed("kineto")
        if head[:1] != b"{":
            return Sniffed("skip", f"not JSON (it starts with {head[:8]!r})")
        if _TRACE_EVENTS in head:  # torch-npu writes arrays; an object naming its device
            # process in the head is its export all the same
            return Sniffed("ascend") if _ASCEND_PROCESS in head else Sniffed("kineto")
        if b'"nodes"' in head and b'"schema"' in head:
            return Sniffed("skip", "a pytorch_et execution trace (torch.profiler "
                                   "ExecutionTraceObserver), not a timeline")
        whole = len(raw) < HEAD_BYTES
        if not whole and _scan(stream, raw, _TRACE_EVENTS):
            return Sniffed("kineto")
        return Sniffed("skip", _describe_json(head) if whole else
                       "JSON without traceEvents: not a trace")


def _read_head(stream: TraceStream) -> bytes:
    parts, n = [], 0
    while n < HEAD_BYTES and (block := stream.read()):
        parts.append(block)
        n += len(block)
    return b"".join(parts)


def _scan(stream: TraceStream, seen: bytes, needle: bytes) -> bool:
    """Whether `needle` occurs in `seen` or in the rest of the stream (read chunk by chunk)."""
    tail = seen
    while True:
        if needle in tail:
            return True
        block = stream.read()
        if not block:
            return False
        tail = tail[-len(needle):] + block


def _describe_json(head: bytes) -> str:
    try:
        doc = json.loads(head.decode("utf-8", "replace"))
    except ValueError:
        return "not a trace: JSON without traceEvents"
    keys = ", ".join(repr(k)[:40] for k in list(doc)[:6]) if isinstance(doc, dict) else ""
    return f"JSON without traceEvents (keys: {keys or 'none'}): not a trace"


def _sniff_db(path: Path) -> Sniffed:
    from residency.traces.ascend import profiler_db_problem

    problem = profiler_db_problem(path)
    return Sniffed("ascend_db") if problem is None else Sniffed("skip", problem)
