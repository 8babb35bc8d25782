"""Streams of the emulated NPU: in-order device tasks on worker threads, events, sticky errors."""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from residency.emulated.allocator import CachingHostAllocator
from residency.emulated.model import Cost, DeviceModel, modelled_cost
from residency.emulated.trace import DEVICE_PID_BASE, Tracer, TraceRecord
from residency.errors import RunFailed

if TYPE_CHECKING:
    from residency.emulated.device import EmulatedNPU

TASK_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_IDLE_POLL_S = 1.0  # an idle worker checks this often whether its stream still exists


class DeviceTaskError(RunFailed):
    """A device task raised; the device stays failed (a sticky error) for this process."""

    def __init__(self, device_index: int, task_name: str, error_type: str,
                 error_message: str) -> None:
        self.device_index = device_index
        self.task_name = task_name
        self.error_type = error_type
        self.error_message = error_message
        super().__init__(
            f"device task {task_name!r} on emulated NPU {device_index} failed: {error_type}: "
            f"{error_message} (sticky error: the device rejects further work in this process)")


class Task:
    """A submitted device task; `start_ns`/`end_ns` (perf_counter_ns) are set once it ran.

    On a modelled device they are the device's own clock: a task starts when the previous
    task of its stream ended on the device or when it was submitted, whichever is later, and
    ends its modelled duration after that, however late the worker thread got a core (a
    real device does not wait for the host's scheduler); the worker sleeps until that end.

    On a modelled device (`DeviceModel.compute == "modelled"`) a task with `model=True` is
    not computed: `cost` holds its FLOPs and bytes and the worker waits out the modelled
    duration. `cpu_ns` is the worker thread's CPU time spent on the task.
    """

    __slots__ = ("name", "category", "stream", "submit_ns", "start_ns", "end_ns", "skipped",
                 "model", "cost", "cpu_ns", "_fn", "_internal", "_done")

    def __init__(self, name: str, category: str, stream: Stream, fn: Callable[[], Any],
                 internal: bool = False, *, model: bool = True) -> None:
        self.name = name
        self.category = category
        self.stream = stream
        self.submit_ns = 0  # set by Stream.submit
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.skipped = False  # True when a sticky error kept it from running
        self.model = model
        self.cost: Cost | None = None
        self.cpu_ns: int | None = None
        self._fn: Callable[[], Any] | None = fn
        self._internal = internal
        self._done = threading.Event()

    def done(self) -> bool:
        """Whether the task has finished (or was skipped)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the task finished; False on timeout. Does not raise its error."""
        return self._done.wait(timeout)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, category={self.category!r}, done={self.done()})"


class Device:
    """State of one emulated device: allocator, streams and sticky error."""

    def __init__(self, index: int, capacity_bytes: int, tracer: Tracer,
                 stream_cls: type[Stream], model: DeviceModel | None = None) -> None:
        self.index = index
        self.tracer = tracer
        self.model = model or DeviceModel()
        # a modelled device copies nothing, so new memory is faulted in when it is allocated
        self.allocator = CachingHostAllocator(
            capacity_bytes, device_index=index, before_release=self.wait_idle,
            on_change=lambda delta, allocated, reserved: tracer.on_memory(
                index, delta, allocated, reserved),
            prefault=self.model.modelled,
            acquire_s=self.model.reacquire_s if self.model.cost_curve_set else None)
        self.streams: list[Stream] = []
        self.error: tuple[str, BaseException] | None = None
        self._lock = threading.Lock()
        self.default_stream = stream_cls._create(self)

    def add_stream(self, stream: Stream) -> int:
        with self._lock:
            self.streams.append(stream)
            return len(self.streams)  # stream ids count from 1: no trace track uses tid 0

    def wait_idle(self) -> None:
        for stream in tuple(self.streams):
            stream._wait_idle()

    def raise_error(self) -> None:
        if self.error is not None:
            name, exc = self.error
            raise DeviceTaskError(self.index, name, type(exc).__name__, str(exc)) from exc

    def synchronize(self) -> None:
        self.wait_idle()
        self.raise_error()


class Stream:
    """An in-order queue of device tasks run by one worker thread.

    Create streams through a module (`npu.Stream(device)`); `priority` is accepted and ignored.
    """

    _npu: ClassVar[EmulatedNPU | None] = None

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        npu = type(self)._npu
        if npu is None:
            raise TypeError("create streams through an emulated NPU module: `npu.Stream(...)`")
        self._setup(npu._device(device), priority)

    @classmethod
    def _create(cls, device: Device) -> Stream:
        stream = cls.__new__(cls)
        stream._setup(device, 0)
        return stream

    def _setup(self, device: Device, priority: int) -> None:
        self._dev = device
        self.priority = priority
        self._cond = threading.Condition()
        self._queue: deque[Task] = deque()
        self._pending = 0
        self._clock_ns = 0  # the device clock: end of this stream's last task (worker-owned)
        self._thread: threading.Thread | None = None
        self.stream_id = device.add_stream(self)

    @property
    def device_index(self) -> int:
        """Index of the stream's device."""
        return self._dev.index

    @property
    def device(self) -> torch.device:
        """The stream's device (PrivateUse1 type: `npu` once installed)."""
        return torch.device("privateuseone", self._dev.index)

    def submit(self, task: Task) -> Task:
        """Enqueue a task built for this stream; returns it."""
        task.submit_ns = time.perf_counter_ns()
        with self._cond:
            self._queue.append(task)
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_stream_worker, args=(weakref.ref(self), self._cond, self._queue),
                    daemon=True,
                    name=f"emulated-npu{self._dev.index}-stream{self.stream_id}")
                self._thread.start()
            self._cond.notify_all()
        return task

    def synchronize(self) -> None:
        """Wait until every task submitted so far ran; raises the device's sticky error."""
        self._wait_idle()
        self._dev.raise_error()

    def query(self) -> bool:
        """True when no submitted task is still pending."""
        with self._cond:
            return self._pending == 0

    def wait_event(self, event: Event) -> None:
        """Make later tasks of this stream wait until `event` completed."""
        task = event._task
        if task is None:
            return

        def wait_for() -> None:  # runs on this stream's worker: it owns `_clock_ns`
            task._done.wait()
            if task.end_ns is not None:  # the event's point on its own stream's clock
                self._clock_ns = max(self._clock_ns, task.end_ns)

        self.submit(Task("wait_event", "internal", self, wait_for, internal=True))

    def wait_stream(self, stream: Stream) -> None:
        """Make later tasks of this stream wait for everything submitted to `stream` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (a new one if None) on this stream; returns it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def _wait_idle(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a device task cannot synchronize its own stream")
        with self._cond:
            while self._pending:
                self._cond.wait()

    def _run_task(self, task: Task) -> None:
        try:
            self._execute(task)
        finally:
            task._fn = None  # drop the closure: it may hold buffers alive
            task._done.set()
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _execute(self, task: Task) -> None:
        fn = task._fn
        assert fn is not None
        if task._internal:
            self._clock_ns = max(self._clock_ns, task.submit_ns)
            fn()
            task.start_ns = task.end_ns = self._clock_ns
            return
        if self._dev.error is not None:
            task.skipped = True
            return
        model = self._dev.model
        picked_ns = time.perf_counter_ns()
        cpu_start_ns = time.thread_time_ns()
        try:
            if model.modelled and task.model:
                task.cost = modelled_cost(fn, model)
                start_ns = max(self._clock_ns, task.submit_ns)
                end_ns = start_ns + model.duration_ns(task.cost, task.category)
                task.start_ns, task.end_ns = start_ns, end_ns
                remaining_ns = end_ns - time.perf_counter_ns()
                if remaining_ns > 0:  # the device "computes"; this thread holds no core
                    time.sleep(remaining_ns / 1e9)
            else:
                task.start_ns = max(picked_ns, self._clock_ns)
                fn()
        except BaseException as exc:  # noqa: BLE001 - a device records any failure, stickily
            if self._dev.error is None:
                self._dev.error = (task.name, exc)
        finally:
            task.cpu_ns = time.thread_time_ns() - cpu_start_ns
            if task.start_ns is None:
                task.start_ns = picked_ns
            if task.end_ns is None:  # real work (or a failure): the host's clock
                task.end_ns = max(time.perf_counter_ns(), task.start_ns)
            self._clock_ns = max(self._clock_ns, task.end_ns)
            self._dev.tracer.add(TraceRecord(
                task.name, task.category, task.start_ns, task.end_ns,
                DEVICE_PID_BASE + self._dev.index, self.stream_id, self._dev.index))

    def __repr__(self) -> str:
        return f"Stream(device=npu:{self._dev.index}, stream_id={self.stream_id})"


def _stream_worker(stream_ref: weakref.ref[Stream], cond: threading.Condition,
                   queue: deque[Task]) -> None:
    """Run a stream's tasks in order; end within a poll interval once the stream is gone.

    Holds no reference to the stream while idle, so an unused module can be collected.
    """
    while True:
        with cond:
            if not queue:
                cond.wait(_IDLE_POLL_S)
            task = queue.popleft() if queue else None
        if task is not None:
            task.stream._run_task(task)
            del task
        elif stream_ref() is None:
            return


class Event:
    """A point in a stream: `record`, then `synchronize`, `query`, `elapsed_time`.

    Create events through a module (`npu.Event(enable_timing=True)`) when `record()` should
    default to the current stream.
    """

    _npu: ClassVar[EmulatedNPU | None] = None

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._task: Task | None = None
        self._time_ns: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Mark the current end of `stream` (the current stream if None)."""
        if stream is None:
            npu = type(self)._npu
            if npu is None:
                raise TypeError("pass a stream, or create the event with `npu.Event(...)`")
            stream = npu.current_stream()
        self._time_ns = None
        self._task = stream.submit(Task("record_event", "internal", stream,
                                        lambda: self._stamp(stream), internal=True))

    def _stamp(self, stream: Stream) -> None:
        self._time_ns = stream._clock_ns  # where the device is: the stream's clock

    def query(self) -> bool:
        """True once everything before the recorded point ran (or if never recorded)."""
        return self._task is None or self._task.done()

    def synchronize(self) -> None:
        """Wait for the recorded point; raises the device's sticky error."""
        if self._task is not None:
            self._task.wait()
            self._task.stream._dev.raise_error()

    def wait(self, stream: Stream | None = None) -> None:
        """Make later tasks of `stream` (the current stream if None) wait for this event."""
        if stream is None:
            npu = type(self)._npu
            if npu is None:
                raise TypeError("pass a stream, or create the event with `npu.Event(...)`")
            stream = npu.current_stream()
        stream.wait_event(self)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and `end_event`, both recorded and completed."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        for event in (self, end_event):
            if event._task is None or not event._task.done() or event._time_ns is None:
                raise RuntimeError("both events must be recorded and completed")
        assert self._time_ns is not None and end_event._time_ns is not None
        return (end_event._time_ns - self._time_ns) / 1e6
