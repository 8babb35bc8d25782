"""Progress of a run on the terminal that started it, also from inside a notebook kernel.

papermill shows only its cell counter while a cell runs (stuck at one cell for minutes while
the pairs run); the kernel's own standard error, however, is the terminal papermill was
started from. `to_terminal` writes a line there (inside an ipykernel: the original fd 2 that
ipykernel keeps behind its capture; elsewhere: `sys.stderr`), and `RunProgress` is the
progress object `residency.experiments.designs.run_design(progress=...)` accepts: it says what
runs
now (arm, pair, request), runs done of the total and an estimate of the time left, at every
run start and end and every `interval_s` seconds in between (a daemon thread), and forwards
to a tqdm bar shown in the notebook. No torch.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from residency.humanize import duration_text
from residency.records.decisions import decisions_file, last_request_id
from residency.rundir import layout

INTERVAL_S = 20.0  # at most this long between two terminal lines
PREFIX = "residency: "
_CLEAR_LINE = "\r\x1b[K"  # on a terminal: start over the line papermill's bar is drawing

__all__ = ["INTERVAL_S", "RunProgress", "pair_labels", "to_terminal"]


def to_terminal(line: str) -> None:
    """Write `line` (with the "residency: " prefix) to the terminal that started this
    process; inside a Jupyter kernel that is the original standard error, which papermill's
    terminal shows, never the notebook. On a terminal the line replaces the partial line of
    papermill's progress bar (which redraws below it)."""
    text = f"{PREFIX}{line}\n"
    err = sys.stderr
    if type(err).__module__.startswith("ipykernel"):
        try:  # with fd capture on, fd 2 feeds the notebook; fileno() is the terminal's copy
            fd = err.fileno()
            os.write(fd, (_CLEAR_LINE if os.isatty(fd) else "").encode() + text.encode())
            return
        except (OSError, ValueError, io.UnsupportedOperation):
            err = sys.__stderr__  # no capture: the process's stderr is the terminal
    with contextlib.suppress(OSError, ValueError, AttributeError):
        tty = err.isatty()  # type: ignore[union-attr]
        err.write((_CLEAR_LINE if tty else "") + text)  # type: ignore[union-attr]
        err.flush()  # type: ignore[union-attr]


def pair_labels(order: Sequence[tuple[str, bool]], design: str) -> list[str]:
    """What each run of a design's `order` ((arm, profiled) per run) is, for people:
    "profiled pair", "unprofiled pair 2 of 3", "request series" (consecutive)."""
    if design == "consecutive":
        return ["request series"] * len(order)
    unprofiled = [i for i, (_, p) in enumerate(order) if not p]
    total = len(unprofiled) // 2
    out = []
    for i, (_, profiled) in enumerate(order):
        if profiled:
            out.append("profiled pair")
        else:
            out.append(f"unprofiled pair {unprofiled.index(i) // 2 + 1} of {total}")
    return out


def _last_request(run_dir: Path | None, index: int, arm: str) -> str | None:
    """The request the current run is serving, from the last line of its rank-0 decisions
    file (None before its first policy call)."""
    if run_dir is None:
        return None
    return last_request_id(run_dir / layout.run_dir(index, arm) / decisions_file(0))


class RunProgress:
    """Progress of one design's runs on the terminal (`to_terminal`) and, optionally, in a
    tqdm bar. Pass it as `progress=` to `run_design`/`run_pair`: it is called with
    `total` and `desc` and then used as the bar (`set_postfix_str`, `update`, `close`)."""

    def __init__(self, order: Sequence[tuple[str, bool]], *, design: str,
                 device_kind: str = "", run_dir: str | os.PathLike[str] | None = None,
                 interval_s: float = INTERVAL_S, bar: bool = True,
                 write: Callable[[str], None] = to_terminal,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.order = list(order)
        self.labels = pair_labels(self.order, design)
        self.design, self.device_kind = design, device_kind
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.interval_s, self._want_bar = interval_s, bar
        self._write, self._clock = write, clock
        self.done = 0
        self._durations: list[float] = []
        self._started = self._run_started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._head = ""

    # -- the bar protocol run_design uses
    def __call__(self, *, total: int, desc: str) -> RunProgress:
        """Start: `run_design` calls this with the number of runs and a description."""
        if total != len(self.order):
            self.order = (self.order + [("?", False)] * total)[:total]
            self.labels = (self.labels + ["?"] * total)[:total]
        if not self.device_kind and desc:
            self._head = desc  # run_design says "<design> (<device kind>)"
        if self._want_bar:
            from tqdm.auto import tqdm

            # on stdout: in the notebook (and its report) a progress bar is output, not an
            # error; stderr streams render pink there
            self._bar = tqdm(total=total, desc=desc, unit="run", file=sys.stdout)
        self._started = self._run_started = self._clock()
        self._emit()
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._tick, name="residency-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def set_postfix_str(self, text: str) -> None:
        """A run starts (`run_design` says which)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def update(self, n: int = 1) -> None:
        """`n` runs finished."""
        now = self._clock()
        with self._lock:
            self._durations.append(now - self._run_started)
            self.done += n
            self._run_started = now
        if self._bar is not None:
            self._bar.update(n)
        self._emit()

    def close(self) -> None:
        """Stop the ticker; say how it ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._bar is not None:
            self._bar.close()
        total = len(self.order)
        word = "finished" if self.done >= total else "stopped"
        self._write(f"{self.design}: {word}: {self.done}/{total} runs in "
                    f"{duration_text(self._clock() - self._started)}")

    # -- lines
    def line(self) -> str:
        """The current state as one line: what runs now, runs done, elapsed, time left."""
        with self._lock:
            done, durations, run_started = self.done, list(self._durations), self._run_started
        total = len(self.order)
        now = self._clock()
        head = self._head or (f"{self.design}"
                              + (f" ({self.device_kind})" if self.device_kind else ""))
        if done < total:
            arm, _ = self.order[done]
            rid = _last_request(self.run_dir, done, arm)
            req = ("starting the service" if rid is None else f"warm-up request {rid}"
                   if rid.startswith("warmup") else f"measured request {rid}")
            now_text = f"run {done + 1}/{total}: {arm}, {self.labels[done]}, {req}"
        else:
            now_text = "all runs done"
        elapsed = now - self._started
        if durations and done < total:
            per_run = sum(durations) / len(durations)
            left = max(0.0, per_run * (total - done) - (now - run_started))
            eta = f"about {duration_text(left)} left"
        elif done < total:
            eta = "time left: estimated once the first run ends"
        else:
            eta = "0 s left"
        return (f"{head}: {now_text}; {done}/{total} runs done; {duration_text(elapsed)} "
                f"elapsed, {eta}")

    def _emit(self) -> None:
        with contextlib.suppress(Exception):  # progress must never break a run
            self._write(self.line())

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._emit()
