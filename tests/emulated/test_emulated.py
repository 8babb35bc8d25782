"""The emulated NPU: allocator, streams, tracing in-process; registration in subprocesses.

The PrivateUse1 rename is process-global and irreversible, so every check that needs
`install_emulated_npu` runs in a fresh interpreter (the `subprocess_python` fixture);
everything else builds an unregistered `EmulatedNPU` or `CachingHostAllocator` here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from residency import markers
from residency.devices import resolve, torch_device
from residency.emulated import (
    DEVICE_NAME,
    DEVICE_PID_BASE,
    OVERSIZE_SLACK_BYTES,
    Block,
    CachingHostAllocator,
    DeviceModel,
    DeviceTaskError,
    EmulatedNPU,
    round_size,
)

MiB = 1024**2
REAL = DeviceModel(compute="real")


def check_invariants(alloc: CachingHostAllocator, live: dict) -> None:
    """Accounting agrees with itself and with the live blocks the test holds."""
    allocated, reserved = alloc.allocated_bytes, alloc.reserved_bytes
    assert 0 <= allocated <= reserved <= alloc.capacity_bytes
    assert alloc.free_bytes + reserved == alloc.capacity_bytes
    assert allocated == sum(block.size for block in live.values())
    stats = alloc.stats()
    assert stats["allocated_bytes.all.current"] == allocated
    assert stats["reserved_bytes.all.current"] == reserved
    assert stats["allocation.all.current"] == len(live)
    assert (stats["reserved_bytes.small_pool.current"]
            + stats["reserved_bytes.large_pool.current"]) == reserved


# -- allocator ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundCase:
    nbytes: int
    size: int


@pytest.mark.parametrize("case", [
    RoundCase(1, 512), RoundCase(512, 512), RoundCase(513, 1024), RoundCase(MiB, MiB),
    RoundCase(MiB + 1, 2 * MiB), RoundCase(2 * MiB, 2 * MiB), RoundCase(5 * MiB, 6 * MiB),
])
def test_round_size(case: RoundCase) -> None:
    assert round_size(case.nbytes) == case.size


OPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 2 * MiB)),           # small and medium
    st.tuples(st.just("alloc"), st.integers(2 * MiB, 40 * MiB)),    # large, some over capacity
    st.tuples(st.just("free"), st.integers(0, 1000)),
    st.tuples(st.just("empty_cache"), st.just(0)),
), max_size=40)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(ops=OPS)
def test_allocator_accounting_holds_for_any_sequence(ops: list[tuple[str, int]]) -> None:
    alloc = CachingHostAllocator(64 * MiB)
    live: dict[int, Block] = {}
    for op, arg in ops:
        if op == "alloc":
            before = (alloc.allocated_bytes, alloc.stats()["num_ooms"])
            try:
                block = alloc.allocate(arg)
            except torch.OutOfMemoryError:
                # OOM: live blocks untouched, the cache was dropped by the retry, one OOM counted
                assert alloc.allocated_bytes == before[0]
                assert alloc.reserved_bytes == alloc.allocated_bytes
                assert alloc.stats()["num_ooms"] == before[1] + 1
            else:
                assert round_size(arg) <= block.size < round_size(arg) + OVERSIZE_SLACK_BYTES
                assert block.buffer is not None and block.buffer.numel() == block.size
                live[block.id] = block
        elif op == "free" and live:
            key = sorted(live)[arg % len(live)]
            alloc.free(live.pop(key))
        elif op == "empty_cache":
            alloc.release_cached()
            assert alloc.reserved_bytes == alloc.allocated_bytes
        check_invariants(alloc, live)


def test_freed_block_is_reused_best_fit_and_stays_reserved() -> None:
    alloc = CachingHostAllocator(256 * MiB)
    small, large, huge = alloc.allocate(4 * MiB), alloc.allocate(8 * MiB), alloc.allocate(64 * MiB)
    for block in (small, large, huge):
        alloc.free(block)
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (0, 76 * MiB)
    assert alloc.allocate(3 * MiB) is small          # smallest cached block that fits
    assert alloc.allocate(5 * MiB) is large
    fresh = alloc.allocate(6 * MiB)                  # 64 MiB is >= 20 MiB too large: not reused
    assert fresh is not huge
    assert alloc.reserved_bytes == 82 * MiB
    assert alloc.stats()["num_device_alloc"] == 4


def test_oom_retries_after_dropping_the_cache_then_raises_with_numbers() -> None:
    alloc = CachingHostAllocator(32 * MiB)
    alloc.free(alloc.allocate(20 * MiB))
    kept = alloc.allocate(24 * MiB)       # fits only once the cached 20 MiB block is dropped
    assert alloc.stats()["num_alloc_retries"] == 1
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (24 * MiB, 24 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as err:
        alloc.allocate(20 * MiB)
    message = str(err.value)
    for number in (20 * MiB, 24 * MiB, 32 * MiB):   # requested, reserved, capacity
        assert str(number) in message
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (24 * MiB, 24 * MiB)
    assert alloc.stats()["num_ooms"] == 1
    assert kept.buffer is not None and kept.allocated
    alloc.free(kept)
    assert alloc.allocate(30 * MiB).size == 30 * MiB
    assert alloc.stats()["num_alloc_retries"] == 2


def test_double_free_and_foreign_blocks_are_rejected() -> None:
    alloc, other = CachingHostAllocator(8 * MiB), CachingHostAllocator(8 * MiB)
    block = alloc.allocate(1000)
    alloc.free(block)
    with pytest.raises(ValueError, match="not a live block"):
        alloc.free(block)
    with pytest.raises(ValueError, match="not a live block"):
        other.free(alloc.allocate(1000))


def test_finalizer_free_while_the_lock_is_held_is_applied_by_the_next_call() -> None:
    alloc = CachingHostAllocator(8 * MiB)
    block = alloc.allocate(4096)
    with alloc._lock:  # as when a finalizer runs inside an allocator call
        alloc.free(block, from_finalizer=True)
    assert alloc.allocated_bytes == 0
    assert alloc.reserved_bytes == 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_empty_cache_returns_touched_memory_to_the_os() -> None:
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    npu = EmulatedNPU(capacity_bytes=1024 * MiB)
    tensor = npu.empty((256 * MiB,), torch.uint8)
    npu.launch("touch", partial(tensor.host.fill_, 1))  # the task drops it once run
    npu.synchronize()
    tensor.free()
    cached = rss()
    assert npu.memory_reserved() == 256 * MiB
    npu.empty_cache()
    assert npu.memory_reserved() == 0
    assert cached - rss() >= 200 * MiB


# -- device module, in-process (not registered) ------------------------------------------------


def test_module_reports_the_allocator_numbers() -> None:
    npu = EmulatedNPU(devices=2, capacity_bytes=64 * MiB)
    a = npu.empty((1024, 1024), device=1)               # 4 MiB on npu:1
    b = npu.empty(100, torch.float16, device="npu:1")   # 200 B -> one 512 B block
    assert npu.memory_allocated("npu:1") == 4 * MiB + 512
    assert npu.memory_allocated(0) == 0
    assert npu.mem_get_info(1) == (64 * MiB - npu.memory_reserved(1), 64 * MiB)
    stats = npu.memory_stats(1)
    assert stats["allocated_bytes.all.current"] == npu.memory_allocated(1)
    assert stats["reserved_bytes.all.current"] == npu.memory_reserved(1)
    assert stats["allocated_bytes.all.peak"] == npu.max_memory_allocated(1)
    assert {"num_alloc_retries", "num_ooms"} <= stats.keys()
    assert (a.shape, a.dtype, a.nbytes, a.host.shape) == (torch.Size([1024, 1024]),
                                                          torch.float32, 4 * MiB, a.shape)
    del a                                               # finalizer returns the block to the cache
    b.free()
    b.free()                                            # idempotent
    assert (npu.memory_allocated(1), npu.memory_reserved(1)) == (0, 4 * MiB + 512)
    npu.set_device(1)
    npu.empty_cache()
    assert npu.memory_reserved(1) == 0
    with pytest.raises(RuntimeError, match="freed"):
        _ = b.host


def test_copies_round_trip_through_device_tasks() -> None:
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=REAL)
    source = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    on_device = npu.to_device(source)
    out = npu.empty(on_device.shape, on_device.dtype)
    src_view, out_view = on_device.host, out.host
    npu.launch("double", lambda: torch.mul(src_view, 2, out=out_view))
    assert torch.equal(out.to_host(), source * 2)
    assert npu.empty((0, 5)).to_host().shape == (0, 5)


def test_tasks_run_in_submission_order_while_the_host_goes_on() -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    gate, seen, order = threading.Event(), [], list[int]()
    npu.launch("wait-for-host", lambda: seen.append(gate.wait(timeout=30)))
    gate.set()  # reached only because launch returned before the task finished
    for i in range(50):
        npu.launch(f"k{i}", partial(order.append, i))
    npu.synchronize()
    assert seen == [True]
    assert order == list(range(50))


def test_synchronize_waits_for_every_stream_of_the_device() -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    side = npu.Stream()
    gate, done = threading.Event(), []
    for stream in (npu.current_stream(), side):
        npu.launch("blocked", lambda: done.append(gate.wait(timeout=30)), stream=stream)
    threading.Timer(0.05, gate.set).start()
    npu.synchronize()
    assert done == [True, True]
    assert npu.current_stream().query() and side.query()


def test_empty_cache_synchronizes_before_releasing() -> None:
    npu = EmulatedNPU(capacity_bytes=64 * MiB)
    gate, done = threading.Event(), []
    npu.launch("blocked", lambda: done.append(gate.wait(timeout=30)))
    threading.Timer(0.05, gate.set).start()
    npu.empty_cache()
    assert done == [True]


def test_task_errors_are_sticky() -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    ran: list[str] = []
    npu.launch("bad", lambda: 1 / 0)
    skipped = npu.launch("after", lambda: ran.append("after"))
    with pytest.raises(DeviceTaskError, match="'bad'.*ZeroDivisionError") as err:
        npu.synchronize()
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    assert skipped.skipped and ran == []
    with pytest.raises(DeviceTaskError):
        npu.launch("later", lambda: None)
    with pytest.raises(DeviceTaskError):
        npu.synchronize()


def test_streams_events_and_the_stream_context() -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    side, order, gate = npu.Stream(), list[str](), threading.Event()
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)

    def first() -> None:
        gate.wait(timeout=30)
        order.append("first")

    start.record()
    npu.launch("first", first)
    end.record()
    with npu.stream(side):
        assert npu.current_stream() is side
        side.wait_event(end)
        npu.launch("second", lambda: order.append("second"))
    assert npu.current_stream() is npu.default_stream()
    assert not end.query()
    gate.set()
    end.synchronize()
    side.synchronize()
    assert order == ["first", "second"]
    assert end.query() and start.elapsed_time(end) >= 0.0
    with pytest.raises(RuntimeError, match="enable_timing"):
        npu.Event().elapsed_time(end)
    assert isinstance(npu.current_stream(), npu.Stream)
    assert side.stream_id != npu.default_stream().stream_id


# -- tracing -------------------------------------------------------------------------------------


def test_trace_export_is_kineto_shaped(tmp_path: Path) -> None:
    npu = EmulatedNPU(capacity_bytes=64 * MiB)
    npu.launch("before-trace", lambda: None)
    npu.synchronize()
    npu.start_trace()
    with markers.span(markers.RELEASE_NORMAL):
        t = npu.to_device(torch.ones(1000))
        view = t.host
        npu.launch("scale", lambda: view.mul_(3))
        npu.synchronize()
    thread = threading.Thread(target=_span_in_thread, name="request-thread")
    thread.start()
    thread.join()
    npu.stop_trace()
    with markers.span("after-stop"):
        pass
    path = npu.export_trace(tmp_path / "sub" / "rank1.trace.json", rank=1, world_size=2)
    trace = json.loads(path.read_text())

    assert trace["distributedInfo"] == {"backend": "gloo", "rank": 1, "world_size": 2}
    assert isinstance(trace["baseTimeNanoseconds"], int) and trace["schemaVersion"] == 1
    assert trace["deviceProperties"][0]["name"] == DEVICE_NAME
    assert trace["traceName"] == str(path)
    events = trace["traceEvents"]
    assert all(e["ph"] in ("X", "M", "i") and {"name", "pid", "tid"} <= e.keys() for e in events)
    # the allocation of t while tracing, as torch.profiler(profile_memory=True) records it
    memory = [e for e in events if e["ph"] == "i"]
    assert [e["name"] for e in memory] == ["[memory]"]
    assert memory[0]["args"]["Device Id"] == 0 and memory[0]["args"]["Bytes"] > 0
    assert memory[0]["args"]["Total Allocated"] == memory[0]["args"]["Bytes"]
    assert memory[0]["args"]["Total Reserved"] >= memory[0]["args"]["Total Allocated"]
    meta = {(e["pid"], e["args"].get("name")) for e in events if e["name"] == "process_name"}
    assert (DEVICE_PID_BASE, "Emulated NPU 0") in meta
    ranges = [e for e in events if e["ph"] == "X"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in ranges)
    device = {e["name"]: e for e in ranges if e["pid"] == DEVICE_PID_BASE}
    host = {e["name"]: e for e in ranges if e["pid"] == os.getpid()}
    assert set(device) == {"Memcpy HtoD", "scale"}
    assert device["Memcpy HtoD"]["cat"] == "gpu_memcpy" and device["scale"]["cat"] == "kernel"
    assert set(host) == {markers.RELEASE_NORMAL, "thread-range"}
    assert all(e["cat"] == "user_annotation" for e in host.values())
    assert host["thread-range"]["tid"] != host[markers.RELEASE_NORMAL]["tid"]
    release = host[markers.RELEASE_NORMAL]
    for kernel in device.values():   # synchronized inside the range: the tasks lie within it
        assert release["ts"] <= kernel["ts"]
        assert kernel["ts"] + kernel["dur"] <= release["ts"] + release["dur"] + 0.001
    thread_names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "request-thread" in thread_names
    assert [r.name for r in npu.trace_events() if r.device is not None] == ["Memcpy HtoD", "scale"]


def test_trace_export_records_memory_and_the_drop_at_empty_cache(tmp_path: Path) -> None:
    """The [memory] events of the export follow the allocator: reserved stays up after a free
    and falls to what is allocated (0) at the empty_cache inside the normal release."""
    from tests.memorytraces import record

    path = tmp_path / "rank0.trace.json"
    reserved_before = record(path, release=True)
    trace = json.loads(path.read_text())
    release = next(e for e in trace["traceEvents"]
                   if e["ph"] == "X" and e["name"] == markers.RELEASE_NORMAL)
    start, end = release["ts"], release["ts"] + release["dur"]
    memory = [e for e in trace["traceEvents"] if e["name"] == "[memory]"]
    totals = [(e["ts"], e["args"]["Total Allocated"], e["args"]["Total Reserved"])
              for e in memory]
    assert all(e["ph"] == "i" and e["args"]["Device Id"] == 0 for e in memory)
    before = [t for t in totals if t[0] < start]
    inside = [t for t in totals if start <= t[0] <= end]
    after = [t for t in totals if t[0] > end]
    assert reserved_before >= 8 * MiB
    assert before[-1][1:] == (0, reserved_before)  # freed: allocated 0, the block cached
    assert inside == [(inside[0][0], 0, 0)]  # empty_cache: reserved falls to allocated
    assert after[0][1] >= 8 * MiB and after[0][2] >= after[0][1]  # acquired again
    assert after[-1][1] == 0 and after[-1][2] == after[0][2]


def test_trace_export_without_empty_cache_keeps_reserved(tmp_path: Path) -> None:
    from tests.memorytraces import record

    path = tmp_path / "rank0.trace.json"
    reserved_before = record(path, release=False)
    memory = [e["args"] for e in json.loads(path.read_text())["traceEvents"]
              if e["name"] == "[memory]"]
    assert {m["Total Reserved"] for m in memory} == {reserved_before}


def _span_in_thread() -> None:
    with markers.span("thread-range"):
        pass


def test_export_needs_a_trace_and_a_valid_rank(tmp_path: Path) -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    with pytest.raises(RuntimeError, match="start_trace"):
        npu.export_trace(tmp_path / "t.json", rank=0, world_size=1)
    npu.start_trace()
    npu.stop_trace()
    for rank, world_size in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match=repr(rank) if world_size else "world_size"):
            npu.export_trace(tmp_path / "t.json", rank=rank, world_size=world_size)


# -- bad input and device selection ---------------------------------------------------------------


@pytest.mark.parametrize("kwargs, named", [
    ({"devices": 0}, "devices"), ({"devices": -2}, "devices"), ({"devices": True}, "devices"),
    ({"capacity_bytes": 0}, "capacity_bytes"), ({"capacity_bytes": -1}, "capacity_bytes"),
    ({"capacity_bytes": 1.5}, "capacity_bytes"),
])
def test_bad_construction_values_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=rf"`{named}`.*{next(iter(kwargs.values()))!r}"):
        EmulatedNPU(**kwargs)


@pytest.mark.parametrize("device", [2, -1, "npu:2", "cuda:0", "npu0", True, 1.0,
                                    torch.device("cpu")])
def test_unknown_devices_are_named(device: object) -> None:
    npu = EmulatedNPU(devices=2, capacity_bytes=MiB)
    with pytest.raises(ValueError, match="`device`") as err:
        npu.memory_allocated(device)
    assert repr(device) in str(err.value)


def test_bad_task_and_tensor_arguments() -> None:
    npu = EmulatedNPU(capacity_bytes=MiB)
    with pytest.raises(ValueError, match="'cuda_sync'"):
        npu.launch("k", lambda: None, category="cuda_sync")
    with pytest.raises(ValueError, match="`fn`"):
        npu.launch("k", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        npu.empty((2, -1))
    with pytest.raises(ValueError, match="host_tensor"):
        npu.to_device([1, 2])  # type: ignore[arg-type]


def test_resolve_on_a_cpu_only_host() -> None:
    assert sys.modules.get("torch_npu") is None and not torch.cuda.is_available()
    assert resolve() == resolve("auto") == "emulated-npu"
    assert resolve("emulated-npu") == "emulated-npu"
    with pytest.raises(RuntimeError, match="emulated-npu"):
        resolve("npu")
    with pytest.raises(RuntimeError, match="cuda"):
        resolve("cuda")
    with pytest.raises(ValueError, match=r"\['auto', 'npu', 'cuda', 'emulated-npu'\], but 'tpu'"):
        resolve("tpu")
    assert torch_device("cuda", 1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="'cpu'"):
        torch_device("cpu", 0)
    with pytest.raises(ValueError, match="-1"):
        torch_device("cuda", -1)


# -- registration (subprocesses) ------------------------------------------------------------------


def test_registered_backend_reproduces_the_generic_failure_and_the_fix(
        subprocess_python: Callable[..., dict]) -> None:
    result = subprocess_python("""
        import json, torch
        from residency.devices import resolve, torch_device
        from residency.emulated import install_emulated_npu
        from residency.policy.cache import ListRecorder, policy_for
        from residency.policy.telemetry import GenericTelemetry, RegisteredModuleTelemetry
        from residency.policy.telemetry import TelemetryUnavailable

        out = {}
        try:
            install_emulated_npu(devices=0)
        except ValueError as exc:
            out["devices0"] = str(exc)
        out["name_before"] = torch._C._get_privateuse1_backend_name()
        npu = install_emulated_npu(devices=1, capacity_bytes=1 << 30)
        out["idempotent"] = install_emulated_npu(devices=1, capacity_bytes=1 << 30) is npu
        try:
            install_emulated_npu(devices=1, capacity_bytes=2 << 30)
        except ValueError as exc:
            out["other_capacity"] = str(exc)
        d = torch.device("npu:0")
        out["module"] = torch.get_device_module(d) is npu and torch.npu is npu
        out["accelerator"] = str(torch.accelerator.current_accelerator())
        out["torch_device"] = str(torch_device("emulated-npu", 0))
        kept = npu.empty((1024, 1024), device=d)
        cached = npu.empty((2 * 1024, 1024), device=d)
        cached.free()
        out["tensor_device"] = str(kept.device)
        try:
            torch.accelerator.memory_allocated(d)
        except RuntimeError as exc:
            out["generic_error"] = str(exc)
        out["registered"] = [torch.get_device_module(d).memory_allocated(d),
                             torch.get_device_module(d).memory_reserved(d),
                             *torch.get_device_module(d).mem_get_info(d)]
        out["snapshot"] = RegisteredModuleTelemetry().snapshot(d).to_dict()
        try:
            GenericTelemetry().snapshot(d)
        except TelemetryUnavailable as exc:
            out["generic_telemetry"] = exc.error_message
        out["bad_index"] = None
        try:
            npu.memory_allocated("npu:1")
        except ValueError as exc:
            out["bad_index"] = str(exc)
        out["auto"] = resolve("auto")

        npu.start_trace()
        recorder = ListRecorder()
        before = RegisteredModuleTelemetry().snapshot(d).to_dict()
        candidate = policy_for("candidate", d, recorder=recorder, rank=0)
        out["candidate_released"] = candidate.release_if_needed()
        out["same_state"] = RegisteredModuleTelemetry().snapshot(d).to_dict() == before
        baseline = policy_for("baseline", d, recorder=recorder, rank=0)
        out["baseline_released"] = baseline.release_if_needed()
        out["after_baseline"] = [npu.memory_allocated(d), npu.memory_reserved(d)]
        out["decisions"] = [[x.arm, x.outcome, x.reason] for x in recorder.decisions]
        npu.stop_trace()
        trace = npu.kineto_trace(rank=0, world_size=1)
        out["annotations"] = [e["name"] for e in trace["traceEvents"]
                              if e.get("cat") == "user_annotation"]
        print(json.dumps(out))
    """)
    assert "`devices`" in result["devices0"] and "0" in result["devices0"]
    assert result["name_before"] == "privateuseone"
    assert result["idempotent"] is True
    assert "capacity_bytes=2147483648" in result["other_capacity"]
    assert result["module"] is True
    assert result["accelerator"] == "npu"
    assert result["torch_device"] == result["tensor_device"] == "npu:0"
    assert "Allocator for npu is not a DeviceAllocator" in result["generic_error"]
    assert "Allocator for npu is not a DeviceAllocator" in result["generic_telemetry"]
    allocated, reserved = 4 * MiB, 4 * MiB + 8 * MiB
    assert result["registered"] == [allocated, reserved, (1 << 30) - reserved, 1 << 30]
    assert result["snapshot"] == {"reserved": reserved, "allocated": allocated,
                                  "free": (1 << 30) - reserved, "total": 1 << 30}
    assert "'npu:1'" in result["bad_index"]
    assert result["auto"] == "emulated-npu"
    assert result["candidate_released"] is False and result["same_state"] is True
    assert result["baseline_released"] is True
    assert result["after_baseline"] == [allocated, allocated]
    assert result["decisions"] == [["candidate", "retained", "within-bounds"],
                                   ["baseline", "released", "telemetry-unavailable"]]
    assert result["annotations"] == [markers.RELEASE_NORMAL, markers.RELEASE_NORMAL]


def test_real_torch_npu_or_another_backend_blocks_the_emulation(
        tmp_path: Path, subprocess_python: Callable[..., dict]) -> None:
    (tmp_path / "torch_npu.py").write_text(
        "import os, types, torch\n"
        "m = types.ModuleType('torch_npu.npu')\n"
        "m.is_available = lambda: os.environ.get('FAKE_NPU') == '1'\n"
        "torch._register_device_module('privateuseone', m)\n"
        "torch.npu = m\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess_python("""
        import json, os, torch
        from residency.devices import resolve
        from residency.emulated import install_emulated_npu
        out = {}
        os.environ["FAKE_NPU"] = "1"
        out["auto_available"] = resolve("auto")
        out["npu_available"] = resolve("npu")
        os.environ["FAKE_NPU"] = "0"
        out["auto_unavailable"] = resolve("auto")
        try:
            resolve("npu")
        except RuntimeError as exc:
            out["npu_unavailable"] = str(exc)
        try:
            install_emulated_npu()
        except RuntimeError as exc:
            out["install"] = str(exc)
        torch.utils.rename_privateuse1_backend("foo")
        try:
            install_emulated_npu()
        except RuntimeError as exc:
            out["install_foo"] = str(exc)
        print(json.dumps(out))
    """, env=env)
    assert result["auto_available"] == result["npu_available"] == "npu"
    assert result["auto_unavailable"] == "emulated-npu"
    assert "is_available() is False" in result["npu_unavailable"]
    assert "torch_npu" in result["install"]
    assert "'foo'" in result["install_foo"]


# -- the device model: modelled time, real memory ----------------------------------------------


def _matmul_task(n: int) -> tuple[Callable[[], object], int]:
    a, b, out = torch.ones(n, n), torch.ones(n, n), torch.empty(n, n)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3


def test_modelled_task_leaves_the_host_free() -> None:
    """A task of modelled 200 ms costs its worker almost no CPU: a host thread does 150 ms of
    CPU work meanwhile. With real compute the same task burns its worker's CPU (the matmul is
    17 GFLOP), which is what this test would see if the stream computed again."""
    fn, flops = _matmul_task(2048)
    model = DeviceModel(flops_per_s=flops / 0.2, bytes_per_s=1e15, launch_ns=0)
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=model)
    task = npu.launch("dit.step", fn)
    host_start_ns = time.thread_time_ns()
    while time.thread_time_ns() - host_start_ns < 150_000_000:  # 150 ms of host CPU work
        sum(range(1000))
    host_cpu_ns = time.thread_time_ns() - host_start_ns
    npu.synchronize()
    assert task.cost is not None and task.cost.flops == flops
    assert task.end_ns - task.start_ns >= 200_000_000          # the modelled time was waited out
    assert host_cpu_ns >= 150_000_000
    assert task.cpu_ns < 50_000_000                             # ...without holding a core


def test_modelled_time_is_the_devices_clock_not_the_workers_wake_up() -> None:
    """Queued modelled tasks follow each other on the device's own clock: each starts exactly
    where the previous one ended and lasts exactly its modelled time, even while the host
    keeps the worker thread from running (a real device does not wait for the host's
    scheduler). Before the device clock, each task started whenever its worker woke up, so
    host load stretched the device timeline.

    The contract is `start = max(previous end, submit)`: a task submitted after the device
    went idle starts at its submission. So that a late *submitting* thread (host load on the
    test itself) cannot make a gap, every task is queued behind a gate task first; the gate
    opens only once all twenty are submitted."""
    fn, flops = _matmul_task(64)
    model = DeviceModel(flops_per_s=flops / 0.002, bytes_per_s=1e15, launch_ns=0)
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=model)
    gate = threading.Event()
    opened = npu.launch("gate", lambda: gate.wait(timeout=60), model=False)
    tasks = [npu.launch(f"step{i}", fn) for i in range(20)]
    gate.set()
    host_start_ns = time.thread_time_ns()
    while time.thread_time_ns() - host_start_ns < 60_000_000:  # the host holds the GIL
        sum(range(1000))
    npu.synchronize()
    assert all(t.submit_ns <= opened.end_ns for t in tasks)   # all queued behind the gate
    durations = {t.end_ns - t.start_ns for t in tasks}
    assert durations == {model.duration_ns(tasks[0].cost, "kernel")}
    assert tasks[0].start_ns == opened.end_ns
    assert all(b.start_ns == a.end_ns for a, b in zip(tasks, tasks[1:], strict=False))


def test_a_task_submitted_to_an_idle_device_starts_at_its_submission() -> None:
    """The other half of the contract: the device clock never runs ahead of the host, so a
    task submitted after the stream went idle starts at its submission time."""
    fn, flops = _matmul_task(64)
    model = DeviceModel(flops_per_s=flops / 0.002, bytes_per_s=1e15, launch_ns=0)
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=model)
    first = npu.launch("first", fn)
    npu.synchronize()
    second = npu.launch("second", fn)
    npu.synchronize()
    assert second.start_ns == max(first.end_ns, second.submit_ns)
    assert second.end_ns - second.start_ns == model.duration_ns(second.cost, "kernel")


def test_an_event_waited_on_moves_the_waiting_streams_clock() -> None:
    fn, flops = _matmul_task(64)
    model = DeviceModel(flops_per_s=flops / 0.005, bytes_per_s=1e15, launch_ns=0)
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=model)
    side = npu.Stream("npu:0")
    first = npu.launch("side", fn, stream=side)
    event = side.record_event()
    npu.current_stream().wait_event(event)
    after = npu.launch("after", fn)
    npu.synchronize()
    assert after.start_ns >= first.end_ns  # the dependency holds on the device clock


def test_a_task_traced_once_reuses_its_cost_for_the_same_shapes() -> None:
    """Tracing a task shape-only is the emulator's own host work: the same code on the same
    shapes (every denoising step) is traced once; other shapes or captured objects it cannot
    describe are traced every time."""
    from residency.emulated.model import cost_key, modelled_cost

    model = DeviceModel()
    first, _ = _matmul_task(96)
    again, _ = _matmul_task(96)
    other, _ = _matmul_task(48)
    a = modelled_cost(first, model)
    assert modelled_cost(again, model) is a          # reused, not traced again
    assert modelled_cost(other, model).flops == 2 * 48**3 != a.flops
    box = object()
    assert cost_key(lambda: box) is None             # an opaque capture: never cached


def test_real_compute_is_kept_as_an_option() -> None:
    fn, _ = _matmul_task(256)
    a = torch.arange(6.0).reshape(2, 3)
    out = torch.empty(2, 3)
    npu = EmulatedNPU(capacity_bytes=64 * MiB, model=REAL)
    task = npu.launch("double", lambda: torch.mul(a, 2, out=out))
    npu.synchronize()
    assert torch.equal(out, a * 2) and task.cost is None
    modelled = EmulatedNPU(capacity_bytes=64 * MiB)
    out.zero_()
    task = modelled.launch("double", lambda: torch.mul(a, 2, out=out))
    modelled.synchronize()
    assert torch.equal(out, torch.zeros(2, 3))                  # shape-only: nothing computed
    assert (task.cost.flops, task.cost.bytes) == (6, 48)        # 6 elements, 24 B in + 24 B out


def test_modelled_copies_use_the_link_and_to_host_stays_real() -> None:
    npu = EmulatedNPU(capacity_bytes=64 * MiB,
                      model=DeviceModel(link_bytes_per_s=1e9, launch_ns=0))
    t, source = npu.empty((1024, 1024)), torch.full((1024, 1024), 3.0)
    task = npu.launch("Memcpy HtoD", lambda: t.host.copy_(source), category="gpu_memcpy")
    npu.synchronize()
    assert task.cost.written_bytes == 4 * MiB
    assert task.end_ns - task.start_ns >= 4 * MiB                # 4 MiB at 1e9 B/s, in ns
    small = npu.to_device(torch.arange(4.0))
    assert torch.equal(small.to_host(), torch.zeros(4))         # upload modelled, readback real
    assert npu.empty((0, 5)).to_host().shape == (0, 5)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_modelled_device_faults_new_memory_in_and_empty_cache_unmaps_it() -> None:
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    npu = EmulatedNPU(capacity_bytes=1024 * MiB)                # modelled: no task touches it
    before = rss()
    tensor = npu.empty((256 * MiB,), torch.uint8)
    faulted = rss()
    assert faulted - before >= 200 * MiB                        # allocation mapped the pages
    tensor.free()
    npu.empty_cache()
    assert faulted - rss() >= 200 * MiB                         # and empty_cache unmapped them


@pytest.mark.parametrize("kwargs, named", [
    ({"compute": "fast"}, "compute"), ({"flops_per_s": 0}, "flops_per_s"),
    ({"bytes_per_s": float("inf")}, "bytes_per_s"), ({"launch_ns": -1}, "launch_ns"),
    ({"accelerator_patch": "x"}, "accelerator_patch")])
def test_bad_model_values_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"`{named}`"):
        DeviceModel(**kwargs)


def test_model_round_trips_through_the_environment() -> None:
    from residency.emulated import ENV_VAR

    model = DeviceModel(compute="real", flops_per_s=1e12, accelerator_patch="vllm-ascend")
    assert DeviceModel.from_env({ENV_VAR: model.to_env()}) == model
    assert DeviceModel.from_env({}) == DeviceModel()
    with pytest.raises(ValueError, match=ENV_VAR):
        DeviceModel.from_env({ENV_VAR: '{"speed": 1}'})


def test_vllm_ascend_patch_reserved_answers_allocated_raises(
        subprocess_python: Callable[..., dict]) -> None:
    result = subprocess_python("""
        import json, torch
        from residency.emulated import DeviceModel, install_emulated_npu
        from residency.policy.cache import ListRecorder, policy_for
        from residency.workload.probe import query_paths

        npu = install_emulated_npu(model=DeviceModel(accelerator_patch="vllm-ascend"))
        d = torch.device("npu:0")
        kept = npu.empty((1024, 1024), device=d)
        out = {"reserved": torch.accelerator.memory_reserved(d)}
        try:
            torch.accelerator.memory_allocated(d)
        except RuntimeError as exc:
            out["allocated_error"] = str(exc)
        out["paths"] = query_paths()
        recorder = ListRecorder()
        policy_for("baseline", d, recorder=recorder, rank=0).release_if_needed()
        decision = recorder.decisions[0]
        out["decision"] = [decision.outcome, decision.reason, decision.error]
        print(json.dumps(out))
    """)
    assert result["reserved"] == 4 * MiB
    assert "Allocator for npu is not a DeviceAllocator" in result["allocated_error"]
    assert result["paths"]["reserved"]["redirected"] is True
    assert result["paths"]["allocated"]["redirected"] is False
    outcome, reason, error = result["decision"]
    assert (outcome, reason) == ("released", "telemetry-unavailable")
    assert "memory_allocated" in error and "not a DeviceAllocator" in error


@pytest.mark.parametrize(("patch", "reserved_ok", "reserved_redirected"), [
    ("none", False, False), ("vllm-ascend", True, True)])
def test_probe_shows_which_function_answered_each_query(
        patch: str, reserved_ok: bool, reserved_redirected: bool) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "residency", "probe", "--device", "emulated-npu", "--json",
         "--accelerator-patch", patch], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    generic = result["generic"]
    assert result["accelerator_patch"] == patch and result["bug_present"] is True
    assert (generic["reserved"]["ok"], generic["reserved"]["redirected"]) == (
        reserved_ok, reserved_redirected)
    assert generic["allocated"]["ok"] is False and generic["allocated"]["redirected"] is False
    assert generic["allocated"]["path"] == "torch.accelerator.memory.memory_allocated"
    assert ("second query" in result["verdict"]) is reserved_ok
    if reserved_redirected:
        assert generic["reserved"]["path"].endswith("EmulatedNPU.memory_reserved")
    # the other queries vllm-ascend redirects: answered through the patch, raised without it
    for query in ("memory_stats", "get_memory_info"):
        assert (generic[query]["ok"], generic[query]["redirected"]) == (
            reserved_ok, reserved_redirected), query
    if not reserved_ok:
        assert "not a DeviceAllocator" in generic["get_memory_info"]["error"]
    assert result["registered_module"] == "residency.emulated.npu"  # the module's __name__
    assert result["vllm_ascend"] is None  # detected: not installed here
    assert (result["patch_source"] is not None) is reserved_redirected


FAKE_VLLM_ASCEND_PATCH = """
import torch

def patch_empty_cache() -> None:
    torch.npu.empty_cache()

torch.accelerator.empty_cache = patch_empty_cache
torch.accelerator.memory_stats = torch.npu.memory_stats
torch.accelerator.memory_reserved = torch.npu.memory_reserved
torch.accelerator.get_memory_info = torch.npu.mem_get_info
"""


@pytest.mark.parametrize("redirects_allocated", [False, True])
def test_the_installed_vllm_ascend_patch_file_runs_alone_and_is_detected(
        tmp_path: Path, subprocess_python: Callable[..., dict],
        redirects_allocated: bool) -> None:
    """What `residency probe --device npu --accelerator-patch vllm-ascend` does, on the
    emulated NPU: vllm-ascend is detected without importing it, and only its
    patch_torch_accelerator.py runs (its package __init__s import vLLM and every other
    patch); the probe then shows what that version redirects, allocated included or not
    (its PR #12344)."""
    package = tmp_path / "site" / "vllm_ascend"
    (package / "patch" / "platform").mkdir(parents=True)
    for init in (package, package / "patch", package / "patch" / "platform"):
        (init / "__init__.py").write_text("raise ImportError('package __init__ ran')\n")
    extra = ("torch.accelerator.memory_allocated = torch.npu.memory_allocated\n"
             if redirects_allocated else "")
    (package / "patch" / "platform" / "patch_torch_accelerator.py").write_text(
        FAKE_VLLM_ASCEND_PATCH + extra)
    root = Path(__file__).resolve().parent.parent.parent
    result = subprocess_python("""
        import json
        from residency.emulated import install_emulated_npu
        from residency.workload.probe import (apply_vllm_ascend_patch, probe_queries,
                                         vllm_ascend_installed)

        before = vllm_ascend_installed()
        install_emulated_npu()
        path = apply_vllm_ascend_patch()
        print(json.dumps({"before": before, "path": path, **probe_queries("npu:0")}))
    """, env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{root}"})
    assert result["before"] == "installed (version unknown)"
    assert result["path"].endswith("vllm_ascend/patch/platform/patch_torch_accelerator.py")
    generic = result["generic"]
    assert generic["reserved"]["ok"] and generic["reserved"]["redirected"]
    assert (generic["allocated"]["ok"], generic["allocated"]["redirected"]) == (
        redirects_allocated, redirects_allocated)
    assert result["bug_present"] is (not redirects_allocated)
    assert ("memory_allocated is redirected too" in result["verdict"]) is redirects_allocated
    assert ("second query" in result["verdict"]) is (not redirects_allocated)


def test_probe_patch_needs_an_npu_device() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "residency", "probe", "--device", "cpu",
         "--accelerator-patch", "vllm-ascend"], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("residency probe: error: --accelerator-patch")


def test_model_options_errors_name_the_option() -> None:
    import argparse

    from residency.emulated.model import add_model_arguments, model_from_args

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert model_from_args(parser.parse_args([])) == DeviceModel()
    with pytest.raises(ValueError, match="`--link-bandwidth`"):
        model_from_args(parser.parse_args(["--link-bandwidth", "0"]))
