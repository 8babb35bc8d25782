"""Real profiler layouts from the field (issue 27): every layout read, or refused clearly.

The fixtures (tests/data/traces/field/, written by make_field_fixtures.py) reproduce real files'
structure; every expected figure comes from `oracle`: stdlib json with Decimal times, the
brief's device-task definitions re-read here, and a plain sort-and-sweep interval union, never
residency's interval code.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from residency.analysis.idle import idle_summary
from residency.traces.load import CACHE_DIR, TraceError, TraceNote, load_traces
from tests.helpers import ROOT, figures, ns, oracle_json, oracle_union
from tests.helpers import idle_cli as cli

FIELD = ROOT / "tests" / "data" / "traces" / "field"
DATA = ROOT / "tests" / "data" / "traces"
SESSION = "localhost.localdomain_2119016_20240124150101123_ascend_pt"

# the brief's device tasks, re-read here: Kineto categories (HTA's list, which adds MTIA's),
# torch-npu Ascend Hardware tasks except waits/records
KINETO_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
NPU_NOT_WORK = {"EVENT_WAIT_SQE", "EVENT_RECORD_SQE", "NOTIFY_WAIT_SQE", "NOTIFY_RECORD_SQE"}


# -- the oracle --------------------------------------------------------------------------------

read_json = oracle_json


union = oracle_union


def length(rows: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in union(rows))


def clip(rows: list[tuple[int, int]], window: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(max(s, a), min(e, b)) for s, e in union(rows) for a, b in window
            if max(s, a) < min(e, b)]


def rank_events(path: Path) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int]]]]:
    """(device tasks, host ranges by name) of one trace file, in absolute ns."""
    doc = read_json(path)
    if isinstance(doc, list):  # torch-npu text export
        lanes = {e["pid"]: e["args"]["name"] for e in doc
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        device, host = [], {}
        for e in doc:
            if e.get("ph") != "X":
                continue
            start = ns(e["ts"])
            row = (start, start + ns(e["dur"]))
            lane = lanes.get(e["pid"])
            if lane == "Ascend Hardware":
                if e["args"].get("Task Type") not in NPU_NOT_WORK:
                    device.append(row)
            elif lane != "Overlap Analysis":
                host.setdefault(e["name"], []).append(row)
        return device, host
    base = int(doc.get("baseTimeNanoseconds", 0))
    device, host = [], {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        start = base + ns(e["ts"])
        row = (start, start + ns(e["dur"]))
        cat = str(e.get("cat", "")).lower()
        if cat in KINETO_DEVICE:
            device.append(row)
        elif cat in ("user_annotation", "cpu_op", "python_function"):
            host.setdefault(e["name"], []).append(row)
    return device, host


def oracle(files: list[Path], window_marker: str | None = None) -> dict[str, object]:
    ranks = [rank_events(f) for f in files]
    every = [r for dev, _ in ranks for r in dev]
    if window_marker is None:
        window = [(min(s for s, _ in every), max(e for _, e in every))]
    else:
        window = union([r for _, host in ranks for name, rows in host.items()
                        if window_marker in name for r in rows])
    measure = sum(e - s for s, e in window)
    return {"window_measure_ns": measure,
            "all_rank_idle_ns": measure - length(clip(every, window)),
            "idle_ns": [measure - length(clip(dev, window)) for dev, _ in ranks],
            "span_idle_ns": [(max(e for _, e in dev) - min(s for s, _ in dev)) - length(dev)
                             if dev else 0 for dev, _ in ranks]}


TRACE_VIEW = FIELD / "npu_loose" / "rank0" / "trace_view.json"
ROCM_FILE = FIELD / "rocm_single" / "worker0.1735632360123.pt.trace.json.gz"
OUTPUT = FIELD / "npu_session" / SESSION / "ASCEND_PROFILER_OUTPUT"
CASES = {  # fixture, its trace files in rank order, window marker
    "rocm_single": (FIELD / "rocm_single", [ROCM_FILE], None),
    "mtia": (FIELD / "mtia", [FIELD / "mtia" / "mtia_rank_0.json.gz"], "ProfilerStep"),
    "cuda_with_et": (FIELD / "cuda_with_et",
                     sorted((FIELD / "cuda_with_et").glob("rank-*.pt.trace.json.gz")), None),
    "npu_loose": (FIELD / "npu_loose", [TRACE_VIEW], "ProfilerStep"),
    "npu_loose_file": (TRACE_VIEW, [TRACE_VIEW], None),
    "npu_output_dir": (OUTPUT, [OUTPUT / "trace_view.json"], None),
    "npu_session": (FIELD / "npu_session", [OUTPUT / "trace_view.json"], "ProfilerStep"),
    "npu_session_dir": (OUTPUT.parent, [OUTPUT / "trace_view.json"], None),
    "rocm_file": (ROCM_FILE,
                  [ROCM_FILE], None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_layout_against_the_oracle(case):
    path, files, marker = CASES[case]
    assert figures(path, window_marker=marker) == oracle(files, marker)


# -- finding 1: a torch-npu trace outside *_ascend_pt/ is torch-npu --------------------------

def test_loose_trace_view_is_read_as_torch_npu_by_its_content(tmp_path):
    """rank0/trace_view.json alone and ASCEND_PROFILER_OUTPUT itself are torch-npu exports
    (an 'Ascend Hardware' process): format ascend, its device tasks busy. Before: read as
    Kineto ('no device tasks', or with --window-marker 100 % idle, exit 0, format kineto)."""
    copy = tmp_path / "copied_off_the_host.json"  # no name hints at all
    shutil.copy(TRACE_VIEW, copy)
    for path in (FIELD / "npu_loose", TRACE_VIEW, copy, OUTPUT):
        out = cli(str(path), "--window-marker", "ProfilerStep", "--json")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["format"] == "ascend" and got["busy_definition"] == "ascend"
        assert got["per_rank"]["0"]["busy_ns"] > 0


def test_loose_trace_view_with_a_window_marker_never_exits_0_as_kineto():
    out = cli(str(FIELD / "npu_loose"), "--window-marker", "ProfilerStep", "--json")
    got = json.loads(out.stdout) if out.returncode == 0 else {"format": None}
    assert not (out.returncode == 0 and got["format"] == "kineto")
    o = oracle([TRACE_VIEW], "ProfilerStep")
    assert got["all_rank_idle_ns"] == o["all_rank_idle_ns"] < o["window_measure_ns"]


def test_the_database_export_outside_a_session_directory():
    db_out = next((DATA / "ascend_real_db").glob("*_1001_*")) / "ASCEND_PROFILER_OUTPUT"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in (db_out, db_out / "ascend_pytorch_profiler_0.db"):
            ts = load_traces(path, cache=False)
            assert ts.format == "ascend" and list(ts.ranks) == [0]
            assert ts.ranks[0].device_tasks > 0


def test_vllm_omni_group_folders_of_loose_exports(tmp_path):
    for rank in (0, 1):
        d = tmp_path / f"diffusion_rank{rank}"
        d.mkdir()
        shutil.copy(TRACE_VIEW, d / "trace_view.json")
    ts = load_traces(tmp_path, cache=False)
    assert ts.format == "ascend" and list(ts.ranks) == [0, 1]


# -- finding 2: one trace without a rank is rank 0 ---------------------------------------------

def test_a_lone_trace_without_a_rank_is_rank_0_with_a_note(tmp_path):
    """The AMD capture (no distributedInfo, a tensorboard file name): rank 0 with a note, as
    HTA reads it. Before: 'cannot tell the rank'. Several unnamed files stay an error."""
    with pytest.warns(TraceNote, match=r"records no rank .*read as rank 0"):
        ts = load_traces(FIELD / "rocm_single", cache=False)
    assert list(ts.ranks) == [0]
    src = ROCM_FILE
    for name in ("worker0.1.pt.trace.json.gz", "worker1.2.pt.trace.json.gz"):
        shutil.copy(src, tmp_path / name)
    with pytest.raises(TraceError, match=r"cannot tell the rank of .*worker0.*worker1"):
        load_traces(tmp_path, cache=False)


def test_distributed_rank_that_contradicts_the_rank_folder_warns(tmp_path):
    src = FIELD / "cuda_with_et" / "rank-1.Apr_03_18_51_38.1103.pt.trace.json.gz"
    (tmp_path / "rank3").mkdir()
    shutil.copy(src, tmp_path / "rank3" / "trace.json.gz")  # distributedInfo.rank is 1
    with pytest.warns(UserWarning, match=r"distributedInfo.rank is 1 but its path names "
                                         r"rank 3; rank 1 is used"):
        assert list(load_traces(tmp_path, cache=False).ranks) == [1]


# -- finding 3: busy definitions apply to a format or are refused --------------------------

@pytest.mark.parametrize(("path", "busy"), [(DATA / "kineto_basic", "msprof"),
                                            (DATA / "kineto_basic", "ascend"),
                                            (FIELD / "npu_loose", "kineto")])
def test_a_busy_definition_for_another_format_is_refused(path, busy):
    """Before: `--busy msprof` on Kineto said 'compute and communication' and counted memcpy
    and memset."""
    out = cli(str(path), "--busy", busy)
    assert out.returncode == 2 and out.stdout == ""
    assert f"--busy {busy} does not apply to" in out.stderr and "Traceback" not in out.stderr


# -- finding 4: other accelerators' device tasks -------------------------------------------

def test_mtia_device_tasks_are_busy():
    """mtia_ccp_events are MTIA's on-device tasks (Kineto ActivityType.h; HTA counts them).
    Before: 'no device tasks', and with a window marker 100 % idle, exit 0."""
    s = figures(FIELD / "mtia", window_marker="ProfilerStep")
    assert s["all_rank_idle_ns"] < s["window_measure_ns"]


@pytest.mark.parametrize("flags", [(), ("--window-marker", "ProfilerStep")])
def test_host_activity_only_is_refused_unless_asked(flags):
    out = cli(str(FIELD / "cpu_only_gloo"), *flags)
    assert out.returncode == 2 and "no device task recognised" in out.stderr
    assert "--allow-no-device-tasks" in out.stderr
    ok = cli(str(FIELD / "cpu_only_gloo"), "--window-marker", "ProfilerStep", "--json",
             "--allow-no-device-tasks")
    got = json.loads(ok.stdout)
    assert ok.returncode == 0 and got["all_rank_idle_ns"] == got["window_measure_ns"] > 0


def test_host_activity_only_asked_for_is_idle_over_what_the_ranks_recorded(tmp_path):
    """The refusal's advice alone (`--allow-no-device-tasks`) reports: the window is the
    ranks' recorded span, all of it idle. Before: refused again, asking for --window-marker."""
    from residency.traces.load import timeline_span

    out = cli(str(FIELD / "cpu_only_gloo"), "--allow-no-device-tasks", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spans = [timeline_span(t) for t in load_traces(FIELD / "cpu_only_gloo",
                                                       cache=False).ranks.values()]
    window = [min(s for s, _ in spans), max(e for _, e in spans)]
    assert got["window_ns"] == window and got["window_measure_ns"] == window[1] - window[0]
    assert got["all_rank_idle_ns"] == got["window_measure_ns"] > 0
    assert all(r["busy_ns"] == 0 for r in got["per_rank"].values())
    text = cli(str(FIELD / "cpu_only_gloo"), "--allow-no-device-tasks")
    assert "no busy device task: earliest to latest event recorded" in text.stdout


# -- finding 5: files that are not traces -----------------------------------------------------

def test_files_that_are_not_traces_are_skipped_not_fatal():
    """An execution trace and a memory timeline beside the Kineto files are listed as
    skipped. Before: the execution trace made the whole directory fail."""
    with pytest.warns(TraceNote) as notes:
        ts = load_traces(FIELD / "cuda_with_et", cache=False)
    assert list(ts.ranks) == [0, 1]
    text = " ".join(str(n.message) for n in notes)
    assert "skipped" in text and "pytorch_et execution trace" in text
    assert "memory timeline export" in text


def test_nothing_but_non_traces_is_an_error_that_lists_them(tmp_path):
    shutil.copy(FIELD / "cuda_with_et" / "benchmark_simple_add_et.json.gz", tmp_path)
    with pytest.raises(TraceError, match=r"no traces found.*skipped: .*"
                                         r"benchmark_simple_add_et.json.gz: a pytorch_et"):
        load_traces(tmp_path, cache=False)


def test_kernel_details_only_is_not_supported():
    """Before: 'was the profile parsed?' (it was: the layout is not supported)."""
    for path in (FIELD / "npu_summaries_only",
                 next((FIELD / "npu_summaries_only").iterdir()) / "ASCEND_PROFILER_OUTPUT"):
        with pytest.raises(TraceError, match=r"holds kernel_details.csv but no "
                                             r"trace_view.json.*not supported"):
            load_traces(path, cache=False)


# -- finding 6 / deliverable 5: the CLI ----------------------------------------------------

def test_a_closed_stdout_ends_quietly():
    """`residency idle ... | head -3`: the reader is gone before anything is written. Before:
    'error: Broken pipe', exit 2 (the bad-input code)."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = cli(str(DATA / "kineto_basic"), stdout=write)
    finally:
        os.close(write)
    assert out.returncode in (0, 141), out.stderr
    assert "Broken pipe" not in out.stderr and "Traceback" not in out.stderr
    assert "error" not in out.stderr


def test_json_holds_every_figure_and_the_warnings():
    out = cli(str(FIELD / "rocm_single"), "--json")
    got = json.loads(out.stdout)
    o = oracle(CASES["rocm_single"][1])
    assert got["window_measure_ns"] == o["window_measure_ns"]
    assert got["per_rank"]["0"]["span_idle_ns"] == o["span_idle_ns"][0]
    assert isinstance(got["warnings"], list)
    assert any("read as rank 0" in w for w in got["warnings"])
    npu = json.loads(cli(str(FIELD / "npu_loose"), "--json").stdout)
    assert npu["per_rank"]["0"]["unknown_tasks"] == {"Other": 5}


def test_errors_name_the_options_as_typed():
    out = cli(str(DATA / "kineto_basic"), "--window-marker", "no-such-range")
    assert out.returncode == 2 and "--window-marker" in out.stderr
    assert "window_marker" not in out.stderr
    bad = cli(str(DATA / "kineto_basic"), "--marker", "(")
    assert bad.returncode == 2 and "--marker must be a regular expression" in bad.stderr


def test_task_types_the_trace_counts_busy_do_not_warn():
    """torch-npu's 'Other' (most AI-core tasks of the real trace) lies inside the trace's own
    Overlap Analysis Computing slices: counted busy, reported in --json, never warned."""
    out = cli(str(FIELD / "npu_loose"))
    assert out.returncode == 0 and "warning" not in out.stderr


# -- deliverable 4: torch-npu's own figures as cross-checks ------------------------------------

def test_step_trace_time_agrees_per_step():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = idle_summary(load_traces(FIELD / "npu_session", cache=False))
    steps = s.per_rank[0].steps
    assert [c.step for c in steps] == ["1", "2"]
    for c in steps:
        assert (c.computing_ns, c.free_ns) == (c.reported_computing_ns, c.reported_free_ns)
    # the oracle: step 1's range is its kernels' (kernel_details.csv), Computing the union of
    # its compute tasks, Free the gaps that start in it
    dev, _ = rank_events(OUTPUT / "trace_view.json")
    step1 = [(s_, e) for s_, e in union(dev) if s_ < steps[0].window[1]]
    assert steps[0].computing_ns == length(step1)


def test_step_trace_time_disagreement_is_warned_quoting_both(tmp_path):
    d = Path(shutil.copytree(FIELD / "npu_session", tmp_path / "s",
                             ignore=shutil.ignore_patterns(CACHE_DIR)))
    csv_path = next(d.glob("*/ASCEND_PROFILER_OUTPUT/step_trace_time.csv"))
    lines = csv_path.read_text().splitlines()
    cells = lines[2].split(",")
    cells[5] = "300.000"  # step 2's Free: 262.532 us in the trace
    csv_path.write_text("\n".join([*lines[:2], ",".join(cells)]) + "\n")
    with pytest.warns(UserWarning, match=r"rank 0: torch-npu's own figures differ by more "
                                         r"than 1 %: step 2 Free 0\.300000 ms in "
                                         r"step_trace_time.csv vs 0\.262532 ms here"):
        idle_summary(load_traces(d, cache=False))


def test_profiler_rank_that_contradicts_the_rank_folder_warns(tmp_path):
    session = next((DATA / "ascend_basic").glob("host_101_*"))  # profiler_info_1.json
    shutil.copytree(session, tmp_path / "rank4" / session.name,
                    ignore=shutil.ignore_patterns(CACHE_DIR))
    with pytest.warns(UserWarning, match=r"the profiler recorded rank 1 but it lies in a "
                                         r"rank4 folder; rank 1 is used"):
        assert list(load_traces(tmp_path, cache=False).ranks) == [1]


def test_a_database_export_under_another_name_is_read_by_its_header(tmp_path):
    """A renamed database is still torch-npu's (its SQLite header and tables); its rank comes
    from its own RANK_DEVICE_MAP when neither its name nor a folder gives one."""
    db = next((DATA / "ascend_real_db").glob("*_1002_*")) / "ASCEND_PROFILER_OUTPUT"
    renamed = tmp_path / "profile.sqlite"
    shutil.copy(db / "ascend_pytorch_profiler_1.db", renamed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = load_traces(renamed, cache=False)
    assert ts.format == "ascend" and list(ts.ranks) == [1] and ts.ranks[1].device_tasks > 0


def test_an_object_document_naming_the_npu_process_is_torch_npu(tmp_path):
    events = json.loads(TRACE_VIEW.read_text())
    events.sort(key=lambda e: e["ph"] != "M")  # the process names first
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "trace.json").write_text(json.dumps({"traceEvents": events}))
    ts = load_traces(tmp_path, cache=False)
    assert ts.format == "ascend" and ts.ranks[0].device_tasks == 7


@pytest.mark.parametrize("option", ["--marker", "--window-marker"])
def test_a_pattern_with_braces_is_named_not_formatted(option):
    """User text inside an option's error is never run through str.format."""
    out = cli(str(DATA / "kineto_basic"), option, "(a{2}{option}{0}")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{option} must be a regular expression" in out.stderr
    assert "(a{2}{option}{0}" in out.stderr


def test_two_loose_exports_of_one_rank_are_listed_by_their_own_names(tmp_path):
    (tmp_path / "rank0").mkdir()
    for name in ("trace_view.json", "trace_view_again.json"):
        shutil.copy(TRACE_VIEW, tmp_path / "rank0" / name)
    with pytest.raises(TraceError, match=r"rank 0 has 2 profiling sessions \(\[0\] "
                                         r"trace_view.json .*\[1\] trace_view_again.json"):
        load_traces(tmp_path, cache=False)
    with pytest.raises(TraceError, match="cannot tell the rank of .*trace_view.json, "
                                         ".*trace_view_again.json"):
        load_traces(tmp_path / "rank0", cache=False)  # the root's own name is no rank


@pytest.mark.parametrize("marker", ["no_such_marker", "ProfilerStep#999"])
def test_a_marker_that_matches_nothing_is_said(marker):
    """A mistyped --marker gave 0 ms of marker time with no word (a --window-marker that
    matches nothing is refused)."""
    out = cli(str(FIELD / "cpu_only_gloo"), "--window-marker", "ProfilerStep", "--json",
              "--allow-no-device-tasks", "--marker", marker)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["marker_ns"] == 0
    said = [w for w in got["warnings"] if "matches no host range" in w]
    assert len(said) == 1 and repr(marker) in said[0] and repr(marker) in out.stderr
    hit = json.loads(cli(str(FIELD / "cpu_only_gloo"), "--window-marker", "ProfilerStep",
                         "--json", "--allow-no-device-tasks", "--marker", "ProfilerStep").stdout)
    assert hit["marker_ns"] > 0 and not [w for w in hit["warnings"] if "matches no" in w]


# -- ranks missing from the job their traces name ---------------------------------------------

def _job_of(tmp_path: Path, world: int, ranks: list[int]) -> Path:
    """kineto_basic's rank 0 trace as `ranks` of a job of `world` ranks (distributedInfo)."""
    doc = json.loads((DATA / "kineto_basic" / "rank0.trace.json").read_text())
    d = tmp_path / "job"
    d.mkdir(parents=True)
    for r in ranks:
        doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": world}
        (d / f"rank{r}.trace.json").write_text(json.dumps(doc))
    return d


def _warned(fn, *args, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args, **kwargs)
    return [str(w.message) for w in caught if "world_size" in str(w.message)]


@pytest.mark.parametrize("how", ["load", "rank by rank", "in parts", "cached"])
def test_ranks_missing_from_the_job_are_said(tmp_path, how, monkeypatch):
    """2 of a job's 8 ranks gave 'all-rank' figures of 2 ranks without a word."""
    from residency.analysis.idle import idle_summary_at

    monkeypatch.setenv("RESIDENCY_CACHE_DIR", str(tmp_path / "cache"))
    ranks = [3] if how == "in parts" else [0, 1, 2, 5]
    d = _job_of(tmp_path, 8, ranks)
    if how == "load":
        said = _warned(load_traces, d, cache=False)
    elif how == "rank by rank":
        said = _warned(idle_summary_at, d, cache=False, workers=1)
    elif how == "in parts":  # one file: its parts parsed in worker processes, then joined
        from residency.traces import load as traces_load

        joined = []
        join = traces_load.join_parts
        monkeypatch.setattr(traces_load, "PART_MIN_BYTES", 256)
        monkeypatch.setattr(traces_load, "join_parts", lambda *a: joined.append(1) or join(*a))
        said = _warned(load_traces, d, cache=False, workers=2, chunk_bytes=256)
        assert joined == [1]
    else:
        _warned(idle_summary_at, d, workers=1)  # records the entries
        said = _warned(idle_summary_at, d, workers=1)
    assert len(said) == 1, said
    assert (f"world_size is 8 but {len(ranks)} rank(s) were read "
            f"({'3; 7' if how == 'in parts' else '0-2, 5; 4'} of ranks 0-7 missing)") in said[0]


def test_the_whole_job_or_no_world_size_is_not_a_warning(tmp_path):
    from residency.analysis.idle import idle_summary_at

    whole = _job_of(tmp_path / "a", 3, [0, 1, 2])
    assert _warned(load_traces, whole, cache=False) == []
    assert _warned(idle_summary_at, whole, cache=False) == []
    # no distributedInfo at all (ranks from the file names): nothing to check against
    doc = json.loads((DATA / "kineto_basic" / "rank0.trace.json").read_text())
    doc.pop("distributedInfo", None)
    bare = tmp_path / "b"
    bare.mkdir()
    for r in (0, 3):
        (bare / f"rank{r}.trace.json").write_text(json.dumps(doc))
    assert _warned(load_traces, bare, cache=False) == []


def test_traces_of_different_world_sizes_are_said(tmp_path):
    d = _job_of(tmp_path, 2, [0, 1])
    doc = json.loads((d / "rank1.trace.json").read_text())
    doc["distributedInfo"]["world_size"] = 4
    (d / "rank1.trace.json").write_text(json.dumps(doc))
    (said,) = _warned(load_traces, d, cache=False)
    assert "different world sizes (distributedInfo.world_size 2, 4)" in said


def test_a_huge_recorded_world_size_is_said_without_listing_it(tmp_path):
    """distributedInfo.world_size is untrusted: its ranks are counted, never listed (a set of
    every rank of the job: gigabytes for 2**31 - 1)."""
    import tracemalloc

    from residency.traces.load import check_world

    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_world(tmp_path, {0: 10**7, 5: 10**7})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (said,) = [str(w.message) for w in caught]
    assert "2 rank(s) were read (0, 5; 9999998 of ranks 0-9999999 missing)" in said
    assert peak < 1 << 20  # bytes: nothing the size of the job
    d = _job_of(tmp_path, 2**31 - 1, [0, 1])
    (said,) = _warned(load_traces, d, cache=False)
    assert "2147483645 of ranks 0-2147483646 missing" in said
