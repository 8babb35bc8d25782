"""Splitting a JSON trace document, read as a stream, into runs of whole events.

A trace is a JSON array of events, or an object whose ``traceEvents`` member is one (Trace Event
Format). `split_events` hands the events to a callback in runs of about one chunk, each as the
text of a JSON array, and returns the rest of the document (the `Skeleton`: the document with
the events array replaced by `PLACEHOLDER`). Memory holds about two chunks and the skeleton,
never the whole file.

Boundaries are found without looking at every byte in Python: a likely one (``}``, ``,``, ``{``)
is taken near the end of the buffer and the run before it is decoded; the run decoding as a
complete JSON array proves the boundary (one inside a string or a nested value cannot). Where
decoding fails, a vectorised scan (quotes, escapes, bracket depth) finds the true boundary, and
where even that is ambiguous, decoding the whole buffer gives the error msgspec would give on
the whole file. Positions count bytes of the decompressed stream.

A document of any other layout (no ``traceEvents`` array at the top, something unexpected
before it) is *irregular*: `split_events` returns None and the caller decodes it whole, as read
by `read_whole` (at most `WHOLE_CAP` bytes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from residency.traces.files import TraceError, TraceStream

__all__ = ["EVENT_CAP", "PLACEHOLDER", "WHOLE_CAP", "NotAligned", "Part", "Skeleton",
           "decode_error", "likely_boundary", "read_whole", "split_events", "split_part",
           "value_end"]

WHOLE_CAP = 64 << 20  # an irregular document; what lies outside the events array
PLACEHOLDER = b'"\\u0000residency:streamed-events"'
PLACEHOLDER_VALUE = "\x00residency:streamed-events"
_NON_WS = re.compile(rb"[^ \t\r\n]")
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_BYTE = re.compile(r"\s*\(byte (\d+)\)")
_INDEX = re.compile(r"`\$\[(\d+)\]")
_OPEN, _CLOSE, _COMMA = 0x5B, 0x5D, 0x2C
_STRUCTURAL = np.zeros(256, bool)
_STRUCTURAL[[_OPEN, _CLOSE, _COMMA, 0x7B, 0x7D]] = True
EVENT_CAP = 16 << 20  # the longest single event


@dataclass
class Skeleton:
    """The document without its events: `text` with `PLACEHOLDER` where the array was.

    `in_object`: the events were an object's ``traceEvents`` (else the document itself)."""

    text: bytes
    head_len: int  # bytes of `text` before the placeholder
    head_offset: int  # stream offset of text[0]
    tail_offset: int  # stream offset of the byte after the events array's closing bracket
    total: int  # bytes in the stream
    in_object: bool
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (text index, bytes dropped)

    def position(self, k: int) -> int:
        """The stream offset of byte `k` of `text`."""
        if k < self.head_len:
            return self.head_offset + k
        k -= self.head_len + len(PLACEHOLDER)
        extra = sum(n for at, n in self.gaps if at <= k)
        return self.tail_offset + k + extra


def decode_error(source: object, exc: msgspec.DecodeError, where: Callable[[int], int],
                 total: int, *, gz: bool) -> TraceError:
    """The TraceError of a msgspec decode error; `where` maps its byte to a stream offset."""
    text = str(exc)
    if "truncated" in text:
        return TraceError(source, "truncated JSON (the file ends early)", total)  # type: ignore[arg-type]
    m = _BYTE.search(text)
    msg = text.replace(m.group(0), "").strip() if m else text
    if m and gz:
        msg += " (the byte counts the decompressed JSON)"
    return TraceError(source, f"invalid JSON: {msg}",  # type: ignore[arg-type]
                      where(int(m.group(1))) if m else None)


def _skip(buf: bytes | bytearray, i: int) -> int:
    m = _NON_WS.search(buf, i)
    return m.start() if m else len(buf)


def _value_end(buf: bytearray, i: int) -> int | None:
    """Index of the first non-space byte after the JSON value at `buf[i]`; None when the buffer
    may end inside it; -1 when it is malformed."""
    with memoryview(buf) as mv:
        try:
            msgspec.json.decode(mv[i:])
        except msgspec.DecodeError as exc:
            text = str(exc)
            m = _BYTE.search(text)
            if "trailing characters" in text and m:
                return i + int(m.group(1)) - 1  # msgspec counts the byte after it
            # at the end of the buffer (a number cut short reads as invalid): more bytes
            return None if "truncated" in text or not m or i + int(m.group(1)) >= len(buf) else -1
        except RecursionError:
            return -1
    return None


def value_end(buf: bytearray, i: int) -> int | None:
    """Index of the first non-space byte after the JSON value that starts at `buf[i]`; None
    when `buf` may end inside it (read more); -1 when it is malformed."""
    return _value_end(buf, i)


def _scan_head(buf: bytearray) -> tuple[str, int]:
    """("array" | "object", index of the events' ``[``), ("more", 0) or ("irregular", 0)."""
    n, i = len(buf), _skip(buf, 0)
    if i == n:
        return "more", 0
    if buf[i] == _OPEN:
        return "array", i
    if buf[i] != 0x7B:
        return "irregular", 0
    i += 1
    while True:
        i = _skip(buf, i)
        if i == n:
            return "more", 0
        if buf[i] != 0x22:
            return "irregular", 0
        end = _value_end(buf, i)
        if end is None or end < 0:
            return ("more", 0) if end is None else ("irregular", 0)
        key = msgspec.json.decode(bytes(buf[i:end]))
        if buf[end] != 0x3A:
            return "irregular", 0
        j = _skip(buf, end + 1)
        if j == n:
            return "more", 0
        if key == "traceEvents" and buf[j] == _OPEN:
            return "object", j
        end = _value_end(buf, j)
        if end is None or end < 0:
            return ("more", 0) if end is None else ("irregular", 0)
        if buf[end] != _COMMA:
            return "irregular", 0
        i = end + 1


def likely_boundary(text: bytes) -> int | None:
    """Index of the comma of the first ``}, {`` in `text`: probably between two events (a
    part of a file parsed on its own starts there; `split_part` proves it)."""
    m = _BOUNDARY.search(text)
    return text.index(b",", m.start()) if m else None


def _likely_cut(buf: bytearray) -> int | None:
    """The comma of the last ``}, {`` in `buf` (after byte 0): probably between two events."""
    end = len(buf)
    for _ in range(64):
        j = buf.rfind(b"}", 1, end)
        if j < 0:
            return None
        m = _BOUNDARY.match(buf, j)
        if m:
            return buf.index(b",", j)
        end = j
    return None


def _boundaries(buf: bytearray) -> tuple[int | None, int | None]:
    """(last comma between two events, first bracket closing the events array) in `buf`,
    whose byte 0 separates two events (outside strings, at the array's level)."""
    a = np.frombuffer(buf, np.uint8)  # a view: released before `buf` is resized
    quotes = np.flatnonzero(a == 0x22)
    quotes = quotes[quotes > 0]
    escaped = quotes[a[quotes - 1] == 0x5C]
    if len(escaped):
        drop = []
        for q in escaped.tolist():
            j = q - 1
            while a[j] == 0x5C:
                j -= 1
            if (q - 1 - j) % 2:
                drop.append(q)
        quotes = np.setdiff1d(quotes, np.array(drop, np.int64))
    pos = np.flatnonzero(_STRUCTURAL[a])
    pos = pos[pos > 0]
    pos = pos[(np.searchsorted(quotes, pos) & 1) == 0]  # an even number of quotes before
    ch = a[pos]
    depth = np.cumsum(np.where((ch == _OPEN) | (ch == 0x7B), 1,
                               np.where(ch == _COMMA, 0, -1)))
    closes = np.flatnonzero(depth < 0)
    close = int(pos[closes[0]]) if len(closes) else None
    commas = pos[(ch == _COMMA) & (depth == 0)]
    if close is not None:
        commas = commas[commas < close]
    del a
    return (int(commas[-1]) if len(commas) else None), close


_AMBIGUOUS = object()


class _Splitter:
    """The state of one split: a buffer that begins with the separator before the next event
    (``[`` or ``,``), and where it lies in the stream."""

    def __init__(self, stream: TraceStream, on_events: Callable[[bytes, int], int],
                 source: object) -> None:
        self.stream, self.on_events, self.source = stream, on_events, source
        self.gz = stream.path.name.endswith(".gz")
        self.buf = bytearray()
        self.off = 0  # stream offset of buf[0]
        self.gap = 0  # white space dropped after buf[0]
        self.index = 0  # number of the next event in the array
        self.prefix = "$"  # the array's path in msgspec's messages
        self.eof = False

    # -- reading ------------------------------------------------------------------------------
    def fill(self) -> None:
        chunk = self.stream.read()
        if not chunk:
            self.eof = True
            return
        self.buf += chunk
        if len(self.buf) > 1 and _NON_WS.search(self.buf, 1) is None:  # white space only
            self.gap += len(self.buf) - 1
            del self.buf[1:]

    def at(self, k: int) -> int:
        """Stream offset of buf[k]."""
        return self.off + (self.gap + k if k else 0)

    # -- decoding one run ---------------------------------------------------------------------
    def error(self, exc: msgspec.DecodeError) -> TraceError:
        return decode_error(self.source, exc, self.at, self.stream.offset, gz=self.gz)

    def attempt(self, end: int, *, replaced: bool, whole: bool = False) -> object:
        """Decode buf[:end + 1] as an array (buf[0] made ``[``; buf[end] made ``]`` when
        `replaced`). Returns the number of events, ("closed", index of the array's real end) or
        _AMBIGUOUS; raises TraceError for an error that the whole file has too."""
        buf = self.buf
        k = _skip(buf, 1)
        if k == end and (replaced or (buf[k] == _CLOSE and buf[0] == _COMMA)):
            # no event between the separator and the comma (replaced) or bracket ending the
            # run: `,,`, `[,` or `,]` in the stream (decoded alone, `[]` would pass); in
            # msgspec's words
            what = "trailing comma in array" if buf[k] == _CLOSE else "invalid character"
            raise TraceError(self.source, f"invalid JSON: JSON is malformed: {what}",  # type: ignore[arg-type]
                             self.at(k))
        first, last = buf[0], buf[end]
        buf[0] = _OPEN
        if replaced:
            buf[end] = _CLOSE
        data = bytes(memoryview(buf)[:end + 1])  # one copy (the view is gone at once)
        buf[0], buf[end] = first, last
        try:
            n = self.on_events(data, self.index)
        except msgspec.ValidationError as exc:
            text = _INDEX.sub(lambda m: f"`{self.prefix}[{int(m.group(1)) + self.index}]",
                              str(exc))
            raise TraceError(self.source, f"not a trace of the expected shape: {text}") from None  # type: ignore[arg-type]
        except RecursionError:
            raise TraceError(self.source, "invalid JSON: nested too deeply to decode") from None  # type: ignore[arg-type]
        except msgspec.DecodeError as exc:
            text = str(exc)
            if "trailing characters" in text and (m := _BYTE.search(text)):
                # msgspec's byte is the one after the first trailing byte
                return "closed", len(data[:int(m.group(1)) - 1].rstrip(b" \t\r\n")) - 1
            if "truncated" in text:
                if whole and self.eof:
                    raise self.error(exc) from None
                return _AMBIGUOUS
            m = _BYTE.search(text)
            p = int(m.group(1)) if m else len(data)
            # a byte the stream has too (not our `]`); at the end of data, a number cut short
            # reads as invalid: real only at the end of the stream
            if p < end or (not replaced and (p < len(data) or (whole and self.eof))):
                raise self.error(exc) from None
            return _AMBIGUOUS
        return n

    def consume(self, end: int, n: int) -> None:
        self.index += n
        self.off = self.at(end)
        self.gap = 0
        del self.buf[:end]

    # -- the events array ---------------------------------------------------------------------
    def events(self, *, part_end: bool = False) -> int:
        """Deliver every event; return the index in buf of the array's closing bracket (the
        buffer then holds the rest of the stream read so far). With `part_end`, the stream is
        one part of the array, ending with the comma after an event (returns -1)."""
        while True:
            while not self.eof and len(self.buf) <= self.stream.chunk_bytes:
                self.fill()
            if self.eof:
                return self.part_end() if part_end else self.last()
            cut = _likely_cut(self.buf)
            got = self.attempt(cut, replaced=True) if cut is not None else _AMBIGUOUS
            if got is _AMBIGUOUS:
                comma, close = _boundaries(self.buf)
                if close is not None:
                    got = self.attempt(close, replaced=False)
                    if isinstance(got, int):
                        self.index += got
                        return close
                elif comma is not None:
                    cut, got = comma, self.attempt(comma, replaced=True)
            if got is _AMBIGUOUS:
                got = self.truth()
                if got is None:  # no boundary and no error yet: one long event
                    if len(self.buf) > EVENT_CAP:
                        raise TraceError(self.source, f"an event longer than {EVENT_CAP} "  # type: ignore[arg-type]
                                         "bytes: not a trace", self.at(0))
                    self.fill()
                    continue
            if isinstance(got, tuple):
                if part_end:
                    raise NotAligned("the events array ends inside a part")
                return got[1] if got[0] == "delivered" else self.close(got[1])
            self.consume(cut, got)  # type: ignore[arg-type]

    def close(self, end: int) -> int:
        """The array ends at buf[end]: deliver its last run."""
        got = self.attempt(end, replaced=False)
        if isinstance(got, tuple) or got is _AMBIGUOUS:  # cannot be: the array decoded before
            raise TraceError(self.source, "invalid JSON: the events array could not be "  # type: ignore[arg-type]
                             "delimited", self.at(end))
        self.index += got  # type: ignore[operator]
        return end

    def truth(self) -> object:
        """Decode the whole buffer: a real error raises; ("closed", k) where the array ends;
        None when the buffer has no error and does not end the array."""
        got = self.attempt(len(self.buf) - 1, replaced=False, whole=True)
        if got is _AMBIGUOUS:
            return None
        if isinstance(got, tuple):
            return got
        # the buffer is exactly the array's rest: its last byte closes it
        self.index += got  # type: ignore[operator]
        return "delivered", len(self.buf.rstrip(b" \t\r\n")) - 1

    def part_end(self) -> int:
        """At the end of a part: its last byte must be the comma after an event."""
        buf = self.buf
        if len(buf) == 1 and buf[0] == _COMMA and self.gap == 0 and self.index:
            return -1  # the last run already ended at the part's final comma
        if len(buf) < 2 or buf[-1] != _COMMA or _skip(buf, 1) == len(buf) - 1:
            raise NotAligned("the part does not end with a comma after an event")
        got = self.attempt(len(buf) - 1, replaced=True)
        if not isinstance(got, int):
            raise NotAligned("the part does not end between two events")
        self.index += got
        return -1

    def last(self) -> int:
        """At the end of the stream: find the array's end, deliver the last run."""
        c = self.buf.rfind(b"]")
        if c > 0:
            got = self.attempt(c, replaced=False)
            if isinstance(got, int):
                self.index += got
                return c
            if isinstance(got, tuple):
                return self.close(got[1])
        got = self.truth()
        if got is None:  # at the end of the stream, truncation is an error: truth raised
            raise TraceError(self.source, "truncated JSON (the file ends early)",  # type: ignore[arg-type]
                             self.stream.offset)
        if got[0] == "delivered":  # type: ignore[index]
            return got[1]  # type: ignore[index]
        return self.close(got[1])  # type: ignore[index]


def split_events(stream: TraceStream, on_events: Callable[[bytes, int], int],
                 source: object) -> Skeleton | tuple[bytes, int]:
    """Stream the document: `on_events(text, index)` gets each run of events as a JSON array
    (the first numbered `index` in the whole array) and returns how many it decoded; it
    raises msgspec's errors unchanged (classified here). Returns the `Skeleton`, or, for an
    irregular document, ``(bytes read so far, stream offset of their first byte)``.

    Raises:
        TraceError: malformed JSON (with its position), an event or the skeleton larger than
            `WHOLE_CAP`, or the stream's own errors.
    """
    sp = _Splitter(stream, on_events, source)
    found = _head(sp)
    if len(found) == 2:
        return found  # type: ignore[return-value]  # irregular
    head, h0, layout = found  # type: ignore[misc]
    end = sp.events()
    tail, tail_offset, gaps = _tail(sp, end, len(head))
    return Skeleton(head + PLACEHOLDER + tail, len(head), h0, tail_offset, stream.offset,
                    layout == "object", gaps)


class NotAligned(Exception):
    """A part of a file read on its own does not begin and end between two events."""


@dataclass
class Part:
    """What one part of a file yields besides its events: the first part, the document before
    the events array (`head` from stream offset `h0`, `layout`); the last, what follows it."""

    head: bytes | None = None
    h0: int = 0
    layout: str = ""
    tail: bytes | None = None
    tail_offset: int = 0
    total: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)


def split_part(stream: TraceStream, on_events: Callable[[bytes, int], int], source: object,
               *, first: bool, last: bool) -> Part:
    """`split_events` on one part of a document: `stream` covers a byte range that (unless
    `first`) begins with the comma before an event and (unless `last`) ends with the comma
    after one. The part's runs decoding proves both (a run of whole events cannot decode
    otherwise), given that the part before it is proved the same way.

    Raises:
        NotAligned: the range does not begin or end between two events, or the document is
            irregular; TraceError: as `split_events` (the caller parses the file whole then).
    """
    sp = _Splitter(stream, on_events, source)
    part = Part()
    if first:
        found = _head(sp)
        if len(found) == 2:
            raise NotAligned("irregular document")
        part.head, part.h0, part.layout = found  # type: ignore[misc]
    else:
        sp.off = stream.offset
        sp.fill()
        if not sp.buf.startswith(b","):
            raise NotAligned("the part does not begin with a comma")
        sp.index = 1  # not the first event: a `,]` is an error
    end = sp.events(part_end=not last)
    if last:
        tail, part.tail_offset, part.gaps = _tail(sp, end, 0)
        part.tail, part.total = tail, stream.offset
    return part


def _head(sp: _Splitter) -> tuple[bytes, int, str] | tuple[bytes, int]:
    """Read up to the events array: (head, its stream offset, layout), the splitter's buffer
    then starting with the array's ``[``; or (bytes read, offset) for an irregular document."""
    stream, buf, h0 = sp.stream, sp.buf, 0
    while True:
        layout, i = _scan_head(buf)
        if layout in ("array", "object"):
            break
        if layout == "irregular" or len(buf) > WHOLE_CAP:
            return bytes(buf), h0
        chunk = stream.read()
        if not chunk:
            return bytes(buf), h0
        if _NON_WS.search(buf) is None:
            h0 += len(buf)
            buf.clear()
        buf += chunk
    head = bytes(buf[:i])
    del buf[:i]
    sp.off = h0 + i
    sp.prefix = "$.traceEvents" if layout == "object" else "$"
    return head, h0, layout


def _tail(sp: _Splitter, end: int, head_len: int) -> tuple[bytes, int, list[tuple[int, int]]]:
    """The rest of the stream after the array's closing bracket at buf[end]."""
    tail_offset = sp.at(end) + 1
    tail = bytearray(sp.buf[end + 1:])
    del sp.buf[:]
    gaps: list[tuple[int, int]] = []
    while True:
        chunk = sp.stream.read()
        if not chunk:
            break
        if len(chunk) >= 4096 and _NON_WS.search(chunk) is None:  # white space: not held
            gaps.append((len(tail), len(chunk)))
        else:
            tail += chunk
        if len(tail) + head_len > WHOLE_CAP:
            raise TraceError(sp.source, f"more than {WHOLE_CAP} bytes outside the events "  # type: ignore[arg-type]
                             "array: not a trace")
    return bytes(tail), tail_offset, gaps


def read_whole(stream: TraceStream, prefix: bytes, offset: int,
               source: object) -> tuple[bytes, int]:
    """The rest of an irregular document after `prefix` (read from stream offset `offset`),
    leading white space dropped: ``(text, stream offset of its first byte)``. Reading stops
    early at a syntax error (the text then ends after it, so decoding it finds that error).

    Raises:
        TraceError: a document longer than `WHOLE_CAP` bytes with no syntax error in them.
    """
    buf = bytearray(prefix)
    while True:
        k = _skip(buf, 0)
        if k:
            offset += k
            del buf[:k]
        if buf:
            try:
                msgspec.json.decode(bytes(buf))
            except msgspec.DecodeError as exc:
                m = _BYTE.search(str(exc))
                if m and "trailing" not in str(exc) and int(m.group(1)) < len(buf) - 1:
                    return bytes(buf), offset
            except RecursionError:
                return bytes(buf), offset
        chunk = stream.read()
        if not chunk:
            return bytes(buf), offset
        if len(buf) + len(chunk) > WHOLE_CAP:
            raise TraceError(source, f"a trace of more than {WHOLE_CAP} bytes must be a JSON "  # type: ignore[arg-type]
                             "array of events or an object with one traceEvents array")
        buf += chunk
