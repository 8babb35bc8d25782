"""The API-reproduction notebook: which allocator-telemetry query answers on this device,
live (`probe`, in a subprocess) or as recorded in a run's decisions (`api_from_run`)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pandas as pd

from residency import devices
from residency.evidence import load_decisions
from residency.notebook.params import check_device
from residency.rundir import Run, load_run

__all__ = ["api_from_run", "api_reproduction", "api_results", "arms_table", "probe",
           "probe_table", "verdict_markdown", "versions_table"]


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
    check_device(device)
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
    d = load_decisions(run)
    d = d[~d["warmup"].astype(bool)]
    dec = {a: d[d["run_arm"] == a] for a in ("baseline", "candidate")}
    generic = {q: _recorded_outcome(dec["baseline"], q) for q in ("allocated", "reserved")}
    kind = devices.REGISTRY.get(run.device_kind)
    if kind is not None and kind.torch_type == "npu":  # the candidate reads the module
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


def _snapshot_text(snapshot: Any) -> str:
    """A snapshot for people: "reserved 14 MiB, allocated 14 MiB, free 3.9 GiB, total 4 GiB"."""
    from residency.humanize import bytes_text

    if not isinstance(snapshot, Mapping):
        return str(snapshot)
    return ", ".join(f"{k} {bytes_text(v) if isinstance(v, (int, float)) else v}"
                     for k, v in snapshot.items())


def arms_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Which telemetry each arm reads on each device kind, and whether a snapshot
    succeeded (what a normal call then does)."""
    rows = []
    for kind, p in probes.items():
        for arm, info in (p.get("arms") or {}).items():
            if info["telemetry"] is None:
                state = "reads none: releases on every call"
            elif info["error"] is None:
                state = f"snapshot ok ({_snapshot_text(info['snapshot'])}): bounds decide"
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
        lines.append(f"* **{kind}** ({devices.label(kind)}): {p.get('verdict')} "
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


