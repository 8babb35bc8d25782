"""The API reproduction: which query path answers on this device (the generic
`torch.accelerator` one and the registered device module's), with the verdict, and the
vllm-ascend redirection applied when asked. `residency probe` and the selftest run it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from residency import devices
from residency.policy.cache import ALWAYS_RELEASE, BASELINE, CANDIDATE
from residency.policy.telemetry import (
    EXTRA_GENERIC_QUERIES,
    GENERIC_QUERIES,
    POLICY_QUERIES,
    GenericTelemetry,
    TelemetryUnavailable,
    as_device,
    telemetry_for,
)


def query_paths() -> dict[str, dict[str, Any]]:
    """Which function answers each generic `torch.accelerator` query in this process.

    Per query: `function` (module-qualified name of what `torch.accelerator.<name>` is now)
    and `redirected` (True when a patch such as vllm-ascend's replaced PyTorch's own). Read
    from the live objects: detected, never assumed.
    """
    import torch

    out: dict[str, dict[str, Any]] = {}
    for key, name in GENERIC_QUERIES.items():
        fn = getattr(torch.accelerator, name, None)
        if fn is None:
            out[key] = {"function": None, "redirected": False}
            continue
        owner = getattr(fn, "__self__", None)
        module = getattr(fn, "__module__", None) or type(owner).__module__
        qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        out[key] = {"function": f"{module}.{qualname}",
                    "redirected": not str(module).startswith("torch.accelerator")}
    return out


VLLM_ASCEND_PATCH_MODULE = "vllm_ascend.patch.platform.patch_torch_accelerator"
"""vllm-ascend's module that redirects `torch.accelerator` functions to `torch.npu`."""

VLLM_ASCEND_PATCH_FILE = ("patch", "platform", "patch_torch_accelerator.py")


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def vllm_ascend_installed() -> str | None:
    """The installed vllm-ascend's version, "installed (version unknown)" for an importable
    `vllm_ascend` without distribution metadata, or None; imports nothing."""
    import importlib.util

    version = _dist_version("vllm-ascend")
    if version is not None:
        return version
    return "installed (version unknown)" if importlib.util.find_spec("vllm_ascend") else None


def apply_vllm_ascend_patch() -> str:
    """Run the installed vllm-ascend's `patch/platform/patch_torch_accelerator.py` alone, as
    the module `VLLM_ASCEND_PATCH_MODULE`: whatever that version redirects is redirected.
    Its package `__init__`s (vLLM and every other platform patch) are not run. Needs torch's
    `npu` device module registered first. Returns the file's path.

    Raises:
        ValueError: vllm-ascend is not installed, has no such file, or running it failed.
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm_ascend")  # a top-level name: nothing is imported
    if spec is None:
        raise ValueError("vllm-ascend is not installed here (no importable `vllm_ascend`)")
    places = [str(p) for p in (spec.submodule_search_locations or [])]
    path = next((f for f in (Path(p, *VLLM_ASCEND_PATCH_FILE) for p in places)
                 if f.is_file()), None)
    if path is None:
        raise ValueError(f"vllm-ascend has no {'/'.join(VLLM_ASCEND_PATCH_FILE)} (looked in "
                         f"{', '.join(places) or 'no package directory'})")
    module_spec = importlib.util.spec_from_file_location(VLLM_ASCEND_PATCH_MODULE, path)
    assert module_spec is not None and module_spec.loader is not None
    try:
        module_spec.loader.exec_module(importlib.util.module_from_spec(module_spec))
    except Exception as exc:  # noqa: BLE001 - any failure: the patch cannot be applied
        raise ValueError(f"{path} failed: {type(exc).__name__}: {exc}") from None
    return str(path)


def setup_probe(kind: str, patch: str = "none") -> dict[str, Any]:
    """Install `kind`'s device stack in this process and apply the accelerator `patch`.

    `patch="vllm-ascend"`: on `emulated-npu` the emulated redirection
    (`residency.emulated.patches`), on `npu` the installed vllm-ascend's own patch file
    (`apply_vllm_ascend_patch`), whatever that version redirects. Returns
    `accelerator_patch`, `patch_source` (what applied it, None without a patch) and
    `vllm_ascend` (`vllm_ascend_installed()`: detected, never assumed).

    Raises:
        ValueError: a patch on a kind other than `npu`/`emulated-npu`, an unknown patch, or
            vllm-ascend's patch cannot be applied (with the reason).
    """
    from residency.devicemodel import ACCELERATOR_PATCHES

    if patch not in ACCELERATOR_PATCHES:
        raise ValueError(f"The value for `--accelerator-patch` must be one of "
                         f"{list(ACCELERATOR_PATCHES)}, but {patch!r} was passed.")
    if patch != "none" and kind not in ("npu", "emulated-npu"):
        raise ValueError("--accelerator-patch needs an npu or emulated-npu device")
    installed = vllm_ascend_installed()
    source = None
    if devices.emulated(kind):
        from residency.emulated import DeviceModel, install_emulated_npu

        install_emulated_npu(model=DeviceModel(compute="real", accelerator_patch=patch))
        source = "residency.emulated.patches (emulated vllm-ascend redirection)" \
            if patch != "none" else None
    elif kind == "npu":
        import torch_npu  # noqa: F401  - registers torch.npu
        if patch == "vllm-ascend":
            try:
                source = f"{apply_vllm_ascend_patch()} (vllm-ascend {installed})"
            except ValueError as exc:
                raise ValueError(f"--accelerator-patch vllm-ascend: {exc}") from None
    return {"accelerator_patch": patch, "patch_source": source, "vllm_ascend": installed}


def _outcome(call: Any) -> dict[str, Any]:
    try:
        value = call()
    except Exception as exc:  # the outcome of a failing query is the evidence
        return {"ok": False, "error_type": type(exc).__name__, "error": str(exc)}
    if isinstance(value, Mapping):  # memory_stats: how many counters, not the counters
        return {"ok": True, "value": f"{len(value)} counters"}
    value = [int(v) for v in value] if isinstance(value, tuple) else int(value)
    return {"ok": True, "value": value}


def _module_name(module: Any) -> str:
    name = getattr(module, "__name__", None)
    return name if isinstance(name, str) else f"{type(module).__module__}." \
        f"{type(module).__qualname__}"


def probe_queries(device: Any) -> dict[str, Any]:
    """Outcome of every query path on `device`: value, or exception type and message.

    Keys: `generic` (`allocated`, `reserved`, then `memory_stats` and `get_memory_info`;
    each also with `path`, the function that answered or raised, and `redirected`),
    `registered` (`allocated`, `reserved`) and `registered_module` (the module's name),
    `mem_get_info`, `arms` (which telemetry each arm reads and whether a snapshot succeeds),
    `bug_present` (decided on `POLICY_QUERIES`) and `verdict`.
    """
    import torch

    device = as_device(device)

    def registered(name: str) -> Any:
        return lambda: getattr(torch.get_device_module(device), name)(device)

    def generic_call(name: str) -> Any:  # looked up at call time: a patch may replace it
        return lambda: getattr(torch.accelerator, name)(device)

    generic = {query: _outcome(generic_call(GENERIC_QUERIES[query]))
               for query in (*POLICY_QUERIES, *EXTRA_GENERIC_QUERIES)}
    module = {
        "allocated": _outcome(registered("memory_allocated")),
        "reserved": _outcome(registered("memory_reserved")),
    }
    arms = {}
    for arm, source in ((BASELINE, GenericTelemetry()), (CANDIDATE, telemetry_for(device))):
        try:
            snapshot: dict[str, Any] | None = source.snapshot(device).to_dict()
            error = None
        except TelemetryUnavailable as exc:
            snapshot, error = None, str(exc)
        arms[arm] = {"telemetry": source.name, "snapshot": snapshot, "error": error}
    arms[ALWAYS_RELEASE] = {"telemetry": None, "snapshot": None, "error": None}
    generic_ok = all(generic[q]["ok"] for q in POLICY_QUERIES)
    module_ok = all(v["ok"] for v in module.values())
    paths = query_paths()
    for key, outcome in generic.items():
        outcome["path"] = paths[key]["function"]
        outcome["redirected"] = paths[key]["redirected"]
    try:
        module_name: str | None = _module_name(torch.get_device_module(device))
    except Exception:  # no module registered for this device type: the outcomes say so
        module_name = None
    return {
        "device": str(device),
        "generic": generic,
        "registered": module,
        "registered_module": module_name,
        "mem_get_info": _outcome(registered("mem_get_info")),
        "arms": arms,
        # the bug: generic query fails where the registered module answers
        "bug_present": (not generic_ok) and module_ok,
        "verdict": _verdict(generic_ok, module_ok) + _sequence(generic),
    }


def _sequence(generic: dict[str, dict[str, Any]]) -> str:
    """The vllm-ascend sequence, when it is what the generic queries show."""
    reserved, allocated = generic["reserved"], generic["allocated"]
    if reserved["ok"] and not allocated["ok"]:
        how = " (redirected to the device module)" if reserved.get("redirected") else ""
        return (f"; the generic sequence fails on its second query: memory_reserved answers"
                f"{how}, memory_allocated raises")
    if allocated["ok"] and allocated.get("redirected"):
        return ("; memory_allocated is redirected too (as vllm-ascend's PR #12344 does), so "
                "the generic sequence answers")
    return ""


def _verdict(generic_ok: bool, module_ok: bool) -> str:
    if not generic_ok and module_ok:
        return ("bug present: the generic torch.accelerator query fails where the registered "
                "device module answers")
    if generic_ok and module_ok:
        return "bug absent: both query paths answer"
    if generic_ok:
        return "registered device module does not answer; the generic query does"
    return "no allocator telemetry on this device: neither query path answers"
