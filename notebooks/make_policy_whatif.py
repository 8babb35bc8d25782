"""Write notebooks/policy_whatif.ipynb (run: python notebooks/make_policy_whatif.py).

The notebook stays thin: every computation is a call into `residency.whatif`; parameters,
output folder and source go through `residency.notebook` like the other notebooks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

CELLS = [
    new_markdown_cell(
        "# Policy what-if: other bounds and the learned budget on recorded snapshots\n\n"
        "Every normal policy call of a candidate run recorded the memory snapshot it saw. This "
        "notebook replays those snapshots through the bounded policy over a grid of the two "
        "bounds (cached-but-unallocated at most `max_cached_fraction` of capacity, free at "
        "least `min_free_fraction`) and through the learned-budget variant (cached budget = "
        "min(observed cached peak x 1.25, `max_cached_fraction` x total), vLLM-Omni PR #6629), "
        "after a gate that the run's own bounds reproduce every recorded decision. The counts "
        "are those of the recorded memory states, not of a re-run: a different decision would "
        "have changed later snapshots.\n\n"
        "Parameters (papermill `-p NAME VALUE`; pass paths with `-r`): `device` is `auto`, "
        "`npu`, `cuda` or `emulated-npu` (used only for a fresh run); `output_dir` is where "
        "`results.json` and the figure go (None: a new `reports/policy_whatif/<UTC timestamp>/`"
        " under the working directory); `source` is a recorded run directory (e.g. "
        "`data/runs/<id>`) to analyse without re-running, or `\"run\"` to record a fresh small "
        "profiled pair into `output_dir/run` first; "
        "`cached_range`/`free_range` are inclusive `start:stop:step` grids; `policy` is the "
        "policy of the heatmap and of the estimated effect."),
    new_code_cell(
        'device = "auto"\n'
        "output_dir = None\n"
        'source = "run"\n'
        'cached_range = "0.05:0.5:0.05"\n'
        'free_range = "0.01:0.2:0.01"\n'
        'policy = "bounded"',
        metadata={"tags": ["parameters"]}),
    new_code_cell(
        "import json\n\n"
        "from IPython.display import Markdown, display\n\n"
        "from residency import notebook as nb\n"
        "from residency import whatif\n\n"
        "params = nb.check_parameters(device=device, output_dir=output_dir, source=source)\n"
        'out = nb.prepare_output_dir(output_dir, "policy_whatif")\n'
        "whatif.parse_range(cached_range, name=\"cached_range\")  # bad input fails here\n"
        "whatif.parse_range(free_range, name=\"free_range\")\n"
        "grid_args = dict(cached=cached_range, free=free_range)\n"
        'run = nb.open_source(params["source"], output_dir=out, design="profiled-pair",\n'
        '                     device=params["device"], steps=2, scale=0.05, resident_mib=64)\n'
        'print(f"run {run.path} (device kind {run.device_kind}); outputs in {out}")'),
    new_markdown_cell(
        "## Device kind\n\n"
        "The device kind of the run is stated below. A run of kind `emulated-npu` was "
        "recorded on host memory standing in for an NPU: its retention rates and costs "
        "describe that emulation and are not NPU figures."),
    new_code_cell("display(Markdown(whatif.device_note(run.device_kind)))"),
    new_markdown_cell(
        "## Consistency gate\n\n"
        "Replaying each recorded normal decision with its own recorded bounds must reproduce "
        "its outcome and reason; otherwise the what-if counts below would not be "
        "trustworthy, and the notebook stops."),
    new_code_cell(
        "gate = whatif.consistency(run)\n"
        'print("\\n".join(whatif.gate_lines(gate)))\n'
        'assert gate.empty, "consistency gate failed: see the mismatches above"'),
    new_markdown_cell(
        "## Retention over the two bounds, and the learned budget\n\n"
        "Left: retention rate (retained / replayed normal calls) of the chosen policy over the "
        "grid; the run's own bounds are outlined in red. Right: retention rate against the "
        "cached bound (for the learned budget: its cap) at the run's own free floor, bounded "
        "and learned-budget side by side."),
    new_code_cell(
        'bounded = whatif.replay_run(run, policy="bounded", **grid_args)\n'
        'learned = whatif.replay_run(run, policy="learned-budget", **grid_args)\n'
        "fig = whatif.figure(bounded, learned, heatmap=policy)\n"
        'fig.savefig(out / "retention.png", dpi=120, bbox_inches="tight")'),
    new_code_cell(
        'grid = bounded if policy == "bounded" else learned\n'
        'display(Markdown("\\n".join(whatif.totals_lines(grid))))'),
    new_markdown_cell(
        "## Estimated effect (a model, not a measurement)\n\n"
        "Predicted releases and retained checks of the measured requests, priced with the "
        "per-call costs this run measured (baseline-arm releases, candidate-arm retained "
        "checks). The note under the table says what the model leaves out."),
    new_code_cell(
        "effect = whatif.estimated_effect(run, grid)\n"
        'display(Markdown("\\n".join(whatif.effect_lines(effect))))'),
    new_code_cell(
        "doc = whatif.results(gate, bounded, learned, effect,\n"
        '                     files={"figure": str(out / "retention.png")})\n'
        '(out / "results.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))\n'
        'print(f"results.json and retention.png written to {out}")'),
]


def build() -> nbformat.NotebookNode:
    """The notebook object."""
    nb = new_notebook(cells=CELLS)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


if __name__ == "__main__":
    path = HERE / "policy_whatif.ipynb"
    nb = build()
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"cell-{i:02d}"
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(path)
