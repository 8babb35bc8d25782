"""torch-npu profiles: which directories form one run, their ranks and clocks (the database
export's format is `residency.traces.ascend_db`, the text export's `residency.traces.ascend_text`).

Layouts read (torch-npu 2.x, ``tensorboard_trace_handler`` / ``ExportType``; vLLM-Omni):

* ``{worker or host}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt/`` per rank and profiling session;
  ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (text export) or
  ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{rank}.db`` (``ExportType.Db``, SQLite).
* Several sessions of one rank (repeated start/stop) are listed; `choose_sessions` picks one per
  rank by ``latest``, an index ``N`` (0 = earliest) or an ISO time prefix of the session start
  (the directory name's timestamp), and refuses to guess.
* vLLM-Omni writes ``<dir>/diffusion_rank<N>/...`` and ``<dir>/stage<K>_rank<N>/...``: the text
  before ``rank<N>`` names a *group* (``diffusion``, ``stage0``); ranks of different groups are
  different processes, so one group is analysed at a time.
* Rank: ``profiler_info_<rank>.json``, else ``ascend_pytorch_profiler_<rank>.db``, else a
  ``[<group>_]rank<N>`` folder *below* the given root, never the ``*_ascend_pt`` directory's
  own name (it starts with the host name: ``gpu-rank7-a_...`` is not rank 7) nor a folder
  named after a host (``gpu-rank7/``: host names have no ``_``). A plain
  ``profiler_info.json`` (written without torch.distributed) records no rank: a lone session
  without a rank folder is read as rank 0, as any lone trace.
* Times: torch-npu writes absolute epoch microseconds. Ascend/pytorch PR #156 (open) would
  write them as numbers relative to the trace's own start (its ``_normalize_timestamps``),
  recording no offset; `align_clocks` detects times that cannot be epoch microseconds and
  refuses to put two such ranks on one time line (a lone rank is analysed, with a warning).
  The collection times in ``profiler_info_<rank>.json`` are not the reference the PR
  subtracts, so using them would misalign ranks silently.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from residency.traces.ascend_db import DB_GLOB, DB_RE
from residency.traces.files import RANK_COMPONENT_RE, TraceError

__all__ = ["AscendSession", "RELATIVE_LIMIT_NS", "SUMMARIES_ONLY", "StepCheck", "align_clocks",
           "choose_sessions", "find_sessions", "read_kernel_details", "read_step_trace",
           "step_checks", "summaries_only"]

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
KERNEL_DETAILS = "kernel_details.csv"
STEP_TRACE = "step_trace_time.csv"
_DIR_RE = re.compile(r"^(?P<worker>.+)_(?P<pid>\d+)_(?P<time>\d{17})_ascend_pt$")
_INFO_RE = re.compile(r"profiler_info_(\d+)\.json")
# "[<group>_]rank<N>": "_" never occurs in host names (RFC 1123), so a folder named after a host
# ("gpu-rank7", "node.rank7") is no rank folder
RELATIVE_LIMIT_NS = 10**17  # 1e17 ns after the epoch is in 1973: earlier, not epoch times


@dataclass(frozen=True)
class AscendSession:
    """One ``*_ascend_pt`` directory: its rank, vLLM-Omni group and session start."""

    directory: Path
    source: Path  # trace_view.json, or the SQLite export when there is no text export
    rank: int | None
    group: str  # "" outside vLLM-Omni's <group>_rank<N>/ folders
    started: dt.datetime | None  # from the directory name, local time of the profiled host

    @property
    def session(self) -> str:
        """The session's label: its start as ISO text (ms), else the directory name."""
        if self.started is None:
            return self.directory.name
        return self.started.isoformat(timespec="milliseconds")


def find_sessions(root: Path, directories: list[Path]) -> list[AscendSession]:
    """Describe every ``*_ascend_pt`` directory found below `root`, and every torch-npu export
    file found outside one (a ``trace_view.json`` or ``ascend_pytorch_profiler_<rank>.db``
    in ``ASCEND_PROFILER_OUTPUT/`` given as the path, a loose ``rank0/trace_view.json``).

    Raises:
        TraceError: a directory with neither a text nor a database export (one with only
            ``kernel_details.csv`` and other summaries: not supported), or with more than one
            ``profiler_info_<rank>.json``.

    Warns:
        UserWarning: a ``profiler_info_<rank>.json`` (or database) rank that contradicts the
            ``rank<N>`` folder it lies in (the profiler's own rank is used).
    """
    found = []
    for d in directories:
        if d.is_dir():
            session, source = d, _source(d)
        elif d.parent.name == OUTPUT_DIR and d.parent.parent.name.endswith("_ascend_pt"):
            session, source = d.parent.parent, d  # the export of a session: its directory
        else:
            session, source = d, d  # a loose export file stands for itself
        m = _DIR_RE.match(session.name)
        started = None
        if m:
            try:
                started = dt.datetime.strptime(m.group("time") + "000", "%Y%m%d%H%M%S%f")
            except ValueError:
                started = None
        # profiler_info_<rank>.json lies in the session directory (for a loose export: beside
        # it, or above its ASCEND_PROFILER_OUTPUT folder)
        info = session if session.is_dir() else session.parent
        info = info.parent if info.name == OUTPUT_DIR else info
        rank = _info_rank(info)
        if rank is None and (db := DB_RE.fullmatch(source.name)):
            rank = int(db.group(1))
        group, path_rank = _path_rank(d, root)
        if rank is not None and path_rank is not None and rank != path_rank:
            warnings.warn(f"{d}: the profiler recorded rank {rank} but it lies in a rank"
                          f"{path_rank} folder; rank {rank} is used", UserWarning, stacklevel=3)
        found.append(AscendSession(session, source, rank if rank is not None else path_rank,
                                   group, started))
    return found


def summaries_only(d: Path) -> bool:
    """Whether `d` (a session or its ``ASCEND_PROFILER_OUTPUT``) holds torch-npu's CSV
    summaries (``kernel_details.csv``, ...) but no timeline."""
    out = d if d.name == OUTPUT_DIR else d / OUTPUT_DIR
    return (out / KERNEL_DETAILS).is_file() and not (out / TRACE_VIEW).is_file()


SUMMARIES_ONLY = ("holds kernel_details.csv but no trace_view.json and no "
                  "ascend_pytorch_profiler_<rank>.db: a layout of summaries only, which is not "
                  "supported (idle needs the timeline: profile with the text export, "
                  "torch_npu.profiler ExportType.Text, or the database export, ExportType.Db)")


def _source(d: Path) -> Path:
    out = d / OUTPUT_DIR
    if (out / TRACE_VIEW).is_file():
        return out / TRACE_VIEW
    dbs = sorted(p for p in out.glob(DB_GLOB) if p.is_file())
    if len(dbs) == 1:
        return dbs[0]
    if len(dbs) > 1:
        raise TraceError(d, f"more than one database export: {', '.join(p.name for p in dbs)}")
    if summaries_only(d):
        raise TraceError(d, SUMMARIES_ONLY)
    raise TraceError(d, f"no {OUTPUT_DIR}/{TRACE_VIEW} and no {OUTPUT_DIR}/"
                     "ascend_pytorch_profiler_<rank>.db (was the profile parsed? torch-npu "
                     "writes them when profiling stops)")


def _info_rank(d: Path) -> int | None:
    ranks = {int(m.group(1)) for f in d.glob("profiler_info_*.json")
             if (m := _INFO_RE.fullmatch(f.name))}
    if len(ranks) > 1:
        raise TraceError(d, f"more than one profiler_info_<rank>.json: {sorted(ranks)}")
    return ranks.pop() if ranks else None  # (a plain profiler_info.json records no rank)


def _path_rank(d: Path, root: Path) -> tuple[str, int | None]:
    """The group and rank of the deepest ``[<group>_]rank<N>`` folder between `root` and `d`
    (both excluded: `d`'s name starts with a host name)."""
    try:
        parts = d.relative_to(root).parts[:-1]
    except ValueError:
        parts = ()
    for part in reversed(parts):
        if m := RANK_COMPONENT_RE.fullmatch(part):
            return (m.group("group") or ""), int(m.group("rank"))
    return "", None


def choose_sessions(root: Path, directories: list[Path], *, session: str | None = None,
                    group: str | None = None) -> list[AscendSession]:
    """One session per rank of one group, as chosen by `session` (``latest``, an index ``N``
    counted from the earliest, or an ISO time prefix such as ``2025-11-30T01:02``) and `group`.
    `session` applies to the ranks with several sessions; a rank with one keeps it.

    Raises:
        TraceError: several groups and no (or an unknown) `group`; several sessions of a rank
            and no `session`; a `session` that matches no session, or several, of a rank. Each
            message lists the candidates.
    """
    found = find_sessions(root, directories)
    groups = sorted({s.group for s in found})
    if group is not None:
        if group not in groups:
            raise TraceError(root, f"no group {group!r}; the groups are: "
                             f"{', '.join(repr(g) for g in groups)}")
        found = [s for s in found if s.group == group]
    elif len(groups) > 1:
        listed = ", ".join(f"{g!r} ({sum(s.group == g for s in found)} directories)"
                           for g in groups)
        raise TraceError(root, f"holds the traces of several process groups: {listed}; "
                         "choose one with --group NAME (group= in the API)")
    by_rank: dict[int | None, list[AscendSession]] = {}
    for s in found:
        by_rank.setdefault(s.rank, []).append(s)
    chosen = list(by_rank.pop(None, []))  # unknown ranks: load_traces names them
    several = {r: v for r, v in by_rank.items() if len(v) > 1}
    for rank, candidates in sorted(by_rank.items()):
        candidates = sorted(candidates, key=_order)
        if session is None or len(candidates) == 1:  # a lone session is its rank's choice
            if len(candidates) > 1:
                raise TraceError(root, f"rank {rank} has {len(candidates)} profiling sessions "
                                 f"({_listing(candidates)}); choose one with --session "
                                 "latest|N|ISO-time (session= in the API)"
                                 + (f"; {len(several) - 1} other rank(s) too"
                                    if len(several) > 1 else ""))
            chosen.append(candidates[0])
        else:
            chosen.append(_pick(root, rank, candidates, session))
    return chosen


def _order(s: AscendSession) -> tuple[Any, ...]:
    return (s.started is None, s.started or dt.datetime.min, s.directory.name)


def _listing(candidates: list[AscendSession]) -> str:
    return "; ".join(f"[{i}] {s.session} {s.directory.name}" for i, s in enumerate(candidates))


def _pick(root: Path, rank: int, candidates: list[AscendSession], choice: str) -> AscendSession:
    text = choice.strip()
    if text == "latest":
        return candidates[-1]
    if re.fullmatch(r"-?\d{1,3}", text):  # longer digit strings are years
        i = int(text)
        if -len(candidates) <= i < len(candidates):
            return candidates[i]
        raise TraceError(root, f"--session {choice}: rank {rank} has {len(candidates)} "
                         f"session(s): {_listing(candidates)}")
    prefix = text.replace(" ", "T")
    hits = [s for s in candidates if s.session.startswith(prefix)]
    if len(hits) == 1:
        return hits[0]
    what = "matches no session" if not hits else f"matches {len(hits)} sessions"
    raise TraceError(root, f"--session {choice} {what} of rank {rank}: "
                     f"{_listing(candidates)} (use latest, an index or a longer ISO time)")


def align_clocks(sources: list[Path], parsed: list[Any]) -> list[Any]:
    """Check that every rank's times are epoch times (or were anchored when parsed).

    A rank whose every time lies below `RELATIVE_LIMIT_NS` was written relative to its own
    start (Ascend/pytorch PR #156): alone it is analysed (with a warning); beside other ranks
    it is refused, since nothing in the profile records the offset that puts the ranks on
    one clock.

    Raises:
        TraceError: relative times in a run of more than one rank.
    """
    relative = [src for src, p in zip(sources, parsed, strict=True) if _is_relative(p)]
    if relative and len(parsed) > 1:
        raise TraceError(relative[0], "timestamps are relative to the profile's start (numbers "
                         f"below {RELATIVE_LIMIT_NS // 10**9} s after the epoch, as Ascend/"
                         "pytorch PR #156 writes them) and the profile records no offset to "
                         "epoch time; the ranks cannot be aligned, so they are not analysed "
                         f"together ({len(relative)} of {len(parsed)} ranks; analyse one "
                         "rank's directory alone)")
    if relative:
        warnings.warn(f"{relative[0]}: timestamps are relative to the profile's start, not "
                      "epoch times; figures of this one rank are unaffected", UserWarning,
                      stacklevel=3)
    return parsed


def _is_relative(p: Any) -> bool:
    ends = [a[:, 1] for a in (p.device, p.ranges) if len(a)]
    if not ends:
        return False
    return max(int(np.abs(e).max()) for e in ends) < RELATIVE_LIMIT_NS


# -- torch-npu's own figures: step_trace_time.csv, kernel_details.csv ------------------------

@dataclass(frozen=True)
class StepCheck:
    """One row of ``step_trace_time.csv`` beside our figures for the same step (ns).

    `step`: the row's ``Step`` ("" when the profile had no steps: the row covers the whole
    timeline); `window`: the step's device time range, from ``kernel_details.csv`` (the
    first start to the last end of the step's kernels, as torch-npu bounds a step by the
    tasks it launched), None for the whole timeline; ours are None when the step's range is
    unknown (no ``kernel_details.csv`` row of that step)."""

    step: str
    reported_computing_ns: int
    reported_free_ns: int
    computing_ns: int | None
    free_ns: int | None
    window: tuple[int, int] | None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object."""
        return {"step": self.step, "reported_computing_ns": self.reported_computing_ns,
                "computing_ns": self.computing_ns, "reported_free_ns": self.reported_free_ns,
                "free_ns": self.free_ns,
                "window_ns": None if self.window is None else list(self.window)}


_CSV_MAX_BYTES = 4 << 30


def _csv_rows(path: Path) -> Any:
    """The rows of a torch-npu CSV summary as dicts (opened as traces are: a regular file
    within the size limit); TraceError when it cannot be read."""
    import csv

    from residency.traces.files import open_regular

    fd, _ = open_regular(path, max_bytes=_CSV_MAX_BYTES)
    with open(fd, encoding="utf-8-sig", errors="replace", newline="") as f:
        try:
            yield from csv.DictReader(f)
        except csv.Error as exc:
            raise TraceError(path, f"cannot read the CSV: {exc}") from None


def _us(text: Any) -> int | None:
    """Microsecond text as torch-npu writes it (``"1736413971558972.912\\t"``: a trailing
    tab keeps spreadsheets from rounding it) to int64 ns; None when not a number."""
    from residency.traces.units import decimal_us_to_ns

    return decimal_us_to_ns(text.strip()) if isinstance(text, str) and text.strip() else None


def read_step_trace(path: Path) -> list[tuple[str, int, int]]:
    """``(step, computing_ns, free_ns)`` per row of a ``step_trace_time.csv`` (columns
    ``Step``, ``Computing``, ``Free`` in us, as torch-npu's ``TraceStepTimeParser`` writes them:
    sums of the ``Overlap Analysis`` slices that start in the step). Rows whose figures are not
    numbers are left out.

    Raises:
        TraceError: the file cannot be read, or lacks one of those columns (named).
    """
    out = []
    for i, row in enumerate(_csv_rows(path)):
        if i == 0:
            missing = [c for c in ("Step", "Computing", "Free") if c not in row]
            if missing:
                raise TraceError(path, f"no column {missing[0]!r} (columns: "
                                 f"{', '.join(map(str, row))})")
        computing, free = _us(row.get("Computing")), _us(row.get("Free"))
        if computing is not None and free is not None:
            out.append((str(row.get("Step") or "").strip(), computing, free))
    return out


def read_kernel_details(path: Path) -> dict[str, tuple[int, int]]:
    """Each ``Step Id`` of a ``kernel_details.csv`` and its kernels' range ``[first start,
    last end)`` in ns (``Start Time(us)``, with its trailing tab, + ``Duration(us)``); {} when
    the file has no ``Step Id`` column (a profile without steps).

    Raises:
        TraceError: the file cannot be read, or lacks ``Start Time(us)`` / ``Duration(us)``.
    """
    out: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(_csv_rows(path)):
        if i == 0:
            missing = [c for c in ("Start Time(us)", "Duration(us)") if c not in row]
            if missing:
                raise TraceError(path, f"no column {missing[0]!r} (columns: "
                                 f"{', '.join(map(str, row))})")
            if "Step Id" not in row:
                return {}
        start, dur = _us(row.get("Start Time(us)")), _us(row.get("Duration(us)"))
        step = str(row.get("Step Id") or "").strip()
        if start is None or dur is None or dur < 0 or not step:
            continue
        lo, hi = out.get(step, (start, start + dur))
        out[step] = (min(lo, start), max(hi, start + dur))
    return out


def _starting_in(merged: np.ndarray, window: tuple[int, int] | None) -> int:
    """Total length of the merged intervals whose start lies in `window` (all: None), as
    torch-npu assigns an Overlap Analysis slice to the step it starts in."""
    if window is not None:
        merged = merged[(merged[:, 0] >= window[0]) & (merged[:, 0] < window[1])]
    return int((merged[:, 1] - merged[:, 0]).sum())


def step_checks(output_dir: Path, computing: np.ndarray, free: np.ndarray) -> list[StepCheck]:
    """torch-npu's per-step Computing and Free (``step_trace_time.csv`` in `output_dir`)
    beside ours: `computing` and `free` are our merged computing and free intervals (ns).
    No ``step_trace_time.csv``: []. Steps are bounded by ``kernel_details.csv``.

    Raises:
        TraceError: either CSV exists but cannot be read (named).
    """
    steps_csv = output_dir / STEP_TRACE
    if not steps_csv.is_file():
        return []
    rows = read_step_trace(steps_csv)
    kernels = output_dir / KERNEL_DETAILS
    ranges = read_kernel_details(kernels) if kernels.is_file() else {}
    out = []
    for step, computing_ns, free_ns in rows:
        window = None if not step else ranges.get(step)
        known = not step or window is not None
        out.append(StepCheck(step, computing_ns, free_ns,
                             _starting_in(computing, window) if known else None,
                             _starting_in(free, window) if known else None, window))
    return out
