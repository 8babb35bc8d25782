"""Decoding one trace file, streamed, into int64-nanosecond columns: what every format shares.

`parse_trace` reads the file in chunks (`residency.traces.files`), has
`residency.traces.jsonstream` split
the events into runs, hands each run to the format's column builder (`READERS`: one module per
format, `residency.traces.kineto` and `residency.traces.ascend_text`), and settles the
document-level fields at the end. Memory: about two chunks plus the kept columns
(16 bytes per Kineto device task, 27 per torch-npu event), whatever the file size.
`parse_whole` decodes a document held in memory the same way (the reference the streamed parse
is tested against; also the path of irregular documents). A large plain file can be parsed in
parts by several processes (`part_bounds`, `parse_part`, `join_parts`).

Per event, a run is decoded by a typed fast path (float64 times) when every value of the run
has the expected type and resolves the nanosecond; else by an any-type path that keeps every
number's decimal text. Both give the same int64 ns for every event
(`residency.traces.units`): the fast path refuses (for the run) any time that is not safely
away from a half-nanosecond tie.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from residency.traces import ascend_text, kineto
from residency.traces.columns import AnyEvent, AnyTrace, Parsed, Reader
from residency.traces.files import CHUNK_BYTES, MAX_TRACE_BYTES, TraceError, TraceStream
from residency.traces.jsonstream import (
    PLACEHOLDER,
    PLACEHOLDER_VALUE,
    NotAligned,
    Part,
    Skeleton,
    decode_error,
    likely_boundary,
    read_whole,
    split_events,
    split_part,
)

__all__ = ["READERS", "NotAligned", "Parsed", "join_parts", "parse_part", "parse_trace",
           "parse_whole", "part_bounds"]

# format name (as `residency.traces.load` finds it) -> the module that reads it
READERS: dict[str, Reader] = {"kineto": kineto.READER, "ascend": ascend_text.READER}


class _Skeleton(msgspec.Struct, gc=False):
    traceEvents: Any = None
    baseTimeNanoseconds: Any = None
    distributedInfo: Any = None


# -- one file ---------------------------------------------------------------------------------

def parse_trace(fmt: str, source: Path, *, root: Path | None = None,
                chunk_bytes: int = CHUNK_BYTES, max_bytes: int = MAX_TRACE_BYTES,
                digest: bool = False, device_names: bool = True,
                fold_device: bool = False,
                keep_host: Callable[[str], bool] | None = None) -> Parsed:
    """Stream `source` (format `fmt`: "kineto" or "ascend") into columns; without
    `device_names`, a Kineto parse leaves the device tasks' names out (``None``); with
    `fold_device` (Kineto, without `device_names`), it folds the device tasks into their union
    as they are read (`Parsed.device_folded`) and keeps no rows of them; with `keep_host`, it
    keeps only the host ranges whose name `keep_host` wants (torch-npu: outside the
    Communication and derived lanes) and counts the others (`Parsed.host_folded`). Either may
    raise `residency.traces.columns.NotFoldable` (Kineto).

    Raises:
        TraceError: the file cannot be read (module `residency.traces.files`), is not valid JSON
            (with the byte position in the decompressed stream), or not a trace.
    """
    with _gc_paused(), _trace_errors(source), TraceStream(
            source, root=root, chunk_bytes=chunk_bytes, max_bytes=max_bytes,
            digest=digest) as stream:
        cols = READERS[fmt].columns(device_names)
        if fold_device:
            cols.fold_device()
        if keep_host is not None:
            cols.keep_host(keep_host)
        got = split_events(stream, cols.add, source)
        if isinstance(got, Skeleton):
            doc = _skeleton(source, got)
            if doc is not None:
                parsed = cols.finish(source, doc if got.in_object else None)
                parsed.digest = _drain(stream)
                return parsed
            prefix, offset = b"", 0  # a repeated traceEvents: read it all again, whole
            stream = TraceStream(source, root=root, chunk_bytes=chunk_bytes,
                                 max_bytes=max_bytes, digest=digest)
        else:
            prefix, offset = got
        with stream:
            data, offset = read_whole(stream, prefix, offset, source)
            parsed = parse_whole(fmt, source, data, offset=offset, total=stream.offset)
            parsed.digest = _drain(stream)
            return parsed


# -- one file in parts, in parallel -----------------------------------------------------------

def part_bounds(source: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """Byte ranges ``[start, stop)`` splitting a plain file into about `parts` parts at likely
    event boundaries (each range but the last ends with the comma the next one begins with)."""
    cuts = []
    with open(source, "rb") as f:
        for j in range(1, parts):
            f.seek(size * j // parts)
            at = likely_boundary(f.read(1 << 20))
            if at is not None:
                cuts.append(size * j // parts + at)
    cuts = sorted(set(cuts))
    starts = [0, *cuts]
    return [(a, b + 1) for a, b in zip(starts, cuts, strict=False)] + [(starts[-1], size)]


def parse_part(fmt: str, source: Path, start: int, stop: int, *, first: bool, last: bool,
               root: Path | None = None, chunk_bytes: int = CHUNK_BYTES,
               max_bytes: int = MAX_TRACE_BYTES, device_names: bool = True,
               digest: bool = False) -> tuple[Any, Part, str | None]:
    """The columns of one part of a plain trace file (`part_bounds`), not yet finished, with
    (`digest`) the content digest of exactly the bytes of the part as it read them (else
    None; `residency.traces.files.parts_digest` combines them).

    Raises:
        NotAligned, TraceError: the caller parses the whole file with `parse_trace` instead.
    """
    with _gc_paused(), _trace_errors(source), TraceStream(
            source, root=root, chunk_bytes=chunk_bytes, max_bytes=max_bytes, start=start,
            stop=stop, digest=digest) as stream:
        cols = READERS[fmt].columns(device_names)
        part = split_part(stream, cols.add, source, first=first, last=last)
        cols.compact()
        return cols, part, _drain(stream) if digest else None


def join_parts(source: Path, parts: list[tuple[Any, Part, str | None]]) -> Parsed:
    """The timeline of a file from its parts' columns, in file order.

    Raises:
        NotAligned: the document repeats ``traceEvents``; TraceError: as `parse_trace`.
    """
    cols = parts[0][0]
    for other, *_ in parts[1:]:
        cols.extend(other)
    head, tail = parts[0][1], parts[-1][1]
    assert head.head is not None and tail.tail is not None
    sk = Skeleton(head.head + PLACEHOLDER + tail.tail, len(head.head), head.h0,
                  tail.tail_offset, tail.total, head.layout == "object", tail.gaps)
    with _trace_errors(source):
        doc = _skeleton(source, sk)
        if doc is None:
            raise NotAligned("traceEvents repeated")
        return cols.finish(source, doc if sk.in_object else None)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a file is parsed: the parse allocates
    millions of objects that hold no cycles (structs are ``gc=False``), and each collection
    pass over them is wasted work (5-8 % of a parse here). Restored as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _trace_errors(source: Path) -> Iterator[None]:
    try:
        yield
    except RecursionError:  # msgspec's nesting limit
        raise TraceError(source, "invalid JSON: nested too deeply to decode") from None
    except msgspec.DecodeError as exc:  # a raw field decoded late (metadata args)
        raise TraceError(source, f"invalid JSON: {exc}") from None


def _drain(stream: TraceStream) -> str | None:
    """Read what is left (for the file's digest, or to check its seal) and return the
    digest."""
    if stream.digest is None:
        stream.finish()
        return None
    while stream.read():
        pass
    return stream.digest


def _skeleton(source: Path, sk: Skeleton) -> Any:
    """The document-level fields; None when the document repeats ``traceEvents``."""
    try:
        doc = msgspec.json.decode(sk.text)
    except msgspec.DecodeError as exc:
        raise decode_error(source, exc, sk.position, sk.total,
                           gz=source.name.endswith(".gz")) from None
    if not sk.in_object:
        return doc if doc == PLACEHOLDER_VALUE else None
    if not isinstance(doc, dict) or doc.get("traceEvents") != PLACEHOLDER_VALUE:
        return None
    return _Skeleton(doc.get("traceEvents"), doc.get("baseTimeNanoseconds"),
                     doc.get("distributedInfo"))


def parse_whole(fmt: str, source: Path, data: bytes, *, offset: int = 0,
                total: int | None = None) -> Parsed:
    """Decode a whole document held in memory (`data` begins at stream byte `offset`).

    Raises:
        TraceError: as `parse_trace`.
    """
    with _trace_errors(source):
        return _parse_whole(fmt, source, data, offset, total)


def _parse_whole(fmt: str, source: Path, data: bytes, offset: int, total: int | None) -> Parsed:
    gz = source.name.endswith(".gz")
    end = offset + len(data) if total is None else total

    def decode(typ: Any, exact: bool) -> Any:
        try:
            return msgspec.json.Decoder(typ, float_hook=str if exact else None).decode(data)
        except msgspec.ValidationError as exc:
            if not exact:
                raise
            raise TraceError(source, f"not a trace of the expected shape: {exc}") from None
        except msgspec.DecodeError as exc:
            raise decode_error(source, exc, lambda k: offset + k, end, gz=gz) from None

    reader = READERS[fmt]
    try:
        doc = decode(reader.fast, False)
        cols = reader.columns(True)
        if cols.add_fast(_events_of(source, doc)):
            return cols.finish(source, doc if reader.reads_document else None)
    except msgspec.ValidationError:
        pass
    doc = decode(AnyTrace | list[AnyEvent], True)  # type: ignore[operator]
    cols = reader.columns(True)
    cols.add_exact(_events_of(source, doc))
    return cols.finish(source, doc if reader.reads_document else None)


def _events_of(source: Path, doc: Any) -> list[Any]:
    """The event list of a JSON Object Format document, or the document if it is an array."""
    if isinstance(doc, list):
        return doc
    if doc.traceEvents is None:
        raise TraceError(source, "no traceEvents: not a trace")
    return doc.traceEvents

