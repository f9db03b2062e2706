"""Change points on synthetic series whose steps are known (harness.gate.changepoint)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.gate.changepoint import best_split, change_points, find_steps, is_regression
from harness.gate.policy import DEFAULT_POLICIES

TPS = DEFAULT_POLICIES["tokens_per_s"]


def noise(seed, n, level=100.0, cv=0.015):
    return np.random.default_rng(seed).normal(level, cv * level, n)


def test_one_step_is_found_where_it_is():
    x = np.r_[noise(1, 30), noise(2, 20, 92.0)]
    steps = find_steps(x, TPS)
    assert len(steps) == 1
    s = steps[0]
    assert s.index == 30
    assert s.ratio == pytest.approx(0.92, abs=0.01)
    assert s.p_value < 0.01 and is_regression(s, TPS)


def test_two_steps_down_then_up():
    x = np.r_[noise(3, 25), noise(4, 15, 90.0), noise(5, 20, 97.0)]
    steps = find_steps(x, TPS)
    assert [s.index for s in steps] == [25, 40]
    assert is_regression(steps[0], TPS) and not is_regression(steps[1], TPS)


def test_no_step_in_noise_and_deterministic():
    for seed in range(5):
        assert find_steps(noise(100 + seed, 60, cv=0.03), TPS) == []
    x = np.r_[noise(6, 20), noise(7, 20, 95.0)]
    assert find_steps(x, TPS, seed=3) == find_steps(x, TPS, seed=3)


def test_a_single_outlier_is_not_a_step():
    x = noise(8, 30)
    x[15] = 40.0
    assert find_steps(x, TPS) == []


def test_small_real_steps_are_dropped_by_the_policy():
    # A 0.5 % shift in very quiet data: significant, but below the 3 % that matters.
    x = np.r_[noise(9, 40, cv=0.001), noise(10, 40, 99.5, cv=0.001)]
    assert [k for k, _ in change_points(x)] == [40]
    assert find_steps(x, TPS) == []
    assert [s.index for s in find_steps(x)] == [40]       # no policy: every significant split


def test_min_size_and_short_series():
    assert best_split([1.0, 2.0, 3.0], min_size=3) is None
    # A step at the very end needs a few runs after it before it is significant: with 20
    # before, 2 after are too few for min_size, 3 are not significant yet, 5 are.
    assert find_steps(np.r_[noise(11, 20), noise(12, 2, 80.0)], TPS) == []
    assert find_steps(np.r_[noise(11, 20), noise(12, 3, 80.0)], TPS) == []
    assert [s.index for s in find_steps(np.r_[noise(11, 20), noise(12, 5, 80.0)], TPS)] == [20]


def test_lower_is_better_metric():
    step = DEFAULT_POLICIES["step_ms_p50"]
    x = np.r_[noise(13, 20, 10.0), noise(14, 20, 11.0)]
    steps = find_steps(x, step)
    assert [s.index for s in steps] == [20] and is_regression(steps[0], step)
