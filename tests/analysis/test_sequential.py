"""Stop when decided: the sequential rule's type-I error by simulation, its looks and
adjusted figures in the manifest, and every view showing them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from residency import humanize
from residency.analysis import sequential as sq
from residency.analysis import stats
from residency.records.manifest import read_manifest, write_manifest

RUNS = Path(__file__).resolve().parent.parent.parent / "data" / "runs"
SIMULATIONS = 4000


def _clopper_pearson_upper(k: int, n: int, level: float = 0.99) -> float:
    return 1.0 if k == n else float(sps.beta.ppf(level, k + 1, n - k))


def _h0(shape: str, rng: np.random.Generator, shape_: tuple[int, int]) -> np.ndarray:
    if shape == "normal":
        return rng.standard_normal(shape_)
    if shape == "t2":
        return rng.standard_t(2, shape_)
    if shape == "cauchy":
        return rng.standard_cauchy(shape_)
    noise = rng.standard_normal(shape_)  # one outlier per sequence, either slot (sign)
    where = rng.integers(0, shape_[1], shape_[0])
    noise[np.arange(shape_[0]), where] += 50 * rng.choice([-1.0, 1.0], shape_[0])
    return noise


@pytest.mark.parametrize("shape", ["normal", "t2", "cauchy", "outlier"])
@pytest.mark.parametrize("max_pairs", [10, 20])
def test_type_one_error_under_h0_is_at_most_5_percent(shape: str, max_pairs: int) -> None:
    # A/A-like: both arms the same level, noise 5 % of it (the ±2 % equivalence margin
    # then rarely stops a sequence early: the hardest case for a false difference)
    rng = np.random.default_rng([7, max_pairs, len(shape)])
    rule = sq.SequentialRule.default(max_pairs)
    size = (SIMULATIONS, max_pairs)
    base = 100 + 5 * rng.standard_normal(size)
    cand = base + 5 * _h0(shape, rng, size)  # the A/A delta: symmetric about 0
    out = sq.simulate(rule, base, cand)
    false = int(np.sum(out["decision"] == 1))
    # the upper 99 % Clopper-Pearson bound of the observed rate stays under 5 % + the bound's
    # own Monte Carlo width: with n = 4000 and a true rate of 5 %, k/n exceeds 5.9 % with
    # probability < 1 %; the rule is conservative (its rate is well below), so demand
    # k/n <= 5 % outright and the 99 % upper bound <= 6 %
    assert false / SIMULATIONS <= 0.05
    assert _clopper_pearson_upper(false, SIMULATIONS) <= 0.06
    assert set(np.unique(out["pairs"])) <= set(rule.looks())


def test_simulated_tables_agree_with_the_suites_exact_test() -> None:
    rng = np.random.default_rng(3)
    for n in (6, 9, 14):
        two, _, _ = sq.signed_rank_tables(n)
        for _ in range(30):
            d = rng.standard_normal(n) + 0.4
            w = int(((np.argsort(np.argsort(np.abs(d))) + 1) * (d > 0)).sum())
            assert two[w] == pytest.approx(stats.wilcoxon_signed_rank(d), abs=1e-12)


def test_rule_spends_exactly_alpha_and_looks_from_six() -> None:
    rule = sq.SequentialRule.default(20)
    assert rule.looks()[0] == 6 and rule.looks()[-1] == 20
    assert sum(rule.weights()) == pytest.approx(1.0)
    assert sum(rule.alpha_at(n) for n in rule.looks()) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="max_pairs"):
        sq.SequentialRule(max_pairs=4)


def test_rule_stops_on_a_clear_difference_with_adjusted_figures() -> None:
    rule = sq.SequentialRule(max_pairs=10, first_look=6, look_every=2, rho=0.5)
    base = [10.0 + 0.01 * i for i in range(10)]
    cand = [b - 1.0 for b in base]
    looks = [lk for n in range(1, 11) if (lk := rule.look(base[:n], cand[:n])) is not None]
    assert looks[0].pairs == 6 and looks[0].decision == "difference"
    found = rule.result(base[:6], cand[:6])
    assert found.stopped_after == 6 and found.max_pairs == 10
    # adjusted p = p / share of alpha spent at the look: 2^-5 / sqrt(0.6)
    assert found.p_adjusted == pytest.approx(2 ** -5 / np.sqrt(0.6))
    assert "Stopped after 6 of 10 pairs" in found.sentence()


def _stopped_run(tmp_path: Path) -> Path:
    """A recorded paired-profile run (6 unprofiled pairs) rewritten as one that a rule with
    at most 10 pairs stopped after 6: every candidate run 10 % faster than its baseline."""
    run = tmp_path / "stopped"
    shutil.copytree(RUNS / "cuda-paired-profile-1r50s", run)
    manifest = read_manifest(run)
    rule = sq.SequentialRule(max_pairs=10, first_look=6, look_every=2, rho=0.5)
    unprofiled = [r for r in manifest["runs"] if not r["profiled"]]
    base = [r for r in unprofiled if r["arm"] == "baseline"]
    for b, c in zip(base, [r for r in unprofiled if r["arm"] == "candidate"], strict=True):
        c["e2e_s"] = b["e2e_s"] * 0.9
    b_vals = [r["e2e_s"] for r in base]
    c_vals = [b * 0.9 for b in b_vals]
    found = rule.result(b_vals, c_vals)
    manifest["sequential"] = {**found.to_dict(), "rule": rule.to_dict()}
    manifest["params"]["max_pairs"] = 10
    write_manifest(run, manifest)
    return run


def test_every_view_reports_a_run_stopped_early(tmp_path: Path) -> None:
    from residency import evidence
    from residency.reports import summary, tables
    from residency.rundir.run import load_run

    run = load_run(_stopped_run(tmp_path), verify=False)
    ev = evidence.build(run, traces=False)
    a = ev["e2e_unprofiled"]
    seq = a.detail["sequential"]
    assert seq["stopped_after"] == 6 and seq["max_pairs"] == 10
    assert [lk["pairs"] for lk in seq["looks"]] == [6]
    assert seq["p_adjusted"] == pytest.approx(2 ** -5 / np.sqrt(0.6))
    assert a.detail["verdict"].startswith("Verdict: the candidate is faster")
    assert "stopped after 6 of 10 pairs" in a.detail["verdict"]
    p_adj = humanize.p_text(seq["p_adjusted"])
    s = summary.summarize(ev, manifest=run.manifest)
    table = tables.evidence_table(ev)
    views = {"first screen": summary.first_screen_markdown(s),
             "notes": summary.notes_markdown(s),
             "pr": summary.pr_markdown(s, run_dir="stopped"),
             "table": tables.render([table], "md")}
    for name, text in views.items():
        assert "stopped after 6 of 10 pairs" in text.lower(), name
        assert p_adj in text, name
    assert "repeated confidence interval" in views["notes"]


def test_the_orchestrator_records_every_look_and_stops(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from residency.experiments import arms, designs
    from residency.experiments.servicefile import builtin_service
    from residency.records.manifest import Manifest

    def fake_arm(spec, arm, index, out, *, steps, seed, profiled, requests=1,  # noqa: ANN001
                 lister=None, require_exclusive=False):  # noqa: ANN001
        (out / f"runs/{index:02d}-{arm}").mkdir(parents=True)
        e2e = (1.0 if arm == "baseline" else 0.9) + 0.001 * index
        return {"arm": arm, "index": index, "dir": f"runs/{index:02d}-{arm}", "e2e_s": e2e,
                "profiled": profiled, "request_id": f"r{index}",
                "cost": arms.run_cost(start_ns=2_000_000_000, warmup_ns=1_000_000_000,
                                     measured_ns=requests * 10**9, total_ns=5 * 10**9)}

    monkeypatch.setattr(arms, "run_arm", fake_arm)
    spec = builtin_service(device_kind="emulated-npu", ranks=1)
    rule = sq.SequentialRule(max_pairs=12, first_look=6, look_every=2, rho=0.5)
    out = designs.run_design("paired-profile", tmp_path / "run", spec=spec, pairs=12,
                             requests=2, progress=False, sequential=rule)
    m = Manifest.read(out).to_dict()
    seq = m["sequential"]
    assert seq["rule"]["max_pairs"] == 12 and seq["rule"]["looks"] == [6, 8, 10, 12]
    assert [lk["pairs"] for lk in seq["looks"]] == [6]
    assert seq["looks"][0]["decision"] == "difference" and seq["stopped_after"] == 6
    assert len(m["runs"]) == 2 + 12 and len(m["order"]) == 14
    assert m["params"]["pairs"] == 6 and m["params"]["max_pairs"] == 12
    assert m["cost"]["runs"] == 14 and m["cost"]["start_s"] == pytest.approx(28.0)
    assert m["runs"][-1]["cost"]["other_s"] == pytest.approx(0.0)
