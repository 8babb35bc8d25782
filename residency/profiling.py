"""Per-request trace capture with each device's real profiler.

npu: `torch_npu.profiler` (one `*_ascend_pt/` directory per rank); cuda: `torch.profiler`
(Kineto JSON); emulated-npu: the emulator's own Kineto export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RequestProfiler:
    """Start/stop around one request; traces land in `out_dir` (one file or dir per rank)."""

    def __init__(self, kind: str, *, rank: int, world_size: int, module: Any = None) -> None:
        self.kind, self.rank, self.world_size, self.module = kind, rank, world_size, module
        self._prof: Any = None
        self._out: Path | None = None

    def start(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._out = out_dir
        if self.kind == "emulated-npu":
            self.module.start_trace()
        elif self.kind == "cuda":
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._prof.start()
        elif self.kind == "npu":
            import torch_npu

            self._prof = torch_npu.profiler.profile(
                activities=[torch_npu.profiler.ProfilerActivity.CPU,
                            torch_npu.profiler.ProfilerActivity.NPU],
                on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(out_dir)))
            self._prof.start()
        else:
            raise ValueError(f"no profiler for device kind {self.kind!r}")

    def stop(self) -> Path:
        """Stop and write this rank's trace; returns the directory holding it."""
        assert self._out is not None, "stop() before start()"
        if self.kind == "emulated-npu":
            self.module.synchronize()
            self.module.stop_trace()
            self.module.export_trace(self._out / f"rank{self.rank}.trace.json", rank=self.rank,
                                     world_size=self.world_size)
        elif self.kind == "cuda":
            self._prof.stop()
            self._prof.export_chrome_trace(str(self._out / f"rank{self.rank}.trace.json"))
        else:  # npu: the trace handler parses and writes on stop (can take long)
            self._prof.stop()
        out, self._out, self._prof = self._out, None, None
        return out
