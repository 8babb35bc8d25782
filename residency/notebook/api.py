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
from residency.evidence import decisions_by_request
from residency.humanize import md_code, md_text
from residency.notebook.params import check_accelerator_patch, check_device, loaded_run
from residency.policy.cache import BASELINE, CANDIDATE
from residency.rundir.run import Run

__all__ = ["api_from_run", "api_reproduction", "api_results",
           "arms_table", "probe", "probe_table", "row_label", "verdict_markdown",
           "versions_table"]

_PATCH = "vllm-ascend"


def _run_probe(spec: str, *, patch: str = "none", timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "residency", "probe", "--device", spec, "--json",
           "--accelerator-patch", patch]
    what = f"`residency probe --device {spec} --accelerator-patch {patch}`"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} did not finish within {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{what} exited with code {proc.returncode}: {tail}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"{what} printed no JSON ({exc})") from None


def _not_probed(kind: str, patch: str, reason: str) -> dict[str, Any]:
    return {"device_kind": kind, "accelerator_patch": patch, "skipped": reason,
            "generic": None, "registered": None, "mem_get_info": None, "arms": None,
            "bug_present": None, "verdict": f"not probed with the {patch} patch: {reason}"}


def _patched_probe(kind: str, plain: Mapping[str, Any], *, timeout_s: float
                   ) -> dict[str, Any]:
    """The probe under vllm-ascend's patch, or why it was not run (detected here)."""
    if devices.info(kind).torch_type != "npu":
        return _not_probed(kind, _PATCH, f"vllm-ascend patches torch.accelerator on NPU "
                           f"devices only, and this device is {kind}")
    if not devices.emulated(kind) and plain.get("vllm_ascend") is None:
        return _not_probed(kind, _PATCH, "vllm-ascend is not installed here (no "
                           "importable `vllm_ascend`)")
    try:
        return _run_probe(kind, patch=_PATCH, timeout_s=timeout_s)
    except RuntimeError as exc:
        if devices.emulated(kind):  # the emulated patch is ours: its failure is a bug
            raise
        return _not_probed(kind, _PATCH, str(exc))


def row_label(entry: Mapping[str, Any]) -> str:
    """How tables name a probe: its device kind, `+ vllm-ascend` when run under the patch."""
    kind, patch = str(entry.get("device_kind")), entry.get("accelerator_patch")
    return kind if patch in (None, "none") else f"{kind} + {patch}"


def probe(device: str = "auto", *, accelerator_patch: str = "both", timeout_s: float = 300
          ) -> dict[str, dict[str, Any]]:
    """The API reproduction on `device`, run as `residency probe --device D --json` in a
    subprocess (the emulated NPU's backend registration is process-global).

    `accelerator_patch`: "none" (plain PyTorch), "vllm-ascend" (under vllm-ascend's
    `torch.accelerator` redirection: the emulated one on emulated-npu, the installed
    vllm-ascend's own on npu) or "both". Whether the patch can run is detected: on npu
    without vllm-ascend installed, or on a device that is not an NPU, that probe's entry
    says why it was not run (`skipped`). With "auto", `cpu` is probed for comparison.
    Returns row label (`row_label`) -> probe JSON, the requested device first.

    Raises:
        ParameterError: `device` is not one of `DEVICE_SPECS`, or `accelerator_patch` not
            one of `ACCELERATOR_PATCH_CHOICES`.
        RuntimeError: a probe process failed, with its last error line.
    """
    check_device(device)
    check_accelerator_patch(accelerator_patch)
    plain = _run_probe(device, timeout_s=timeout_s)  # also resolves `auto` to a kind
    kind = str(plain["device_kind"])
    entries = []
    if accelerator_patch in ("none", "both"):
        entries.append(plain)
    if accelerator_patch in (_PATCH, "both"):
        entries.append(_patched_probe(kind, plain, timeout_s=timeout_s))
    if device == "auto" and kind != "cpu":
        entries.append(_run_probe("cpu", timeout_s=timeout_s))
    return {row_label(e): e for e in entries}


_UNAVAILABLE = re.compile(r"^\w+ telemetry unavailable: (?P<type>[\w.]+): (?P<msg>.*?)"
                          r"(?: \[query: (?P<query>[\w.]+)\])?$", re.S)

_ANSWERED = {"ok": True, "value": None}  # answered; the failed snapshot kept no value


def _recorded_outcomes(decisions: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """allocated and reserved as the first measured normal call recorded them. A failed
    snapshot that names its query (`[query: ...]`) tells which query raised: the generic
    source asks reserved first, then allocated, then mem_get_info. Without the query (runs
    recorded before it was kept) both carry the failure."""
    normal = decisions[decisions["kind"] == "normal"]
    if normal.empty:
        none = {"ok": None, "error_type": None, "error": "no normal call recorded"}
        return {"allocated": none, "reserved": dict(none)}
    failed = normal[normal["reason"] == "telemetry-unavailable"]
    if not failed.empty:
        text = str(failed.iloc[0]["error"])
        m = _UNAVAILABLE.match(text)
        error = {"ok": False, "error_type": m["type"] if m else None,
                 "error": m["msg"] if m else text}
        query = (m["query"] if m else None) or ""
        if query.endswith("memory_allocated"):  # reserved answered first
            return {"allocated": error, "reserved": dict(_ANSWERED)}
        if query.endswith("memory_reserved"):  # the first query raised
            return {"allocated": {"ok": None, "error_type": None,
                                  "error": "not reached: memory_reserved raised first"},
                    "reserved": error}
        if query.endswith("mem_get_info"):
            return {"allocated": dict(_ANSWERED), "reserved": dict(_ANSWERED)}
        return {"allocated": error, "reserved": dict(error)}
    row = normal.iloc[0]
    out = {}
    for field_name in ("allocated", "reserved"):
        value = row[field_name]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out[field_name] = {"ok": None, "error_type": None, "error": "no snapshot recorded"}
        else:
            out[field_name] = {"ok": True, "value": int(value)}
    return out


def _recorded_verdict(generic: Mapping[str, Mapping[str, Any]],
                      registered: Mapping[str, Mapping[str, Any]]) -> tuple[bool | None, str]:
    g_ok = [v["ok"] for v in generic.values()]
    r_ok = [v["ok"] for v in registered.values()]
    if None in r_ok or (False not in g_ok and None in g_ok):
        return None, "undetermined from this run: a query path was not observed"
    if False not in g_ok:
        return False, "bug absent: both query paths answered"
    if not all(r_ok):
        return False, "bug absent: the registered device module did not answer either"
    verdict = ("bug present: the generic torch.accelerator query failed where the "
               "registered device module answered")
    if generic["reserved"]["ok"] is True:
        verdict += ("; the generic sequence failed on its second query: memory_reserved "
                    "answered, memory_allocated raised")
    return True, verdict


def api_from_run(run: Run) -> dict[str, Any]:
    """The API reproduction as recorded in a run's decisions: the baseline arm reads the
    generic `torch.accelerator` telemetry; on npu and emulated-npu the candidate reads the
    registered device module (on other kinds the registered path is not observed). Which
    generic query raised comes from the recorded error (`_recorded_outcomes`); the
    accelerator patch from the manifest (`params.emulated_npu.accelerator_patch`; None when
    the run did not record one). Returns a probe-shaped dict (`generic`, `registered`,
    `bug_present`, `verdict`, ...)."""
    d = decisions_by_request(run)
    d = d[~d["warmup"].astype(bool)]
    dec = {a: d[d["run_arm"] == a] for a in (BASELINE, CANDIDATE)}
    generic = _recorded_outcomes(dec[BASELINE])
    kind = devices.REGISTRY.get(run.device_kind)
    if kind is not None and kind.torch_type == "npu":  # the candidate reads the module
        registered = _recorded_outcomes(dec[CANDIDATE])
    else:
        registered = {q: {"ok": None, "error_type": None,
                          "error": f"not observed: on {run.device_kind} both arms read the "
                          "generic telemetry"} for q in ("allocated", "reserved")}
    bug, verdict = _recorded_verdict(generic, registered)
    arms = {a: _recorded_arm(dec[a], "registered" if a == CANDIDATE and kind is not None and
                             kind.torch_type == "npu" else "generic") for a in dec
            if len(dec[a])}
    v = run.manifest.get("versions") or {}
    model = (run.manifest.get("params") or {}).get("emulated_npu")
    patch = model.get("accelerator_patch") if isinstance(model, dict) else None
    return {"device_kind": run.device_kind, "device": None, "python": v.get("python"),
            "torch": v.get("torch"), "torch_npu": v.get("torch_npu"),
            "vllm_ascend": v.get("vllm_ascend"), "accelerator_patch": patch,
            "generic": generic, "registered": registered, "mem_get_info": None,
            "arms": arms or None,
            "bug_present": bug, "verdict": verdict, "recorded": True, "run_dir": str(run.path)}


def _recorded_arm(decisions: Any, telemetry: str) -> dict[str, Any]:
    """What one arm's recorded normal decisions show of its telemetry: the source it reads,
    the first recorded snapshot (or None), and the first telemetry error (or None)."""
    normal = decisions[decisions["kind"] == "normal"]
    errors = normal[normal["reason"] == "telemetry-unavailable"]
    error = None if errors.empty else str(errors.iloc[0]["error"])
    snapshot = None
    ok = normal[normal["reason"] != "telemetry-unavailable"]
    if not ok.empty:
        first = ok.iloc[0]
        snapshot = {k: first.get(k) for k in ("reserved", "allocated", "free", "total")
                    if first.get(k) is not None}
    return {"telemetry": telemetry, "snapshot": snapshot, "error": error}


def api_reproduction(source: str, device: str = "auto", *, accelerator_patch: str = "both"
                     ) -> dict[str, dict[str, Any]]:
    """Row label -> probe-shaped dict: a live `probe(device, accelerator_patch=...)` when
    `source` is "run", else what the recorded run directory `source` shows
    (`api_from_run`; the run's own accelerator patch applies)."""
    if str(source) == "run":
        return probe(device, accelerator_patch=accelerator_patch)
    check_accelerator_patch(accelerator_patch)
    entry = api_from_run(loaded_run(source))
    return {row_label(entry): entry}


def _outcome_text(out: Mapping[str, Any] | None) -> tuple[str, str]:
    if out is None:
        return "not observed", ""
    if out.get("ok") is True:
        value = out.get("value")
        return "ok", "answered (value not recorded)" if value is None else str(value)
    if out.get("ok") is None:
        return "not observed", str(out.get("error") or "")
    return "error", f"{out.get('error_type')}: {out.get('error')}"


_GENERIC_CALLS = {"allocated": "memory_allocated", "reserved": "memory_reserved",
                  "memory_stats": "memory_stats", "get_memory_info": "get_memory_info"}
_REGISTERED_CALLS = {"allocated": "memory_allocated", "reserved": "memory_reserved"}


def _patch_text(entry: Mapping[str, Any]) -> str:
    patch = entry.get("accelerator_patch")
    return "not recorded" if patch is None else str(patch)


def _generic_function(out: Mapping[str, Any] | None) -> str:
    path = (out or {}).get("path")
    if not path:
        return "not recorded"
    return f"{path} (redirected)" if out.get("redirected") else f"{path} (PyTorch's own)"


def probe_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per probe (device kind and accelerator patch), query path and query: the
    function that ran (PyTorch's own, a redirection such as vllm-ascend's, or the registered
    device module's), the outcome and the value (bytes) or exception type and message. A
    probe that was not run (`skipped`) is one row saying why."""
    rows = []

    def row(entry: Mapping[str, Any], path: str, call: str, function: str,
            out: Mapping[str, Any] | None) -> None:
        outcome, detail = _outcome_text(out)
        rows.append({"device kind": entry.get("device_kind"),
                     "accelerator patch": _patch_text(entry), "path": path, "call": call,
                     "function that ran": function, "outcome": outcome,
                     "value (bytes) or exception": detail})

    for p in probes.values():
        if p.get("skipped"):
            rows.append({"device kind": p.get("device_kind"),
                         "accelerator patch": _patch_text(p), "path": "", "call": "",
                         "function that ran": "", "outcome": "not probed",
                         "value (bytes) or exception": p["skipped"]})
            continue
        generic = p.get("generic") or {}
        for query, name in _GENERIC_CALLS.items():
            if query in generic or query in _REGISTERED_CALLS:
                row(p, "generic", f"torch.accelerator.{name}(d)",
                    _generic_function(generic.get(query)), generic.get(query))
        module = p.get("registered_module") or "the registered device module"
        for query, name in _REGISTERED_CALLS.items():
            row(p, "registered", f"torch.get_device_module(d).{name}(d)",
                f"{module}.{name}", (p.get("registered") or {}).get(query))
        if p.get("mem_get_info") is not None:
            row(p, "registered", "torch.get_device_module(d).mem_get_info(d)",
                f"{module}.mem_get_info", p["mem_get_info"])
    return pd.DataFrame(rows, columns=["device kind", "accelerator patch", "path", "call",
                                       "function that ran", "outcome",
                                       "value (bytes) or exception"])


def _snapshot_text(snapshot: Any) -> str:
    """A snapshot for people: "reserved 14 MiB, allocated 14 MiB, free 3.9 GiB, total 4 GiB"."""
    from residency.humanize import bytes_text

    if not isinstance(snapshot, Mapping):
        return str(snapshot)
    return ", ".join(f"{k} {bytes_text(v) if isinstance(v, (int, float)) else v}"
                     for k, v in snapshot.items())


def arms_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Which telemetry each arm reads on each device kind (and accelerator patch), and
    whether a snapshot succeeded (what a normal call then does)."""
    rows = []
    for p in probes.values():
        for arm, info in (p.get("arms") or {}).items():
            if info["telemetry"] is None:
                state = "reads none: releases on every call"
            elif info["error"] is None:
                state = f"snapshot ok ({_snapshot_text(info['snapshot'])}): bounds decide"
            else:
                state = f"unavailable -> every normal call releases ({info['error']})"
            rows.append({"device kind": p.get("device_kind"),
                         "accelerator patch": _patch_text(p), "arm": arm,
                         "telemetry": info["telemetry"] or "none", "normal call": state})
    return pd.DataFrame(rows, columns=["device kind", "accelerator patch", "arm", "telemetry",
                                       "normal call"])


def versions_table(probes: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """python, torch, torch-npu and vllm-ascend (detected: the installed distribution)
    versions, one row per probed device kind."""
    rows: dict[str, dict[str, Any]] = {}
    for p in probes.values():
        kind = str(p.get("device_kind"))
        if kind in rows or p.get("skipped"):
            continue
        rows[kind] = {"device kind": kind, "device": p.get("device"),
                      "python": p.get("python"), "torch": p.get("torch"),
                      "torch-npu": p.get("torch_npu") or "none",
                      "vllm-ascend": p.get("vllm_ascend") or "not installed"}
    return pd.DataFrame(list(rows.values()))


def verdict_markdown(probes: Mapping[str, Mapping[str, Any]]) -> str:
    """One Markdown line per probe: device kind, accelerator patch (and what applied it), the
    detected verdict and `bug_present`."""
    lines = []
    for p in probes.values():
        kind = str(p.get("device_kind"))
        patch = p.get("accelerator_patch")
        if patch not in (None, "none"):
            by = f", applied by {md_text(p['patch_source'])}" if p.get("patch_source") else ""
            where = f" with the {md_text(patch)} patch{by}"
        else:
            where = " without an accelerator patch" if patch == "none" else ""
        how = ("read from the recorded run's decisions" if p.get("recorded") else
               "detected by calling both query paths now")
        if p.get("skipped"):
            how = "detected before probing"
        lines.append(f"* **{md_text(kind)}** ({md_text(devices.label(kind))}){where}: "
                     f"{md_text(p.get('verdict'))} (`bug_present` = "
                     f"{md_text(p.get('bug_present'))}; {how}, never assumed)."
                     + _redirections(p))
    return "\n".join(lines)


def _redirections(entry: Mapping[str, Any]) -> str:
    """Which generic queries a patch redirected, as the live objects showed."""
    generic = entry.get("generic") or {}
    seen = {q: o["redirected"] for q, o in generic.items()
            if isinstance(o, Mapping) and "redirected" in o}
    if entry.get("accelerator_patch") in (None, "none") or not seen:
        return ""
    moved = [md_code(q) for q, r in seen.items() if r]
    kept = [md_code(q) for q, r in seen.items() if not r]
    return (f" Redirected: {', '.join(moved) or 'none'}; PyTorch's own: "
            f"{', '.join(kept) or 'none'}.")


_ENTRY_FIELDS = ("device_kind", "accelerator_patch", "patch_source", "generic", "registered",
                 "bug_present", "verdict", "skipped")


def api_results(probes: Mapping[str, Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """The `results.json` of api_reproduction: `device_kind`, `accelerator_patch`,
    `generic`, `registered`, `bug_present` and `verdict` of the first probe (the requested
    device), versions (vllm-ascend included), the other probes under `comparison` (keyed by
    row label: the same device under the patch, `cpu`), and `extra`."""
    label, first = next(iter(probes.items()))
    comparison = {k: {key: p.get(key) for key in _ENTRY_FIELDS}
                  for k, p in probes.items() if k != label}
    return {"device_kind": first.get("device_kind", label),
            "accelerator_patch": first.get("accelerator_patch"),
            "patch_source": first.get("patch_source"), "generic": first.get("generic"),
            "registered": first.get("registered"), "bug_present": first.get("bug_present"),
            "verdict": first.get("verdict"), "mem_get_info": first.get("mem_get_info"),
            "versions": {k: first.get(k) for k in ("python", "torch", "torch_npu",
                                                   "vllm_ascend")},
            "recorded": bool(first.get("recorded")), "comparison": comparison, **extra}
