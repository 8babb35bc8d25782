"""vLLM-Omni general plugin: run a residency arm inside vLLM-Omni's `BoundedAllocatorCache`.

Every vLLM-Omni process (API server, engine core, each diffusion worker) calls the functions
of the `vllm_omni.general_plugins` entry-point group once, before it builds a model
(`vllm_omni/plugins/__init__.py: load_omni_general_plugins`, read at vllm-project/vllm-omni
6a96e66ea6f85ea42d3d514cf3feb1ed1a1a1ca2; `VLLM_PLUGINS`, when set, must name `residency`).
Our `register` is that function. It reads:

* `RESIDENCY_ARM`: `candidate`, `baseline` or `always-release`; unset or empty: do nothing
  (logged once per process) and vLLM-Omni runs its own policy untouched;
* `RESIDENCY_DECISIONS_DIR`: where each process appends `decisions-rank<r>.jsonl` (one line
  per policy call, docs/contracts.md); unset: the arm still applies, nothing is recorded.
  The rank is read at the first policy call (torch.distributed rank when initialised, else
  `RANK`, else `LOCAL_RANK`, else 0): the plugin itself loads before distributed init.
  `request_id` is null in every line (the workers never see a request id); attribute calls
  to requests by `wall_ns` against the client's request times. `device_kind` is the
  device type of the first instance that calls (`npu`, `cuda`, ...).

What upstream looks like (vllm_omni/diffusion/offloader/module_residency.py):

* fixed bounds, vllm-project/vllm-omni 08dd3091b5c83dee11ee47ceacb28349c34a608c (PR #6526;
  same shape in the lishunyang12 and zhumingjue138 forks): `BoundedAllocatorCache(device, *,
  max_cached_fraction=0.25, min_free_fraction=0.05)` stores `device`, `max_cached_fraction`,
  `min_free_fraction`; `_should_release()` reads `torch.accelerator.memory_reserved/
  memory_allocated(device)` and `current_omni_platform.get_device_memory(device)` (free,
  total); `release_if_needed(*, force=False) -> bool` releases through the module global
  `current_omni_platform.empty_cache()` when forced, when a bound is crossed, or when any
  telemetry call raises. `MiniMaxH3Pipeline` builds one with `BoundedAllocatorCache(self.device)`
  only when distributed layer-wise offload is on.
* learned budget, vllm-project/vllm-omni 6a9867f3f304f3ae973a2c1a08d72b4bfffa5022 (PR #6629,
  open when read; an earlier seeded revision in the Asthenia0412 fork): no
  `max_cached_fraction`; `grow_retention_budget`, `shrink_retention_budget`,
  `observed_cached_peak`, `budget_bytes` = min(observed peak x 1.25, 25 % of total), and
  `_should_release` updates the peak as a side effect.
* older trees (heyuanliu-intel fork, 96041fb9) have no `BoundedAllocatorCache` at all.

What `register` does: on the fixed-bounds shape it replaces the class's `release_if_needed`
(class object, once per process: instances made before and after are covered) with a
wrapper that keeps one `residency.policy.cache.BoundedAllocatorCache` per upstream instance, built
from that instance's `device`, `max_cached_fraction` and `min_free_fraction`, releasing
through the upstream `current_omni_platform.empty_cache()` and recording to the process's
decisions file. Decisions keep upstream semantics (bounds compared with `int(total * f)`,
forced calls read no telemetry, a telemetry failure releases); the arm picks the source:
`candidate` = `telemetry_for(device)`, `baseline` = `GenericTelemetry` (what upstream
reads), `always-release` = release on every call. free/total come from the device module's
`mem_get_info`, which is what `current_omni_platform.get_device_memory` calls on NPU. Calls
also open `residency.release[normal|forced]` host ranges, so profiled runs carry markers.

It refuses (raises `UnsupportedUpstream`, a RuntimeError naming what is missing and the
vLLM-Omni version) any other shape, the learned budget included: substituting fixed bounds
would measure a policy that upstream does not run, and its peak state has no place in the
decisions record. vLLM-Omni does not catch errors of a plugin function, so a refusal stops
the process at start-up instead of yielding a mislabelled run.

Without the adapter (not installed, or arm unset) nothing is recorded per call; analysis
falls back to the trace markers, which then come only from what the service itself emits.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from residency.policy.cache import (
    ARMS,
    BoundedAllocatorCache,
    JsonlRecorder,
    default_rank,
    policy_for,
)
from residency.records.decisions import decisions_file

logger = logging.getLogger(__name__)

ARM_ENV = "RESIDENCY_ARM"
DECISIONS_DIR_ENV = "RESIDENCY_DECISIONS_DIR"
UPSTREAM_MODULE = "vllm_omni.diffusion.offloader.module_residency"
UPSTREAM_CLASS = "BoundedAllocatorCache"
SESSION_ATTR = "_residency_session"
"""Class attribute set on the patched upstream class (its presence means: patched)."""
LEARNED_BUDGET_ATTRS = ("budget_bytes", "grow_retention_budget", "shrink_retention_budget",
                        "observed_cached_peak")
INSTANCE_ATTRS = ("device", "max_cached_fraction", "min_free_fraction")

_POLICY_ATTR = "_residency_policy"
_logged: set[str] = set()


class UnsupportedUpstream(RuntimeError):
    """vLLM-Omni's `BoundedAllocatorCache` lacks something the adapter relies on."""

    def __init__(self, missing: str, version: str, detail: str) -> None:
        self.missing = missing
        self.version = version
        super().__init__(
            f"residency adapter refuses vLLM-Omni {version}: `{missing}` {detail}. "
            f"Unset {ARM_ENV} to serve without the adapter.")


def upstream_version() -> str:
    """The installed vLLM-Omni version, from its distribution metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-omni")
    except PackageNotFoundError:
        return "unknown (no vllm-omni distribution metadata)"


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.log(level, message, *args)


def _parameters(func: Any, name: str, version: str) -> dict[str, inspect.Parameter]:
    if not callable(func):
        raise UnsupportedUpstream(name, version, "is missing or not callable")
    try:
        return dict(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        raise UnsupportedUpstream(name, version, f"has no readable signature ({exc})") from exc


def check_upstream(module: ModuleType) -> type:
    """The fixed-bounds `BoundedAllocatorCache` class of `module`.

    Raises:
        UnsupportedUpstream: the class, a constructor parameter, `_should_release`,
            `release_if_needed(force=...)` or `current_omni_platform.empty_cache` is
            missing, or the class is the learned-budget variant.
    """
    version = upstream_version()
    cls = getattr(module, UPSTREAM_CLASS, None)
    if not isinstance(cls, type):
        raise UnsupportedUpstream(f"{module.__name__}.{UPSTREAM_CLASS}", version, "is missing")
    learned = [name for name in LEARNED_BUDGET_ATTRS if hasattr(cls, name)]
    if learned:
        raise UnsupportedUpstream(
            f"{UPSTREAM_CLASS}.max_cached_fraction", version,
            f"is replaced by a learned retention budget ({', '.join(learned)}); only the "
            "fixed-bounds class is supported")
    init = _parameters(cls, f"{UPSTREAM_CLASS}.__init__", version)
    for name in INSTANCE_ATTRS:
        if name not in init:
            raise UnsupportedUpstream(f"{UPSTREAM_CLASS}.__init__({name})", version,
                                      "is not a constructor parameter")
    _parameters(getattr(cls, "_should_release", None), f"{UPSTREAM_CLASS}._should_release",
                version)
    release = _parameters(getattr(cls, "release_if_needed", None),
                          f"{UPSTREAM_CLASS}.release_if_needed", version)
    force = release.get("force")
    if force is None or force.kind not in (inspect.Parameter.KEYWORD_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise UnsupportedUpstream(f"{UPSTREAM_CLASS}.release_if_needed(force)", version,
                                  "is not a keyword parameter")
    platform = getattr(module, "current_omni_platform", None)
    if not callable(getattr(platform, "empty_cache", None)):
        raise UnsupportedUpstream(f"{module.__name__}.current_omni_platform.empty_cache",
                                  version, "is missing")
    return cls


class _Session:
    """Per-process adapter state: the arm, the decisions file, and the upstream release."""

    def __init__(self, module: ModuleType, arm: str, decisions_dir: Path | None,
                 version: str) -> None:
        self.module = module
        self.arm = arm
        self.decisions_dir = decisions_dir
        self.version = version
        self.rank: int | None = None
        self.recorder: JsonlRecorder | None = None
        self._lock = threading.Lock()

    def release(self) -> None:
        """The upstream release path (looked up per call, as upstream does)."""
        self.module.current_omni_platform.empty_cache()

    def _start(self, device: Any) -> None:
        self.rank = default_rank()
        if self.decisions_dir is None:
            return
        device_type = getattr(device, "type", None) or str(device).split(":")[0]
        self.recorder = JsonlRecorder(self.decisions_dir / decisions_file(self.rank),
                                      request_id=None, device_kind=device_type)
        atexit.register(self.recorder.close)

    def policy_for(self, instance: Any) -> BoundedAllocatorCache:
        """The residency policy of one upstream instance (rebuilt if its bounds change)."""
        missing = [name for name in INSTANCE_ATTRS if not hasattr(instance, name)]
        if missing:
            raise UnsupportedUpstream(f"{UPSTREAM_CLASS}.{missing[0]}", self.version,
                                      "is not set on the instance")
        key = tuple(getattr(instance, name) for name in INSTANCE_ATTRS)
        cached = instance.__dict__.get(_POLICY_ATTR)
        if cached is not None and cached[0] == key:
            return cached[1]
        with self._lock:
            if self.rank is None:
                self._start(key[0])
            policy = policy_for(self.arm, key[0], max_cached_fraction=key[1],
                                min_free_fraction=key[2], release=self.release,
                                recorder=self.recorder, rank=self.rank)
        instance.__dict__[_POLICY_ATTR] = (key, policy)
        return policy


def _wrap(original: Callable[..., bool], session: _Session) -> Callable[..., bool]:
    @functools.wraps(original)
    def release_if_needed(self: Any, *, force: bool = False) -> bool:
        return session.policy_for(self).release_if_needed(force=force)

    return release_if_needed


def install(cls: type, module: ModuleType, *, arm: str, decisions_dir: Path | None) -> bool:
    """Patch `cls.release_if_needed` for `arm`; False when it was already patched.

    Raises:
        RuntimeError: `cls` is already patched for another arm.
    """
    current: _Session | None = cls.__dict__.get(SESSION_ATTR)
    if current is not None:
        if current.arm != arm:
            raise RuntimeError(f"{UPSTREAM_CLASS} is already patched for arm {current.arm!r}; "
                               f"refusing to switch to {arm!r} in the same process")
        return False
    session = _Session(module, arm, decisions_dir, upstream_version())
    cls.release_if_needed = _wrap(cls.release_if_needed, session)  # type: ignore[attr-defined]
    setattr(cls, SESSION_ATTR, session)
    logger.info("residency adapter: %s.release_if_needed runs arm %r (vLLM-Omni %s), "
                "decisions in %s", UPSTREAM_CLASS, arm, session.version,
                decisions_dir or "(not recorded)")
    return True


def register() -> None:
    """vLLM-Omni general-plugin entry point: patch `BoundedAllocatorCache` per `RESIDENCY_ARM`.

    Raises:
        ValueError: `RESIDENCY_ARM` is not one of the arms.
        UnsupportedUpstream: the installed vLLM-Omni has another class shape.
    """
    arm = os.environ.get(ARM_ENV, "").strip()
    if not arm:
        _log_once("unset", logging.INFO, "residency adapter: %s is unset; vLLM-Omni's own "
                  "allocator-cache policy runs unpatched", ARM_ENV)
        return
    if arm not in ARMS:
        raise ValueError(f"The value for `{ARM_ENV}` must be one of {list(ARMS)}, but {arm!r} "
                         "was passed.")
    try:
        module = importlib.import_module(UPSTREAM_MODULE)
    except ImportError as exc:
        raise UnsupportedUpstream(UPSTREAM_MODULE, upstream_version(),
                                  f"cannot be imported ({type(exc).__name__}: {exc})") from exc
    cls = getattr(module, UPSTREAM_CLASS, None)
    if not (isinstance(cls, type) and SESSION_ATTR in cls.__dict__):
        cls = check_upstream(module)
    decisions = os.environ.get(DECISIONS_DIR_ENV, "").strip()
    if not decisions:
        _log_once("no-dir", logging.WARNING, "residency adapter: %s is unset; arm %r applies "
                  "but no decisions are recorded", DECISIONS_DIR_ENV, arm)
    install(cls, module, arm=arm, decisions_dir=Path(decisions) if decisions else None)


__all__ = ["ARM_ENV", "DECISIONS_DIR_ENV", "UnsupportedUpstream", "check_upstream", "install",
           "register", "upstream_version"]
