"""Issue #42 on the emulated NPU and CPU: the NPU's telemetry failure injected where it is
absent (mechanism, refusals, and every view of a run saying it), `--scale auto` sizing from a
capacity, and the release-cost benchmark and the emulated NPU's cost curve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from residency import devices
from residency import protocol as sizing
from residency.cli import main as cli
from residency.devicemodel import DeviceModel, curve_from_csv, fit_line
from residency.policy.cache import (
    DEFAULT_MAX_CACHED_FRACTION,
    DEFAULT_MIN_FREE_FRACTION,
    ListRecorder,
    limit_bytes,
    policy_for,
)
from residency.policy.telemetry import GenericTelemetry, TelemetryUnavailable
from tests.helpers import ROOT, run_cli

CUDA_RUN = ROOT / "data" / "runs" / "cuda-profiled-pair-1r5s"
INJECTED = "NPU telemetry failure injected into the baseline"


# ----------------------------------------------------------------------------- injection
@pytest.fixture
def restore_accelerator():
    """Put back every torch.accelerator function the injection replaces."""
    import torch

    from residency.emulated.patches import VLLM_ASCEND_REDIRECTED
    from residency.workload.inject import FAILING_FUNCTIONS

    names = set(FAILING_FUNCTIONS) | set(VLLM_ASCEND_REDIRECTED)
    saved = {n: getattr(torch.accelerator, n) for n in names}
    yield
    for name, fn in saved.items():
        setattr(torch.accelerator, name, fn)


class FakeCudaModule:
    """Stands in for torch.cuda (no GPU here): what vllm-ascend's redirection reads."""

    def __init__(self) -> None:
        self.emptied = 0

    def memory_reserved(self, device=None) -> int:
        return 3 << 30

    def memory_stats(self, device=None) -> dict:
        return {"reserved_bytes.all.current": 3 << 30}

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return 90 << 30, 100 << 30

    def empty_cache(self) -> None:
        self.emptied += 1


def test_injected_generic_queries_raise_as_torch_npu_and_the_baseline_releases(
        restore_accelerator) -> None:
    import torch

    from residency.workload.inject import FAILING_FUNCTIONS, inject_generic_telemetry_failure

    record = inject_generic_telemetry_failure("cuda")
    assert record["failing"] == list(FAILING_FUNCTIONS) and record["redirected"] == []
    for name in ("memory_allocated", "memory_reserved", "memory_stats", "empty_cache"):
        with pytest.raises(RuntimeError, match="Allocator for cuda is not a DeviceAllocator"):
            getattr(torch.accelerator, name)(*(() if name == "empty_cache" else ("cuda:0",)))
    with pytest.raises(TelemetryUnavailable) as info:
        GenericTelemetry().snapshot("cuda:0")
    assert info.value.query == "torch.accelerator.memory_reserved"  # upstream's first query
    released = []
    recorder = ListRecorder()
    policy = policy_for("baseline", "cuda:0", recorder=recorder, rank=0,
                        release=lambda: released.append(1))
    assert policy.release_if_needed() is True  # the normal call releases, as on the NPU
    assert policy.release_if_needed(force=True) is True  # forced: no telemetry read
    normal, forced = recorder.decisions
    assert normal.reason == "telemetry-unavailable" and forced.reason == "forced"
    assert "Allocator for cuda is not a DeviceAllocator" in normal.error
    assert released == [1, 1]


def test_injected_with_vllm_ascend_reserved_answers_and_allocated_raises(
        restore_accelerator) -> None:
    import torch

    from residency.workload.inject import inject_generic_telemetry_failure

    fake = FakeCudaModule()
    record = inject_generic_telemetry_failure("cuda", "vllm-ascend", module=fake)
    assert "memory_allocated" in record["failing"]
    assert set(record["redirected"]) == {"memory_reserved", "memory_stats", "empty_cache",
                                         "get_memory_info"}
    assert torch.accelerator.memory_reserved("cuda:0") == 3 << 30
    torch.accelerator.empty_cache()
    assert fake.emptied == 1
    with pytest.raises(TelemetryUnavailable) as info:
        GenericTelemetry().snapshot("cuda:0")
    assert info.value.query == "torch.accelerator.memory_allocated"  # the second query


def test_inject_for_arm_touches_only_the_baseline(restore_accelerator) -> None:
    import torch

    from residency.workload.inject import inject_for_arm

    before = torch.accelerator.memory_allocated
    assert inject_for_arm("cuda", "candidate", "generic-telemetry") is None
    assert inject_for_arm("cuda", "always-release", "generic-telemetry") is None
    assert inject_for_arm("cuda", "baseline", "none") is None
    assert torch.accelerator.memory_allocated is before
    assert inject_for_arm("cuda", "baseline", "generic-telemetry")["kind"] == "generic-telemetry"
    assert torch.accelerator.memory_allocated is not before


@pytest.mark.parametrize(("kind", "says"), [
    ("npu", "real (torch-npu <= 2.12"), ("npu", "absent (torch-npu >= 2.13)"),
    ("emulated-npu", "already raise"), ("cpu", "cuda only")])
def test_injection_refused_where_the_failure_is_real_absent_or_already_there(
        kind: str, says: str) -> None:
    with pytest.raises(ValueError, match="--inject-failure") as info:
        devices.check_injection(kind, "generic-telemetry")
    assert says in str(info.value)
    assert devices.check_injection(kind, "none") == "none"


def test_cli_refuses_injection_on_the_emulated_npu_and_fill_without_auto(tmp_path, capsys
                                                                         ) -> None:
    assert cli.main(["pair", "--device", "emulated-npu", "--inject-failure",
                     "generic-telemetry", "--out", str(tmp_path / "r")]) == 2
    assert "already raise" in capsys.readouterr().err
    assert cli.main(["pair", "--device", "emulated-npu", "--fill", "0.8",
                     "--out", str(tmp_path / "r2")]) == 2
    assert "--fill applies with --scale auto only" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "r2").exists()


def test_labels_say_the_injection() -> None:
    assert devices.label("cuda", "generic-telemetry") == f"CUDA GPU, {INJECTED}"
    assert devices.label("cuda") == "CUDA GPU"
    assert devices.injection_of({"inject_failure": {"kind": "generic-telemetry"}}) == \
        "generic-telemetry"
    assert devices.injection_of({}) == "none"
    record = devices.injection_record("cuda", "generic-telemetry", "vllm-ascend")
    assert record["arms"] == ["baseline"] and record["accelerator_patch"] == "vllm-ascend"
    assert record["error"].endswith("Allocator for cuda is not a DeviceAllocator.")


@pytest.fixture
def faked_injected_cuda_run(tmp_path: Path) -> Path:
    """A recorded CUDA run with an injection record added and the run sealed again: FAKED
    for this test (that run was not injected), kept in tmp, never presented as measured."""
    from residency.records.manifest import Manifest

    run_dir = tmp_path / "cuda-faked-injected"
    shutil.copytree(CUDA_RUN, run_dir)
    manifest = Manifest.read(run_dir)
    manifest.params["inject_failure"] = devices.injection_record("cuda", "generic-telemetry")
    manifest.complete(run_dir)
    return run_dir


def test_every_view_of_an_injected_run_says_it(faked_injected_cuda_run: Path) -> None:
    from residency import evidence
    from residency.reports import banner, summary
    from residency.rundir.run import load_run

    run = load_run(faked_injected_cuda_run)
    assert run.injection == "generic-telemetry"
    ev = evidence.build(run)
    assert ev.label == f"CUDA GPU, {INJECTED}"
    assert ev.to_dict()["inject_failure"] == "generic-telemetry"
    s = summary.summarize(ev, manifest=run.manifest)
    assert INJECTED in s.npu
    assert INJECTED in banner.banner_line(run.manifest)
    assert INJECTED in banner.banner_markdown(run.manifest)
    assert INJECTED in banner.banner_html(run.manifest)
    for fmt in ("md", "pr"):
        rc, out, err = run_cli("tables", str(faked_injected_cuda_run), "--format", fmt)
        assert rc == 0, err
        assert INJECTED in out, fmt


def test_an_uninjected_cuda_run_says_nothing_of_an_injection() -> None:
    from residency import evidence
    from residency.reports import banner
    from residency.rundir.run import load_run

    run = load_run(CUDA_RUN)
    assert run.injection == "none"
    assert evidence.build(run).label == "CUDA GPU"
    assert "injected" not in banner.banner_line(run.manifest)


# ----------------------------------------------------------------------------- sizing
H200_BYTES = 150_011_101_184  # what torch.cuda.mem_get_info reported on the lent H200


@pytest.mark.parametrize("total", [H200_BYTES, 64 << 30, 4 << 30, 1 << 30])
def test_auto_size_holds_fill_with_the_candidates_cache_inside_both_bounds(total: int) -> None:
    s = sizing.auto_size(total)
    assert s.fill == sizing.AUTO_FILL
    assert s.peak_reserved_bytes <= int(total * s.fill) + 1
    assert s.peak_reserved_bytes > int(total * (s.fill - 0.01))
    # the cache a normal call leaves: the text encoder, within 25 %
    assert s.text_encoder_bytes <= limit_bytes(total, DEFAULT_MAX_CACHED_FRACTION)
    assert s.cached_fraction == pytest.approx(sizing.STAGED_FRACTION, rel=1e-6)
    # free after its offload (reserved stays at the peak) at least the 5 % floor
    assert total - s.peak_reserved_bytes >= limit_bytes(total, DEFAULT_MIN_FREE_FRACTION)
    assert s.resident_bytes == pytest.approx(s.resident_mib * s.scale * sizing.MiB, rel=1e-9)
    assert s.to_params()["mode"] == "auto" and "rule" in s.to_params()


def test_auto_size_on_an_h200_holds_about_120_gb() -> None:
    s = sizing.auto_size(H200_BYTES)
    assert s.scale == pytest.approx(0.10 * H200_BYTES / (768 * sizing.MiB))
    assert s.peak_reserved_bytes / 1e9 == pytest.approx(127.5, abs=0.1)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"fill": 0.95}, "fill"), ({"fill": 0}, "fill"), ({"fill": float("nan")}, "fill"),
    ({"staged_fraction": 0.3}, "staged_fraction"), ({"fill": 0.1}, "fill")])
def test_auto_size_refuses_what_would_cross_a_bound(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        sizing.auto_size(H200_BYTES, **kwargs)


def test_auto_size_of_the_emulated_npu_asks_no_device() -> None:
    assert sizing.device_total_bytes("emulated-npu") == 4 << 30
    assert sizing.device_total_bytes("emulated-npu", capacity_bytes=1 << 30) == 1 << 30


# ----------------------------------------------------------------------------- release cost
def test_fit_line_is_least_squares() -> None:
    assert fit_line([1, 2, 3], [2.5, 4.5, 6.5]) == pytest.approx((0.5, 2.0))
    with pytest.raises(ValueError, match="two or more distinct sizes"):
        fit_line([1, 1], [2, 3])


def test_release_cost_benchmark_runs_on_the_emulated_npu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "release_cost.py"), "--device",
         "emulated-npu", "--capacity", str(256 << 20), "--max-gib", "0.03125", "--block-mib",
         "8", "--points", "2", "--repeats", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "ms/GiB x C (least squares, n = 4 samples at 2 sizes)" in done.stdout
    rows = (tmp_path / "release_cost.csv").read_text().splitlines()
    assert rows[0].startswith("device_kind,") and len(rows) == 5
    assert all(r.startswith("emulated-npu,") for r in rows[1:])
    curve = curve_from_csv(tmp_path / "release_cost.csv")
    model = DeviceModel(**curve)
    assert model.cost_curve_set and "emulated-npu curve release_cost.csv (n=4)" in \
        model.describe()
    assert model.to_params()["release_ms_per_gib"] == curve["release_ms_per_gib"]


def test_the_default_model_records_no_cost_curve() -> None:
    params = DeviceModel().to_params()
    assert "release_ms" not in params and "cost_curve" not in params
    assert DeviceModel.from_params(params) == DeviceModel()


def test_a_cost_curve_is_all_or_nothing_and_nonnegative() -> None:
    with pytest.raises(ValueError, match="given together"):
        DeviceModel(release_ms=1.0)
    with pytest.raises(ValueError, match="`release_ms_per_gib`"):
        DeviceModel(release_ms=1.0, release_ms_per_gib=-1.0, reacquire_ms_per_gib=1.0)


def test_with_a_cost_curve_released_buffers_are_pooled_and_reused() -> None:
    from residency.emulated import EmulatedNPU

    model = DeviceModel(compute="real", release_ms=0.0, release_ms_per_gib=0.0,
                        reacquire_ms_per_gib=0.0, cost_curve="test")
    npu = EmulatedNPU(1, 64 << 20, model=model)
    t = npu.empty((4 << 20,), dtype=__import__("torch").uint8)
    first = t.host.data_ptr()
    t.free()
    npu.empty_cache()
    assert npu.memory_reserved() == 0  # released as far as the device's accounting goes
    again = npu.empty((4 << 20,), dtype=__import__("torch").uint8)
    assert again.host.data_ptr() == first  # the host buffer came back from the pool


def test_the_release_curve_option_reaches_the_model(tmp_path: Path) -> None:
    from residency.devicemodel import add_model_arguments, model_from_args

    csv = tmp_path / "c.csv"
    csv.write_text("device_kind,cached_gib,release_ms,reacquire_ms\n"
                   "cuda,1,0.6,0.4\ncuda,8,4.8,4.0\ncuda,32,19.6,19.0\n")
    import argparse

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    model = model_from_args(p.parse_args(["--release-curve", str(csv)]))
    assert model.release_ms_per_gib == pytest.approx(0.6, abs=0.05)
    assert model.cost_curve == "cuda curve c.csv (n=3)"
    (tmp_path / "bad.csv").write_text("device_kind,cached_gib\ncuda,1\n")
    with pytest.raises(ValueError, match="bad.csv: needs columns"):
        model_from_args(p.parse_args(["--release-curve", str(tmp_path / "bad.csv")]))


def test_pair_records_scale_auto_on_the_emulated_npu_manifest(tmp_path: Path) -> None:
    """The sizing rule and its numbers in the manifest (no service run: the check stops at
    the first service start, which a bad arm makes fail fast)."""
    from residency.experiments.servicefile import builtin_service

    spec = builtin_service(device_kind="cuda", ranks=1, scale=2.0, resident_on_device=True,
                           inject_failure="generic-telemetry", accelerator_patch="vllm-ascend")
    command = list(spec.command)
    assert command[command.index("--inject-failure") + 1] == "generic-telemetry"
    assert command[command.index("--accelerator-patch") + 1] == "vllm-ascend"
    assert "--resident-on-device" in command
    plain = builtin_service(device_kind="emulated-npu", ranks=1)
    assert "--inject-failure" not in plain.command
    assert "--resident-on-device" not in plain.command
    assert json.dumps(sizing.auto_size(4 << 30).to_params())  # JSON-ready
