"""E2E noise and attribution on the emulated NPU: an A/A run beside the default main job.

In one invocation (emulated NPU, 2 ranks, 50 steps, default scale and device model):

1. an A/A run (`--design aa`: the candidate in both slots, ABBA order) of `--aa-pairs` pairs
   (at least 3, i.e. 6 same-arm service runs), each run measuring `--requests` requests;
2. the default main job, `papermill notebooks/paired_profile.ipynb` with its own default
   parameters, timed from start to finish; its unprofiled pairs are the A/B run.

It prints the E2E coefficient of variation of the A/A runs (target <= 2 % on 2 cores) and
their spread, and for every A/B pair the E2E delta beside the normal-call saving and the
phase deltas (from the phase markers' durations in the service response: prepare, denoise,
decode; per request the slowest rank, per run the median over its requests): how much of
the E2E delta the release calls explain and how much the later phases (re-acquiring and
re-faulting released memory). Target: the fix's sign (candidate faster) in every pair. Then
the E2E verdict of the main job and its wall time (target <= 10 min on 2 cores), with the
load average seen while it ran. Emulated figures are not NPU figures.

    python benchmarks/emulated_noise.py [--aa-pairs 3] [--requests R] [--keep DIR]
        [--main-job-dir DIR]   # analyse an existing main-job output instead of running it
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from residency.analysis import stats
from residency.evidence import notes
from residency.evidence.verdicts import e2e_verdict
from residency.experiments.designs import run_pair
from residency.rundir.run import Run, RunEntry, load_run

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("prepare_ns", "denoise_ns", "decode_ns")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path(
        "/proc/loadavg").exists() else "n/a"


def _requests(run: Run, entry: RunEntry) -> list[dict[str, Any]]:
    client = run.client(entry)
    return [r["response"] for r in client.get("requests") or []] or [client["response"]]


def _per_run(run: Run, entry: RunEntry) -> dict[str, float]:
    """Median over the run's measured requests of: the slowest rank's phase times (s) and
    the slowest rank's normal-call time (s)."""
    rows: dict[str, list[float]] = {k: [] for k in (*PHASES, "normal_ns")}
    for response in _requests(run, entry):
        ranks = response["per_rank"]
        for key in PHASES:
            rows[key].append(max(r[key] for r in ranks) / 1e9)
        rows["normal_ns"].append(max(sum(r["normal"]["duration_ns"]) for r in ranks) / 1e9)
    return {k: statistics.median(v) for k, v in rows.items()}


def _pairs(run: Run) -> list[tuple[RunEntry, RunEntry]]:
    b = [e for e in run.arm("baseline") if not e.profiled]
    c = [e for e in run.arm("candidate") if not e.profiled]
    return list(zip(b, c, strict=False))


def run_main_job(out: Path, aa: Path | None = None) -> tuple[float, str, str]:
    """Run the default main job into `out` (with `aa_source` = `aa`, so its report reads
    the E2E delta against this A/A run); returns (wall s, load before, load after)."""
    load_before = _load()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3",
         str(ROOT / "notebooks" / "paired_profile.ipynb"), str(out / "paired_profile.ipynb"),
         "-p", "output_dir", str(out), "-r", "device", "emulated-npu",
         *(["-r", "aa_source", str(aa)] if aa is not None else [])],
        capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"main job failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, load_before, _load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa-pairs", type=int, default=3, help="A/A pairs (2 runs each)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per A/A run (default: the main job's)")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories here")
    parser.add_argument("--main-job-dir", metavar="DIR",
                        help="an existing main-job output directory (skip running it)")
    args = parser.parse_args()
    if args.aa_pairs < 3:
        parser.error("--aa-pairs must be at least 3 (6 same-arm runs)")
    sys.path.insert(0, str(ROOT / "notebooks"))
    from build import PAIRED_PAIRS, PAIRED_REQUESTS  # the main job's defaults

    requests = args.requests or PAIRED_REQUESTS
    print(f"emulated NPU (not an NPU measurement), 2 ranks, 50 steps, scale 1.0; "
          f"{os.cpu_count()} CPUs, load average {_load()} at start")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        aa_load = _load()
        aa_start = time.perf_counter()
        aa = load_run(run_pair("aa", out=base / "aa", device="emulated-npu", ranks=2,
                               steps=50, pairs=args.aa_pairs, requests=requests,
                               progress=False))
        aa_wall = time.perf_counter() - aa_start
        slot_a, slot_b = _aa_slots(aa)
        noise = stats.aa_noise(slot_a, slot_b)
        cv_ok = noise.cv is not None and noise.cv <= 0.02
        print(f"\nA/A ({len(slot_a) * 2} candidate runs, {requests} requests each, "
              f"{aa_wall:.0f} s, load {aa_load} -> {_load()}):")
        print("  run E2E (s, median of its requests): "
              + ", ".join(f"{x:.3f}" for x in [*slot_a, *slot_b]))
        print(f"  {notes.note(noise)}")
        print(f"  E2E coefficient of variation {noise.cv:.2%} (target <= 2 %: "
              f"{'met' if cv_ok else 'NOT met'})")

        if args.main_job_dir:
            main_dir, wall, before, after = Path(args.main_job_dir), None, "n/a", "n/a"
        else:
            main_dir = base / "main"
            main_dir.mkdir(parents=True, exist_ok=True)
            wall, before, after = run_main_job(main_dir, aa=base / "aa")
        ab = load_run(main_dir / "run")
        _report_ab(ab, noise)
        if wall is not None:
            print(f"\ndefault main job (paired_profile.ipynb, {PAIRED_PAIRS} unprofiled pairs "
                  f"+ the profiled pair, {PAIRED_REQUESTS} requests per unprofiled run): "
                  f"{wall / 60:.1f} min wall (target <= 10 min on 2 cores: "
                  f"{'met' if wall <= 600 else 'NOT met'}); load average {before} before, "
                  f"{after} after")


def _aa_slots(aa: Run) -> tuple[list[float], list[float]]:
    slots: dict[str, list[float]] = {"A": [], "B": []}
    for entry in aa.manifest["runs"]:
        slots[entry["slot"]].append(float(entry["e2e_s"]))
    return slots["A"], slots["B"]


def _report_ab(ab: Run, noise: stats.AANoise) -> None:
    pairs = _pairs(ab)
    print(f"\nA/B: unprofiled pairs of the main job ({len(pairs)} pairs, "
          f"order {[e.arm for e in ab.runs if not e.profiled]}):")
    print("  pair  E2E delta (s)  normal-call saving (s)  prepare  denoise  decode "
          "(deltas, s; candidate - baseline)")
    signs, deltas, savings, phase_deltas = [], [], [], []
    for i, (b, c) in enumerate(pairs, 1):
        pb, pc = _per_run(ab, b), _per_run(ab, c)
        delta = float(c.e2e_s or 0) - float(b.e2e_s or 0)
        saving = pb["normal_ns"] - pc["normal_ns"]
        phases = [pc[k] - pb[k] for k in PHASES]
        signs.append(delta < 0)
        deltas.append(delta)
        savings.append(saving)
        phase_deltas.append(phases)
        print(f"  {i:>4}  {delta:+13.3f}  {saving:22.3f}  {phases[0]:+7.3f}  "
              f"{phases[1]:+7.3f}  {phases[2]:+6.3f}")
    if deltas:
        med = statistics.median(deltas)
        release = -statistics.median(savings)
        prep, den, dec = (statistics.median(p[k] for p in phase_deltas) for k in range(3))
        parts = [("the normal release calls", release),
                 ("the rest of the preparation window (re-acquiring and re-faulting what the "
                  "baseline released)", prep - release),
                 ("denoise", den), ("decode", dec)]
        print(f"  where the median E2E delta ({med:+.3f} s) comes from, medians over pairs "
              "(slowest rank per request, median per run; the parts need not add up exactly):")
        for name, value in parts:
            share = f" ({value / med:.0%} of it)" if med else ""
            print(f"    {name}: {value:+.3f} s{share}")
    print(f"  the fix's sign (candidate faster) in {sum(signs)} of {len(signs)} pairs "
          f"(target: every pair: {'met' if signs and all(signs) else 'NOT met'})")
    b = [float(x.e2e_s or 0) for x, _ in pairs]
    c = [float(y.e2e_s or 0) for _, y in pairs]
    if len(b) >= 2:
        diff = stats.compare_pairs(b, c, unit="s", noise=noise.spread)
        margin = 0.02 * statistics.median(b)
        eq = stats.equivalence_pairs(b, c, margin=margin, unit="s",
                                     margin_label="2 % of the baseline median E2E")
        print(f"  {notes.note(diff)}")
        print(f"  {notes.note(eq)}")
        print(f"  {e2e_verdict(diff, eq)}")


if __name__ == "__main__":
    main()
