"""The decisions JSONL (`decisions-rank<r>.jsonl`, docs/contracts.md): one object per policy
call, flushed per line, one file per rank of a service run. Both ways, in one place.

Schema: `DecisionRecord` (one line; its `snapshot` a `Snapshot`), msgspec structs. What
msgspec cannot say is checked beside it, here: `end_ns` not before `start_ns`, `kind`,
`outcome` and `reason` among the policy's values and agreeing with each other, and the line
agreeing with its file.
Names: `decisions_file(rank)`, `DECISIONS_GLOB`, `files_of` (a service run's files by rank).
Writing: `DecisionsWriter` (`residency.policy.cache.JsonlRecorder` writes through it; a record
that does not validate against `DecisionRecord` is refused before it is written).
Reading: `read_decisions` (a run's file, streamed, hashed while read, every line validated
against `DecisionRecord` and checked against its file), `read_records` (a file as written,
unchecked: the selftest's checks), `last_request_id` (the tail of a file still being written:
the terminal progress).

The values `kind`, `outcome` and `reason` may take belong to the policy
(`residency.policy.cache`); a reader is given them (`Expected.values`). Format history: one
layout since the first run; `request_id` null from the vLLM-Omni adapter.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from residency.records.files import (
    CHANGED_SINCE_VERIFIED,
    RunDirError,
    RunReading,
    loads,
    open_regular,
    printable,
    read_errors,
    small,
)
from residency.records.schema import Count, Finite, Int64, validate

__all__ = ["DECISIONS_GLOB", "MAX_DECISIONS_BYTES", "MAX_DECISION_LINE_BYTES",
           "SNAPSHOT_KEYS", "DecisionRecord", "DecisionsWriter", "Expected", "Snapshot",
           "decisions_file", "files_of", "last_request_id", "read_decisions", "read_records",
           "write_records"]

DECISIONS_GLOB = "decisions-rank*.jsonl"  # every rank's decisions file in a folder
_DECISIONS_NAME = re.compile(r"decisions-rank(0|[1-9][0-9]{0,5})\.jsonl")
# all decisions files of one service run together (a real 8-rank run of a thousand requests
# writes about 10 MB); parsed records take about ten times their bytes in memory
MAX_DECISIONS_BYTES = 32 * 1024 * 1024
MAX_DECISION_LINE_BYTES = 1024 * 1024


# --------------------------------------------------------------------------------- schema
class Snapshot(msgspec.Struct, forbid_unknown_fields=True):
    """The allocator's memory as the policy read it (bytes; a figure it could not read is
    null or absent)."""

    reserved: Count | None = None
    allocated: Count | None = None
    free: Count | None = None
    total: Count | None = None


SNAPSHOT_KEYS = Snapshot.__struct_fields__  # ("reserved", "allocated", "free", "total")


class DecisionRecord(msgspec.Struct):
    """One line of a decisions file: one policy call (docs/contracts.md). Open: a key the
    recorder's context adds beyond these is kept as written."""

    rank: Count
    kind: str
    outcome: str
    reason: str
    start_ns: Int64  # monotonic
    end_ns: Int64
    wall_ns: Count | None = None  # time.time_ns() at the start
    arm: str | None = None
    snapshot: Snapshot | None = None
    error: str | None = None
    max_cached_fraction: Finite | None = None
    min_free_fraction: Finite | None = None
    device_kind: str | None = None
    request_id: str | None = None


def decisions_file(rank: int) -> str:
    """The name of rank `rank`'s decisions JSONL file: `decisions-rank<rank>.jsonl`."""
    return f"decisions-rank{rank}.jsonl"


# ------------------------------------------------------------------------------------ writing
class DecisionsWriter:
    """Appends one JSON object per record to a decisions file, flushed per line (safe across
    threads); `close` flushes and fsyncs."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` as one compact JSON line (its keys in the order given) and flush.

        Raises:
            ValueError: `record` does not validate against `DecisionRecord` (naming the
                field); nothing is written.
        """
        try:
            msgspec.convert(record, DecisionRecord, strict=True)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{self.path}: a decision that does not validate: {exc}"
                             ) from None
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        """Flush, fsync and close (idempotent)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


# ------------------------------------------------------------------- reading, as written
def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of one decisions file as `DecisionsWriter` wrote them, in order (blank
    lines skipped; no validation: `read_decisions` checks a run's files against the
    schema)."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_records(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> Path:
    """Write `records` as a whole decisions file at `path`, one compact line each, replacing
    what was there (unchecked: e.g. an edited copy of a run's file)."""
    path = Path(path)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records),
                    encoding="utf-8")
    return path


def last_request_id(path: str | os.PathLike[str], *, tail_bytes: int = 4096) -> str | None:
    """The request of the last record that names one, read from the last `tail_bytes` of a
    decisions file still being written (None when there is none yet or it cannot be read;
    a partly written last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        with contextlib.suppress(ValueError):
            rid = json.loads(raw).get("request_id")
            if rid:
                return str(rid)
    return None


# ------------------------------------------------------------------ reading a run's files
@dataclass(frozen=True)
class Expected:
    """What a decisions file's lines must say of themselves: its rank (from the file name),
    the arm of its service run, the run's device kind (or that kind's torch device type,
    which the vLLM-Omni adapter records), and the values `kind`, `outcome` and `reason` may
    take (the policy's)."""

    rank: int
    arm: str
    device_kinds: tuple[str, ...]
    values: Mapping[str, tuple[str, ...]]


def files_of(run_dir: Path, *, ranks: Any, builtin: bool) -> list[tuple[int, Path]]:
    """(rank, path) of each decisions file of one service run, by rank.

    Raises:
        RunDirError: a file whose name is not `decisions-rank<r>.jsonl` for a rank of the run
            (0..`params.ranks`-1), or, for the built-in service (which creates every rank's
            file when it starts), some ranks' files without the others'. Warns (UserWarning)
            instead for an external service's missing file (its rank may never have loaded
            the adapter; the consecutive gate names the likely cause) and for a service run
            without any decisions file (recorded without decision logs: the evidence falls
            back to the service's per-rank response).
    """
    found: dict[int, Path] = {}
    for f in sorted(run_dir.glob(DECISIONS_GLOB)):
        m = _DECISIONS_NAME.fullmatch(f.name)
        if m is None:
            raise RunDirError(f, "is not a decisions file name: expected "
                              "decisions-rank<r>.jsonl with r a rank number")
        rank = int(m.group(1))
        if isinstance(ranks, int) and rank >= ranks:
            with read_errors(f), open_regular(f):
                pass  # a file that is no regular one is named as such first
            raise RunDirError(f, f"rank {rank} is not a rank of the run (params.ranks = "
                              f"{ranks}: ranks 0..{ranks - 1})")
        found[rank] = f
    if not isinstance(ranks, int) or len(found) == ranks:
        return sorted(found.items())
    # every found rank is < ranks, so the first missing ones lie below len(found) + 3
    missing = [r for r in range(min(ranks, len(found) + 3)) if r not in found]
    names = ", ".join(decisions_file(r) for r in missing) + (
        f" and {ranks - len(found) - len(missing)} more" if ranks - len(found) > len(missing)
        else "")
    if not found:
        warnings.warn(f"{run_dir}: no decisions file (params.ranks = {ranks}; the run was "
                      "recorded without decision logs?): per-rank figures come from the "
                      "service's response in client.json only", UserWarning, stacklevel=4)
    elif builtin:
        raise RunDirError(run_dir, f"{names} missing: the built-in service writes one "
                          f"decisions file per rank (params.ranks = {ranks}), so a rank's "
                          "decisions were lost")
    else:
        warnings.warn(f"{run_dir}: {names} missing (params.ranks = {ranks}): the external "
                      "service's rank wrote no decisions file (did its adapter load?); its "
                      "calls are not counted", UserWarning, stacklevel=4)
    return sorted(found.items())


def _decision(path: Path, lineno: int, rec: Any, expect: Expected) -> dict[str, Any]:
    """One decisions line validated against `DecisionRecord`, then checked where msgspec
    cannot (`end_ns` not before `start_ns`; `kind`, `outcome` and `reason` among the policy's
    values and agreeing with each other) and against its file (rank, arm, device kind); the
    line's object with its snapshot's figures at the top level, `duration_ns`, `warmup` and
    `file` added."""
    where = f"line {lineno}"
    if not isinstance(rec, dict):
        raise RunDirError(path, f"{where}: expected a JSON object, got "
                          f"{type(rec).__name__}")
    validate(path, rec, DecisionRecord, where=f"{where}: ")

    def bad(field: str, what: str) -> RunDirError:
        return RunDirError(path, f"{where}: {what}", field=field)

    if rec["end_ns"] < rec["start_ns"]:
        raise bad("end_ns", "end_ns is before start_ns")
    snap = rec.pop("snapshot", None) or {}
    for key in SNAPSHOT_KEYS:
        rec[key] = snap.get(key)
    for key, allowed in expect.values.items():
        if rec.get(key) not in allowed:
            raise bad(key, f"must be one of {list(allowed)}, got "
                      f"{printable(repr(rec.get(key)))}"[:300])
    if (rec["kind"] == "forced") != (rec["reason"] == "forced"):
        raise bad("reason", f"kind {rec['kind']!r} with reason {rec['reason']!r} (a forced "
                  "call has reason 'forced', and only a forced call has it)")
    if (rec["outcome"] == "retained") != (rec["reason"] == "within-bounds"):
        raise bad("outcome", f"outcome {rec['outcome']!r} with reason {rec['reason']!r} (a call "
                  "retains exactly when its reason is 'within-bounds')")
    if rec.get("rank") != expect.rank:
        raise bad("rank", f"rank {rec.get('rank')!r} in the file of rank {expect.rank}")
    if rec.get("arm") is not None and rec["arm"] != expect.arm:
        raise bad("arm", f"{printable(repr(rec['arm']))[:100]} in a run of arm "
                  f"{printable(repr(expect.arm))[:100]} (manifest runs[].arm)")
    if rec.get("device_kind") is not None and rec["device_kind"] not in expect.device_kinds:
        raise bad("device_kind", f"{printable(repr(rec['device_kind']))[:100]} in a run of "
                  f"device kind {expect.device_kinds[0]!r} (manifest device_kind; "
                  f"allowed: {list(expect.device_kinds)})")
    rec["duration_ns"] = rec["end_ns"] - rec["start_ns"]
    rec["warmup"] = str(rec.get("request_id") or "").startswith("warmup-")
    rec["file"] = path.name
    return rec


def read_decisions(path: Path, *, expect: Expected, sha256: str | None = None,
                   budget: list[int] | None = None,
                   reading: RunReading | None = None) -> list[dict[str, Any]]:
    """The records of one decisions file, streamed: lines split on "\\n" only (JSON text may
    hold U+2028), at most `MAX_DECISION_LINE_BYTES` a line, `budget[0]` bytes left for the
    whole service run (decremented), hashed while read and checked against `sha256`, each
    line checked against `expect` (`_decision`)."""
    digest = hashlib.sha256()
    rows: list[dict[str, Any]] = []
    pending = bytearray()
    lineno = 0

    def parse(raw: bytes) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RunDirError(path, f"line {lineno}: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start} of the line)") from None
        if line.strip():
            rows.append(_decision(path, lineno, loads(path, line, f"line {lineno}: "),
                                  expect))

    with contextlib.ExitStack() as stack:
        if reading is not None and (reading.kept(path) or small(path)):
            data = reading.read(path, sha256)  # the bytes verified, hashed when read
            sha256 = None
            chunks: Iterator[bytes] = (data[i:i + (1 << 20)]
                                       for i in range(0, len(data), 1 << 20))
        else:
            stack.enter_context(read_errors(path))
            fh = stack.enter_context(open_regular(path))
            chunks = iter(lambda: fh.read(1 << 20), b"")
        for chunk in chunks:
            digest.update(chunk)
            if budget is not None:
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise RunDirError(path, "the decisions files of this service run "
                                      f"exceed {MAX_DECISIONS_BYTES} bytes together")
            pending += chunk
            start = 0
            while (end := pending.find(b"\n", start)) >= 0:
                lineno += 1
                parse(bytes(pending[start:end]))
                start = end + 1
            del pending[:start]
            if len(pending) > MAX_DECISION_LINE_BYTES:
                raise RunDirError(path, f"line {lineno + 1}: longer than "
                                  f"{MAX_DECISION_LINE_BYTES} bytes")
    if pending:
        lineno += 1
        parse(bytes(pending))
    if sha256 is not None and digest.hexdigest() != sha256:
        raise RunDirError(path, CHANGED_SINCE_VERIFIED)
    return rows
