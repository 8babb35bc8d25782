"""The planner's arithmetic on known cases: the published costs, the fewest pairs that can
reach p < 0.05, a run recorded without costs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from residency.analysis import planning as pl
from tests.helpers import ROOT

RUNS = ROOT / "data" / "runs"


def test_published_costs_of_the_default_design_are_about_80_hours() -> None:
    costs = pl.published_costs()
    assert costs.request_s == pytest.approx(2248.795837)
    assert costs.warmup_s == costs.request_s and costs.start_s == 300.0
    # 1 profiled pair + 10 pairs x 5 requests: 22 starts, 22 warm-ups, 2 + 100 requests
    expected = 22 * 300.0 + (22 + 2 + 100) * 2248.795837
    assert costs.design_s(10, 5) == pytest.approx(expected)
    assert expected / 3600 == pytest.approx(79.29, abs=0.01)


def test_published_effect_is_minus_4_31_s() -> None:
    effect, source = pl.published_effect(2248.795837)
    assert effect == pytest.approx(2244.482967 - 2248.795837)
    assert "published" in source


def test_six_pairs_all_one_direction_is_the_smallest_design_reaching_p_below_5_percent() -> None:
    assert pl.min_pairs_for() == 6
    noise = pl.Noise(run_cv=0.001)
    plan = pl.plan_designs(pl.published_costs(), noise, effect_s=-1000.0, pairs=(3, 5, 6),
                           requests=(1,), simulations=200)
    by_pairs = {r.pairs: r for r in plan.rows}
    assert by_pairs[5].power == 0.0 and by_pairs[5].mde_s is None
    assert by_pairs[6].power == 1.0  # an effect far beyond the noise: all six in one direction
    assert plan.recommended is not None and plan.recommended.pairs == 6


def test_out_of_budget_says_so_and_what_the_budget_supports() -> None:
    plan = pl.make_plan(published=True, cv=0.0025, budget_hours=48, simulations=500)
    text = "\n".join(plan.lines())
    assert plan.recommended is None
    assert "The E2E claim is out of the budget (budget 48 h)" in text
    assert "release durations per rank" in text and "Within the budget" in text


def test_a_manifest_without_costs_plans_from_typed_costs() -> None:
    run = RUNS / "emulated-paired-profile-2r50s"  # recorded before costs were
    with pytest.raises(pl.PlanError, match="--start-s"):
        pl.make_plan(pilot=run, cv=0.01, simulations=200)
    plan = pl.make_plan(pilot=run, start_s=3.0, cv=0.01, simulations=200)
    assert plan.costs.start_s == 3.0 and plan.costs.warmup_s > 0 and plan.costs.request_s > 0
    assert "start typed" in plan.costs.source and "request recorded" in plan.costs.source


def test_noise_from_an_aa_run() -> None:
    from residency.rundir.run import load_run

    noise = pl.noise_from_run(load_run(RUNS / "emulated-aa-2r50s"))
    assert 0 < noise.run_cv < 0.1 and noise.request_cv == 0.0


def test_plan_cli_prints_the_table_and_a_recommendation() -> None:
    proc = subprocess.run([sys.executable, "-m", "residency", "plan", "--published", "--cv",
                           "0.0025", "--pairs", "6,40", "--requests", "1",
                           "--simulations", "300"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "| 40 x 1 | 82 |" in proc.stdout and "Recommended: 40 pairs" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "residency", "plan", "--cv", "0.01"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("residency plan: error: costs:")


def test_cli_and_notebook_defaults_agree() -> None:
    import nbformat

    from residency.rundir.layout import PAIRED_DEFAULTS

    nb = nbformat.read(ROOT / "notebooks" / "paired_profile.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values: dict = {}
    exec(cell.source, values)  # noqa: S102 - the notebook's own parameter cell
    assert (values["pairs"], values["requests"]) == PAIRED_DEFAULTS == (10, 5)
    from residency.cli.main import create_parser, pair_design

    args = create_parser("pair").parse_args(["pair", "--design", "paired-profile", "--out",
                                             "x"])
    assert pair_design(args)[:2] == PAIRED_DEFAULTS


def test_the_plan_runs_first_but_reads_after_the_verdict(capsys) -> None:
    """The planning cell runs before the run starts and writes the plan to the terminal only;
    the report shows it in its own section after the first screen (issue 40: nothing between
    the title and the verdict)."""
    import nbformat

    from residency.notebook.planning import plan_to_terminal

    nb = nbformat.read(ROOT / "notebooks" / "paired_profile.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    plan_cell = next(i for i, s in enumerate(code) if "nb.plan_markdown(params)" in s)
    run_cell = next(i for i, s in enumerate(code) if "nb.open_source(" in s)
    shown = next(i for i, s in enumerate(code) if "display(Markdown(plan))" in s)
    first_screen = next(i for i, s in enumerate(code) if "nb.first_screen(ev, run)" in s)
    assert plan_cell < run_cell <= first_screen < shown
    assert "display" not in code[plan_cell]
    plan_to_terminal("**Design**: 10 pairs\n\n| a | b |\n")
    err = capsys.readouterr().err
    assert "residency: Design: 10 pairs" in err and "**" not in err
