"""Write the four notebooks (run: python notebooks/build.py).

api_reproduction.ipynb, consecutive_requests.ipynb, paired_profile.ipynb and
policy_whatif.ipynb are generated
from the cell lists below, outputs cleared and cell ids fixed, so a regenerated notebook
differs from the committed one only where this file changed. Every computation is a call into
`residency.notebook`; the notebooks hold parameters, prose and display calls.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMETERS_HELP = (
    "Parameters (papermill `-p NAME VALUE`; pass paths with `-r`): `device` is `auto` (a real "
    "NPU, else CUDA, else the emulated NPU), `npu`, `cuda` or `emulated-npu`; `output_dir` is "
    "where `results.json`, tables and figures go (None: a new "
    "`reports/<notebook>/<UTC timestamp>/` under the working directory); `source` is `\"run\"` "
    "to record a fresh run into `output_dir/run`, or a recorded run directory (e.g. "
    "`data/runs/<id>`) to analyse without re-running.")

SERVICE_HELP = (
    " `service` is None for the built-in service, or a service file (TOML) describing an "
    "external one, e.g. vLLM-Omni with residency's adapter (`data/services/`; the CI "
    "stand-in `tests/data/services/standin_2r.toml`): with `source=\"run\"` the run starts "
    "that service per arm (its file sets the device kind and ranks), and decisions are "
    "attributed to requests by the client's wall-clock windows.")

IMPORTS = ("from IPython.display import Markdown, display\n\n"
           "from residency import notebook as nb\n"
           "from residency.reports import views as rv\n")


def _params(**values: object) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in values.items())


def _check(name: str, names: list[str], designs: tuple[str, ...] | None = None) -> str:
    args = [f"designs={designs!r}"] if designs else []
    args += [f"{n}={n}" for n in names]
    call = textwrap.fill(", ".join(args) + ")", width=96, initial_indent="    ",
                         subsequent_indent="    ", break_long_words=False)
    return (f"{IMPORTS}\n"
            f"params = nb.check_parameters(\n{call}\n"
            f'out = nb.prepare_output_dir(output_dir, "{name}")')


API_REPRODUCTION = [
    new_markdown_cell(
        "# API reproduction: which allocator-telemetry query answers on this device\n\n"
        "The retention policy needs allocated and reserved bytes. Before the fix it read them "
        "through `torch.accelerator.memory_reserved/memory_allocated` (the *generic* path) on "
        "every device; on Ascend with torch-npu up to the 2.12 line that raises `Allocator for "
        "npu is not a DeviceAllocator`, so every normal call released the cache. The fix reads "
        "the *registered* device module (`torch.get_device_module(device)`) on NPU.\n\n"
        "Inside a real vLLM-Omni process on Ascend, vllm-ascend's `patch_torch_accelerator.py` "
        "redirects `torch.accelerator.memory_reserved`, `memory_stats`, `empty_cache` and "
        "`get_memory_info` to `torch.npu`; before its PR #12344 it leaves `memory_allocated` "
        "alone, so the generic sequence's first query answers and the second raises.\n\n"
        "This notebook calls both paths (and `mem_get_info`) on the device, in a separate "
        "process, and reports for each query the function that ran (PyTorch's own, a "
        "redirection, or the registered device module) and its outcome: the value, or the "
        "exception type and message. `accelerator_patch` selects the probes: `\"none\"` "
        "(plain PyTorch), `\"vllm-ascend\"` (under vllm-ascend's redirection: on the emulated "
        "NPU the emulated one, on a real NPU the installed vllm-ascend's own patch module, "
        "whatever that version redirects) or `\"both\"`. Whether vllm-ascend is installed, "
        "and whether its patch redirects `memory_allocated`, is **detected, never assumed**; "
        "so is the verdict that the bug is present or absent. With `device=\"auto\"` it also "
        "probes `cpu` for comparison. With a recorded run as `source`, the outcomes are read "
        "from that run's recorded decisions instead (under the run's own patch).\n\n"
        + PARAMETERS_HELP),
    new_code_cell(_params(device="auto", output_dir=None, source="run",
                          accelerator_patch="both"),
                  metadata={"tags": ["parameters"]}),
    new_code_cell(_check("api_reproduction", ["device", "output_dir", "source",
                                              "accelerator_patch"])),
    new_markdown_cell("## Versions"),
    new_code_cell('probes = nb.api_reproduction(params["source"], params["device"],\n'
                  '                             accelerator_patch=params["accelerator_patch"])\n'
                  'rv.show_probe_banner(probes, params["source"])\n'
                  "versions = nb.versions_table(probes)\n"
                  'nb.write_tables(out, {"versions": versions})\n'
                  "rv.show_table(versions)"),
    new_markdown_cell(
        "## Query outcomes\n\n"
        "One row per probe (device kind and accelerator patch), path and query: the function "
        "that ran (`(redirected)` when a patch replaced PyTorch's own), and `ok` with the "
        "value in bytes, or `error` with the exception type and message exactly as raised. A "
        "probe that could not run here (no vllm-ascend installed, a device that is not an "
        "NPU) is one `not probed` row saying why."),
    new_code_cell("outcomes = nb.probe_table(probes)\n"
                  'nb.write_tables(out, {"query_outcomes": outcomes})\n'
                  'column = "value (bytes) or exception"\n'
                  'rv.show_table(outcomes, headers={column: "value or exception"},\n'
                  "              formats={column: rv.bytes_or_text})"),
    new_markdown_cell(
        "## What each arm reads\n\n"
        "`baseline` reads the generic path on every device (the pre-fix code), `candidate` "
        "the registered module on NPU and the generic path elsewhere (the fix), "
        "`always-release` reads nothing and releases on every call (pre-retention). When an "
        "arm's telemetry is unavailable, each of its normal calls releases."),
    new_code_cell("arms = nb.arms_table(probes)\n"
                  'nb.write_tables(out, {"arms": arms})\n'
                  "rv.show_table(arms)"),
    new_markdown_cell("## Verdict"),
    new_code_cell("display(Markdown(nb.verdict_markdown(probes)))\n"
                  'results = nb.finish(out, nb.api_results(probes, source=params["source"],\n'
                  '                                         notebook="api_reproduction", '
                  "parameters=params))"),
]

CONSECUTIVE_REQUESTS = [
    new_markdown_cell(
        "# Consecutive requests: the candidate's normal checks retain, its forced releases "
        "release, in every request\n\n"
        "One candidate service (the fix) answers `requests` consecutive requests after a "
        "warm-up. For every rank and request the table counts the normal checks "
        "(retained / released) and the forced releases. A plot shows each normal check's "
        "memory state against the two bounds: cached-but-unallocated at most 25 % and free at "
        "least 5 % of device capacity.\n\n"
        "**Gates** fail this notebook: any telemetry error or out-of-memory error with the "
        "candidate, or any recorded decision that disagrees with the policy re-evaluated on "
        "its own recorded snapshot (the policy's bounds rule, `residency.policy.cache`; the one "
        "replay gate, `residency.analysis.whatif.consistency`).\n\n" + PARAMETERS_HELP
        + " `ranks`, `requests`, `steps` and `scale` (workload size) set up a fresh run; a "
        "recorded run keeps its own." + SERVICE_HELP),
    new_code_cell(_params(device="auto", output_dir=None, source="run", ranks=2, requests=3,
                          steps=2, scale=1.0, service=None, inject_failure="none",
                          require_exclusive=False),
                  metadata={"tags": ["parameters"]}),
    new_code_cell(_check("consecutive_requests",
                         ["device", "output_dir", "source", "ranks", "requests", "steps",
                          "scale", "service", "inject_failure", "require_exclusive"],
                         designs=("consecutive",))),
    new_markdown_cell("## The run"),
    new_code_cell('run = nb.open_source(params["source"], output_dir=out, design="consecutive",\n'
                  '                     device=params["device"], ranks=params["ranks"], '
                  'steps=params["steps"],\n'
                  '                     requests=params["requests"], scale=params["scale"],\n'
                  '                     service=params["service"],\n'
                  '                     inject_failure=params["inject_failure"],\n'
                  '                     require_exclusive=params["require_exclusive"])\n'
                  "rv.show_banner(run)\n"
                  "display(Markdown(nb.describe_run(run)))"),
    new_markdown_cell(
        "## Normal checks and forced releases per rank and request\n\n"
        "Counts from the per-rank decision logs (warm-up excluded); `oom` from the service's "
        "response (empty when the service does not report it)."),
    new_code_cell("table = nb.consecutive_table(run)\n"
                  'nb.write_tables(out, {"consecutive_requests": table})\n'
                  "summary = nb.consecutive_summary(run, table)\n"
                  "rv.show_table(table)\n"
                  "for key, note in nb.consecutive_notes(summary).items():\n"
                  "    rv.show_note(nb.statistical_note(note, what=nb.ATTRIBUTIONS[key]))"),
    new_markdown_cell(
        "## Memory state at each normal check against the bounds\n\n"
        "Left: cached-but-unallocated bytes (reserved - allocated) over capacity; a normal "
        "check retains while this stays at or under the dashed line. Right: free bytes over "
        "capacity; it retains while this stays at or over the dashed line. Circles retained, "
        "crosses released."),
    new_code_cell("frame = nb.fractions(run)\n"
                  "fig = nb.plot_fractions(frame)\n"
                  'nb.save_figure(fig, out, "fractions")\n'
                  'nb.write_tables(out, {"fractions": frame})\n'
                  "display(fig)"),
    new_markdown_cell("## Gates"),
    new_code_cell("failures = nb.gate_failures(run)\n"
                  'results = nb.finish(out, {**summary, "gate_failures": failures, '
                  '"source": params["source"],\n'
                  '                "run_dir": str(run.path), '
                  '"notebook": "consecutive_requests", "parameters": params})\n'
                  "nb.check_gates(failures)"),
]

sys.path.insert(0, str(HERE.parent))  # this checkout's residency: its defaults
from residency.rundir.layout import PAIRED_DEFAULTS  # noqa: E402

# the main job's defaults, shared with `residency pair`: see README "Defaults and timing"
PAIRED_PAIRS, PAIRED_REQUESTS = PAIRED_DEFAULTS

PAIRED_PROFILE = [
    new_markdown_cell(
        "# Paired profile: the fix (candidate) against the pre-fix telemetry (baseline)"),
    new_code_cell(_params(device="auto", output_dir=None, source="run", ranks=2, steps=50,
                          seed=2101, scale=1.0, pairs=PAIRED_PAIRS, requests=PAIRED_REQUESTS,
                          service=None, aa_source=None, inject_failure="none",
                          stop_when_decided=False, plan_pilot=None, plan_cv=None,
                          plan_effect_s=None, plan_budget_hours=None,
                          require_exclusive=False, compare=None),
                  metadata={"tags": ["parameters"]}),
    new_code_cell(_check("paired_profile",
                         ["device", "output_dir", "source", "ranks", "steps", "seed", "scale",
                          "pairs", "requests", "service", "aa_source", "inject_failure",
                          "stop_when_decided", "plan_pilot", "plan_cv", "plan_effect_s",
                          "plan_budget_hours", "require_exclusive", "compare"],
                         designs=("paired-profile", "profiled-pair", "alternating"))),
    # the plan, before anything starts: on the terminal now, in the report after the verdict
    new_code_cell("plan = nb.plan_markdown(params)\nnb.plan_to_terminal(plan)"),
    new_code_cell('run = nb.open_source(params["source"], output_dir=out, '
                  'design="paired-profile",\n'
                  '                     device=params["device"], ranks=params["ranks"], '
                  'steps=params["steps"],\n'
                  '                     seed=params["seed"], scale=params["scale"], '
                  'pairs=params["pairs"],\n'
                  '                     requests=params["requests"],\n'
                  '                     service=params["service"],\n'
                  '                     inject_failure=params["inject_failure"],\n'
                  '                     stop_when_decided=params["stop_when_decided"],\n'
                  '                     require_exclusive=params["require_exclusive"])\n'
                  "rv.show_banner(run)\n"
                  'ev = nb.paired_profile(run, aa=params["aa_source"])\n'
                  "display(Markdown(nb.first_screen(ev, run)))"),
    new_markdown_cell("## Notes"),
    new_code_cell("display(Markdown(nb.first_screen_notes(ev, run)))"),
    new_markdown_cell(
        "## Timeline of the profiled pair\n\n"
        "The picture the attribution rests on: baseline above candidate, each on its own run's "
        "time axis from the request start. One lane per rank shows device-busy time; shading "
        "across all lanes marks the all-rank no-device-task time (no rank runs a device "
        "task); red marks are normal releases, purple forced ones; the top lane shows the "
        "phases. At the right, the same width around each arm's first normal release: with "
        "the baseline it sits in time every rank spends without device work, with the "
        "candidate it is a telemetry read."),
    new_code_cell("from residency.evidence import reference_pair\n\n"
                  "timeline = rv.write_timeline(run, reference_pair(run), out)"),
    new_markdown_cell(
        "## Memory at each policy call\n\n"
        "Per rank, reserved and allocated bytes at every policy call of the measured requests "
        "(the recorded snapshots) against the bounds: a normal call retains while reserved "
        "stays at or under allocated + 25 % of capacity and free memory at or over 5 %. "
        "Calls without a snapshot (forced calls read no telemetry; the baseline's failed "
        "reads see none) are ticks on the axis."),
    new_code_cell("memory = rv.write_memory(run, out)"),
    new_markdown_cell(
        "## Device memory over time in the profiled pair\n\n"
        "From the traces themselves (torch.profiler's `[memory]` events, torch-npu's "
        "`memory_record.csv`, the emulated NPU's allocator): per rank, the caching "
        "allocator's reserved and allocated bytes after every change, with the release "
        "markers shaded. With the baseline, reserved memory should fall to allocated at each "
        "normal release and be acquired again afterwards; with the candidate it should stay "
        "level through them. The table sums what the releases handed back."),
    new_code_cell("memory_timeline = rv.write_memory_timeline(run, reference_pair(run), out)"),
    new_markdown_cell(
        "## All-rank no-device-task time by cause\n\n"
        "For each arm of the profiled pair, which host range was running while no rank ran a "
        "device task (the innermost range at each instant, so each arm's rows add up to its "
        "all-rank no-device-task time; \"(no host range)\" is time no range covered), and "
        "the difference, the largest changes either way first; a cut table sums the causes "
        "it leaves out in one row, and the total row is each arm's all-rank no-device-task "
        "time. What the fix removes should lead: the "
        "normal release itself and the load that re-acquires what it released "
        "(`residency.load[...]`); loads and phases both arms share stay level."),
    new_code_cell("causes = rv.write_causes(run, reference_pair(run), out)"),
    new_markdown_cell(
        "## What else changed: device tasks, baseline vs candidate\n\n"
        "Count and total time of device tasks per phase and task-name group in the profiled "
        "pair, largest change first, so a reviewer sees whether anything other than the "
        "release moved. One pair of runs: a description, not a test."),
    new_code_cell("diff = rv.write_trace_diff(run, reference_pair(run), out)"),
    new_markdown_cell(
        "## Normal-call duration per rank\n\n"
        "Each rank's median duration per normal policy call in the measured request of the "
        "profiled pair (warm-up excluded): every rank, in this run pair, a description with "
        "no test (ranks of one run are not independent replicates). A normal call releases "
        "when its telemetry read fails or a bound is crossed, else it only reads telemetry."),
    new_code_cell("rv.show_text(nb.release_reason(ev))\n"
                  "table = nb.normal_call_frame(ev)\n"
                  "fig = nb.plot_normal_calls(ev)\n"
                  'nb.write_tables(out, {"normal_calls": table})\n'
                  'nb.save_figure(fig, out, "normal_calls")\n'
                  "rv.show_table(table)\n"
                  "display(fig)\n"
                  'rv.show_note(nb.note(ev, "normal_call_per_rank"))'),
    new_markdown_cell(
        "## Normal-call duration per call, one value per run\n\n"
        "The cross-run comparison takes the run as the unit: one value per run, its median "
        "per call over all its normal calls (every rank, every measured request), with the "
        "range of its calls. Only unprofiled runs (profiled ones when the design has no "
        "others): profiled and unprofiled runs are never pooled."),
    new_code_cell("table = nb.per_run_frame(ev)\n"
                  'nb.write_tables(out, {"normal_calls_per_run": table})\n'
                  "rv.show_table(table)\n"
                  'rv.show_note(nb.note(ev, "normal_call_per_run"))'),
    new_markdown_cell(
        "## Releases\n\n"
        "Normal calls that released the cache, and forced releases (failure paths, VAE "
        "release points) that released, over every measured run of each arm: forced calls "
        "must still release with the candidate."),
    new_code_cell("table = nb.releases_frame(ev)\n"
                  'nb.write_tables(out, {"releases": table})\n'
                  "rv.show_table(table)\n"
                  'for text in nb.notes(ev, ("normal_released", "forced_released")):\n'
                  "    rv.show_note(text)"),
    new_markdown_cell(
        "## Idle attribution\n\n"
        "From the profiled pair's traces: the normal-release markers of all ranks (union) "
        "intersected with all-rank no-device-task time, the all-rank no-device-task time of "
        "the whole trace, and the preparation window (request arrival to the first "
        "denoising step)."),
    new_code_cell("table = nb.idle_frame(ev)\n"
                  "fig = nb.plot_idle(ev)\n"
                  'nb.write_tables(out, {"idle": table})\n'
                  'nb.save_figure(fig, out, "idle")\n'
                  "rv.show_table(table)\n"
                  "display(fig)\n"
                  'for text in nb.notes(ev, ("idle_intersection", "all_rank_idle", '
                  '"preparation_window")):\n'
                  "    rv.show_note(text)"),
    new_markdown_cell(
        "## Client end-to-end time\n\n"
        "Per pair, baseline and candidate. Profiling slows a run down, so the profiled pair "
        "and the unprofiled pairs are compared separately, on one axis from zero; the "
        "unprofiled pairs are numbered 1..K as the notes number them, the profiled pair is "
        "named. The right panel shows each pair's delta "
        "(candidate − baseline) and their median."),
    new_code_cell("table = nb.e2e_frame(ev)\n"
                  'nb.write_tables(out, {"e2e": table})\n'
                  "rv.show_table(table)\n"
                  "profiled, unprofiled = rv.e2e_pairs(ev)\n"
                  "rv.write_e2e(profiled, unprofiled, device_kind=run.device_kind, "
                  "output_dir=out,\n"
                  "             aa_spread=rv.aa_spread(ev), injection=run.injection)\n"
                  'for text in nb.notes(ev, [k for k in ("e2e_profiled", "e2e_unprofiled", '
                  '"e2e_aa") if k in ev]):\n'
                  "    rv.show_note(text)"),
    new_markdown_cell(
        "## Evidence beside the published NPU figures\n\n"
        "For each quantity, this run's value, change and change relative to E2E beside the "
        "published ones (8 x Ascend 910B1) at their published precision. Rows measured on the "
        "full stack (this change with five others) are marked as such: they are context, not "
        "a figure of this change to set beside this run's. The full tables with every "
        "statistical note are `evidence.md` and `published.md` (CSV beside them)."),
    new_code_cell("from residency.reports.side_by_side import side_by_side\n\n"
                  "evidence, published = nb.evidence_tables(ev)\n"
                  'nb.write_tables(out, {"evidence": evidence, "published": published})\n'
                  "table = side_by_side(evidence, published, evidence=ev)\n"
                  "# published figures at their published precision: cells shown as written\n"
                  "rv.show_table(table, formats={c: str for c in table.columns})\n"
                  "display(Markdown(f\"*{evidence.attrs['legend']}*\"))"),
    new_markdown_cell(
        "## Every device side by side\n\n"
        "With `compare` (run folders of any device), this run beside those runs and the "
        "published NPU figures, a column per run: what sets it apart (device kind, failure "
        "injected or not, scale, reserved bytes), then the normal-call cost per call and per "
        "GiB released, the forced-call cost, normal-release markers ∩ all-rank "
        "no-device-task time and the E2E delta with its share of E2E. The figure puts the "
        "normal-call cost per call of every run and device on one log axis. Emulated NPU "
        "columns are host-memory costs, never NPU figures."),
    new_code_cell('cross = None\n'
                  'if params["compare"]:\n'
                  '    table, fig, cross = nb.cross_device(run, params["compare"])\n'
                  '    nb.write_tables(out, {"cross_device": table})\n'
                  '    nb.save_figure(fig, out, "cross_device")\n'
                  "    rv.show_table(table, formats={c: str for c in table.columns})\n"
                  "    display(fig)\n"
                  "    display(Markdown(f\"*{table.attrs['footer']}*\"))\n"
                  "else:\n"
                  '    display(Markdown("No `compare` runs given: pass run folders "\n'
                  "                     '(papermill `-y \"compare: [data/runs/cuda-paired-"
                  "profile-1r50s]\"`) '\n"
                  '                     "to set other devices beside this run."))'),
    new_markdown_cell(
        "## Plan: what this design can decide\n\n"
        "Computed before anything started, and shown then on the terminal papermill ran in. "
        "The design's device time, the power of the exact paired E2E test and the smallest "
        "effect it detects (`residency plan`, README \"Plan within a device budget\"), from "
        "`plan_pilot` (a recorded run: its costs, and its noise unless `aa_source` or "
        "`plan_cv`), the effect `plan_effect_s` (default: the published -0.19 % change) and "
        "`plan_budget_hours`. With `stop_when_decided=True`, `pairs` is the maximum and "
        "pairs are added until E2E is decided under a sequential rule fixed before the "
        "first pair."),
    new_code_cell("display(Markdown(plan))"),
    new_markdown_cell(
        "## Appendix: parameters and the run\n\n" + PARAMETERS_HELP
        + " `ranks`, `steps`, `seed`, `scale`, `pairs` and `requests` (measured requests per "
        "unprofiled run after its warm-up; the run's median is the unit) set up a fresh run; a "
        "recorded run keeps its own. `aa_source` (None or an A/A run directory recorded with "
        "`residency pair --design aa` on the same device kind) adds that run's E2E noise: the "
        "unprofiled E2E delta is then read against the A/A spread. `require_exclusive` "
        "(True): a fresh run refuses to measure while a process other than its own holds a "
        "device. `compare` (None or a list of recorded run folders, any device) adds the "
        "cross-device table and figure." + SERVICE_HELP),
    new_code_cell("display(Markdown(nb.describe_run(run, assignment=False)))\n"
                  'results = nb.finish(out, nb.paired_results(ev, source=params["source"], '
                  'notebook="paired_profile",\n'
                  "                                             parameters=params, "
                  "manifest=run.manifest,\n"
                  "                                             cross_device=cross))"),
]

POLICY_WHATIF = [
    new_markdown_cell(
        "# Policy what-if: other bounds and the learned budget on recorded snapshots\n\n"
        "Every normal policy call of a candidate run recorded the memory snapshot it saw. This "
        "notebook replays those snapshots through the bounded policy over a grid of the two "
        "bounds (cached-but-unallocated at most `max_cached_fraction` of capacity, free at "
        "least `min_free_fraction`) and through the learned-budget variant (cached budget = "
        "min(observed cached peak x 1.25, `max_cached_fraction` x total), vLLM-Omni PR #6629), "
        "after a gate that the run's own bounds reproduce every recorded decision. The counts "
        "are those of the measured requests' recorded memory states (warm-up excluded, as in "
        "every other view; warm-up decisions are replayed first only to carry the learned "
        "budget's peak), not of a re-run: a different decision would have changed later "
        "snapshots.\n\n" + PARAMETERS_HELP
        + " With `source=\"run\"` a small profiled pair is recorded first. "
        "`cached_range`/`free_range` are inclusive `start:stop:step` grids; `policy` is the "
        "policy of the heatmap and of the estimated effect."),
    new_code_cell(_params(device="auto", output_dir=None, source="run",
                          cached_range="0.05:0.5:0.05", free_range="0.01:0.2:0.01",
                          policy="bounded"), metadata={"tags": ["parameters"]}),
    new_code_cell(_check("policy_whatif", ["device", "output_dir", "source"]).replace(
        "as rv\n", "as rv\nfrom residency.reports import whatif as whatif_report\n")
        + "\nnb.check_ranges(cached_range, free_range, policy)"),
    new_markdown_cell("## The run"),
    new_code_cell('run = nb.open_source(params["source"], output_dir=out, design="profiled-pair",\n'
                  '                     device=params["device"], steps=2, scale=0.05, '
                  "resident_mib=64)\n"
                  "rv.show_banner(run)\n"
                  "display(Markdown(nb.describe_run(run)))"),
    new_markdown_cell(
        "## Consistency gate\n\n"
        "Replaying each recorded normal decision with its own recorded bounds must reproduce "
        "its outcome and reason (the policy's own bounds rule, `residency.policy.cache`); "
        "otherwise the what-if counts below would not be trustworthy, and the notebook stops."),
    new_code_cell("w = nb.policy_whatif(run, cached_range=cached_range, free_range=free_range, "
                  "policy=policy)\n"
                  'print("\\n".join(whatif_report.gate_lines(w.gate)))\n'
                  "if not w.gate.empty:\n"
                  '    raise nb.GateError(["The replay does not reproduce the recorded "\n'
                  '                        "decisions: see the mismatches above."])'),
    new_markdown_cell(
        "## Retention over the two bounds, and the learned budget\n\n"
        "Left: retention rate (retained / replayed normal calls of the measured requests) of "
        "the chosen policy over the grid; the run's own bounds are outlined in red. Right: "
        "retention rate against the cached bound (for the learned budget: its cap) at the "
        "run's own free floor, bounded and learned-budget side by side."),
    new_code_cell("fig = nb.whatif_figure(w.bounded, w.learned, heatmap=policy)\n"
                  'figure = rv.show_figure(fig, out, "retention")\n'
                  "grid_csv = rv.write_whatif([w.bounded, w.learned], output_dir=out, "
                  "policy=policy)\n"
                  'rv.show_text(nb.whatif_results(w)["note"])'),
    new_markdown_cell(
        "## Estimated effect (a model, not a measurement)\n\n"
        "Predicted releases and retained checks of the measured requests, priced with the "
        "per-call costs this run measured (baseline-arm releases, candidate-arm retained "
        "checks: the evidence's per-call durations). The note under the table says what the "
        "model leaves out."),
    new_code_cell("effect_csv = rv.write_effect(w.effect.table, output_dir=out)\n"
                  "rv.show_text(w.effect.note)\n"
                  'files = {"figure": figure, "grid": grid_csv, "effect": effect_csv}\n'
                  'results = nb.finish(out, nb.whatif_results(w, files=files, '
                  'source=params["source"],\n'
                  '                                           notebook="policy_whatif", '
                  "parameters=params))"),
]

NOTEBOOKS = {
    "api_reproduction": API_REPRODUCTION,
    "consecutive_requests": CONSECUTIVE_REQUESTS,
    "paired_profile": PAIRED_PROFILE,
    "policy_whatif": POLICY_WHATIF,
}


def build(name: str, cells: list) -> nbformat.NotebookNode:
    """The notebook `name`: cells with fixed ids, no outputs, the python3 kernel."""
    for i, cell in enumerate(cells):
        cell["id"] = f"{name}-{i:02d}"[-64:]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "title": name.replace("_", " "),
    })
    nbformat.validate(nb)
    return nb


def main(argv: list[str] | None = None) -> int:
    """Write every notebook beside this file, or into the folder given as the argument."""
    out = Path(argv[0]) if argv else HERE
    for name, cells in NOTEBOOKS.items():
        path = out / f"{name}.ipynb"
        nbformat.write(build(name, cells), path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
