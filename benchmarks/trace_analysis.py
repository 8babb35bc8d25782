"""Trace analysis speed and memory, process to process, every ratio from one run: `residency
idle` (the default path a user gets: cold, i.e. the first time, which writes the cache; warm;
``--no-cache``) against a bare read of the same files (a typed msgspec decode of the JSON; the
needed rows of a database, fetched with sqlite3), against HolisticTraceAnalysis
(`traceinsight` 0.6.1) in its own venv, and the Dask path against the local one; then, on
paper, 1,024 ranks x 1 GB from the per-rank figures; one line per case (`--markdown FILE`:
the same table as Markdown, for the README); and (`--scaling-ranks N`) the speedup of
`--workers` 1, 2, 4, ... over one worker.

    python benchmarks/trace_analysis.py [--repeat 3] [--hta-python /tmp/ti/bin/python]
                                        [--shapes kineto,kineto-dense,kineto-host,ascend,ascend-db]
                                        [--scale 1gb|8x1gb] [--dask-ranks 64] [--dir DIR]

Traces are generated (`benchmarks/tracegen.py`), one case per shape so that no target holds on
one shape only: ``kineto``, the standard Kineto export (document head, metadata,
ProfilerStep annotations, cpu_op with args, python_function, cuda_runtime launches,
kernels/memcpy with args, ac2g flows, cuda_sync, gpu_user_annotation, release markers;
fractional-us times, some as decimal strings; 8 ranks x 110k events, against HTA too);
``kineto-dense`` (every event a kernel, gaps 0-150 us; 2 x 500k); ``kineto-host`` (nearly
every event a host range; 2 x 400k); ``ascend``, torch-npu's text export (8 x 110k) and
``ascend-db``, its database export (8 x 110k). ``--scale 1gb`` adds every shape at ~1.2 GB in
2 ranks (device-dense: the issue's 2 x 2.5M kernels), ``8x1gb`` at 8 ranks of ~1 GB each
(about 40 GB of disk in all, one case at a time, each removed after its measurement unless
``--dir``); the Dask case (``--dask-ranks`` ranks x ``--dask-events`` events, 64 x 110k by
default: the standard case's rank size, on a LocalCluster of 2 workers against the local
path; ``--dask-ranks 0`` skips it).

Targets (issues 26, 44): cold within 1.2x of the bare read, warm at most 0.2x cold, writing the
cache at most 10 % of the cold run, peak memory of the process tree at most 25 % of the input
(under 1 GB for 8 x 1 GB), at least 30x faster than HTA cold, the LocalCluster within 1.3x of
the local path. A shared machine is noisy: every figure is the median (and range) of
--repeat interleaved rounds, ratios pair runs of the same round, and the load average is
printed. Every measurement is a fresh process (files are in the OS page cache after
generation: "cold" means without our cache, not a cold disk); peak memory is the largest sum
of RSS over the process tree, sampled every 20 ms in one run of each command of its own (the
sampling costs CPU, so timed runs are not sampled). HTA (never a dependency):

    python -m venv /tmp/ti && /tmp/ti/bin/pip install traceinsight==0.6.1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tracegen  # noqa: E402

MARKER = r"residency\.release\[normal\]"

BARE = """
import json, math, sqlite3, sys, time, msgspec
from pathlib import Path
class E(msgspec.Struct, gc=False):
    ph: str = ""; cat: str = ""; name: str = ""
    ts: "float | str" = math.nan; dur: "float | str" = math.nan
class T(msgspec.Struct, gc=False):
    traceEvents: list[E] = []
dec, array = msgspec.json.Decoder(T), msgspec.json.Decoder(list[E])
n = 0
for p in map(Path, sys.argv[1:]):
    if p.suffix == ".db":  # the rows an analysis needs, fetched and nothing else
        con = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
        for sql in ("SELECT startNs, endNs, taskType, globalTaskId FROM TASK",
                    "SELECT globalTaskId, taskType, name FROM COMPUTE_TASK_INFO",
                    "SELECT startNs, endNs, name FROM PYTORCH_API",
                    "SELECT startNs, endNs, name FROM CANN_API", "SELECT * FROM STRING_IDS"):
            n += len(con.execute(sql).fetchall())
        con.close()
        continue
    data = p.read_bytes()
    n += len(array.decode(data) if data.lstrip()[:1] == b"[" else dec.decode(data).traceEvents)
print(json.dumps({"events": n}))
"""

HTA = """
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
df = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
print(json.dumps({"span_idle_us": [float(x) for x in df.sort_values("rank")["idle_time(us)"]]}))
"""


# msprof-analyze (its own venv, never a dependency): the free_analysis recipe, the closest to
# our figure: per rank, the busy union of compute tasks (TASK joined with COMPUTE_TASK_INFO)
# and communication operations (COMMUNICATION_OP), and its --top_num longest gaps (free time)
MSPROF = """
import sys
from msprof_analyze.cli.entrance import msprof_analyze_cli
sys.argv = ["msprof-analyze", "cluster", "-d", sys.argv[1], "-m", "free_analysis",
            "--output_path", sys.argv[2]]
sys.exit(msprof_analyze_cli())
"""
MSPROF_TOP = 10  # the recipe's default --top_num

# the same figure from our busy intervals (`--busy msprof`, msprof-analyze's definition), one
# rank at a time: the MSPROF_TOP longest gaps of each rank's busy union, [start, end) in ns
OURS_GAPS = """
import json, sys, warnings
from pathlib import Path
import numpy as np
from residency.analysis.idle import busy_intervals
from residency.traces.load import load_traces
warnings.simplefilter("ignore")
out = {}
for session in sorted(Path(sys.argv[1]).glob("*_ascend_pt")):
    traces = load_traces(session, cache=False, workers=1)
    _, _, merged, _ = busy_intervals(traces, busy="msprof", warn=False)
    for rank, b in merged.items():
        b = np.asarray(b)
        gaps = np.column_stack([b[:-1, 1], b[1:, 0]])
        top = gaps[np.argsort(gaps[:, 0] - gaps[:, 1], kind="stable")[:int(sys.argv[2])]]
        idle = int((gaps[:, 1] - gaps[:, 0]).sum())
        out[str(rank)] = {"gaps": top.tolist(), "span_idle_ns": idle}
print(json.dumps(out))
"""


def msprof_gaps(out: Path) -> dict[str, list[list[int]]]:
    """msprof-analyze's FreeAnalysis table (its SQLite output) as [start, end) ns per rank."""
    import sqlite3
    from decimal import Decimal

    con = sqlite3.connect(out / "cluster_analysis_output" / "cluster_analysis.db")
    try:
        rows = con.execute('SELECT rankId, "startTime(us)", "endTime(us)" FROM FreeAnalysis')
        got: dict[str, list[list[int]]] = {}
        for rank, a, b in rows.fetchall():
            got.setdefault(str(rank), []).append([int(Decimal(a) * 1000), int(Decimal(b) * 1000)])
    finally:
        con.close()
    return got


def msprof_case(label: str, d: Path, args: argparse.Namespace, env: dict[str, str],
                msprof: str) -> dict:
    """msprof-analyze's free_analysis against `residency idle --busy msprof` (cold), process
    to process, paired rounds; then whether the figures agree (each rank's longest gaps)."""
    ours_runs, theirs = [], []
    outs = []
    for _ in range(args.msprof_repeat):
        cache = Path(tempfile.mkdtemp(prefix="residency-bench-cache-"))
        ours_runs.append(measure(ours(d, "--busy", "msprof"), {**env,
                                                               "RESIDENCY_CACHE_DIR": str(cache)}))
        shutil.rmtree(cache, ignore_errors=True)
        out = Path(tempfile.mkdtemp(prefix="msprof-out-"))
        theirs.append(measure([msprof, "-c", MSPROF, str(d), str(out)], dict(os.environ)))
        outs.append(msprof_gaps(out))
        shutil.rmtree(out, ignore_errors=True)
    mine = json.loads(subprocess.run([sys.executable, "-c", OURS_GAPS, str(d), str(MSPROF_TOP)],
                                     capture_output=True, text=True, check=True, env=env,
                                     cwd=ROOT).stdout.strip().splitlines()[-1])
    agree = [r for r in mine if sorted(map(tuple, mine[r]["gaps"])) ==
             sorted(map(tuple, outs[0].get(r, [])))]
    print(f"\n== {label}: msprof-analyze 26.2.0 free_analysis against `residency idle --busy "
          f"msprof`, cold ({load()})")
    print(f"{'msprof-analyze cluster -m free_analysis':<42} {show(theirs)}  CPU "
          f"{show(theirs, 'cpu_s')}")
    print(f"{'`residency idle --busy msprof`, cold':<42} {show(ours_runs)}  CPU "
          f"{show(ours_runs, 'cpu_s')}")
    print(f"msprof-analyze / ours, process to process: wall {ratio(theirs, ours_runs)}, CPU "
          f"{ratio(theirs, ours_runs, 'cpu_s')}  (goal >= 10x)")
    same_runs = all(o == outs[0] for o in outs)
    print(f"the figure (each rank's {MSPROF_TOP} longest gaps of its busy union, compute + "
          f"communication, [start, end) ns): {len(agree)} of {len(mine)} ranks identical"
          + ("" if same_runs else "; msprof-analyze's runs differ among themselves"))
    for r in sorted(set(mine) - set(agree), key=int)[:3]:
        print(f"  rank {r}: ours {sorted(mine[r]['gaps'])[:3]}..., msprof-analyze "
              f"{sorted(outs[0].get(r, []))[:3]}...")
    idle = sum(v["span_idle_ns"] for v in mine.values())
    print(f"  (ours also: every gap of every rank's busy union, span_idle_ns, summed over "
          f"ranks: {idle / 1e6:.3f} ms; the recipe lists its --top_num longest only)")
    return {"ours": ours_runs, "theirs": theirs, "agree": len(agree), "ranks": len(mine)}


def _tree(pid: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def _rss_kb(pids: list[int]) -> int:
    rss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                rss += sum(int(line.split()[1]) for line in f if line.startswith("Rss:"))
        except OSError:
            pass
    return rss


def measure(argv: list[str], env: dict[str, str], *, sample: bool = False) -> dict:
    """Run one child to its end: wall, CPU of its tree (user + system), its last stdout line
    (JSON) and, with `sample`, the peak RSS of its tree (else None). Sampling /proc every
    20 ms costs ~1 ms of CPU a sample, which slowed a two-worker run by ~15 % on 2 cores:
    timed runs are never sampled, memory comes from runs of their own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    peak = [0]
    done = threading.Event()

    def sampling() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss_kb(_tree(proc.pid)))

    sampler = threading.Thread(target=sampling, daemon=True)
    if sample:
        sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    if sample:
        sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{argv[:4]} failed ({proc.returncode}):\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = out.strip().splitlines()
    return {"wall_s": wall, "rss_mb": peak[0] / 1024 if sample else None,
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "out": json.loads(lines[-1]) if lines else None}


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs if r[key] is not None)


def peak_mb(argv: list[str], env: dict[str, str], *, prepare: Any = None) -> float:
    """Peak RSS (MB) of the process tree in one sampled run of its own (after `prepare()`)."""
    if prepare is not None:
        prepare()
    return measure(argv, env, sample=True)["rss_mb"]


def show(runs: list[dict], key: str = "wall_s") -> str:
    v = [r[key] for r in runs]
    return f"{statistics.median(v):7.2f} s ({min(v):.2f}-{max(v):.2f})"


def ratio(num: list[dict], den: list[dict], key: str = "wall_s") -> str:
    r = [n[key] / d[key] for n, d in zip(num, den, strict=True)]
    return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}, n={len(r)})"


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def reader_built() -> bool:
    """Whether `residency idle` here reads Kineto runs with the compiled reader."""
    probe = subprocess.run([sys.executable, "-c", "from residency.traces import kineto_scan; "
                            "print(kineto_scan.available())"], capture_output=True, text=True,
                           check=True)
    return probe.stdout.strip() == "True"


def ours(d: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "residency", "idle", str(d), "--json", "--marker",
            MARKER, *extra]


BARE_WHAT = ("a typed msgspec decode of every event", "sqlite3: the rows read, fetched")


def bare_argv(files: list[Path]) -> list[str]:
    """A bare read of `files`: typed msgspec decode of JSON, the needed rows of a database."""
    return [sys.executable, "-c", BARE, *map(str, files)]


def against_bare(label: str, d: Path, total: int, ranks: int, args: argparse.Namespace,
                 env: dict[str, str], hta: str | None = None, fmt: str = "kineto",
                 quick: bool = False) -> dict:
    """Bare decode, cold (fresh cache), no cache, warm (the cold run's cache), HTA: rounds.
    `quick` (a large case under --scale-quick): --scale-repeat rounds, no --no-cache run, and
    peak memory sampled in the timed runs themselves (which that slows by ~1 ms a 20 ms)."""
    runs: dict[str, list[dict]] = {k: [] for k in ("bare", "cold", "nocache", "warm", "hta",
                                                   "msgspec")}
    pure = {"RESIDENCY_PURE_PYTHON": "1"}  # the compiled reader off: msgspec reads every run
    built = reader_built() and fmt.startswith("kineto")  # (it reads Kineto runs only)
    files = tracegen.trace_files(d, fmt)
    entry_bytes = 0
    for _ in range(args.scale_repeat if quick else args.repeat):
        cache = Path(tempfile.mkdtemp(prefix="residency-bench-cache-"))
        mine = {**env, "RESIDENCY_CACHE_DIR": str(cache)}
        runs["bare"].append(measure(bare_argv(files), env, sample=quick))
        runs["cold"].append(measure(ours(d), mine, sample=quick))
        entry_bytes = sum(p.stat().st_size for p in cache.rglob("*.entry"))
        runs["warm"].append(measure(ours(d), mine, sample=quick))
        if not quick:
            runs["nocache"].append(measure(ours(d, "--no-cache"), mine))
        if built:
            runs["msgspec"].append(measure(ours(d, "--no-cache"), {**mine, **pure}))
        shutil.rmtree(cache, ignore_errors=True)
        if hta and len(runs["hta"]) < args.hta_repeat:
            runs["hta"].append(measure([hta, "-c", HTA, str(d)],
                                       {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}))
    bare, cold, nocache, warm = (runs[k] for k in ("bare", "cold", "nocache", "warm"))
    assert all(r["out"] == cold[0]["out"] for r in cold + warm + nocache + runs["msgspec"]), \
        "answers differ"
    # peak memory: one sampled run each, apart from the timed ones
    cache = Path(tempfile.mkdtemp(prefix="residency-bench-cache-"))
    mine = {**env, "RESIDENCY_CACHE_DIR": str(cache)}
    rss = {} if quick else {
        "bare": peak_mb(bare_argv(files), env), "cold": peak_mb(ours(d), mine),
        "warm": peak_mb(ours(d), mine), "nocache": peak_mb(ours(d, "--no-cache"), mine)}
    shutil.rmtree(cache, ignore_errors=True)
    if runs["hta"]:
        rss["hta"] = peak_mb([hta, "-c", HTA, str(d)],  # type: ignore[list-item]
                             {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"})
    if runs["msgspec"]:
        rss["msgspec"] = peak_mb(ours(d, "--no-cache"), {**mine, **pure})
    for k, mb_ in rss.items():
        for r in runs[k]:
            r["rss_mb"] = mb_
    mb = total / 1e6
    print(f"\n== {label}: {ranks} ranks, {mb:.0f} MB of {tracegen.SHAPES[fmt]} ({load()})")
    print(f"{'bare read (sequential)':<38} {show(bare)}  CPU {show(bare, 'cpu_s')}  "
          f"peak RSS {med(bare, 'rss_mb'):.0f} MB  ({BARE_WHAT[fmt == 'ascend-db']})")
    what = "SQLite" if fmt == "ascend-db" else "JSON"
    for name, rs in (("`residency idle`, cold (default)", cold),
                     ("`residency idle --no-cache`", nocache),
                     ("`residency idle`, warm", warm),
                     ("  --no-cache, msgspec path (no reader)", runs["msgspec"])):
        if not rs:
            continue
        print(f"{name:<38} {show(rs)}  CPU {show(rs, 'cpu_s')}  peak RSS "
              f"{med(rs, 'rss_mb'):.0f} MB = {med(rs, 'rss_mb') / mb:.1%} of the {what}")
    print(f"cold / bare read: wall {ratio(cold, bare)}, CPU {ratio(cold, bare, 'cpu_s')}  "
          "(target <= 1.2x)")
    if runs["msgspec"]:
        if nocache:  # (--scale-quick runs no --no-cache)
            print(f"--no-cache, compiled reader / msgspec path: wall "
                  f"{ratio(nocache, runs['msgspec'])}, CPU "
                  f"{ratio(nocache, runs['msgspec'], 'cpu_s')}")
    elif fmt.startswith("kineto"):
        print("the compiled reader is not built here (no C compiler at install, or "
              "RESIDENCY_PURE_PYTHON is set): every figure is the msgspec path's")
    print(f"warm / cold: wall {ratio(warm, cold)}, CPU {ratio(warm, cold, 'cpu_s')}  "
          "(target <= 0.2x)")
    if quick:
        print("(--scale-quick: no --no-cache run; peak memory sampled in the timed runs)")
    else:
        write = [max(0.0, c["cpu_s"] - n["cpu_s"]) / c["cpu_s"]
                 for c, n in zip(cold, nocache, strict=True)]
        print(f"writing the cache: CPU (cold - no-cache) / cold = {statistics.median(write):.1%}"
              f" ({min(write):.1%}-{max(write):.1%}; target <= 10 %); entries "
              f"{entry_bytes / 1e6:.2f} MB ({entry_bytes / max(1, ranks) / 1e3:.0f} kB per rank)")
    out = {"cold": cold, "bare": bare, "warm": warm, "nocache": nocache,
           "entry_bytes": entry_bytes, "mb": mb, "label": label, "fmt": fmt, "ranks": ranks}
    if runs["hta"]:
        h = runs["hta"]
        print(f"HTA (traceinsight) temporal breakdown  {show(h)}  CPU {show(h, 'cpu_s')}  peak "
              f"RSS {med(h, 'rss_mb'):.0f} MB")
        n = len(h)
        print(f"HTA / `residency idle` cold, process to process: wall "
              f"{ratio(h, cold[:n])}, CPU {ratio(h, cold[:n], 'cpu_s')}  (target >= 30x)")
        out["hta"] = h
    return out


IMPORTED = ("import atexit, gc; atexit.register(gc.freeze); "
            "import residency.analysis.idle, residency.traces.load; ")


def dask_case(args: argparse.Namespace, base: Path, env: dict[str, str]) -> dict | None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("\n== Dask: skipped: dask[distributed] is not installed (pip install "
              "'residency[cluster]')")
        return None
    d = base / "dask"
    total = tracegen.generate(d, args.dask_ranks, args.dask_events, args.seed)
    local, cluster, imports = [], [], []
    mine = {**env, "RESIDENCY_NO_CACHE": "1"}
    for _ in range(args.repeat):
        local.append(measure(ours(d, "--workers", "2"), mine))
        cluster.append(measure(ours(d, "--scheduler", "local", "--workers", "2"), mine))
        # what no LocalCluster run avoids: importing distributed after what `residency idle`
        # has imported (numpy among it, which distributed would import too), ending as it
        # does, against the same process without distributed
        imports.append(measure([sys.executable, "-c", IMPORTED + "import distributed"],
                               mine)["wall_s"]
                       - measure([sys.executable, "-c", IMPORTED], mine)["wall_s"])
    assert all(r["out"] == local[0]["out"] for r in local + cluster), "answers differ"
    for runs, extra in ((local, ("--workers", "2")),
                        (cluster, ("--scheduler", "local", "--workers", "2"))):
        mb_ = peak_mb(ours(d, *extra), mine)
        for r in runs:
            r["rss_mb"] = mb_
    print(f"\n== Dask: {args.dask_ranks} ranks x {args.dask_events} events, {total / 1e6:.0f} MB "
          f"({load()}); "
          "identical JSON on both paths")
    print(f"local worker processes (2)             {show(local)}  peak RSS "
          f"{med(local, 'rss_mb'):.0f} MB")
    print(f"LocalCluster, 2 workers (--scheduler)  {show(cluster)}  peak RSS "
          f"{med(cluster, 'rss_mb'):.0f} MB")
    fixed = med(cluster, "wall_s") - med(local, "wall_s")
    floor = [(r["wall_s"] + x) / r["wall_s"] for r, x in zip(local, imports, strict=True)]
    print(f"LocalCluster / local: wall {ratio(cluster, local)}  (target within 1.3x); "
          f"Dask's fixed cost {fixed:.2f} s (importing distributed, starting the cluster, "
          "the first tasks), so the ratio falls as ranks grow")
    print(f"  of which importing distributed alone {statistics.median(imports):.2f} s "
          f"({min(imports):.2f}-{max(imports):.2f}, n={len(imports)}, after what the local "
          f"path imports, in a process of its own): no LocalCluster run can be under "
          f"{statistics.median(floor):.2f}x of this local path")
    return {"local": local, "cluster": cluster, "ranks": args.dask_ranks}


def scaling_case(args: argparse.Namespace, base: Path, env: dict[str, str]) -> dict:
    """`--scaling-ranks` ranks (Kineto, `--dask-events` events each) read with `--workers` 1,
    2, 4, ... up to this machine's CPUs, `--no-cache`, interleaved rounds: the speedup over one
    worker (target: at least 10x on 16 workers), and Amdahl's serial fraction from the widest
    run, with what it projects for 16 workers where fewer CPUs are here (a projection, not a
    measurement)."""
    d = base / f"kineto-{args.scaling_ranks}x{args.dask_events}"
    total = tracegen.generate(d, args.scaling_ranks, args.dask_events, args.seed)
    cpus = usable_cpus()
    widths = sorted({w for w in (1, 2, 4, 8, 16, 32, 64) if w <= cpus} | {cpus})
    mine = {**env, "RESIDENCY_NO_CACHE": "1"}
    runs: dict[int, list[dict]] = {w: [] for w in widths}
    for _ in range(args.repeat):
        for w in widths:
            runs[w].append(measure(ours(d, "--workers", str(w)), mine))
    assert all(r["out"] == runs[1][0]["out"] for rs in runs.values() for r in rs), \
        "answers differ"
    print(f"\n== Workers: {args.scaling_ranks} ranks x {args.dask_events} events, "
          f"{total / 1e6:.0f} MB, --no-cache, {cpus} CPUs here ({load()}); identical JSON "
          "at every width")
    for w in widths:
        speed = _paired(runs[1], runs[w])
        print(f"--workers {w:<3} {show(runs[w])}  CPU {show(runs[w], 'cpu_s')}  speedup over "
              f"one worker {speed[0]:.2f}x (n={speed[1]})")
    wide = widths[-1]
    out = {"widths": widths, "runs": runs, "ranks": args.scaling_ranks}
    if wide >= 16:
        print("(measured above: the target is >= 10x at 16 workers)")
        return out
    # the fixed cost at this width: the same number of ranks of 1,000 events each (start-up,
    # imports, workers started, each rank's plan and reduction handed back, the summary)
    tiny = base / f"kineto-{args.scaling_ranks}x1000"
    tracegen.generate(tiny, args.scaling_ranks, 1000, args.seed)
    fixed = [measure(ours(tiny, "--workers", str(wide)), mine) for _ in range(args.repeat)]
    t1, f = med(runs[1], "wall_s"), med(fixed, "wall_s")
    at16 = t1 / (f + max(0.0, t1 - f) / 16)
    out["projected_16"] = at16
    print(f"fixed cost at --workers {wide}: {show(fixed)} (the same {args.scaling_ranks} ranks "
          f"of 1,000 events each); projected on 16 workers, the rest divided by 16: "
          f"{t1:.2f} s / ({f:.2f} s + {max(0.0, t1 - f):.2f} s / 16) = {at16:.1f}x (target "
          ">= 10x; a projection from this machine's one-worker run and fixed cost, not a "
          "measurement: starting 16 workers costs more than starting "
          f"{wide}; run this on a 16-core host)")
    return out


def on_paper(per: dict, dask: dict | None) -> None:
    """1,024 ranks x 1 GB on N workers, from the measured per-rank figures."""
    cold, mb = per["cold"], per["mb"]
    cpu_per_gb = med(cold, "cpu_s") / (mb / 1000)  # CPU seconds per GB of JSON, all included
    entry = per["entry_bytes"] / max(1, per["ranks"])  # one rank's reduction, as cached
    ranks_gb = per["mb"] / 1000 / per["ranks"]
    per_worker = med(cold, "rss_mb") / min(per["ranks"], os.cpu_count() or 1)
    if ranks_gb >= 0.5:  # a worker streams its rank: extrapolate only from ranks near 1 GB
        rss_gb = 45 + max(0.0, per_worker - 45) / ranks_gb  # interpreter + per GB
        memory = (f"a worker ~{rss_gb:.0f} MB for a 1 GB rank (45 MB interpreter + the "
                  "measured per-GB growth)")
        each = f"each worker ~{rss_gb:.0f} MB; "
    else:
        memory = (f"a worker {per_worker:.0f} MB for a {ranks_gb * 1000:.0f} MB rank (run "
                  "--scale 1gb for a 1 GB rank's; streamed, it does not grow with the file)")
        each = ""
    overhead = 0.0
    if dask:
        overhead = max(0.0, (med(dask["cluster"], "wall_s") - med(dask["local"], "wall_s")))
    print(f"\n== On paper: 1,024 ranks x 1 GB, from the figures above: {cpu_per_gb:.1f} CPU s "
          f"per GB (cold, whole process), a rank's reduction {entry / 1e3:.0f} kB per "
          f"{ranks_gb * 1000:.0f} MB (so ~{entry / max(ranks_gb, 1e-9) / 1e6:.2f} MB per GB), "
          f"{memory}, " + (f"Dask's fixed cost (import, cluster start, first tasks) "
                           f"~{overhead:.1f} s" if dask else "Dask's fixed cost not measured "
                           "(the Dask case did not run; left out below)"))
    red = entry / max(ranks_gb, 1e-9) * 1024
    for n in (8, 64, 256, 1024):
        wall = math.ceil(1024 / n) * cpu_per_gb + overhead
        took = f"{wall / 60:.1f} min" if wall >= 60 else f"{wall:.0f} s"
        print(f"  N = {n:>4} workers (one core each, traces on shared storage): "
              f"~{took:>8}; {each}the client gathers "
              f"~{red / 1e6:.0f} MB of reductions")
    print("  (storage bandwidth not modelled: 1 TB read at 10 GB/s adds ~100 s at any N)")


def compile_bytecode() -> bool:
    """Compile residency's bytecode as any first run (or pip, at install) would, when this
    environment forbids writing it; whether it had to."""
    if not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return False
    import compileall

    return bool(compileall.compile_dir(ROOT / "residency", quiet=1))


# per shape: (ranks, events per rank) of the default run (practical on 2 cores) and of --scale
DEFAULT = {"kineto-dense": (2, 500_000), "kineto-host": (2, 400_000), "ascend": (8, 110_000),
           "ascend-db": (8, 110_000)}
BYTES_PER_EVENT = {"kineto": 240, "kineto-dense": 160, "kineto-host": 170, "ascend": 200,
                   "ascend-db": 50}
SCALED = {  # 1gb: the 2 x 2.5M device-dense case and ~1.2 GB of the others
    "1gb": {"kineto": (2, 2_500_000), "kineto-dense": (2, 2_500_000),
            "kineto-host": (2, 3_500_000), "ascend": (2, 3_000_000),
            "ascend-db": (2, 12_000_000)},
    "8x1gb": {fmt: (8, 1_000_000_000 // b) for fmt, b in BYTES_PER_EVENT.items()},
}


def _paired(num: list[dict], den: list[dict], key: str = "wall_s") -> tuple[float, int]:
    """The median ratio of paired rounds and their number."""
    r = [n[key] / d[key] for n, d in zip(num, den, strict=True)]
    return statistics.median(r), len(r)


def case_rows(cases: list[dict]) -> list[dict[str, str]]:
    """One row per case: every target on every shape, as the table prints it."""
    rows = []
    for c in cases:
        cold_bare, n = _paired(c["cold"], c["bare"])
        cold_bare_cpu, _ = _paired(c["cold"], c["bare"], "cpu_s")
        warm_cold, _ = _paired(c["warm"], c["cold"])
        peak = max(med(c["cold"], "rss_mb"), med(c["warm"], "rss_mb"))
        write = "-"
        if c.get("nocache"):
            write = format(statistics.median(max(0.0, a["cpu_s"] - b["cpu_s"]) / a["cpu_s"]
                                             for a, b in zip(c["cold"], c["nocache"],
                                                             strict=True)), ".1%")
        row = {"case": c["label"], "input": f"{c['mb']:,.0f} MB", "n": str(n),
               "cold / bare, wall": f"{cold_bare:.2f}x",
               "cold / bare, CPU": f"{cold_bare_cpu:.2f}x",
               "warm / cold, wall": f"{warm_cold:.2f}x", "writing the cache, CPU": write,
               "peak of the tree": f"{peak:,.0f} MB = {peak / c['mb']:.1%}",
               "HTA or msprof-analyze / ours, cold": "-"}
        if "hta" in c:
            h = c["hta"]
            wall, k = _paired(h, c["cold"][:len(h)])
            cpu, _ = _paired(h, c["cold"][:len(h)], "cpu_s")
            row["HTA or msprof-analyze / ours, cold"] = (
                f"HTA {wall:.1f}x wall, {cpu:.1f}x CPU (n={k}; target 30x)")
        if "msprof" in c:
            m = c["msprof"]
            wall, k = _paired(m["theirs"], m["ours"])
            cpu, _ = _paired(m["theirs"], m["ours"], "cpu_s")
            row["HTA or msprof-analyze / ours, cold"] = (
                f"msprof-analyze {wall:.2f}x wall, {cpu:.2f}x CPU (n={k}; goal 10x); figures "
                f"identical on {m['agree']} of {m['ranks']} ranks")
        rows.append(row)
    return rows


TARGETS = ("targets: cold <= 1.2x the bare read, warm <= 0.2x cold, writing the cache <= 10 % "
           "of the cold CPU, peak <= 25 % of the input, HTA >= 30x, msprof-analyze goal >= 10x")


def summary(cases: list[dict], markdown: Path | None = None, started: str = "") -> None:
    """One line per case: every target on every shape; with `markdown`, the same table
    written there as Markdown (with the commit, the time and the load it ran under)."""
    if not cases:
        return
    rows = case_rows(cases)
    print(f"\n== Every case (median ratios of paired rounds; {TARGETS})")
    print(f"{'case':<44} {'input':>9} {'cold/bare':>10} {'CPU':>7} {'warm/cold':>10} "
          f"{'cache':>7} {'peak':>20}")
    for r in rows:
        print(f"{r['case']:<44} {r['input']:>9} {r['cold / bare, wall']:>10} "
              f"{r['cold / bare, CPU']:>7} {r['warm / cold, wall']:>10} "
              f"{r['writing the cache, CPU']:>7} {r['peak of the tree']:>20}")
        if r["HTA or msprof-analyze / ours, cold"] != "-":
            print(f"  against: {r['HTA or msprof-analyze / ours, cold']}")
    if markdown is not None:
        head = list(rows[0])
        ended = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        lines = [f"One run of `python benchmarks/trace_analysis.py {' '.join(sys.argv[1:])}` "
                 f"at {commit()}, {started} to {ended} ({usable_cpus()} CPUs, {load()} at the "
                 f"end); medians of n paired rounds; {TARGETS}.", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r[k].replace("|", "\\|") for k in head) + " |" for r in rows]
        markdown.write_text("\n".join(lines) + "\n")
        print(f"(the table, as Markdown: {markdown})")


def commit() -> str:
    """The checked-out commit of this tree (``+changes`` where the tree differs), or
    ``unknown``."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=2101)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=110_000, help="events per rank (standard)")
    ap.add_argument("--hta-python", default="/tmp/ti/bin/python",
                    help="interpreter with traceinsight installed (a separate venv)")
    ap.add_argument("--scale", choices=["1gb", "8x1gb"],
                    help="also every shape at this size (SCALED: ~1.2 GB in 2 ranks, or 8 "
                         "ranks of ~1 GB each; needs the disk, checked first)")
    ap.add_argument("--shapes", default=",".join(tracegen.SHAPES),
                    help="comma-separated trace shapes (tracegen.SHAPES), each its own case")
    ap.add_argument("--dask-ranks", type=int, default=64)
    ap.add_argument("--dask-events", type=int, default=110_000,
                    help="events per rank (Dask; default: the standard case's rank)")
    ap.add_argument("--scaling-ranks", type=int, default=0,
                    help="also read this many Kineto ranks (--dask-events events each) with "
                         "--workers 1, 2, 4, ... up to the CPUs here: the speedup over one "
                         "worker (0: skipped)")
    ap.add_argument("--markdown", type=Path,
                    help="write the table of every case here, as Markdown (for the README)")
    ap.add_argument("--skip-standard", action="store_true",
                    help="only the --scale cases (and Dask)")
    ap.add_argument("--dir", type=Path, help="keep the generated traces here")
    ap.add_argument("--msprof-python", default="/tmp/msprof/bin/python",
                    help="interpreter with msprof-analyze 26.2.0 installed (a separate venv), "
                         "run on the ascend-db cases")
    ap.add_argument("--msprof-max-mb", type=float, default=float("inf"),
                    help="leave msprof-analyze out on larger database cases")
    ap.add_argument("--scale-repeat", type=int, default=1,
                    help="rounds of the --scale cases under --scale-quick")
    ap.add_argument("--scale-quick", action="store_true",
                    help="--scale cases: --scale-repeat rounds, no --no-cache run, peak memory "
                         "sampled in the timed runs (minutes a run at 8 x 1 GB on 2 cores)")
    ap.add_argument("--msprof-repeat", type=int, default=1,
                    help="paired rounds of msprof-analyze and ours (slow: minutes at scale)")
    args = ap.parse_args()
    shapes = [x for x in args.shapes.split(",") if x]
    unknown = [x for x in shapes if x not in tracegen.SHAPES]
    if unknown:
        ap.error(f"The value for --shapes must name shapes of {list(tracegen.SHAPES)}, but "
                 f"{unknown} was passed.")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    if compile_bytecode():
        print("residency's bytecode compiled first (PYTHONDONTWRITEBYTECODE is set here: "
              "without it every run would compile our modules again, ~0.05 s, while an "
              "installed package, as HTA's, has its bytecode)")
    base = args.dir or Path(tempfile.mkdtemp(prefix="residency-bench-"))
    base.mkdir(parents=True, exist_ok=True)  # (a new --dir: the disk check reads it first)
    hta = args.hta_python
    why = None
    if not Path(hta).exists():
        why = f"{hta} does not exist"
    elif subprocess.run([hta, "-c", "import hta"], capture_output=True).returncode:
        why = f"{hta} cannot import hta"
    if why:
        print(f"HTA skipped: {why} (python -m venv /tmp/ti && /tmp/ti/bin/pip install "
              "traceinsight==0.6.1)")
        hta = None
    msprof = args.msprof_python
    why = None
    if "ascend-db" not in shapes:
        msprof = None
    elif not Path(msprof).exists():
        why = f"{msprof} does not exist"
    elif subprocess.run([msprof, "-c", "import msprof_analyze"], capture_output=True).returncode:
        why = f"{msprof} cannot import msprof_analyze"
    if why:
        print(f"msprof-analyze skipped: {why} (python -m venv /tmp/msprof && "
              "/tmp/msprof/bin/pip install msprof-analyze==26.2.0)")
        msprof = None
    cases: list[dict] = []
    try:
        per = None
        plans = [] if args.skip_standard else [
            (fmt, "", *((args.ranks, args.events) if fmt == "kineto" else DEFAULT[fmt]))
            for fmt in shapes]
        if args.scale:
            plans += [(fmt, args.scale, *SCALED[args.scale][fmt]) for fmt in shapes]
        for fmt, scale, ranks, events in plans:
            d = base / f"{fmt}-{ranks}x{events}"
            need = ranks * events * BYTES_PER_EVENT[fmt]
            free = shutil.disk_usage(base).free
            label = f"{fmt}{' ' + scale if scale else ''} ({events} events per rank)"
            if free < need * 1.2 and not (d / "generated.params").is_file():
                print(f"\n== {label}: skipped: {free / 1e9:.1f} GB free, "
                      f"{need / 1e9:.1f} GB needed")
                continue
            total = tracegen.generate(d, ranks, events, args.seed, fmt=fmt)
            case = against_bare(label, d, total, ranks, args, env,
                                hta if fmt == "kineto" and not scale else None, fmt=fmt,
                                quick=bool(scale) and args.scale_quick)
            cases.append(case)
            if fmt == "ascend-db" and msprof and total / 1e6 > args.msprof_max_mb:
                print(f"\n== {label}: msprof-analyze skipped: {total / 1e6:.0f} MB, over "
                      f"--msprof-max-mb {args.msprof_max_mb:g}")
            elif fmt == "ascend-db" and msprof:
                case["msprof"] = msprof_case(label, d, args, env, msprof)
            if fmt == "kineto":
                per = case
            if scale and args.dir is None:  # (a large case's disk, back before the next)
                shutil.rmtree(d, ignore_errors=True)
        summary(cases, args.markdown, started)
        dask = dask_case(args, base, env) if args.dask_ranks else None
        if args.scaling_ranks:
            scaling_case(args, base, env)
        if per is not None:
            on_paper(per, dask)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
