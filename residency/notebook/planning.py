"""The paired-profile notebook's planning cell, run before anything starts: the plan of
`residency.analysis.planning` from the notebook's parameters, as Markdown, shown on the
terminal that started the notebook then (`plan_to_terminal`) and in the report in a section
after the first screen (the report opens with the verdict, issue 40 item 6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from residency.analysis.planning import PlanError, design_statement, make_plan

__all__ = ["plan_markdown", "plan_to_terminal"]


def plan_markdown(params: Mapping[str, Any]) -> str:
    """Markdown: the design this notebook runs and what it can decide, then the plan from
    `plan_pilot` (else a recorded `source`) for costs, `plan_cv` (else `aa_source`, else the
    pilot) for noise, `plan_effect_s` (else the published change) and `plan_budget_hours`;
    when no costs are known, what to pass to get a plan (never an error)."""
    pairs, requests = int(params.get("pairs", 0)), int(params.get("requests", 1))
    seq = bool(params.get("stop_when_decided"))
    head = design_statement("paired-profile", pairs, requests)
    if seq:
        from residency.analysis.sequential import SequentialRule

        head += " " + (SequentialRule.default(pairs).describe() if pairs >= 6 else
                       "stop_when_decided needs pairs >= 6 (the maximum).")
    source = params.get("source")
    pilot = params.get("plan_pilot") or (source if source not in (None, "run") else None)
    try:
        plan = make_plan(pilot=pilot, aa=params.get("aa_source"), cv=params.get("plan_cv"),
                         effect_s=params.get("plan_effect_s"),
                         budget_hours=params.get("plan_budget_hours"),
                         pairs=sorted({3, 6, 10, 15, 20, 30, max(pairs, 1)}),
                         requests=sorted({1, 3, max(requests, 1)}))
    except PlanError as exc:
        return (f"**Design**: {head}\n\n**Plan**: not computed — {exc}. Give `plan_pilot` (a "
                "recorded run of this device, e.g. a short one) and, without an A/A run or a "
                "pilot with 2+ unprofiled runs per arm, `plan_cv`; or run `residency plan`.\n")
    return f"**Design**: {head}\n\n" + "\n".join(plan.lines()) + "\n"


def plan_to_terminal(markdown: str) -> None:
    """Write the plan (`plan_markdown`'s text, emphasis dropped) to the terminal papermill
    was started from, line by line, before the run starts; nothing goes into the notebook."""
    from residency.notebook.progress import to_terminal

    for line in markdown.replace("**", "").splitlines():
        if line.strip():
            to_terminal(line)
