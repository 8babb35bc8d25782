"""The trace cache lives in the user's cache directory and never beside the traces; entries
are keyed by content; the per-rank reduction path (`idle_summary_at`, `residency idle`) gives
the figures of the whole-timeline path to the nanosecond, here and on a Dask LocalCluster."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from residency.analysis import idle
from residency.analysis.idle import idle_summary, idle_summary_at
from residency.cli import main as cli
from residency.traces import cache as tracecache
from residency.traces import load as traces
from residency.traces import parallel
from residency.traces.load import CACHE_DIR, TraceError, load_traces
from tests.helpers import MARKER, PAIRED, ROOT, copy_fixture, many_ranks, run_cli, same_traces

DATA = Path(__file__).parent.parent / "data" / "traces"


def tree(d: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under `d` with its size, mtime_ns and (files) content."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns,
                                      p.read_bytes() if p.is_file() else b"")
    return out


def entries() -> list[Path]:
    d = tracecache.cache_dir()
    return sorted(d.glob("*.entry")) if d.is_dir() else []


OPTIONS = [dict(marker=MARKER), dict(marker="release", window_marker="residency.release"),
           dict(busy="all"), dict(busy="msprof", marker="Hccl|release")]


@pytest.mark.parametrize("fixture", ["kineto_basic", "ascend_basic", "ascend_real",
                                     "ascend_real_db"])
@pytest.mark.parametrize("options", OPTIONS, ids=range(len(OPTIONS)))
def test_rank_by_rank_equals_the_whole_timeline_path(tmp_path, fixture, options):
    d = copy_fixture(fixture, tmp_path)
    try:
        whole = idle_summary(load_traces(d, cache=False), **options)
    except ValueError as exc:  # the same refusal on both paths
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            idle_summary_at(d, cache=False, **options)
        return
    for kwargs in (dict(cache=False), dict(cache=False, workers=2), dict(cache=True),
                   dict(cache=True)):
        assert idle_summary_at(d, **kwargs, **options) == whole


def test_rank_by_rank_on_many_ranks_and_the_same_errors(tmp_path):
    d = many_ranks(tmp_path / "t", 4)
    whole = idle_summary(load_traces(d, cache=False), marker=MARKER)
    assert whole.marker_idle_intersection_ns > 0 and whole.ranks == (0, 1, 2, 3)
    assert idle_summary_at(d, marker=MARKER, workers=2, cache=False) == whole
    assert idle_summary_at(d, marker=MARKER, workers=3) == whole  # records entries
    assert idle_summary_at(d, marker=MARKER, workers=3) == whole  # reads them
    # a rank named twice: the same error on both paths
    doc = json.loads((d / "rank0" / "trace.json").read_text())
    doc["distributedInfo"]["rank"] = 2
    (d / "rank0" / "trace.json").write_text(json.dumps(doc))
    for call in (lambda: load_traces(d, cache=False), lambda: idle_summary_at(d)):
        with pytest.raises(TraceError, match="rank 2 appears twice"):
            call()


def spy_on_map(distributed):
    """A `Client.map` that records each call's `ours` (whether the workers are the ones
    `--scheduler local` started) and its tasks' groups of ranks."""
    real_map = distributed.Client.map

    def mapped(self, func, *iterables, **kwargs):
        mapped.ours.append(kwargs.get("ours"))
        mapped.groups.append(list(iterables[1]))
        return real_map(self, func, *iterables, **kwargs)

    mapped.ours, mapped.groups = [], []
    return mapped


MB = 1 << 20


@pytest.mark.parametrize(("sizes", "threads", "grouped"), [
    # the benchmark's ranks: guided, 13 tasks (equal tasks of 3 ranks were 22)
    ([26 * MB] * 64, 2, [16, 12, 9, 7, 5, 4, 3, 2, 2, 1, 1, 1, 1]),
    ([2 * MB] * 16, 2, [4, 3, 3, 2, 1, 1, 1, 1]),
    ([2 * MB] * 5, 4, [1] * 5),  # fewer ranks than shares: one each
    ([1 << 30] * 8, 64, [1] * 8),  # 1 GB ranks on many threads: one each
    ([0] * 3, 2, [1] * 3),  # not readable here (storage only the workers see): one each
    ([0, 40 * MB, 0, 40 * MB, 40 * MB, 40 * MB], 1, [2, 1, 1, 1, 1]),  # unknown sizes alone
    ([MB, MB, MB, 0, 100 * MB], 1, [1, 2, 1, 1]),  # ... and last
    ([26 * MB] * 4, 0, [1] * 4),  # no worker joined yet: one rank a task, not one task
])
def test_dask_tasks_shrink_to_one_rank(sizes, threads, grouped):
    groups = parallel.task_groups(sizes, threads)
    assert [len(g) for g in groups] == grouped
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    order = [i for g in groups for i in g]
    assert [sizes[i] for i in order] == sorted(sizes, reverse=True)


def test_dask_tasks_take_the_largest_ranks_first():
    sizes = [5 * MB, 90 * MB, 30 * MB, 40 * MB, 1 * MB, 70 * MB]
    groups = parallel.task_groups(sizes, 1)
    assert [i for g in groups for i in g] == sorted(range(6), key=lambda i: -sizes[i])
    # each task holds at least half of what was not yet given out (1 thread, 2 shares)
    left = sum(sizes)
    for g in groups:
        held = sum(sizes[i] for i in g)
        assert held >= left // 2
        left -= held


def test_the_cluster_here_starts_with_a_prompt_worker_poll(tmp_path, monkeypatch):
    """The nannies of the LocalCluster started here poll their worker's start message every
    2 ms (distributed's 50 ms was ~25 ms of waiting a start); distributed's value is back
    afterwards, and a distributed without that attribute is left alone."""
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    from distributed.nanny import WorkerProcess

    shipped = WorkerProcess._init_msg_interval
    seen = []

    class Stop(Exception):
        pass

    def cluster(*args, **kwargs):
        seen.append(WorkerProcess._init_msg_interval)
        raise Stop

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    plan = traces.plan_traces(many_ranks(tmp_path / "t", 2))
    job = {"busy": "kineto", "marker": MARKER, "window_marker": None, "cache": False,
           "chunk_bytes": traces.CHUNK_BYTES, "max_trace_bytes": traces.MAX_TRACE_BYTES}
    with pytest.raises(Stop):
        idle.reductions_at(plan, job, scheduler="local", workers=2)
    assert seen == [parallel.WORKER_START_POLL_S] and shipped > parallel.WORKER_START_POLL_S
    assert WorkerProcess._init_msg_interval == shipped
    monkeypatch.delattr(WorkerProcess, "_init_msg_interval")
    with parallel.prompt_worker_start():
        assert not hasattr(WorkerProcess, "_init_msg_interval")


@pytest.mark.parametrize("ours", [True, False])
def test_a_dask_task_keeps_the_heap_only_on_the_cluster_started_here(ours, monkeypatch):
    kept, reduced = [], []
    monkeypatch.setattr(parallel, "keep_heap", lambda: kept.append(1) or True)

    def task(plan, i, **job):
        reduced.append((plan, i, job))
        return "reduction"

    job = {"busy": None, "cache": False}
    assert parallel.run_group("plan", (3, 1), task=task, ours=ours,
                              kwargs=job) == ["reduction"] * 2
    assert reduced == [("plan", 3, job), ("plan", 1, job)] and kept == ([1] if ours else [])


class KilledWorker(Exception):
    """Named as distributed's own (`distributed.scheduler.KilledWorker`)."""


@pytest.mark.parametrize(("exc", "scheduler", "kind", "words"), [
    (ModuleNotFoundError("No module named 'residency'"), "tcp://h:8786", parallel.DaskTaskError,
     "every worker must import residency"),
    (KilledWorker("('task-1', <WorkerState 'tcp://h:1'>)"), "local", parallel.DaskTaskError,
     "a worker or the scheduler was lost"),
    (FileNotFoundError(2, "No such file or directory", "/nfs/rank3.json"), "tcp://h:8786",
     TraceError, "/nfs/rank3.json: cannot be read on a worker of the cluster at tcp://h:8786"),
    (RuntimeError("boom\nsecond line"), "local", parallel.DaskTaskError,
     "(RuntimeError: boom "),
])
def test_a_failed_dask_task_says_what_the_workers_need(exc, scheduler, kind, words):
    plan = traces.plan_traces(DATA / "kineto_basic")
    got = parallel.task_error(exc, plan.root, scheduler)
    assert type(got) is kind and words in str(got) and "\n" not in str(got), str(got)


@pytest.mark.parametrize("exc", [TraceError("/t/rank0.json", "not JSON"),
                                 FileNotFoundError(2, "No such file or directory", "/t/x")])
def test_a_trace_error_on_this_machines_cluster_is_the_local_paths_error(exc):
    plan = traces.plan_traces(DATA / "kineto_basic")
    assert parallel.task_error(exc, plan.root, "local") is exc


def test_a_worker_of_another_residency_version_refuses_its_task():
    reduced = []

    def task(plan, i, **job):
        reduced.append(i)

    here = re.escape(parallel.analysis_version())
    with pytest.raises(parallel.DaskTaskError, match=rf"runs residency {here}, this process "
                       r"9\.9\.9, parser 1: install the same residency"):
        parallel.run_group("plan", (0,), task=task, ours=False, kwargs={},
                           version="9.9.9, parser 1")
    assert reduced == []  # nothing computed
    got = parallel.run_group("plan", (0,), task=task, ours=False, kwargs={},
                             version=parallel.analysis_version())
    assert reduced == [0] and got == [None]
    err = parallel.DaskTaskError("x")
    assert parallel.task_error(err, None, "tcp://h:8786") is err  # one line as it is


def _no_residency_on_the_worker(shared, items, *, task, ours, kwargs, version=None):
    raise ModuleNotFoundError("No module named 'residency'")


@pytest.mark.slow
def test_a_cluster_without_residency_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    pytest.importorskip("distributed", reason="dask[distributed] is not installed "
                        "(pip install 'residency[cluster]')")
    monkeypatch.setattr(parallel, "run_group", _no_residency_on_the_worker)
    code = cli.main(["idle", str(many_ranks(tmp_path / "t", 2)), "--no-cache",
                     "--scheduler", "local", "--workers", "1"])
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("residency idle: error: "))
    assert code == 1, err
    assert "ModuleNotFoundError: No module named 'residency'" in line
    assert "every worker must import residency" in line


@pytest.mark.parametrize("mask, count, usable", [({3}, 8, 1), ({0, 1, 2}, 8, 3),
                                                  (None, 6, 6), (None, None, 1)])
def test_usable_cpus_follows_the_affinity_mask(mask, count, usable, monkeypatch):
    if mask is None:
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: mask)
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    assert parallel.usable_cpus() == usable


@pytest.mark.slow
def test_the_cluster_hands_back_the_ranks_in_plan_order_as_they_finish(tmp_path):
    """Results are taken as each task ends: rank 0, ten times the others' size, goes alone
    and first (a task of the largest share), the small ones in tasks of their own as the work
    runs out, and the results still come back in plan order."""
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    d = many_ranks(tmp_path / "t", 4)
    doc = json.loads((d / "rank0" / "trace.json").read_text())
    doc["traceEvents"] *= 10
    (d / "rank0" / "trace.json").write_text(json.dumps(doc))
    plan = traces.plan_traces(d)
    job = {"busy": "kineto", "marker": MARKER, "window_marker": None, "cache": False,
           "chunk_bytes": traces.CHUNK_BYTES, "max_trace_bytes": traces.MAX_TRACE_BYTES}
    mapped = spy_on_map(distributed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed.Client, "map", mapped)
        got, _ = idle.reductions_at(plan, job, scheduler="local", workers=2)
    (groups,) = mapped.groups  # the largest rank first, then one small rank a task
    assert groups[0] == (0,) and max(map(len, groups)) == 1
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert [r.source for r in got] == list(plan.sources)
    assert [r.content_rank for r in got] == [0, None, 2, None]
    assert got[0].device_tasks == 10 * got[2].device_tasks


@pytest.mark.slow
def test_a_bad_rank_on_the_cluster_is_the_local_paths_error(tmp_path):
    """A task's error reaches the caller as the local path raises it (type and words), and
    the cluster is closed behind it."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed "
                        "(pip install 'residency[cluster]')")
    d = many_ranks(tmp_path / "t", 3)
    (d / "rank2" / "trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1,]}')
    with pytest.raises(TraceError) as local:
        idle_summary_at(d, cache=False, workers=2)
    with pytest.raises(TraceError) as cluster:
        idle_summary_at(d, cache=False, scheduler="local", workers=2)
    assert str(cluster.value) == str(local.value) and "rank2" in str(cluster.value)


@pytest.mark.slow
def test_local_cluster_gives_the_local_figures_to_the_nanosecond(tmp_path):
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    d = many_ranks(tmp_path / "t", 5)
    local = idle_summary_at(d, marker=MARKER, cache=False)
    assert local == idle_summary(load_traces(d, cache=False), marker=MARKER)
    mapped = spy_on_map(distributed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed.Client, "map", mapped)
        assert idle_summary_at(d, marker=MARKER, cache=False, scheduler="local",
                               workers=2) == local
    assert mapped.ours == [True]  # the cluster's workers are ours: they keep their heap
    rc, out, err = run_cli("idle", str(d), "--json", "--marker", MARKER, "--scheduler",
                           "local", "--workers", "2")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc.pop("warnings") == []  # the CLI's JSON adds the warnings (issue 27)
    assert doc == local.to_dict()


@pytest.mark.slow
def test_a_scheduler_address_from_the_environment_gives_the_local_figures(tmp_path,
                                                                           monkeypatch):
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    d = many_ranks(tmp_path / "t", 3)
    local = idle_summary_at(d, marker=MARKER, cache=False)
    mapped = spy_on_map(distributed)
    monkeypatch.setattr(distributed.Client, "map", mapped)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
        rc, out, err = run_cli("idle", str(d), "--json", "--marker", MARKER, "--no-cache")
    assert rc == 0, err
    assert mapped.ours == [False]  # a cluster of the user's: its workers' heaps left alone
    doc = json.loads(out)
    doc.pop("warnings")
    assert doc == local.to_dict()


def test_the_local_cluster_is_quiet_where_the_user_kept_dasks_settings(tmp_path,
                                                                       monkeypatch):
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    import dask

    seen = {}

    class Started(Exception):
        pass

    def cluster(**kwargs):
        seen.update({k: dask.config.get(k) for k in (
            "distributed.worker.profile.enabled", "distributed.admin.tick.interval",
            "distributed.scheduler.work-stealing", "distributed.scheduler.http.routes",
            "distributed.worker.http.routes")})
        raise Started

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    d = many_ranks(tmp_path / "t", 2)
    with dask.config.set({"distributed.admin.tick.interval": "50ms",
                          "distributed.worker.http.routes": ["residency.mine"]}), \
            pytest.raises(Started):
        idle_summary_at(d, cache=False, scheduler="local", workers=1)
    assert seen == {"distributed.worker.profile.enabled": False,
                    "distributed.admin.tick.interval": "50ms",  # the user's, kept
                    "distributed.scheduler.work-stealing": False,
                    "distributed.scheduler.http.routes": [],
                    "distributed.worker.http.routes": ["residency.mine"]}  # kept
    assert dask.config.get("distributed.worker.profile.enabled") is True  # restored
    assert "distributed.http.health" in dask.config.get("distributed.scheduler.http.routes")


def test_scheduler_without_dask_is_bad_input(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.split(".")[0] in ("distributed", "dask"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    d = copy_fixture("kineto_basic", tmp_path)
    rc, out, err = run_cli("idle", str(d), "--scheduler", "local")
    assert rc == 2 and "residency[cluster]" in err and not out


# -- where the cache lives -------------------------------------------------------------------

def test_nothing_is_written_beside_the_traces(tmp_path):
    for fixture in ("kineto_basic", "ascend_basic"):
        d = copy_fixture(fixture, tmp_path)
        before = tree(d)
        for _ in range(2):  # cold, then warm
            load_traces(d)
            idle_summary_at(d, marker="release")
            assert run_cli("idle", str(d), "--json")[0] == 0
            assert run_cli("idle", str(d), "--by-cause")[0] == 0
        assert tree(d) == before
    assert entries(), "the cache went to the user's cache directory"


def test_tables_write_nothing_into_the_run(tmp_path):
    run = Path(shutil.copytree(PAIRED, tmp_path / "run"))
    before = tree(run)
    for _ in range(2):
        rc, _, err = run_cli("tables", str(run), "--format", "json")
        assert rc == 0, err
    assert tree(run) == before


def test_cache_dir_follows_xdg_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.delenv("RESIDENCY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tracecache.cache_dir().is_relative_to(tmp_path / "xdg" / "residency")
    d = copy_fixture("kineto_basic", tmp_path)
    monkeypatch.setenv("RESIDENCY_NO_CACHE", "1")
    load_traces(d)
    idle_summary_at(d)
    assert not (tmp_path / "xdg").exists()
    monkeypatch.delenv("RESIDENCY_NO_CACHE")
    assert run_cli("idle", str(d), "--no-cache")[0] == 0
    assert not (tmp_path / "xdg").exists()
    assert run_cli("idle", str(d))[0] == 0
    assert len(list((tmp_path / "xdg").rglob("*.entry"))) == 3  # 2 ranks, the set's summary


def test_a_cache_dir_inside_the_traces_folder_is_never_used(tmp_path, monkeypatch):
    d = copy_fixture("kineto_basic", tmp_path)
    monkeypatch.setenv("RESIDENCY_CACHE_DIR", str(d / "cache"))
    before = tree(d)
    load_traces(d)
    idle_summary_at(d)
    assert tree(d) == before


# -- what an entry is worth -------------------------------------------------------------------

def _counting(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    parse = traces.parse_trace
    monkeypatch.setattr(traces, "parse_trace",
                        lambda *a, **k: calls.append(a[1]) or parse(*a, **k))
    return calls


@pytest.mark.parametrize("fixture", ["kineto_basic", "ascend_basic"])
def test_entries_are_used_and_follow_the_trace(tmp_path, monkeypatch, fixture):
    d = copy_fixture(fixture, tmp_path)
    fresh = load_traces(d, cache=False)
    fresh_idle = idle_summary_at(d, cache=False)
    load_traces(d)
    idle_summary_at(d)
    # columns and reduction of two ranks, and a Kineto set's summary
    assert len(entries()) == 4 + (fixture == "kineto_basic")
    calls = _counting(monkeypatch)
    same_traces(load_traces(d), fresh)
    assert idle_summary_at(d) == fresh_idle
    assert calls == []
    # a changed trace (size and mtime) is parsed again, and so is a changed option
    src = fresh.ranks[0].source
    doc = json.loads(src.read_text())
    extra = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 1}
    if fixture == "kineto_basic":
        doc["traceEvents"].append(extra)
    else:
        doc.append({**doc[-1], "name": "extra", "ts": "1764500000000001.000"})
    src.write_text(json.dumps(doc))
    again = load_traces(d)
    assert calls == [src]
    assert again.ranks[0].device_tasks == fresh.ranks[0].device_tasks + (fixture == "kineto_basic")
    assert idle_summary_at(d) == idle_summary(again)
    idle_summary_at(d, busy="all")
    assert calls == [src, src, src, fresh.ranks[1].source]


def test_a_change_that_keeps_size_and_mtime_is_caught(tmp_path, monkeypatch):
    d = copy_fixture("kineto_basic", tmp_path)
    src = d / "rank0.trace.json"
    first = idle_summary_at(d)
    load_traces(d)
    st = src.stat()
    text = src.read_text()
    i = text.index('"dur": 50')  # the first kernel: 100 -> 150 us
    edited = text[:i] + '"dur": 90' + text[i + len('"dur": 50'):]
    assert len(edited) == len(text)
    src.write_text(edited)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size and src.stat().st_mtime_ns == st.st_mtime_ns
    calls = _counting(monkeypatch)
    got = load_traces(d)
    assert calls == [src]
    assert int(got.ranks[0].device[0, 1] - got.ranks[0].device[0, 0]) == 90_000
    now = idle_summary_at(d)
    assert now == idle_summary(load_traces(d, cache=False)) and now != first


def _age_entries(seconds: float) -> None:
    """Entries written (or last used) `seconds` after now: the traces' status is then older
    than `RACY_NS` before them, so it vouches for the trace."""
    for p in entries():
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + int(seconds * 1e9)))


def _counting_digests(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    digest = tracecache.digest_like
    monkeypatch.setattr(tracecache, "digest_like",
                        lambda recorded, path, **k: calls.append(path) or digest(recorded, path,
                                                                                 **k))
    return calls


def test_an_unchanged_trace_whose_status_vouches_for_it_is_not_hashed_again(tmp_path,
                                                                             monkeypatch):
    d = copy_fixture("kineto_basic", tmp_path)
    first = idle_summary_at(d)
    hashed = _counting_digests(monkeypatch)
    assert idle_summary_at(d) == first
    assert len(hashed) == 2  # just written: the status is too recent to vouch (racy)
    _age_entries(10)
    hashed.clear()
    calls = _counting(monkeypatch)
    assert idle_summary_at(d) == first
    assert hashed == [] and calls == []  # used, and no trace read at all


def test_a_change_keeping_size_and_mtime_is_caught_where_the_status_vouched(tmp_path,
                                                                            monkeypatch):
    d = copy_fixture("kineto_basic", tmp_path)
    src = d / "rank0.trace.json"
    first = idle_summary_at(d)
    _age_entries(10)
    st = src.stat()
    text = src.read_text()
    i = text.index('"dur": 50')
    src.write_text(text[:i] + '"dur": 90' + text[i + len('"dur": 50'):])
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    assert src.stat().st_ctime_ns != st.st_ctime_ns
    hashed, calls = _counting_digests(monkeypatch), _counting(monkeypatch)
    now = idle_summary_at(d)
    assert src in hashed and calls == [src]  # ctime moved: hashed, and the digest differs
    assert now != first and now == idle_summary_at(d, cache=False)


def test_a_sealed_read_hashes_the_trace_whatever_its_status(tmp_path, monkeypatch):
    from residency.traces import files

    d = copy_fixture("kineto_basic", tmp_path)
    idle_summary_at(d)
    _age_entries(10)
    hashed = _counting_digests(monkeypatch)
    monkeypatch.setattr(tracecache, "active_seal", lambda: object())
    assert files.active_seal() is None  # (only the cache's view of the seal is faked)
    idle_summary_at(d)
    assert len(hashed) == 2


def _trace_digests() -> list[object]:
    """The trace digest each ``idle`` entry of a rank records (None: its status alone)."""
    import struct

    out = []
    for p in entries():
        data = p.read_bytes()
        magic = data.index(b"\n") + 1
        (n,) = struct.unpack_from("<Q", data, magic)
        header = json.loads(data[magic + 8:magic + 8 + n])
        if header["key"]["kind"] == "idle":
            out.append(header["trace_digest"])
    return out


def test_a_settled_trace_is_not_hashed_and_its_status_keys_its_entry(tmp_path, monkeypatch):
    """A trace that last changed `RACY_NS` before it is read is not hashed: its entry records
    its status alone, used while that status vouches for the trace (never under a seal); a
    change that keeps size and mtime moves ctime, and the trace is read again."""
    import time

    monkeypatch.setattr(idle.entries, "SUMMARY_FORMATS", frozenset())  # ranks' entries alone
    monkeypatch.setattr(tracecache, "RACY_NS", 50_000_000)
    d = copy_fixture("kineto_basic", tmp_path)
    src = d / "rank0.trace.json"
    time.sleep(0.1)
    first = idle_summary_at(d)
    assert _trace_digests() == [None, None]
    time.sleep(0.1)
    calls, hashed = _counting(monkeypatch), _counting_digests(monkeypatch)
    assert idle_summary_at(d) == first and calls == [] and hashed == []
    unsealed = tracecache.active_seal
    monkeypatch.setattr(tracecache, "active_seal", lambda: object())
    assert idle_summary_at(d) == first and len(calls) == 2  # a seal: status vouches nothing
    monkeypatch.setattr(tracecache, "active_seal", unsealed)
    calls.clear()
    st = src.stat()
    text = src.read_text()
    i = text.index('"dur": 50')
    src.write_text(text[:i] + '"dur": 90' + text[i + len('"dur": 50'):])
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    now = idle_summary_at(d)
    assert calls == [src] and now != first and now == idle_summary_at(d, cache=False)


def test_an_entry_of_the_status_alone_is_not_recorded_for_a_trace_changed_while_read(
        tmp_path):
    """`put` without a digest records nothing where the trace's status is no longer the one
    taken before it was read."""
    d = copy_fixture("kineto_basic", tmp_path)
    src = d / "rank0.trace.json"
    before = src.stat()
    args = ("idle", src, before, {"t": 1}, None, {}, {})
    src.write_text(src.read_text() + " ")
    tracecache.put(*args, root=d)
    assert entries() == []
    tracecache.put(args[0], src, src.stat(), *args[3:], root=d)
    assert len(entries()) == 1


# -- a trace set's summary ----------------------------------------------------------------

def _counting_reductions(monkeypatch) -> list[int]:
    calls: list[int] = []
    reductions = idle.reductions_at
    monkeypatch.setattr(idle, "reductions_at",
                        lambda plan, *a, **k: calls.append(len(plan.sources))
                        or reductions(plan, *a, **k))
    return calls


def _raised(call) -> tuple[object, list[tuple[type, str]]]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call()
    return got, [(w.category, str(w.message)) for w in caught]


def test_a_repeated_idle_reads_the_sets_summary_not_its_ranks(tmp_path, monkeypatch):
    """Once its traces' status vouches for them, a Kineto set's summary is the recorded one:
    no rank's reduction is read, the figures and warnings are the computed ones (the window
    basis too), and another option or a changed trace computes again."""
    d = many_ranks(tmp_path / "t", 3)
    src = d / "rank0" / "trace.json"
    doc = json.loads(src.read_text())
    doc["distributedInfo"]["rank"] = 5  # a warning: its path names rank 0
    src.write_text(json.dumps(doc))
    kw = dict(marker="release", window_marker="aten::mm")
    cold, cold_warned = _raised(lambda: idle_summary_at(d, **kw))
    assert cold.window_basis == "window marker" and cold.ranks == (1, 2, 5)
    assert any("its path names rank 0" in m for _, m in cold_warned)
    reduced, parsed = _counting_reductions(monkeypatch), _counting(monkeypatch)
    assert _raised(lambda: idle_summary_at(d, **kw)) == (cold, cold_warned)
    assert parsed == []  # (the summary too recent to vouch, racy, or not: the same figures)
    _age_entries(10)
    reduced.clear()
    hashed = _counting_digests(monkeypatch)
    assert _raised(lambda: idle_summary_at(d, **kw)) == (cold, cold_warned)
    assert reduced == [] and parsed == [] and hashed == []
    assert idle_summary_at(d, marker="release") == idle_summary_at(d, marker="release",
                                                                     cache=False)
    assert reduced == [3, 3]  # another option: another summary (and the uncached one)
    doc = json.loads(src.read_text())
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                               "ts": 0, "dur": 1})
    src.write_text(json.dumps(doc))
    parsed.clear()
    now = idle_summary_at(d, **kw)
    assert parsed == [src]  # the changed trace alone, the others from their entries
    assert now == idle_summary_at(d, **kw, cache=False) != cold


def _summary_entry() -> Path:
    (p,) = [p for p in entries() if b'"idle-summary"' in p.read_bytes()[:4096]]
    return p


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "wrong type", "too large"])
def test_a_damaged_summary_entry_is_ignored_and_rewritten(tmp_path, monkeypatch, damage):
    """A set's summary entry that is damaged, or well sealed but not a summary (a field of
    another type, its digest recomputed), or larger than a summary may be, is not used: the
    ranks' entries answer, with the figures of an uncached run, and the entry is rewritten."""
    import struct

    d = many_ranks(tmp_path / "t", 2)
    truth = idle_summary_at(d, marker="release", cache=False)
    idle_summary_at(d, marker="release")
    _age_entries(10)
    p = _summary_entry()
    data = p.read_bytes()
    magic = data.index(b"\n") + 1
    (n,) = struct.unpack_from("<Q", data, magic)
    header = json.loads(data[magic + 8:magic + 8 + n])
    if damage == "flip":  # the last digit of the all-rank idle time: still valid JSON
        i = data.index(b'"all_rank_idle_ns": ') + len(b'"all_rank_idle_ns": ')
        i = data.index(b",", i) - 1
        data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "garbage":
        data = b"not an entry" * 10
    else:
        if damage == "wrong type":
            header["meta"]["summary"]["all_rank_idle_ns"] = "12"
        else:
            header["meta"]["padding"] = "x" * tracecache.SET_MAX_BYTES
        header["payload_digest"] = tracecache.payload_digest(
            header, [json.dumps(header["meta"], sort_keys=True).encode()])
        head = json.dumps(header).encode()
        data = data[:magic] + struct.pack("<Q", len(head)) + head
    p.write_bytes(data)
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**10))  # still vouched
    reduced = _counting_reductions(monkeypatch)
    assert idle_summary_at(d, marker="release") == truth
    assert reduced == [2]  # the summary refused: the ranks' entries read
    assert _summary_entry().read_bytes() != data  # rewritten


def test_warnings_before_an_error_are_raised_with_it(tmp_path):
    """What `idle_summary_at` warns while computing a set it cannot summarise (no device task
    anywhere) reaches the caller with the error; nothing is recorded."""
    d = tmp_path / "t"
    d.mkdir()
    (d / "rank0.trace.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
         "dur": 5}]}))
    for _ in range(2):
        with pytest.warns(UserWarning, match="no device task"), \
                pytest.raises(ValueError, match="allow_no_device_tasks"):
            idle_summary_at(d)
    _age_entries(10)
    assert [p for p in entries() if "idle-summary" in p.read_bytes()[:4096].decode(
        errors="replace")] == []


def test_the_summary_json_reads_back_as_the_summary(tmp_path):
    """`IdleSummary.from_dict` reads what `to_dict` wrote (torch-npu step checks included);
    a field of the wrong type is named."""
    from residency.analysis.idle.model import IdleSummary

    for fixture in ("kineto_basic", "ascend_basic", "field/npu_session"):
        s = idle_summary(load_traces(copy_fixture(fixture, tmp_path / fixture), cache=False),
                         marker="release")
        back = IdleSummary.from_dict(json.loads(json.dumps(s.to_dict())))
        assert back == s and back.to_dict() == s.to_dict()
    assert any(r.steps for r in s.per_rank)  # (the torch-npu set's)
    bad = json.loads(json.dumps(s.to_dict()))
    bad["per_rank"][str(s.ranks[0])]["busy_ns"] = "12"
    with pytest.raises(ValueError, match=rf"per_rank\[{s.ranks[0]}\]\.busy_ns"):
        IdleSummary.from_dict(bad)
    with pytest.raises(ValueError, match="ranks"):
        IdleSummary.from_dict({**s.to_dict(), "ranks": [99]})


def test_mtime_alone_invalidates(tmp_path, monkeypatch):
    d = copy_fixture("kineto_basic", tmp_path)
    load_traces(d)
    calls = _counting(monkeypatch)
    load_traces(d)
    assert calls == []
    src = d / "rank0.trace.json"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    load_traces(d)
    assert calls == [src]


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "directory"])
def test_a_corrupted_entry_is_ignored_and_rewritten(tmp_path, monkeypatch, damage):
    d = copy_fixture("ascend_basic", tmp_path)
    fresh, fresh_idle = load_traces(d, cache=False), idle_summary_at(d, cache=False)
    load_traces(d)
    idle_summary_at(d)
    good = {p: p.read_bytes() for p in entries()}
    assert len(good) == 4
    for p, data in good.items():
        if damage == "flip":  # one byte of the payload (the last array)
            p.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
        elif damage == "truncate":
            p.write_bytes(data[: len(data) // 2])
        elif damage == "garbage":
            p.write_bytes(b"PAR1 not an entry" * 10)
        elif damage == "empty":
            p.write_bytes(b"")
        else:
            p.unlink()
            p.mkdir()
    calls = _counting(monkeypatch)
    same_traces(load_traces(d), fresh)
    assert idle_summary_at(d) == fresh_idle
    assert len(calls) == 4  # every entry was refused
    if damage != "directory":  # rewritten, and used again
        assert {p: p.read_bytes() for p in entries()} == good
        load_traces(d)
        idle_summary_at(d)
        assert len(calls) == 4


@pytest.mark.parametrize("vouched", [False, True])
def test_an_edited_entry_with_a_recomputed_digest_still_needs_the_trace(tmp_path,
                                                                        monkeypatch, vouched):
    """An entry whose trace digest is not the trace's is refused, also where the trace's
    status would vouch for it (the payload digest covers the trace digest)."""
    d = copy_fixture("kineto_basic", tmp_path)
    load_traces(d)
    for p in entries():
        data = bytearray(p.read_bytes())
        at = data.index(b'"trace_digest": "') + len(b'"trace_digest": "xxh3_128:')
        data[at] = ord("0") if data[at] != ord("0") else ord("1")
        p.write_bytes(bytes(data))
    if vouched:
        _age_entries(10)
    calls = _counting(monkeypatch)
    load_traces(d)
    assert len(calls) == 2


def forge(entry: Path) -> bytes:
    """`entry` with its first busy interval (or device task; a set's all-rank idle) 3 s off
    and every digest recomputed: an entry that a loader reading it would trust."""
    import struct

    data = bytearray(entry.read_bytes())
    magic = data.index(b"\n") + 1
    (n,) = struct.unpack_from("<Q", data, magic)
    header = json.loads(bytes(data[magic + 8:magic + 8 + n]))
    payload = bytearray(data[magic + 8 + n:])
    if header["key"]["kind"] == "idle-summary":  # a set's figures: its all-rank idle 3 s off
        header["meta"]["summary"]["all_rank_idle_ns"] -= 3_000_000_000
        blobs = [json.dumps(header["meta"], sort_keys=True).encode()]  # (its payload)
    else:
        (offset,) = [a[3] for a in header["arrays"] if a[0] in ("busy", "device")]
        end = struct.unpack_from("<q", payload, offset + 8)[0]
        struct.pack_into("<q", payload, offset + 8, end + 3_000_000_000)
        blobs = [bytes(payload)]
    header["payload_digest"] = tracecache.payload_digest(header, blobs)
    head = json.dumps(header).encode()
    return bytes(data[:magic]) + struct.pack("<Q", len(head)) + head + bytes(payload)


def test_a_forged_cache_shipped_with_a_run_has_no_effect(tmp_path, monkeypatch):
    """Entries forged for the very traces of a run (trace digest right, content 3 s off, own
    digest recomputed) and shipped inside it, where older versions kept their cache
    (``residency.parquet.cache/``) or where a cache folder set inside the run would look, are
    never read."""
    real = copy_fixture("kineto_basic", tmp_path / "real")
    truth = idle_summary_at(real, cache=False, marker="release")
    columns = load_traces(real, cache=False)
    monkeypatch.setenv("RESIDENCY_CACHE_DIR", str(tmp_path / "forger"))
    idle_summary_at(real, marker="release")
    load_traces(real)
    forged = {p.name: forge(p) for p in (tmp_path / "forger").rglob("*.entry")}
    assert len(forged) == 5
    for p in (tmp_path / "forger").rglob("*.entry"):  # the forgery is what a reader trusts
        p.write_bytes(forged[p.name])
    assert idle_summary_at(real, marker="release") != truth
    shutil.rmtree(tmp_path / "forger")
    for folder in (real / CACHE_DIR, real / "cache" / "traces-v1", real):
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in forged.items():
            (folder / name).write_bytes(data)
            (folder / "rank0.trace.json.parquet").write_bytes(data)
    for where in (tmp_path / "user", real / "cache"):  # a cache folder inside the run: unused
        monkeypatch.setenv("RESIDENCY_CACHE_DIR", str(where))
        for _ in range(2):
            assert idle_summary_at(real, marker="release") == truth
            same_traces(load_traces(real), columns)


def test_the_cache_is_bounded_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(idle.entries, "SUMMARY_FORMATS", frozenset())  # ranks' entries alone
    d = many_ranks(tmp_path / "t", 3)
    idle_summary_at(d, cache=True)
    sizes = sorted(p.stat().st_size for p in entries())
    assert len(sizes) == 3
    for p in entries():
        p.unlink()
    monkeypatch.setenv("RESIDENCY_CACHE_MAX_BYTES", str(sizes[-1] + sizes[-2]))
    idle_summary_at(d, cache=True)  # rank 0, 1, 2 in order: rank 0's entry goes
    assert len(entries()) == 2
    assert sum(p.stat().st_size for p in entries()) <= sizes[-1] + sizes[-2]
    calls = _counting(monkeypatch)
    idle_summary_at(d / "rank2", cache=True)  # the most recent: kept
    assert calls == []
    idle_summary_at(d / "rank0", cache=True)  # the least recent: gone
    assert calls == [d / "rank0" / "trace.json"]


def test_idle_module_keeps_dask_off_the_default_path():
    heavy = "('dask', 'distributed', 'pandas', 'scipy', 'torch', 'pyarrow')"
    code = (f"import sys; from residency.cli import main as cli; "
            f"cli.main(['idle', {str(DATA / 'kineto_basic')!r}, '--json']); "
            f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {heavy}); "
            f"assert not loaded, loaded")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert idle.__name__ == "residency.analysis.idle"


def test_an_idle_entry_holds_the_busy_union_packed(tmp_path):
    """The busy union is recorded as its first row plus narrow columns of lengths and gaps
    (`intervals.pack`); the warm figures are the cold ones to the nanosecond."""
    import numpy as np

    d = many_ranks(tmp_path / "t", 2)
    cold = idle_summary_at(d, marker="release")
    ranks = 0
    for p in entries():
        data = p.read_bytes()
        magic = data.index(b"\n") + 1
        (n,) = np.frombuffer(data[magic:magic + 8], "<u8")
        header = json.loads(data[magic + 8:magic + 8 + int(n)])
        if header["key"]["kind"] == "idle-summary":
            continue
        specs = {a[0]: a for a in header["arrays"]}
        assert specs["busy"][2] == [1, 2]
        assert specs["busy_lengths"][1] in ("|u1", "<u2", "<u4")
        ranks += 1
    assert ranks == 2
    assert idle_summary_at(d, marker="release") == cold


def test_the_one_atomic_write_keeps_the_caches_temporary_file_rules(tmp_path):
    """`jsonio.write_bytes_atomic`, which the cache's entries and the screenshots go through:
    chunks written in order, the temporary file created with the mode asked for and never
    through a link planted at its name, nothing left behind when the write fails."""
    import stat

    from residency.jsonio import write_bytes_atomic

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "entry"
    tmp = tmp_path / ".entry.123.tmp"
    tmp.symlink_to(victim)
    write_bytes_atomic(out, [b"ab", memoryview(b"cd")], tmp=tmp, mode=0o600, fsync=False)
    assert out.read_bytes() == b"abcd" and victim.read_bytes() == b"precious"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and not tmp.exists()
    with pytest.raises(TypeError):
        write_bytes_atomic(out, [b"new", object()])
    assert out.read_bytes() == b"abcd" and not list(tmp_path.glob(".*.tmp"))
