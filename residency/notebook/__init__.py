"""Support for the four notebooks (`notebooks/`), split by notebook: `params` (parameter
checks, the run to analyse), `outputs` (output folder, `results.json`, tables, figures),
`api` (API reproduction), `consecutive` (consecutive requests and their gates), `paired`
(paired profile) and `whatif` (policy what-if). Every figure lives in `residency.reports.figures`;
every attribution in `residency.evidence`. Notebooks use `from residency import notebook as
nb`: every public name of the submodules is available here.

No torch and no workload at import: a notebook kernel must stay free of the emulated NPU's
process-global backend registration, so `probe` runs `residency probe` in a subprocess and
fresh runs start their services as subprocesses.
"""

from __future__ import annotations

from residency.evidence import PAIRED_ARMS
from residency.humanize import markdown_table_in_full
from residency.notebook.api import (
    api_from_run,
    api_reproduction,
    api_results,
    arms_table,
    probe,
    probe_table,
    row_label,
    verdict_markdown,
    versions_table,
)
from residency.notebook.consecutive import (
    check_gates,
    consecutive_notes,
    consecutive_summary,
    consecutive_table,
    fractions,
    gate_failures,
)
from residency.notebook.outputs import (
    RESULTS_FILE,
    describe_run,
    describe_service,
    finish,
    prepare_output_dir,
    save_figure,
    statistical_note,
    write_results,
    write_tables,
)
from residency.notebook.paired import (
    ATTRIBUTIONS,
    PER_RUN_COLUMNS,
    cross_device,
    e2e_frame,
    evidence_tables,
    first_screen,
    first_screen_notes,
    headline,
    normal_call_frame,
    note,
    notes,
    paired_profile,
    paired_results,
    per_run_frame,
    release_reason,
    releases_frame,
)
from residency.notebook.params import (
    ACCELERATOR_PATCH_CHOICES,
    DEVICE_SPECS,
    NOTEBOOKS,
    GateError,
    ParameterError,
    check_parameters,
    open_source,
)
from residency.notebook.planning import plan_markdown, plan_to_terminal
from residency.notebook.whatif import WhatIf, check_ranges, policy_whatif, whatif_results
from residency.reports.figures import (
    idle_frame,
    plot_fractions,
    plot_idle,
    plot_normal_calls,
    whatif_figure,
)

__all__ = [
    "ACCELERATOR_PATCH_CHOICES", "PAIRED_ARMS", "ATTRIBUTIONS", "DEVICE_SPECS",
    "NOTEBOOKS", "PER_RUN_COLUMNS", "RESULTS_FILE",
    "GateError", "ParameterError", "WhatIf", "api_from_run", "api_reproduction", "api_results",
    "arms_table", "check_gates", "check_parameters", "check_ranges", "consecutive_notes",
    "consecutive_summary", "consecutive_table", "cross_device", "describe_run", "describe_service",
    "e2e_frame",
    "evidence_tables", "finish", "first_screen", "first_screen_notes", "fractions",
    "gate_failures", "headline", "idle_frame",
    "markdown_table_in_full", "normal_call_frame", "note", "notes", "open_source", "paired_profile",
    "paired_results", "per_run_frame", "plan_markdown", "plan_to_terminal", "plot_fractions",
    "plot_idle",
    "plot_normal_calls", "policy_whatif", "prepare_output_dir", "probe", "probe_table",
    "release_reason", "releases_frame", "row_label", "save_figure", "statistical_note",
    "verdict_markdown",
    "versions_table", "whatif_figure", "whatif_results", "write_results", "write_tables",
]
