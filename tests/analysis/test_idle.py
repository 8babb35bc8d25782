"""All-rank idle and marker attribution: golden figures worked by hand, an independent
cross-check of HTA-style per-rank idle, and the CLI contract."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from residency.analysis.idle import idle_summary, per_rank_idle
from residency.traces.load import load_traces
from tests.helpers import ROOT, residency

DATA = ROOT / "tests" / "data" / "traces"
BASE = 1_764_500_000_000_000_000
EPOCH_NS = 1_764_500_000_000_000_000
NORMAL = r"residency\.release\[normal\]"

# kineto_basic, in us relative to the base (see tests/data/traces/make_fixtures.py):
# rank 0 busy [100,150) [200,225.5) [400,500) (+ overlapping and zero-length tasks)
# rank 1 busy [120,160) [240,300) [450,550); window [100,550) = 450 us
# union busy [100,160) [200,225.5) [240,300) [400,550) = 295.5 -> all-rank idle 154.5 us
# normal releases: rank 0 [150,250), rank 1 [140,260) -> union [140,260) = 120 us;
# in all-rank idle: [160,200) + [225.5,240) = 54.5 us
KINETO_GOLDEN = {
    "format": "kineto", "busy_definition": "kineto", "ranks": [0, 1],
    "window_ns": [BASE + 100_000, BASE + 550_000], "window_measure_ns": 450_000,
    "window_marker": None, "marker": NORMAL,
    "all_rank_idle_ns": 154_500, "marker_ns": 120_000, "marker_idle_intersection_ns": 54_500,
    "rejected_events": 3,
    # span_idle: rank 0 span [100,500) minus busy 175.5; rank 1 [120,550) minus 200
    "per_rank": {"0": {"busy_ns": 175_500, "idle_ns": 274_500, "device_tasks": 5, "markers": 1,
                       "span_idle_ns": 224_500, "excluded_tasks": {}, "unknown_tasks": {},
                       "reported_free_ns": None, "torch_npu_steps": []},
                 "1": {"busy_ns": 200_000, "idle_ns": 250_000, "device_tasks": 3, "markers": 1,
                       "span_idle_ns": 230_000, "excluded_tasks": {}, "unknown_tasks": {},
                       "reported_free_ns": None, "torch_npu_steps": []}},
}
# ascend_basic, in us after EPOCH: rank 0 [100.251,150.751) [200,230); rank 1 [120,180)
# [190.5,200); window [100.251,230) = 129.749 us; idle [180,190.5) = 10.5 us;
# releases [140,240) and [150,230) -> [140,230) in the window = 90 us, 10.5 us of it idle
ASCEND_GOLDEN = {
    "format": "ascend", "busy_definition": "ascend", "ranks": [0, 1],
    "window_ns": [EPOCH_NS + 100_251, EPOCH_NS + 230_000], "window_measure_ns": 129_749,
    "window_marker": None, "marker": NORMAL,
    "all_rank_idle_ns": 10_500, "marker_ns": 90_000, "marker_idle_intersection_ns": 10_500,
    "rejected_events": 0,
    # rank 0's Overlap Analysis Free slice [150.751,200) us; rank 1's lane has no Free slice
    # span_idle: rank 0 [100.251,230) minus 80.5; rank 1 [120,200) minus 69.5
    "per_rank": {"0": {"busy_ns": 80_500, "idle_ns": 49_249, "device_tasks": 2, "markers": 1,
                       "span_idle_ns": 49_249, "excluded_tasks": {}, "unknown_tasks": {},
                       "reported_free_ns": 49_249, "torch_npu_steps": []},
                 "1": {"busy_ns": 69_500, "idle_ns": 60_249, "device_tasks": 2, "markers": 1,
                       "span_idle_ns": 10_500, "excluded_tasks": {}, "unknown_tasks": {},
                       "reported_free_ns": 0, "torch_npu_steps": []}},
}


@pytest.fixture(scope="module")
def kineto():
    return load_traces(DATA / "kineto_basic", cache=False)


def test_kineto_golden(kineto):
    assert idle_summary(kineto, marker=NORMAL).to_dict() == KINETO_GOLDEN


def test_ascend_golden():
    ts = load_traces(DATA / "ascend_basic", cache=False)
    assert idle_summary(ts, marker=NORMAL).to_dict() == ASCEND_GOLDEN


def test_window_marker(kineto):
    # window = rank 0's prepare phase [50,450); busy union inside it 195.5 us
    s = idle_summary(kineto, marker=NORMAL, window_marker=r"phase\[prepare\]")
    assert s.window_ns == (BASE + 50_000, BASE + 450_000) and s.window_measure_ns == 400_000
    assert (s.all_rank_idle_ns, s.marker_ns, s.marker_idle_intersection_ns) == (
        204_500, 120_000, 54_500)
    assert [(r.busy_ns, r.idle_ns) for r in s.per_rank] == [(125_500, 274_500),
                                                            (100_000, 300_000)]


def test_markers_are_clipped_to_the_window(kineto):
    # the forced release [320,330) lies in the window; clip the window to exclude it
    assert idle_summary(kineto, marker="forced").marker_ns == 10_000
    s = idle_summary(kineto, marker="forced", window_marker="release.normal")
    assert (s.marker_ns, s.per_rank[1].markers) == (0, 0)


def test_no_marker_and_bad_patterns(kineto):
    s = idle_summary(kineto)
    assert (s.marker_ns, s.marker_idle_intersection_ns) == (0, 0)
    assert all(r.markers == 0 for r in s.per_rank)
    with pytest.raises(ValueError, match="`marker` must be a regular expression"):
        idle_summary(kineto, marker="(")
    with pytest.raises(ValueError, match="no host range matches `window_marker`"):
        idle_summary(kineto, window_marker="nothing-like-this")


def test_per_rank_frame(kineto):
    f = per_rank_idle(kineto, marker=NORMAL)
    assert list(f.columns) == ["rank", "busy_ns", "idle_ns", "device_tasks", "markers",
                               "span_idle_ns", "excluded_tasks", "reported_free_ns",
                               "unknown_tasks", "steps", "source"]
    assert f["busy_ns"].tolist() == [175_500, 200_000]
    assert f["span_idle_ns"].tolist() == [224_500, 230_000]


# -- cross-check: HTA's per-rank idle by an independent, loop-based implementation -----------

def hta_style_idle(path: Path) -> int:
    """Span of device tasks minus their union: stdlib json, Decimal and a plain sweep."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    doc = json.loads(raw, parse_float=Decimal)
    base = doc.get("baseTimeNanoseconds", 0)
    tasks = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() not in (
                "kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"):
            continue
        try:
            ts, dur = Decimal(str(e["ts"])), Decimal(str(e["dur"]))
        except (KeyError, ArithmeticError):
            continue
        if not ts.is_finite() or not dur.is_finite() or dur < 0 or isinstance(e["ts"], bool):
            continue
        start = base + int((ts * 1000).to_integral_value(rounding=ROUND_HALF_UP))
        tasks.append((start, start + int((dur * 1000).to_integral_value(rounding=ROUND_HALF_UP))))
    if not tasks:
        return 0
    tasks.sort()
    busy, cur_s, cur_e = 0, tasks[0][0], tasks[0][1]
    for s, e in tasks[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return max(e for _, e in tasks) - min(s for s, _ in tasks) - busy


def synthetic_ranks(d: Path, *, ranks: int = 3, n: int = 400, seed: int = 7) -> Path:
    """Seeded Kineto ranks: two streams of overlapping tasks, numeric and string times."""
    rnd = random.Random(seed)
    for r in range(ranks):
        events, t = [], 0.0
        for i in range(n):
            t += rnd.uniform(-2.0, 6.0) if i else 0.0
            t = max(t, 0.0)
            ts = round(t, 3)
            dur = round(rnd.uniform(0.0, 5.0), 4)
            cat = rnd.choice(["kernel", "Kernel", "gpu_memcpy", "Memset", "cuda_runtime"])
            events.append({"ph": "X", "cat": cat, "name": "k", "pid": 0, "tid": rnd.choice([7, 9]),
                           "ts": f"{ts:.3f}" if rnd.random() < 0.3 else ts, "dur": dur})
        doc = {"baseTimeNanoseconds": BASE, "distributedInfo": {"rank": r},
               "traceEvents": events}
        (d / f"worker{r}.pt.trace.json").write_text(json.dumps(doc))
    return d


def test_cross_check_span_idle_against_independent_implementation(tmp_path, kineto):
    synthetic = load_traces(synthetic_ranks(tmp_path), cache=False)
    for ts in (kineto, synthetic):
        ours = {r.rank: r.span_idle_ns for r in idle_summary(ts).per_rank}
        theirs = {r: hta_style_idle(t.source) for r, t in ts.ranks.items()}
        assert ours == theirs
        assert any(v > 0 for v in ours.values())


# -- the CLI contract ---------------------------------------------------------------------------

def cli(*args: str) -> subprocess.CompletedProcess:
    return residency("idle", *args, cwd=ROOT, timeout=180)


def test_cli_json_golden():
    out = cli(str(DATA / "kineto_basic"), "--marker", NORMAL, "--json", "--no-cache")
    assert (out.returncode, out.stderr) == (0, "")
    assert json.loads(out.stdout) == {**KINETO_GOLDEN, "warnings": []}


def test_cli_table_in_milliseconds(tmp_path):
    d = Path(shutil.copytree(DATA / "ascend_basic", tmp_path / "ascend_basic"))
    out = cli(str(d), "--marker", NORMAL)
    assert (out.returncode, out.stderr) == (0, "")
    assert "ascend traces, 2 ranks (0, 1)" in out.stdout
    assert "Unit: milliseconds; n = 2 ranks." in out.stdout
    assert "0.011 ms" in out.stdout  # 10.5 us of all-rank idle, in ms
    from residency.traces import cache as tracecache

    assert not any(d.rglob("*.parquet")) and not any(d.rglob("*.entry"))  # nothing beside
    assert any(tracecache.cache_dir().glob("*.entry"))  # the user's cache directory


@pytest.mark.parametrize("setup, needle", [
    ("truncated", "(at byte "),
    ("missing", "no such file"),
    ("bad-regex", "must be a regular expression"),
])
def test_cli_bad_input_exits_2_without_traceback(tmp_path, setup, needle):
    args = [str(tmp_path)]
    if setup == "truncated":
        (tmp_path / "rank0.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    elif setup == "missing":
        args = [str(tmp_path / "nope")]
    else:
        args = [str(DATA / "kineto_basic"), "--no-cache", "--marker", "("]
    out = cli(*args)
    assert out.returncode == 2 and out.stdout == ""
    assert needle in out.stderr and "Traceback" not in out.stderr
    if setup == "truncated":
        assert "rank0.json" in out.stderr


def test_cli_warns_about_a_rank_without_device_tasks(tmp_path):
    for r, cat in ((0, "kernel"), (1, "user_annotation")):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({"traceEvents": [
            {"ph": "X", "cat": cat, "name": "x", "ts": 1, "dur": 2}]}))
    out = cli(str(tmp_path), "--json", "--no-cache")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "warning: rank 1" in out.stderr and "no device tasks" in out.stderr
    assert json.loads(out.stdout)["per_rank"]["1"]["busy_ns"] == 0
