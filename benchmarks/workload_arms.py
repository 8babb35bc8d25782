"""Baseline vs candidate on the emulated NPU, measured side by side in one run.

Runs one unprofiled baseline/candidate pair of the built-in service (2 ranks, default scale,
50 steps by default), then prints per-rank normal-call durations, request E2E per arm and the
ratio of normal-call medians. Target: candidate's normal call >= 20x faster than baseline's
(the published NPU figures were 216.8-251.2 ms vs 1.33-1.58 ms). Emulated figures are not
NPU figures.

    python benchmarks/workload_arms.py [--ranks 2] [--steps 50] [--scale 1.0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from residency.experiments.designs import run_pair
from residency.rundir.assignment import assigned_decisions
from residency.rundir.run import load_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--keep", metavar="DIR", help="keep the run directory here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp) / "run"
        run = load_run(run_pair("alternating", out=out, device="emulated-npu",
                                ranks=args.ranks, steps=args.steps, pairs=1,
                                scale=args.scale))
        medians = {}
        print(f"emulated NPU (not an NPU measurement), {args.ranks} ranks, {args.steps} steps, "
              f"scale {args.scale}; one unprofiled pair, order {run.manifest['order']}")
        for entry in run.runs:
            df = assigned_decisions(run, entry)
            normal = df[df["kind"] == "normal"].sort_values("rank")
            ms = (normal["duration_ns"] / 1e6).tolist()
            medians[entry.arm] = statistics.median(ms)
            outcomes = ", ".join(normal["outcome"].tolist())
            print(f"  {entry.arm:<9} normal call per rank: "
                  + ", ".join(f"{v:.3f}" for v in ms) + f" ms ({outcomes}); "
                  f"request E2E {entry.e2e_s:.3f} s (n=1 request)")
        ratio = medians["baseline"] / medians["candidate"]
        print(f"ratio of normal-call medians baseline/candidate: {ratio:.1f}x "
              f"(target >= 20x: {'met' if ratio >= 20 else 'NOT met'}; n={args.ranks} ranks "
              "per arm, one run pair)")


if __name__ == "__main__":
    main()
