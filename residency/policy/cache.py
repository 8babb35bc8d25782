"""The allocator cache-retention policy, its arms, and the decisions it records."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from residency import markers
from residency.policy.telemetry import (
    GenericTelemetry,
    MemorySnapshot,
    Telemetry,
    TelemetryUnavailable,
    as_device,
    telemetry_for,
)
from residency.records.decisions import DecisionsWriter

Kind = Literal["normal", "forced"]
Outcome = Literal["retained", "released"]
Reason = Literal[
    "within-bounds", "cached-bound", "free-bound", "telemetry-unavailable", "forced",
    "always-release",
]
# The arms: this module owns their names; every other module uses these constants.
CANDIDATE = "candidate"  # the fix: the device's own telemetry bounds what stays cached
BASELINE = "baseline"  # pre-fix: generic telemetry on every device
ALWAYS_RELEASE = "always-release"  # pre-retention: release on every call (also its reason)
ARMS = (CANDIDATE, BASELINE, ALWAYS_RELEASE)  # every arm of the policy
PAIRED_ARMS = (BASELINE, CANDIDATE)  # the two arms a paired run compares, in run order
DEFAULT_MAX_CACHED_FRACTION = 0.25  # cached-but-unallocated at most this share of capacity
DEFAULT_MIN_FREE_FRACTION = 0.05  # physically free at least this share of capacity


@dataclass(frozen=True)
class Decision:
    """One policy call: what it saw, what it did, and when (monotonic ns + wall anchor)."""

    kind: Kind
    outcome: Outcome
    reason: Reason
    snapshot: MemorySnapshot | None
    error: str | None
    start_ns: int
    end_ns: int
    wall_ns: int
    rank: int
    max_cached_fraction: float
    min_free_fraction: float
    arm: str | None = None
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def released(self) -> bool:
        """True when the call released the allocator cache."""
        return self.outcome == "released"

    @property
    def duration_ns(self) -> int:
        """Call duration, monotonic nanoseconds."""
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict[str, Any]:
        """The decisions-JSONL record (see docs/contracts.md)."""
        return {
            "rank": self.rank,
            **self.context,
            "arm": self.arm,
            "kind": self.kind,
            "outcome": self.outcome,
            "reason": self.reason,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "wall_ns": self.wall_ns,
            "snapshot": None if self.snapshot is None else self.snapshot.to_dict(),
            "error": self.error,
            "max_cached_fraction": self.max_cached_fraction,
            "min_free_fraction": self.min_free_fraction,
        }


class Recorder(Protocol):
    """Anything that keeps decisions."""

    def record(self, decision: Decision) -> None: ...


class ListRecorder:
    """Keeps decisions in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def record(self, decision: Decision) -> None:
        self.decisions.append(decision)


class JsonlRecorder:
    """Appends one JSON object per decision to a decisions file, flushed per line (the
    format: `residency.records.decisions`, which writes it).

    `context` (e.g. `request_id`, `device_kind`) is merged into every line; change it
    with `set_context` between requests.
    """

    def __init__(self, path: str | os.PathLike[str], **context: Any) -> None:
        self._writer = DecisionsWriter(path)
        self.path = self._writer.path
        self.context: dict[str, Any] = dict(context)

    def set_context(self, **context: Any) -> None:
        self.context.update(context)

    def record(self, decision: Decision) -> None:
        self._writer.write({**decision.to_dict(), **self.context})

    def close(self) -> None:
        self._writer.close()


def limit_bytes(total: Any, fraction: Any) -> Any:
    """int(total * fraction): a byte limit as the policy compares it. Works on Python numbers
    and elementwise on numpy arrays (truncated toward zero, int64) alike."""
    product = total * fraction
    return product.astype("int64") if hasattr(product, "astype") else int(product)


def crossed_bounds(cached: Any, free: Any, total: Any, max_cached_fraction: Any,
                   min_free_fraction: Any, *, cached_limit: Any = None) -> tuple[Any, Any]:
    """The bounds rule, the only copy: (cached over its limit, free under its floor).

    Scalars or numpy arrays (broadcast). `cached_limit` replaces int(total *
    max_cached_fraction) when a variant (the learned budget) tightens it.
    """
    limit = limit_bytes(total, max_cached_fraction) if cached_limit is None else cached_limit
    return cached > limit, free < limit_bytes(total, min_free_fraction)


def retains(snapshot: MemorySnapshot, max_cached_fraction: float, min_free_fraction: float
            ) -> Reason:
    """The bounded decision on one snapshot: within-bounds, cached-bound or free-bound (the
    cached bound is checked first)."""
    over, under = crossed_bounds(snapshot.cached, snapshot.free, snapshot.total,
                                 max_cached_fraction, min_free_fraction)
    if over:
        return "cached-bound"
    if under:
        return "free-bound"
    return "within-bounds"


def _telemetry_error(telemetry: Any, exc: Exception) -> str:
    """The recorded error: `<source> telemetry unavailable: <type>: <message>`."""
    if isinstance(exc, TelemetryUnavailable):
        return str(exc)
    source = getattr(telemetry, "name", None) or type(telemetry).__name__
    return str(TelemetryUnavailable.wrap(str(source), exc))


def _check_fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"The value for `{name}` must be a fraction in [0, 1], but {value!r} "
                         "was passed.")
    return float(value)


def default_rank() -> int:
    """This process's rank: torch.distributed when initialised, else `RANK`, else
    `LOCAL_RANK`, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 - a rank is a label; fall back to the environment
        pass
    for name in ("RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return 0


class BoundedAllocatorCache:
    """Keeps the allocator cache after an offload while cached <= 25 % and free >= 5 % of total.

    `release_if_needed()` is a normal call; `release_if_needed(force=True)` always releases
    without reading telemetry; a telemetry failure releases.
    """

    def __init__(
        self,
        device: Any,
        *,
        max_cached_fraction: float = DEFAULT_MAX_CACHED_FRACTION,
        min_free_fraction: float = DEFAULT_MIN_FREE_FRACTION,
        telemetry: Telemetry | None = None,
        release: Callable[[], None] | None = None,
        recorder: Recorder | None = None,
        rank: int | None = None,
        arm: str | None = None,
        always_release: bool = False,
    ) -> None:
        self.device = as_device(device)
        self.max_cached_fraction = _check_fraction("max_cached_fraction", max_cached_fraction)
        self.min_free_fraction = _check_fraction("min_free_fraction", min_free_fraction)
        self.telemetry = telemetry if telemetry is not None else telemetry_for(self.device)
        self._release = release
        self.recorder = recorder
        self.rank = default_rank() if rank is None else rank
        self.arm = arm
        self.always_release = always_release
        self.last_decision: Decision | None = None

    def release(self) -> None:
        """Return the allocator's cached blocks to the device."""
        if self._release is not None:
            self._release()
            return
        import torch

        torch.get_device_module(self.device).empty_cache()

    def release_if_needed(self, *, force: bool = False) -> bool:
        """Release the cache unless a normal call finds both bounds held; True if released."""
        kind: Kind = "forced" if force else "normal"
        name = markers.RELEASE_FORCED if force else markers.RELEASE_NORMAL
        wall_ns = time.time_ns()
        start_ns = time.perf_counter_ns()
        snapshot: MemorySnapshot | None = None
        error: str | None = None
        with markers.span(name):
            if force:
                reason: Reason = "forced"
            elif self.always_release:
                reason = ALWAYS_RELEASE
            else:
                try:
                    snapshot = self.telemetry.snapshot(self.device)
                    reason = retains(snapshot, self.max_cached_fraction, self.min_free_fraction)
                except Exception as exc:  # noqa: BLE001 - the contract: any telemetry failure
                    # releases; a third-party telemetry may raise anything
                    snapshot = None
                    reason, error = "telemetry-unavailable", _telemetry_error(self.telemetry, exc)
            released = reason != "within-bounds"
            if released:
                self.release()
        decision = Decision(
            kind=kind, outcome="released" if released else "retained", reason=reason,
            snapshot=snapshot, error=error, start_ns=start_ns, end_ns=time.perf_counter_ns(),
            wall_ns=wall_ns, rank=self.rank, max_cached_fraction=self.max_cached_fraction,
            min_free_fraction=self.min_free_fraction, arm=self.arm,
        )
        self.last_decision = decision
        if self.recorder is not None:
            self.recorder.record(decision)
        return released

    def __repr__(self) -> str:
        return (f"BoundedAllocatorCache(device={self.device}, arm={self.arm!r}, "
                f"max_cached_fraction={self.max_cached_fraction}, "
                f"min_free_fraction={self.min_free_fraction}, telemetry={self.telemetry!r})")


def policy_for(arm: str, device: Any, **kw: Any) -> BoundedAllocatorCache:
    """The policy of an arm: `candidate` (the fix), `baseline` (pre-fix generic telemetry on
    every device) or `always-release` (pre-retention: release on every call)."""
    if arm == CANDIDATE:
        return BoundedAllocatorCache(device, arm=arm, **kw)
    if arm == BASELINE:
        kw.setdefault("telemetry", GenericTelemetry())
        return BoundedAllocatorCache(device, arm=arm, **kw)
    if arm == ALWAYS_RELEASE:
        return BoundedAllocatorCache(device, arm=arm, always_release=True, **kw)
    raise ValueError(f"The value for `arm` must be one of {list(ARMS)}, but {arm!r} was passed.")


__all__ = [
    "ALWAYS_RELEASE", "ARMS", "BASELINE", "CANDIDATE",
    "DEFAULT_MAX_CACHED_FRACTION", "DEFAULT_MIN_FREE_FRACTION", "PAIRED_ARMS",
    "BoundedAllocatorCache", "Decision", "JsonlRecorder", "ListRecorder",
    "crossed_bounds", "limit_bytes", "policy_for", "retains",
]
