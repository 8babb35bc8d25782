"""Support for the three notebooks (`notebooks/`): parameter checks, output folders, the
`results.json` sidecar, and the tables, figures and notes each notebook shows.

Data flow: parameters -> `check_parameters` -> `open_source` (a fresh run via
`residency.experiments.run_pair`, or a recorded run directory) -> analyses that return data
(`consecutive_table`, `gate_failures`, `fractions`, `paired_profile`, ...) -> `plot_*`
figures -> `write_results` / `write_tables` / `save_figure`.

No torch and no workload at import: a notebook kernel must stay free of the emulated NPU's
process-global backend registration, so `probe` runs `residency probe` in a subprocess and
fresh runs start their services as subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from residency import devices, stats
from residency.rundir import Run, RunDirError, RunEntry, load_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ARMS = ("baseline", "candidate")
DEVICE_SPECS = devices.SPECS
NOTEBOOKS = ("api_reproduction", "consecutive_requests", "paired_profile")
EMULATED_LABEL = devices.EMULATED_LABEL
MAX_CACHED_FRACTION = 0.25
MIN_FREE_FRACTION = 0.05
RESULTS_FILE = "results.json"
ATTRIBUTIONS = {  # key in PairedProfile.results / results.json notes -> words
    "normal_call_duration": "normal-call duration per rank",
    "normal_released": "normal calls that released",
    "forced_released": "forced releases that released",
    "idle_intersection": "normal-release markers ∩ all-rank no-device-task time",
    "all_rank_idle": "all-rank no-device-task time",
    "preparation_window": "preparation window",
    "e2e_profiled": "client E2E, profiled pair",
    "e2e_unprofiled": "client E2E, unprofiled pairs",
    "normal_retained": "normal checks retained",
}

__all__ = [
    "ARMS", "ATTRIBUTIONS", "DEVICE_SPECS", "EMULATED_LABEL", "NOTEBOOKS", "api_from_run",
    "api_reproduction", "api_results", "arms_table", "check_gates", "check_parameters",
    "consecutive_notes", "consecutive_summary", "consecutive_table", "describe_run",
    "device_label", "e2e_frame", "evidence_tables", "finish", "fractions", "gate_failures",
    "GateError", "idle_frame", "markdown_table", "normal_call_frame", "open_source",
    "paired_profile", "paired_results", "PairedProfile", "ParameterError", "plot_e2e",
    "plot_fractions", "plot_idle", "plot_normal_calls", "prepare_output_dir", "probe",
    "probe_table", "releases_frame", "save_figure", "statistical_note", "verdict_markdown",
    "versions_table", "write_results", "write_tables",
]


# ----------------------------------------------------------------------------- errors
class ParameterError(ValueError):
    """A notebook parameter that cannot be used; IPython shows only its one-sentence message."""

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of a traceback: the message alone."""
        return [f"ParameterError: {self}"]


class GateError(AssertionError):
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


def _check_device(value: Any) -> str:
    if not isinstance(value, str) or value not in DEVICE_SPECS:
        raise ParameterError(f"The value for `device` must be one of {list(DEVICE_SPECS)}, "
                             f"but {value!r} was passed.")
    return value


def _check_output_dir(value: Any) -> str | None:
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


def _check_source(value: Any, *, designs: Sequence[str] | None) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ParameterError(f"The value for `source` must be \"run\" or a recorded run "
                             f"directory, but {value!r} was passed.")
    if str(value) == "run":
        return "run"
    path = Path(value)
    if not path.is_dir():
        raise ParameterError(f"The value for `source` must be \"run\" or a recorded run "
                             f"directory, but {str(path)!r} does not exist.")
    try:
        run = load_run(path, allow_incomplete=True)
    except RunDirError as exc:
        raise ParameterError(f"The value for `source` must be a readable run directory, but "
                             f"{exc}.") from None
    if run.status != "complete":
        raise ParameterError(f"The value for `source` must be a complete run directory, but "
                             f"{str(path)!r} is marked {run.status!r} in its manifest.json "
                             f"(error: {run.manifest.get('error') or 'none recorded'}).")
    if designs is not None and run.design not in designs:
        raise ParameterError(f"The value for `source` must be a run of design "
                             f"{' or '.join(repr(d) for d in designs)}, but {str(path)!r} "
                             f"has design {run.design!r}.")
    return str(path.resolve())


_INT_MINIMUM = {"ranks": 1, "steps": 1, "requests": 1, "pairs": 0, "seed": 0}
_POSITIVE = ("scale", "resident_mib")


def check_parameters(*, designs: Sequence[str] | None = None, **params: Any) -> dict[str, Any]:
    """The notebook's parameters, checked; raises `ParameterError` (one sentence) on the
    first value that cannot be used.

    Known names: `device` (auto|npu|cuda|emulated-npu), `output_dir` (None or a folder),
    `source` ("run" or a complete recorded run directory, of one of `designs` when given),
    `ranks`, `steps`, `requests` (integers >= 1), `pairs`, `seed` (integers >= 0), `scale`,
    `resident_mib` (numbers > 0). With `source="run"`, an explicit `npu` or `cuda` must be
    usable here. A recorded run must match an explicit `device`. Returns the values, with
    `source` as "run" or an absolute path.
    """
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name == "device":
            out[name] = _check_device(value)
        elif name == "output_dir":
            out[name] = _check_output_dir(value)
        elif name == "source":
            out[name] = _check_source(value, designs=designs)
        elif name in _INT_MINIMUM:
            out[name] = _check_int(name, value, _INT_MINIMUM[name])
        elif name in _POSITIVE:
            out[name] = _check_positive(name, value)
        else:
            raise ParameterError(f"The parameter `{name}` is not one this notebook knows "
                                 f"(known: device, output_dir, source, "
                                 f"{', '.join([*_INT_MINIMUM, *_POSITIVE])}).")
    device, source = out.get("device", "auto"), out.get("source")
    if source == "run" and device in ("npu", "cuda"):
        from residency.devices import resolve  # imports torch; installs nothing

        try:
            resolve(device)
        except RuntimeError as exc:
            raise ParameterError(f"The value for `device` must be usable here, but {exc}."
                                 ) from None
    elif source not in (None, "run") and device != "auto":
        kind = load_run(source).device_kind
        if kind != device:
            raise ParameterError(f"The value for `device` must be 'auto' or the recorded run's "
                                 f"device kind {kind!r}, but {device!r} was passed.")
    return out


# ----------------------------------------------------------------------------- outputs
def _announce(line: str) -> None:
    """Print `line` in the notebook and, inside a Jupyter kernel, on the terminal that
    started it (papermill's stderr), which sees nothing of the notebook's own output."""
    print(line, flush=True)
    err = sys.stderr
    if not type(err).__module__.startswith("ipykernel"):
        return
    text = f"residency: {line}\n"
    try:  # with fd capture on, fd 2 feeds the notebook; fileno() is the terminal's copy
        os.write(err.fileno(), text.encode())
    except (OSError, ValueError, io.UnsupportedOperation):  # no capture: fd 2 is the terminal
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.__stderr__.write(text)  # type: ignore[union-attr]
            sys.__stderr__.flush()  # type: ignore[union-attr]


def prepare_output_dir(output_dir: str | os.PathLike[str] | None, name: str) -> Path:
    """The folder for this notebook's results, tables and figures, created and announced.

    `None` gives a new `reports/<name>/<UTC timestamp>/` under the current working directory
    (a suffix `-1`, `-2`, ... when that name is taken).

    Raises:
        ParameterError: `output_dir` is a file or cannot be created.
    """
    _check_output_dir(output_dir)
    if output_dir is not None:
        path = Path(output_dir).resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ParameterError(f"The value for `output_dir` must be a folder that can be "
                                 f"created, but {exc}.") from None
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = Path.cwd() / "reports" / name
        for i in range(1000):
            path = base / (stamp if i == 0 else f"{stamp}-{i}")
            try:
                path.mkdir(parents=True)
                break
            except FileExistsError:
                continue
        else:
            raise ParameterError(f"The output folder {base} has no free name for {stamp}.")
    _announce(f"{name}: results.json, tables and figures go to {path}")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(output_dir: str | os.PathLike[str], results: Mapping[str, Any]) -> Path:
    """Write `results.json` into `output_dir` atomically; returns its path. NaN and
    infinities become null; numpy values and paths become plain JSON."""
    path = Path(output_dir) / RESULTS_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_jsonable(results), f, indent=2, ensure_ascii=False, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_tables(output_dir: str | os.PathLike[str], tables: Mapping[str, pd.DataFrame]
                 ) -> list[Path]:
    """Write each table as `<name>.md` and `<name>.csv` into `output_dir`; returns the paths.
    Evidence tables (with a title in `attrs`) use `residency.tables` formatting."""
    from residency import tables as tb

    paths = []
    for name, table in tables.items():
        if any(n is not None for n in table.index.names):
            table = table.reset_index()
        md = Path(output_dir) / f"{name}.md"
        csv = Path(output_dir) / f"{name}.csv"
        if "title" in table.attrs:
            md.write_text(tb.to_markdown(table), encoding="utf-8")
            csv.write_text(tb.to_csv(table), encoding="utf-8")
        else:
            md.write_text(markdown_table(table), encoding="utf-8")
            csv.write_text(table.to_csv(index=False, lineterminator="\n"), encoding="utf-8")
        paths += [md, csv]
    return paths


def markdown_table(df: pd.DataFrame) -> str:
    """`df` as a Markdown table with every cell in full (a named index becomes columns)."""
    if any(n is not None for n in df.index.names):
        df = df.reset_index()

    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return str(v).replace("|", "\\|").replace("\n", " ")

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def save_figure(fig: Figure, output_dir: str | os.PathLike[str], name: str) -> Path:
    """Save `fig` as `<name>.png` (120 dpi) into `output_dir`; returns the path."""
    path = Path(output_dir) / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


# ----------------------------------------------------------------------------- the run
def open_source(source: str | os.PathLike[str], *, output_dir: str | os.PathLike[str],
                design: str, device: str = "auto", ranks: int = 2, steps: int = 50,
                seed: int = 2101, scale: float = 1.0, pairs: int = 1, requests: int = 1,
                resident_mib: float = 1024) -> Run:
    """The run to analyse: the recorded run directory `source`, or with `source="run"` a new
    run of `design` recorded into `output_dir/run` by `residency.experiments.run_pair`
    (services start as subprocesses)."""
    if str(source) != "run":
        return load_run(source)
    from residency.experiments import run_pair

    with warnings.catch_warnings():  # tqdm.auto in a kernel without ipywidgets: text bars
        warnings.filterwarnings("ignore", message=".*IProgress not found.*")
        path = run_pair(design, out=Path(output_dir) / "run", device=device, ranks=ranks,
                        steps=steps, seed=seed, pairs=pairs, requests=requests, scale=scale,
                        resident_mib=resident_mib, progress=True)
    return load_run(path)


def device_label(device_kind: str) -> str:
    """How figures and tables name a device kind (emulated runs say they are not NPU
    measurements)."""
    return devices.label(device_kind)


def describe_run(run: Run) -> str:
    """A Markdown paragraph: which run is analysed, on what device kind, with which
    parameters and runs."""
    m = run.manifest
    params = ", ".join(f"{k}={v}" for k, v in (m.get("params") or {}).items() if v is not None)
    order = ", ".join(f"{r.name}{' (profiled)' if r.profiled else ''}" for r in run.runs)
    text = (f"**Run** `{run.path}`: design `{run.design}`, device kind **{run.device_kind}** "
            f"({device_label(run.device_kind)}), {m.get('service', '?')} service; parameters "
            f"{params}; measured runs in order: {order}. Recorded {m.get('started_at')} to "
            f"{m.get('ended_at')} on host `{m.get('host')}`.")
    if run.device_kind == "emulated-npu":
        text += (" The emulated NPU keeps real host buffers and does its own accounting: its "
                 "durations describe this host, never an NPU.")
    return text


def statistical_note(text: str, *, what: str | None = None) -> str:
    """`text` as the Markdown line a notebook prints under an attribution (`what`)."""
    return f"**Statistical note{f' ({what})' if what else ''}.** {text}"


def finish(output_dir: str | os.PathLike[str], results: Mapping[str, Any]) -> Path:
    """Write `results.json` (with `files`: what `output_dir` holds besides it) and announce
    where everything went; returns the results path."""
    out = Path(output_dir)
    files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [f for f in files if f != RESULTS_FILE]
    path = write_results(out, {**results, "output_dir": str(out.resolve()), "files": files,
                               "written_at": datetime.now(timezone.utc).isoformat(
                                   timespec="seconds")})
    tables = sum(f.endswith(".md") for f in files)
    figures = sum(f.endswith(".png") for f in files)
    _announce(f"done: results.json, {tables} table(s) (.md/.csv) and {figures} figure(s) "
              f"(.png) in {out.resolve()}")
    return path


# ----------------------------------------------------------------------------- API reproduction
def _run_probe(spec: str, *, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "residency.cli", "probe", "--device", spec, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`residency probe --device {spec}` did not finish within "
                           f"{timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"`residency probe --device {spec}` exited with code "
                           f"{proc.returncode}: {tail}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"`residency probe --device {spec}` printed no JSON ({exc})"
                           ) from None


def probe(device: str = "auto", *, timeout_s: float = 300) -> dict[str, dict[str, Any]]:
    """The API reproduction on `device`, run as `residency probe --device D --json` in a
    subprocess (the emulated NPU's backend registration is process-global); with "auto",
    the resolved device kind and `cpu` for comparison. Returns device kind -> probe JSON,
    the requested device first.

    Raises:
        ParameterError: `device` is not one of `DEVICE_SPECS`.
        RuntimeError: the probe process failed, with its last error line.
    """
    _check_device(device)
    first = _run_probe(device, timeout_s=timeout_s)
    out = {str(first["device_kind"]): first}
    if device == "auto" and "cpu" not in out:
        out["cpu"] = _run_probe("cpu", timeout_s=timeout_s)
    return out


_UNAVAILABLE = re.compile(r"^\w+ telemetry unavailable: (?P<type>[\w.]+): (?P<msg>.*)$", re.S)


def _recorded_outcome(decisions: pd.DataFrame, field_name: str) -> dict[str, Any]:
    normal = decisions[decisions["kind"] == "normal"]
    if normal.empty:
        return {"ok": None, "error_type": None, "error": "no normal call recorded"}
    failed = normal[normal["reason"] == "telemetry-unavailable"]
    if not failed.empty:
        text = str(failed.iloc[0]["error"])
        m = _UNAVAILABLE.match(text)
        return {"ok": False, "error_type": m["type"] if m else None,
                "error": m["msg"] if m else text}
    row = normal.iloc[0]
    value = row[field_name]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {"ok": None, "error_type": None, "error": "no snapshot recorded"}
    return {"ok": True, "value": int(value)}


def api_from_run(run: Run) -> dict[str, Any]:
    """The API reproduction as recorded in a run's decisions: the baseline arm reads the
    generic `torch.accelerator` telemetry; on npu and emulated-npu the candidate reads the
    registered device module (on other kinds the registered path is not observed). One
    snapshot reads allocated and reserved together, so both carry the same failure.
    Returns a probe-shaped dict (`generic`, `registered`, `bug_present`, `verdict`, ...)."""
    dec = {a: pd.concat([run.decisions(e) for e in run.arm(a)] or [pd.DataFrame(
        columns=["kind"])]) for a in ARMS}
    generic = {q: _recorded_outcome(dec["baseline"], q) for q in ("allocated", "reserved")}
    if run.device_kind in ("npu", "emulated-npu"):
        registered = {q: _recorded_outcome(dec["candidate"], q)
                      for q in ("allocated", "reserved")}
    else:
        registered = {q: {"ok": None, "error_type": None,
                          "error": f"not observed: on {run.device_kind} both arms read the "
                          "generic telemetry"} for q in ("allocated", "reserved")}
    g_ok = [v["ok"] for v in generic.values()]
    r_ok = [v["ok"] for v in registered.values()]
    if None in g_ok or None in r_ok:
        bug: bool | None = None
        verdict = "undetermined from this run: a query path was not observed"
    else:
        bug = (not all(g_ok)) and all(r_ok)
        verdict = ("bug present: the generic torch.accelerator query failed where the "
                   "registered device module answered" if bug else
                   "bug absent: " + ("both query paths answered" if all(g_ok) else
                                     "the registered device module did not answer either"))
    v = run.manifest.get("versions") or {}
    return {"device_kind": run.device_kind, "device": None, "python": v.get("python"),
            "torch": v.get("torch"), "torch_npu": v.get("torch_npu"), "generic": generic,
            "registered": registered, "mem_get_info": None, "arms": None, "bug_present": bug,
            "verdict": verdict, "recorded": True, "run_dir": str(run.path)}


def api_reproduction(source: str, device: str = "auto") -> dict[str, dict[str, Any]]:
    """Device kind -> probe-shaped dict: a live `probe(device)` when `source` is "run",
    else what the recorded run directory `source` shows (`api_from_run`)."""
    if str(source) == "run":
        return probe(device)
    run = load_run(source)
    return {run.device_kind: api_from_run(run)}


def _outcome_text(out: Mapping[str, Any] | None) -> tuple[str, str]:
    if out is None:
        return "not observed", ""
    if out.get("ok") is True:
        return "ok", str(out["value"])
    if out.get("ok") is None:
        return "not observed", str(out.get("error") or "")
    return "error", f"{out.get('error_type')}: {out.get('error')}"


def probe_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per device kind, query path and query: outcome and value (bytes) or
    exception type and message."""
    rows = []
    paths = (("generic", "torch.accelerator"), ("registered", "torch.get_device_module(d)"))
    for kind, p in probes.items():
        for key, api in paths:
            for query in ("allocated", "reserved"):
                outcome, detail = _outcome_text((p.get(key) or {}).get(query))
                rows.append({"device kind": kind, "path": key,
                             "call": f"{api}.memory_{query}(d)", "outcome": outcome,
                             "value (bytes) or exception": detail})
        if p.get("mem_get_info") is not None:
            outcome, detail = _outcome_text(p["mem_get_info"])
            rows.append({"device kind": kind, "path": "registered",
                         "call": "torch.get_device_module(d).mem_get_info(d)",
                         "outcome": outcome, "value (bytes) or exception": detail})
    return pd.DataFrame(rows)


def arms_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Which telemetry each arm reads on each device kind, and whether a snapshot
    succeeded (what a normal call then does)."""
    rows = []
    for kind, p in probes.items():
        for arm, info in (p.get("arms") or {}).items():
            if info["telemetry"] is None:
                state = "reads none: releases on every call"
            elif info["error"] is None:
                state = f"snapshot ok {info['snapshot']}: bounds decide"
            else:
                state = f"unavailable -> every normal call releases ({info['error']})"
            rows.append({"device kind": kind, "arm": arm,
                         "telemetry": info["telemetry"] or "none", "normal call": state})
    return pd.DataFrame(rows, columns=["device kind", "arm", "telemetry", "normal call"])


def versions_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """python, torch and torch-npu versions per probed device kind."""
    return pd.DataFrame([{"device kind": k, "device": p.get("device"), "python": p.get("python"),
                          "torch": p.get("torch"), "torch-npu": p.get("torch_npu") or "none"}
                         for k, p in probes.items()])


def verdict_markdown(probes: Mapping[str, Mapping[str, Any]]) -> str:
    """One Markdown line per probed device kind: the detected verdict and `bug_present`."""
    lines = []
    for kind, p in probes.items():
        how = ("read from the recorded run's decisions" if p.get("recorded") else
               "detected by calling both query paths now")
        lines.append(f"* **{kind}** ({device_label(kind)}): {p.get('verdict')} "
                     f"(`bug_present` = {p.get('bug_present')}; {how}, never assumed).")
    return "\n".join(lines)


def api_results(probes: Mapping[str, Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """The `results.json` of api_reproduction: `device_kind`, `generic`, `registered`,
    `bug_present` of the first (requested) device kind, `verdict`, versions, the other
    kinds under `comparison`, and `extra`."""
    kind, first = next(iter(probes.items()))
    comparison = {k: {key: p.get(key) for key in ("generic", "registered", "bug_present",
                                                  "verdict")}
                  for k, p in probes.items() if k != kind}
    return {"device_kind": kind, "generic": first.get("generic"),
            "registered": first.get("registered"), "bug_present": first.get("bug_present"),
            "verdict": first.get("verdict"), "mem_get_info": first.get("mem_get_info"),
            "versions": {k: first.get(k) for k in ("python", "torch", "torch_npu")},
            "recorded": bool(first.get("recorded")), "comparison": comparison, **extra}


# ----------------------------------------------------------------------------- decisions
def _arm_decisions(run: Run, arm: str) -> pd.DataFrame:
    frames = [run.decisions(e).assign(run=e.name) for e in run.arm(arm)]
    if not frames:
        from residency.rundir import DECISION_COLUMNS

        return pd.DataFrame(columns=[*DECISION_COLUMNS, "run"])
    return pd.concat(frames, ignore_index=True)


def _requests(run: Run, entry: RunEntry) -> list[dict[str, Any]]:
    """The measured requests of one run entry, in order: request_id and service response."""
    client = run.client(entry)
    if client.get("requests"):
        return [{"request_id": r.get("request_id"), "response": r.get("response") or {}}
                for r in client["requests"]]
    return [{"request_id": client.get("request_id"), "response": client.get("response") or {}}]


def _oom_by_rank(response: Mapping[str, Any]) -> dict[int, int]:
    return {int(pr["rank"]): int(pr["oom"]) for pr in response.get("per_rank") or []
            if "rank" in pr and pr.get("oom") is not None}


def consecutive_table(run: Run, *, arm: str = "candidate") -> pd.DataFrame:
    """Per rank x per measured request of `arm`: normal checks (retained / released),
    forced releases (released), telemetry errors and OOMs (None when the service did not
    report them). Warm-up requests excluded."""
    rows = []
    for entry in run.arm(arm):
        dec = run.decisions(entry)
        for number, req in enumerate(_requests(run, entry), 1):
            mine = dec[dec["request_id"] == req["request_id"]]
            oom = _oom_by_rank(req["response"])
            ranks = sorted(set(mine["rank"].astype(int)) | set(oom))
            for rank in ranks:
                d = mine[mine["rank"] == rank]
                normal, forced = d[d["kind"] == "normal"], d[d["kind"] == "forced"]
                rows.append({
                    "run": entry.name, "request": number, "request_id": req["request_id"],
                    "rank": rank, "normal_checks": len(normal),
                    "normal_retained": int((normal["outcome"] == "retained").sum()),
                    "normal_released": int((normal["outcome"] == "released").sum()),
                    "forced": len(forced),
                    "forced_released": int((forced["outcome"] == "released").sum()),
                    "telemetry_errors": int((d["reason"] == "telemetry-unavailable").sum()),
                    "oom": oom.get(rank)})
    cols = ["run", "request", "request_id", "rank", "normal_checks", "normal_retained",
            "normal_released", "forced", "forced_released", "telemetry_errors", "oom"]
    df = pd.DataFrame(rows, columns=cols).sort_values(["run", "rank", "request"],
                                                       ignore_index=True)
    df["oom"] = df["oom"].astype(object)
    df.attrs.update(device_kind=run.device_kind, arm=arm)
    return df


def consecutive_summary(run: Run, table: pd.DataFrame | None = None, **extra: Any
                        ) -> dict[str, Any]:
    """The `results.json` of consecutive_requests: `device_kind`, `ranks`, `requests`,
    `normal_total`, `normal_retained`, `forced_total`, `forced_released`,
    `telemetry_errors`, `oom` (None when not reported), plus `extra`."""
    t = consecutive_table(run) if table is None else table
    ooms = t["oom"].tolist()
    return {"device_kind": run.device_kind, "ranks": int(t["rank"].nunique()),
            "requests": int(t[["run", "request"]].drop_duplicates().shape[0]),
            "normal_total": int(t["normal_checks"].sum()),
            "normal_retained": int(t["normal_retained"].sum()),
            "forced_total": int(t["forced"].sum()),
            "forced_released": int(t["forced_released"].sum()),
            "telemetry_errors": int(t["telemetry_errors"].sum()),
            "oom": None if not ooms or any(o is None for o in ooms) else int(sum(ooms)),
            **extra}


def consecutive_notes(summary: Mapping[str, Any]) -> dict[str, str]:
    """What the counts of `consecutive_summary` support (Clopper-Pearson 95 % intervals):
    `normal_retained` and `forced_released`."""
    out = {}
    for key, total in (("normal_retained", "normal_total"), ("forced_released", "forced_total")):
        n = int(summary[total])
        out[key] = (stats.proportion(int(summary[key]), n).note if n else
                    "No calls of this kind recorded: nothing to estimate.")
    return out


def _snapshot(row: Mapping[str, Any]) -> dict[str, int] | None:
    values = {}
    for k in ("reserved", "allocated", "free", "total"):
        v = row.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        values[k] = int(v)
    return values


def _replay_mismatches(run: Run) -> list[str]:
    from residency.policy import replay  # no torch at import

    bad = []
    checked = 0
    for entry in run.runs:
        for row in run.decisions(entry).to_dict(orient="records"):
            snap = _snapshot(row)
            if row.get("kind") != "normal" or snap is None:
                continue
            record = {**row, "snapshot": snap}
            try:
                r = replay(record)
            except (ValueError, TypeError, KeyError) as exc:
                bad.append(f"{entry.name} rank {row.get('rank')} {row.get('request_id')}: "
                           f"cannot be re-evaluated ({exc})")
                continue
            if r["expected_outcome"] is None:
                continue
            checked += 1
            if (r["expected_outcome"], r["expected_reason"]) != (row["outcome"], row["reason"]):
                bad.append(f"{entry.name} rank {row.get('rank')} {row.get('request_id')}: "
                           f"recorded {row['outcome']} ({row['reason']}), re-evaluated on its "
                           f"snapshot {r['expected_outcome']} ({r['expected_reason']})")
    return bad


def gate_failures(run: Run, *, arm: str = "candidate") -> list[str]:
    """One sentence per failed gate (empty when all pass): `arm` has no normal decision,
    any telemetry error or OOM with `arm`, or any recorded normal decision (any arm) that
    disagrees with `residency.policy.replay` on its recorded snapshot."""
    failures = []
    dec = _arm_decisions(run, arm)
    if dec[dec["kind"] == "normal"].empty:
        failures.append(f"The {arm} arm recorded no normal policy decision, so nothing was "
                        "checked.")
    errors = dec[dec["reason"] == "telemetry-unavailable"]
    if not errors.empty:
        failures.append(f"The {arm} arm had {len(errors)} telemetry error(s) (first: "
                        f"{errors.iloc[0]['error']}).")
    ooms = sum(v for e in run.arm(arm) for req in _requests(run, e)
               for v in _oom_by_rank(req["response"]).values())
    if ooms:
        failures.append(f"The {arm} arm reported {ooms} out-of-memory error(s).")
    mismatches = _replay_mismatches(run)
    if mismatches:
        more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
        failures.append(f"{len(mismatches)} recorded decision(s) disagree with the policy "
                        f"re-evaluated on their snapshots: {'; '.join(mismatches[:3])}{more}.")
    return failures


def check_gates(failures: Sequence[str]) -> None:
    """Raise `GateError` listing `failures` when there are any; print that all passed
    otherwise."""
    if failures:
        raise GateError(failures)
    print("All gates passed: no telemetry error or OOM with the candidate, and every recorded "
          "normal decision matches the policy re-evaluated on its snapshot.")


def fractions(run: Run, *, arm: str = "candidate") -> pd.DataFrame:
    """Per normal decision of `arm` with a snapshot: cached fraction
    (max(0, reserved - allocated) / total), free fraction (free / total), outcome, reason,
    its bounds, rank and measured request number."""
    rows = []
    for entry in run.arm(arm):
        order = {r["request_id"]: i for i, r in enumerate(_requests(run, entry), 1)}
        dec = run.decisions(entry)
        for row in dec[dec["kind"] == "normal"].sort_values("start_ns").to_dict("records"):
            snap = _snapshot(row)
            if snap is None or snap["total"] <= 0:
                continue
            rows.append({"run": entry.name, "rank": int(row["rank"]),
                         "request": order.get(row["request_id"]),
                         "request_id": row["request_id"],
                         "cached_fraction": max(0, snap["reserved"] - snap["allocated"])
                         / snap["total"],
                         "free_fraction": snap["free"] / snap["total"],
                         "outcome": row["outcome"], "reason": row["reason"],
                         "max_cached_fraction": float(row["max_cached_fraction"]),
                         "min_free_fraction": float(row["min_free_fraction"])})
    cols = ["run", "rank", "request", "request_id", "cached_fraction", "free_fraction",
            "outcome", "reason", "max_cached_fraction", "min_free_fraction"]
    df = pd.DataFrame(rows, columns=cols)
    df.attrs.update(device_kind=run.device_kind, arm=arm)
    return df


# ----------------------------------------------------------------------------- paired profile
@dataclass(frozen=True)
class PairedProfile:
    """The attributions of a paired-profile run, each with the statistics result whose
    `note` says what it supports. Durations per rank in ms; E2E in s; idle in ns."""

    device_kind: str
    run_dir: Path
    pair: tuple[str, str] | None  # run names of the profiled (reference) pair
    normal_call_ms: dict[str, dict[int, float]]  # arm -> rank -> summed normal-call ms
    normal_calls: dict[str, dict[str, int]]  # arm -> {"total", "released"} over all runs
    forced_calls: dict[str, dict[str, int]]  # arm -> {"total", "released"} over all runs
    idle: dict[str, dict[str, int]] | None  # arm -> idle figures (ns) of the profiled pair
    idle_error: str | None
    prepare_s: dict[str, float | None]
    prepare_source: str
    e2e_s: dict[str, dict[str, list[float]]]  # "profiled"/"unprofiled" -> arm -> E2E s
    results: dict[str, Any] = field(repr=False)  # attribution -> stats result

    @property
    def notes(self) -> dict[str, str]:
        """Attribution -> the statistical note of its result."""
        return {k: _note_of(v) for k, v in self.results.items()}

    def note(self, attribution: str) -> str:
        """The Markdown statistical note of one attribution (or why there is none)."""
        text = self.notes.get(attribution)
        return statistical_note(text or "No data for this attribution in this run: nothing "
                                "to test.", what=ATTRIBUTIONS.get(attribution, attribution))


def _note_of(result: Any) -> str:
    if isinstance(result, Mapping):  # one Proportion per arm
        return " ".join(f"{arm}: {r.note}" for arm, r in result.items())
    return str(result.note)


def _normal_ms_by_rank(run: Run, entry: RunEntry) -> dict[int, float]:
    dec = run.decisions(entry)
    normal = dec[dec["kind"] == "normal"]
    if not normal.empty:
        return {int(r): float(v) / 1e6
                for r, v in normal.groupby("rank")["duration_ns"].sum().items()}
    out = {}
    for pr in (run.client(entry).get("response") or {}).get("per_rank") or []:
        n = pr.get("normal") or {}
        if n.get("count"):
            d = n["duration_ns"]
            out[int(pr["rank"])] = float(sum(d) if isinstance(d, list) else d) / 1e6
    return out


def _counts(dec: pd.DataFrame, kind: str) -> dict[str, int]:
    calls = dec[dec["kind"] == kind]
    return {"total": len(calls), "released": int((calls["outcome"] == "released").sum())}


def _e2e(run: Run, entry: RunEntry) -> float | None:
    return entry.e2e_s if entry.e2e_s is not None else run.client(entry).get("e2e_s")


def paired_profile(run: Run) -> PairedProfile:
    """Every attribution of the paired-profile notebook from a loaded run: per-rank
    normal-call durations of the profiled pair, released counts of normal and forced calls
    over all runs, idle figures and preparation window of the profiled pair (from traces
    when present), and client E2E of the profiled and of the unprofiled pairs (never pooled).
    """
    from residency import tables as tb

    pair = tb._reference_pair(run)
    normal_ms = {a: (_normal_ms_by_rank(run, e) if pair else {})
                 for a, e in zip(ARMS, pair or (None, None), strict=True)}
    dec = {a: _arm_decisions(run, a) for a in ARMS}
    normal = {a: _counts(dec[a], "normal") for a in ARMS}
    forced = {a: _counts(dec[a], "forced") for a in ARMS}
    idle, idle_error = tb.idle_from_traces(run)
    prep: dict[str, float | None] = {a: None for a in ARMS}
    prep_source = "none recorded"
    if idle is not None:
        prep = {a: idle[a]["prepare_ns"] / 1e9 for a in ARMS}
        prep_source = "trace window marker residency.phase[prepare]"
    elif pair is not None:
        raw = {a: tb._max_prepare_ns(run, e) for a, e in zip(ARMS, pair, strict=True)}
        if None not in raw.values():
            prep = {a: v / 1e9 for a, v in raw.items()}
            prep_source = "service response, max over ranks of per_rank prepare_ns"
    e2e: dict[str, dict[str, list[float]]] = {}
    for profiled, key in ((True, "profiled"), (False, "unprofiled")):
        lists = {a: [_e2e(run, r) for r in run.arm(a) if r.profiled == profiled] for a in ARMS}
        n = min(len(v) for v in lists.values())  # pair i: the i-th run of each arm
        e2e[key] = {a: [float(x) for x in v[:n] if x is not None] for a, v in lists.items()}

    results: dict[str, Any] = {}
    b, c = list(normal_ms["baseline"].values()), list(normal_ms["candidate"].values())
    if b and c:
        results["normal_call_duration"] = stats.compare_groups(b, c, unit="ms")
    for key, counts in (("normal_released", normal), ("forced_released", forced)):
        if all(counts[a]["total"] for a in ARMS):
            results[key] = {a: stats.proportion(counts[a]["released"], counts[a]["total"])
                            for a in ARMS}
    if idle is not None:
        results["idle_intersection"] = stats.single(
            idle["baseline"]["marker_idle_intersection_ns"] / 1e6,
            idle["candidate"]["marker_idle_intersection_ns"] / 1e6, unit="ms")
        results["all_rank_idle"] = stats.single(idle["baseline"]["all_rank_idle_ns"] / 1e9,
                                                idle["candidate"]["all_rank_idle_ns"] / 1e9,
                                                unit="s")
    if None not in prep.values():
        results["preparation_window"] = stats.single(prep["baseline"], prep["candidate"],
                                                     unit="s")
    for key in ("profiled", "unprofiled"):
        lists = e2e[key]
        if lists["baseline"] and len(lists["baseline"]) == len(lists["candidate"]):
            results[f"e2e_{key}"] = stats.compare_pairs(lists["baseline"], lists["candidate"],
                                                        unit="s")
    return PairedProfile(
        device_kind=run.device_kind, run_dir=run.path,
        pair=(pair[0].name, pair[1].name) if pair else None, normal_call_ms=normal_ms,
        normal_calls=normal, forced_calls=forced, idle=idle, idle_error=idle_error,
        prepare_s=prep, prepare_source=prep_source, e2e_s=e2e, results=results)


def normal_call_frame(pp: PairedProfile) -> pd.DataFrame:
    """Rank x arm table of normal-call durations (ms, summed per rank) of the profiled pair."""
    ranks = sorted(set(pp.normal_call_ms["baseline"]) | set(pp.normal_call_ms["candidate"]))
    rows = [{"rank": r, **{f"{a} (ms)": pp.normal_call_ms[a].get(r) for a in ARMS}}
            for r in ranks]
    df = pd.DataFrame(rows, columns=["rank", "baseline (ms)", "candidate (ms)"])
    with np.errstate(divide="ignore", invalid="ignore"):
        df["baseline / candidate"] = (df["baseline (ms)"].astype(float)
                                      / df["candidate (ms)"].astype(float)).round(2)
    return df.set_index("rank")


def releases_frame(pp: PairedProfile) -> pd.DataFrame:
    """Per arm: normal calls released of total and forced calls released of total, over all
    measured runs (warm-ups excluded)."""
    return pd.DataFrame([{"arm": a,
                          "normal calls released": f"{pp.normal_calls[a]['released']}/"
                          f"{pp.normal_calls[a]['total']}",
                          "forced calls released": f"{pp.forced_calls[a]['released']}/"
                          f"{pp.forced_calls[a]['total']}"} for a in ARMS]).set_index("arm")


def idle_frame(pp: PairedProfile) -> pd.DataFrame:
    """Per arm (profiled pair): normal-release markers ∩ all-rank idle (ms), all-rank idle
    (s), preparation window (s); empty values where no traces were recorded."""
    rows = []
    for a in ARMS:
        i = (pp.idle or {}).get(a) or {}
        inter, allr = i.get("marker_idle_intersection_ns"), i.get("all_rank_idle_ns")
        rows.append({"arm": a,
                     "normal-release markers ∩ all-rank idle (ms)":
                         None if inter is None else inter / 1e6,
                     "all-rank idle (s)": None if allr is None else allr / 1e9,
                     "preparation window (s)": pp.prepare_s[a]})
    return pd.DataFrame(rows).set_index("arm")


def e2e_frame(pp: PairedProfile) -> pd.DataFrame:
    """One row per pair: design (profiled / unprofiled), pair number, E2E of each arm (s)
    and the delta candidate - baseline (s)."""
    rows = []
    for key in ("profiled", "unprofiled"):
        lists = pp.e2e_s[key]
        for i, (b, c) in enumerate(zip(lists["baseline"], lists["candidate"], strict=False), 1):
            rows.append({"pairs": key, "pair": i, "baseline (s)": b, "candidate (s)": c,
                         "delta (s)": c - b})
    return pd.DataFrame(rows, columns=["pairs", "pair", "baseline (s)", "candidate (s)",
                                       "delta (s)"]).set_index(["pairs", "pair"])


def paired_results(pp: PairedProfile, **extra: Any) -> dict[str, Any]:
    """The `results.json` of paired_profile: `device_kind`, `normal_call_ms` (per-rank lists
    by rank), `idle_intersection_ms`, `e2e_s` (the unprofiled pairs when there are any, else
    the profiled pair; `e2e_s_source` says which), `notes`, plus counts, the other idle
    figures, both E2E lists and `extra`."""
    idle = pp.idle or {}
    source = "unprofiled" if pp.e2e_s["unprofiled"]["baseline"] else "profiled"

    def idle_of(key: str, scale: float) -> dict[str, float | None]:
        return {a: None if key not in idle.get(a, {}) else idle[a][key] / scale for a in ARMS}

    return {
        "device_kind": pp.device_kind,
        "normal_call_ms": {a: [pp.normal_call_ms[a][r] for r in sorted(pp.normal_call_ms[a])]
                           for a in ARMS},
        "idle_intersection_ms": idle_of("marker_idle_intersection_ns", 1e6),
        "e2e_s": pp.e2e_s[source],
        "notes": pp.notes,
        "e2e_s_source": f"{source} pairs",
        "e2e_s_profiled": pp.e2e_s["profiled"],
        "e2e_s_unprofiled": pp.e2e_s["unprofiled"],
        "normal_calls": pp.normal_calls, "forced_calls": pp.forced_calls,
        "all_rank_idle_s": idle_of("all_rank_idle_ns", 1e9),
        "preparation_window_s": pp.prepare_s, "preparation_window_source": pp.prepare_source,
        "idle_error": pp.idle_error, "profiled_pair": list(pp.pair) if pp.pair else None,
        "run_dir": str(pp.run_dir), **extra}


def evidence_tables(run: Run, pp: PairedProfile) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's evidence table (with the profiled pair's idle figures) and the published
    NPU figures, in the same columns."""
    from residency import tables as tb

    return (tb.evidence_table(run, idle=pp.idle, idle_error=pp.idle_error),
            tb.published_table())


# ----------------------------------------------------------------------------- figures
def _title(what: str, device_kind: str, n: str) -> str:
    return f"{what}\n{device_kind} ({device_label(device_kind)}); {n}"


def _figure(ncols: int, *, width: float = 11.0, height: float = 4.2) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False,
                             layout="constrained")
    plt.close(fig)  # shown by display(fig), never twice by the inline backend
    return fig, axes[0]


def plot_fractions(frame: pd.DataFrame) -> Figure:
    """Cached and free fractions of each normal check against their bounds (retain while
    cached <= 0.25 and free >= 0.05 of total), by measured request and rank."""
    kind = frame.attrs.get("device_kind", "?")
    fig, (ax_c, ax_f) = _figure(2)
    ranks = sorted(frame["rank"].unique())
    width = 0.6 / max(1, len(ranks))
    for i, rank in enumerate(ranks):
        d = frame[frame["rank"] == rank]
        x = d["request"].astype(float) - 0.3 + (i + 0.5) * width
        for outcome, marker in (("retained", "o"), ("released", "x")):
            m = d["outcome"] == outcome
            if m.any():
                label = f"rank {rank}, {outcome}"
                ax_c.scatter(x[m], d["cached_fraction"][m], marker=marker, label=label)
                ax_f.scatter(x[m], d["free_fraction"][m], marker=marker, label=label)
    cached = float(frame["max_cached_fraction"].iloc[0]) if len(frame) else MAX_CACHED_FRACTION
    free = float(frame["min_free_fraction"].iloc[0]) if len(frame) else MIN_FREE_FRACTION
    ax_c.axhline(cached, color="red", ls="--", label=f"bound: retain while <= {cached:g}")
    ax_f.axhline(free, color="red", ls="--", label=f"bound: retain while >= {free:g}")
    for ax, what in ((ax_c, "cached / total (reserved - allocated)"),
                     (ax_f, "free / total")):
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("measured request (in order)")
        ax.set_ylabel(f"{what}, fraction of capacity")
        requests = sorted(frame["request"].dropna().unique())
        ax.set_xticks(requests)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    ax_c.set_title("cached-but-unallocated")
    ax_f.set_title("physically free")
    n = f"n = {len(frame)} normal checks, {len(ranks)} ranks"
    fig.suptitle(_title("Memory state at each normal check vs the two bounds", kind, n))
    return fig


def plot_normal_calls(pp: PairedProfile) -> Figure:
    """Per-rank normal-call duration (ms, log scale) of both arms of the profiled pair."""
    fig, (ax,) = _figure(1, width=9.0)
    ranks = sorted(set(pp.normal_call_ms["baseline"]) | set(pp.normal_call_ms["candidate"]))
    x = np.arange(len(ranks))
    for i, a in enumerate(ARMS):
        vals = [pp.normal_call_ms[a].get(r, np.nan) for r in ranks]
        bars = ax.bar(x + (i - 0.5) * 0.4, vals, width=0.4, label=a)
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(x, [f"rank {r}" for r in ranks])
    ax.set_ylabel("normal-call duration per rank (ms, log scale)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    nb, nc = (len(pp.normal_call_ms[a]) for a in ARMS)
    pair = f"profiled pair {pp.pair[0]} / {pp.pair[1]}" if pp.pair else "no pair"
    ax.set_title(_title("Normal policy calls: time per rank", pp.device_kind,
                        f"n = {nb} vs {nc} ranks, {pair}"))
    return fig


def plot_idle(pp: PairedProfile) -> Figure:
    """Per arm: normal-release markers ∩ all-rank idle (ms), all-rank idle (s) and the
    preparation window (s) of the profiled pair, one panel per unit."""
    fig, axes = _figure(3, width=12.0)
    frame = idle_frame(pp)
    for ax, col in zip(axes, frame.columns, strict=True):
        vals = frame[col].astype(float).tolist()
        bars = ax.bar(list(ARMS), vals, color=["tab:blue", "tab:orange"])
        ax.bar_label(bars, fmt="%.4g", fontsize=8)
        ax.set_title(col, fontsize=10)
        ax.set_ylabel(col.rsplit("(", 1)[-1].rstrip(")"))
        ax.grid(axis="y", alpha=0.3)
        if all(math.isnan(v) for v in vals):
            ax.text(0.5, 0.5, "no traces recorded", ha="center", transform=ax.transAxes)
    fig.suptitle(_title("Idle attribution of the profiled pair", pp.device_kind,
                        "n = 1 profiled run per arm (single observations)"))
    return fig


def plot_e2e(pp: PairedProfile) -> Figure:
    """Client E2E (s) of each pair, baseline to candidate, profiled and unprofiled pairs in
    separate panels (never pooled)."""
    fig, axes = _figure(2)
    for ax, key in zip(axes, ("profiled", "unprofiled"), strict=True):
        lists = pp.e2e_s[key]
        for i, (b, c) in enumerate(zip(lists["baseline"], lists["candidate"], strict=False), 1):
            ax.plot([0, 1], [b, c], marker="o", label=f"pair {i}")
        ax.set_xticks([0, 1], list(ARMS))
        ax.set_xlim(-0.3, 1.3)
        ax.set_ylabel("client E2E (s)")
        n = len(lists["baseline"])
        ax.set_title(f"{key} pairs (n = {n})", fontsize=10)
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "none in this run", ha="center", transform=ax.transAxes)
    n_all = sum(len(pp.e2e_s[k]["baseline"]) for k in pp.e2e_s)
    fig.suptitle(_title("Client end-to-end time per pair", pp.device_kind,
                        f"n = {n_all} pairs in all"))
    return fig
