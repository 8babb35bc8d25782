"""The emulated NPU's device module (torch-npu function names) and its device memory."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from residency import markers
from residency.emulated.allocator import Block, check_positive_int
from residency.emulated.model import DeviceModel, modelled_cost
from residency.emulated.streams import TASK_CATEGORIES, Device, Stream, Task
from residency.emulated.streams import Event as _Event
from residency.emulated.trace import Tracer, TraceRecord, kineto_json, kineto_trace

DEFAULT_CAPACITY_BYTES = 4 * 1024**3
BACKEND_NAME = "npu"
DEVICE_NAME = "Emulated NPU (host-backed)"


class DeviceTensor:
    """Device memory holding a tensor of `shape`/`dtype` in one allocator block.

    `.host` is a CPU tensor over the block's buffer, meant for use inside device tasks only.
    """

    def __init__(self, npu: EmulatedNPU, device_index: int, shape: torch.Size,
                 dtype: torch.dtype, block: Block | None) -> None:
        self._npu = npu
        self.device_index = device_index
        self.shape = shape
        self.dtype = dtype
        self.nbytes = shape.numel() * dtype.itemsize
        self._block = block
        if block is None:  # zero bytes: nothing allocated, like PyTorch
            self._host: torch.Tensor | None = torch.empty(shape, dtype=dtype)
        else:
            assert block.buffer is not None
            self._host = block.buffer[: self.nbytes].view(dtype).view(shape)

    @property
    def device(self) -> torch.device:
        """The tensor's device (PrivateUse1 type: `npu` once installed)."""
        return torch.device("privateuseone", self.device_index)

    @property
    def freed(self) -> bool:
        """Whether `free()` was called."""
        return self._host is None

    @property
    def host(self) -> torch.Tensor:
        """A CPU view of the device memory (for device tasks); RuntimeError once freed."""
        host = self._host
        if host is None:
            raise RuntimeError("this DeviceTensor was freed")
        return host

    def free(self) -> None:
        """Return the memory to the device's cache (idempotent)."""
        self._release(from_finalizer=False)

    def to_host(self) -> torch.Tensor:
        """A CPU copy, made by a device task on the current stream after all earlier work."""
        source = self.host
        out = torch.empty_like(source)
        # the host receives real bytes: this copy runs even on a modelled device
        task = self._npu.launch("Memcpy DtoH", lambda: out.copy_(source), self.device_index,
                                category="gpu_memcpy", model=False)
        task.wait()
        self._npu._devices[self.device_index].raise_error()
        return out

    def _release(self, *, from_finalizer: bool) -> None:
        block, self._block = self._block, None
        self._host = None
        if block is not None:
            self._npu._devices[self.device_index].allocator.free(
                block, from_finalizer=from_finalizer)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn things down
            self._release(from_finalizer=True)

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return (f"DeviceTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device=npu:{self.device_index}{state})")


def _WARM_UP_TASK() -> None:  # noqa: N802 - a constant-like task
    torch.mm(torch.ones(2, 2), torch.ones(2, 2)).add_(1).sum()


_DEVICE_STRING = re.compile(r"(?:npu|privateuseone)(?::(\d+))?")


class EmulatedNPU(types.ModuleType):
    """The device module of the emulated NPU, with torch-npu's function names.

    `device` arguments accept None (the current device), an int, "npu[:i]" or a torch.device
    of the PrivateUse1 type. The current device is process-wide; the current stream is
    per thread. Builds without registering anything; `install_emulated_npu` registers one.
    `model` says how device tasks take time (`DeviceModel`: modelled by default, or real
    compute on host threads).
    """

    def __init__(self, devices: int = 1, capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
                 *, model: DeviceModel | None = None) -> None:
        super().__init__("residency.emulated.npu", "Emulated NPU device module (host-backed).")
        check_positive_int("devices", devices)
        self._capacity_bytes = check_positive_int("capacity_bytes", capacity_bytes)
        self._clock_offset_ns = time.time_ns() - time.perf_counter_ns()  # wall = perf + offset
        self._tracer = Tracer()
        self.Stream = type("Stream", (Stream,), {"_npu": self, "__module__": __name__})
        self.Event = type("Event", (_Event,), {"_npu": self, "__module__": __name__})
        if model is not None and not isinstance(model, DeviceModel):
            raise ValueError(f"The value for `model` must be a DeviceModel or None, but "
                             f"{model!r} was passed.")
        self._model = model or DeviceModel()
        if self._model.modelled:  # the first shape-only run imports and sets up for ~1 s CPU:
            modelled_cost(_WARM_UP_TASK, self._model)  # pay it here, not in the first task
        self._devices = [Device(i, capacity_bytes, self._tracer, self.Stream, self._model)
                         for i in range(devices)]
        self._current_index = 0
        self._local = threading.local()

    @property
    def capacity_bytes(self) -> int:
        """Capacity of each device, bytes."""
        return self._capacity_bytes

    @property
    def model(self) -> DeviceModel:
        """How device tasks take time (modelled or real compute) and the accelerator patch."""
        return self._model

    def _device(self, device: Any) -> Device:
        return self._devices[self._index(device)]

    def _index(self, device: Any) -> int:
        index: int | None = None
        if device is None:
            index = self._current_index
        elif isinstance(device, int) and not isinstance(device, bool):
            index = device
        elif isinstance(device, str):
            match = _DEVICE_STRING.fullmatch(device.strip())
            if match:
                index = int(match[1]) if match[1] is not None else self._current_index
        elif isinstance(device, torch.device) and device.type in (BACKEND_NAME, "privateuseone"):
            index = self._current_index if device.index is None else device.index
        if index is None or not 0 <= index < len(self._devices):
            raise ValueError(
                f"The value for `device` must be None, an index in [0, {len(self._devices)}), "
                f"'npu[:index]' or an npu torch.device of an existing device, but {device!r} "
                "was passed.")
        return index

    # -- device management ----------------------------------------------------------------
    def is_available(self) -> bool:
        """Always True: the emulated device needs no hardware."""
        return True

    def is_initialized(self) -> bool:
        """Always True."""
        return True

    def init(self) -> None:
        """Nothing to initialise."""

    def device_count(self) -> int:
        """Number of emulated devices."""
        return len(self._devices)

    def current_device(self) -> int:
        """Index of the current device (process-wide)."""
        return self._current_index

    def set_device(self, device: Any) -> None:
        """Make `device` the current device (process-wide)."""
        self._current_index = self._index(device)

    def get_device_name(self, device: Any = None) -> str:
        """The device's name."""
        self._index(device)
        return DEVICE_NAME

    def synchronize(self, device: Any = None) -> None:
        """Wait for every task on every stream of `device`; raises its sticky error."""
        self._device(device).synchronize()

    # -- memory ---------------------------------------------------------------------------
    def memory_allocated(self, device: Any = None) -> int:
        """Bytes in live blocks of `device`."""
        return self._device(device).allocator.allocated_bytes

    def memory_reserved(self, device: Any = None) -> int:
        """Bytes held by `device`'s allocator, live or cached."""
        return self._device(device).allocator.reserved_bytes

    def max_memory_allocated(self, device: Any = None) -> int:
        """Peak of `memory_allocated` since start or `reset_peak_memory_stats`."""
        return self._device(device).allocator.max_allocated_bytes

    def max_memory_reserved(self, device: Any = None) -> int:
        """Peak of `memory_reserved` since start or `reset_peak_memory_stats`."""
        return self._device(device).allocator.max_reserved_bytes

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """Set the peaks to the current values."""
        self._device(device).allocator.reset_peak_stats()

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        """Allocator counters under torch-npu's keys (`allocated_bytes.all.current`, ...)."""
        return self._device(device).allocator.stats()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) bytes: free = capacity - reserved."""
        allocator = self._device(device).allocator
        return allocator.free_bytes, allocator.capacity_bytes

    def empty_cache(self) -> None:
        """Synchronize the current device, then return its cached blocks to the OS (with the
        model's cost curve: to a host pool, taking the curve's time)."""
        device = self._device(None)
        device.synchronize()
        start = time.perf_counter()
        released = device.allocator.release_cached()
        if self._model.cost_curve_set:  # the measured curve's cost, not the host's
            left = self._model.release_s(released) - (time.perf_counter() - start)
            if left > 0:
                time.sleep(left)

    def empty(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32,
              device: Any = None) -> DeviceTensor:
        """Uninitialised device memory for a tensor of `shape` and `dtype`."""
        index = self._index(device)
        size = torch.Size([shape] if isinstance(shape, int) else shape)
        if any(dim < 0 for dim in size):
            raise ValueError(f"The value for `shape` must not have negative sizes, but "
                             f"{tuple(size)} was passed.")
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"The value for `dtype` must be a torch.dtype, but {dtype!r} "
                             "was passed.")
        nbytes = size.numel() * dtype.itemsize
        block = self._devices[index].allocator.allocate(nbytes) if nbytes else None
        return DeviceTensor(self, index, size, dtype, block)

    def to_device(self, host_tensor: torch.Tensor, device: Any = None, *,
                  name: str = "Memcpy HtoD") -> DeviceTensor:
        """Allocate device memory and enqueue the copy of `host_tensor` into it.

        Like a non-blocking copy from pinned memory, `host_tensor` must stay unchanged until
        the copy ran (synchronize, or an event recorded after it).
        """
        if not isinstance(host_tensor, torch.Tensor) or host_tensor.device.type != "cpu":
            raise ValueError(f"The value for `host_tensor` must be a CPU torch.Tensor, but "
                             f"{type(host_tensor).__name__} was passed.")
        index = self._index(device)
        source = host_tensor.detach()
        out = self.empty(source.shape, source.dtype, index)
        if out.nbytes:
            target = out.host
            self.launch(name, lambda: target.copy_(source), index, category="gpu_memcpy")
        return out

    # -- execution ------------------------------------------------------------------------
    def current_stream(self, device: Any = None) -> Stream:
        """The calling thread's current stream of `device` (its default stream unless set)."""
        dev = self._device(device)
        current: dict[int, Stream] = getattr(self._local, "streams", {})
        return current.get(dev.index, dev.default_stream)

    def default_stream(self, device: Any = None) -> Stream:
        """The default stream of `device`."""
        return self._device(device).default_stream

    def set_stream(self, stream: Stream) -> None:
        """Make `stream` the calling thread's current stream of its device."""
        if not isinstance(stream, Stream) or stream._dev not in self._devices:
            raise ValueError(f"The value for `stream` must be a stream of this module, but "
                             f"{stream!r} was passed.")
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        self._local.streams[stream._dev.index] = stream

    @contextlib.contextmanager
    def stream(self, stream: Stream | None) -> Iterator[None]:
        """Within the block, `stream` is the current stream of its device (None: no change)."""
        if stream is None:
            yield
            return
        previous = self.current_stream(stream._dev.index)
        self.set_stream(stream)
        try:
            yield
        finally:
            self.set_stream(previous)

    def launch(self, name: str, fn: Callable[[], Any], device: Any = None, *,
               category: str = "kernel", stream: Stream | None = None,
               model: bool = True) -> Task:
        """Enqueue `fn` as a device task on `stream` (default: the current stream of `device`).

        On a modelled device `fn` runs with its torch operators shape-only and the stream
        waits out their modelled time; `model=False` computes it anyway (results the host
        must receive). Raises the device's sticky error if an earlier task failed.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"The value for `name` must be a non-empty string, but {name!r} "
                             "was passed.")
        if not callable(fn):
            raise ValueError(f"The value for `fn` must be callable, but {fn!r} was passed.")
        if category not in TASK_CATEGORIES:
            raise ValueError(f"The value for `category` must be one of {list(TASK_CATEGORIES)}, "
                             f"but {category!r} was passed.")
        if stream is None:
            stream = self.current_stream(device)
        elif device is not None and self._index(device) != stream.device_index:
            raise ValueError(f"stream {stream!r} is not on device {device!r}")
        stream._dev.raise_error()
        return stream.submit(Task(name, category, stream, fn, model=model))

    # -- tracing --------------------------------------------------------------------------
    def start_trace(self) -> None:
        """Forget earlier records and record device tasks and host ranges from now on."""
        self._tracer.start(time.perf_counter_ns())
        markers.add_sink(self._tracer.on_host_range)

    def stop_trace(self) -> None:
        """Stop recording after every task submitted so far ran (errors are not raised here)."""
        for device in self._devices:
            device.wait_idle()
        markers.remove_sink(self._tracer.on_host_range)
        self._tracer.stop(time.perf_counter_ns())

    def trace_events(self) -> list[TraceRecord]:
        """The records of the current or last trace, by start time."""
        return self._tracer.snapshot()

    def kineto_trace(self, *, rank: int, world_size: int, trace_name: str = "") -> dict[str, Any]:
        """The current or last trace as a Kineto-shaped JSON object (see `export_trace`)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"The value for `world_size` must be a positive integer, but "
                             f"{world_size!r} was passed.")
        if (isinstance(rank, bool) or not isinstance(rank, int)
                or not 0 <= rank < world_size):
            raise ValueError(f"The value for `rank` must be an integer in [0, {world_size}), "
                             f"but {rank!r} was passed.")
        start_ns = self._tracer.start_ns
        if start_ns is None:
            raise RuntimeError("no trace to export: call start_trace() first")
        return kineto_trace(
            self._tracer.snapshot(), start_ns=start_ns,
            base_time_ns=start_ns + self._clock_offset_ns,
            streams={d.index: [s.stream_id for s in d.streams] for d in self._devices},
            device_name=DEVICE_NAME, capacity_bytes=self._capacity_bytes, rank=rank,
            world_size=world_size, trace_name=trace_name,
            memory=self._tracer.memory_snapshot())

    def export_trace(self, path: str | os.PathLike[str], *, rank: int,
                     world_size: int) -> Path:
        """Write the current or last trace as Kineto JSON to `path`; returns the path.

        Device tasks are `ph: X` events of category kernel/gpu_memcpy/gpu_memset on pid
        DEVICE_PID_BASE + device index, tid = stream id; host ranges are `user_annotation`
        on this process's pid and native thread id. `ts`/`dur` are microseconds, `ts` relative
        to `baseTimeNanoseconds` (wall-clock ns at `start_trace`). The text is laid out as
        Kineto lays out its own (`residency.emulated.trace.kineto_json`).
        """
        target = Path(path)
        trace = self.kineto_trace(rank=rank, world_size=world_size, trace_name=str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(kineto_json(trace), encoding="utf-8")
        return target

    def __repr__(self) -> str:
        return (f"<EmulatedNPU devices={len(self._devices)} "
                f"capacity_bytes={self._capacity_bytes} compute={self._model.compute}>")
