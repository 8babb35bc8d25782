"""What a file found beside traces holds, decided from its first bytes (the path is a hint).

`sniff` tells apart, for each candidate file (``*.json``, ``*.json.gz``, ``*.db``):

* ``kineto``: a Kineto / Chrome trace: a JSON object with a ``traceEvents`` array
  (torch.profiler's ``export_chrome_trace``, ``tensorboard_trace_handler``; HolisticTraceAnalysis'
  test traces), or an array of events (objects with a ``ph`` field) with no ``Ascend
  Hardware`` process;
* ``ascend``: torch-npu's text export, an event array (``trace_view.json``) holding a
  ``process_name`` metadata event (``"ph": "M"``) whose ``args.name`` is ``Ascend Hardware``,
  wherever the file lies (a ``trace_view.json`` copied off the NPU host,
  ``rank0/trace_view.json``), or an object with ``traceEvents`` whose head holds that event.
  Structure decides, never the bare text: a Kineto kernel or range *named* ``Ascend Hardware``
  leaves a trace Kineto;
* ``ascend_db``: torch-npu's ``ExportType.Db`` output, a SQLite file (its 16-byte header)
  with the ``TASK`` and ``STRING_IDS`` tables;
* ``skip``, with the reason: torch.profiler's execution trace (``pytorch_et``:
  ``{"schema": ..., "nodes": [...]}``, ``ExecutionTraceObserver``), its memory timeline export
  (``export_memory_timeline``: ``[[times...], [[sizes...]...]]``), other JSON (torch-npu's
  ``profiler_info_<rank>.json``, ``communication.json``, ...), an empty file, text that is
  not JSON, a SQLite file of another tool, and the sidecars serving frameworks write beside
  their captures: an array whose first element is an object without ``ph`` (vLLM's, SGLang's
  and xDiT's ``execution_details.json``, ``[{"file", "batch_size", "mode"}]``, and TraceLens'
  split metadata of the same name) holds no trace events.

Only the head of a file is read (`HEAD_BYTES`), except for an event array (read until an
``Ascend Hardware`` process name appears, or to its end; its first element up to `EVENT_CAP`)
and an object whose head has no ``traceEvents`` key (read until it appears). What cannot be
decided (malformed or truncated JSON) is left to the parser as ``kineto``, which names the
error and its byte. Files are opened as `residency.traces.files`
opens traces: regular files only, inside the folder searched, within the size limits.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from residency.traces.ascend_text import ASCEND_DEVICE_PROCESS
from residency.traces.files import MAX_TRACE_BYTES, TraceStream
from residency.traces.jsonstream import EVENT_CAP, value_end

__all__ = ["HEAD_BYTES", "SQLITE_HEADER", "Sniffed", "sniff"]

HEAD_BYTES = 1 << 16
SQLITE_HEADER = b"SQLite format 3\x00"
_ASCEND_PROCESS = b'"Ascend Hardware"'
_TRACE_EVENTS = b'"traceEvents"'
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_WINDOW = 4096  # bytes either side of an "Ascend Hardware" read to find the event holding it
_OUTWARD = 64  # enclosing objects tried per occurrence
_BLANK = b" \t\r\n\xef\xbb\xbf"  # white space and a UTF-8 byte-order mark
_PH_KEY = re.compile(rb'"ph"\s*:')  # a trace event's phase key, anywhere in the head
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
            raw, first = _first_element(stream, raw)
            # records without "ph" anywhere read so far: a sidecar; a trace whose first event
            # lacks it (rejected as an event, counted) is still a trace
            if isinstance(first, dict) and "ph" not in first and not _PH_KEY.search(raw):
                keys = ", ".join(repr(k)[:40] for k in list(first)[:6]) or "none"
                return Sniffed("skip", f"a JSON array of records without \"ph\" (keys: {keys})"
                                       ": no trace events (a capture's sidecar?)")
            found = _device_process(stream, raw)
            return Sniffed("ascend") if found else Sniffed("kineto")
        if head[:1] != b"{":
            return Sniffed("skip", f"not JSON (it starts with {head[:8]!r})")
        if _TRACE_EVENTS_KEY.search(head):  # torch-npu writes arrays; an object holding its
            # device process in the head is its export all the same
            return Sniffed("ascend") if _device_process(None, head) else Sniffed("kineto")
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


def _first_element(stream: TraceStream, raw: bytes) -> tuple[bytes, object]:
    """(the bytes read so far, the array's first element when it is an object that decodes
    within `EVENT_CAP`, else None). `raw` starts with the array (blanks before it dropped)."""
    buf = raw.lstrip(_BLANK)
    while True:
        i = len(buf) - len(buf[1:].lstrip(_BLANK))  # the first element's first byte
        if i < len(buf) and buf[i:i + 1] != b"{":
            return buf, None  # not an object: the parser names what it is
        end = value_end(bytearray(buf), i) if i < len(buf) else None
        if end is not None:
            if end < 0:
                return buf, None
            try:
                return buf, msgspec.json.decode(buf[i:end])
            except msgspec.DecodeError:
                return buf, None
        if len(buf) > EVENT_CAP:
            return buf, None
        more = _read_more(stream, len(buf))  # double what is held: linear in all
        if not more:
            return buf, None
        buf += more


def _read_more(stream: TraceStream, n: int) -> bytes:
    parts, got = [], 0
    while got < n and (block := stream.read()):
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def _device_process(stream: TraceStream | None, seen: bytes) -> bool:
    """Whether a ``process_name`` metadata event names the ``Ascend Hardware`` process in
    `seen` or (with `stream`) in the rest of the stream, read chunk by chunk."""
    buf, start, eof = seen, 0, stream is None
    n = len(_ASCEND_PROCESS)
    while True:
        i = buf.find(_ASCEND_PROCESS, start)
        if i >= 0 and (eof or i + n + _WINDOW <= len(buf)):
            lo = max(0, i - _WINDOW)
            before = buf[lo:i].decode("utf-8", "replace")
            after = buf[i:i + n + _WINDOW].decode("utf-8", "replace")
            if _names_device_process(before + after, len(before)):
                return True
            start = i + 1
            continue
        if eof:
            return False
        block = stream.read()  # type: ignore[union-attr]
        if not block:
            eof = True
            continue
        nxt = i if i >= 0 else max(start, len(buf) - n + 1)
        keep = max(0, nxt - _WINDOW)
        buf, start = buf[keep:] + block, nxt - keep


def _names_device_process(text: str, at: int) -> bool:
    """Whether the string at `at` in `text` is the ``args.name`` of a ``process_name``
    metadata event: the innermost enclosing object with a ``ph`` field is that event."""
    decoder = json.JSONDecoder()
    s = text.rfind("{", 0, at)
    for _ in range(_OUTWARD):
        if s < 0:
            return False
        try:
            obj, end = decoder.raw_decode(text, s)
        except ValueError:  # a brace inside a string, or an object cut by the window
            obj, end = None, -1
        if isinstance(obj, dict) and end > at and "ph" in obj:
            args = obj.get("args")
            return (obj.get("ph") == "M" and obj.get("name") == "process_name"
                    and isinstance(args, dict) and args.get("name") == ASCEND_DEVICE_PROCESS)
        s = text.rfind("{", 0, s)
    return False


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
    except (ValueError, RecursionError):  # nested deeper than the parser's stack: not ours
        return "not a trace: JSON without traceEvents"
    keys = ", ".join(repr(k)[:40] for k in list(doc)[:6]) if isinstance(doc, dict) else ""
    return f"JSON without traceEvents (keys: {keys or 'none'}): not a trace"


def _sniff_db(path: Path) -> Sniffed:
    from residency.traces.ascend_db import profiler_db_problem

    problem = profiler_db_problem(path)
    return Sniffed("ascend_db") if problem is None else Sniffed("skip", problem)
