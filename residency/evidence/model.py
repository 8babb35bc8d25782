"""The evidence model: `Attribution` (one attribution's numbers, unit, n, statistical unit,
scope and note), `Scope`, and `Evidence` (every attribution of one run). Immutable."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from residency import devices
from residency.evidence import notes
from residency.jsonio import plain
from residency.policy.cache import BASELINE, CANDIDATE, PAIRED_ARMS

__all__ = ["PAIRED_ARMS", "Attribution", "Evidence", "Scope", "plain"]


@dataclass(frozen=True)
class Scope:
    """Which data an attribution used: run names, and whether warm-up requests count."""

    runs: tuple[str, ...]
    warmup: bool = False
    what: str = ""  # e.g. "profiled pair", "all measured runs"

    def describe(self) -> str:
        """e.g. `profiled pair 00-baseline, 01-candidate; measured requests (warm-up
        excluded)`."""
        req = ("warm-up and measured requests (warm-up included)" if self.warmup else
               "measured requests (warm-up excluded)")
        what = f"{self.what} " if self.what else ""
        return f"{what}{', '.join(self.runs) or 'no runs'}; {req}"


def _freeze(value: Any) -> Any:
    """A read-only deep copy: mappings become MappingProxyType, lists and tuples tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Attribution:
    """One attribution: values per arm in `unit`, judged on `judged_on`, over `scope`.

    `kind` says its shape: `description` (every rank of one run pair, no test), `groups`
    (one value per run, Mann-Whitney), `pairs` (paired E2E, sign-flip), `counts` (k of n
    calls, Clopper-Pearson), `tally` (plain counts), `single` (one value per arm), `samples`
    (per-call values, no test), `gate` (pass/fail checks). `values[arm]` holds the numbers
    (for `counts`: (k,) with `n[arm]` calls); `labels[arm]` names each value (rank, run or
    pair). `result` is the `residency.analysis.stats` result, if a test or interval applies.
    """

    key: str
    metric: str
    kind: str
    unit: str
    values: Mapping[str, tuple[Any, ...]]
    n: Mapping[str, int]
    judged_on: str
    scope: Scope
    note: str
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    result: Any = None
    source: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("values", "n", "labels", "detail"):
            object.__setattr__(self, name, _freeze(getattr(self, name)))

    @property
    def p_value(self) -> float | None:
        """The test's two-sided p, when a test applies."""
        return getattr(self.result, "p_value", None) if self.result is not None and \
            not isinstance(self.result, Mapping) else None

    def shares(self) -> dict[str, float]:
        """`counts`: each arm's share of its calls, k / n (an arm without calls left out)."""
        return {arm: self.values[arm][0] / self.n[arm] for arm in PAIRED_ARMS
                if self.n.get(arm)}

    def share_change_pp(self) -> float:
        """`counts`: the candidate's share minus the baseline's, in percentage points."""
        k = {arm: self.values[arm][0] for arm in PAIRED_ARMS}
        return 100 * (k[CANDIDATE] / self.n[CANDIDATE] - k[BASELINE] / self.n[BASELINE])

    def median_ratio(self) -> float | None:
        """`description`: the candidate's median over ranks / the baseline's (None when the
        baseline's is 0)."""
        med = self.detail["medians"]
        return med[CANDIDATE] / med[BASELINE] if med[BASELINE] else None

    def slot_medians(self) -> dict[str, float]:
        """`aa` (A/A noise): the median of each slot's values, slot "A" and slot "B"."""
        return {slot: float(np.median(self.values[slot])) for slot in ("A", "B")}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, the stats result as its record with its note
        (`residency.evidence.notes.record`)."""
        res = self.result
        if isinstance(res, Mapping):
            res = {k: notes.record(v) for k, v in res.items()}
        elif res is not None:
            res = notes.record(res)
        return {"key": self.key, "metric": self.metric, "kind": self.kind, "unit": self.unit,
                "values": {a: list(v) for a, v in self.values.items()},
                "labels": {a: list(v) for a, v in self.labels.items()},
                "n": dict(self.n), "judged_on": self.judged_on,
                "scope": {"runs": list(self.scope.runs), "warmup": self.scope.warmup,
                          "what": self.scope.what, "text": self.scope.describe()},
                "p_value": self.p_value, "result": res, "source": self.source,
                "note": self.note, "detail": plain(self.detail)}


@dataclass(frozen=True)
class Evidence:
    """Every attribution of one run directory (see the module docstring)."""

    run_dir: Path
    device_kind: str
    design: str | None
    status: str
    reference_pair: tuple[str, str] | None  # run names of the profiled (reference) pair
    attributions: tuple[Attribution, ...]
    idle_error: str | None = None
    digest: str | None = None  # the run's seal digest (`sha256:...`), None when unsealed
    assignment_note: str = "Warm-up requests excluded."
    """How decisions were assigned to requests (by time or id), that warm-ups are excluded,
    and how many decisions lay outside every request (`residency.rundir.assignment.scope_note`);
    JSON key `attribution_note`."""
    request_assignment: tuple[Mapping[str, Any], ...] = ()
    """Per service run: `run`, `method`, `outside_count`, `outside_first_wall_ns`,
    `outside_last_wall_ns`, `startup_count`, `warmup_by_kind`, `id_mismatch_count` (decisions
    inside a window that carry another request's id), `note`; JSON key `request_attribution`."""
    service: Mapping[str, Any] = field(default_factory=dict)
    """Which service ran: `kind` (builtin|external), `name`, `file`, `command`, `versions`
    (what it reported), `expect` (the manifest's `service_info`)."""
    injection: str = "none"
    """The failure injected into the baseline (`--inject-failure`), "none" when none."""

    @property
    def name(self) -> str:
        """The run directory's name (", INCOMPLETE run" appended when not complete)."""
        return self.run_dir.name + ("" if self.status == "complete" else ", INCOMPLETE run")

    @property
    def label(self) -> str:
        """The device kind's label, saying an injected failure (`residency.devices.label`)."""
        return devices.label(self.device_kind, self.injection)

    def keys(self) -> tuple[str, ...]:
        """Keys of the attributions present, in order."""
        return tuple(a.key for a in self.attributions)

    def get(self, key: str) -> Attribution | None:
        """The attribution `key`, or None when the run has no data for it."""
        return next((a for a in self.attributions if a.key == key), None)

    def __getitem__(self, key: str) -> Attribution:
        found = self.get(key)
        if found is None:
            raise KeyError(f"no attribution {key!r} in {self.run_dir.name} (present: "
                           f"{', '.join(self.keys()) or 'none'})")
        return found

    def __contains__(self, key: object) -> bool:
        return any(a.key == key for a in self.attributions)

    def __iter__(self) -> Iterator[Attribution]:
        return iter(self.attributions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: run, device kind, reference pair and every attribution by key."""
        return {"run_dir": str(self.run_dir), "device_kind": self.device_kind,
                "device_label": self.label, "inject_failure": self.injection,
                "design": self.design, "status": self.status,
                "reference_pair": list(self.reference_pair) if self.reference_pair else None,
                "idle_error": self.idle_error, "service": plain(dict(self.service)),
                "attribution_note": self.assignment_note,
                "request_attribution": [dict(r) for r in self.request_assignment],
                "attributions": {a.key: a.to_dict() for a in self.attributions}}

    def __repr__(self) -> str:
        return (f"<Evidence {self.run_dir.name} ({self.device_kind}): "
                f"{', '.join(self.keys())}>")
