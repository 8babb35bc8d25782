"""Loading Kineto and torch-npu traces: exact times, ranks, rejection, errors, cache."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from residency.records.client import CLIENT
from residency.records.manifest import MANIFEST
from residency.traces import units
from residency.traces.load import TraceError, load_traces
from tests.helpers import copy_fixture, same_traces

DATA = Path(__file__).parent.parent / "data" / "traces"
BASE = 1_764_500_000_000_000_000
EPOCH_NS = 1_764_500_000_000_000_000


def write_kineto(path: Path, events: list, *, rank: int | None = None, base: int | None = BASE,
                 gz: bool = False) -> Path:
    doc: dict = {"traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 8}
    raw = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def kernel(ts, dur, cat="kernel", name="k", ph="X") -> dict:
    return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur}


def test_kineto_fixture_device_tasks_and_ranges():
    ts = load_traces(DATA / "kineto_basic", cache=False)
    assert ts.format == "kineto" and list(ts.ranks) == [0, 1]
    r0, r1 = ts.ranks[0], ts.ranks[1]
    assert r0.source.name == "rank0.trace.json" and r1.source.name == "rank1.trace.json.gz"
    assert (r0.device - BASE).tolist() == [          # sorted by start, overlaps kept
        [100_000, 150_000], [120_501, 130_501], [200_000, 225_500], [300_250, 300_250],
        [400_000, 500_000]]
    assert (r1.device - BASE).tolist() == [[120_000, 160_000], [240_000, 300_000],
                                            [450_000, 550_000]]
    assert r0.device.dtype == np.int64 and r0.device_tasks == 5
    assert (r0.rejected_events, r1.rejected_events, ts.rejected_events) == (3, 0, 3)
    assert r0.range_names.tolist() == ["aten::empty", "residency.phase[prepare]",
                                       "residency.release[normal]"]
    assert (r0.ranges - BASE).tolist() == [[10_000, 15_000], [50_000, 450_000],
                                           [150_000, 250_000]]
    frame = r0.ranges_frame()
    assert list(frame.columns) == ["name", "start_ns", "end_ns"]
    assert frame["name"].tolist() == r0.range_names.tolist()
    assert not r0.device.flags.writeable  # a frozen timeline's arrays are read-only too


def test_epoch_microsecond_numbers_are_exact_to_the_nanosecond():
    ts = load_traces(DATA / "kineto_epoch" / "trace_rank3.json", cache=False)
    assert list(ts.ranks) == [3]  # rank from the file name
    assert ts.ranks[3].device.tolist() == [[1_764_500_000_123_456_789, 1_764_500_000_123_459_289],
                                           [1_764_500_000_123_460_000, 1_764_500_000_123_461_000]]


def test_ascend_fixture():
    ts = load_traces(DATA / "ascend_basic", cache=False)
    assert ts.format == "ascend" and list(ts.ranks) == [0, 1]
    r0 = ts.ranks[0]
    assert r0.source.name == "trace_view.json"
    # "…100.251" as float64 would read …100.25: the string is parsed exactly
    assert (r0.device - EPOCH_NS).tolist() == [[100_251, 150_751], [200_000, 230_000]]
    assert (ts.ranks[1].device - EPOCH_NS).tolist() == [[120_000, 180_000], [190_500, 200_000]]
    names = set(r0.range_names)  # Python and CANN processes; not Overlap Analysis
    assert names == {"residency.release[normal]", "AscendCL@aclnnMatmul"}
    assert "Computing" not in set(ts.ranks[1].range_names)


def write_ascend(d: Path, rank: int, text: str) -> Path:
    """A torch-npu tree whose trace_view.json is `text` (an array of events)."""
    (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (d / f"profiler_info_{rank}.json").write_text("{}")
    (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(text)
    return d


def test_ascend_numeric_epoch_times_are_exact(tmp_path):
    meta = '{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "Ascend Hardware"}}'
    write_ascend(tmp_path / "h_1_ascend_pt", 0, f"""[{meta},
        {{"ph": "X", "name": "a", "pid": 7, "ts": 1764500000000100.251, "dur": 2.5}},
        {{"ph": "X", "name": "b", "pid": 7, "ts": 1764500000000200, "dur": 1}},
        {{"ph": "X", "name": "c", "pid": 7, "ts": "soon", "dur": 1}},
        {{"ph": "X", "name": "d", "pid": 7, "ts": "1764500000000300.5", "dur": -1}},
        {{"ph": "X", "name": "e", "pid": 8, "ts": "1764500000000090", "dur": 1}}]""")
    t = load_traces(tmp_path, cache=False).ranks[0]
    assert (t.device - EPOCH_NS).tolist() == [[100_251, 102_751], [200_000, 201_000]]
    assert t.rejected_events == 2
    assert t.range_names.tolist() == ["e"]  # a process without a name is a host process


def test_zero_with_a_large_exponent_is_zero(tmp_path):
    # "0E20" is 0 (hypothesis's regex of numbers found it: the event was refused as out of range)
    assert [units.decimal_us_to_ns(t) for t in ("0E20", "-0.000E25", "0E999999999")] == [0] * 3
    meta = '{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "Ascend Hardware"}}'
    write_ascend(tmp_path / "h_1_ascend_pt", 0, f"""[{meta},
        {{"ph": "X", "name": "a", "pid": 7, "ts": "1764500000000000.000", "dur": "0E20"}},
        {{"ph": "X", "name": "b", "pid": 7, "ts": "0e30", "dur": 1}}]""")
    t = load_traces(tmp_path, cache=False).ranks[0]
    assert t.device.tolist() == [[0, 1000], [EPOCH_NS, EPOCH_NS]] and t.rejected_events == 0


def test_run_directory_with_trace_subdir(tmp_path):
    run = tmp_path / "runs" / "00-baseline"
    copy_fixture("kineto_basic", run)
    (run / "kineto_basic").rename(run / "trace")
    (run / CLIENT).write_text("{}")
    assert list(load_traces(run, cache=False).ranks) == [0, 1]


def test_run_directory_of_several_runs_is_refused(tmp_path):
    for arm in ("00-baseline", "01-candidate"):
        shutil.copytree(DATA / "kineto_basic", tmp_path / "runs" / arm / "trace")
    (tmp_path / MANIFEST).write_text("{}")
    with pytest.raises(TraceError, match=r"traces of 2 runs \(runs/00-baseline, "):
        load_traces(tmp_path, cache=False)
    shutil.rmtree(tmp_path / "runs" / "01-candidate")
    assert list(load_traces(tmp_path, cache=False).ranks) == [0, 1]  # the only run


def test_kineto_array_format_and_fast_exact_paths_agree(tmp_path):
    floats = [kernel(10.25, 2.5), kernel(3, 1)]
    strings = [kernel("10.250", "2.5"), kernel("3", 1)]
    a = write_kineto(tmp_path / "a" / "rank0.json", floats)
    b = write_kineto(tmp_path / "b" / "rank0.json", strings)
    c = tmp_path / "c" / "rank0.json"
    c.parent.mkdir()
    c.write_text(json.dumps([kernel(10.25 + BASE / 1000 * 0, 2.5), kernel(3, 1)]))
    got = [load_traces(p, cache=False).ranks[0].device for p in (a, b)]
    assert (got[0] - BASE).tolist() == (got[1] - BASE).tolist() == [[3000, 4000],
                                                                     [10_250, 12_750]]
    assert load_traces(c, cache=False).ranks[0].device.tolist() == [[3000, 4000],
                                                                    [10_250, 12_750]]


@dataclass
class Case:
    name: str
    event: dict
    rejected: int
    device: list = field(default_factory=list)  # relative to BASE


CASES = [
    Case("negative dur", kernel(5, -1), 1),
    Case("non-numeric ts", kernel("soon", 1), 1),
    Case("boolean ts", kernel(True, 1), 1),
    Case("missing ts", {"ph": "X", "cat": "kernel", "name": "k", "dur": 1}, 1),
    Case("missing dur", {"ph": "X", "cat": "kernel", "name": "k", "ts": 1}, 1),
    Case("nan string ts", kernel("nan", 1), 1),
    Case("object dur", kernel(5, {"us": 1}), 1),
    Case("exponent string", kernel("1e3", 1), 0, [[1_000_000, 1_001_000]]),
    Case("ten fraction digits", kernel("1.0000000006", 1), 0, [[1000, 2000]]),
    Case("half a ns rounds away from zero", kernel("2.0005", "0.0015"), 0, [[2001, 2003]]),
    Case("zero dur kept", kernel(4, 0), 0, [[4000, 4000]]),
    Case("cuda_sync excluded", kernel(1, 1, cat="cuda_sync"), 0),
    Case("gpu_user_annotation excluded", kernel(1, 1, cat="gpu_user_annotation"), 0),
    Case("GPU_MEMSET any case", kernel(1, 1, cat="GPU_MEMSET"), 0, [[1000, 2000]]),
    Case("not a complete event", kernel(1, 1, ph="B"), 0),
    Case("odd phase and category types", {**kernel("1", 1, ph=["X"]), "cat": ["kernel"]}, 0),
    Case("unknown phase", kernel(1, 1, ph="Z"), 0),
    Case("rejected host range", kernel(1, -2, cat="user_annotation"), 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_event_rejection_table(tmp_path, case):
    anchor = kernel(0, 10_000)  # keeps one device task in every trace
    path = write_kineto(tmp_path / "rank0.json", [anchor, case.event])
    t = load_traces(path, cache=False).ranks[0]
    assert t.rejected_events == case.rejected
    assert (t.device[1:] - BASE).tolist() == case.device
    assert (t.device[0] - BASE).tolist() == [0, 10_000_000]


plain = st.from_regex(r"-?[0-9]{1,19}(\.[0-9]{1,6})?", fullmatch=True)
fixed = st.tuples(st.integers(-(10**17), 10**17), st.integers(0, 999)).map(
    lambda p: f"{p[0]:018d}.{p[1]:03d}")  # one layout: the matrix path


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(plain | st.text(max_size=5), max_size=6), st.lists(fixed, max_size=6)))
def test_decimal_text_parser_agrees_with_decimal(values):
    ns, ok = units.decimal_text_to_ns(values)
    assert [int(v) if k else None for v, k in zip(ns, ok, strict=True)] == [
        units.decimal_us_to_ns(v) for v in values]


def test_truncated_json_names_file_and_position(tmp_path):
    good = write_kineto(tmp_path / "rank0.json", [kernel(1, 1)])
    bad = tmp_path / "rank1.json"
    bad.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(TraceError) as err:
        load_traces(tmp_path, cache=False)
    assert err.value.path == bad and err.value.position == bad.stat().st_size
    assert "rank1.json" in str(err.value) and "truncated" in str(err.value)


def test_invalid_json_names_byte_position(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X",, "ts": 1}]}')
    with pytest.raises(TraceError, match=r"rank0\.json \(at byte 28\): invalid JSON"):
        load_traces(tmp_path, cache=False)


def test_broken_gzip(tmp_path):
    path = write_kineto(tmp_path / "rank0.json.gz", [kernel(1, 1)], gz=True)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(TraceError, match="rank0.json.gz"):
        load_traces(tmp_path, cache=False)


def test_not_a_trace(tmp_path):
    (tmp_path / "rank0.json").write_text('{"hello": 1}')
    with pytest.raises(TraceError, match="JSON without traceEvents"):
        load_traces(tmp_path, cache=False)


def test_duplicate_rank_names_both_files(tmp_path):
    a = write_kineto(tmp_path / "a.json", [kernel(1, 1)], rank=2)
    b = write_kineto(tmp_path / "b.json", [kernel(1, 1)], rank=2)
    with pytest.raises(TraceError, match="rank 2 appears twice") as err:
        load_traces(tmp_path, cache=False)
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_unknown_rank_lists_the_files(tmp_path):
    write_kineto(tmp_path / "x.json", [kernel(1, 1)])
    write_kineto(tmp_path / "y.json", [kernel(1, 1)])
    with pytest.raises(TraceError, match=r"cannot tell the rank of .*x\.json.*y\.json"):
        load_traces(tmp_path, cache=False)


def test_both_formats_and_nothing_are_errors(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_traces(tmp_path / "missing")
    with pytest.raises(TraceError, match="no traces found"):
        load_traces(tmp_path)
    copy_fixture("ascend_basic", tmp_path)
    write_kineto(tmp_path / "rank0.json", [kernel(1, 1)])
    with pytest.raises(TraceError, match="both Kineto files"):
        load_traces(tmp_path)


def test_ascend_without_trace_view_or_rank(tmp_path):
    d = copy_fixture("ascend_basic", tmp_path)
    one = sorted(d.iterdir())[0]
    (one / "profiler_info_0.json").unlink()
    with pytest.raises(TraceError, match="cannot tell the rank of .*host_100"):
        load_traces(d, cache=False)
    (one / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").unlink()
    with pytest.raises(TraceError, match="no ASCEND_PROFILER_OUTPUT/trace_view.json"):
        load_traces(d, cache=False)


def test_ascend_rank_from_vllm_omni_directory_name(tmp_path):
    d = copy_fixture("ascend_basic", tmp_path)
    for i, sub in enumerate(sorted(d.iterdir())):
        (sub / f"profiler_info_{i}.json").unlink()
        (d / f"diffusion_rank{5 + i}").mkdir()
        sub.rename(d / f"diffusion_rank{5 + i}" / sub.name)
    assert list(load_traces(d, cache=False).ranks) == [5, 6]


def test_kineto_rank_never_from_a_host_name(tmp_path):
    """Kineto's default file name is <host>_<pid>.<time>.pt.trace.json: a host called
    gpu-rank7-a (or gpu-rank7) names no rank; distributedInfo.rank, or a path component named
    exactly [<group>_]rank<N> below the given path, does."""
    host = tmp_path / "host"
    write_kineto(host / "gpu-rank7-a_12345.1764500000000.pt.trace.json", [kernel(1, 1)])
    write_kineto(host / "gpu-rank7_12346.1764500000000.pt.trace.json", [kernel(1, 1)])
    with pytest.raises(TraceError, match=r"cannot tell the rank of .*gpu-rank7-a_12345.*"
                                         r"no distributedInfo\.rank"):
        load_traces(host, cache=False)
    named = tmp_path / "named"
    write_kineto(named / "gpu-rank7-a_12345.1764500000000.pt.trace.json", [kernel(1, 1)],
                 rank=2)  # the trace's own rank wins over anything in the path
    write_kineto(named / "diffusion_rank4" / "gpu-rank7-a_12346.1.pt.trace.json",
                 [kernel(1, 1)])  # a rank folder below the root
    write_kineto(named / "trace_rank5.json.gz", [kernel(1, 1)], gz=True)  # vLLM-Omni's name
    write_kineto(named / "gpu-rank7-a" / "rank6.trace.json", [kernel(1, 1)])
    assert list(load_traces(named, cache=False).ranks) == [2, 4, 5, 6]
    inside = tmp_path / "rank9" / "gpu-rank7-a_1.pt.trace.json"
    write_kineto(inside, [kernel(1, 1)])
    write_kineto(tmp_path / "rank9" / "gpu-rank7-a_2.pt.trace.json", [kernel(1, 1)])
    with pytest.raises(TraceError, match="cannot tell the rank"):  # the root's own name: no
        load_traces(tmp_path / "rank9", cache=False)


def test_vllm_omni_kineto_groups_are_chosen_with_group(tmp_path):
    """vLLM-Omni on CUDA writes Kineto files per process group (diffusion_rank<N>/ beside
    stage<K>_rank<N>/): several groups need --group, which loads that group's ranks only."""
    for group, offset in (("diffusion", 0), ("stage0", 100)):
        for rank in (0, 1):
            write_kineto(tmp_path / f"{group}_rank{rank}" / "host_1.pt.trace.json",
                         [kernel(offset + 1, 1 + rank)])
    with pytest.raises(TraceError, match=r"several process groups: 'diffusion' \(2 files\), "
                                         r"'stage0' \(2 files\); choose one with --group"):
        load_traces(tmp_path, cache=False)
    ts = load_traces(tmp_path, cache=False, group="stage0")
    assert list(ts.ranks) == [0, 1]
    assert all("stage0_rank" in str(t.source) for t in ts.ranks.values())
    durations = [int(t.device[0][1] - t.device[0][0]) for t in ts.ranks.values()]
    assert durations == [1_000, 2_000]  # rank r's task lasts 1 + r us
    starts = {int(t.device[0][0]) for t in ts.ranks.values()}
    plain = load_traces(tmp_path, cache=False, group="diffusion")
    assert {s - 100_000 for s in starts} == {int(t.device[0][0]) for t in plain.ranks.values()}
    with pytest.raises(TraceError, match=r"no group 'vae'; the groups are: 'diffusion', "
                                         r"'stage0'"):
        load_traces(tmp_path, cache=False, group="vae")


def test_rank_without_device_tasks_warns(tmp_path):
    write_kineto(tmp_path / "rank0.json", [kernel(1, 1)])
    write_kineto(tmp_path / "rank1.json", [kernel(1, 1, cat="user_annotation", name="m")])
    with pytest.warns(UserWarning, match="rank 1 .* has no device tasks"):
        ts = load_traces(tmp_path, cache=False)
    assert ts.ranks[1].device.shape == (0, 2)


def test_ranks_that_do_not_overlap_are_an_error(tmp_path):
    write_kineto(tmp_path / "rank0.json", [kernel(1, 1)])
    write_kineto(tmp_path / "rank1.json", [kernel(1, 1)], base=BASE + 10**12)
    with pytest.raises(TraceError, match="do not overlap"):
        load_traces(tmp_path, cache=False)


def test_trace_error_survives_pickling():
    err = pickle.loads(pickle.dumps(TraceError("/x/rank0.json", "truncated", 12)))
    assert (err.path, err.message, err.position) == (Path("/x/rank0.json"), "truncated", 12)
    assert isinstance(err, ValueError) and str(err) == "/x/rank0.json (at byte 12): truncated"


def _three_ranks(d: Path) -> Path:
    for r in range(3):
        write_kineto(d / f"rank{r}.json",
                     [kernel(i * 3.5 + r, 2.25) for i in range(200)] +
                     [kernel(f"{i}.5", 1, cat="user_annotation", name=f"m{i % 3}")
                      for i in range(20)])
    return d


def test_parallel_parse_matches_sequential(tmp_path):
    d = _three_ranks(tmp_path)
    same_traces(load_traces(d, cache=False, workers=2), load_traces(d, cache=False, workers=1))


def test_parallel_parse_with_threads_alive_uses_fresh_processes(tmp_path):
    d = _three_ranks(tmp_path)
    release = threading.Event()
    other = threading.Thread(target=release.wait)  # as in a notebook kernel: no fork then
    other.start()
    try:
        got = load_traces(d, cache=False, workers=2)
    finally:
        release.set()
        other.join()
    same_traces(got, load_traces(d, cache=False, workers=1))


@pytest.mark.parametrize("threads", [False, True], ids=["forked", "spawned"])
def test_parse_workers_keep_their_heap_and_the_caller_keeps_its_own(threads):
    from residency.traces import parallel

    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError, AttributeError):
        glibc = False
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    if threads:  # a process with threads spawns its workers: the setting is not inherited
        other.start()
    try:
        with parallel.process_pool(2) as pool:
            kept = {pool.submit(parallel.heap_kept).result() for _ in range(4)}
    finally:
        release.set()
        if threads:
            other.join()
    assert kept == {glibc}
    assert not parallel.heap_kept()  # this process's allocator is left as it was


@pytest.mark.parametrize("exact", [False, True], ids=["fast path", "exact path"])
def test_host_range_names_of_any_type(tmp_path, exact):
    ts = "1.5" if exact else 1.5  # a string time sends the file down the exact path
    events = [kernel(0, 10), kernel(ts, 1, cat="cpu_op", name=5),
              {"ph": "X", "cat": "cpu_op", "ts": 2, "dur": 1},
              kernel(3, 1, cat="python_function", name="caf\u00e9")]
    t = load_traces(write_kineto(tmp_path / "rank0.json", events), cache=False).ranks[0]
    assert t.range_names.tolist() == ["5", "", "caf\u00e9"]


