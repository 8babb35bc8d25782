"""The ``idle`` entries of the trace cache (`residency.traces.cache`): a `RankReduction` and
the options it was computed under, written and read back (`record`, `cached`); and a Kineto
trace set's `IdleSummary` with the warnings its computation raised (`record_summary`,
`summary_cached`), so that a repeated ``residency idle`` reads one small entry instead of every
rank's union. An entry that is not well formed reads as no entry."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from residency.analysis.idle.model import IdleSummary, RankReduction
from residency.traces import busy as busydef
from residency.traces import intervals as iv

__all__ = ["cached", "entry_meta", "from_entry", "options", "record", "record_summary",
           "recorded", "summary_cached", "summary_options"]


def options(plan: Any, job: dict[str, Any]) -> dict[str, Any]:
    """What an ``idle`` cache entry was computed under (besides the trace and parser)."""
    return {"format": plan.format, "busy": busydef.resolve(job["busy"], plan.format).name,
            "marker": job["marker"], "window_marker": job["window_marker"],
            "reduction": 3}  # 3: busy packed (iv.pack); 2: unknown types confirmed, host
    # ranges, step intervals


def cached(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result | None = None, *,
           packed: bool = False) -> RankReduction | None:
    """Item `i`'s reduction from its cache entry, if one matches (`stat`: the trace's status
    from `residency.traces.load.open_stat`, taken now when not given); with `packed`, its busy
    union as the entry holds it (`iv.Packed`, checked, not unpacked)."""
    from residency.traces import cache as tracecache
    from residency.traces import load as tr

    source = plan.sources[i]
    if not (job["cache"] and tracecache.enabled(plan.parse_root, source)):
        return None
    if stat is None:
        stat = tr.open_stat(source, plan.parse_root, job["max_trace_bytes"])
    got = tracecache.get("idle", source, stat, options(plan, job), root=plan.parse_root,
                         max_trace_bytes=job["max_trace_bytes"])
    return from_entry(plan, i, got, packed=packed) if got is not None else None


def record(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result, digest: str | None,
           r: RankReduction) -> None:
    """Record item `i`'s reduction `r` (computed under `job` from the bytes whose content
    digest is `digest`, of the trace whose status was `stat` before it was read) in the user's
    cache; `digest` None: an entry of the trace's status alone
    (`residency.traces.cache.put`)."""
    from residency.traces import cache as tracecache

    busy: Any = r.busy  # (packed already where the parse folded the rank's device rows)
    head, lengths, gaps = busy.parts if isinstance(busy, iv.Packed) else iv.pack(busy)
    arrays = {"busy": head, "busy_lengths": lengths, "busy_gaps": gaps,
              "markers": r.markers, "window_ranges": r.window_ranges}
    if r.free is not None:
        arrays["free"] = r.free
    if r.computing is not None and r.work is not None:
        arrays["computing"], arrays["work"] = r.computing, r.work
    tracecache.put("idle", plan.sources[i], stat, options(plan, job), digest, entry_meta(r),
                   arrays, root=plan.parse_root)


def recorded(plan: Any, i: int, job: dict[str, Any], stat: os.stat_result) -> bool:
    """Whether item `i` has a cache entry (not yet checked): with every rank recorded, the
    lookups run here in threads, with no worker processes to start."""
    from residency.traces import cache as tracecache

    return tracecache.has_entry("idle", plan.sources[i], stat, options(plan, job),
                                root=plan.parse_root)


def entry_meta(r: RankReduction) -> dict[str, Any]:
    return {"content_rank": r.content_rank, "device_tasks": r.device_tasks,
            "rejected_events": r.rejected_events, "busy_bounds": r.busy_bounds,
            "excluded": r.excluded, "unknown": r.unknown, "overlap_span": r.overlap_span,
            "span": r.span, "end_abs": r.end_abs, "free": r.free is not None,
            "confirmed": sorted(r.confirmed), "host_ranges": r.host_ranges,
            "steps": r.computing is not None, "world_size": r.world_size}


def _pair(v: Any) -> tuple[int, int] | None:
    if v is None:
        return None
    a, b = v
    if type(a) is not int or type(b) is not int:
        raise TypeError("not a pair of ints")
    return a, b


def _counts(v: Any) -> dict[str, int]:
    if not isinstance(v, dict) or not all(type(k) is str and type(n) is int
                                          for k, n in v.items()):
        raise TypeError("not a dict of counts")
    return dict(v)


def from_entry(plan: Any, i: int, got: tuple[dict[str, Any], dict[str, np.ndarray]], *,
               packed: bool = False) -> RankReduction | None:
    """A reduction from a cache entry (with `packed`, its busy union left packed, once
    checked); None when the entry is not well formed."""
    from residency.traces import load as tr

    meta, arrays = got
    try:
        content = meta["content_rank"]
        if content is not None and type(content) is not int:
            return None
        rows = {}
        steps = ("computing", "work") if meta["steps"] else ()
        for k in ("busy", "markers", "window_ranges", *steps) + (
                ("free",) if meta["free"] else ()):
            a = arrays[k]
            if a.dtype != np.int64 or a.ndim != 2 or a.shape[1] != 2:
                return None
            rows[k] = np.array(a)  # (not a view: the entry's bytes are freed)
        # (packed: its columns left as views of the entry's bytes, which they are most of)
        parts = (rows["busy"], arrays["busy_lengths"], arrays["busy_gaps"])
        rows["busy"] = iv.Packed.of_parts(*parts).checked() if packed else iv.unpack(*parts)
        end_abs = meta["end_abs"]
        if end_abs is not None and type(end_abs) is not int:
            return None
        n, rejected, hosts = meta["device_tasks"], meta["rejected_events"], meta["host_ranges"]
        if type(n) is not int or type(rejected) is not int or type(hosts) is not int:
            return None
        confirmed, world = meta["confirmed"], meta["world_size"]
        if not isinstance(confirmed, list) or not all(type(c) is str for c in confirmed):
            return None
        if world is not None and type(world) is not int:
            return None
        rank = tr.rank_of(plan, i, content, warn=False)
        return RankReduction(rank, plan.sources[i], n, rejected, rows["busy"],
                             _pair(meta["busy_bounds"]), _counts(meta["excluded"]),
                             _counts(meta["unknown"]), rows["markers"], rows["window_ranges"],
                             rows.get("free"), _pair(meta["overlap_span"]),
                             _pair(meta["span"]), end_abs, content, frozenset(confirmed),
                             hosts, rows.get("computing"), rows.get("work"), world)
    except (KeyError, TypeError, ValueError):
        return None


# -- a trace set's summary ------------------------------------------------------------------

SUMMARY_FORMATS = frozenset({"kineto"})  # whose figures come from the trace files alone
# (a torch-npu set's also from its CSV summaries and profiler metadata: not recorded)


def summary_options(plan: Any, job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What a trace set's summary entry was computed under: the ranks' `options`, the folder
    as given (warnings name files by it), the trace size limit and `extra` (the other
    arguments of `residency.analysis.idle.idle_summary_at` that change its figures or its
    warnings)."""
    return {**options(plan, job), "summary": 1, "root": str(plan.root),
            "max_trace_bytes": job["max_trace_bytes"], **extra}


def _categories() -> dict[str, type[Warning]]:
    """The warning categories a summary entry may replay, by name."""
    from residency.traces.load import TraceNote

    return {c.__name__: c for c in (UserWarning, RuntimeWarning, TraceNote)}


def summary_cached(plan: Any, key: dict[str, Any], stats: list[os.stat_result]
                   ) -> tuple[IdleSummary, list[Warning]] | None:
    """The summary recorded for `plan`'s traces as they are now (`stats`) under `key`
    (`summary_options`), with the warnings to raise again; None without a usable entry."""
    import dataclasses

    from residency.traces import cache as tracecache

    if plan.format not in SUMMARY_FORMATS:
        return None
    got = tracecache.get_set("idle-summary", list(plan.sources), stats, key,
                             root=plan.parse_root)
    if got is None:
        return None
    try:
        summary = IdleSummary.from_dict(got["summary"])
        basis, notes = got["window_basis"], got["warnings"]
        kinds = _categories()
        if type(basis) is not str or not isinstance(notes, list):
            return None
        replay = [kinds[k](m) for k, m in notes if type(m) is str]
        if len(replay) != len(notes):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return dataclasses.replace(summary, window_basis=basis), replay


def record_summary(plan: Any, key: dict[str, Any], stats: list[os.stat_result],
                   summary: IdleSummary, raised: list[Warning]) -> None:
    """Record `summary` of `plan`'s traces (their status `stats` taken before they were read)
    and the warnings its computation `raised`, under `key`; nothing where a warning's category
    could not be raised again as it was."""
    from residency.traces import cache as tracecache

    kinds = _categories()
    if plan.format not in SUMMARY_FORMATS or any(kinds.get(type(w).__name__) is not type(w)
                                                 for w in raised):
        return
    meta = {"summary": summary.to_dict(), "window_basis": summary.window_basis,
            "warnings": [[type(w).__name__, str(w)] for w in raised]}
    tracecache.put_set("idle-summary", list(plan.sources), stats, key, meta,
                       root=plan.parse_root)
