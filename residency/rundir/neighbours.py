"""Who else was on the devices while a run measured: the processes each device kind's own tool
lists at the start and end of every measured service run, each marked as ours (this process
and the service's process tree: its rank processes) or foreign, and the host processes that
used the most CPU meanwhile (beside `residency.rundir.hostload`, which records how loaded the
host was; this module says by whom).

Hand-made harnesses for vLLM-Omni reject a sample when a foreign process appears on the GPU;
here `seen(record)` says whether to warn and `describe(record)` words it, and `exclusive`
refuses to measure (`residency pair|serve --require-exclusive`).

Listers are registered per device kind (`register`, `LISTERS`), one function each:

* `cuda`: NVML (`pynvml`, from the `nvidia-ml-py` package) when importable, else
  `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits`;
* `npu`: the process table of `npu-smi info` (`| NPU Chip | Process id | Process name |
  Process memory(MB) |` rows, or `No running processes found in NPU <n>`);
* `emulated-npu`: none: host memory stands in for the device, so no process can hold it.

`RESIDENCY_DEVICE_PROCESSES=FILE` (or the `lister` argument) replaces the kind's lister with a
stand-in that reads FILE at every sample, in the nvidia-smi CSV form above (`pid, name,
used MiB[, device]`, `#` comments): tests start a process and list it there. No torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STANDIN_ENV = "RESIDENCY_DEVICE_PROCESSES"
"""Path of a stand-in listing (nvidia-smi CSV form), read instead of the device's own tool."""
TOOL_TIMEOUT_S = 20.0
HOST_TOP = 5
"""How many of the host's other processes (most CPU used during the service run) to keep."""
_PROC = "/proc"

__all__ = ["HOST_TOP", "LISTERS", "STANDIN_ENV", "DeviceProcess", "Listing", "NotExclusive",
           "check", "describe", "exclusive", "foreign", "host_cpu", "lister_for", "own_pids",
           "parse_npu_smi", "parse_smi_csv", "record", "register", "sample", "seen",
           "summarize"]


@dataclass(frozen=True)
class DeviceProcess:
    """One process holding a device: its host pid, name, device (as the tool names it; None
    when it does not say) and device memory in MiB (None when not reported)."""

    pid: int
    name: str
    device: str | None = None
    used_mib: float | None = None


@dataclass(frozen=True)
class Listing:
    """What a lister saw: the processes, which tool (`source`), `error` when the tool could
    not be asked (then `processes` is empty and nothing is known), and `applies` False for
    a kind that has no device processes (the emulated NPU)."""

    processes: tuple[DeviceProcess, ...] = ()
    source: str = ""
    error: str | None = None
    applies: bool = True


Lister = Callable[[], Listing]
LISTERS: dict[str, Lister] = {}


class NotExclusive(RuntimeError):
    """A foreign process holds a device (or the devices' processes cannot be listed) while
    exclusivity was required."""


def register(kind: str) -> Callable[[Lister], Lister]:
    """Register `fn() -> Listing` as the device-process lister of `kind`."""
    def add(fn: Lister) -> Lister:
        LISTERS[kind] = fn
        return fn
    return add


# ----------------------------------------------------------------------------- parsers
def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi_csv(text: str) -> tuple[DeviceProcess, ...]:
    """Rows `pid, name, used MiB[, device]` (nvidia-smi's `--format=csv,noheader,nounits`;
    `[N/A]` memory is None); blank lines and `#` comments skipped.

    Raises:
        ValueError: a row without an integer pid, naming the row.
    """
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            pid = int(cells[0])
        except ValueError:
            raise ValueError(f"device process row {line.strip()!r}: the pid is not an "
                             "integer") from None
        out.append(DeviceProcess(pid=pid, name=cells[1] if len(cells) > 1 else "",
                                 used_mib=_number(cells[2]) if len(cells) > 2 else None,
                                 device=cells[3] or None if len(cells) > 3 else None))
    return tuple(out)


_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|(.*?)\|\s*(\d+)\s*\|"
                      r"(?:\s*(\d+)\s*\|)?")


def parse_npu_smi(text: str) -> tuple[DeviceProcess, ...]:
    """The processes of `npu-smi info`'s process table: rows `| NPU Chip | Process id |
    Process name | Process memory(MB) |` (names may be empty; in a container a trailing
    `Process id in container` column holds the pid as this namespace sees it, used instead
    of the host's); `No running processes found in NPU <n>` rows hold none. The device is
    `<npu>:<chip>`."""
    out, in_table = [], False
    for line in text.splitlines():
        if "Process id" in line and "Process memory" in line:
            in_table = True
            continue
        if not in_table:
            continue
        m = _NPU_ROW.match(line.strip())
        if m:
            out.append(DeviceProcess(pid=int(m.group(6) or m.group(3)), name=m.group(4).strip(),
                                     device=f"{m.group(1)}:{m.group(2)}",
                                     used_mib=float(m.group(5))))
    return tuple(out)


def _run_tool(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it could not be run)."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found on PATH"
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(argv[:2])} failed: {type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return None, f"{' '.join(argv[:2])} exited {proc.returncode}: {tail[0][:200]}"
    return proc.stdout, None


# ----------------------------------------------------------------------------- listers
def _nvml() -> Listing | None:
    """NVML's compute processes of every GPU; None when pynvml cannot be used here."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver or library: fall back to nvidia-smi
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(p, "usedGpuMemory", None)
                name = ""
                with contextlib.suppress(Exception):
                    raw = pynvml.nvmlSystemGetProcessName(p.pid)
                    name = raw.decode() if isinstance(raw, bytes) else str(raw)
                out.append(DeviceProcess(pid=int(p.pid), name=name, device=str(i),
                                         used_mib=None if not isinstance(used, int)
                                         else used / 2**20))
        return Listing(tuple(out), source="nvml")
    except Exception as exc:  # noqa: BLE001 - any NVML error: say it, as a failed listing
        return Listing(source="nvml", error=f"NVML: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


@register("cuda")
def _cuda() -> Listing:
    found = _nvml()
    if found is not None:
        return found
    text, error = _run_tool(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                             "--format=csv,noheader,nounits"])
    if error is not None:
        return Listing(source="nvidia-smi", error=error)
    try:
        return Listing(parse_smi_csv(text or ""), source="nvidia-smi")
    except ValueError as exc:
        return Listing(source="nvidia-smi", error=str(exc))


@register("npu")
def _npu() -> Listing:
    text, error = _run_tool(["npu-smi", "info"])
    if error is not None:
        return Listing(source="npu-smi info", error=error)
    return Listing(parse_npu_smi(text or ""), source="npu-smi info")


@register("emulated-npu")
def _emulated() -> Listing:
    return Listing(source="none: the emulated NPU is host memory, no device processes",
                   applies=False)


def _standin(path: str) -> Lister:
    def listing() -> Listing:
        try:
            with open(path, encoding="utf-8") as f:
                return Listing(parse_smi_csv(f.read()), source=f"stand-in {path}")
        except (OSError, ValueError) as exc:
            return Listing(source=f"stand-in {path}", error=f"{path}: {exc}")
    return listing


def lister_for(kind: str, *, env: Mapping[str, str] | None = None) -> Lister:
    """The device-process lister of `kind`: the stand-in file named by `STANDIN_ENV` when
    set, else the registered one; a kind without one lists nothing, with the reason."""
    env = os.environ if env is None else env
    if env.get(STANDIN_ENV):
        return _standin(env[STANDIN_ENV])
    if kind in LISTERS:
        return LISTERS[kind]
    return lambda: Listing(source="none", error=f"no device-process lister for kind {kind!r}")


# ----------------------------------------------------------------------------- processes
def _stat(pid: str) -> tuple[int, str, float] | None:
    """(ppid, name, CPU seconds) of a process from /proc/<pid>/stat."""
    try:
        with open(f"{_PROC}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
        name = text[text.index("(") + 1:text.rindex(")")]
        rest = text[text.rindex(")") + 2:].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return int(rest[1]), name, (int(rest[11]) + int(rest[12])) / ticks
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _processes() -> dict[int, tuple[int, str, float]]:
    try:
        pids = [p for p in os.listdir(_PROC) if p.isdigit()]
    except OSError:
        return {}
    out = {}
    for p in pids:
        s = _stat(p)
        if s is not None:
            out[int(p)] = s
    return out


def own_pids(roots: Iterable[int]) -> set[int]:
    """`roots` and all their descendants (from /proc; only `roots` off Linux)."""
    own = {int(r) for r in roots}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in _processes().items():
        children.setdefault(ppid, []).append(pid)
    todo = list(own)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in own:
                own.add(child)
                todo.append(child)
    return own


def host_cpu() -> dict[int, tuple[str, float]]:
    """Every host process now: pid -> (name, CPU seconds used so far); empty off Linux."""
    return {pid: (name, cpu) for pid, (_, name, cpu) in _processes().items()}


# ----------------------------------------------------------------------------- records
def sample(lister: Lister, own: Iterable[int]) -> dict[str, Any]:
    """One look at the devices: `source`, `applies`, `error`, `processes` (each `pid`,
    `name`, `device`, `used_mib`, `own`) and `foreign` (how many are not `own`)."""
    listing = lister()
    mine = set(own)
    procs = [{"pid": p.pid, "name": p.name, "device": p.device, "used_mib": p.used_mib,
              "own": p.pid in mine} for p in listing.processes]
    return {"source": listing.source, "applies": listing.applies, "error": listing.error,
            "processes": procs, "foreign": sum(not p["own"] for p in procs)}


def record(start: Mapping[str, Any], end: Mapping[str, Any], *,
           host_before: Mapping[int, tuple[str, float]] | None = None,
           host_after: Mapping[int, tuple[str, float]] | None = None,
           own: Iterable[int] = ()) -> dict[str, Any]:
    """The manifest entry's `neighbours` of one service run: the device samples at its
    `start` and `end`, and `host_top`, the `HOST_TOP` host processes other than `own` that
    used the most CPU in between (`pid`, `name`, `cpu_s`; those that ended meanwhile are not
    seen)."""
    top = []
    if host_before is not None and host_after is not None:
        mine = set(own)
        used = [(cpu - host_before[pid][1], pid, name) for pid, (name, cpu) in host_after.items()
                if pid in host_before and pid not in mine and cpu > host_before[pid][1]]
        top = [{"pid": pid, "name": name, "cpu_s": round(cpu, 3)}
               for cpu, pid, name in sorted(used, reverse=True)[:HOST_TOP]]
    return {"start": dict(start), "end": dict(end), "host_top": top}


def foreign(rec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The foreign device processes of one run's record or a summary, each with `when`
    (`start`, `end`, or the runs where the summary saw it)."""
    if not isinstance(rec, Mapping):
        return []
    if isinstance(rec.get("foreign"), list):  # a summary
        return [dict(p) for p in rec["foreign"] if isinstance(p, Mapping)]
    out = []
    for when in ("start", "end"):
        s = rec.get(when)
        for p in (s.get("processes") or []) if isinstance(s, Mapping) else []:
            if isinstance(p, Mapping) and not p.get("own"):
                out.append({**p, "when": when})
    return out


def summarize(records: Sequence[tuple[str, Any]]) -> dict[str, Any] | None:
    """The run as a whole from (run dir, record) of its service runs: `source`, `applies`,
    `samples`, `failed_samples` (the tool could not be asked), `foreign` (each distinct pid
    once: `pid`, `name`, `device`, `used_mib` (the largest seen), `seen` (["runs/03-candidate
    start", ...])), `errors` (distinct), `runs`; None when no run recorded it (runs recorded
    before this field existed)."""
    recs = [(name, r) for name, r in records if isinstance(r, Mapping)
            and isinstance(r.get("start"), Mapping)]
    if not recs:
        return None
    by_pid: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    samples = failed = 0
    for name, r in recs:
        for when in ("start", "end"):
            s = r.get(when)
            if not isinstance(s, Mapping):
                continue
            samples += 1
            if s.get("error"):
                failed += 1
                if s["error"] not in errors:
                    errors.append(str(s["error"]))
        for p in foreign(r):
            d = by_pid.setdefault(int(p["pid"]), {"pid": int(p["pid"]), "name": p.get("name"),
                                                  "device": p.get("device"),
                                                  "used_mib": p.get("used_mib"), "seen": []})
            if isinstance(p.get("used_mib"), (int, float)):
                d["used_mib"] = max(d["used_mib"] or 0, p["used_mib"])
            d["seen"].append(f"{name} {p['when']}")
    first = recs[0][1]["start"]
    return {"source": first.get("source"), "applies": bool(first.get("applies", True)),
            "samples": samples, "failed_samples": failed, "foreign": list(by_pid.values()),
            "errors": errors, "runs": len(recs)}


def seen(rec: Mapping[str, Any] | None) -> bool:
    """True when a foreign process held a device in the record (a run's or a summary)."""
    return bool(foreign(rec))


def _proc_text(p: Mapping[str, Any]) -> str:
    bits = [p.get("name") or "unnamed"]
    if isinstance(p.get("used_mib"), (int, float)):
        bits.append(f"{p['used_mib']:,.0f} MiB")
    if p.get("device") is not None:
        bits.append(f"device {p['device']}")
    return f"pid {p['pid']} ({', '.join(bits)})"


def describe(rec: Mapping[str, Any] | None) -> str:
    """One sentence for people, starting `Device neighbours: `: which tool listed the
    devices' processes, the foreign ones and when they were seen, or why nothing is known;
    what to do when one was seen."""
    if not rec:
        return ("Device neighbours: not recorded (the run predates the manifest field "
                "neighbours): rerun to know whether another process used the devices.")
    if not rec.get("applies", True):
        return ("Device neighbours: none possible (emulated NPU: host memory stands in for "
                "the device, so no process can hold it; the host's load is above).")
    found = foreign(rec)
    source = rec.get("source") or "?"
    n = rec.get("samples")
    checked = f" ({source}, {n} samples)" if n else f" ({source})"
    errors = rec.get("errors") or []
    if found:
        text = ("Device neighbours: foreign processes on the devices" + checked + ": " + "; ".join(
            f"{_proc_text(p)} at {', '.join(p.get('seen') or [])}" for p in found)
            + ". Their work shared the device with the measured runs: rerun on devices no "
              "other process holds (`--require-exclusive` refuses to measure otherwise).")
    elif errors and rec.get("failed_samples") == n:
        text = (f"Device neighbours: unknown{checked}: the devices' processes could not be "
                f"listed ({'; '.join(errors)}).")
    else:
        text = f"Device neighbours: no foreign process on the devices{checked}."
        if errors:
            text += (f" {rec.get('failed_samples')} of {n} samples could not be taken: "
                     f"{'; '.join(errors)}.")
    return text


def exclusive(lister: Lister, own: Iterable[int]) -> dict[str, Any]:
    """Sample the devices and require that no foreign process holds one; returns the sample.

    Raises:
        NotExclusive: a foreign process is listed (named), or the devices' processes cannot
            be listed (exclusivity cannot be checked).
    """
    s = sample(lister, own)
    check(s)
    return s


def check(s: Mapping[str, Any]) -> None:
    """Require that the sample `s` lists no foreign process (see `exclusive`).

    Raises:
        NotExclusive: a foreign process is listed, or the sample could not be taken.
    """
    if s["error"]:
        raise NotExclusive(f"cannot list the devices' processes ({s['error']}), so "
                           "--require-exclusive cannot be checked")
    others = [p for p in s["processes"] if not p["own"]]
    if others:
        raise NotExclusive(f"{len(others)} foreign process(es) on the devices ({s['source']}): "
                           + "; ".join(_proc_text(p) for p in others)
                           + ": --require-exclusive refuses to measure")

