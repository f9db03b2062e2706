"""The gate's design (harness.gate.sequential) and its noise report (harness.gate.noise): what
is refused before measuring, how many rounds a plan needs, and what the noise table says."""

from __future__ import annotations

import pytest

from harness.protocol.errors import InputError
from harness.gate import noise
from harness.gate.policy import DEFAULT_POLICIES, Policy
from harness.gate.sequential import (Design, check_fixed, look, plan_ab, plan_stored, reachable,
                                     rounds_to_decide)
from harness.gate.stats import INCONCLUSIVE, min_p

TPS = DEFAULT_POLICIES["tokens_per_s"]
GATED = {k: p for k, p in DEFAULT_POLICIES.items() if p.gate}


def test_plan_ab_picks_the_earliest_first_look_that_can_reach_alpha_over_k():
    d = plan_ab(GATED, 1, 15)
    assert d == Design(7, 15) and d.looks == 9
    # 6 vs 6 at best 1/924, above 0.01/10; 7 vs 7 at best 1/3432, below 0.01/9.
    assert min_p(6, 6) > 0.01 / 10 and min_p(7, 7) < 0.01 / 9
    assert plan_ab(GATED, 5, 15).first_look == 2        # repeats as samples (stored modes)
    assert plan_ab(GATED, 1, 15, min_rounds=9).first_look == 9
    with pytest.raises(InputError, match="--max-rounds 3: it needs --max-rounds 5"):
        plan_ab(GATED, 1, 3)
    with pytest.raises(InputError, match="--rounds must be >= 1"):
        plan_ab(GATED, 1, 15, min_rounds=0)


def test_levels_are_split_among_the_looks():
    d = Design(7, 15)
    assert d.levels(TPS) == pytest.approx((0.01 / 9, 0.05 / 9))
    assert Design(1, 1).levels(TPS) == (0.01, 0.05)


def test_stored_baselines_are_replanned_or_refused():
    labels = {"a": "cell a"}
    # 5 baseline repeats: the head's second round reaches alpha / K.
    assert plan_stored(GATED, {"a": {"tokens_per_s": 5}}, {"a": 5}, labels, "file x", 15).first_look == 2
    # 3: more head rounds before the first look.
    assert plan_stored(GATED, {"a": {"tokens_per_s": 3}}, {"a": 5}, labels, "file x", 15).first_look == 4
    # 1: never, whatever the head does -- refused with what a baseline needs.
    with pytest.raises(InputError, match=r"1 sample\(s\) of `tokens_per_s` .* needs at least 2"):
        plan_stored(GATED, {"a": {"tokens_per_s": 1}}, {"a": 5}, labels, "file x", 15)


def test_fixed_samples_are_checked_once():
    labels = {"a": "cell a"}
    assert check_fixed(GATED, {"a": {"tokens_per_s": (5, 5)}}, labels, "run B") == Design(1, 1)
    with pytest.raises(InputError, match="3 vs 3 .* smallest p they can give is 0.05"):
        check_fixed(GATED, {"a": {"tokens_per_s": (3, 3)}}, labels, "run B")
    # A metric the policies do not gate is never a reason to refuse.
    check_fixed(GATED, {"a": {"tokens_per_s": (5, 5), "idle_fraction": (1, 1)}}, labels, "run B")


def test_reachable_needs_both_a_p_and_an_interval():
    assert reachable(TPS, 7, 7, 9) and not reachable(TPS, 6, 6, 10)
    eq_only = Policy("x", "higher", 0.03, alpha=0.5, alpha_eq=0.001)
    assert not reachable(eq_only, 3, 3, 1)       # p fine, but no 99.8 % interval from 3 vs 3


def test_rounds_to_decide_grows_with_the_noise():
    base = [100.0, 103.0, 97.0, 101.5, 98.5, 100.2, 99.6]
    quiet = look(base, [b * 1.001 for b in reversed(base)], TPS, Design(7, 15), 7)
    noisy_base = [100.0, 115.0, 85.0, 108.0, 92.0, 104.0, 96.0]
    noisy = look(noisy_base, list(reversed(noisy_base)), TPS, Design(7, 15), 7)
    assert noisy.verdict == INCONCLUSIVE
    r_noisy = rounds_to_decide(noisy, Design(7, 15), 1, 7)
    r_quiet = rounds_to_decide(quiet, Design(7, 15), 1, 7) if quiet.verdict == INCONCLUSIVE else 7
    assert r_noisy > r_quiet >= 7


def _run(samples, metric="tokens_per_s"):
    return {"status": "ok", "samples": {metric: samples}, "metrics": {metric: samples[0]}}


def test_side_noise_separates_within_from_between_runs():
    runs = [_run([100.0, 101.0, 99.0]), _run([110.0, 111.0, 109.0]), _run([104.5, 103.5, 104.0])]
    n = noise.side_noise(runs, TPS, "head")
    assert n.runs == 3 and n.n == 9 and n.relative
    assert n.within == pytest.approx(1 / 110)                 # median of 1/100, 1/110, 0.5/104
    assert n.between == pytest.approx(4 / 104)                # medians 100, 110, 104
    assert (n.lo, n.hi) == (99.0, 111.0)
    one = noise.side_noise(runs[:1], TPS, "base")
    assert one.between is None
    assert noise.side_noise([{"status": "failed"}], TPS, "head") is None
    idle = noise.side_noise([_run([0.10], "idle_fraction"), _run([0.14], "idle_fraction")],
                            DEFAULT_POLICIES["idle_fraction"], "head")
    assert not idle.relative and idle.between == pytest.approx(0.02)


def test_noise_warnings_over_half_the_threshold_one_line_per_side():
    loud = noise.Noise("tokens_per_s", "base", 3, 15, True, within=0.001, between=0.02, lo=1, hi=2)
    quiet = noise.Noise("tokens_per_s", "head", 3, 15, True, within=0.001, between=0.01, lo=1, hi=2)
    scatter = noise.Noise("step_ms_p50", "head", 3, 15, True, within=0.05, between=0.001, lo=1, hi=2)
    lines = noise.warnings([loud, quiet, scatter], DEFAULT_POLICIES, "cell", per_round=True)
    assert lines == ["cell (base): `tokens_per_s` 2.0 % between rounds (MAD/median; over half "
                     "the threshold)"]
    # Against a stored baseline the repeats are the samples: their scatter counts too.
    lines = noise.warnings([scatter], DEFAULT_POLICIES, "cell", per_round=False)
    assert lines and "5.0 % within a run" in lines[0]
