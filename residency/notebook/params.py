"""Notebook parameters: checked once, one sentence per bad value (`ParameterError`), and
the run a notebook analyses (`open_source`).

A notebook execution reads each recorded run once: `check_parameters` loads (reads and
verifies) every run directory it is given, and `open_source`, the A/A and compare runs and
the API notebook's recorded run take that reading (`loaded_run`), never the disk again."""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from residency import devices
from residency.errors import BadInput, RunFailed
from residency.records.manifest import MANIFEST
from residency.rundir.run import Run, RunDirError, load_run

DEVICE_SPECS = devices.SPECS
NOTEBOOKS = ("api_reproduction", "consecutive_requests", "paired_profile", "policy_whatif")

ACCELERATOR_PATCH_CHOICES = ("none", "vllm-ascend", "both")
"""API notebook's `accelerator_patch`: probe without a patch, with vllm-ascend's, or both."""

__all__ = ["ACCELERATOR_PATCH_CHOICES", "DEVICE_SPECS", "NOTEBOOKS", "GateError",
           "ParameterError", "check_accelerator_patch", "check_parameters", "check_output_dir",
           "check_device", "loaded_run", "open_source"]

# the runs this notebook execution loaded, by real path, with their manifest's stat when
# loaded (a run changed on disk since is loaded again); `check_parameters` starts afresh
_LOADED: dict[str, tuple[tuple[int, int, int], Run]] = {}


def _stat(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path / MANIFEST)
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(path: str | os.PathLike[str], run: Run) -> Run:
    _LOADED[os.path.realpath(path)] = (_stat(Path(path)), run)
    return run


def _remembered(path: str | os.PathLike[str]) -> Run | None:
    got = _LOADED.get(os.path.realpath(path))
    return got[1] if got is not None and got[0] == _stat(Path(path)) else None


def loaded_run(source: str | os.PathLike[str]) -> Run:
    """The complete recorded run at `source` as this notebook execution read it (loaded
    and verified once, by `check_parameters`); loaded now (`load_run`) when it was not."""
    return _remembered(source) or _remember(source, load_run(source))


# ----------------------------------------------------------------------------- errors
class ParameterError(BadInput):
    """A notebook parameter that cannot be used; IPython shows only its one-sentence message."""

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of a traceback: the message alone."""
        return [f"ParameterError: {self}"]


class GateError(RunFailed, AssertionError):
    """A gate of a notebook failed; `failures` holds one sentence per failed check."""

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = tuple(failures)
        word = "gate" if len(self.failures) == 1 else "gates"
        super().__init__(f"{len(self.failures)} {word} failed: " + " ".join(self.failures))

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of a traceback: one line per failed gate."""
        word = "gate" if len(self.failures) == 1 else "gates"
        return [f"GateError: {len(self.failures)} {word} failed:",
                *(f"  - {f}" for f in self.failures)]


# ----------------------------------------------------------------------------- parameters
def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, bool))


def _passed(value: Any) -> str:
    kind = type(value).__name__
    return f"{value!r} ({kind})" if isinstance(value, str) else f"{value!r}"


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise ParameterError(f"The value for `{name}` must be an integer >= {minimum}, but "
                             f"{_passed(value)} was passed.")
    return int(value)


def _check_positive(name: str, value: Any) -> float:
    if not _is_number(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise ParameterError(f"The value for `{name}` must be a number > 0, but "
                             f"{_passed(value)} was passed.")
    return float(value)


def check_device(value: Any) -> str:
    if not isinstance(value, str) or value not in DEVICE_SPECS:
        raise ParameterError(f"The value for `device` must be one of {list(DEVICE_SPECS)}, "
                             f"but {value!r} was passed.")
    return value


def check_accelerator_patch(value: Any) -> str:
    if not isinstance(value, str) or value not in ACCELERATOR_PATCH_CHOICES:
        raise ParameterError(f"The value for `accelerator_patch` must be one of "
                             f"{list(ACCELERATOR_PATCH_CHOICES)}, but {value!r} was passed.")
    return value


def check_output_dir(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ParameterError(f"The value for `output_dir` must be None or a folder path, but "
                             f"{value!r} was passed.")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ParameterError(f"The value for `output_dir` must be a folder, but {str(path)!r} "
                             "is a file.")
    return str(path)


def _check_source(value: Any, *, designs: Sequence[str] | None, name: str = "source",
                  live: bool = True) -> str:
    what = "\"run\" or a recorded run directory" if live else "None or a recorded run directory"
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ParameterError(f"The value for `{name}` must be {what}, but {value!r} was "
                             "passed.")
    if live and str(value) == "run":
        return "run"
    path = Path(value)
    if not path.is_dir():
        raise ParameterError(f"The value for `{name}` must be {what}, but {str(path)!r} does "
                             "not exist.")
    try:
        run = _remembered(path) or load_run(path, allow_incomplete=True)  # read once
    except RunDirError as exc:
        raise ParameterError(f"The value for `{name}` must be a readable run directory, but "
                             f"{exc}.") from None
    if run.status != "complete":
        raise ParameterError(f"The value for `{name}` must be a complete run directory, but "
                             f"{str(path)!r} is marked {run.status!r} in its manifest.json "
                             f"(error: {run.manifest.get('error') or 'none recorded'}).")
    if designs is not None and run.design not in designs:
        raise ParameterError(f"The value for `{name}` must be a run of design "
                             f"{' or '.join(repr(d) for d in designs)}, but {str(path)!r} "
                             f"has design {run.design!r}.")
    _remember(path, run)
    return str(path.resolve())


def _check_compare(value: Any) -> list[str] | None:
    """None, or the run directories to compare with (one path or a list), each complete."""
    if value is None:
        return None
    items = [value] if isinstance(value, (str, os.PathLike)) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ParameterError("The value for `compare` must be None or a list of recorded run "
                             f"directories, but {value!r} was passed.")
    return [_check_source(v, designs=None, name="compare", live=False) for v in items]


def _check_service(value: Any) -> str | None:
    """None (the built-in service) or a service file that loads, as an absolute path."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ParameterError(f"The value for `service` must be None or a service file (TOML), "
                             f"but {value!r} was passed.")
    from residency.experiments.errors import ExperimentError
    from residency.experiments.servicefile import load_service_file

    try:
        load_service_file(value)
    except ExperimentError as exc:
        raise ParameterError(f"The value for `service` must be a usable service file, but "
                             f"{exc}.") from None
    return str(Path(value).resolve())


def _check_service_use(service: str, source: str | None, device: str) -> None:
    if source not in (None, "run"):
        raise ParameterError(f"The value for `service` must be None when `source` is a "
                             f"recorded run directory (its manifest names the service that "
                             f"ran), but {service!r} was passed.")
    from residency.experiments.servicefile import load_service_file

    kind = load_service_file(service).device_kind
    if device not in ("auto", kind):
        raise ParameterError(f"The value for `device` must be 'auto' or the service file's "
                             f"device kind {kind!r}, but {device!r} was passed.")


_INT_MINIMUM = {"ranks": 1, "steps": 1, "requests": 1, "pairs": 0, "seed": 0}
_POSITIVE = ("scale", "resident_mib")
_PLAN_NUMBERS = ("plan_cv", "plan_effect_s", "plan_budget_hours")  # None or a number (> 0;
# the effect non-zero, of either sign)


def check_parameters(*, designs: Sequence[str] | None = None, **params: Any) -> dict[str, Any]:
    """The notebook's parameters, checked; raises `ParameterError` (one sentence) on the
    first value that cannot be used.

    Known names: `device` (auto|npu|cuda|emulated-npu), `output_dir` (None or a folder),
    `source` ("run" or a complete recorded run directory, of one of `designs` when given),
    `ranks`, `steps`, `requests` (integers >= 1), `pairs`, `seed` (integers >= 0), `scale`,
    `resident_mib` (numbers > 0), `accelerator_patch` (none|vllm-ascend|both). With
    `source="run"`, an explicit `npu` or `cuda` must be usable here. A recorded run must
    match an explicit `device`. `service` (None or a service file that loads) goes with
    `source="run"` only, and an explicit `device` must be its device kind. `aa_source`
    (None or a complete A/A run directory, `--design aa`) is the E2E noise the unprofiled
    E2E delta is read against. `require_exclusive` (True or False): a fresh run refuses to
    measure while a foreign process holds a device. `compare` (None or a list of complete
    recorded run directories, any design and device): runs set beside this one in the
    cross-device table. Returns the values, with `source` as "run" or an absolute path,
    `service` as an absolute path and `compare` as a list of absolute paths.
    """
    _LOADED.clear()  # a new execution reads its runs afresh
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name == "device":
            out[name] = check_device(value)
        elif name == "output_dir":
            out[name] = check_output_dir(value)
        elif name == "source":
            out[name] = _check_source(value, designs=designs)
        elif name == "service":
            out[name] = _check_service(value)
        elif name == "aa_source":
            out[name] = None if value is None else _check_source(
                value, designs=("aa",), name=name, live=False)
        elif name == "accelerator_patch":
            out[name] = check_accelerator_patch(value)
        elif name == "scale" and value == "auto":
            out[name] = value  # sized from the device's capacity (residency.sizing)
        elif name == "inject_failure":
            from residency.devices import INJECTIONS

            if value not in INJECTIONS:
                raise ParameterError(f"The value for `inject_failure` must be one of "
                                     f"{list(INJECTIONS)}, but {value!r} was passed.")
            out[name] = value
        elif name == "stop_when_decided":
            if not isinstance(value, bool):
                raise ParameterError(f"The value for `{name}` must be True or False, but "
                                     f"{_passed(value)} was passed.")
            out[name] = value
        elif name == "plan_pilot":
            out[name] = None if value is None else _check_source(
                value, designs=None, name=name, live=False)
        elif name == "plan_effect_s":  # of either sign, not zero
            out[name] = None if value is None else math.copysign(
                _check_positive(name, abs(value) if _is_number(value) else value), value)
        elif name in _PLAN_NUMBERS:
            out[name] = None if value is None else _check_positive(name, value)
        elif name == "require_exclusive":
            if not isinstance(value, bool):
                raise ParameterError("The value for `require_exclusive` must be True or False, "
                                     f"but {value!r} was passed.")
            out[name] = value
        elif name == "compare":
            out[name] = _check_compare(value)
        elif name in _INT_MINIMUM:
            out[name] = _check_int(name, value, _INT_MINIMUM[name])
        elif name in _POSITIVE:
            out[name] = _check_positive(name, value)
        else:
            raise ParameterError(f"The parameter `{name}` is not one this notebook knows "
                                 f"(known: device, output_dir, source, service, aa_source, "
                                 f"accelerator_patch, inject_failure, stop_when_decided, "
                                 f"plan_pilot, require_exclusive, compare, "
                                 f"{', '.join([*_INT_MINIMUM, *_POSITIVE, *_PLAN_NUMBERS])}).")
    device, source = out.get("device", "auto"), out.get("source")
    service = out.get("service")
    if service is not None:
        _check_service_use(service, source, device)
    elif source == "run" and device in ("npu", "cuda"):
        from residency.devices import resolve  # imports torch; installs nothing

        try:
            resolve(device)
        except RuntimeError as exc:
            raise ParameterError(f"The value for `device` must be usable here, but {exc}."
                                 ) from None
    elif source not in (None, "run") and device != "auto":
        kind = loaded_run(source).device_kind
        if kind != device:
            raise ParameterError(f"The value for `device` must be 'auto' or the recorded run's "
                                 f"device kind {kind!r}, but {device!r} was passed.")
    return out



def open_source(source: str | os.PathLike[str], *, output_dir: str | os.PathLike[str],
                design: str, device: str = "auto", ranks: int = 2, steps: int = 50,
                seed: int = 2101, scale: float | str = 1.0, pairs: int = 1, requests: int = 1,
                resident_mib: float = 1024, service: str | os.PathLike[str] | None = None,
                inject_failure: str = "none", stop_when_decided: bool = False,
                require_exclusive: bool = False) -> Run:
    """The run to analyse: the recorded run directory `source`, or with `source="run"` a new
    run of `design` recorded into `output_dir/run` by `residency.experiments.designs.run_pair`
    (services start as subprocesses): the built-in service, or the external one the service
    file `service` describes (then `device`, `ranks` and `scale` come from that file).
    `scale="auto"` sizes the workload from the device; `inject_failure` (cuda only) injects
    the NPU's telemetry failure into the baseline (`residency pair --inject-failure`).
    `stop_when_decided` (paired-profile): `pairs` is the maximum, the suite's sequential rule
    (`residency.analysis.sequential.SequentialRule.default`) stops once E2E is decided.
    `require_exclusive`: see `residency.experiments.designs.run_design`."""
    if str(source) != "run":
        return loaded_run(source)
    from residency.experiments.designs import plan, run_pair
    from residency.notebook.progress import RunProgress

    out = Path(output_dir) / "run"
    progress = RunProgress(plan(design, pairs), design=design, run_dir=out)  # + terminal
    with warnings.catch_warnings():  # tqdm.auto in a kernel without ipywidgets: text bars
        warnings.filterwarnings("ignore", message=".*IProgress not found.*")
        path = run_pair(design, out=out, device=device, ranks=ranks, steps=steps, seed=seed,
                        pairs=pairs, requests=requests, scale=scale,
                        resident_mib=resident_mib, service_file=service, progress=progress,
                        inject_failure=inject_failure,
                        sequential=_rule(stop_when_decided, design, pairs),
                        require_exclusive=require_exclusive)
    _clear_progress()
    return load_run(path)


def _clear_progress() -> None:
    """Inside a Jupyter kernel, clear the cell's output once the runs are recorded: the
    finished progress bar never stands between the report's title and its verdict (the
    terminal keeps every progress line; the appendix lists the runs)."""
    if type(sys.stderr).__module__.startswith("ipykernel"):
        from IPython.display import clear_output

        clear_output()




def _rule(stop_when_decided: bool, design: str, pairs: int) -> Any:
    """The sequential rule of a notebook run with `stop_when_decided`, else None."""
    if not stop_when_decided:
        return None
    if design != "paired-profile" or pairs < 6:
        raise ParameterError(f"The value for `pairs` must be at least 6 (the maximum, with "
                             f"stop_when_decided), but {pairs!r} was passed.")
    from residency.analysis.sequential import SequentialRule

    return SequentialRule.default(pairs)
