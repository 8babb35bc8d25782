"""The policy-what-if notebook: the gate, both policies' grids, the effect estimate and the
`results.json`, rendered from `residency.analysis.whatif` (which prices calls from the evidence)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from residency.analysis import whatif
from residency.evidence import whatif as whatif_effect
from residency.reports import whatif as whatif_report
from residency.rundir.run import Run

__all__ = ["WhatIf", "check_ranges", "policy_whatif", "whatif_results"]


@dataclass(frozen=True, eq=False)
class WhatIf:
    """The what-if of one run: gate, both policies' grids, and the effect of `policy`."""

    gate: pd.DataFrame
    bounded: pd.DataFrame | None
    learned: pd.DataFrame | None
    effect: whatif_effect.EffectEstimate | None
    policy: str

    @property
    def grid(self) -> pd.DataFrame | None:
        """The grid of the chosen policy."""
        return self.bounded if self.policy == "bounded" else self.learned


def check_ranges(cached_range: Any, free_range: Any, policy: Any) -> None:
    """Refuse a bad range or policy with one sentence (`WhatIfError`) before any work."""
    whatif.parse_range(cached_range, name="cached_range")
    whatif.parse_range(free_range, name="free_range")
    if policy not in whatif.POLICIES:
        raise whatif.WhatIfError(f"The value for `policy` must be one of "
                                 f"{list(whatif.POLICIES)}, but {policy!r} was passed.")


def policy_whatif(run: Run, *, cached_range: str, free_range: str, policy: str = "bounded"
                  ) -> WhatIf:
    """Gate first; when it passes, both policies over the grid and the effect of `policy`."""
    gate = whatif.consistency(run)
    if not gate.empty:
        return WhatIf(gate, None, None, None, policy)
    grid = {"cached": cached_range, "free": free_range}
    bounded = whatif.replay_run(run, policy="bounded", **grid)
    learned = whatif.replay_run(run, policy="learned-budget", **grid)
    effect = whatif_effect.estimated_effect(run, bounded if policy == "bounded" else learned)
    return WhatIf(gate, bounded, learned, effect, policy)


def whatif_results(w: WhatIf, *, files: dict[str, str | Path] | None = None,
                   **extra: Any) -> dict[str, Any]:
    """The `results.json` document of the notebook (see `residency.reports.whatif.results`)."""
    if w.bounded is None or w.learned is None or w.effect is None:
        return {"consistency": {"checked": int(w.gate.attrs.get("checked", 0)),
                                "passed": False,
                                "mismatches": w.gate.to_dict(orient="records")}, **extra}
    doc = whatif_report.results(w.gate, w.bounded, w.learned, w.effect,
                         files={k: str(v) for k, v in (files or {}).items()})
    return {**doc, **extra}
