"""Named host ranges: `torch.profiler.record_function` plus optional in-process sinks.

A sink is any callable `sink(name, start_ns, end_ns)` (monotonic `perf_counter_ns` clock);
the emulated NPU registers one to export host ranges beside its device tasks.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

RangeSink = Callable[[str, int, int], None]

RELEASE_NORMAL = "residency.release[normal]"
RELEASE_FORCED = "residency.release[forced]"
REQUEST = "residency.request"
PHASE_PREPARE = "residency.phase[prepare]"
PHASE_DENOISE = "residency.phase[denoise]"
PHASE_DECODE = "residency.phase[decode]"
PHASE_PREFIX = "residency.phase["  # every phase range starts so
PHASE_PATTERN = rf"^{re.escape(PHASE_PREFIX)}(?P<phase>[^\]]+)\]$"  # its `phase` group: the name
RELEASES = {"normal": RELEASE_NORMAL, "forced": RELEASE_FORCED}  # by policy-call kind
PHASES = {"prepare": PHASE_PREPARE, "denoise": PHASE_DENOISE, "decode": PHASE_DECODE}


def load(component: str) -> str:
    """The host range of loading one component onto the device (allocating its memory and
    uploading it), e.g. `residency.load[vae]`: where re-acquiring released memory shows."""
    return f"residency.load[{component}]"

_sinks: list[RangeSink] = []


def add_sink(sink: RangeSink) -> None:
    """Register a callable that receives every finished range."""
    if sink not in _sinks:
        _sinks.append(sink)


def remove_sink(sink: RangeSink) -> None:
    """Unregister a sink added with `add_sink` (no error when absent)."""
    if sink in _sinks:
        _sinks.remove(sink)


def emit(name: str, start_ns: int, end_ns: int) -> None:
    """Report an already measured range to every sink."""
    for sink in tuple(_sinks):
        sink(name, start_ns, end_ns)


def _profiler_listening() -> bool:
    """True when a profiler may record `record_function` ranges.

    `record_function` costs about 10 us even with no profiler; it is skipped only when torch's
    profiler is off and torch-npu (whose profiler we do not introspect) is not loaded.
    """
    import torch

    return "torch_npu" in sys.modules or torch.autograd._profiler_enabled()


@contextmanager
def span(name: str) -> Iterator[None]:
    """A host range named `name`, visible to torch profilers and to registered sinks."""
    start_ns = time.perf_counter_ns()
    try:
        if _profiler_listening():
            from torch.profiler import record_function

            with record_function(name):
                yield
        else:
            yield
    finally:
        if _sinks:
            emit(name, start_ns, time.perf_counter_ns())
