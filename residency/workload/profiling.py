"""Per-request trace capture with each device's real profiler, one registered class per kind.

npu: `torch_npu.profiler` (one `*_ascend_pt/` directory per rank); cuda: `torch.profiler`
(Kineto JSON); emulated-npu: the emulator's own Kineto export. `residency.devices.profiler`
picks the class from `PROFILERS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from residency import devices

__all__ = ["PROFILERS", "CudaProfiler", "EmulatedProfiler", "NpuProfiler", "RequestProfiler"]


class RequestProfiler:
    """Start/stop around one request; traces land in `out_dir` (one file or dir per rank)."""

    kind = ""

    def __init__(self, *, rank: int, world_size: int, module: Any = None) -> None:
        self.rank, self.world_size, self.module = rank, world_size, module
        self._prof: Any = None
        self._out: Path | None = None

    def start(self, out_dir: Path) -> None:
        """Start capturing; this rank's trace will be written under `out_dir`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self._out = out_dir
        self._start()

    def stop(self) -> Path:
        """Stop and write this rank's trace; returns the directory holding it."""
        assert self._out is not None, "stop() before start()"
        self._stop(self._out)
        out, self._out, self._prof = self._out, None, None
        return out

    def _start(self) -> None:  # pragma: no cover - each kind overrides
        raise NotImplementedError

    def _stop(self, out: Path) -> None:  # pragma: no cover - each kind overrides
        raise NotImplementedError


class EmulatedProfiler(RequestProfiler):
    """The emulated NPU's own tracer, exported as Kineto JSON `rank<r>.trace.json`."""

    kind = "emulated-npu"

    def _start(self) -> None:
        self.module.start_trace()

    def _stop(self, out: Path) -> None:
        self.module.synchronize()
        self.module.stop_trace()
        self.module.export_trace(out / f"rank{self.rank}.trace.json", rank=self.rank,
                                 world_size=self.world_size)


class CudaProfiler(RequestProfiler):
    """`torch.profiler` with CPU and CUDA activity, exported as `rank<r>.trace.json`."""

    kind = "cuda"

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                             profile_memory=True)  # [memory] events: residency.traces.memory
        self._prof.start()

    def _stop(self, out: Path) -> None:
        self._prof.stop()
        self._prof.export_chrome_trace(str(out / f"rank{self.rank}.trace.json"))


class NpuProfiler(RequestProfiler):
    """`torch_npu.profiler` with `tensorboard_trace_handler`: one `*_ascend_pt/` per rank."""

    kind = "npu"

    def _start(self) -> None:
        import torch_npu

        assert self._out is not None
        self._prof = torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU,
                        torch_npu.profiler.ProfilerActivity.NPU],
            profile_memory=True,  # memory_record.csv: residency.traces.memory
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(self._out)))
        self._prof.start()

    def _stop(self, out: Path) -> None:
        self._prof.stop()  # the trace handler parses and writes on stop (can take long)


PROFILERS: dict[str, type[RequestProfiler]] = {
    cls.kind: cls for cls in (EmulatedProfiler, CudaProfiler, NpuProfiler)}


def profiler(kind: str, *, rank: int, world_size: int, module: Any = None) -> Any:
    """The per-request profiler of `kind`, the class registered for it in
    `residency.workload.profiling.PROFILERS`: torch-npu's profiler on npu, `torch.profiler` on cuda,
    the emulator's own Kineto export on emulated-npu (`module`: the installed emulated
    device module)."""
    return PROFILERS[devices.check_kind(kind)](rank=rank, world_size=world_size, module=module)
