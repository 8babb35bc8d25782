"""The evidence of a run directory: every attribution the suite makes, computed once.

`build(run)` loads a run's decisions and client records once (`RunData`), then calls each
registered attributor; the result is one immutable `Evidence` holding `Attribution`s, each
with its values, unit, n, the statistical unit it was judged on, its scope (which runs,
warm-up excluded or not), the statistics result and a note. `residency.reports.tables`, every
notebook, `results.json` and the what-if effect model only render it, so they agree by
construction.

Scope rule: warm-up requests are excluded from every attribution unless its `scope` says
otherwise (the replay gate replays warm-up decisions too, and says so).

Adding an attribution is one function:

    @attributor("my_key")
    def _my_key(data: RunData) -> Attribution | None: ...

`decisions_by_request` is the one place where decisions are assigned to runs and requests (and
marked warm-up or measured). No torch here.
"""

from __future__ import annotations

from residency.evidence.attributions import (
    ATTRIBUTORS,
    REQUEST_COLUMNS,
    RESPONSE_SOURCE,
    TRACE_SOURCE,
    attributor,
    build,
)
from residency.evidence.model import PAIRED_ARMS, Attribution, Evidence, Scope
from residency.evidence.runs import (
    NORMAL_MARKER,
    PREPARE_MARKER,
    RunData,
    decisions_by_request,
    idle_from_traces,
    measured_requests,
    reference_pair,
    service_of,
)

__all__ = ["PAIRED_ARMS", "ATTRIBUTORS", "NORMAL_MARKER", "PREPARE_MARKER", "REQUEST_COLUMNS",
           "RESPONSE_SOURCE", "TRACE_SOURCE", "Attribution", "Evidence", "RunData", "Scope",
           "attributor", "build", "decisions_by_request", "idle_from_traces", "measured_requests",
           "reference_pair", "service_of"]
