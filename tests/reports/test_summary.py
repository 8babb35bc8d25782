"""The first screen (`residency.reports.summary`) and the host load it warns about
(`residency.rundir.hostload`), on the recorded runs and on hand-made records (issue 25)."""

from __future__ import annotations

import pytest

from residency import evidence
from residency.records.manifest import read_manifest
from residency.reports import summary
from residency.rundir import hostload
from residency.rundir.run import load_run
from tests.helpers import PAIRED


def _sample(t_s: float, busy_s: float | None, own_s: float, load: float = 0.5,
            cpus: int = 2) -> hostload.Sample:
    return hostload.Sample(loadavg=(load, load, load), cpu_count=cpus, host_busy_s=busy_s,
                           own_cpu_s=own_s, monotonic_ns=int(t_s * 1e9))


def test_other_processes_cpu_share_is_host_busy_minus_own_over_wall_times_cpus() -> None:
    # 10 s on 2 CPUs: the host was busy 12 CPU-seconds, this process and its services 9:
    # other processes used 3 of 20 CPU-seconds
    rec = hostload.record(_sample(100, 1000, 50), _sample(110, 1012, 59, load=1.5))
    assert rec["other_cpu_share"] == pytest.approx(0.15)
    assert rec["start"] == {"loadavg": [0.5, 0.5, 0.5], "cpu_count": 2}
    assert rec["end"]["loadavg"] == [1.5, 1.5, 1.5] and rec["seconds"] == 10
    assert hostload.loaded(rec)  # 15 % >= 10 %
    quiet = hostload.record(_sample(0, 0, 0), _sample(10, 9.5, 9))
    assert quiet["other_cpu_share"] == pytest.approx(0.025) and not hostload.loaded(quiet)
    off_linux = hostload.record(_sample(0, None, 0), _sample(10, None, 9))
    assert off_linux["other_cpu_share"] is None
    assert hostload.loaded({"start": {"loadavg": [1.2, 1, 1], "cpu_count": 2},
                            "other_cpu_share": None})  # 1.2 >= 0.5 x 2 before the run


def test_summarize_weights_the_runs_by_time_and_keeps_the_largest() -> None:
    runs = [{"start": {"loadavg": [0.1, 0, 0], "cpu_count": 2}, "end": {}, "seconds": 30,
             "other_cpu_share": 0.0},
            {"start": {}, "end": {"loadavg": [2, 1, 1], "cpu_count": 2}, "seconds": 10,
             "other_cpu_share": 0.4}]
    whole = hostload.summarize([*runs, None])
    assert whole["other_cpu_share"] == pytest.approx(0.1) and whole["other_cpu_share_max"] == 0.4
    assert whole["runs"] == 2 and hostload.loaded(whole)
    assert hostload.summarize([None, {}]) is None


def test_a_sample_of_this_host_reads_load_and_cpus() -> None:
    s = hostload.sample()
    assert s.cpu_count and s.own_cpu_s > 0 and s.monotonic_ns > 0


def test_first_screen_of_the_recorded_run(paired_evidence: evidence.Evidence) -> None:
    s = summary.summarize(paired_evidence, manifest=load_run(PAIRED).manifest)
    assert [r.key for r in s.rows] == ["normal_call", "normal_released", "forced_released",
                                       "telemetry_errors", "idle_intersection", "e2e"]
    assert all(r.n and r.verdict and r.change for r in s.rows)
    assert s.e2e.count("erdict:") == 1 and "-21.65 % of the baseline median" in s.e2e
    # the emulated shares of E2E are more than 10x the published ones: said, with both
    (far,) = [w for w in s.warnings if "does not transfer" in w]
    assert "0.009841 % in the published NPU run (isolated pair)" in far
    assert "% of the baseline's E2E here" in far
    assert all(x.factor > summary.TRANSFER_FACTOR for x in s.shares)
    assert "Host load not recorded" in s.host and not any("Loaded host" in w
                                                          for w in s.warnings)
    md = summary.first_screen_markdown(s)
    assert md.index("E2E") < md.index("What this says about an NPU") < md.index(
        "| attribution |")


def test_a_loaded_host_is_warned_about_on_the_first_screen(
        paired_evidence: evidence.Evidence) -> None:
    manifest = read_manifest(PAIRED)
    manifest["host_load"] = {"start": {"loadavg": [2.1, 1.8, 1.0], "cpu_count": 2},
                             "end": {"loadavg": [3.4, 2.0, 1.2], "cpu_count": 2},
                             "other_cpu_share": 0.35, "other_cpu_share_max": 0.49, "runs": 8}
    s = summary.summarize(paired_evidence, manifest=manifest)
    (loaded,) = [w for w in s.warnings if w.startswith("**Loaded host**")]
    assert "load average 2.10 at the start and 3.40 at the end on 2 CPUs" in loaded
    assert "other processes used 35.0 % of the CPUs (at most 49.0 % in one service run)" in loaded
    assert "rerun on a quiet machine" in loaded
    assert loaded in summary.first_screen_markdown(s)
    pr = summary.pr_markdown(s, run_dir="RUN")
    assert loaded in pr and "`residency verify RUN --digest" in pr and "<code>" not in pr
