"""Emulated-NPU traces with device-memory records, for the memory-timeline tests.

`record` runs one small "request" on a fresh emulated NPU while its tracer records: a tensor
is allocated and freed, then a normal release marker runs, with `empty_cache` inside it when
`release` is true (the baseline's behaviour) and a telemetry read only otherwise (the
candidate's). It returns the reserved bytes the allocator held when the release began.
"""

from __future__ import annotations

from pathlib import Path

MIB = 1024**2


def record(path: Path, *, release: bool, rank: int = 0, world_size: int = 1,
           tensor_bytes: int = 8 * MIB) -> int:
    """Write the trace to `path` (Kineto JSON); returns the reserved bytes before the
    release marker."""
    import torch

    from residency import markers
    from residency.emulated import EmulatedNPU

    npu = EmulatedNPU(capacity_bytes=64 * MIB)
    npu.start_trace()
    with markers.span(markers.REQUEST):
        tensor = npu.empty(tensor_bytes // 4, dtype=torch.float32)
        npu.launch("work", lambda: None)
        npu.synchronize()
        tensor.free()
        reserved = npu.memory_reserved()
        with markers.span(markers.RELEASE_NORMAL):
            if release:
                npu.empty_cache()
            else:
                npu.memory_allocated()
        again = npu.empty(tensor_bytes // 4, dtype=torch.float32)
        npu.launch("more work", lambda: None)
        npu.synchronize()
        again.free()
    npu.stop_trace()
    npu.export_trace(path, rank=rank, world_size=world_size)
    return reserved
