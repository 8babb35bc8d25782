"""One rank's reduction (`RankReduction`: its busy union and marker ranges, never its columns),
computed where the rank is read, and every rank's, here or on a Dask cluster
(`residency.traces.parallel`), with the union of every rank's busy intervals reduced on the
cluster's workers in a tree (`reductions_at`)."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from residency.analysis.idle import entries
from residency.analysis.idle.model import RankReduction
from residency.traces import busy as busydef
from residency.traces import intervals as iv

if TYPE_CHECKING:
    from residency.traces.load import RankTimeline

__all__ = ["busy_union", "compile_pattern", "matching", "packed_reduction", "rank_reduction",
           "reduce_rank", "reductions_at"]


def compile_pattern(pattern: str, option: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError, MemoryError, ValueError) as exc:
        # (a repeat count past the C limit, 'x{4294967296}', is an OverflowError)
        raise busydef.OptionError(option, "The value for {option} must be a regular "
                                  "expression, but {0!r} was passed ({1}).", pattern,
                                  exc) from None


def matching(t: RankTimeline, rx: re.Pattern[str]) -> iv.Intervals:
    """The host ranges of `t` whose name matches `rx`, as an interval array (not merged)."""
    names = t.range_names.tolist()
    hit = {n: rx.search(n) is not None for n in set(names)}  # each distinct name once
    return t.ranges[np.fromiter(map(hit.__getitem__, names), bool, len(names))]


_NONE = np.empty((0, 2), np.int64)
# torch-npu: the classes of a rank's `computing` and `work` unions (torch-npu's step checks)
COMPUTING = frozenset({"compute", "unknown"})
WORK = COMPUTING | {"communication"}




def reduce_rank(t: RankTimeline, definition: busydef.BusyDefinition, fmt: str,
                marker: re.Pattern[str] | None, window_marker: re.Pattern[str] | None,
                *, content_rank: int | None = None, consume: bool = False) -> RankReduction:
    """One rank's `RankReduction` under `definition` and the compiled patterns. With
    `consume`, the caller gives `t` up: its busy union may be written over its device rows
    (no second copy of a device-dense rank)."""
    from residency.traces.load import timeline_span

    chosen = busydef.busy_tasks(t, definition, fmt)
    rows = chosen.rows
    bounds = (int(rows[:, 0].min()), int(rows[:, 1].max())) if len(rows) else None
    span = timeline_span(t)
    free = None
    overlap_span = None
    if len(t.overlap):
        free = iv.merge(t.overlap[t.overlap_names == "Free"])
        overlap_span = (int(t.overlap[:, 0].min()), int(t.overlap[:, 1].max()))
    ends = [max(-int(a[:, 1].min()), int(a[:, 1].max()))  # largest |end|, no copy
            for a in (t.device, t.ranges, t.overlap) if len(a)]
    if consume and rows is t.device and rows.base is None:  # (ours alone: parsed for this)
        rows.setflags(write=True)  # (Kineto: every device row chosen, nothing reads them on)
        busy = iv.merge_in_place(rows)
    else:
        busy = iv.merge(rows)
    excluded, unknown, confirmed = chosen.excluded, chosen.unknown, chosen.confirmed
    del chosen, rows  # (torch-npu: the chosen rows, a copy, freed before the next two)
    computing = work = None
    if fmt == "ascend":
        computing = iv.merge(busydef.class_rows(t, COMPUTING))
        work = iv.merge(busydef.class_rows(t, WORK))
    return RankReduction(
        t.rank, t.source, t.device_tasks, t.rejected_events, busy, bounds,
        dict(excluded), dict(unknown),
        np.ascontiguousarray(matching(t, marker)) if marker is not None else _NONE,
        np.ascontiguousarray(matching(t, window_marker)) if window_marker is not None
        else _NONE, free, overlap_span, span,
        int(max(ends)) if ends else None, content_rank, frozenset(confirmed),
        len(t.ranges), computing, work)


def rank_reduction(plan: Any, i: int, *, busy: str, marker: str | None,
                   window_marker: str | None, cache: bool, chunk_bytes: int,
                   max_trace_bytes: int, parsed: Any = None,
                   packed: bool = False) -> RankReduction:
    """The reduction of `plan`'s item `i` (a `residency.traces.load.TracePlan`): from the user's
    cache when an entry matches, else parsed (or from `parsed`, its parse) and recorded. With
    `packed`, its busy union may come as an `iv.Packed` (as a parse folded it, or as its
    cache entry holds it)."""
    job = {"busy": busy, "marker": marker, "window_marker": window_marker, "cache": cache,
           "chunk_bytes": chunk_bytes, "max_trace_bytes": max_trace_bytes}
    hit = entries.cached(plan, i, job, packed=packed) if parsed is None else None
    return hit if hit is not None else _computed(plan, i, job, parsed, packed=packed)


def _computed(plan: Any, i: int, job: dict[str, Any], parsed: Any, *,
              packed: bool = False, stat: os.stat_result | None = None,
              hashed: bool | None = None) -> RankReduction:
    """Item `i`'s reduction, parsed here (or from `parsed`, its parse, of the trace whose
    status was `stat` before it was read, `hashed` as it was read or not) and recorded."""
    from residency.traces import cache as tracecache
    from residency.traces import load as tr
    from residency.traces.columns import NotFoldable

    source, root, limit = plan.sources[i], plan.parse_root, job["max_trace_bytes"]
    if stat is None:
        stat = tr.open_stat(source, root, limit)
    cache = job["cache"] and tracecache.enabled(root, source)
    if hashed is None:
        hashed = _hashed(plan, i, job, stat)
    own = parsed is None  # parsed here for this reduction alone: its arrays can be reused
    wrx = None if job["window_marker"] is None else compile_pattern(job["window_marker"],
                                                             "window_marker")
    rx = None if job["marker"] is None else compile_pattern(job["marker"], "marker")
    definition = busydef.resolve(job["busy"], plan.format)
    if parsed is None:  # (Kineto: device rows folded into their union as they are read; a
        # torch-npu database: into one union per set of classes; every format: only the host
        # ranges the patterns match kept, the others counted)
        kw = dict(root=root, chunk_bytes=job["chunk_bytes"], max_bytes=limit, digest=hashed,
                  device_names=False)
        try:
            parsed = tr.parse_source(plan.format, source, fold_device=True,
                                     fold_classes=(definition.classes, COMPUTING, WORK),
                                     classify=busydef.classify,
                                     keep_host=_wanted(rx, wrx), **kw)
        except NotFoldable:  # (a start out of range once the base is added, or a torch-npu
            # process named anew after its rows were counted: the whole rows needed)
            parsed = tr.parse_source(plan.format, source, **kw)
    content_rank, parsed_world = parsed.rank, parsed.world_size
    trace_digest = parsed.digest if hashed else None  # (None: an entry of its status)
    record = cache and (trace_digest is not None or not hashed)
    folded, host_folded = parsed.device_folded, parsed.host_folded
    by_class = parsed.device_classes
    rank = tr.rank_of(plan, i, content_rank, warn=False)  # warned once, where gathered
    t = tr.timeline_of(parsed, -1 if rank is None else rank, source, plan.sessions[i])
    del parsed
    r = dataclasses.replace(reduce_rank(t, definition, plan.format, rx, wrx, consume=own),
                            rank=rank, content_rank=content_rank, world_size=parsed_world)
    del t
    if host_folded is not None:
        r = _with_host_folded(r, host_folded)
    if folded is not None:
        r = _with_folded(r, folded)
    if by_class is not None:
        r = _with_classes(r, by_class, definition)
    if record:  # (a digest asked for and none given: nothing is recorded)
        entries.record(plan, i, job, stat, trace_digest, r)
    if isinstance(r.busy, iv.Packed) and not packed:
        r = dataclasses.replace(r, busy=r.busy.unpack())
    return r


def _hashed(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result) -> bool:
    """Whether item `i` (status `stat`, taken before it is read) is hashed as it is read: for
    its cache entry, where its status will not vouch for it (changed lately,
    `residency.traces.cache.settled`)."""
    from residency.traces import cache as tracecache

    return (job["cache"] and tracecache.enabled(plan.parse_root, plan.sources[i])
            and not tracecache.settled(stat))


def _wanted(marker: re.Pattern[str] | None, window_marker: re.Pattern[str] | None
            ) -> Callable[[str], bool]:
    """Whether a host range of this name is one `reduce_rank` looks at (as `matching` tells
    it): the others it only counts."""
    patterns = [p for p in (marker, window_marker) if p is not None]
    return lambda name: any(p.search(name) is not None for p in patterns)


def _with_host_folded(r: RankReduction, f: Any) -> RankReduction:
    """`r`, reduced from a timeline without the host ranges a parse only counted, with what
    `reduce_rank` takes of those rows from their figures `f` (a
    `residency.traces.columns.FoldedHost`)."""
    if not f.ranges:
        return r
    span = ((f.first_start, f.last_end) if r.span is None else
            (min(r.span[0], f.first_start), max(r.span[1], f.last_end)))
    end = max(-f.first_end, f.last_end)  # the largest |end| of a counted row
    return dataclasses.replace(r, span=span, host_ranges=r.host_ranges + f.ranges,
                               end_abs=end if r.end_abs is None else max(r.end_abs, end))


def _with_folded(r: RankReduction, f: Any) -> RankReduction:
    """`r`, reduced from a timeline without device rows (a Kineto parse that folded them,
    every one of them busy: `busydef.busy_tasks`), with what `reduce_rank` takes of those
    rows from their fold `f` (a `residency.traces.columns.FoldedDevice`); the union packed."""
    if not f.tasks:
        return r
    span = ((f.first_start, f.last_end) if r.span is None else
            (min(r.span[0], f.first_start), max(r.span[1], f.last_end)))
    end = max(-f.first_end, f.last_end)  # the largest |end| of a device row
    return dataclasses.replace(r, device_tasks=f.tasks, busy=f.union,
                               busy_bounds=(f.first_start, f.last_end), span=span,
                               end_abs=end if r.end_abs is None else max(r.end_abs, end))


def _with_classes(r: RankReduction, f: Any, definition: busydef.BusyDefinition
                  ) -> RankReduction:
    """`r`, reduced from a timeline without device rows (a torch-npu database parse that
    folded them by class), with what `reduce_rank` takes of those rows from their fold `f`
    (a `residency.traces.columns.FoldedClasses`, whose unions hold the Communication lane's
    ranges where their classes count it); the busy union packed."""
    klass = {ty: busydef.classify(ty) for ty in f.types}
    excluded = {ty: n for ty, n in sorted(f.types.items())
                if klass[ty] not in definition.classes}
    excluded.update(r.excluded)  # (the Communication lane's, where it does not count)
    unknown = {ty: n for ty, n in sorted(f.types.items()) if klass[ty] == "unknown"}
    span, end_abs = r.span, r.end_abs
    if f.tasks:
        span = ((f.first_start, f.last_end) if span is None else
                (min(span[0], f.first_start), max(span[1], f.last_end)))
        end = max(-f.first_end, f.last_end)  # the largest |end| of a device row
        end_abs = end if end_abs is None else max(end_abs, end)
    return dataclasses.replace(r, device_tasks=f.tasks, busy=f.unions[definition.classes],
                               busy_bounds=f.bounds[definition.classes],
                               excluded=excluded, unknown=unknown, span=span, end_abs=end_abs,
                               computing=f.unions[COMPUTING].unpack(),
                               work=f.unions[WORK].unpack())


def _here(plan: Any, job: dict[str, Any], workers: int | None
          ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """Every rank's reduction on this machine. With at least as many files as workers, not
    all of them recorded in the cache, each file is one job of a worker process: its cache
    entry looked up there, else parsed and reduced there (`rank_reduction`). Else cache
    entries are looked up here first (in threads), then the rest parsed here, one file per
    worker process while there are enough of them, or each large file in parts in the workers
    (`residency.traces.load.parse_files`; a database, never read in parts, read here) and
    reduced here, one rank at a time."""
    from residency.traces import load as tr

    n_items = len(plan.sources)
    stats = {i: tr.open_stat(plan.sources[i], plan.parse_root, job["max_trace_bytes"])
             for i in range(n_items)}
    from residency.traces.parallel import PARALLEL_MIN_BYTES, map_threads, usable_cpus

    n = workers if workers is not None else usable_cpus()
    small = sum(st.st_size for st in stats.values()) < PARALLEL_MIN_BYTES
    if n > 1 and n_items >= n and not (workers is None and small) and not (
            job["cache"] and all(entries.recorded(plan, i, job, stats[i]) for i in range(n_items))):
        return _pool(plan, job, n, stats)  # (lookups in the workers: no start-up cost here)
    found: list[RankReduction | None] = [None] * n_items
    if job["cache"] and n_items:
        found = map_threads(lambda i: entries.cached(plan, i, job, stats[i], packed=True),
                            range(n_items))
    todo = [i for i, r in enumerate(found) if r is None]
    done: dict[int, RankReduction] = {}
    if n <= 1 or (workers is None and small):
        done = {i: _computed(plan, i, job, None, packed=True) for i in todo}
    elif len(todo) >= n:  # (recorded, but entries refused: stale or damaged)
        done = dict(zip(todo, _pool(plan, job, n, {i: stats[i] for i in todo})[0],
                        strict=True))
    else:  # fewer files than workers: each file's parts in the workers (a database, never
        # read in parts, is read here: only the host ranges its reduction reads kept)
        for i in todo:
            if tr.is_database(plan.sources[i]):
                done[i] = _computed(plan, i, job, None, packed=True)
                continue
            hashed = _hashed(plan, i, job, stats[i])
            (p,) = tr.parse_files(plan.format, [plan.sources[i]], workers=workers,
                                  root=plan.parse_root, chunk_bytes=job["chunk_bytes"],
                                  max_bytes=job["max_trace_bytes"], digest=hashed,
                                  device_names=False)
            done[i] = _computed(plan, i, job, p, packed=True, stat=stats[i], hashed=hashed)
            del p
    return [found[i] if found[i] is not None else done[i] for i in range(n_items)], None


def busy_union(reductions: Sequence[RankReduction]) -> iv.Intervals:
    """The union of the ranks' busy intervals (a leaf of the all-rank reduction tree)."""
    return iv.union(*(r.busy for r in reductions))


def reductions_at(plan: Any, job: dict[str, Any], *, scheduler: str | None = None,
                  workers: int | None = None
                  ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """Every rank's reduction of `plan` (a `residency.traces.load.TracePlan`) under `job`
    (`rank_reduction`'s keywords), in plan order, here (`workers` processes) or on a Dask
    cluster (`scheduler`, `residency.traces.parallel.map_dask`), and the union of every rank's
    busy intervals where the cluster's workers reduced it (a tree: each task's ranks, then the
    partial unions pairwise, on the workers); None where the ranks were reduced on this
    machine."""
    from residency.traces import parallel

    if scheduler is None:
        return _here(plan, job, workers)
    return parallel.map_dask(rank_reduction, plan, [_size(s) for s in plan.sources],
                             scheduler=scheduler, workers=workers, kwargs=job,
                             root=plan.root, leaf=busy_union, combine=iv.union)


def packed_reduction(plan: Any, i: int, *, spill: str | None = None, **job: Any
                     ) -> RankReduction:
    """`rank_reduction` with its busy union packed (`residency.traces.intervals.Packed`) for
    the trip from a worker process: 6 bytes a device-dense row instead of 16; with `spill` (a
    folder), written to a file there (`Spilled`) instead of being pickled where it packs to
    `SPILL_MIN_BYTES` or more."""
    r = rank_reduction(plan, i, packed=True, **job)
    busy: Any = r.busy if isinstance(r.busy, iv.Packed) else iv.Packed(r.busy)
    if spill is not None and sum(a.nbytes for a in busy.parts) >= SPILL_MIN_BYTES:
        busy = Spilled(busy, spill)
    return dataclasses.replace(r, busy=busy)


SPILL_MIN_BYTES = 1 << 20  # a smaller packed union is pickled: a file a rank cost the client
# ~0.3 ms to read back and remove (64 small ranks: 20 ms of its serial time)


class Spilled:
    """A rank's packed busy union written to a file in a folder the receiver owns: the trip
    from a worker process without a pickle of its columns (pickled, an array is copied twice
    more in the worker, 30 MB for a 2.5M-row device-dense union); `packed` reads it back
    (once: the file is removed)."""

    __slots__ = ("path",)

    def __init__(self, busy: iv.Packed, folder: str) -> None:
        fd, self.path = tempfile.mkstemp(suffix=".npy", dir=folder)
        with os.fdopen(fd, "wb") as f:
            for a in busy.parts:
                np.save(f, a, allow_pickle=False)

    def packed(self) -> iv.Packed:
        """The union written (read back once: the file is removed), checked."""
        with open(self.path, "rb") as f:
            parts = [np.load(f, allow_pickle=False) for _ in range(3)]
        os.unlink(self.path)
        return iv.Packed.of_parts(*parts).checked()


def _pool(plan: Any, job: dict[str, Any], n: int, stats: dict[int, os.stat_result]
          ) -> tuple[list[RankReduction], iv.Intervals | None]:
    """The reductions of the items of `stats`, in their order, by `n` worker processes in jobs
    of a few ranks (`residency.traces.parallel.task_groups`, largest first). Each rank's union
    comes back packed, through a file (`Spilled`), and stays packed here (`summarize` measures
    packed sets as they are: unpacking a device-dense rank's union faulted in 40 MB a rank); the
    all-rank union is not built (`summarize` sweeps the ranks' unions): on one machine a tree
    of unions through the workers sent each union twice more and doubled the peak (732 MB
    against 351 MB on 2 x 2.5M device-dense ranks)."""
    from residency.traces import parallel

    items = list(stats)
    groups = [tuple(items[k] for k in g) for g in
              parallel.task_groups([stats[i].st_size for i in items], n)]
    out = []
    with tempfile.TemporaryDirectory(prefix="residency-idle-") as folder:
        got, _ = parallel.map_local(packed_reduction, groups, workers=n, args=(plan,),
                                    kwargs={**job, "spill": folder})
        for i in items:
            r = got.pop(i)
            busy = r.busy.packed() if isinstance(r.busy, Spilled) else r.busy
            out.append(dataclasses.replace(r, busy=busy))
            del r
    return out, None


def _size(source: Path) -> int:
    """`source`'s size here in bytes (0 where it cannot be read here: it is checked where it
    is read)."""
    try:
        return os.stat(source).st_size
    except OSError:
        return 0
