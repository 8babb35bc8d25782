"""Known answers on the runs recorded on a real CUDA GPU (`data/runs/cuda-*`, one H200,
`scripts/device_check.sh`): every one verifies, says it came from CUDA and never from an NPU,
and its evidence holds what the device showed (the bug absent: both arms retain alike)."""

from __future__ import annotations

from pathlib import Path

import pytest

from residency import evidence
from residency.records.manifest import read_manifest
from residency.rundir.run import load_run
from tests.helpers import run_cli

RUNS = Path(__file__).resolve().parent.parent.parent / "data" / "runs"
CUDA_RUNS = sorted(RUNS.glob("cuda-*"))


def test_the_cuda_runs_are_recorded() -> None:
    assert [p.name for p in CUDA_RUNS] == [
        "cuda-consecutive-1r2s", "cuda-injected-paired-profile-auto-1r50s",
        "cuda-paired-profile-1r50s", "cuda-profiled-pair-1r5s"]


@pytest.mark.parametrize("run_dir", CUDA_RUNS, ids=lambda p: p.name)
def test_each_verifies_and_says_cuda(run_dir: Path) -> None:
    manifest = read_manifest(run_dir)
    assert manifest["device_kind"] == "cuda"
    ev = evidence.build(load_run(run_dir))
    assert ev.device_kind == "cuda"
    rc, out, err = run_cli("tables", str(run_dir))
    assert rc == 0, err
    text = out
    injected = "NPU telemetry failure injected into the baseline"
    if manifest["params"].get("inject_failure"):
        assert f"(device kind cuda: CUDA GPU, {injected})" in text
        text = text.replace(injected, "")
    else:
        assert "(device kind cuda)" in text
    assert "NPU" not in text  # neither "emulated NPU" nor an NPU claim


def test_paired_profile_on_cuda_shows_no_difference_where_the_bug_is_absent() -> None:
    ev = evidence.build(load_run(RUNS / "cuda-paired-profile-1r50s"))
    # both arms read torch.accelerator's answers: every normal call retained, every forced
    # call released, in 7 runs per arm (the profiled one and 6 unprofiled)
    assert ev["normal_released"].values == {"baseline": (0,), "candidate": (0,)}
    assert ev["normal_released"].n == {"baseline": 19, "candidate": 19}
    assert ev["forced_released"].values == {"baseline": (38,), "candidate": (38,)}
    assert ev["telemetry_errors"].values == {"baseline": (0,), "candidate": (0,)}
    e2e = ev["e2e_unprofiled"]
    assert e2e.n == {"baseline": 6, "candidate": 6}
    assert e2e.p_value == pytest.approx(27 / 32, rel=1e-12)  # exact Wilcoxon, 6 pairs
    assert "Not significant" in e2e.note


def test_first_screen_of_the_cuda_run_speaks_of_cuda_in_singular_where_one() -> None:
    from residency.reports import summary

    run = load_run(RUNS / "cuda-paired-profile-1r50s")
    s = summary.summarize(evidence.build(run), manifest=run.manifest)
    assert s.device_kind == "cuda"
    assert "6 unprofiled pairs; built-in service, 1 rank, 50 steps" in s.e2e
    assert "1 ranks" not in s.e2e
    assert "not what an NPU would measure" in s.npu


def test_the_injected_failure_on_cuda_releases_the_baselines_normal_calls() -> None:
    """The H200 run with the NPU's telemetry failure injected into the baseline at
    --scale auto (15.0 GB text encoder, 127.6 GB peak of 150.1 GB): the baseline's normal
    calls met the failure and released, the candidate's retained; the release cost shows."""
    run = load_run(RUNS / "cuda-injected-paired-profile-auto-1r50s")
    params = run.manifest["params"]
    assert params["inject_failure"]["arms"] == ["baseline"]
    assert params["sizing"]["mode"] == "auto"
    ev = evidence.build(run)
    assert ev["normal_released"].values == {"baseline": (2,), "candidate": (0,)}
    assert ev["telemetry_errors"].values == {"baseline": (2,), "candidate": (0,)}
    assert ev["forced_released"].values == {"baseline": (4,), "candidate": (4,)}
    durations = ev["normal_call_per_rank"].values
    assert min(durations["baseline"]) > 10 * max(durations["candidate"])
    neighbours = run.manifest["neighbours"]
    assert neighbours["source"] == "nvml" and neighbours["foreign"] == []


def test_the_cross_device_table_names_the_injection_in_the_runs_column() -> None:
    rc, out, err = run_cli("tables", str(RUNS / "cuda-paired-profile-1r50s"),
                           str(RUNS / "cuda-injected-paired-profile-auto-1r50s"),
                           "--published")
    assert rc == 0, err
    title = out.splitlines()[0]
    assert ("cuda-injected-paired-profile-auto-1r50s (CUDA GPU, NPU telemetry failure injected "
            "into the baseline)") in title
    assert "cuda-paired-profile-1r50s (CUDA GPU)," in title
