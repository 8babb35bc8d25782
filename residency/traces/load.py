"""Load profiler traces into per-rank timelines of int64-nanosecond intervals.

One entry point, `load_traces`, for both formats the brief names:

* Kineto JSON (`*.json`, `*.json.gz`, from torch.profiler and the emulated NPU). Device tasks:
  ``ph == "X"`` with category (case-insensitive) in `DEVICE_CATEGORIES`; host ranges: ``ph ==
  "X"`` with category in `HOST_CATEGORIES`. ``ts``/``dur`` are microseconds (number or decimal
  string); absolute ns = ``baseTimeNanoseconds`` + ts * 1000 when the trace has a base.
* torch-npu ``*_ascend_pt/`` directories: device tasks are the ``X`` events of the process
  named `ASCEND_DEVICE_PROCESS` in ``ASCEND_PROFILER_OUTPUT/trace_view.json``; host ranges
  are the ``X`` events of every other process except the derived `ASCEND_DERIVED_PROCESSES`.
  Each device task keeps its ``args["Task Type"]`` and each host range its lane (process
  name), as codes (`RankTimeline.device_task_type`, `range_task_type`, `range_lane`); the
  derived slices are set apart (`RankTimeline.overlap`). torch-npu layouts (sessions,
  vLLM-Omni groups, ranks, relative times) are `residency.traces.ascend`'s, its SQLite export
  `residency.traces.ascend_db`'s.

Which format a file holds is read from its content (`residency.traces.sniff`), the path being
only a hint: a ``trace_view.json`` copied anywhere is torch-npu's, an execution trace beside
Kineto files is skipped. Kineto's device categories per accelerator: `residency.traces.categories`.

Timestamps are parsed exactly: decimal text goes to int64 ns without passing through float64,
and float64 values are used only where they give the same nanosecond. An event whose ``ts``
is not a number, whose ``dur`` is missing or negative, or whose times lie 2**62 ns (146 years)
or more from the epoch is rejected: counted in `RankTimeline.rejected_events` and never used.

Files are streamed in chunks (`residency.traces.formats`): memory depends on the chunk size and
the number of events kept, not on the file size. Only regular files are read, none through a
link leaving the folder searched, each at most `MAX_TRACE_BYTES` on disk and decompressed
(`residency.traces.files`). Parsed files are cached in the user's cache directory, never beside
the traces, checked against the trace's content digest and their own (`residency.traces.cache`).
Parsing needs neither pandas nor pyarrow.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from residency.traces.ascend_text import (
    ASCEND_COMM_PROCESSES,
    ASCEND_DERIVED_PROCESSES,
    ASCEND_DEVICE_PROCESS,
)
from residency.traces.categories import DEVICE_CATEGORIES, HOST_CATEGORIES
from residency.traces.files import (
    CHUNK_BYTES,
    MAX_TRACE_BYTES,
    RANK_COMPONENT_RE,
    Sealed,
    TraceError,
    active_seal,
    check_regular,
    parts_digest,
    sealed_reads,
)
from residency.traces.formats import (
    NotAligned,
    Parsed,
    join_parts,
    parse_part,
    parse_trace,
    part_bounds,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ASCEND_COMM_PROCESSES", "ASCEND_DERIVED_PROCESSES", "ASCEND_DEVICE_PROCESS",
           "CACHE_DIR", "CHUNK_BYTES", "COMMUNICATION_LANE", "DEVICE_CATEGORIES",
           "HOST_CATEGORIES", "MAX_TRACE_BYTES", "RankTimeline", "TraceError", "TraceNote",
           "TraceSet", "load_traces"]

COMMUNICATION_LANE = "[Communication]"  # the task type `residency.traces.busy` gives their ranges

CACHE_DIR = "residency.parquet.cache"  # where versions before 0.2 cached: never read, skipped
PART_MIN_BYTES = 32 << 20  # a file is split into parts of at least this much
_EMPTY_CODES = np.empty(0, np.int16)


@dataclass(frozen=True, eq=False)
class RankTimeline:
    """One rank's device tasks and named host ranges, int64 ns, half-open ``[start, end)``.

    `device`: ``(n, 2)`` as recorded (sorted by start; overlaps and zero-length tasks kept).
    `ranges`: ``(m, 2)`` host ranges sorted by start; `range_names`: their names, an ``(m,)``
    object array of str.

    torch-npu only (Kineto: all -1, empty tables): `device_task_type` ``(n,)`` and
    `range_task_type` ``(m,)``: int16 codes into `task_types` of each event's
    ``args["Task Type"]`` (-1: none); `range_lane` ``(m,)``: codes into `lanes` of the range's
    process name (e.g. ``Communication``, ``CANN``, ``Python``; -1: none).
    `device_names` ``(n,)``: each device task's name (object array of str).
    `overlap` / `overlap_names`: the derived ``Overlap Analysis`` slices (``Computing``,
    ``Communication``, ``Communication(Not Overlapped)``, ``Free``); `session`: the torch-npu
    profiling session the rank was read from.
    """

    rank: int
    source: Path
    device: np.ndarray
    ranges: np.ndarray
    range_names: np.ndarray
    rejected_events: int
    device_task_type: np.ndarray = field(default_factory=lambda: _EMPTY_CODES)
    range_task_type: np.ndarray = field(default_factory=lambda: _EMPTY_CODES)
    range_lane: np.ndarray = field(default_factory=lambda: _EMPTY_CODES)
    task_types: tuple[str, ...] = ()
    lanes: tuple[str, ...] = ()
    overlap: np.ndarray = field(default_factory=lambda: np.empty((0, 2), np.int64))
    overlap_names: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    session: str | None = None
    device_names: np.ndarray = field(default_factory=lambda: np.empty(0, object))

    @property
    def device_types(self) -> np.ndarray:
        """Each device task's type as str (``""``: none; Kineto: ``""`` for every task)."""
        return np.array([*self.task_types, ""], object)[self.device_task_type]

    def lane_mask(self, lanes: frozenset[str]) -> np.ndarray:
        """Which host ranges lie on one of `lanes` (process names; torch-npu only)."""
        codes = [i for i, name in enumerate(self.lanes) if name in lanes]
        return np.isin(self.range_lane, codes) if codes else np.zeros(len(self.ranges), bool)

    def __post_init__(self) -> None:
        if len(self.device_names) != len(self.device):  # built without them: unnamed
            # one "" seen n times (read-only, no memory per task: parses for `idle` have none)
            names = np.broadcast_to(np.array("", object), (len(self.device),))
            object.__setattr__(self, "device_names", names)
        for name, n in (("device_task_type", len(self.device)),
                        ("range_task_type", len(self.ranges)), ("range_lane", len(self.ranges))):
            if len(getattr(self, name)) != n:
                if len(getattr(self, name)):
                    raise ValueError(f"{name} has {len(getattr(self, name))} rows, not {n}")
                codes = np.full(n, -1, np.int16)
                codes.setflags(write=False)
                object.__setattr__(self, name, codes)

    @property
    def device_tasks(self) -> int:
        """Number of device tasks."""
        return len(self.device)

    def ranges_frame(self) -> pd.DataFrame:
        """The host ranges as a DataFrame: ``name`` (categorical), ``start_ns``, ``end_ns``."""
        import pandas as pd

        return pd.DataFrame({"name": pd.Categorical(self.range_names.tolist()),
                             "start_ns": self.ranges[:, 0], "end_ns": self.ranges[:, 1]})


@dataclass(frozen=True, eq=False)
class TraceSet:
    """The ranks of one profiled run, in one format."""

    format: Literal["kineto", "ascend"]
    ranks: dict[int, RankTimeline]
    # the seal the traces were read under (a sealed run's): what reads their files again
    # (memory records, torch-npu's own CSVs) reads under it too
    seal: Sealed | None = None

    @property
    def rejected_events(self) -> int:
        """Events rejected over all ranks."""
        return sum(t.rejected_events for t in self.ranks.values())


def load_traces(path: str | os.PathLike[str], *, cache: bool = True,
                workers: int | None = None, chunk_bytes: int = CHUNK_BYTES,
                max_trace_bytes: int = MAX_TRACE_BYTES, session: str | None = None,
                group: str | None = None, seal: Sealed | None = None) -> TraceSet:
    """Load every rank's trace under `path`.

    `path` is a trace file, a directory of rank traces of one format (searched recursively:
    ``rank<N>/`` folders, ``*_ascend_pt`` sessions, ``ASCEND_PROFILER_OUTPUT`` itself, loose
    ``trace_view.json`` or database exports, vLLM-Omni's group folders), or a run directory
    whose ``trace/`` subdirectory holds them. Each file's format is decided from its content
    (`residency.traces.sniff`); files that are not traces are skipped with a `TraceNote`. A lone
    trace that records no rank is rank 0 (with a `TraceNote`). A Kineto file's rank is its
    ``distributedInfo.rank``, else the deepest path component below `path` named exactly
    ``[<group>_]rank<N>`` (``rank3.trace.json``, ``diffusion_rank3/``), never a host name
    that contains ``rank<N>`` (``gpu-rank7-a_123.pt.trace.json`` names no rank); a
    torch-npu directory's rank is in its ``profiler_info_<rank>.json``, else a ``rank<N>``
    folder below `path` (vLLM-Omni writes ``diffusion_rank<N>/``), never the directory's own
    name (a host name). Several sessions of a rank are chosen with `session`, vLLM-Omni groups
    (``diffusion_rank<N>/``, ``stage<K>_rank<N>/``, in either format) with `group`
    (`residency.traces.ascend.choose_sessions`). Files are parsed in `workers` processes
    (default: one per CPU when the traces are large), each streamed in chunks of
    `chunk_bytes`. With `cache`, parsed files are read from and written to the user's cache
    directory (`residency.traces.cache`; never beside the traces); an entry that cannot be
    used, or does not match the trace or its own digest, is ignored and rewritten. With
    `seal` (a sealed run's artifact list), every file read under its root must be sealed and
    is checked against its sha256 as it is read (`residency.traces.files.sealed_reads`).

    Raises:
        TraceError: nothing to load (the skipped files listed; a torch-npu session of CSV
            summaries only: not supported), both formats under `path`, a trace that is not a regular
            file (FIFO, device, socket), a link leaving `path`, a file larger than
            `max_trace_bytes` on disk or decompressed, unreadable or invalid JSON (with the
            byte position in the decompressed stream where known), a rank that cannot be told
            or appears twice, several sessions or groups and no choice among them, relative
            torch-npu times on several ranks, or ranks whose time ranges do not overlap.
            A `session` for Kineto traces (they have no sessions to choose).

    Warns:
        UserWarning: a rank without device tasks (its busy time is zero); a recorded rank
            that contradicts the ``rank<N>`` folder it lies in (the recorded one is used).
        TraceNote: a file skipped as not a trace; a lone trace read as rank 0.
    """
    with sealed_reads(seal):
        plan = plan_traces(path, session=session, group=group)
        parsed = _parse_all(plan.format, plan.sources, cache=cache, workers=workers,
                            root=plan.parse_root, chunk_bytes=chunk_bytes,
                            max_bytes=max_trace_bytes)
        if plan.format == "ascend":
            from residency.traces import ascend

            parsed = ascend.align_clocks(plan.sources, parsed)
    timelines = [rank_timeline(plan, i, p) for i, p in enumerate(parsed)]
    settle_ranks(plan, [t.rank if t is not None else None for t in timelines])
    ranks = {t.rank: t for t in timelines if t is not None}
    check_spans(plan.root, {r: (t.source, timeline_span(t)) for r, t in ranks.items()})
    check_world(plan.root, {t.rank: p.world_size for t, p in zip(timelines, parsed,
                                                                strict=True) if t is not None})
    for t in ranks.values():
        if not len(t.device):
            warnings.warn(no_device_tasks(t.rank, t.source), UserWarning, stacklevel=2)
    return TraceSet(plan.format, dict(sorted(ranks.items())), seal)


@dataclass(frozen=True)
class TracePlan:
    """What `load_traces` reads under `root`: per rank, the `items` found (a Kineto file, a
    torch-npu session directory), the `sources` parsed (the file itself, ``trace_view.json``
    or the SQLite export), the rank already `known` from the layout (torch-npu) and the
    torch-npu `sessions`; `parse_root` is the folder every source must resolve inside."""

    root: Path
    format: Literal["kineto", "ascend"]
    items: tuple[Path, ...]
    sources: tuple[Path, ...]
    known: tuple[int | None, ...]
    sessions: tuple[str | None, ...]
    parse_root: Path | None


def plan_traces(path: str | os.PathLike[str], *, session: str | None = None,
                group: str | None = None) -> TracePlan:
    """The traces `load_traces` reads under `path` (discovery only; raises as it does)."""
    root = Path(path)
    found = _discover(root)
    fmt, items = found.fmt, found.items
    for f, why in found.skipped:
        warnings.warn(f"skipped {f}: {why}", TraceNote, stacklevel=2)
    known: list[int | None] = [None] * len(items)
    sessions: list[str | None] = [None] * len(items)
    if fmt == "ascend":
        from residency.traces import ascend

        chosen = ascend.choose_sessions(root, items, session=session, group=group)
        items = [c.directory for c in chosen]
        sources = [c.source for c in chosen]
        known = [c.rank for c in chosen]
        sessions = [c.session for c in chosen]
    else:
        if session is not None:  # (was ignored: a typo went unnoticed)
            raise TraceError(root, "holds Kineto traces, which have no profiling sessions: "
                             "--session (session= in the API) chooses among torch-npu ones; "
                             "drop it")
        items = _choose_kineto_group(root, items, group)
        sources = list(items)
        known, sessions = [None] * len(items), [None] * len(items)
    return TracePlan(root, fmt, tuple(items), tuple(sources), tuple(known), tuple(sessions),
                     None if fmt == "kineto" and not root.is_dir() else root)


def rank_of(plan: TracePlan, i: int, content_rank: int | None, *, warn: bool = True
            ) -> int | None:
    """The rank of `plan`'s item `i` given the rank its content names (Kineto
    ``distributedInfo.rank``, a database's ``RANK_DEVICE_MAP``); None when it cannot be told.
    A lone trace that names no rank is rank 0.

    Warns:
        UserWarning: a Kineto file's recorded rank contradicts the ``rank<N>`` in its path
            (the recorded one is used).
        TraceNote: a lone trace read as rank 0.
    """
    item = plan.items[i]
    if plan.format == "kineto":
        named = _rank_from_path(item, plan.root)
        if warn and content_rank is not None and named is not None and content_rank != named:
            warnings.warn(f"{item}: distributedInfo.rank is {content_rank} but its path names "
                          f"rank {named}; rank {content_rank} is used", UserWarning,
                          stacklevel=3)
        rank = content_rank if content_rank is not None else named
    else:
        rank = plan.known[i] if plan.known[i] is not None else content_rank
    if rank is None and len(plan.items) == 1:
        if warn:
            warnings.warn(f"{item} records no rank ({_NO_RANK[plan.format]}); read as rank 0, the "
                          "only trace", TraceNote, stacklevel=3)
        rank = 0
    return rank


def rank_timeline(plan: TracePlan, i: int, p: Parsed) -> RankTimeline | None:
    """The timeline of `plan`'s item `i` from its parse; None when its rank cannot be told."""
    rank = rank_of(plan, i, p.rank)
    return None if rank is None else timeline_of(p, rank, plan.sources[i], plan.sessions[i])


def timeline_of(p: Parsed, rank: int, source: Path, session: str | None) -> RankTimeline:
    """The timeline of one parse: derived torch-npu slices set apart, arrays read-only."""
    derived = np.isin(p.range_lane, [k for k, n in enumerate(p.lanes)
                                     if n in ASCEND_DERIVED_PROCESSES])
    if derived.any():
        host = ~derived
        arrays = (p.device, p.ranges[host], p.names[host], p.device_task_type,
                  p.range_task_type[host], p.range_lane[host], p.ranges[derived],
                  p.names[derived])
    else:  # (the parse's own arrays: no copy of every host range, 260 MB for 10M of them)
        arrays = (p.device, p.ranges, p.names, p.device_task_type, p.range_task_type,
                  p.range_lane, p.ranges[:0], p.names[:0])
    for a in arrays:
        a.setflags(write=False)
    names = p.device_names if p.device_names is not None else np.empty(0, object)
    names.setflags(write=False)
    return RankTimeline(rank, source, *arrays[:3], p.rejected, *arrays[3:6],
                        p.task_types, p.lanes, *arrays[6:], session, names)


def settle_ranks(plan: TracePlan, ranks: list[int | None]) -> None:
    """Refuse a rank that appears twice or items whose rank cannot be told (None).

    Raises:
        TraceError: naming the items.
    """
    origin: dict[int, Path] = {}
    unknown = []
    for item, rank in zip(plan.items, ranks, strict=True):
        if rank is None:
            unknown.append(item)
            continue
        if rank in origin:
            raise TraceError(item, f"rank {rank} appears twice: in {origin[rank]} and in {item}")
        origin[rank] = item
    if unknown:
        listed = ", ".join(str(u) for u in unknown)
        raise TraceError(plan.root, f"cannot tell the rank of {listed} "
                         f"({_NO_RANK[plan.format]}; one trace alone is read as rank 0, "
                         "several need their ranks)")


def no_device_tasks(rank: int, source: Path) -> str:
    """The warning about a rank without device tasks."""
    return f"rank {rank} ({source}) has no device tasks; its busy time is 0"


# -- discovery -------------------------------------------------------------------------------

_NO_RANK = {"kineto": "no distributedInfo.rank and no path component named "
                      "[<group>_]rank<N> below the given path",
            "ascend": "no profiler_info_<rank>.json, no ascend_pytorch_profiler_<rank>.db and "
                      "no rank<N> folder below the given path"}

_CANDIDATE_SUFFIXES = (".json", ".json.gz", ".db")


class TraceNote(UserWarning):
    """Something the loader decided that the user should know: a file skipped as not a trace,
    a rank given to a file that names none."""


@dataclass(frozen=True)
class _Found:
    fmt: Literal["kineto", "ascend"]
    items: list[Path]
    skipped: list[tuple[Path, str]]


def _discover(path: Path) -> _Found:
    """The traces under `path`, each file's format decided from its content
    (`residency.traces.sniff`); files that are not traces are listed as skipped."""
    from residency.traces.sniff import sniff

    if not os.path.lexists(path):
        raise TraceError(path, "no such file or directory")
    if not path.is_dir():  # a file (or a FIFO, device...: refused when opened)
        kind = sniff(path)
        if kind.kind == "skip":
            raise TraceError(path, f"not a trace: {kind.reason}")
        return _Found("kineto" if kind.kind == "kineto" else "ascend", [path], [])
    root = path / "trace" if (path / "trace").is_dir() else path
    if root.name.endswith("_ascend_pt"):
        return _Found("ascend", [root], [])
    candidates: list[Path] = []
    ascend: list[Path] = []
    runs: list[Path] = []  # trace/ folders of run directories below PATH
    summaries: list[Path] = []  # folders of torch-npu CSV summaries without a timeline
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]  # hidden: never a trace
        files = [f for f in files if not f.startswith(".")]
        ascend += [Path(d, x) for x in dirs if x.endswith("_ascend_pt")]
        runs += [Path(d, x) for x in dirs if x == "trace"]
        dirs[:] = sorted(x for x in dirs if not x.endswith("_ascend_pt") and x != CACHE_DIR)
        candidates += [Path(d, f) for f in sorted(files) if f.endswith(_CANDIDATE_SUFFIXES)]
        if "kernel_details.csv" in files:
            summaries.append(Path(d))
    if len(runs) > 1:
        listed = ", ".join(str(r.parent.relative_to(root)) for r in sorted(runs)[:4])
        raise TraceError(root, f"holds the traces of {len(runs)} runs ({listed}"
                         f"{', ...' if len(runs) > 4 else ''}); point PATH at one of them")
    if runs:
        return _discover(runs[0].parent)
    kineto: list[Path] = []
    exports: dict[Path, list[Path]] = {}  # folder -> its torch-npu export files
    skipped: list[tuple[Path, str]] = []
    for f in candidates:
        kind = sniff(f, root=root)
        if kind.kind == "kineto":
            kineto.append(f)
        elif kind.kind == "skip":
            skipped.append((f, kind.reason))
        else:
            exports.setdefault(f.parent, []).append(f)
    for folder, files in exports.items():
        if len(files) > 1:  # a text export and a database beside it: the text is read
            text = [f for f in files if not f.name.endswith(".db")]
            keep = text if len(text) == 1 else files
            skipped += [(f, f"a torch-npu export beside {keep[0].name}, which is read")
                        for f in files if f not in keep]
            exports[folder] = keep
        ascend += exports[folder]
    if kineto and ascend:
        raise TraceError(root, f"holds both Kineto files ({kineto[0].name}, ...) and torch-npu "
                         f"traces ({ascend[0].name}, ...); point PATH at one format")
    if not (kineto or ascend):
        from residency.traces.ascend import SUMMARIES_ONLY

        if summaries:
            raise TraceError(summaries[0], SUMMARIES_ONLY)
        listed = "; ".join(f"{f}: {why}" for f, why in skipped[:6])
        raise TraceError(root, "no traces found: expected Kineto *.json / *.json.gz files or "
                         "torch-npu *_ascend_pt directories, trace_view.json or "
                         "ascend_pytorch_profiler_<rank>.db"
                         + (f" (skipped: {listed}{'; ...' if len(skipped) > 6 else ''})"
                            if skipped else ""))
    return (_Found("kineto", sorted(kineto), skipped) if kineto
            else _Found("ascend", sorted(ascend), skipped))


def _kineto_group(p: Path, root: Path) -> str:
    """The vLLM-Omni process group of a Kineto file: the ``<group>`` of the deepest folder
    below `root` named ``<group>_rank<N>`` (``diffusion_rank0/``, ``stage1_rank0/``); ""
    when no folder names one."""
    try:
        parts = p.relative_to(root).parts[:-1]
    except ValueError:
        return ""
    for part in reversed(parts):
        if m := RANK_COMPONENT_RE.fullmatch(part):
            return m.group("group") or ""
    return ""


def _choose_kineto_group(root: Path, files: list[Path], group: str | None) -> list[Path]:
    """The files of one process group: those of `group` when given, else all of them as long
    as at most one named group is present (files in no ``<group>_rank<N>/`` folder belong to
    none and never make a choice necessary).

    Raises:
        TraceError: an unknown `group`, or several named groups and no `group`; both list
            them.
    """
    by_group: dict[str, list[Path]] = {}
    for f in files:
        by_group.setdefault(_kineto_group(f, root) if root.is_dir() else "", []).append(f)
    if group is not None:
        if group not in by_group:
            raise TraceError(root, f"no group {group!r}; the groups are: "
                             f"{', '.join(repr(g) for g in sorted(by_group))}")
        return by_group[group]
    if len([g for g in by_group if g]) > 1:
        listed = ", ".join(f"{g!r} ({len(v)} files)" for g, v in sorted(by_group.items()))
        raise TraceError(root, f"holds the traces of several process groups: {listed}; "
                         "choose one with --group NAME (group= in the API)")
    return files


def _rank_from_path(p: Path, root: Path) -> int | None:
    """The rank named by the deepest path component of `p` below `root` that is exactly
    ``[<group>_]rank<N>`` (a folder, or a file name before its first dot: ``rank3.trace.json``,
    ``trace_rank3.json.gz``, ``diffusion_rank3/``). A name that merely contains ``rank<N>``
    (Kineto's default ``<host>_<pid>.<time>.pt.trace.json`` with a host ``gpu-rank7-a``) names
    no rank."""
    try:
        parts = p.relative_to(root).parts
    except ValueError:
        parts = (p.name,)
    parts = parts or (p.name,)
    for i, part in enumerate(reversed(parts)):
        name = part.split(".", 1)[0] if i == 0 and p.is_file() else part
        if m := RANK_COMPONENT_RE.fullmatch(name):
            return int(m.group("rank"))
    return None


def timeline_span(t: RankTimeline) -> tuple[int, int] | None:
    """Earliest start and latest end over a rank's device tasks and host ranges."""
    lo = [int(a.min()) for a in (t.device[:, 0], t.ranges[:, 0]) if len(a)]
    hi = [int(a.max()) for a in (t.device[:, 1], t.ranges[:, 1]) if len(a)]
    return (min(lo), max(hi)) if lo else None


def check_world(root: Path, worlds: dict[int, int | None]) -> None:
    """Warn where the ranks read (rank -> the ``distributedInfo.world_size`` its trace names)
    are not the whole job their traces name: all-rank figures then cover those ranks only."""
    said = sorted({w for w in worlds.values() if w is not None})
    if not said:
        return
    if len(said) > 1:
        warnings.warn(f"{root}: the traces name different world sizes "
                      f"(distributedInfo.world_size {', '.join(map(str, said))}): are they of "
                      "one job?", UserWarning, stacklevel=3)
        return
    (world,) = said
    read = set(worlds)
    inside = sum(1 for r in read if 0 <= r < world)  # (never a set of `world` ranks: untrusted)
    if inside != len(read) or inside != world:
        missing = world - inside
        warnings.warn(f"{root}: distributedInfo.world_size is {world} but {len(read)} "
                      f"rank(s) were read ({rank_list(read)}; {missing} of ranks 0-{world - 1} "
                      "missing): all-rank figures cover the ranks read only", UserWarning,
                      stacklevel=3)


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks as short text, runs of consecutive ranks as ``a-b``: ``0-3, 7``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_spans(root: Path, spans: dict[int, tuple[Path, tuple[int, int] | None]]) -> None:
    """Refuse ranks (rank -> source, `timeline_span`) whose time ranges do not overlap.

    Raises:
        TraceError: naming every rank's span.
    """
    known = {r: (src, s) for r, (src, s) in spans.items() if s is not None}
    if len(known) > 1 and max(s[0] for _, s in known.values()) >= min(
            s[1] for _, s in known.values()):
        listed = "; ".join(f"rank {r} ({src}) [{s}, {e}) ns"
                           for r, (src, (s, e)) in sorted(known.items()))
        raise TraceError(root, "the ranks' time ranges do not overlap, so they cannot be one "
                         f"run on one clock: {listed}")


# -- parsing, one file per call (in a worker process when parallel) --------------------------

def parse_files(fmt: str, sources: list[Path], *, workers: int | None, root: Path | None,
                chunk_bytes: int = CHUNK_BYTES, max_bytes: int = MAX_TRACE_BYTES,
                digest: bool = False, device_names: bool = True) -> list[Parsed]:
    """Parse `sources` (no cache), in worker processes when that pays (as `load_traces`);
    with `digest`, each parse records the file's content digest; without `device_names`,
    Kineto device tasks are left unnamed."""
    return _parse_all(fmt, sources, cache=False, workers=workers, root=root,
                      chunk_bytes=chunk_bytes, max_bytes=max_bytes, digest=digest,
                      device_names=device_names)


def _parse_all(fmt: str, sources: list[Path], *, cache: bool, workers: int | None,
               root: Path | None, chunk_bytes: int, max_bytes: int,
               digest: bool = False, device_names: bool = True) -> list[Parsed]:
    """Cached parses first, then the rest, in worker processes when that pays. Each worker
    streams one file at a time, so memory grows with the workers, not the file sizes."""
    stats = [open_stat(s, root, max_bytes) for s in sources]
    found: list[Parsed | None] = [None] * len(sources)
    from residency.traces import cache as tracecache

    cache = cache and tracecache.enabled(root)
    seal = active_seal()
    if cache:
        from residency.traces.parallel import map_threads

        def cached(i: int) -> Parsed | None:
            with sealed_reads(seal):  # (a thread starts outside the caller's seal)
                return tracecache.get_parsed(sources[i], stats[i], root=root,
                                             max_trace_bytes=max_bytes)

        # hashing each trace (to check its entry) runs in threads (the hash releases the GIL)
        found = map_threads(cached, range(len(sources)))
    todo = [i for i, f in enumerate(found) if f is None]
    job = dict(root=root, chunk_bytes=chunk_bytes, max_bytes=max_bytes, digest=cache or digest,
               device_names=device_names)
    from residency.traces.parallel import PARALLEL_MIN_BYTES, usable_cpus

    n = workers if workers is not None else usable_cpus()
    small = sum(stats[i].st_size for i in todo) < PARALLEL_MIN_BYTES
    parts = {} if n <= 1 or (workers is None and small) else _plan_parts(
        sources, [stats[i].st_size for i in range(len(sources))], todo, n)
    jobs = len(todo) + sum(len(b) - 1 for b in parts.values())
    if n <= 1 or jobs <= 1 or (workers is None and small):
        parsed = [_parse_one(fmt, sources[i], **job) for i in todo]  # type: ignore[arg-type]
    else:
        parsed = _parse_pool(fmt, sources, stats, todo, parts, min(n, jobs), job)
    for i, p in zip(todo, parsed, strict=True):
        found[i] = p
        if cache:
            tracecache.put_parsed(sources[i], stats[i], p, root=root)
    return found  # type: ignore[return-value]


def _plan_parts(sources: list[Path], sizes: list[int], todo: list[int],
                n: int) -> dict[int, list[tuple[int, int]]]:
    """Byte ranges for the plain files worth parsing in parts: when there are fewer files
    than workers, each large one is split so that every worker has work. Never under a seal
    (a sealed file's sha256 is checked over the whole file as it is parsed)."""
    if len(todo) >= n or active_seal() is not None:
        return {}
    out = {}
    for i in todo:
        k = min(n // len(todo), sizes[i] // PART_MIN_BYTES)
        if k > 1 and not sources[i].name.endswith((".gz", ".db")) and not _is_sqlite(sources[i]):
            bounds = part_bounds(sources[i], sizes[i], k)
            if len(bounds) > 1:
                out[i] = bounds
    return out


def _parse_pool(fmt: str, sources: list[Path], stats: list[os.stat_result], todo: list[int],
                parts: dict[int, list[tuple[int, int]]], n: int, job: dict) -> list[Parsed]:
    """Parse files (and parts of files) in `n` worker processes (`parallel.map_in_order`):
    each file's parts are joined as soon as they are parsed, in file order; a file whose parts
    do not join is parsed again whole here (its exact error, if any); the error raised is the
    first failing file's."""
    import tempfile

    from residency.traces.parallel import map_in_order  # (here: small traces start faster)

    with tempfile.TemporaryDirectory(prefix="residency-traces-") as folder:
        seal = active_seal()
        calls = [[(parse_part, (fmt, sources[i], a, b),
                   dict(first=k == 0, last=k == len(parts[i]) - 1, **job))
                  for k, (a, b) in enumerate(parts[i])] if i in parts else
                 [(_parse_to_disk, (fmt, sources[i], job, folder, seal), {})] for i in todo]

        def joined(k: int, got: list[Any] | Exception) -> Parsed:
            i = todo[k]
            if i not in parts:
                if isinstance(got, Exception):
                    raise got
                return _from_disk(*got[0])
            try:
                if isinstance(got, Exception):
                    raise got
                p = join_parts(sources[i], got)
            except (NotAligned, TraceError):  # parse it whole: the exact error, if any
                return parse_trace(fmt, sources[i], **job)
            if job["digest"]:  # of exactly the bytes the parts parsed, as they read them
                p.digest = parts_digest([(a, b, g[2]) for (a, b), g in
                                         zip(parts[i], got, strict=True)])
            return p

        # largest first: the last job to finish is a small one
        return map_in_order(calls, joined, workers=n,
                            submit_order=sorted(range(len(todo)),
                                                key=lambda k: -stats[todo[k]].st_size))


_COLUMNS = ("device", "ranges", "device_task_type", "range_task_type", "range_lane")


def parse_source(fmt: str, source: Path, **job: Any) -> Parsed:
    """`parse_trace` (keywords as it takes them), or `residency.traces.ascend_db.read_db` for
    torch-npu's SQLite export (of the keywords: `digest`, `device_names`, `keep_host`, and
    `fold_classes` and `classify`, its `fold` and `classify`, which other formats ignore)."""
    return _parse_one(fmt, source, **job)


def _parse_one(fmt: str, source: Path, **job: Any) -> Parsed:
    """`parse_trace`, or `residency.traces.ascend_db.read_db` for torch-npu's SQLite export."""
    if is_database(source):
        from residency.traces.ascend_db import read_db

        return read_db(source, digest=bool(job.get("digest")),
                       device_names=bool(job.get("device_names", True)),
                       keep_host=job.get("keep_host"), fold=job.get("fold_classes"),
                       classify=job.get("classify"))
    job = {k: v for k, v in job.items() if k not in ("fold_classes", "classify")}  # (databases)
    if fmt != "kineto":  # (the device rows of torch-npu's text export are known at its end)
        job = {k: v for k, v in job.items() if k != "fold_device"}
    return parse_trace(fmt, source, **job)


def is_database(source: Path) -> bool:
    """Whether `source` is read as torch-npu's SQLite export (`parse_source`): a ``.db`` file,
    or one that starts with SQLite's header; never read in parts."""
    return source.suffix == ".db" or _is_sqlite(source)


def _is_sqlite(source: Path) -> bool:
    """Whether `source` starts with SQLite's header (torch-npu's database under any name)."""
    from residency.traces.sniff import SQLITE_HEADER

    try:
        with open(source, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False  # the parse names the problem


def _parse_to_disk(fmt: str, source: Path, job: dict, folder: str,
                   seal: Sealed | None = None) -> tuple[Parsed, str]:
    """`parse_trace` in a worker (under the caller's `seal`): the columns go back through a
    file in `folder` (read by `_from_disk`), not a pickle, so neither side holds them twice."""
    with sealed_reads(seal):
        p = _parse_one(fmt, source, **job)
    path = os.path.join(folder, f"{os.getpid()}-{source.name}-{id(p)}.npy")
    with open(path, "wb") as f:
        for name in _COLUMNS:
            np.save(f, getattr(p, name), allow_pickle=False)
            setattr(p, name, None)
    return p, path


def _from_disk(p: Parsed, path: str) -> Parsed:
    with open(path, "rb") as f:
        for name in _COLUMNS:
            setattr(p, name, np.load(f, allow_pickle=False))
    os.unlink(path)
    return p


def open_stat(source: Path, root: Path | None, max_bytes: int) -> os.stat_result:
    """The status of `source`, after `open_regular`'s checks (regular, inside root, size)."""
    return check_regular(source, root=root, max_bytes=max_bytes)
