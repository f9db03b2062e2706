"""harness.gate.stats and policy: verdicts on constructed samples, where the answer is known."""

from __future__ import annotations

import pytest

from harness.protocol.errors import InputError
from harness.gate.policy import DEFAULT_POLICIES, Policy, resolve_policies
from harness.gate.stats import (IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, ci_rank, compare,
                                hodges_lehmann, mann_whitney_p, min_p, shift_ci, u_cdf)

TPS = DEFAULT_POLICIES["tokens_per_s"]          # higher is better, 3 %
STEP = DEFAULT_POLICIES["step_ms_p50"]          # lower is better, 3 %
IDLE = DEFAULT_POLICIES["idle_fraction"]        # lower is better, 0.02 absolute

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]


def scaled(samples, factor):
    return [v * factor for v in samples]


def test_clear_regression_is_regressed_with_the_exact_minimum_p():
    c = compare(BASE, scaled(BASE, 0.95), TPS)
    assert c.verdict == REGRESSED
    # 5 vs 5, complete separation: the exact one-sided p is 1 / C(10, 5) = 1/252.
    assert c.p_worse == pytest.approx(1 / 252)
    assert c.ratio == pytest.approx(0.95)
    assert c.ci_ratio[0] <= 0.95 <= c.ci_ratio[1] < 0.97
    assert c.base == 100.0 and c.head == pytest.approx(95.0)


def test_big_but_not_significant_change_is_inconclusive():
    # Medians 5 % apart, but the samples interleave: no evidence.
    base = [100, 90, 110, 95, 105]
    head = [95, 85, 104, 91, 99.75]
    c = compare(base, head, TPS)
    assert c.worse_rel > 0.03
    assert c.p_worse > 0.01
    assert c.verdict == INCONCLUSIVE


def test_significant_but_small_change_is_unchanged():
    # Every head sample lower, but only by 1 %: real, below what matters, and the interval
    # shows it cannot be 3 %.
    tight = [100.0, 100.1, 99.9, 100.05, 99.95]
    c = compare(tight, scaled(tight, 0.99), TPS)
    assert c.p_worse < 0.01
    assert 0.97 < c.ci_ratio[0] <= c.ci_ratio[1] < 1.0
    assert c.verdict == UNCHANGED


def test_a_point_estimate_inside_the_threshold_is_not_unchanged():
    # The issue's own example: medians 21.1 vs 9.18, yet the pairwise estimate is ~1: the
    # interval spans a 2x change either way, so nothing is claimed.
    c = compare([24.7, 8.63, 9.18], [4.55, 24.9, 21.1], TPS)
    assert abs(c.ratio - 1) < 0.03
    assert c.verdict == INCONCLUSIVE
    # The same estimate with tight samples is a claim the interval supports.
    assert compare(BASE, scaled(BASE, 0.995), TPS).verdict == UNCHANGED


def test_improvement_and_direction_lower_is_better():
    assert compare(BASE, scaled(BASE, 1.06), TPS).verdict == IMPROVED
    # For step time a rise is the regression, a drop the improvement.
    assert compare(BASE, scaled(BASE, 1.06), STEP).verdict == REGRESSED
    assert compare(BASE, scaled(BASE, 0.94), STEP).verdict == IMPROVED


def test_three_repeats_can_never_be_significant_at_one_percent():
    c = compare([10, 10.1, 9.9], [5, 5.1, 4.9], TPS)
    assert c.p_worse == pytest.approx(1 / 20)
    assert c.verdict == INCONCLUSIVE


def test_absolute_threshold_for_fractions_near_zero():
    base = [0.10, 0.11, 0.105, 0.102, 0.108]
    assert compare(base, [v + 0.01 for v in base], IDLE).verdict == UNCHANGED    # 1 point
    assert compare(base, [v + 0.05 for v in base], IDLE).verdict == REGRESSED    # 5 points
    # A baseline of exactly zero still works (no ratio, absolute threshold).
    c = compare([0.0] * 5, [0.05, 0.06, 0.055, 0.052, 0.058], IDLE)
    assert c.ratio is None and c.verdict == REGRESSED


def test_both_thresholds_must_be_exceeded():
    policy = Policy("x", "higher", threshold_rel=0.03, threshold_abs=10.0)
    # 5 % worse but only 5 units: not enough on the absolute scale.
    assert compare(BASE, scaled(BASE, 0.95), policy).verdict == UNCHANGED
    policy = Policy("x", "higher", threshold_rel=0.03, threshold_abs=2.0)
    assert compare(BASE, scaled(BASE, 0.95), policy).verdict == REGRESSED


def test_one_outlier_cannot_fake_a_regression():
    head = list(BASE)
    head[2] = 50.0      # one repeat hit by a page-fault storm
    c = compare(BASE, head, TPS)
    assert c.ratio == pytest.approx(1.0, abs=0.01)
    # Not a regression -- and with one wild sample in five, not a claim of "unchanged" either.
    assert c.verdict == INCONCLUSIVE
    assert compare(BASE * 3, head * 3, TPS).verdict == UNCHANGED


def test_identical_and_tied_samples():
    assert compare([4.0] * 5, [4.0] * 5, DEFAULT_POLICIES["accept_len_mean"]).verdict == UNCHANGED
    # Ties within each side (seeded acceptance draws repeat): a permutation p, still exact.
    p = mann_whitney_p([3.0, 3.0, 3.5, 3.5], [4.0, 4.0, 4.5, 4.5], "less")
    assert p == pytest.approx(1 / 70, rel=1e-6)


def test_hodges_lehmann_is_the_median_of_pairwise_ratios():
    ratio, diff = hodges_lehmann([1.0, 2.0], [2.0, 4.0])
    # pairs: 2/1, 4/1, 2/2, 4/2 -> log-median of {2, 4, 1, 2} = 2
    assert ratio == pytest.approx(2.0)
    assert diff == pytest.approx(1.5)   # median of {1, 3, 0, 2}


def test_deterministic_ci():
    a = compare(BASE, scaled(BASE, 0.97), TPS)
    b = compare(BASE, scaled(BASE, 0.97), TPS)
    assert a.ci_ratio == b.ci_ratio and a.ci_diff == b.ci_diff


def test_levels_are_the_callers():
    # 5 vs 5 separated: p = 1/252 passes alpha 0.01 but not a per-look 0.01 / 10.
    assert compare(BASE, scaled(BASE, 0.9), TPS).verdict == REGRESSED
    c = compare(BASE, scaled(BASE, 0.9), TPS, alpha=0.001, look=3)
    assert c.verdict == INCONCLUSIVE and c.alpha == 0.001 and c.look == 3


def test_single_samples_have_no_interval():
    c = compare([0.1], [0.3], IDLE)
    assert c.ci_diff is None and c.verdict == INCONCLUSIVE


# -- the exact distribution behind p and the interval -----------------------------------------


def test_u_distribution_matches_scipy_exact():
    import numpy as np
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(3)
    for m, n in ((3, 3), (4, 7), (6, 6), (10, 3), (12, 9)):
        for _ in range(5):
            x, y = rng.normal(size=m), rng.normal(size=n) + 0.7
            u = int((x[:, None] > y[None, :]).sum())
            want = mannwhitneyu(x, y, alternative="less", method="exact").pvalue
            assert u_cdf(m, n, u) == pytest.approx(want, rel=1e-9)


def test_min_p_and_interval_ranks():
    assert min_p(5, 5) == pytest.approx(1 / 252) and min_p(3, 3) == pytest.approx(1 / 20)
    assert min_p(0, 5) == 1.0
    assert ci_rank(3, 3, 0.90) == 0          # 3 vs 3 cannot give a 90 % interval: P(U=0) = 0.05
    k = ci_rank(5, 5, 0.90)
    assert u_cdf(5, 5, k - 1) <= 0.05 < u_cdf(5, 5, k)
    assert shift_ci([1, 2, 3], [1, 2, 3], 0.9) is None


def test_interval_covers_the_true_shift_as_often_as_it_says():
    import numpy as np

    rng = np.random.default_rng(11)
    hits, trials = 0, 1500
    for _ in range(trials):
        base = rng.normal(100, 3, 6)
        head = rng.normal(95, 3, 7)
        lo, hi = shift_ci(base, head, 0.90)
        hits += lo <= -5 <= hi
    # At least the nominal 90 % (the exact interval is conservative by the discreteness of U),
    # but not trivially wide.
    assert 0.89 <= hits / trials <= 0.95


def test_to_dict_is_plain_json():
    import json
    d = compare(BASE, scaled(BASE, 0.95), TPS).to_dict()
    assert json.loads(json.dumps(d))["verdict"] == REGRESSED
    assert d["policy"] == {"direction": "higher", "threshold_rel": 0.03, "threshold_abs": None,
                           "alpha": 0.01, "alpha_eq": 0.05, "gate": True, "per": "repeat"}


def test_compare_needs_samples():
    with pytest.raises(ValueError):
        compare([], [1.0], TPS)


# -- policies ----------------------------------------------------------------------------------


def test_default_policies_when_the_scenario_has_none():
    p = resolve_policies({})
    assert set(p) == {"tokens_per_s", "accept_len_mean", "idle_fraction", "profiler_overhead_pct",
                      "step_ms_p50", "kernel_us", "idle_fraction_nvml"}
    assert not p["profiler_overhead_pct"].gate
    # a serving engine's NVML estimate: coarse, its own name, reported and never gated
    assert not p["idle_fraction_nvml"].gate and p["idle_fraction_nvml"].per == "run"
    assert p["idle_fraction"].threshold_abs == 0.02 and p["idle_fraction"].direction == "lower"
    # One profiled sample per worker run: reported with its noise, not gated by default.
    assert not p["idle_fraction"].gate and p["idle_fraction"].per == "run"
    assert p["tokens_per_s"].threshold_rel == 0.03 and p["tokens_per_s"].gate


def test_scenario_policies_fill_from_defaults_and_gate_only_what_they_name():
    p = resolve_policies({"tokens_per_s": {"direction": None, "threshold_rel": 0.05, "threshold_abs": None},
                          "bw_pct_roofline": {"direction": "higher", "threshold_rel": None,
                                              "threshold_abs": 2.0}}, alpha=0.05)
    assert set(p) == {"tokens_per_s", "bw_pct_roofline"}
    assert p["tokens_per_s"] == Policy("tokens_per_s", "higher", 0.05, None, 0.05)
    assert p["bw_pct_roofline"].threshold_abs == 2.0
    # A metric without a default policy: one sample per run until shown otherwise.
    assert p["bw_pct_roofline"].per == "run" and p["bw_pct_roofline"].gate


def test_scenario_may_gate_the_idle_fraction():
    p = resolve_policies({"idle_fraction": {"direction": None, "threshold_rel": None,
                                            "threshold_abs": None, "gate": True}}, alpha_eq=0.1)
    assert p["idle_fraction"].gate and p["idle_fraction"].threshold_abs == 0.02
    assert p["idle_fraction"].alpha_eq == 0.1


def test_policy_without_direction_for_an_unknown_metric_is_bad_input():
    with pytest.raises(InputError, match="metrics.foo: no direction"):
        resolve_policies({"foo": {"direction": None, "threshold_rel": 0.1, "threshold_abs": None}},
                         where="s.yaml")
    with pytest.raises(InputError, match="--alpha"):
        resolve_policies({}, alpha=1.5)
    with pytest.raises(InputError, match="--alpha-eq"):
        resolve_policies({}, alpha_eq=0.5)
