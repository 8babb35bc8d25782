"""`residency idle` keeps, of a Kineto rank's host ranges, only those its patterns (`--marker`,
`--window-marker`) match, and counts the others (`residency.traces.columns.FoldedHost`): the
same reduction to the nanosecond as from the whole timeline, whichever rows are the rank's
extremes, with the compiled reader or not, and where a counted row would be dropped once
``baseTimeNanoseconds`` is added (parsed again, whole)."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from residency.analysis.idle import idle_summary, idle_summary_at
from residency.analysis.idle.reduce import rank_reduction
from residency.traces.ascend_text import READER
from residency.traces.columns import NotFoldable
from residency.traces.load import load_traces, parse_source, plan_traces
from tests.helpers import copy_fixture, tracegen

MARKER = r"residency\.release\[normal\]"
WINDOW = r"^step \d+$"
NAMES = ["residency.release[normal]", "residency.release[forced]", "step 1", "step 22",
         "aten::mm", "ünïcode \"quoted\"", "", "step x", "a\\b"]


def _events(seed: int, n: int = 500) -> list[dict]:
    """Kernels and host ranges of the `NAMES`; a host range that no pattern matches starts
    first and another ends last (the rank's span and largest end come from counted rows)."""
    rng = random.Random(seed)
    out: list[dict] = [{"ph": "X", "cat": "cpu_op", "name": "aten::first", "pid": 1, "tid": 1,
                        "ts": -50.0, "dur": 1.0}]
    t = 0.0
    for i in range(n):
        t += rng.uniform(0.0, 3.0)
        if rng.random() < 0.5:
            out.append({"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7,
                        "ts": round(t, 3), "dur": round(rng.uniform(0.0, 4.0), 3)})
        else:
            out.append({"ph": "X", "cat": rng.choice(["cpu_op", "user_annotation"]),
                        "name": rng.choice(NAMES), "pid": 1, "tid": 1, "ts": round(t, 3),
                        "dur": round(rng.uniform(0.0, 20.0), 3)})
    out.append({"ph": "X", "cat": "python_function", "name": "last", "pid": 1, "tid": 1,
                "ts": round(t, 3), "dur": 5000.0})
    return out


def _trace(d: Path, events: list[dict], base: int, rank: int) -> Path:
    (d / f"rank{rank}").mkdir(parents=True, exist_ok=True)
    path = d / f"rank{rank}" / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": base,
                                "distributedInfo": {"rank": rank, "world_size": 2}}))
    return path


def _parse(path: Path, **kw):
    return parse_source("kineto", path, root=path.parent, chunk_bytes=512, max_bytes=1 << 30,
                        device_names=False, **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_parse_keeps_the_wanted_host_ranges_and_counts_the_rest(tmp_path, trace_reader, seed):
    path = _trace(tmp_path, _events(seed), 1_764_500_000_000_000_000, 0)
    rx = re.compile(MARKER)
    whole, kept = _parse(path), _parse(path, keep_host=lambda n: rx.search(n) is not None)
    wanted = np.array([rx.search(n) is not None for n in whole.names], bool)
    assert 0 < wanted.sum() < len(wanted)  # (neither all nor none: the test can fail)
    assert np.array_equal(kept.ranges, whole.ranges[wanted])
    assert list(kept.names) == list(whole.names[wanted])
    other = whole.ranges[~wanted]
    f = kept.host_folded
    assert whole.host_folded is None
    assert (f.ranges, f.first_start, f.last_end, f.first_end) == (
        len(other), other[:, 0].min(), other[:, 1].max(), other[:, 1].min())
    assert kept.rejected == whole.rejected and np.array_equal(kept.device, whole.device)


def _fields(r) -> dict:
    out = {}
    for k, v in dataclasses.asdict(r).items():
        out[k] = np.asarray(v).tolist() if isinstance(v, np.ndarray) else v
    return out


@pytest.mark.parametrize("marker,window", [(MARKER, None), (None, WINDOW), (MARKER, WINDOW),
                                           (None, None), ("$^", None)])
def test_a_filtered_reduction_equals_the_whole_timelines(tmp_path, trace_reader, marker, window):
    d = tmp_path / "t"
    for rank in (0, 1):
        _trace(d, _events(10 + rank), 1_764_500_000_000_000_000, rank)
    plan = plan_traces(d)
    job = dict(busy=None, marker=marker, window_marker=window, cache=False, chunk_bytes=2048,
               max_trace_bytes=1 << 30)
    for i, source in enumerate(plan.sources):
        whole = rank_reduction(plan, i, parsed=_parse(source), **job)
        filtered = rank_reduction(plan, i, **job)
        assert _fields(filtered) == _fields(whole)
        assert whole.host_ranges > len(filtered.markers) + len(filtered.window_ranges)


def test_a_counted_row_out_of_range_once_based_is_parsed_again_whole(tmp_path, trace_reader):
    d = tmp_path / "t"
    base = 4_520_000_000_000_000_000
    for rank in (0, 1):
        events = _events(20 + rank)
        if rank == 1:  # a host range starting beyond 2**62 ns once based: dropped, counted
            events.append({"ph": "X", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 1,
                           "ts": 1e14, "dur": 1.0})
        _trace(d, events, base, rank)
    whole = idle_summary(load_traces(d, cache=False), marker=MARKER)
    assert whole.rejected_events == 1
    for kw in (dict(cache=False, workers=1), dict(cache=True, workers=2)):
        assert idle_summary_at(d, marker=MARKER, chunk_bytes=2048, **kw) == whole


@pytest.mark.parametrize("source", ["generated", "ascend_real", "ascend_basic"])
@pytest.mark.parametrize("marker,window", [
    (MARKER, None), (None, None), ("aten::mm", "Free|release"), ("$^", "^Aclnn|^Ascend"),
    (".", None)])
def test_a_torch_npu_text_reduction_keeps_only_what_it_reads(tmp_path, trace_reader, source,
                                                               marker, window):
    """torch-npu's text export: host ranges outside the Communication and derived lanes kept
    only where a pattern matches them, the rest counted; the reduction is the whole one."""
    if source == "generated":
        d = tmp_path / "npu"
        tracegen().generate(d, 2, 3000, 4, fmt="ascend")
    else:
        d = copy_fixture(source, tmp_path / "npu")
    plan = plan_traces(d)
    job = dict(busy=None, marker=marker, window_marker=window, cache=False, chunk_bytes=4096,
               max_trace_bytes=1 << 30)
    counted = 0
    for i, src in enumerate(plan.sources):
        whole_parse = parse_source("ascend", src, root=plan.parse_root, chunk_bytes=4096,
                                   max_bytes=1 << 30)
        whole = rank_reduction(plan, i, parsed=whole_parse, **job)
        filtered = rank_reduction(plan, i, **job)
        assert _fields(filtered) == _fields(whole)
        kept = parse_source("ascend", src, root=plan.parse_root, chunk_bytes=4096,
                            max_bytes=1 << 30, device_names=False,
                            keep_host=lambda n: marker is not None and re.search(marker, n)
                            is not None)
        counted += 0 if kept.host_folded is None else kept.host_folded.ranges
        assert kept.device_names is None
    assert counted > 0 if marker != "." else counted == 0  # (the filter ran, or had nothing)


def _npu_session(d: Path, events: list[dict], rank: int = 0) -> Path:
    out = d / f"host_{100 + rank}_20251130010203_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out.parent / f"profiler_info_{rank}.json").write_text(json.dumps({"rank_id": rank}))
    (out / "trace_view.json").write_text(json.dumps(events))
    return out / "trace_view.json"


def _npu_events(n: int = 400) -> list[dict]:
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                        "args": {"name": name}}
                       for p, name in ((1, "Python"), (2, "CANN"), (3, "Ascend Hardware"),
                                       (4, "Communication"))]
    for i in range(n):
        us = f"{1764500000000000 + 10 * i}.125"
        out.append({"ph": "X", "name": "aten::mm" if i % 7 else "residency.release[normal]",
                    "pid": 1 + i % 2, "tid": 1, "ts": us, "dur": 3.5})
        out.append({"ph": "X", "name": f"k{i % 3}", "pid": 3, "tid": 9, "ts": us, "dur": 2.0,
                    "args": {"Task Type": "AI_CORE"}})
    return out


def test_a_torch_npu_rank_lets_unwanted_host_ranges_go_as_it_reads(tmp_path, trace_reader):
    """The process names come first (as torch-npu writes them): the unwanted host ranges are
    counted run by run, never all held until the end."""
    path = _npu_session(tmp_path, _npu_events())
    rx = re.compile(MARKER)
    cols = READER.columns(False)
    cols.keep_host(lambda n: rx.search(n) is not None)
    with path.open("rb") as f:
        events = f.read()
    cols.add(events)
    held = sum(len(x) for x in cols.ts)
    assert held < 400 + 400 // 7 + 10  # device rows and wanted ranges, not every host range
    parsed = cols.finish(path, None)
    whole = parse_source("ascend", path, root=tmp_path, chunk_bytes=1 << 20, max_bytes=1 << 30)
    wanted = np.array([rx.search(n) is not None for n in whole.names], bool)
    assert np.array_equal(parsed.ranges, whole.ranges[wanted])
    assert parsed.host_folded.ranges == int((~wanted).sum()) > 0


def test_a_process_named_anew_after_its_ranges_were_counted_is_read_whole(tmp_path, trace_reader):
    """A process named a host lane first and the device's later (the last name counts): its
    rows were counted as host ranges, so the parse is refused and read again whole."""
    events = _npu_events()
    events.append({"ph": "M", "name": "process_name", "pid": 2, "tid": 0,
                   "args": {"name": "Ascend Hardware"}})  # (CANN's rows are device tasks)
    path = _npu_session(tmp_path / "t", events)
    with pytest.raises(NotFoldable):
        parse_source("ascend", path, root=path.parent, chunk_bytes=4096, max_bytes=1 << 30,
                     device_names=False, keep_host=lambda n: False)
    plan = plan_traces(tmp_path / "t")
    job = dict(busy=None, marker=MARKER, window_marker=None, cache=False, chunk_bytes=4096,
               max_trace_bytes=1 << 30)
    whole = rank_reduction(plan, 0, parsed=parse_source(
        "ascend", path, root=path.parent, chunk_bytes=4096, max_bytes=1 << 30), **job)
    assert _fields(rank_reduction(plan, 0, **job)) == _fields(whole)
    assert whole.device_tasks == 400 + 200  # (pid 2's rows among them)
