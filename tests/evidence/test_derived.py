"""residency.evidence.derived: the figures reports show that the evidence derives (shares of
E2E, retention rate, idle-by-cause ranking), computed once here and only formatted by
residency.reports."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd

from residency.evidence import derived
from residency.policy.cache import BASELINE


class _Evidence:
    """Just what `derived` reads of an Evidence: `get(key)`."""

    def __init__(self, **attributions: object) -> None:
        self._a = attributions

    def get(self, key: str) -> object:
        return self._a.get(key)


def _result(**fields: float) -> SimpleNamespace:
    return SimpleNamespace(result=SimpleNamespace(**fields))


def test_percent_and_fraction_of_e2e() -> None:
    assert derived.percent_of_e2e_ms(250.0, 2.0) == 100 * 250.0 / 1e3 / 2.0 == 12.5
    assert derived.fraction_of_e2e(500.0, "ms", 2.0) == 0.25
    assert derived.fraction_of_e2e(0.5, "s", 2.0) == 0.25


def test_e2e_baseline_prefers_the_asked_pairs() -> None:
    ev = _Evidence(e2e_profiled=_result(baseline_median=3), e2e_unprofiled=None)
    assert derived.e2e_baseline_s(ev, True) == 3.0
    assert isinstance(derived.e2e_baseline_s(ev, True), float)
    assert derived.e2e_baseline_s(ev, False) is None


def test_shares_against_the_published_rows() -> None:
    rows = {"normal-release markers": {BASELINE: 100.0},
            "client E2E, one isolated pair": {BASELINE: 10.0},
            "full stack, profiled pair, all-rank": {BASELINE: 1.0},
            "full stack, 3 alternating": {BASELINE: 20.0}}
    ev = _Evidence(e2e_profiled=_result(baseline_median=2.0),
                   idle_intersection=_result(baseline=400.0),
                   all_rank_idle=_result(baseline=0.5))
    idle, whole = derived.shares(ev, rows.get)
    assert (idle.emulated, idle.published) == (0.2, 0.01)
    assert math.isclose(idle.factor, 20.0)
    assert (whole.emulated, whole.published) == (0.25, 0.05)
    assert math.isclose(whole.factor, 5.0)
    assert derived.shares(ev, lambda prefix: None) == ()
    assert derived.shares(_Evidence(), rows.get) == ()


def test_share_factor_is_symmetric_and_infinite_without_a_share() -> None:
    assert derived.Share("x", 0.02, 0.2, "s").factor == derived.Share("x", 0.2, 0.02, "s").factor
    assert derived.Share("x", 0.0, 0.2, "s").factor == math.inf


def test_retention_rate() -> None:
    frame = pd.DataFrame({"calls": [4, 0], "retained": [1, 0]})
    rate = derived.retention_rate(frame)
    assert rate.iloc[0] == 0.25 and math.isnan(rate.iloc[1])


def test_ranked_causes_by_size_either_way_and_their_sums() -> None:
    diff = pd.DataFrame({"cause": ["a", "b", "c", "d"], "delta_idle_ns": [-5, 9, 5, 1],
                         "delta_idle_ms": [-5e-6, 9e-6, 5e-6, 1e-6]})
    shown, rest = derived.ranked_causes(diff, 3)
    assert list(shown["cause"]) == ["b", "a", "c"]  # ties keep the frame's order
    assert list(rest["cause"]) == ["d"]
    assert derived.cause_sums(diff, ["delta_idle_ns"]) == {"delta_idle_ns": 10.0}
